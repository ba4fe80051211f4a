"""Predict what a serving configuration does under a load: the plan's ``predicted`` block.

:func:`predict` is the analytic twin of :func:`greenctl.planner.core.simulator.simulate`; both
return the same keys (:data:`PREDICTED_KEYS`). The shared pieces (instances, load split,
energy/carbon/water/cost accounting) live here so the two agree on everything but latency.

Dispatch policies (the list, and the rule that picks a plan's, are
:mod:`greenctl.planner.core.policy`'s):

- ``fifo``: one central FIFO queue per model over all its instances (Clover's
  producer/consumer); a request goes to the fastest idle instance, else to the first to
  free up. Heterogeneous instances use the pooled M/G/c approximation of
  :func:`greenctl.planner.core.queueing.pooled_latency_quantile_ms`.
- ``wrr``: weighted round-robin over deployments by ``quota_rps`` (InfAdapter), round-robin
  over a deployment's instances; each instance is a G/G/1 queue whose arrivals are a
  fraction ``p`` of one Poisson stream spread evenly (stride scheduling), so ``ca2 = p``.
- ``batch``: the same split, each instance batching dynamically up to its deployment's
  ``batch`` as its executor does: a batch closes when full or ``max_wait_ms`` after its first
  request (the executors' :data:`~greenctl.data.batching.DEFAULT_MAX_WAIT_MS`, or a glet's
  planned ``placement["duty_cycle_ms"]``) and runs for the time of its padded size, from the
  profiles at every measured batch size of the (variant, resource)
  (:func:`greenctl.planner.core.service.batch_service`,
  :func:`greenctl.planner.core.queueing.dynamic_batch`).

Load split: over models by ``rate_rps`` when it is a dict, else in proportion to their
quotas when every deployment has one, else to their capacity. Over deployments of a model
(``wrr``/``batch``) likewise by quota, else by capacity.

Energy: an instance draws its profile's busy ``power_w`` while serving and its
``idle_power_w`` otherwise (busy power falls back to ``energy_j x throughput``); each
device additionally draws ``device_idle_power_w`` all the time (instances with the same
``device`` share one; an instance without ``device`` is a device of its own). Energy per
request = total power / served rate. Carbon (g) = energy (J) / 3.6e6 (kWh) x PUE x carbon
intensity (g/kWh). Water (L) = energy (kWh) x (PUE x indirect EWIF + direct WUE). A solver
prices a plan by the same rule through :func:`energy_terms`: per instance its idle power, plus
per request it serves the busy energy above idle (:class:`EnergyTerms`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import hourly_cost, kind_of
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.policy import check_policy_name
from greenctl.planner.core.queueing import (
    BatchPrediction,
    LatencyModel,
    WaitTime,
    batch_capacity_rps,
    dynamic_batch,
    front_capacity_rps,
    front_wait,
    mgc_model,
    mixture_model,
    mixture_quantiles,
    pooled_shares,
    stage_wait,
    with_front,
    with_overhead,
    with_stage_wait,
)
from greenctl.planner.core.service import batch_service, service_time

PREDICTED_KEYS = (
    "rate_rps",
    "served_rps",
    "dropped_rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "slo_violation_frac",
    "accuracy",
    "power_w",
    "energy_j_per_request",
    "carbon_g_per_request",
    "water_l_per_request",
    "cost_per_hour",
    "cost_priced",  # False: some instance's cost is its resource amount (no price profiled)
    "utilisation",
    "overloaded",
)

ProfileKey = tuple[str, str, int]
#: a latency SLO in ms: one for every request, or each variant's own (``{variant: ms}``, a
#: glet plan's models; a variant without one is held to none)
SloInput = float | Mapping[str, float] | None


#: What a prediction's latency holds (``latency_includes``), with and without a measured
#: serving path (``greenctl profile serving``).
LATENCY_WITH_PATH = "model + measured serving path (client, dispatcher, executor)"
LATENCY_MODEL_ONLY = "model only: run `greenctl profile serving` to add the serving path"


def slo_for(slo: SloInput, variants: Sequence[str]) -> float | None:
    """The SLO (ms) requests served by ``variants`` are held to: the one SLO, else the
    strictest of those variants' own (None: none)."""
    if slo is None or isinstance(slo, int | float):
        return None if slo is None else float(slo)
    own = [float(slo[v]) for v in variants if v in slo]
    return min(own) if own else None


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

    A batching deployment (``batch > 1``) gets its batch service model from the profiles of
    every measured batch size up to its own of its (variant, resource) in ``profiles``, with
    the executors' batching (``max_wait_ms``, default
    :data:`~greenctl.data.batching.DEFAULT_MAX_WAIT_MS`; a deployment's
    ``placement["duty_cycle_ms"]``, a glet's planned cycle, wins). With the measured serving
    path (``serving``, as :func:`predict` takes it) an accelerator instance gets its executor
    front (:func:`front_cpu_ms`).

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
        front = front_cpu_ms(_path_for(serving, dep.model, dep.variant, dep.resource), dep.resource)
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


