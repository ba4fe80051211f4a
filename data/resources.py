"""Resource labels (``cpu:N``, ``gpu:MODEL``, ``mig:PROFILE``, ``mps:PCT`` or any
``kind:size``) and the one table of resource kinds.

:data:`RESOURCE_KINDS` says, once, everything greenctl decides by a resource's kind: how a
size is written and checked, the budget unit and amount, how an executor is pinned (cores,
``CUDA_VISIBLE_DEVICES``, the MPS active-thread percentage), the Kubernetes resource name and
the Ray actor options. Other modules ask the kind record (``parse_resource(x).spec``) and do
not compare kind strings; adding a kind is adding a row here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError

_LABEL = re.compile(r"^([a-z][a-z0-9_-]*):([A-Za-z0-9][A-Za-z0-9._+-]*)$")
_MIG_PROFILE = re.compile(r"^[1-8]g\.\d+gb(\+me)?$")

#: How an executor instance is held to its resource.
PIN_CORES = "cores"  # CPU affinity to whole cores (partition.assign_cores)
PIN_GPU = "gpu"  # CUDA_VISIBLE_DEVICES = one whole GPU (its UUID or index)
PIN_MIG_INSTANCE = "mig-instance"  # CUDA_VISIBLE_DEVICES = one MIG GPU instance's UUID
PIN_NONE = "none"  # a planning-only kind: greenctl does not start executors on it

#: Host CPUs a GPU-bound Ray replica asks for (its host thread; keeps CPUs for CPU replicas).
GPU_REPLICA_CPUS = 0.25


def _float_or_one(size: str) -> float:
    try:
        return float(size)
    except ValueError:
        return 1.0


def _mig_slices(size: str) -> int:
    return int(size.split("g.", 1)[0])


@dataclass(frozen=True)
class ResourceKind:
    """One row of the resource-kind table: what greenctl decides by a resource's kind."""

    name: str
    #: how the size is written in labels and hints (``cpu:N``), and with a word on it
    form: str
    form_hint: str
    #: whether greenctl can start executors on it (``apply``); other kinds plan only
    runnable: bool
    #: the size is valid (None: any size)
    size_ok: Callable[[str], bool] | None
    #: why a size is not valid, and the fix
    size_error: str
    size_hint: str | None
    #: what a kind budget (``--budget cpu=14``) counts, and one instance's amount of it
    budget_unit: str
    budget_amount: Callable[[str], float]
    #: how an instance is pinned (PIN_*)
    pinning: str
    #: executors cap their GPU threads (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) and need
    #: the MPS control daemon
    thread_percentage: bool
    #: the size names a GPU model, which must match the GPU it is placed on
    size_is_gpu_model: bool
    #: units of a whole GPU when the kind partitions one (mps: 100 percent, mig: 7 slices)
    share_capacity: int | None
    #: the label of a whole-GPU share, for messages
    whole_share: str
    #: the Kubernetes resource an instance's container is limited to (``{size}`` filled in);
    #: None for kinds with no Kubernetes mapping; cpu requests its cores
    k8s_resource: str | None
    #: a Ray custom resource a replica asks one of (``{size}`` filled in); None: Ray's own
    #: num_cpus (cores kinds) or num_gpus (the GPU fraction)
    ray_resource: str | None
    #: a valid label of this kind, for hints and tests
    example: str

    @property
    def accelerator(self) -> bool:
        """Whether its instances run on a GPU (a CUDA device)."""
        return self.pinning in (PIN_GPU, PIN_MIG_INSTANCE)

    @property
    def pins_cores(self) -> bool:
        return self.pinning == PIN_CORES

    def check(self, label: str, size: str) -> None:
        """Raise InputError when ``size`` is not a valid size of this kind."""
        if self.size_ok is not None and not self.size_ok(size):
            raise InputError(
                f"resource '{label}': {self.size_error.format(size=size)}", hint=self.size_hint
            )

    def share_units(self, size: str) -> int | None:
        """A GPU share's units (percent, compute slices); None for kinds that do not split
        a GPU."""
        return int(self.budget_amount(size)) if self.share_capacity is not None else None

    def gpu_fraction(self, size: str) -> float:
        """How much of one GPU an instance holds (1.0 for a whole GPU, 0 off the GPU)."""
        if not self.accelerator:
            return 0.0
        if self.share_capacity is None:
            return 1.0
        return self.budget_amount(size) / self.share_capacity

    def pin_env(self, size: str, *, device: str | None) -> dict[str, str]:
        """Environment that pins an executor: ``CUDA_VISIBLE_DEVICES`` (when ``device``, a
        GPU or MIG instance UUID or index, is known here) and the MPS thread percentage."""
        env: dict[str, str] = {}
        if self.accelerator and device is not None:
            env["CUDA_VISIBLE_DEVICES"] = device
        if self.thread_percentage:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(int(size))
        return env

    def ray_actor_options(self, size: str) -> dict[str, Any]:
        """``ray_actor_options`` that pin one Ray Serve replica to a resource of this kind."""
        if self.pins_cores:
            return {"num_cpus": self.budget_amount(size)}
        if self.ray_resource is not None:
            custom = self.ray_resource.format(kind=self.name, size=size)
            return {"num_cpus": GPU_REPLICA_CPUS, "resources": {custom: 1.0}}
        return {"num_cpus": GPU_REPLICA_CPUS, "num_gpus": self.gpu_fraction(size)}

    def k8s_resources(self, size: str, *, memory: str) -> dict[str, Any] | None:
        """A container's ``resources`` for one instance; None when Kubernetes has no
        mapping for this kind."""
        if self.pins_cores:
            cores = str(int(size))
            return {
                "requests": {"cpu": cores, "memory": memory},
                "limits": {"cpu": cores, "memory": memory},
            }
        if self.k8s_resource is None:
            return None
        key = self.k8s_resource.format(size=size)
        return {"requests": {"cpu": "1", "memory": memory}, "limits": {key: "1", "memory": memory}}


