"""The points of a profiling run: which (resource, variant) items to measure, and how.

:func:`plan_runs` turns the discovered hardware and the user's choices into
:class:`RunItem` s, one per (resource, variant): ``cpu:N`` in this process; ``gpu:MODEL``,
``mig:PROFILE`` and ``mps:PCT`` in a child process that sees exactly that device; with
``emulate_mig``, every MIG slice of each whole GPU as an MPS share (:func:`_emulated_items`).
:func:`group_items` groups consecutive child items that can share one child process.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import GpuGeometry, emulated_slices, find_gpu, known_gpu_names
from greenctl.data.records import MPS_EMULATED, Hardware, Variant
from greenctl.profiler.device import GpuInfo
from greenctl.profiler.options import check_emulate_mig

if TYPE_CHECKING:
    from greenctl.profiler.hw import Inventory

DEFAULT_MPS = (25, 50, 100)


@dataclass
class RunItem:
    """One (resource, variant) unit of work: all batch sizes of a variant on one resource."""

    resource: str
    variant: Variant
    hardware: Hardware
    batches: list[int]
    device: str = "cpu"
    cores: int | None = None  # cpu:N
    env: dict[str, str] | None = None  # set: run in a child process with this environment
    meter: dict[str, Any] = field(default_factory=dict)  # {"kind": "cpu"|"nvml", ...}
    #: ``Profile.source`` of its rows (``mps-emulated``: a MIG slice measured as an MPS share)
    source: str = "measured"
    #: more resource labels its measurements are also stored under (one MPS share emulates
    #: every MIG profile of its compute size: ``mig:1g.10gb`` and ``mig:1g.20gb``)
    also: list[str] = field(default_factory=list)
    #: a client of the run's MPS session (:func:`greenctl.profiler.mps.mps_session`): runs
    #: while that daemon does, its pipe directory added to ``env`` then
    mps_client: bool = False

    @property
    def in_child(self) -> bool:
        return self.env is not None

    @property
    def title(self) -> str:
        """What progress lines call it: ``resnet50 on mig:1g.10gb (MPS 14 %)``."""
        pct = (self.env or {}).get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
        emulated = f" (MPS {pct} %)" if self.source == MPS_EMULATED and pct else ""
        return f"{self.variant.name} on {self.resource}{emulated}"

    def to_spec(self, *, duration_s: float | None, requests: int | None, warmup: int) -> dict:
        """The JSON document a child process takes on stdin."""
        return {
            "variant": asdict(self.variant),
            "resource": self.resource,
            "device": self.device,
            "cores": self.cores,
            "batches": self.batches,
            "duration_s": duration_s,
            "requests": requests,
            "warmup": warmup,
            "meter": self.meter,
        }


def plan_runs(
    inventory: Inventory,
    variants: Sequence[Variant],
    *,
    cpus: Sequence[int] = (1,),
    gpus: bool = False,
    batches: Sequence[int] = (1,),
    mps: Sequence[int] | None = None,
    emulate_mig: bool = False,
) -> list[RunItem]:
    """Turn hardware and choices into run items (see the module docstring).

    Args:
        inventory: what :func:`greenctl.profiler.hw.discover` found.
        variants: the variants to measure.
        cpus: core counts, one ``cpu:N`` item per variant each.
        gpus: also every whole GPU, MIG instance and (when a daemon runs) MPS share.
        batches: the batch sizes every item measures (all in one child per item).
        mps: MPS active-thread percentages; None: :data:`DEFAULT_MPS` when an MPS daemon
            runs, and none on the daemon ``emulate_mig`` starts.
        emulate_mig: also every MIG slice of each whole GPU (MIG mode off) whose model the
            MIG geometry knows, as an MPS share (:func:`_emulated_items`); these items come
            first, so that a failure of MPS shows within the first minute of a run.

    Raises:
        InputError: a ``cpu:N`` needs more cores than this process may use, ``gpus`` was
            asked for and there is no NVIDIA GPU, ``emulate_mig`` without ``gpus``, or no GPU
            whose slices can be emulated.
    """
    check_emulate_mig(emulate_mig=emulate_mig, gpus=gpus)
    avail = len(inventory.cpu_info.usable_cores)
    for n in cpus:
        if n > avail:
            raise InputError(
                f"--cpus {n}: this process may use {avail} core(s)",
                hint=f"use --cpus values between 1 and {avail}",
            )
    if gpus and not inventory.gpus:
        raise InputError(
            "--gpus: no NVIDIA GPU found on this machine" + _notes(inventory),
            hint="drop --gpus to profile CPUs only",
        )
    items: list[RunItem] = []
    total_cores = inventory.cpu_info.logical_cores or avail
    for v in variants:
        for n in cpus:
            items.append(
                RunItem(
                    resource=f"cpu:{n}",
                    variant=v,
                    hardware=inventory.cpu,
                    batches=list(batches),
                    device="cpu",
                    cores=n,
                    meter={
                        "kind": "cpu",
                        "cores": n,
                        "total_cores": total_cores,
                        "rapl": inventory.cpu_info.rapl_files,
                    },
                )
            )
    if gpus:
        shares = list(DEFAULT_MPS if mps is None else mps)
        emulated: list[RunItem] = []
        if emulate_mig:
            # every MPS share runs in the emulation's MPS session: the defaults when a daemon
            # runs already (as without --emulate-mig), only those given on greenctl's own
            session_shares = shares if inventory.mps_pipe else list(mps or ())
            emulated = _emulated_items(inventory, variants, list(batches), session_shares)
            shares = []
        items = emulated + items + _gpu_items(inventory, variants, list(batches), shares)
    return items


def _notes(inv: Inventory) -> str:
    return f" ({'; '.join(inv.notes)})" if inv.notes else ""


def mps_share(gpu: Hardware, fraction: float) -> Hardware:
    """The hardware record of an MPS client's share ``fraction`` of a whole GPU."""
    return Hardware(
        host=gpu.host,
        kind="mps",
        model_name=gpu.model_name,
        device_index=gpu.device_index,
        memory_mb=gpu.memory_mb,
        compute_share=fraction,
        uuid=gpu.uuid,
        parent_uuid=gpu.uuid,
        driver_version=gpu.driver_version,
        cuda_version=gpu.cuda_version,
    )