@dataclass(frozen=True)
class ServingPath:
    """The measured serving path of a model (``greenctl profile serving``).

    Attributes:
        overhead_ms: equiprobable samples of the latency a request spends outside the model
            (client, dispatcher and executor hops), added to every request's latency.
        executor_cpu_ms: CPU the executor daemon spends per request; on CPU instances it
            runs on the instance's cores, so it delays the requests queued behind. On a GPU,
            MIG or MPS instance (a path measured on its resource) it is the executor's front,
            a serial stage on one core before the device (:func:`front_cpu_ms`).
        service_scale: the median model run inside a served executor over the profile's
            back-to-back median (CPU, batch 1), when it was measured (a ``model`` stand-in).
            A CPU instance's service time is then its back-to-back service stretched by it,
            at every load: served runs stay about as slow as the profile's isolated runs
            (``tiny-l`` on one core: 4.8/4.7/4.6 ms at 20/100/160 req/s against 2.3 ms
            back-to-back and 4.75 ms isolated), so the cold-run shift of
            :func:`warm_service` does not apply. ``None``: not measured (a ``noop``
            stand-in); the cold-run shift applies.
        tail_scale: the same ratio at p95 and p99 (served runs have a longer tail than
            back-to-back ones, the more so at low load: ``tiny-l`` served at 20 req/s had a
            p95 of 9 ms against its 4.8 ms median), when measured (the median over the
            rates of one ``profile serving`` run, see
            :func:`greenctl.executor.runtime.serving.serving_overheads`); ``None``: the
            back-to-back shape is stretched by ``service_scale`` alone.
        resource: where the path was measured when not on a CPU core (``gpu:MODEL``,
            ``mig:PROFILE``, ``mps:PCT``; ``profile serving --resource``): its scales and its
            executor front then apply to instances on that resource only, with no executor
            CPU charged to the device. ``None``: measured on a CPU core, applying to CPU
            instances.
        dispatcher_cpu_ms: CPU the dispatcher process spends per request of this model
            (``profile serving``'s dispatcher path, at the measured rate nearest the plan's
            total: :func:`greenctl.executor.runtime.serving.serving_overheads`): the dispatcher is
            then a serial stage every request of the plan crosses (:class:`DispatcherStage`).
            ``None``: not measured (a direct path, or bare samples); the stage is not modeled.
        rate_rps: the load (req/s, through the dispatcher, this model alone) the overhead
            samples were measured at: they hold the dispatcher's wait at that rate, which
            :meth:`DispatcherStage.overhead_ms` does not add again. ``None``: unknown, taken
            as an idle dispatcher (its whole wait is added).
    """

    overhead_ms: tuple[float, ...]
    executor_cpu_ms: float = 0.0
    service_scale: float | None = None
    tail_scale: tuple[float, float] | None = None
    resource: str | None = None
    dispatcher_cpu_ms: float | None = None
    rate_rps: float | None = None


ServingInput = Mapping[str, "ServingPath | Sequence[float]"] | ServingPath | Sequence[float]


def _as_path(value: ServingPath | Sequence[float] | None) -> ServingPath | None:
    if value is None or isinstance(value, ServingPath):
        return value
    return ServingPath(tuple(float(x) for x in value)) if len(value) else None


def _path_for(
    serving: ServingInput | None,
    model: str,
    variant: str | None = None,
    resource: str | None = None,
) -> ServingPath | None:
    """The serving path of a variant: measured on its own resource (``variant@resource``),
    else its own entry, else its model's, else ``"*"``."""
    if serving is None or isinstance(serving, ServingPath):
        return serving
    if isinstance(serving, Mapping):
        on = f"{variant}@{resource}" if variant and resource else None
        for key in (on, variant, model, "*"):
            if key is not None and serving.get(key) is not None:
                return _as_path(serving[key])
        return None
    return _as_path(serving)


def path_serves(path: ServingPath, resource: str) -> bool:
    """Whether ``path``'s served run (and executor CPU) holds on ``resource``: a path
    measured on a CPU core for CPU instances, one measured on a GPU, MIG or MPS resource for
    instances on that very resource."""
    if path.resource is not None:
        return path.resource == resource
    return kind_of(resource).pins_cores


def front_cpu_ms(path: ServingPath | Sequence[float] | None, resource: str) -> float:
    """The executor front of an instance on ``resource``: the CPU (ms) its executor spends
    on each request on one core, in series with the device.

    An accelerator instance (GPU, MIG, MPS) is served through one executor process whose
    event loop receives each request (a 224x224 image is 600 KB), decodes it, enqueues it
    and encodes the answer: one request at a time, whatever the device could take. Its
    capacity is then at most ``1000 / front`` req/s and its requests wait for the front
    (:func:`~greenctl.planner.core.queueing.with_front`). The figure is the path's
    ``executor_cpu_ms`` when the path was measured on that very resource (``greenctl
    profile serving --resource``): the whole executor process's CPU per request, so the
    front is taken at the most it can be. 0 (no front modeled, the instance as its device
    alone) for CPU instances, whose executor CPU shares the instance's cores
    (:func:`served_service`), and where no executor CPU was measured on the resource
    (bare overhead samples included).
    """
    if not isinstance(path, ServingPath) or path.resource is None:
        return 0.0
    if not path_serves(path, resource):
        return 0.0
    if not kind_of(resource).accelerator:
        return 0.0
    cpu = float(path.executor_cpu_ms or 0.0)
    return cpu if math.isfinite(cpu) and cpu > 0 else 0.0