#: The table: the kinds greenctl runs executors on.
RESOURCE_KINDS: dict[str, ResourceKind] = {
    k.name: k
    for k in (
        ResourceKind(
            name="cpu",
            form="cpu:N",
            form_hint="cpu:N (cores)",
            runnable=True,
            size_ok=lambda s: s.isdigit() and int(s) >= 1,
            size_error="cpu:N needs a whole number of cores >= 1",
            size_hint=None,
            budget_unit="cores",
            budget_amount=float,
            pinning=PIN_CORES,
            thread_percentage=False,
            size_is_gpu_model=False,
            share_capacity=None,
            whole_share="",
            k8s_resource=None,
            ray_resource=None,
            example="cpu:2",
        ),
        ResourceKind(
            name="gpu",
            form="gpu:MODEL",
            form_hint="gpu:MODEL",
            runnable=True,
            size_ok=None,
            size_error="",
            size_hint=None,
            budget_unit="GPUs",
            budget_amount=_float_or_one,
            pinning=PIN_GPU,
            thread_percentage=False,
            size_is_gpu_model=True,
            share_capacity=None,
            whole_share="gpu:MODEL",
            k8s_resource="nvidia.com/gpu",
            ray_resource=None,
            example="gpu:A100",
        ),
        ResourceKind(
            name="mig",
            form="mig:PROFILE",
            form_hint="mig:PROFILE (e.g. mig:1g.10gb)",
            runnable=True,
            size_ok=lambda s: bool(_MIG_PROFILE.match(s)),
            size_error="'{size}' is not a MIG profile name",
            size_hint="MIG profiles look like 1g.10gb, 3g.40gb or 7g.80gb",
            budget_unit="compute slices",
            budget_amount=lambda s: float(_mig_slices(s)),
            pinning=PIN_MIG_INSTANCE,
            thread_percentage=False,
            size_is_gpu_model=False,
            share_capacity=7,
            whole_share="a 7g MIG profile",
            k8s_resource="nvidia.com/mig-{size}",
            ray_resource="mig-{size}",
            example="mig:1g.10gb",
        ),
        ResourceKind(
            name="mps",
            form="mps:PCT",
            form_hint="mps:PCT (1-100)",
            runnable=True,
            size_ok=lambda s: s.isdigit() and 1 <= int(s) <= 100,
            size_error="mps:PCT needs a percentage between 1 and 100",
            size_hint=None,
            budget_unit="percent of one GPU",
            budget_amount=float,
            pinning=PIN_GPU,
            thread_percentage=True,
            size_is_gpu_model=False,
            share_capacity=100,
            whole_share="mps:100",
            k8s_resource="nvidia.com/gpu",
            ray_resource=None,
            example="mps:50",
        ),
    )
}

