"""Discrete-event simulation of a serving configuration: the check on the analytic path.

Requests arrive (Poisson or a trace, :mod:`greenctl.planner.core.loads`), are split over
models by independent thinning (each model sees a Poisson stream), optionally cross the
measured dispatcher first, and are dispatched by a policy to the queues of
:mod:`greenctl.planner.core.sim_queues` (``fifo``, ``wrr`` or ``batch``). Service times are
drawn from each instance's :class:`~greenctl.planner.core.latency.ServiceTime`. The first
``warmup_frac`` of requests are left out of latency statistics; a bounded queue
(``queue_limit``) drops arrivals that find it full (``fifo`` and ``wrr``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan, check_families
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.evaluate import (
    PREDICTED_KEYS,
    DispatcherStage,
    Instance,
    ServingInput,
    ServingPath,
    SloInput,
    account,
    build_instances,
    check_policy,
    instances_dispatcher,
    path_serves,
    predict,
    served_batches,
    served_service,
    serving_path,
    slo_for,
    spare_idle_w,
    split_load,
)
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.loads import check_arrivals, poisson_arrivals, trace_arrivals
from greenctl.planner.core.plan_inputs import (
    default_rate,
    model_slos,
    pick_profiles,
    served_model_slos,
    sized_slo_ms,
)
from greenctl.planner.core.policy import plan_policy
from greenctl.planner.core.queueing import front_capacity_rps, pooled_shares
from greenctl.planner.core.sim_queues import (
    QueueRun,
    batch_queue,
    dispatcher_cpu_by_model,
    dispatcher_queue,
    fifo_queue,
    front_held,
    front_queue,
    fronted_fifo,
    held_samples,
    held_wait,
    lindley_queue,
    stride_assign,
    wrr_queues,
)

__all__ = [
    "EvaluateOptions",
    "QueueRun",
    "SimulateOptions",
    "batch_queue",
    "default_rate",
    "dispatcher_cpu_by_model",
    "dispatcher_queue",
    "evaluate_plan",
    "fifo_queue",
    "front_held",
    "front_queue",
    "held_samples",
    "held_wait",
    "lindley_queue",
    "model_slos",
    "pick_profiles",
    "served_model_slos",
    "simulate",
    "sized_slo_ms",
    "stride_assign",
    "wrr_queues",
]


@dataclass(frozen=True)
class SimulateOptions:
    """How :func:`simulate` runs a configuration (its keywords, one type).

    Attributes:
        rate_rps: Poisson rate, used when ``arrivals_s`` (sorted times in s) is not given.
        duration_s / n_requests: the length of a Poisson run (default 100,000 requests).
        seed: makes the run reproducible.
        queue_limit: waiting requests per queue beyond which arrivals are dropped.
        warmup_frac: leading fraction of requests left out of latency statistics.
        serving: the measured serving path, as :func:`~greenctl.planner.core.evaluate.predict`
            takes it.
        Others: as in :func:`~greenctl.planner.core.evaluate.predict`.
    """

    rate_rps: float | None = None
    arrivals_s: np.ndarray | None = None
    duration_s: float | None = None
    n_requests: int | None = None
    policy: str = "fifo"
    seed: int = 0
    queue_limit: int | None = None
    percentile_slo_ms: SloInput = None
    carbon_g_per_kwh: float | None = None
    pue: float = 1.0
    wue_l_per_kwh: float | None = None
    ewif_l_per_kwh: float | None = None
    device_idle_power_w: float | None = None
    max_wait_ms: float | None = None
    warmup_frac: float = 0.01
    serving: ServingInput | None = None
    spare_idle_w: float = 0.0


def simulate(
    deployments: Sequence[Deployment],
    profiles: Mapping[tuple[str, str, int], Profile],
    variants: Mapping[str, Variant],
    options: SimulateOptions | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Simulate a configuration; returns the same keys as :func:`~greenctl.planner.core.evaluate.predict`.

    ``options`` (:class:`SimulateOptions`; its fields as keywords win) say the load and how it
    is served. The serving path runs as ``predict`` models it: overhead draws, served runs on
    the measured resource, executor CPU or front, and the dispatcher, with the waits the samples
    already hold taken out (:func:`~greenctl.planner.core.sim_queues.held_samples`).

    The run is ``overloaded`` (percentiles ``math.inf``) when the offered rate reaches a queue's
    capacity or more than 2 % of the requests (at least 100) are still queued when arrivals
    stop. ``dropped_rps`` counts a bounded queue's drops plus, when overloaded, the backlog.
    """
    opts = replace(options, **kwargs) if options is not None else SimulateOptions(**kwargs)
    instances = build_instances(
        deployments, profiles, max_wait_ms=opts.max_wait_ms, serving=opts.serving
    )
    check_policy(opts.policy, instances)
    _check_options(opts)
    arrivals, horizon_s = _arrivals(opts)
    model_rate, shares = split_load(instances, deployments, arrivals.size / horizon_s)
    run = _start(instances, model_rate, shares, arrivals, horizon_s, opts)
    for mi, m in enumerate(run.models):
        idx = np.flatnonzero(run.which == mi)
        if idx.size == 0:
            continue
        members = [i for i in instances if i.model == m]
        a = run.at_ms[idx]
        rate = model_rate[m]
        if opts.policy == "fifo":
            runs = [(run.fifo(members, a, rate), members)]
        elif opts.policy == "wrr":
            runs = [(run.wrr(members, a, rate, shares), members)]
        else:
            runs = run.batch(members, a, rate, shares)
        for queue_run, mem in runs:
            run.collect(queue_run, mem, idx)
    return run.result(variants)