def _child_items(
    variants: Sequence[Variant],
    *,
    resource: str,
    hardware: Hardware,
    batches: list[int],
    env: dict[str, str],
    gpu_index: int | None,
    share: float | None,
    **extra: Any,
) -> list[RunItem]:
    """One child-process item per variant on one device (``cuda:0`` in the child), metered
    by NVML on GPU ``gpu_index`` and attributed its ``share``."""
    meter = {"kind": "nvml", "gpu_index": gpu_index, "share": share}
    return [
        RunItem(
            resource=resource,
            variant=v,
            hardware=hardware,
            batches=batches,
            device="cuda:0",
            env=env,
            meter=dict(meter),
            **extra,
        )
        for v in variants
    ]


def _gpu_items(
    inv: Inventory, variants: Sequence[Variant], batches: list[int], mps: list[int]
) -> list[RunItem]:
    """Items of every whole GPU (the first of each model), its MPS shares when a daemon runs,
    and every distinct MIG instance profile."""
    items: list[RunItem] = []
    seen: set[tuple[str, str]] = set()
    mig_gpus = set(inv.mig_enabled) | {m.device_index for m in inv.mig}
    for index in sorted(inv.mig_enabled - {m.device_index for m in inv.mig}):
        inv.notes.append(
            f"GPU {index} is in MIG mode without usable instances: nothing to profile there "
            "(create instances, e.g. with `greenctl apply`, or disable MIG)"
        )
    base_env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    for gpu in inv.gpus:
        if gpu.device_index in mig_gpus:
            continue  # in MIG mode CUDA sees only the instances
        label = GpuInfo(0, "", gpu.model_name, 0.0, None).label
        key = (f"gpu:{label}", gpu.model_name)
        if key in seen:
            continue
        seen.add(key)
        env = {**base_env, "CUDA_VISIBLE_DEVICES": str(gpu.uuid)}
        items += _child_items(
            variants, resource=f"gpu:{label}", hardware=gpu, batches=batches, env=env,
            gpu_index=gpu.device_index, share=1.0,
        )  # fmt: skip
        if inv.mps_pipe:
            items += _mps_items(gpu, variants, batches, mps, env)
    for mig in inv.mig:
        key = (f"mig:{mig.mig_profile}", mig.model_name)
        if key in seen or not mig.uuid:
            continue
        seen.add(key)
        items += _child_items(
            variants, resource=f"mig:{mig.mig_profile}", hardware=mig, batches=batches,
            env={**base_env, "CUDA_VISIBLE_DEVICES": str(mig.uuid)},
            gpu_index=mig.device_index, share=mig.compute_share,
        )  # fmt: skip
    return items


