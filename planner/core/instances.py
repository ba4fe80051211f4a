"""A plan's instances as the analytic model and the simulator see them: one per copy of a
deployment, with its service time, capacity and serving path; how busy one is at a rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.policy import check_policy_name
from greenctl.planner.core.queueing import (
    BatchPrediction,
    batch_capacity_rps,
    dynamic_batch,
    front_capacity_rps,
)
from greenctl.planner.core.service import batch_service, service_time
from greenctl.planner.core.serving_path import (
    DispatcherStage,
    ServingInput,
    ServingPath,
    dispatcher_stage,
    front_cpu_ms,
    path_serves,
    serving_path,
    stretched_service,
)

ProfileKey = tuple[str, str, int]


#: How long (ms) an instance must sit idle before its next request runs "cold" (at the
#: profile's isolated latency rather than its back-to-back one). An assumption: on the
#: machines measured, runs after gaps of 5 ms and more were as slow as after 50 ms.
WARM_MS = 2.0


@dataclass(frozen=True)
class Instance:
    """One running copy of a deployment."""

    index: int
    deployment: int  # index into the deployments list
    model: str
    variant: str
    resource: str
    batch: int
    service: ServiceTime  # execution time of one batch of ``batch``
    profile: Profile
    device: str
    #: batching instances: the run time at every batch size (the one service model) and the
    #: profile behind each measured size
    batches: BatchService | None = None
    batch_profiles: tuple[tuple[int, Profile], ...] = ()
    #: an accelerator instance's executor front: the CPU (ms) its executor spends on each
    #: request on one core, in series with the device (:func:`front_cpu_ms`); 0: none modeled
    front_ms: float = 0.0

    @property
    def capacity_rps(self) -> float:
        """Requests per second this instance's device (or cores) completes when always busy
        (a batching one: as its executor batches when saturated,
        :func:`~greenctl.planner.core.queueing.batch_capacity_rps`); what its busy time and
        power are counted against."""
        if self.batches is not None:
            return batch_capacity_rps(self.batches)
        return 1000.0 * self.batch / self.service.mean_ms

    @property
    def served_capacity_rps(self) -> float:
        """Requests per second this instance serves when saturated: its device's
        :attr:`capacity_rps`, or less when its executor front saturates first
        (:func:`~greenctl.planner.core.queueing.front_capacity_rps`)."""
        return min(self.capacity_rps, front_capacity_rps(self.front_ms))


def build_instances(
    deployments: Sequence[Deployment],
    profiles: Mapping[ProfileKey, Profile],
    *,
    max_wait_ms: float | None = None,
    serving: ServingInput | None = None,
) -> list[Instance]:
    """Expand deployments into instances with their service-time distributions.

    A batching deployment (``batch > 1``) gets a batch service model from every measured batch
    size up to its own of its (variant, resource), with the executors' ``max_wait_ms`` (a
    deployment's ``placement["duty_cycle_ms"]`` wins). With a measured serving path an
    accelerator instance also gets its executor front (:func:`front_cpu_ms`).

    Raises:
        InputError: a deployment without a profile (names variant, resource and batch).
    """
    if not deployments:
        raise InputError("the plan has no deployments", hint="plan with `greenctl plan ...`")
    out: list[Instance] = []
    fitted: dict[ProfileKey, ServiceTime] = {}
    for di, dep in enumerate(deployments):
        key = (dep.variant, dep.resource, dep.batch)
        profile = profiles.get(key)
        if profile is None:
            raise InputError(
                f"no profile for variant '{dep.variant}' on '{dep.resource}' at batch "
                f"{dep.batch} (deployments[{di}])",
                hint=f"measure it with `greenctl profile --variant {dep.variant} --batch "
                f"{dep.batch}` on that resource, or load published figures with "
                "`greenctl profile import`",
            )
        if key not in fitted:
            fitted[key] = service_time(profile)  # the one model the planners size from
        wait = max_wait_ms
        if isinstance(dep.placement, dict) and dep.placement.get("duty_cycle_ms") is not None:
            wait = float(dep.placement["duty_cycle_ms"])
        batches: BatchService | None = None
        by_size: tuple[tuple[int, Profile], ...] = ()
        if dep.batch > 1:
            rows = {
                b: p
                for (v, r, b), p in profiles.items()
                if v == dep.variant and r == dep.resource and 1 <= b <= dep.batch
            }
            by_size = tuple(sorted(rows.items()))
            batches = batch_service(rows, dep.resource, dep.batch, max_wait_ms=wait)
        front = front_cpu_ms(
            serving_path(serving, dep.model, dep.variant, dep.resource), dep.resource
        )
        for _ in range(dep.count):
            idx = len(out)
            device = str(dep.device) if dep.device is not None else f"instance-{idx}"
            out.append(
                Instance(
                    index=idx,
                    deployment=di,
                    model=dep.model,
                    variant=dep.variant,
                    resource=dep.resource,
                    batch=dep.batch,
                    service=fitted[key],
                    profile=profile,
                    device=device,
                    batches=batches,
                    batch_profiles=by_size,
                    front_ms=front,
                )
            )
    return out


def cold_fraction(rate_rps: float, busy_frac: float, warm_ms: float = WARM_MS) -> float:
    """Share of requests that find their instance idle for longer than ``warm_ms``.

    Poisson arrivals see the time average (PASTA): a share ``1 - busy`` finds the instance
    idle, and the idle time before an arrival is exponential with the arrival rate.
    """
    busy = min(max(busy_frac, 0.0), 1.0)
    return (1.0 - busy) * math.exp(-max(rate_rps, 0.0) * warm_ms / 1000.0)


def warm_service(inst: Instance, rate_rps: float, busy_frac: float) -> ServiceTime:
    """The service time of ``inst`` at its load: back-to-back latency, shifted towards the
    profile's isolated latency (``isolated_p*_ms``) by :func:`cold_fraction`.

    Profiles without isolated latencies (imported, older) keep their service time.
    """
    hot, cold = inst.profile.latency_ms, inst.profile.isolated_ms
    # the points ServiceTime.from_percentiles fits, in the order of its parameters
    keys = [k for k in ("p50", "p95", "p99") if k in hot and k in cold]
    if "p50" not in keys or cold["p50"] <= hot["p50"]:
        return inst.service
    w = cold_fraction(rate_rps, busy_frac)
    if w <= 0:
        return inst.service
    mixed = {k: hot[k] + w * max(cold[k] - hot[k], 0.0) for k in keys}
    vals = [mixed[k] for k in keys]
    for i in range(1, len(vals)):  # keep them non-decreasing after the shift
        vals[i] = max(vals[i], vals[i - 1])
    return ServiceTime.from_percentiles(*vals)  # p50[, p95[, p99]] in that order


def served_service(
    inst: Instance, rate_rps: float, busy_frac: float, path: ServingPath | None
) -> tuple[ServiceTime, float]:
    """The service time of ``inst`` as served at ``rate_rps`` (per batch), and the executor
    CPU (ms per request) that shares its cores.

    A path measured on a CPU core lends its ``service_scale`` and ``executor_cpu_ms`` to CPU
    instances; one measured on a GPU, MIG or MPS resource lends its scale to instances on
    that resource (their executor's CPU is not the device's). Other instances, and those
    without a measured scale, get :func:`warm_service`.
    """
    if path is None or not path_serves(path, inst.resource):
        return warm_service(inst, rate_rps, busy_frac), 0.0
    demand = max(path.executor_cpu_ms, 0.0) if path.resource is None else 0.0
    if path.service_scale is None:
        return warm_service(inst, rate_rps, busy_frac), demand
    return stretched_service(inst.service, path), demand


def served_batches(
    inst: Instance, rate_rps: float, path: ServingPath | None = None
) -> tuple[BatchService, float] | None:
    """A batching instance's service model as served at ``rate_rps``, and the executor CPU
    (ms per request) that shares its cores; None when the rate overloads it.

    Each measured size's run becomes :func:`served_service`'s (the cold-run shift at the
    batch rate and busy time the profiled runs give, or the serving path's stretch), so
    ``predict`` and ``simulate`` run the executor's batching on the same runs.
    """
    if inst.batches is None:
        raise InputError(f"{inst.variant} on {inst.resource} does not batch")
    hot = dynamic_batch(rate_rps, inst.batches) if rate_rps > 0 else None
    if rate_rps > 0 and hot is None:
        return None
    batch_rate = rate_rps / hot.mean_batch if hot is not None else 0.0
    busy_frac = hot.busy_frac if hot is not None else 0.0
    per_size = dict(inst.batch_profiles)
    demand = 0.0

    def as_served(n: int, svc: ServiceTime) -> ServiceTime:
        nonlocal demand
        at = replace(inst, profile=per_size[n], service=svc, batch=n)
        out, demand = served_service(at, batch_rate, busy_frac, path)
        return out

    return inst.batches.map(as_served), demand


def profiles_by_key(profiles: Sequence[Profile]) -> dict[ProfileKey, Profile]:
    """Index profiles by (variant, resource, batch); the last one of a key wins."""
    return {(p.variant, p.resource, p.batch): p for p in profiles}


def check_policy(policy: str, instances: Sequence[Instance]) -> None:
    """Raises InputError for an unknown policy or batched deployments under fifo/wrr."""
    check_policy_name(policy)
    if policy != "batch":
        batched = sorted({(i.variant, i.resource, i.batch) for i in instances if i.batch > 1})
        if batched:
            v, r, b = batched[0]
            raise InputError(
                f"policy '{policy}' serves one request at a time, but {v} on {r} has batch {b}",
                hint="use --policy batch for batched deployments",
            )


def busy_stretch(inst: Instance, served: ServiceTime, demand_ms: float) -> float:
    """Busy time per unit of profiled busy time of a one-request-at-a-time instance served
    with ``served`` (:func:`served_service`) and ``demand_ms`` of executor CPU per request on
    its cores: what :func:`predict` multiplies its busy fraction by."""
    return (served.mean_ms + demand_ms) / inst.service.mean_ms


def batch_busy_frac(pred: BatchPrediction, rate_rps: float, demand_ms: float) -> float:
    """The busy fraction of a batching instance at ``rate_rps``: its device's
    (:func:`~greenctl.planner.core.queueing.dynamic_batch`) plus, on CPU, the executor's own
    work per request (``demand_ms``), which shares the cores."""
    return min(pred.busy_frac + rate_rps * demand_ms / 1000.0, 1.0)


def instance_busy(inst: Instance, rate_rps: float, path: ServingPath | None = None) -> float:
    """The share of time ``inst`` is busy at ``rate_rps`` as :func:`predict` counts it under
    ``wrr``/``batch`` (one queue per instance; 1.0 when the rate saturates it)."""
    if rate_rps <= 0:
        return 0.0
    if inst.batches is not None:
        got = served_batches(inst, rate_rps, path)
        pred = dynamic_batch(rate_rps, got[0]) if got is not None else None
        return 1.0 if got is None or pred is None else batch_busy_frac(pred, rate_rps, got[1])
    busy = busy_fraction(inst, rate_rps)
    if path is None or not path_serves(path, inst.resource):
        return busy
    served, demand = served_service(inst, rate_rps, busy, path)
    return min(busy_stretch(inst, served, demand) * busy, 1.0)


def busy_fraction(inst: Instance, rate: float) -> float:
    """Fraction of time an instance serving one request at a time executes at ``rate``."""
    return min(rate / inst.capacity_rps, 1.0)


def instances_dispatcher(
    instances: Sequence[Instance],
    model_rate: Mapping[str, float],
    shares: Sequence[float],
    serving: ServingInput | None,
) -> DispatcherStage | None:
    """The dispatcher stage of a plan's ``instances`` at ``model_rate`` (:func:`split_load`'s
    rates and shares): each instance's serving path weighted by its share of its model's
    requests (:func:`dispatcher_stage`); None without a serving path. The one construction
    :func:`predict` and the simulator both use."""
    if serving is None:
        return None
    return dispatcher_stage(
        model_rate,
        {
            m: [
                (shares[i.index], serving_path(serving, m, i.variant, i.resource))
                for i in instances
                if i.model == m
            ]
            for m in model_rate
        },
    )