def _check_options(opts: SimulateOptions) -> None:
    """Refuse a bounded queue where it is not simulated and a warm-up outside [0, 1)."""
    if opts.queue_limit is not None and opts.queue_limit < 0:
        raise InputError(f"queue limit must be >= 0, got {opts.queue_limit}")
    if opts.queue_limit is not None and opts.policy == "batch":
        raise InputError("a bounded queue is simulated for the fifo and wrr policies only")
    if not 0 <= opts.warmup_frac < 1:
        raise InputError(f"warm-up fraction must be in [0, 1), got {opts.warmup_frac}")


def _arrivals(opts: SimulateOptions) -> tuple[np.ndarray, float]:
    """The run's arrival times (s) and its horizon (s): a trace's whole seconds, else the
    asked duration, else the last arrival."""
    given = opts.arrivals_s is not None
    arrivals_s = opts.arrivals_s
    if arrivals_s is None:
        if opts.rate_rps is None:
            raise InputError("give a rate or arrival times")
        arrivals_s = poisson_arrivals(
            opts.rate_rps, duration_s=opts.duration_s, n=opts.n_requests, seed=opts.seed
        )
    arrivals = np.asarray(arrivals_s, dtype=float)
    if arrivals.size == 0:
        raise InputError("the load has no requests", hint="raise the rate, duration or scale")
    if opts.duration_s is not None:
        return arrivals, float(opts.duration_s)
    if given:  # a trace: whole seconds
        return arrivals, float(max(math.ceil(arrivals[-1]), 1.0))
    return arrivals, float(max(arrivals[-1], 1e-9))