def front_held_wait(
    path: ServingPath | Sequence[float] | None, front_ms: float, rate_rps: float
) -> WaitTime | None:
    """The executor-front wait that ``path``'s overhead samples hold: they were measured
    through that front (``profile serving --resource``, one executor) at ``path.rate_rps``,
    so they hold its wait at that rate (:func:`~greenctl.planner.core.queueing.with_front`
    adds only its growth to ``rate_rps``, the instance's rate); the wait at ``rate_rps``
    where the measured rate was past the front's capacity (the samples hold more: nothing
    is added); None without a front or a measured rate (nothing is taken as held)."""
    measured = path.rate_rps if isinstance(path, ServingPath) else None
    if front_ms <= 0 or measured is None or measured <= 0:
        return None
    then = front_wait(float(measured), front_ms)
    return front_wait(rate_rps, front_ms) if then is None else then


def dispatcher_cpu_ms(path: ServingPath | Sequence[float] | None) -> float | None:
    """The dispatcher's CPU (ms) per request measured with ``path``; None when not measured
    (bare overhead samples, a direct path, a figure that is not a number > 0)."""
    if not isinstance(path, ServingPath) or path.dispatcher_cpu_ms is None:
        return None
    cpu = float(path.dispatcher_cpu_ms)
    return cpu if math.isfinite(cpu) and cpu > 0 else None


@dataclass(frozen=True)
class DispatcherStage:
    """The dispatcher as a serial stage: one event loop on one core that every request of a
    plan crosses before its executor (:mod:`greenctl.executor.runtime.dispatcher`), whatever model
    it is for (module docstring of :mod:`~greenctl.planner.core.queueing`, "The dispatcher").

    Attributes:
        rate_rps: the plan's total rate, every model's requests.
        cpu_ms: ``(rate share, CPU ms per request)`` by model: each model's measured
            :attr:`ServingPath.dispatcher_cpu_ms`; a model whose paths have none is charged
            the measured models' rate-weighted mean (the stage is one process: its requests
            cannot pass it uncharged).
        unmeasured: the models charged that mean.
    """

    rate_rps: float
    cpu_ms: tuple[tuple[float, float], ...]
    unmeasured: tuple[str, ...] = ()

    @property
    def mean_cpu_ms(self) -> float:
        """The CPU (ms) the dispatcher spends on the plan's average request."""
        total = sum(w for w, _ in self.cpu_ms)
        return sum(w * f for w, f in self.cpu_ms) / total

    @property
    def capacity_rps(self) -> float:
        """The most requests per second the dispatcher carries for the whole plan
        (:func:`~greenctl.planner.core.queueing.front_capacity_rps` of the mean)."""
        return front_capacity_rps(self.mean_cpu_ms)

    @property
    def utilisation(self) -> float:
        """The share of its core the dispatcher is busy at the plan's rate (>= 1: overloaded)."""
        return self.rate_rps / self.capacity_rps

    @property
    def overloaded(self) -> bool:
        """Whether the plan's rate reaches what the dispatcher can carry (its queue has no
        steady state: :meth:`wait` is None)."""
        return self.wait() is None

    def wait(self) -> WaitTime | None:
        """A request's wait at the dispatcher at the plan's rate (None: overloaded)."""
        return stage_wait(self.rate_rps, self.cpu_ms)

    def held_wait(self, path: ServingPath | None) -> WaitTime | None:
        """The dispatcher wait ``path``'s overhead samples hold (they were measured through
        it): its wait at ``path.rate_rps`` with ``path``'s own CPU figure; the wait at the
        plan's rate where that rate was past its capacity (the samples hold more: nothing is
        added); None without a rate or a figure (nothing is taken as held)."""
        own = dispatcher_cpu_ms(path)
        if own is None or path is None or not path.rate_rps or path.rate_rps <= 0:
            return None
        then = stage_wait(float(path.rate_rps), ((1.0, own),))
        return self.wait() if then is None else then

    def overhead_ms(self, path: ServingPath | None) -> tuple[float, ...]:
        """The overhead samples of a request served through ``path`` with the dispatcher's
        wait at the plan's rate: the path's samples (or 0 ms without a path) plus how much
        longer a request waits there than when the path was measured
        (:func:`~greenctl.planner.core.queueing.with_stage_wait` of :meth:`held_wait`).

        Raises:
            InputError: the dispatcher is overloaded (:attr:`overloaded`).
        """
        now = self.wait()
        if now is None:
            raise InputError(
                f"the dispatcher is overloaded: {self.rate_rps:,.0f} req/s at "
                f"{self.mean_cpu_ms:.3g} ms of CPU per request (at most "
                f"{self.capacity_rps:,.0f} req/s)"
            )
        samples = path.overhead_ms if path is not None and len(path.overhead_ms) else (0.0,)
        return with_stage_wait(samples, now, self.held_wait(path))