#: The resource kinds greenctl can run executors on (``apply``). Plans and simulations may
#: name any other ``kind:size`` label (its figures come from the profiles).
KNOWN_KINDS = tuple(RESOURCE_KINDS)


def resource_kind(name: str) -> ResourceKind:
    """The table's row for ``name``; another kind gets a planning-only record (its size's
    number, or one, per instance; no executors, no Kubernetes mapping; a Ray custom
    resource ``kind-size``)."""
    found = RESOURCE_KINDS.get(name)
    if found is not None:
        return found
    return ResourceKind(
        name=name,
        form=f"{name}:SIZE",
        form_hint=f"{name}:SIZE",
        runnable=False,
        size_ok=None,
        size_error="",
        size_hint=None,
        budget_unit=f"{name} (the size's number, else one per instance)",
        budget_amount=_float_or_one,
        pinning=PIN_NONE,
        thread_percentage=False,
        size_is_gpu_model=False,
        share_capacity=None,
        whole_share="",
        k8s_resource=None,
        ray_resource="{kind}-{size}",
        example=f"{name}:1",
    )


def kind_of(label: str) -> ResourceKind:
    """The kind record of a label's ``kind:`` prefix, without validating the size (for
    stored rows already validated when written)."""
    return resource_kind(str(label).split(":", 1)[0].strip())


def hourly_cost(label: str, cost_per_hour: float | None) -> tuple[float, bool]:
    """What one instance on ``label`` costs per hour, and whether that is a price: its
    profile's ``cost_per_hour``, else its budget amount (cores, percent, slices or units) per
    hour standing in for one. The planners and the evaluation core price by this one rule."""
    if cost_per_hour is not None:
        return float(cost_per_hour), True
    return parse_resource(label).amount, False


@dataclass(frozen=True, order=True)
class Resource:
    """A parsed resource label."""

    kind: str
    size: str

    @property
    def label(self) -> str:
        return f"{self.kind}:{self.size}"

    def __str__(self) -> str:
        return self.label

    @property
    def spec(self) -> ResourceKind:
        """This resource's row of the kind table."""
        return resource_kind(self.kind)

    @property
    def cpu_cores(self) -> int | None:
        """Cores of a cores-pinned (``cpu:N``) resource, else None."""
        return int(self.size) if self.spec.pins_cores else None

    @property
    def mps_percent(self) -> int | None:
        """Active-thread percentage of an ``mps:PCT`` resource, else None."""
        return int(self.size) if self.spec.thread_percentage else None

    @property
    def mig_compute_slices(self) -> int | None:
        """Compute slices of a ``mig:Ng.XXgb`` resource (the N), else None."""
        return _mig_slices(self.size) if self.spec.pinning == PIN_MIG_INSTANCE else None

    @property
    def amount(self) -> float:
        """How much of its kind's budget this resource uses (the table's budget unit):
        cpu: cores; mps: percent of one GPU; mig: compute slices; gpu and others: the
        size's number, else one unit."""
        return self.spec.budget_amount(self.size)


def parse_resource(label: str) -> Resource:
    """Parse and validate a resource label.

    Raises:
        InputError: the label is malformed; the message shows the accepted forms.
    """
    text = str(label).strip()
    m = _LABEL.match(text)
    if not m:
        forms = ", ".join(k.form_hint for k in RESOURCE_KINDS.values())
        raise InputError(
            f"unknown resource label '{label}'",
            hint=f"use {forms} or another kind:size label",
        )
    kind, size = m.group(1), m.group(2)
    resource_kind(kind).check(label, size)
    return Resource(kind, size)


def runnable_resource(label: str, *, field: str) -> Resource:
    """Parse a label that an executor is to run on: one of :data:`KNOWN_KINDS`.

    Args:
        label: the resource label.
        field: where the label came from, for the message (``deployments[2].resource``).

    Raises:
        InputError: a malformed label, or a kind greenctl cannot start executors on.
    """
    try:
        r = parse_resource(label)
    except InputError as exc:
        raise InputError(f"{field}: {exc.message}", hint=exc.hint) from None
    if not r.spec.runnable:
        raise InputError(
            f"{field} is '{label}': greenctl runs executors on "
            f"{', '.join(k + ':...' for k in KNOWN_KINDS)} resources, not '{r.kind}'",
            hint=f"plan for this machine's resources (`greenctl hw`); '{r.kind}' labels are "
            "for planning and `greenctl simulate` only",
        )
    return r