@dataclass
class _Run:
    """What one :func:`simulate` run accumulates over its models' queues (per request:
    latency and SLO; per instance: requests served, busy time, executor CPU)."""

    instances: list[Instance]
    opts: SimulateOptions
    rng: np.random.Generator
    models: list[str]
    which: np.ndarray  # each request's model (its index in ``models``)
    at_ms: np.ndarray  # when each request reaches its executor
    horizon_s: float
    stage: DispatcherStage | None
    dispatch_wait: np.ndarray
    saturated: bool
    latency: np.ndarray = field(init=False)
    slo_ms: np.ndarray = field(init=False)  # the SLO each request is held to
    served_count: np.ndarray = field(init=False)
    busy_ms: np.ndarray = field(init=False)
    demand: np.ndarray = field(init=False)  # executor CPU (ms per request) on its cores
    backlog: int = 0
    #: by path and the front's held wait: held_samples
    held: dict[tuple[ServingPath | None, tuple[float, float]], np.ndarray] = field(
        default_factory=dict
    )

    def __post_init__(self) -> None:
        n, k = self.which.size, len(self.instances)
        self.latency = np.full(n, np.nan)
        self.slo_ms = np.full(n, np.inf)
        self.served_count = np.zeros(k)
        self.busy_ms = np.zeros(k)
        self.demand = np.zeros(k)

    def served(self, inst: Instance, rate: float, busy_frac: float) -> ServiceTime:
        """The service an instance runs at its rate: as ``predict`` serves it where its
        serving path was measured on its resource, else its profiled service."""
        path = serving_path(self.opts.serving, inst.model, inst.variant, inst.resource)
        if path is None or not path_serves(path, inst.resource):
            return inst.service
        svc, self.demand[inst.index] = served_service(inst, rate, busy_frac, path)
        return svc

    def fifo(self, members: list[Instance], a: np.ndarray, rate: float) -> QueueRun:
        """One model's central FIFO queue (each instance's front takes its share of it)."""
        self.saturated |= rate >= sum(i.capacity_rps for i in members)
        services = [i.service for i in members]
        pooled = pooled_shares(rate, services) if self.opts.serving is not None else None
        if pooled is not None:
            services = [
                self.served(i, rate * float(g), rate * float(g) / i.capacity_rps)
                for i, g in zip(members, pooled, strict=True)
            ]
        fronts = [i.front_ms for i in members]
        limit = self.opts.queue_limit
        if pooled is not None and any(f > 0 for f in fronts):
            self.saturated |= any(
                rate * float(g) >= front_capacity_rps(f)
                for g, f in zip(pooled, fronts, strict=True)
            )
            return fronted_fifo(a, services, pooled, fronts, self.rng, limit, self.demand, members)
        demand_ms = float(self.demand[members[0].index])
        return fifo_queue(a, services, self.rng, queue_limit=limit, demand_ms=demand_ms)

    def _saturate(self, members: list[Instance], rate: float, sh: list[float]) -> None:
        self.saturated |= any(
            rate * s >= i.served_capacity_rps for s, i in zip(sh, members, strict=True)
        )

    def wrr(
        self, members: list[Instance], a: np.ndarray, rate: float, shares: Sequence[float]
    ) -> QueueRun:
        """One model's instances by weighted round-robin, each a FIFO queue."""
        sh = [shares[i.index] for i in members]
        self._saturate(members, rate, sh)
        services = [i.service for i in members]
        if self.opts.serving is not None:
            services = [
                self.served(i, rate * s, min(rate * s / i.capacity_rps, 1.0))
                for s, i in zip(sh, members, strict=True)
            ]
        return wrr_queues(
            a,
            services,
            sh,
            self.rng,
            queue_limit=self.opts.queue_limit,
            demands_ms=[float(self.demand[i.index]) for i in members],
            fronts_ms=[i.front_ms for i in members],
        )

    def batch(
        self, members: list[Instance], a: np.ndarray, rate: float, shares: Sequence[float]
    ) -> list[tuple[QueueRun, list[Instance]]]:
        """One model's instances batching, each's share an independent thinning (a Poisson
        stream, as ``predict`` models it; the dispatcher's batch policy fills the busiest
        instance first, which neither models)."""
        sh = [shares[i.index] for i in members]
        self._saturate(members, rate, sh)
        assign = (
            self.rng.choice(len(members), size=a.size, p=np.asarray(sh) / sum(sh))
            if len(members) > 1
            else np.zeros(a.size, dtype=int)
        )
        runs = []
        for k, inst in enumerate(members):
            sub = np.flatnonzero(assign == k)
            if sub.size == 0:
                continue
            # an accelerator's executor front, then the device (none: as they come)
            before = front_queue(a[sub], inst.front_ms)
            at = a[sub] + before + inst.front_ms if inst.front_ms > 0 else a[sub]
            b = self._batches(inst, at, rate * sh[k])
            run_full = QueueRun(
                a, np.full(a.size, np.nan), np.full(a.size, np.nan), np.full(a.size, -1)
            )
            run_full.wait_ms[sub] = before + b.wait_ms
            run_full.service_ms[sub] = b.service_ms
            run_full.server[sub] = k
            runs.append((run_full, members))
        return runs

    def _batches(self, inst: Instance, at: np.ndarray, rate: float) -> QueueRun:
        """One instance's batches at its rate: the runs ``predict`` models there (cold runs
        at light load); batch 1 is a FIFO server."""
        if inst.batches is None:
            svc = inst.service
            if self.opts.serving is not None:
                svc = self.served(inst, rate, min(rate / inst.capacity_rps, 1.0))
            return batch_queue(at, svc, 1, self.rng)
        path = serving_path(self.opts.serving, inst.model, inst.variant, inst.resource)
        got = served_batches(inst, rate, path)
        if got is not None:
            self.demand[inst.index] = got[1]
        how = inst.batches.batching
        return batch_queue(
            at,
            inst.batches if got is None else got[0],
            inst.batch,
            self.rng,
            max_wait_ms=how.max_wait_ms,
            depth=how.depth,
            slots=how.slots,
        )

    def collect(self, run: QueueRun, mem: list[Instance], idx: np.ndarray) -> None:
        """Record a queue's requests: each one's latency (plus its serving path's time and
        the simulated stage waits), SLO, and its instance's count and busy time."""
        ok = ~run.dropped
        lat = run.latency_ms
        finish = run.arrival_ms + lat
        horizon_ms = self.horizon_s * 1000.0
        for k, inst in enumerate(mem):
            sel = ok & (run.server == k)
            if not sel.any():
                continue
            count = int(sel.sum())
            self.served_count[inst.index] += count
            slo = slo_for(self.opts.percentile_slo_ms, [inst.variant])
            if slo is not None:
                self.slo_ms[idx[sel]] = slo
            self.backlog += int((finish[sel] > horizon_ms).sum())
            self.busy_ms[inst.index] += _busy_time(run, sel, inst, self.opts.policy)
            self.busy_ms[inst.index] += count * float(self.demand[inst.index])
            lat[sel] += self._overhead(inst, count, idx[sel])
        self.latency[idx[ok]] = lat[ok]

    def _overhead(self, inst: Instance, count: int, where: np.ndarray) -> np.ndarray | float:
        """The serving path's time of ``count`` requests of ``inst`` (``where``: their
        indices): its samples less the waits they hold, plus the simulated ones."""
        path = serving_path(self.opts.serving, inst.model, inst.variant, inst.resource)
        # the front's wait the samples hold, at the rate this instance served
        front = front_held(path, inst.front_ms, count / self.horizon_s)
        if self.stage is not None or front != (0.0, 0.0):
            key = (path, front)
            if key not in self.held:
                self.held[key] = held_samples(self.stage, path, front)
            rest = self.held[key]
            if path is not None and path.overhead_ms:  # else one point: 0 less H
                rest = rest[self.rng.integers(0, rest.size, count)]
            if self.stage is not None:
                rest = rest + self.dispatch_wait[where]
            return np.maximum(rest, 0.0)
        if path is not None and path.overhead_ms:  # the serving path's own time
            samples = np.asarray(path.overhead_ms, dtype=float)
            return samples[self.rng.integers(0, samples.size, count)]
        return 0.0

    def result(self, variants: Mapping[str, Variant]) -> dict[str, Any]:
        """The run's figures: served rates, the accounting, latency percentiles, SLO."""
        opts, n = self.opts, self.which.size
        overloaded = self.saturated or self.backlog > max(100, 0.02 * n)
        served_rps = self.served_count / self.horizon_s
        if overloaded:
            # the backlog never clears: count it as not served
            total = self.served_count.sum()
            served_rps = served_rps * (max(total - self.backlog, 0.0) / max(total, 1.0))
        busy = np.minimum(self.busy_ms / (self.horizon_s * 1000.0), 1.0)
        result = account(
            self.instances,
            variants,
            rate_rps=n / self.horizon_s,
            served_rps=served_rps.tolist(),
            busy_frac=busy.tolist(),
            carbon_g_per_kwh=opts.carbon_g_per_kwh,
            pue=opts.pue,
            wue_l_per_kwh=opts.wue_l_per_kwh,
            ewif_l_per_kwh=opts.ewif_l_per_kwh,
            device_idle_power_w=opts.device_idle_power_w,
            spare_idle_w=opts.spare_idle_w,
        )
        start = int(n * opts.warmup_frac)
        steady = self.latency[start:]
        measured = steady[~np.isnan(steady)]
        if overloaded:
            result.update(p50_ms=math.inf, p95_ms=math.inf, p99_ms=math.inf)
        elif measured.size:
            p50, p95, p99 = np.percentile(measured, [50, 95, 99])
            result.update(p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99))
        else:
            result.update(p50_ms=None, p95_ms=None, p99_ms=None)
        with_slo = opts.percentile_slo_ms is not None
        if with_slo:
            held = self.slo_ms[start:][~np.isnan(steady)]
            late = int((measured > held).sum())
            lost = int(np.isnan(steady).sum())
            frac = (late + lost) / max(steady.size, 1)
            result["slo_violation_frac"] = 1.0 if self.saturated else frac
        result["overloaded"] = bool(overloaded)
        return {k: result.get(k) for k in PREDICTED_KEYS if with_slo or k != "slo_violation_frac"}