def dispatcher_stage(
    model_rates: Mapping[str, float],
    paths: Mapping[str, Sequence[tuple[float, ServingPath | Sequence[float] | None]]],
) -> DispatcherStage | None:
    """The plan's dispatcher stage from each model's rate and the serving paths its requests
    are served through, each with its share of them (``(share, path)``, :func:`serving_path`);
    None when no path of any model has the dispatcher's CPU measured
    (:func:`dispatcher_cpu_ms`): the stage is then not modeled and every figure is as
    without it.

    A model's CPU per request is its measured paths' mean, weighted by their shares (the
    dispatcher forwards a model's requests alike, whichever instance they go to: the figures
    differ by the rate and run they were measured at; equal weights where the shares are 0).
    The models' shares of the stage are their rates (equal shares at no load).
    """
    figures: dict[str, float] = {}
    for m in model_rates:
        got = [(max(float(w), 0.0), dispatcher_cpu_ms(p)) for w, p in paths.get(m, ())]
        measured = [(w, f) for w, f in got if f is not None]
        if not measured:
            continue
        if sum(w for w, _ in measured) <= 0:
            measured = [(1.0, f) for _, f in measured]
        figures[m] = sum(w * f for w, f in measured) / sum(w for w, _ in measured)
    if not figures:
        return None
    rates = {m: max(float(r), 0.0) for m, r in model_rates.items()}
    total = sum(rates.values())
    weight = rates if total > 0 else {m: 1.0 for m in rates}
    seen = sum(weight[m] for m in figures)
    mean = (
        sum(weight[m] * f for m, f in figures.items()) / seen
        if seen > 0
        else sum(figures.values()) / len(figures)
    )
    cpu = tuple((weight[m], figures.get(m, mean)) for m in rates if weight[m] > 0)
    return DispatcherStage(total, cpu, tuple(m for m in rates if m not in figures))


def planned_dispatcher(
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    model_rates: Mapping[str, float],
    variants: Mapping[str, Iterable[str]],
) -> DispatcherStage | None:
    """The dispatcher stage of a plan still to be made (a planner's, before it knows which
    variants serve): :func:`dispatcher_stage` over every measured path of each model, its own
    entry, its variants' and theirs measured on a resource (``variant@resource``), weighted
    alike, ``variants`` naming each model's. None without a dispatcher figure among them."""
    if not serving:
        return None
    paths: dict[str, list[tuple[float, ServingPath | Sequence[float] | None]]] = {}
    for model in model_rates:
        names = set(variants.get(model, ()))
        paths[model] = [
            (1.0, p)
            for key, p in serving.items()
            if key == model or key in names or key.split("@", 1)[0] in names
        ]
    return dispatcher_stage(model_rates, paths)


def dispatcher_note(stage: DispatcherStage | None) -> str:
    """What a plan's ``latency_includes`` says of the dispatcher stage (a clause that starts
    with ``"; "``): modeled, with its measured CPU, capacity and load, or not modeled."""
    if stage is None:
        return (
            "; the dispatcher's queueing is not modeled (no dispatcher CPU measured: "
            "`greenctl profile serving` measures it on its dispatcher path)"
        )
    note = (
        f"; the dispatcher, a serial stage on one core for all the plan's requests "
        f"({stage.mean_cpu_ms:.2g} ms of CPU per request measured, at most "
        f"{stage.capacity_rps:,.0f} req/s; modeled {100 * stage.utilisation:.0f} % busy at "
        f"{stage.rate_rps:,.0f} req/s"
    )
    if stage.overloaded:
        note += ": overloaded, the plan's rate exceeds what it can carry"
    note += ")"
    if stage.unmeasured:
        note += (
            "; no dispatcher CPU measured for "
            + ", ".join(stage.unmeasured)
            + ": charged the measured models' mean"
        )
    return note


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


def stretched_service(hot: ServiceTime, path: ServingPath) -> ServiceTime:
    """A back-to-back service time as served: its p50 (and p95, p99 when measured)
    stretched by the path's ratios (:class:`ServingPath`); ``hot`` without a ratio."""
    if path.service_scale is None:
        return hot
    if path.tail_scale is None:
        return hot.scaled(path.service_scale)
    vals = [
        hot.quantile(q) * r
        for q, r in zip((0.5, 0.95, 0.99), (path.service_scale, *path.tail_scale), strict=True)
    ]
    for i in range(1, 3):  # non-decreasing
        vals[i] = max(vals[i], vals[i - 1])
    return ServiceTime.from_percentiles(*vals)


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


def split_load(
    instances: Sequence[Instance],
    deployments: Sequence[Deployment],
    rate_rps: float | Mapping[str, float],
) -> tuple[dict[str, float], list[float]]:
    """The rate of each model, and each instance's share (0..1) of its model's rate.

    The per-instance shares are what ``wrr`` and ``batch`` dispatch by (quota, else
    capacity, split evenly over a deployment's instances); ``fifo`` ignores them.
    """
    models = list(dict.fromkeys(i.model for i in instances))
    cap_of_dep: dict[int, float] = {}
    for inst in instances:
        cap_of_dep[inst.deployment] = (
            cap_of_dep.get(inst.deployment, 0.0) + inst.served_capacity_rps
        )
    all_quota = all(d.quota_rps is not None for d in deployments)
    if isinstance(rate_rps, Mapping):
        unknown = sorted(set(rate_rps) - set(models))
        if unknown:
            raise InputError(f"rate given for models not in the plan: {', '.join(unknown)}")
        model_rate = {m: float(rate_rps.get(m, 0.0)) for m in models}
    else:
        weights = {}
        for m in models:
            deps = {i.deployment for i in instances if i.model == m}
            if all_quota:
                weights[m] = sum(float(deployments[d].quota_rps or 0.0) for d in deps)
            else:
                weights[m] = sum(cap_of_dep[d] for d in deps)
        total = sum(weights.values())
        if total <= 0:
            weights = {m: 1.0 for m in models}
            total = float(len(models))
        model_rate = {m: float(rate_rps) * weights[m] / total for m in models}
    for m, r in model_rate.items():
        if not math.isfinite(r) or r < 0:
            raise InputError(f"rate for model '{m}' must be a finite number >= 0, got {r}")
    shares = [0.0] * len(instances)
    for m in models:
        dep_ids = sorted({i.deployment for i in instances if i.model == m})
        model_quota = all(deployments[d].quota_rps is not None for d in dep_ids)
        dep_w = {
            d: (float(deployments[d].quota_rps or 0.0) if model_quota else cap_of_dep[d])
            for d in dep_ids
        }
        total = sum(dep_w.values())
        if total <= 0:
            dep_w = {d: cap_of_dep[d] for d in dep_ids}
            total = sum(dep_w.values())
        for inst in instances:
            if inst.model == m:
                shares[inst.index] = (
                    dep_w[inst.deployment] / total / deployments[inst.deployment].count
                )
    return model_rate, shares