def _mps_items(
    gpu: Hardware,
    variants: Sequence[Variant],
    batches: list[int],
    mps: list[int],
    env: dict[str, str],
) -> list[RunItem]:
    """``mps:PCT`` items of a whole GPU under the MPS daemon that runs already."""
    items: list[RunItem] = []
    for pct in mps:
        penv = {**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
        pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        if pipe_dir:
            penv["CUDA_MPS_PIPE_DIRECTORY"] = pipe_dir
        items += _child_items(
            variants, resource=f"mps:{pct}", hardware=mps_share(gpu, pct / 100.0),
            batches=batches, env=penv, gpu_index=gpu.device_index, share=pct / 100.0,
        )  # fmt: skip
    return items


def _emulated_items(
    inv: Inventory, variants: Sequence[Variant], batches: list[int], mps: list[int]
) -> list[RunItem]:
    """MIG slices emulated as MPS shares of whole GPUs (MISO's method).

    For the first whole GPU of each model the MIG geometry knows, one child per (compute size,
    variant) runs at :func:`~greenctl.data.mig_geometry.mps_percentage`; its rows are stored as
    ``mig:<profile>`` for every profile of that size
    (:func:`~greenctl.data.mig_geometry.emulated_slices`), ``source`` ``mps-emulated``, energy
    ``nvml-attributed``. These and the ``mps`` items are clients of the run's MPS session, so
    each is checked to reach MPS. No per-client memory limit is set: one share stands for
    several memory sizes, and the planner leaves out variants that do not fit.

    Raises:
        InputError: no GPU whose slices can be emulated (a MIG-mode GPU is a note instead).
    """
    items: list[RunItem] = []
    base_env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    if inv.mps_pipe is not None:
        base_env["CUDA_MPS_PIPE_DIRECTORY"] = os.path.dirname(inv.mps_pipe)
    mig_gpus = set(inv.mig_enabled) | {m.device_index for m in inv.mig}
    seen: set[str] = set()
    unknown: list[str] = []
    for gpu in inv.gpus:
        if gpu.device_index in mig_gpus:
            inv.notes.append(
                f"GPU {gpu.device_index} ({gpu.model_name}) is in MIG mode: its MIG instances "
                "are profiled instead of emulated slices (greenctl does not change MIG mode)"
            )
            continue
        if gpu.model_name in seen or not gpu.uuid:
            continue
        seen.add(gpu.model_name)
        geo = find_gpu(gpu.model_name)
        if geo is None:
            unknown.append(f"GPU {gpu.device_index} ({gpu.model_name})")
        env = {**base_env, "CUDA_VISIBLE_DEVICES": str(gpu.uuid)}
        items += _emulated_gpu_items(gpu, geo, variants, batches, mps, env)
    if unknown:
        msg = (
            f"{'; '.join(unknown)}: greenctl knows no MIG geometry for this model, so it has "
            f"no slices to emulate (known: {', '.join(known_gpu_names())})"
        )
        if not any(i.source == MPS_EMULATED for i in items) and not mig_gpus:
            raise InputError(
                f"--emulate-mig: {msg}",
                hint="drop --emulate-mig to profile the whole GPU, or add the model to "
                "data/datasets/mig_geometry.json (its NVML name under nvml_names)",
            )
        inv.notes.append(msg)
    return items


def _emulated_gpu_items(
    gpu: Hardware,
    geo: GpuGeometry | None,
    variants: Sequence[Variant],
    batches: list[int],
    mps: list[int],
    env: dict[str, str],
) -> list[RunItem]:
    """One whole GPU's emulated MIG slices, then its ``mps:PCT`` shares, as MPS clients."""
    items: list[RunItem] = []
    for sl in emulated_slices(geo) if geo is not None else []:
        items += _child_items(
            variants, resource=f"mig:{sl.profiles[0]}", hardware=mps_share(gpu, sl.share),
            batches=batches, env={**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(sl.percentage)},
            gpu_index=gpu.device_index, share=sl.share, source=MPS_EMULATED,
            also=[f"mig:{p}" for p in sl.profiles[1:]], mps_client=True,
        )  # fmt: skip
    for pct in mps:
        items += _child_items(
            variants, resource=f"mps:{pct}", hardware=mps_share(gpu, pct / 100.0),
            batches=batches, env={**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)},
            gpu_index=gpu.device_index, share=pct / 100, mps_client=True,
        )  # fmt: skip
    return items


def group_items(items: Sequence[RunItem]) -> list[list[RunItem]]:
    """Consecutive child items of one resource, environment, meter and batch sizes, grouped to
    run in one child process (one interpreter, torch import and CUDA context for all of their
    variants instead of one each); in-process (CPU) items stay alone."""
    groups: list[list[RunItem]] = []

    def key(i: RunItem) -> tuple[Any, ...]:
        return (
            i.resource,
            json.dumps(i.env, sort_keys=True),
            i.device,
            json.dumps(i.meter, sort_keys=True),
            tuple(i.batches),
            i.source,
            tuple(i.also),
            i.mps_client,
            id(i.hardware) if i.hardware is not None else None,
        )

    for i in items:
        if i.in_child and groups and groups[-1][0].in_child and key(groups[-1][0]) == key(i):
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