def _start(
    instances: list[Instance],
    model_rate: dict[str, float],
    shares: Sequence[float],
    arrivals: np.ndarray,
    horizon_s: float,
    opts: SimulateOptions,
) -> _Run:
    """A run before its queues: each request's model, and the dispatcher every request
    crosses first (as ``predict`` builds it: one FIFO server)."""
    n = int(arrivals.size)
    rng = np.random.default_rng(np.random.SeedSequence([opts.seed, 7919]))
    models = list(model_rate)
    total = sum(model_rate.values())
    if len(models) > 1 and total > 0:
        probs = np.array([model_rate[m] / total for m in models])
        which = rng.choice(len(models), size=n, p=probs)
    else:
        which = np.zeros(n, dtype=int)
    arrival_ms = arrivals * 1000.0
    stage = instances_dispatcher(instances, model_rate, shares, opts.serving)
    at_ms = arrival_ms
    dispatch_wait = np.zeros(0)
    if stage is not None:
        by_model = dispatcher_cpu_by_model(stage, model_rate)
        cpu = np.array([by_model[m] for m in models])[which]
        dispatch_wait = dispatcher_queue(arrival_ms, cpu)
        at_ms = arrival_ms + dispatch_wait + cpu
    return _Run(
        instances=instances,
        opts=opts,
        rng=rng,
        models=models,
        which=which,
        at_ms=at_ms,
        horizon_s=horizon_s,
        stage=stage,
        dispatch_wait=dispatch_wait,
        saturated=stage is not None and stage.overloaded,  # its queue grows: as predict
    )