def account(
    instances: Sequence[Instance],
    variants: Mapping[str, Variant],
    *,
    rate_rps: float,
    served_rps: Sequence[float],
    busy_frac: Sequence[float],
    carbon_g_per_kwh: float | None = None,
    pue: float = 1.0,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    device_idle_power_w: float | None = None,
    spare_idle_w: float = 0.0,
) -> dict[str, Any]:
    """Throughput, accuracy, power, energy, carbon, water and cost of a configuration.

    Args:
        served_rps: per instance, the rate it completes.
        busy_frac: per instance, the fraction of time it executes (0..1).
        spare_idle_w: idle power no instance carries (:func:`spare_idle_w`).
    """
    if pue < 1.0 or not math.isfinite(pue):
        raise InputError(f"PUE must be a number >= 1, got {pue}")
    if carbon_g_per_kwh is not None:
        carbon_option(carbon_g_per_kwh, "carbon intensity")
    for name, value in (
        ("WUE", wue_l_per_kwh),
        ("EWIF", ewif_l_per_kwh),
        ("device idle power", device_idle_power_w),
    ):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise InputError(f"{name} must be a number >= 0, got {value}")
    served = float(sum(served_rps))
    out: dict[str, Any] = {
        "rate_rps": float(rate_rps),
        "served_rps": served,
        "dropped_rps": _clean(max(float(rate_rps) - served, 0.0), float(rate_rps)),
    }
    # accuracy, request-weighted
    acc_num, acc_known = 0.0, True
    for inst, s in zip(instances, served_rps, strict=True):
        if s <= 0:
            continue
        variant = variants.get(inst.variant)
        if variant is None or variant.accuracy is None:
            acc_known = False
            continue
        acc_num += s * float(variant.accuracy)
    out["accuracy"] = acc_num / served if acc_known and served > 0 else None
    # power
    power, power_known = 0.0, True
    for inst, u in zip(instances, busy_frac, strict=True):
        busy_w = inst.profile.power_w
        if busy_w is None and inst.profile.energy_j is not None:
            busy_w = inst.profile.energy_j * inst.capacity_rps
        if busy_w is None:
            power_known = False
            continue
        idle_w = inst.profile.idle_power_w or 0.0
        u = min(max(u, 0.0), 1.0)
        power += u * busy_w + (1.0 - u) * idle_w
    if device_idle_power_w:
        power += device_idle_power_w * len({inst.device for inst in instances})
    power += spare_idle_w
    out["power_w"] = power if power_known else None
    energy = power / served if power_known and served > 0 else None
    out["energy_j_per_request"] = energy
    kwh = energy / 3.6e6 if energy is not None else None
    out["carbon_g_per_request"] = (
        kwh * pue * carbon_g_per_kwh if kwh is not None and carbon_g_per_kwh is not None else None
    )
    if kwh is not None and (wue_l_per_kwh is not None or ewif_l_per_kwh is not None):
        out["water_l_per_request"] = kwh * (pue * (ewif_l_per_kwh or 0.0) + (wue_l_per_kwh or 0.0))
    else:
        out["water_l_per_request"] = None
    # priced as the planners price: a profile without cost_per_hour costs its resource amount
    costs = [hourly_cost(i.resource, i.profile.cost_per_hour) for i in instances]
    out["cost_per_hour"] = float(sum(c for c, _ in costs))
    out["cost_priced"] = all(priced for _, priced in costs)
    out["utilisation"] = (
        float(sum(min(max(u, 0.0), 1.0) for u in busy_frac) / len(instances)) if instances else 0.0
    )
    return out


# -- the energy of one instance, as the solvers price it ---------------------------------------
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
    busy = _busy_fraction(inst, rate_rps)
    if path is None or not path_serves(path, inst.resource):
        return busy
    served, demand = served_service(inst, rate_rps, busy, path)
    return min(busy_stretch(inst, served, demand) * busy, 1.0)


@dataclass(frozen=True)
class EnergyTerms:
    """The power of one instance as linear terms: ``idle_w + dynamic_j_per_request x rate``.

    Summed over a plan's instances (``idle_w`` per instance, ``dynamic_j_per_request`` per
    request each serves) they give :func:`predict`'s ``power_w``; divided by the rate served,
    its ``energy_j_per_request``. Exact at every rate below saturation for an instance that
    serves one request at a time with a rate-independent service (``linear``); otherwise (a
    batching instance: partial batches at low rates; a serving path without a measured
    ``service_scale``, whose cold runs depend on the rate) exact at ``rate_rps`` only, the
    secant of the power curve from the idle point.

    Attributes:
        idle_w: the instance's power at no load (its profile's ``idle_power_w``), drawn
            whether it serves or not.
        dynamic_j_per_request: busy minus idle power times busy time per request served.
        rate_rps: the per-instance rate the terms were taken at.
        linear: whether they hold at every rate below saturation (never for a batching
            instance; otherwise checked at half the rate).
    """

    idle_w: float
    dynamic_j_per_request: float
    rate_rps: float
    linear: bool

    def power_w(self, rate_rps: float) -> float:
        """The instance's power at ``rate_rps`` (req/s) by these terms."""
        return self.idle_w + self.dynamic_j_per_request * rate_rps


