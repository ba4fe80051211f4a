"""Predict what a serving configuration does under a load: the plan's ``predicted`` block.

:func:`predict` is the analytic twin of :func:`greenctl.planner.core.simulator.simulate`:
both return :data:`PREDICTED_KEYS` and share the instances, load split and accounting kept
here, so they differ only in latency. Policies (:mod:`greenctl.planner.core.policy`):
``fifo`` (pooled M/G/c per model), ``wrr`` (a G/G/1 queue per instance) and ``batch``
(each instance batching as its executor does). Solvers price plans by the same energy rule
through :func:`energy_terms`. Energy, carbon and water formulas: docs/models.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.accounting import (
    EnergyTerms,
    account,
    energy_terms,
    instance_power_w,
    spare_idle_w,
    split_load,
)
from greenctl.planner.core.instances import (
    Instance,
    ProfileKey,
    batch_busy_frac,
    build_instances,
    busy_fraction,
    busy_stretch,
    check_policy,
    cold_fraction,
    instance_busy,
    instances_dispatcher,
    profiles_by_key,
    served_batches,
    served_service,
    warm_service,
)
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.queueing import (
    LatencyModel,
    dynamic_batch,
    mgc_model,
    mixture_model,
    mixture_quantiles,
    pooled_shares,
    with_front,
    with_overhead,
)
from greenctl.planner.core.serving_path import (
    DispatcherStage,
    ServingInput,
    ServingPath,
    dispatcher_cpu_ms,
    dispatcher_note,
    dispatcher_stage,
    front_cpu_ms,
    front_held_wait,
    path_serves,
    planned_dispatcher,
    serving_path,
    stretched_service,
)

__all__ = [
    "LATENCY_MODEL_ONLY",
    "LATENCY_WITH_PATH",
    "PREDICTED_KEYS",
    "DispatcherStage",
    "EnergyTerms",
    "Instance",
    "PredictOptions",
    "ProfileKey",
    "ServingInput",
    "ServingPath",
    "SloInput",
    "account",
    "build_instances",
    "check_policy",
    "cold_fraction",
    "dispatcher_cpu_ms",
    "dispatcher_note",
    "dispatcher_stage",
    "energy_terms",
    "front_cpu_ms",
    "front_held_wait",
    "instance_busy",
    "instance_power_w",
    "instances_dispatcher",
    "path_serves",
    "planned_dispatcher",
    "predict",
    "profiles_by_key",
    "served_batches",
    "served_service",
    "serving_path",
    "slo_for",
    "spare_idle_w",
    "split_load",
    "stretched_service",
    "warm_service",
]

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


def _order(result: dict[str, Any], slo: bool) -> dict[str, Any]:
    return {k: result.get(k) for k in PREDICTED_KEYS if slo or k != "slo_violation_frac"}


@dataclass(frozen=True)
class PredictOptions:
    """How :func:`predict` evaluates a configuration (its keywords, one type).

    Attributes:
        rate_rps: the total Poisson arrival rate, or ``{model: rate}``.
        percentile_slo_ms: an SLO in ms, or ``{variant: ms}``; adds ``slo_violation_frac``.
        carbon_g_per_kwh, pue, wue_l_per_kwh, ewif_l_per_kwh: grid intensity, PUE (>= 1), and
            direct and indirect water per kWh.
        device_idle_power_w: idle power of each whole device, shared by its instances.
        max_wait_ms: batch fill wait (a deployment's ``placement["duty_cycle_ms"]`` wins).
        serving: the measured serving path, for every model or ``{variant or model: ...}``.
        spare_idle_w: idle power no instance carries (a MIG plan's empty slices).
    """

    rate_rps: float | Mapping[str, float]
    policy: str = "fifo"
    percentile_slo_ms: SloInput = None
    carbon_g_per_kwh: float | None = None
    pue: float = 1.0
    wue_l_per_kwh: float | None = None
    ewif_l_per_kwh: float | None = None
    device_idle_power_w: float | None = None
    max_wait_ms: float | None = None
    serving: ServingInput | None = None
    spare_idle_w: float = 0.0


def predict(
    deployments: Sequence[Deployment],
    profiles: Mapping[ProfileKey, Profile],
    variants: Mapping[str, Variant],
    options: PredictOptions | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Analytic prediction of a configuration's latency, accuracy, energy, carbon and cost.

    ``profiles`` maps ``(variant, resource, batch)`` to a Profile (:func:`profiles_by_key`);
    ``options`` gives the load (:class:`PredictOptions`), its fields as keywords winning. Latency
    includes the serving path's overhead, executor CPU or front, dispatcher stage and cold runs.

    Returns:
        :data:`PREDICTED_KEYS`; an overloaded configuration has ``overloaded`` True, infinite
        percentiles, the excess as ``dropped_rps`` and its queues' requests violating.
    Raises:
        InputError: a missing profile, an unknown policy, a bad number.
    """
    opts = replace(options, **kwargs) if options is not None else PredictOptions(**kwargs)
    instances = build_instances(
        deployments, profiles, max_wait_ms=opts.max_wait_ms, serving=opts.serving
    )
    check_policy(opts.policy, instances)
    model_rate, shares = split_load(instances, deployments, opts.rate_rps)
    total_rate = sum(model_rate.values())
    # the dispatcher: one serial stage every request crosses, where its CPU was measured
    stage = instances_dispatcher(instances, model_rate, shares, opts.serving)
    passed = model_rate  # what the dispatcher forwards: at most its capacity, pro rata
    if stage is not None and stage.overloaded and total_rate > 0:
        passed = {m: r * stage.capacity_rps / total_rate for m, r in model_rate.items()}
    run = _Prediction(instances, opts, stage)
    for m, rate in passed.items():
        members = [i for i in instances if i.model == m]
        if opts.policy == "fifo":
            run.pooled(rate, members)
        else:
            for i in members:
                run.own_queue(i, rate * shares[i.index], shares[i.index])
    return run.result(variants, total_rate)


@dataclass
class _Prediction:
    """What :func:`predict` gathers over a plan's queues: the latency models with their
    rates, the SLO violations, and each instance's served rate and busy fraction."""

    instances: Sequence[Instance]
    opts: PredictOptions
    stage: DispatcherStage | None
    parts: list[tuple[float, LatencyModel]] = field(default_factory=list)
    violation: float = 0.0
    overloaded: bool = False
    served: list[float] = field(init=False)
    busy: list[float] = field(init=False)
    #: busy time per unit of profiled busy time, on instances with a serving path measured
    #: on their kind of resource (served runs, and on CPU the executor's own CPU, take longer)
    stretch: list[float] = field(init=False)
    dispatched: dict[ServingPath | None, tuple[float, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        k = len(self.instances)
        self.served, self.busy, self.stretch = [0.0] * k, [0.0] * k, [1.0] * k

    def path(self, i: Instance) -> ServingPath | None:
        return serving_path(self.opts.serving, i.model, i.variant, i.resource)

    def overhead_of(self, path: ServingPath | None) -> tuple[float, ...]:
        """The path's overhead samples, with the dispatcher's wait at the plan's rate."""
        if self.stage is None or self.stage.overloaded:
            return path.overhead_ms if path is not None else ()
        if path not in self.dispatched:
            self.dispatched[path] = self.stage.overhead_ms(path)
        return self.dispatched[path]

    def served_at(self, i: Instance, rate: float, busy_frac: float) -> tuple[ServiceTime, float]:
        """:func:`served_service`, noting the instance's busy stretch."""
        path = self.path(i)
        svc, demand = served_service(i, rate, busy_frac, path)
        if path is not None and path_serves(path, i.resource):
            self.stretch[i.index] = busy_stretch(i, svc, demand)
        return svc, demand

    def pooled(self, rate: float, members: list[Instance]) -> None:
        """A model's instances behind one pooled FIFO queue (policy ``fifo``)."""
        model = None
        if rate > 0:
            got = pooled_shares(rate, [i.service for i in members])
            loaded = [
                self.served_at(i, rate * float(g), rate * float(g) / i.capacity_rps)
                for i, g in zip(members, got, strict=True)
            ]
            # one pooled queue: the first instance's executor CPU stands for all
            model = mgc_model(rate, [s for s, _ in loaded], demand_ms=loaded[0][1])
        self.queue(rate, members, model)

    def own_queue(self, i: Instance, r: float, share: float) -> None:
        """An instance with a queue of its own at rate ``r`` (policies ``wrr``, ``batch``)."""
        if self.opts.policy == "batch" and i.batches is not None:
            if r > 0:
                self.queue(r, [i], *self.batching(i, r))
            return
        svc, demand = self.served_at(i, r, busy_fraction(i, r))
        if self.opts.policy == "wrr":
            # stride-scheduled share p of a Poisson stream: interarrival ca2 ~ p
            ca2 = max(min(share, 1.0), 0.05)
            self.queue(r, [i], mgc_model(r, [svc], ca2=ca2, demand_ms=demand), ca2=ca2)
        else:  # batch policy, batch 1: a FIFO server
            self.queue(r, [i], mgc_model(r, [svc]))

    def batching(self, i: Instance, rate: float) -> tuple[LatencyModel | None, float]:
        """A batching instance at ``rate``: its latency model and busy fraction."""
        got = served_batches(i, rate, self.path(i))
        if got is None:
            return None, 1.0
        model, demand = got
        pred = dynamic_batch(rate, model)
        if pred is None:
            return None, 1.0
        return pred.latency, batch_busy_frac(pred, rate, demand)

    def with_path(
        self, rate: float, members: list[Instance], model: LatencyModel, ca2: float
    ) -> LatencyModel | None:
        """A queue's latency plus its serving path's: on an accelerator, the executor's
        front before the device (on CPU the executor's own work shares the cores instead),
        each at its instance's share of a pooled queue, with the path's overhead."""
        path = self.path(members[0])
        overhead = self.overhead_of(path)
        if any(i.front_ms > 0 for i in members):
            pooled = (
                pooled_shares(rate, [m.service for m in members]) if len(members) > 1 else [1.0]
            )
            return mixture_model(
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
        return with_overhead(model, overhead) if overhead else model

    def queue(
        self,
        rate: float,
        members: list[Instance],
        model: LatencyModel | None,
        busy_frac: float | None = None,
        *,
        ca2: float = 1.0,
    ) -> None:
        """Record one queue at ``rate``: its latency, SLO violations, served rates, busy."""
        if rate <= 0:
            return
        if model is not None:
            model = self.with_path(rate, members, model, ca2)
        if model is None:
            self.overloaded = True
            self.violation += rate
            for i in members:  # saturated: serving at capacity, the device busy throughout
                self.served[i.index] = i.served_capacity_rps  # (unless its front binds)
                self.busy[i.index] = min(i.served_capacity_rps / i.capacity_rps, 1.0)
            return
        self.parts.append((rate, model))
        slo = slo_for(self.opts.percentile_slo_ms, [i.variant for i in members])
        if slo is not None:
            self.violation += rate * float(model.sf(slo)[0])
        if self.opts.policy == "fifo" and len(members) > 1:
            # Pooled queue: fastest idle instance first (queueing.pooled_shares).
            for i, share in zip(
                members, pooled_shares(rate, [m.service for m in members]), strict=True
            ):
                self.served[i.index] = rate * float(share)
                self.busy[i.index] = min(
                    self.stretch[i.index] * self.served[i.index] / i.capacity_rps, 1.0
                )
        else:
            (i,) = members
            self.served[i.index] = rate
            if busy_frac is None:
                busy_frac = self.stretch[i.index] * busy_fraction(i, rate)
            self.busy[i.index] = min(busy_frac, 1.0)

    def result(self, variants: Mapping[str, Variant], total_rate: float) -> dict[str, Any]:
        """The accounting of the served rates and busy time, the latency percentiles of
        the queues' mixture and the share of requests that miss their SLO."""
        opts = self.opts
        result = account(
            self.instances,
            variants,
            rate_rps=total_rate,
            served_rps=self.served,
            busy_frac=self.busy,
            carbon_g_per_kwh=opts.carbon_g_per_kwh,
            pue=opts.pue,
            wue_l_per_kwh=opts.wue_l_per_kwh,
            ewif_l_per_kwh=opts.ewif_l_per_kwh,
            device_idle_power_w=opts.device_idle_power_w,
            spare_idle_w=opts.spare_idle_w,
        )
        overloaded, violation = self.overloaded, self.violation
        if self.stage is not None and self.stage.overloaded:
            overloaded = True  # the dispatcher's queue grows: every request late
            violation = total_rate
        if overloaded:
            result.update(p50_ms=math.inf, p95_ms=math.inf, p99_ms=math.inf)
        elif self.parts:
            p50, p95, p99 = mixture_quantiles(self.parts, (0.5, 0.95, 0.99))
            result.update(p50_ms=p50, p95_ms=p95, p99_ms=p99)
        else:
            result.update(p50_ms=None, p95_ms=None, p99_ms=None)
        if opts.percentile_slo_ms is not None:
            # a sum of survival functions over queues: float error must not show as below 0
            frac = violation / total_rate if total_rate > 0 else 0.0
            result["slo_violation_frac"] = min(max(frac, 0.0), 1.0)
        result["overloaded"] = overloaded
        return _order(result, opts.percentile_slo_ms is not None)