def _busy_time(run: QueueRun, sel: np.ndarray, inst: Instance, policy: str) -> float:
    """Execution time (ms) an instance spent on the selected requests."""
    if policy != "batch":
        return float(run.service_ms[sel].sum())
    # a batch's members share one start; count each batch's execution once (to a ns: the
    # waits of requests that crossed an executor front are sums of two parts)
    starts = np.round(run.arrival_ms[sel] + run.wait_ms[sel], 6)
    svc = run.service_ms[sel]
    _, first = np.unique(starts, return_index=True)
    return float(svc[first].sum())


@dataclass(frozen=True)
class EvaluateOptions:
    """How :func:`evaluate_plan` evaluates a plan (its keywords, one type).

    Attributes:
        rate_rps: Poisson load; default :func:`default_rate`.
        trace: requests per second to replay instead (Poisson within each second; the
            analytic path uses its mean); ``trace_scale`` multiplies it.
        duration_s / n_requests: the length of a run (``duration_s`` also cuts a trace).
        policy: ``fifo``, ``wrr`` or ``batch``; default the one ``apply`` serves with.
        analytic: use the fast analytic path instead of the simulator.
        serving: the measured serving paths; None: the model's latency alone.
        Others: as in :class:`SimulateOptions`.
    """

    rate_rps: float | None = None
    trace: np.ndarray | Sequence[float] | None = None
    trace_scale: float = 1.0
    duration_s: float | None = None
    n_requests: int | None = None
    policy: str | None = None
    analytic: bool = False
    seed: int = 0
    queue_limit: int | None = None
    percentile_slo_ms: float | None = None
    carbon_g_per_kwh: float | None = None
    pue: float = 1.0
    wue_l_per_kwh: float | None = None
    ewif_l_per_kwh: float | None = None
    device_idle_power_w: float | None = None
    serving: ServingInput | None = None


