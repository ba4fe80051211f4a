"""The executors a plan asks for (:class:`InstanceSpec`, one per daemon) and the view of a
running instance's store row that ``apply`` and ``status`` report.

A spec's :attr:`InstanceSpec.key` is what ``apply`` compares with the running instances: an
executor whose key the plan still wants keeps running.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import PIN_GPU, PIN_MIG_INSTANCE, parse_resource
from greenctl.executor.deploy.llm_plan import plan_engines
from greenctl.executor.deploy.partition import MigSlot


@dataclass
class InstanceSpec:
    """One executor the plan wants."""

    model: str
    variant: str
    resource: str
    batch: int
    quota_rps: float | None
    mig: MigSlot | None = None
    gpu: int | None = None  # whole GPU or MPS share: NVML index
    #: how long its batches wait to fill: a glet's planned duty cycle (``placement``'s
    #: ``duty_cycle_ms``), as ``simulate`` predicts it; None: apply's ``max_wait_ms``. Not
    #: part of the key: a kept glet keeps its executor (and wait) when only its cycle moves
    max_wait_ms: float | None = None
    #: an LLM tier's engine and model path (:mod:`~greenctl.executor.deploy.llm_plan`): the
    #: key names them instead of the batch, so an engine stays when only its slots move
    engine: tuple[str, str] | None = None

    @property
    def key(self) -> str:
        if self.engine is not None:
            return f"{self.model}|{self.variant}|{self.resource}|{':'.join(self.engine)}"
        where = ""
        if self.mig is not None:
            where = f"mig{self.mig.gpu}:{self.mig.profile}@{self.mig.start}"
        elif self.gpu is not None:
            where = f"gpu{self.gpu}"
        return f"{self.model}|{self.variant}|{self.resource}|b{self.batch}|{where}"


def mig_layouts(plan: Plan) -> list[dict[str, Any]]:
    """The plan's GPUs that it lays out in MIG instances (``extra["gpus"]`` entries with a
    ``layout``): a plan that repartitions GPUs, whatever its kind."""
    gpus = plan.extra.get("gpus")
    if not isinstance(gpus, list):
        return []
    return [g for g in gpus if isinstance(g, dict) and g.get("layout")]


def desired_instances(plan: Plan) -> list[InstanceSpec]:
    """Expand a plan into one spec per executor instance.

    MIG plans with a ``gpus`` list place one executor on each listed GPU instance; other
    deployments give ``count`` instances each, an LLM tier's each with its engine.
    """
    engines = plan_engines(plan)
    specs: list[InstanceSpec] = []
    mig_deps: dict[tuple[str, str], Deployment] = {}
    gpus = plan.extra.get("gpus") if isinstance(plan.extra.get("gpus"), list) else None
    for d in plan.deployments:
        r = parse_resource(d.resource)
        glet_slots = isinstance(d.placement, dict) and isinstance(d.placement.get("starts"), list)
        if r.spec.pinning == PIN_MIG_INSTANCE and gpus and not glet_slots:
            mig_deps[(d.variant, r.size)] = d
            continue
        specs += [
            dataclasses.replace(s, engine=engines.get(d.variant)) for s in _deployment_instances(d)
        ]
    if gpus:
        specs += _layout_instances(gpus, mig_deps)
    return specs


def _per_instance_quota(d: Deployment) -> float | None:
    return None if d.quota_rps is None else d.quota_rps / max(d.count, 1)


def _deployment_instances(d: Deployment) -> list[InstanceSpec]:
    """The ``count`` instances of one deployment, each on its GPU or MIG slot if pinned."""
    r = parse_resource(d.resource)
    cycle = d.placement.get("duty_cycle_ms") if isinstance(d.placement, dict) else None
    wait = float(cycle) if isinstance(cycle, int | float) and cycle > 0 else None
    out = []
    for i in range(d.count):
        gpu = None
        if r.spec.pinning == PIN_GPU:
            gpu = gpu_index(d.device, d.placement, i)
        mig = None
        if r.spec.pinning == PIN_MIG_INSTANCE:
            start = placement_start(d.placement, i)
            if start is not None:
                mig = MigSlot(gpu_index(d.device, d.placement, i) or 0, r.size, start)
        out.append(
            InstanceSpec(
                d.model,
                d.variant,
                d.resource,
                d.batch,
                _per_instance_quota(d),
                mig=mig,
                gpu=gpu,
                max_wait_ms=wait,
            )
        )
    return out


def _layout_instances(
    gpus: list[Any], mig_deps: dict[tuple[str, str], Deployment]
) -> list[InstanceSpec]:
    """One instance per busy slice of a MIG plan's ``gpus`` layouts.

    Raises:
        InputError: a slice runs a variant no deployment places on that profile.
    """
    out = []
    for gi, g in enumerate(gpus):
        index = int(g.get("index", gi))
        for j, slot in enumerate(g.get("layout") or []):
            profile = str(slot.get("profile", "")).removeprefix("mig:")
            variant = slot.get("variant")
            if not variant:
                continue  # an idle slice
            d = mig_deps.get((variant, profile))
            if d is None:
                raise InputError(
                    f"plan gpus[{gi}].layout[{j}] runs {variant} on {profile}, but no deployment "
                    f"has variant {variant} on mig:{profile}"
                )
            out.append(
                InstanceSpec(
                    d.model,
                    variant,
                    d.resource,
                    d.batch,
                    _per_instance_quota(d),
                    mig=MigSlot(index, profile, int(slot.get("start", 0))),
                )
            )
    return out


def gpu_index(device: Any, placement: Any, i: int = 0) -> int | None:
    """The GPU of instance ``i``: ``placement.gpus[i]`` (glet plans), ``placement.gpu``,
    a numeric ``device``, else GPU 0."""
    if isinstance(placement, dict):
        gpus = placement.get("gpus")
        if isinstance(gpus, list) and i < len(gpus) and isinstance(gpus[i], int):
            return int(gpus[i])
        if isinstance(placement.get("gpu"), int):
            return int(placement["gpu"])
    if isinstance(device, int) or (isinstance(device, str) and device.isdigit()):
        return int(device)
    return 0


def placement_start(placement: Any, i: int) -> int | None:
    """The MIG memory-slot start of instance ``i``, if the placement names one."""
    if isinstance(placement, dict) and isinstance(placement.get("starts"), list):
        starts = placement["starts"]  # a glet plan's MIG glets: instance i's slot
        return int(starts[i]) if i < len(starts) else None
    if isinstance(placement, dict) and "start" in placement:
        return int(placement["start"])
    if isinstance(placement, list) and i < len(placement):
        item = placement[i]
        return int(item["start"]) if isinstance(item, dict) else int(item)
    return None


def instance_view(row: dict[str, Any]) -> dict[str, Any]:
    """What ``apply`` and ``status`` show of a running instance's store row."""
    return {
        "id": row["id"],
        "model": row["model"],
        "variant": row["variant"],
        "resource": row["resource"],
        "batch": row["batch"],
        "quota_rps": row["quota_rps"],
        "cores": json.loads(row["cores"] or "[]"),
        "device": row["device"],
        "pid": row["pid"],
        "port": row["port"],
        "restarts": row.get("restarts") or 0,
    }