def instance_power_w(
    inst: Instance, rate_rps: float, serving: ServingInput | None = None
) -> float | None:
    """The power (W) of ``inst`` serving ``rate_rps`` alone under ``wrr``/``batch``, by the
    rule :func:`predict` accounts with (:func:`account`); None when its profile has no power."""
    path = _path_for(serving, inst.model, inst.variant, inst.resource)
    busy = instance_busy(inst, rate_rps, path)
    return account([inst], {}, rate_rps=rate_rps, served_rps=[rate_rps], busy_frac=[busy])[
        "power_w"
    ]


def energy_terms(
    deployment: Deployment,
    profiles: Mapping[ProfileKey, Profile],
    *,
    rate_rps: float,
    serving: ServingInput | None = None,
    max_wait_ms: float | None = None,
) -> EnergyTerms | None:
    """The linear power terms of one instance of ``deployment`` (its variant, resource and
    batch; its count is ignored) at the operating point ``rate_rps`` (req/s per instance):
    what a solver sums over a plan to get :func:`predict`'s ``power_w`` (:class:`EnergyTerms`).

    ``profiles``, ``serving`` and ``max_wait_ms`` as :func:`predict` takes them (every
    measured batch size of a batching deployment's (variant, resource)). None when the
    profile has neither ``power_w`` nor ``energy_j``.

    Raises:
        InputError: no profile for the deployment, or a rate that is not a finite number > 0.
    """
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise InputError(f"an operating point must be a rate > 0 req/s, got {rate_rps}")
    (inst,) = build_instances(
        [replace(deployment, count=1)], profiles, max_wait_ms=max_wait_ms, serving=serving
    )
    idle = instance_power_w(inst, 0.0, serving)
    power = instance_power_w(inst, rate_rps, serving)
    if idle is None or power is None:
        return None
    dynamic = (power - idle) / rate_rps
    linear = False  # a batching instance: its batches fill with the rate
    if inst.batches is None:
        half = instance_power_w(inst, 0.5 * rate_rps, serving)
        linear = half is not None and math.isclose(
            half, idle + dynamic * 0.5 * rate_rps, rel_tol=1e-9, abs_tol=1e-12
        )
    return EnergyTerms(idle, dynamic, float(rate_rps), linear)


def _clean(value: float, scale: float) -> float:
    """Round float noise (relative to ``scale``) to zero."""
    return 0.0 if abs(value) <= 1e-9 * max(abs(scale), 1.0) else value


def _order(result: dict[str, Any], slo: bool) -> dict[str, Any]:
    return {k: result.get(k) for k in PREDICTED_KEYS if slo or k != "slo_violation_frac"}