def evaluate_plan(
    plan: Plan,
    profiles: Sequence[Profile],
    variants: Sequence[Variant],
    options: EvaluateOptions | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Predict (``analytic``) or simulate what a plan does under a load.

    ``profiles`` are drawn from newest-first per variant/resource/batch (:func:`pick_profiles`);
    ``variants`` give accuracy and refuse a deployment whose ``model`` is not its variant's
    family; ``options`` (:class:`EvaluateOptions`; its fields as keywords win) say the load.

    Returns:
        The metrics dict (the plan's ``predicted`` keys).
    """
    opts = replace(options, **kwargs) if options is not None else EvaluateOptions(**kwargs)
    slo_ms = opts.percentile_slo_ms
    if slo_ms is not None and not (math.isfinite(slo_ms) and slo_ms > 0):
        raise InputError(
            f"the latency SLO must be a number of ms > 0, got {slo_ms}",
            hint="for example --slo-ms 500",
        )
    if not (math.isfinite(opts.trace_scale) and opts.trace_scale > 0):
        raise InputError(f"the trace scale must be a number > 0, got {opts.trace_scale}")
    pol = plan_policy(plan, opts.policy)
    by_name = {v.name: v for v in variants}
    sized = sized_slo_ms(plan, by_name, slo_ms)
    table = pick_profiles(profiles, sized)
    check_families(plan.deployments, {v.name: v.family for v in variants})
    # without an SLO asked for, a plan of models with SLOs of their own (glet) is held to them
    slo: SloInput = slo_ms
    if slo is None and model_slos(plan):
        slo = sized
    common: dict[str, Any] = dict(
        policy=pol,
        percentile_slo_ms=slo,
        carbon_g_per_kwh=opts.carbon_g_per_kwh,
        pue=opts.pue,
        wue_l_per_kwh=opts.wue_l_per_kwh,
        ewif_l_per_kwh=opts.ewif_l_per_kwh,
        device_idle_power_w=opts.device_idle_power_w,
        spare_idle_w=spare_idle_w(plan),  # a MIG GPU's slices no instance holds idle too
        serving=opts.serving,
    )
    if opts.trace is not None:
        return _evaluate_trace(plan, table, by_name, opts, common)
    rate = default_rate(plan) if opts.rate_rps is None else float(opts.rate_rps)
    if opts.analytic:
        return predict(plan.deployments, table, by_name, rate_rps=rate, **common)
    if opts.n_requests is not None:
        _check_requests(float(opts.n_requests), "--requests")
    elif opts.duration_s is not None and math.isfinite(rate) and math.isfinite(opts.duration_s):
        _check_requests(rate * opts.duration_s, "--rate times --duration")
    return simulate(
        plan.deployments,
        table,
        by_name,
        rate_rps=rate,
        duration_s=opts.duration_s,
        n_requests=opts.n_requests,
        seed=opts.seed,
        queue_limit=opts.queue_limit,
        **common,
    )


def _evaluate_trace(
    plan: Plan,
    table: Mapping[tuple[str, str, int], Profile],
    by_name: Mapping[str, Variant],
    opts: EvaluateOptions,
    common: dict[str, Any],
) -> dict[str, Any]:
    """:func:`evaluate_plan` under a trace: its mean rate analytically, else replayed."""
    if opts.rate_rps is not None:
        raise InputError("give a rate or a trace, not both")
    if opts.n_requests is not None:
        raise InputError("a trace sets the number of requests: use --duration to cut it")
    series = np.asarray(opts.trace, float)
    if opts.duration_s is not None:
        if opts.duration_s < 1:
            raise InputError(f"duration must be at least 1 s for a trace, got {opts.duration_s}")
        series = series[: int(opts.duration_s)]
    if opts.analytic:
        return predict(
            plan.deployments,
            table,
            by_name,
            rate_rps=float(series.mean()) * opts.trace_scale,
            **common,
        )
    _check_requests(float(np.sum(series)) * opts.trace_scale, "the trace (times --scale)")
    arrivals = trace_arrivals(series, seed=opts.seed, scale=opts.trace_scale)
    return simulate(
        plan.deployments,
        table,
        by_name,
        arrivals_s=arrivals,
        seed=opts.seed,
        queue_limit=opts.queue_limit,
        **common,
    )


def _check_requests(expected: float, what: str) -> None:
    """Refuse a run of more than :data:`~greenctl.planner.core.loads.MAX_ARRIVALS` requests."""
    check_arrivals(
        expected, what, hint="shorten the run (--duration / --requests), or use --analytic"
    )