def predict(
    deployments: Sequence[Deployment],
    profiles: Mapping[ProfileKey, Profile],
    variants: Mapping[str, Variant],
    *,
    rate_rps: float | Mapping[str, float],
    policy: str = "fifo",
    percentile_slo_ms: SloInput = None,
    carbon_g_per_kwh: float | None = None,
    pue: float = 1.0,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    device_idle_power_w: float | None = None,
    max_wait_ms: float | None = None,
    serving: ServingInput | None = None,
    spare_idle_w: float = 0.0,
) -> dict[str, Any]:
    """Analytic prediction of a configuration's latency, accuracy, energy, carbon and cost.

    Args:
        deployments: the plan's deployments.
        profiles: ``{(variant, resource, batch): Profile}`` (see :func:`profiles_by_key`).
        variants: ``{name: Variant}`` for accuracy.
        rate_rps: the total arrival rate (Poisson), or ``{model: rate}``.
        policy: ``fifo``, ``wrr`` or ``batch`` (module docstring).
        percentile_slo_ms: an SLO in ms, or each variant's own (``{variant: ms}``, a glet
            plan's models, :func:`slo_for`); adds ``slo_violation_frac``.
        carbon_g_per_kwh: grid carbon intensity (g CO2 / kWh).
        pue: power usage effectiveness (>= 1).
        wue_l_per_kwh: direct (on-site) water usage effectiveness, L/kWh.
        ewif_l_per_kwh: indirect (electricity generation) water intensity, L/kWh.
        device_idle_power_w: idle power of each whole device, shared by its instances.
        spare_idle_w: idle power no instance carries: the compute slices of a MIG plan's
            GPUs that hold no instance (:func:`spare_idle_w`).
        max_wait_ms: how long an executor waits for a batch to fill (default: the executors'
            :data:`~greenctl.data.batching.DEFAULT_MAX_WAIT_MS`; a deployment's
            ``placement["duty_cycle_ms"]`` wins).
        serving: the measured serving path (``greenctl profile serving``): a
            :class:`ServingPath` or bare overhead samples in ms, one for every model or
            ``{variant or model: ...}`` (a variant's own entry first, then its model's, then
            ``"*"``). Its overhead is added to every
            request's latency and its executor CPU delays the queue of CPU instances; on a
            GPU, MIG or MPS instance a path measured on that resource adds the executor's
            front, a serial CPU stage before the device that caps the instance at
            ``1000 / executor_cpu_ms`` req/s and whose wait every request adds
            (:func:`front_cpu_ms`; none where no executor CPU was measured there).
            Where a path has the dispatcher's CPU measured (``dispatcher_cpu_ms``), the
            dispatcher is a serial stage all the plan's requests cross
            (:class:`DispatcherStage`): a request adds its wait at the plan's total rate
            beyond the wait its path's samples were measured with, and a total rate at or
            above its capacity overloads the plan (it forwards at most its capacity, the
            rest dropped). Without it latencies are the model's alone.

    Latency also accounts for cold runs: a request that finds its instance idle runs at the
    profile's isolated latency when the profile has one (:func:`warm_service`), unless the
    serving path measured how fast the model runs when served (:func:`served_service`).
    On CPU instances with a serving path, busy time (so utilisation and energy) counts the
    served run time and the executor's own CPU.

    Returns:
        A dict with :data:`PREDICTED_KEYS` (``slo_violation_frac`` only with an SLO).
        An overloaded configuration (load at or above capacity of any queue) has
        ``overloaded`` True, ``p50/p95/p99_ms`` = ``math.inf``, the excess as
        ``dropped_rps`` and every request of an overloaded queue counted as violating.

    Raises:
        InputError: a missing profile, an unknown policy, a bad number.
    """
    instances = build_instances(deployments, profiles, max_wait_ms=max_wait_ms, serving=serving)
    check_policy(policy, instances)
    model_rate, shares = split_load(instances, deployments, rate_rps)
    total_rate = sum(model_rate.values())
    # the dispatcher: one serial stage every request crosses, where its CPU was measured
    stage = instances_dispatcher(instances, model_rate, shares, serving)
    passed = model_rate  # what the dispatcher forwards: at most its capacity, pro rata
    if stage is not None and stage.overloaded and total_rate > 0:
        passed = {m: r * stage.capacity_rps / total_rate for m, r in model_rate.items()}
    dispatched: dict[ServingPath | None, tuple[float, ...]] = {}

    def overhead_of(path: ServingPath | None) -> tuple[float, ...]:
        """The path's overhead samples, with the dispatcher's wait at the plan's rate."""
        if stage is None or stage.overloaded:
            return path.overhead_ms if path is not None else ()
        if path not in dispatched:
            dispatched[path] = stage.overhead_ms(path)
        return dispatched[path]

    served = [0.0] * len(instances)
    busy = [0.0] * len(instances)
    # busy time per unit of profiled busy time, on instances with a serving path measured on
    # their kind of resource (served runs, and on CPU the executor's own CPU, take longer)
    stretch = [1.0] * len(instances)

    def served_at(
        i: Instance, rate: float, busy_frac: float
    ) -> tuple[ServiceTime, float]:  # served_service, noting the instance's busy stretch
        path = _path_for(serving, i.model, i.variant, i.resource)
        svc, demand = served_service(i, rate, busy_frac, path)
        if path is not None and path_serves(path, i.resource):
            stretch[i.index] = busy_stretch(i, svc, demand)
        return svc, demand

    parts: list[tuple[float, LatencyModel]] = []
    violation = 0.0
    overloaded = False

    def batching(i: Instance, rate: float) -> tuple[LatencyModel | None, float]:
        """A batching instance at ``rate``: its latency model and busy fraction."""
        got = served_batches(i, rate, _path_for(serving, i.model, i.variant, i.resource))
        if got is None:
            return None, 1.0
        model, demand = got
        pred = dynamic_batch(rate, model)
        if pred is None:
            return None, 1.0
        return pred.latency, batch_busy_frac(pred, rate, demand)

    def queue(
        rate: float,
        members: list[Instance],
        model: LatencyModel | None,
        busy_frac: float | None = None,
        *,
        ca2: float = 1.0,
    ) -> None:
        nonlocal violation, overloaded
        if rate <= 0:
            return
        path = _path_for(serving, members[0].model, members[0].variant, members[0].resource)
        overhead = overhead_of(path)
        if model is not None and any(i.front_ms > 0 for i in members):
            # on an accelerator, the executor's front before the device (on CPU the
            # executor's own work shares the cores instead), each at its instance's share
            # of a pooled queue, with the path's overhead
            pooled = (
                pooled_shares(rate, [m.service for m in members]) if len(members) > 1 else [1.0]
            )
            model = mixture_model(
                [
                    (
                        float(g),
                        with_front(
                            model,
                            rate * g,
                            i.front_ms,
                            ca2=ca2,
                            overhead_ms=overhead,
                            held=front_held_wait(path, i.front_ms, rate * g),
                        ),
                    )
                    for i, g in zip(members, pooled, strict=True)
                ]
            )
        elif model is not None and overhead:
            model = with_overhead(model, overhead)
        if model is None:
            overloaded = True
            violation += rate
            for i in members:  # saturated: serving at capacity, the device busy throughout
                served[i.index] = i.served_capacity_rps  # (unless its executor front binds)
                busy[i.index] = min(i.served_capacity_rps / i.capacity_rps, 1.0)
            return
        parts.append((rate, model))
        slo = slo_for(percentile_slo_ms, [i.variant for i in members])
        if slo is not None:
            violation += rate * float(model.sf(slo)[0])
        if policy == "fifo" and len(members) > 1:
            # Pooled queue: fastest idle instance first (queueing.pooled_shares).
            for i, share in zip(
                members, pooled_shares(rate, [m.service for m in members]), strict=True
            ):
                served[i.index] = rate * float(share)
                busy[i.index] = min(stretch[i.index] * served[i.index] / i.capacity_rps, 1.0)
        else:
            (i,) = members
            served[i.index] = rate
            if busy_frac is None:
                busy_frac = stretch[i.index] * _busy_fraction(i, rate)
            busy[i.index] = min(busy_frac, 1.0)

    for m, rate in passed.items():
        members = [i for i in instances if i.model == m]
        if policy == "fifo":
            model = None
            if rate > 0:
                got = pooled_shares(rate, [i.service for i in members])
                loaded = [
                    served_at(i, rate * float(g), rate * float(g) / i.capacity_rps)
                    for i, g in zip(members, got, strict=True)
                ]
                # one pooled queue: the first instance's executor CPU stands for all
                model = mgc_model(rate, [s for s, _ in loaded], demand_ms=loaded[0][1])
            queue(rate, members, model)
        else:
            for i in members:
                r = rate * shares[i.index]
                if policy == "batch" and i.batches is not None:
                    if r > 0:
                        queue(r, [i], *batching(i, r))
                    continue
                svc, demand = served_at(i, r, _busy_fraction(i, r))
                if policy == "wrr":
                    # stride-scheduled share p of a Poisson stream: interarrival ca2 ~ p
                    ca2 = max(min(shares[i.index], 1.0), 0.05)
                    queue(r, [i], mgc_model(r, [svc], ca2=ca2, demand_ms=demand), ca2=ca2)
                else:  # batch policy, batch 1: a FIFO server
                    queue(r, [i], mgc_model(r, [svc]))

    result = account(
        instances,
        variants,
        rate_rps=total_rate,
        served_rps=served,
        busy_frac=busy,
        carbon_g_per_kwh=carbon_g_per_kwh,
        pue=pue,
        wue_l_per_kwh=wue_l_per_kwh,
        ewif_l_per_kwh=ewif_l_per_kwh,
        device_idle_power_w=device_idle_power_w,
        spare_idle_w=spare_idle_w,
    )
    if stage is not None and stage.overloaded:
        overloaded = True  # the dispatcher's queue grows: every request late
        violation = total_rate
    if overloaded:
        result.update(p50_ms=math.inf, p95_ms=math.inf, p99_ms=math.inf)
    elif parts:
        p50, p95, p99 = mixture_quantiles(parts, (0.5, 0.95, 0.99))
        result.update(p50_ms=p50, p95_ms=p95, p99_ms=p99)
    else:
        result.update(p50_ms=None, p95_ms=None, p99_ms=None)
    if percentile_slo_ms is not None:
        # a sum of survival functions over queues: float error must not show as below 0
        frac = violation / total_rate if total_rate > 0 else 0.0
        result["slo_violation_frac"] = min(max(frac, 0.0), 1.0)
    result["overloaded"] = overloaded
    return _order(result, percentile_slo_ms is not None)


def _busy_fraction(inst: Instance, rate: float) -> float:
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
                (shares[i.index], _path_for(serving, m, i.variant, i.resource))
                for i in instances
                if i.model == m
            ]
            for m in model_rate
        },
    )


def serving_path(
    serving: ServingInput | None,
    model: str,
    variant: str | None = None,
    resource: str | None = None,
) -> ServingPath | None:
    """The serving path whose overhead :func:`predict` adds to the requests of ``variant`` of
    ``model`` on ``resource`` (what a model-less offer carries,
    :func:`greenctl.executor.runtime.offers.instance_offers`): measured on its own resource, else its
    own entry, else its model's, else ``"*"``."""
    return _path_for(serving, model, variant, resource)


def spare_idle_w(plan: Any) -> float:
    """Idle power (W) of the compute slices of a MIG plan's GPUs that no instance holds.

    A partitioned GPU draws its whole idle power whatever its layout, and ``plan mig``
    charges each of its ``gpus`` GPUs that (``extra.model.gpu_idle_w``); the plan's instances
    carry only their own slices' share (their profiles' ``idle_power_w``), so a layout that
    leaves slices empty (3g + 3g leaves one of an A100's seven; a GPU with no instance all
    seven) would look cheaper summed than planned. This is the difference,
    ``(gpus x C - the instances' compute slices) x gpu_idle_w / C`` with ``C`` the GPU's
    compute slices, added to every evaluation of the plan (``simulate``, ``replay``). It
    depends only on the request and the deployments. 0 for a plan without those figures
    (only ``plan mig`` records ``gpu_idle_w``).
    """
    from greenctl.data.mig_geometry import resolve_gpu

    model = plan.extra.get("model")
    idle = model.get("gpu_idle_w") if isinstance(model, dict) else None
    gpus = plan.request.get("gpus")
    gpu = plan.request.get("gpu")
    if not isinstance(idle, int | float) or not isinstance(gpus, int) or not gpu:
        return 0.0
    geo = resolve_gpu(str(gpu))
    used = sum(d.count * geo.profile(d.resource).compute_slices for d in plan.deployments)
    return max(gpus * geo.compute_slices - used, 0) * float(idle) / geo.compute_slices
