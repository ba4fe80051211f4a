"""The replay every single-family serving kind shares (mix's, mig's, a third party's).

Each second of an interval's arrivals is evaluated with the analytic
:func:`~greenctl.planner.core.evaluate.predict` at its own rate (steady state; the queue
carried between seconds is not modeled), and SLO violations (including what an overloaded
configuration drops), accuracy, energy, carbon, water and cost are summed per interval. A
change pays its reconfiguration: new instances load for their variant's ``load_time_s``
while the old configuration serves (0 s when unknown, and the result says so). A kind sets
what differs in a :class:`Serving`: the first plan, the static baselines' plans, the SLO
percentile and its own baselines (:class:`Extras`). Every figure is modeled, and labelled so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import kind_of
from greenctl.executor.kinds.base import PlanKind, get_kind
from greenctl.executor.kinds.replaying import (
    TRACE_INTERVAL_COLUMNS,
    Footprint,
    Interval,
    PolicyStep,
    ReplayInputs,
    ReplayLoop,
    Round,
    TraceWindow,
    intervals,
)
from greenctl.planner.core import solvers
from greenctl.planner.core.evaluate import predict, spare_idle_w
from greenctl.planner.core.simulator import pick_profiles, sized_slo_ms
from greenctl.planner.mix.solve import REFERENCE_CARBON_INTENSITY

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: the static baselines every serving kind runs (when asked), sized for the window's peak
STATIC_BASELINES = ("base", "co2opt")
#: the baselines a serving replay runs unless told; a kind that does not run one of them
#: (VPA sizes CPU pods: mix's) leaves it out with a note, as any baseline not its own
DEFAULT_BASELINES = (*STATIC_BASELINES, "vpa")
#: the columns of one interval of one policy
INTERVAL_COLUMNS = (
    *TRACE_INTERVAL_COLUMNS,
    "reconfig_s",
    "violations",
    "violation_frac",
    "accuracy",
    "energy_j",
    "carbon_g",
    "water_l",
    "cost_usd",
)
SUMMARY_COLUMNS = (
    "policy",
    "requests",
    "violations",
    "violation_pct",
    "accuracy",
    "energy_kwh",
    "carbon_g",
    "water_l",
    "cost_usd",
    "changes",
    "mean_units",
    "basis",
)
MODELED = (
    "modeled: profiles + the evaluation core's analytic predict per second of the load "
    "trace (steady state each second); energy from the profiles' power"
)


class ReadCache:
    """The store, with the reads a planning round repeats (variants, profiles) memoised: a
    replay plans hundreds of times from one unchanged store."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._memo: dict[Any, Any] = {}

    def _cached(self, name: str, *args: Any, **kwargs: Any) -> Any:
        key = (name, args, tuple(sorted(kwargs.items())))
        if key not in self._memo:
            self._memo[key] = getattr(self._store, name)(*args, **kwargs)
        return list(self._memo[key])

    def variants(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached("variants", *args, **kwargs)

    def latest_profiles(self, *args: Any, **kwargs: Any) -> Any:
        return self._cached("latest_profiles", *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def config_key(deps: Sequence[Deployment]) -> tuple[Any, ...]:
    return tuple(
        sorted((d.model, d.variant, d.resource, d.batch, d.count, d.quota_rps) for d in deps)
    )


def config_label(deps: Sequence[Deployment]) -> str:
    """``resnet50@cpu:6x1 + resnet18@cpu:2x2``."""
    return " + ".join(f"{d.variant}@{d.resource}x{d.count}" for d in deps)


def units(deps: Sequence[Deployment]) -> float:
    """The configuration's size in its kind's budget units (cores, MIG compute slices)."""
    total = 0.0
    for d in deps:
        try:
            amount = float(kind_of(d.resource).budget_amount(d.resource.split(":", 1)[1]))
        except (IndexError, ValueError, InputError):
            continue
        total += amount * d.count
    return total


def units_name(deps: Sequence[Deployment]) -> str:
    """The budget unit of the configuration's resource kinds (``cores``, ...)."""
    names = {kind_of(d.resource).budget_unit for d in deps}
    return names.pop() if len(names) == 1 else "budget units"


@dataclass
class Evaluator:
    """Predicts a configuration at one rate (memoised: traces repeat their rates)."""

    table: dict[Any, Any]
    variants: dict[str, Any]
    slo_ms: float | None
    policy: Callable[[Plan], str]
    memo: dict[Any, dict[str, Any]] = field(default_factory=dict)
    keys: dict[int, tuple[Plan, tuple[Any, ...]]] = field(default_factory=dict)

    def at(self, plan: Plan, rate: float) -> dict[str, Any]:
        known = self.keys.get(id(plan))
        if known is None or known[0] is not plan:  # (the plan is kept: its id stays its own)
            known = self.keys[id(plan)] = (plan, config_key(plan.deployments))
        key = (known[1], float(rate))
        got = self.memo.get(key)
        if got is None:
            got = predict(
                plan.deployments,
                self.table,
                self.variants,
                rate_rps=float(rate),
                policy=self.policy(plan),
                percentile_slo_ms=self.slo_ms,
                spare_idle_w=spare_idle_w(plan),  # as simulate: a MIG GPU's empty slices
            )
            self.memo[key] = got
        return got

    def seconds(self, plan: Plan | None, rates: np.ndarray) -> dict[str, float]:
        """Totals over seconds at ``rates`` (one second each); ``plan`` None: nothing serves
        (every request violates)."""
        out = {"requests": 0.0, "violations": 0.0, "served": 0.0, "acc": 0.0, "energy_j": 0.0}
        out["cost_usd"] = 0.0
        out["busy"] = 0.0
        if rates.size == 0:
            return out
        values, counts = np.unique(rates, return_counts=True)
        for r, c in zip(values.tolist(), counts.tolist(), strict=True):
            out["requests"] += r * c
            if plan is None:
                out["violations"] += r * c
                continue
            m = self.at(plan, r)
            served = float(m["served_rps"] or 0.0)
            # over the SLO, an overloaded queue's requests included; without an SLO the
            # requests it cannot serve
            if self.slo_ms is not None:
                viol = float(m.get("slo_violation_frac") or 0.0) * r
            else:
                viol = float(m.get("dropped_rps") or 0.0)
            out["violations"] += min(viol, r) * c
            out["served"] += served * c
            if m.get("accuracy") is not None:
                out["acc"] += float(m["accuracy"]) * served * c
            out["energy_j"] += float(m["power_w"] or 0.0) * c
            out["cost_usd"] += float(m["cost_per_hour"] or 0.0) * c / 3600.0
            out["busy"] += float(m["utilisation"] or 0.0) * c
        return out


def load_time_s(
    old: Plan | None, new: Plan, variants: dict[str, Any], unmodeled: set[str]
) -> float:
    """The longest load time of the instances ``new`` adds to ``old``."""
    before: dict[tuple[str, str, int], int] = {}
    for d in old.deployments if old is not None else []:
        key = (d.variant, d.resource, d.batch)
        before[key] = before.get(key, 0) + d.count
    longest = 0.0
    for d in new.deployments:
        key = (d.variant, d.resource, d.batch)
        if d.count > before.get(key, 0):
            v = variants.get(d.variant)
            lt = getattr(v, "load_time_s", None) if v is not None else None
            if lt is None:
                unmodeled.add(d.variant)
            else:
                longest = max(longest, float(lt))
    return longest


def account(
    ev: Evaluator,
    step: PolicyStep,
    rates: np.ndarray,
    at: Interval,
    policy: str,
    fp: Footprint,
) -> dict[str, Any]:
    """One interval of one policy at the seconds' ``rates``: the seconds of its
    reconfiguration on what served before (or nothing, after an eviction), the rest on its
    plan."""
    split = min(math.ceil(step.reconfig_s), rates.size) if step.reconfig_s > 0 else 0
    parts = []
    if split:
        before = None if step.down else step.previous
        parts.append(ev.seconds(before, rates[:split]))
        if step.previous is not None and not step.down and step.plan is not None:
            # the loading instances are paid for, beside what serves
            extra = ev.seconds(step.plan, np.zeros(split))
            parts.append({"cost_usd": extra["cost_usd"], "energy_j": extra["energy_j"]})
    parts.append(ev.seconds(step.plan, rates[split:]))
    tot: dict[str, float] = {}
    for p in parts:
        for key, v in p.items():
            tot[key] = tot.get(key, 0.0) + v
    energy_j = tot.get("energy_j", 0.0)
    kwh = energy_j / 3.6e6
    served = tot.get("served", 0.0)
    requests = tot.get("requests", 0.0)
    deps = step.plan.deployments if step.plan is not None else []
    return {
        "policy": policy,
        "interval": at.k,
        "time": at.time,
        "offset_s": at.offset_s,
        "requests": requests,
        "peak_rps": at.peak_rps,
        "forecast_rps": step.forecast_rps,
        "carbon_g_per_kwh": at.carbon_g_per_kwh,
        "action": step.action,
        "config": config_label(deps),
        "units": units(deps),
        "reconfig_s": float(split),
        "violations": tot.get("violations", 0.0),
        "violation_frac": tot.get("violations", 0.0) / requests if requests > 0 else 0.0,
        "accuracy": tot.get("acc", 0.0) / served if served > 0 else None,
        "energy_j": energy_j,
        "carbon_g": fp.carbon_g(kwh, at.carbon_g_per_kwh),
        "water_l": fp.water_l(kwh),
        "cost_usd": tot.get("cost_usd", 0.0),
        "_busy_mean": tot.get("busy", 0.0) / max(rates.size, 1),
    }


def summarise(policy: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    req = sum(r["requests"] for r in rows)
    viol = sum(r["violations"] for r in rows)
    acc_num = sum((r["accuracy"] or 0.0) * r["requests"] for r in rows)
    acc_den = sum(r["requests"] for r in rows if r["accuracy"] is not None)
    water = [r["water_l"] for r in rows if r["water_l"] is not None]
    return {
        "policy": policy,
        "requests": req,
        "violations": viol,
        "violation_pct": 100.0 * viol / req if req > 0 else 0.0,
        "accuracy": acc_num / acc_den if acc_den > 0 else None,
        "energy_kwh": sum(r["energy_j"] for r in rows) / 3.6e6,
        "carbon_g": sum(r["carbon_g"] for r in rows),
        "water_l": sum(water) if water else None,
        "cost_usd": sum(r["cost_usd"] for r in rows),
        "changes": sum(1 for r in rows if r["action"] in ("change", "evict")),
        "mean_units": sum(r["units"] for r in rows) / len(rows) if rows else 0.0,
    }


# -- the replay of a single-family serving plan ----------------------------------------------
@dataclass
class Served:
    """What a replay evaluates its configurations with: the family's variants, the profiles
    picked at its SLO and the evaluator over them."""

    family: str
    variants: dict[str, Any]
    table: dict[Any, Any]
    slo_ms: float | None
    evaluator: Evaluator

    @classmethod
    def of(cls, store: Store, kind: PlanKind, first: Plan, request: dict[str, Any]) -> Served:
        family = first.deployments[0].model
        variants = {v.name: v for v in store.variants(family)}
        profiles = store.latest_profiles(family=family)
        probe = Plan(kind=first.kind, request=request, deployments=first.deployments)
        slo = sized_slo_ms(probe, variants, request.get("sla_ms"))
        slo_ms = next(iter(slo.values()), None) if slo else None
        if slo_ms is not None:
            slo = {v: slo_ms for v in variants}  # every variant sized at the family's SLO
        table = pick_profiles(profiles, slo)
        ev = Evaluator(table, variants, slo_ms, kind.dispatch_policy)
        return cls(family, variants, table, slo_ms, ev)


def first_plan(
    store: Store, kind: PlanKind, inputs: ReplayInputs, window: TraceWindow, forecast: float
) -> Plan:
    """The stored plan, else the request planned at the first interval's carbon (and the
    first forecast, without a rate)."""
    if inputs.first_plan is not None:
        return inputs.first_plan
    req = {**inputs.request, "carbon_intensity": float(window.carbon[0])}
    if req.get("rate_rps") is None and not req.get("families"):
        req["rate_rps"] = max(forecast, 1e-3)
    return kind.solve(store, req)[0]


@dataclass(frozen=True)
class ServingRun:
    """One serving replay as a kind's baselines see it."""

    store: Store  # the store, its repeated reads memoised (:class:`ReadCache`)
    inputs: ReplayInputs
    loop: ReplayLoop
    request: dict[str, Any]  # the request, with what the kind holds of the first plan
    first: Plan
    served: Served
    window: TraceWindow
    peaks: np.ndarray  # each interval's actual peak (req/s)
    forecasts: np.ndarray  # greenctl's forecast of each interval's peak
    carbon: float  # the request's carbon intensity (the reference one when it has none)

    @property
    def peak(self) -> float:
        """The window's peak (req/s): what the static baselines are sized for."""
        return float(self.peaks.max())


class LivePolicy(Protocol):
    """A baseline that decides each interval from what it saw of the ones before (VPA's
    pod): it cannot be planned ahead, so the accounting asks it interval by interval."""

    def decide(self, at: Interval) -> PolicyStep:
        """Its step in interval ``at``."""
        ...

    def learn(self, row: dict[str, Any], at: Interval) -> None:
        """What interval ``at`` showed it: its accounted ``row`` (``_busy_mean``: the mean
        utilisation of what served, which the result leaves out)."""
        ...


@dataclass
class Extras:
    """A kind's own baselines beside the static ones, by policy name."""

    policies: dict[str, list[PolicyStep]] = field(default_factory=dict)  # one step per interval
    live: Mapping[str, LivePolicy] = field(default_factory=dict)  # accounted after the others
    meta: dict[str, Any] = field(default_factory=dict)  # what the result's meta says of them


@dataclass(frozen=True)
class Serving:
    """What a single-family serving kind sets in the replay they share."""

    #: hold(first plan, request, notes): what every replan keeps of the first plan
    hold: Callable[[Plan, dict[str, Any], list[str]], None]
    #: static(run, baseline): the plan a static baseline (``base``, ``co2opt``) runs, sized
    #: for the window's peak; None: it is left out (a note says why)
    static: Callable[[ServingRun, str], Plan | None]
    #: the percentile the SLO is held at, of the request
    percentile: Callable[[dict[str, Any]], str]
    #: extras(run): the kind's own further baselines (None: it has none)
    extras: Callable[[ServingRun], Extras] | None = None


def replay_serving(
    store: Store, inputs: ReplayInputs, loop: ReplayLoop, serving: Serving
) -> dict[str, Any]:
    """Replay a single-family serving plan over a load trace and a carbon signal, beside its
    baselines."""
    opts = inputs.options
    if opts.load_trace is None:
        raise InputError(f"a {inputs.kind} replay needs --load-trace FILE (requests per second)")
    cached = cast("Store", ReadCache(store))  # it answers as the store does
    pk = get_kind(inputs.kind)
    request = dict(inputs.request)
    ci0 = float(request.get("carbon_intensity") or REFERENCE_CARBON_INTENSITY)
    win = loop.window(opts.load_trace, ci0)
    forecasts, peaks, forecast_note = loop.forecast(win.rps[: win.end_s], win)
    first = first_plan(cached, pk, inputs, win, float(forecasts[0]))
    label = (first.extra.get("model") or {}).get("label")
    if label:  # e.g. "synthetic profiles", "mps-emulated profiles"
        loop.notes.append(f"the plans rest on {label}")
    serving.hold(first, request, loop.notes)
    served = Served.of(cached, pk, first, request)
    run = ServingRun(cached, inputs, loop, request, first, served, win, peaks, forecasts, ci0)
    policies = {"greenctl": greenctl_steps(run), **static_baselines(run, serving)}
    extras = serving.extras(run) if serving.extras is not None else Extras()
    policies.update(extras.policies)
    fp = Footprint(float(request.get("pue") or 1.0), opts.wue_l_per_kwh, opts.ewif_l_per_kwh)
    rows = account_all(served.evaluator, win, intervals(win, peaks), policies, extras.live, fp)
    summary = [summarise(name, rs) for name, rs in rows.items()]
    for s in summary:  # what every figure rests on, in the CSV too
        s["basis"] = "modeled" + (f" on {label}" if label else "")
    meta = {
        "kind": inputs.kind,
        "family": served.family,
        "load_trace": str(opts.load_trace),
        **loop.window_meta(win, forecast_note),
        "slo_ms": served.slo_ms,
        "percentile": serving.percentile(request),
        "units": units_name(first.deployments),
        "first_plan": config_label(first.deployments),
        "first_plan_id": first.id,
        "baselines": list(inputs.baselines),
        **extras.meta,
        "peak_rps": run.peak,
        "evaluations": len(served.evaluator.memo),
        "solver": (solvers.active_memo() or solvers.SolveMemo()).stats(),
        "modeled": MODELED,
        # "synthetic profiles", "mps-emulated profiles": what the figures rest on (None: measured)
        "label": label or None,
    }
    return loop.finish(meta, summary, rows, INTERVAL_COLUMNS, SUMMARY_COLUMNS)


def greenctl_steps(run: ServingRun) -> list[PolicyStep]:
    """greenctl's own policy: the loop's replanning round each interval, at greenctl's
    forecast and the interval's carbon."""
    forecasts, win = run.forecasts, run.window

    def round_of(running: Plan, k: int, reference: float) -> Round:
        rate, ci = float(forecasts[k]), float(win.carbon[k])
        key = (config_key(running.deployments), ci, reference, rate)
        return Round(key, {"signal": ci, "reference": reference, "rate": max(rate, 1e-3)}, rate)

    def load_time(old: Plan, new: Plan) -> float:
        return load_time_s(old, new, run.served.variants, run.loop.unmodeled)

    return run.loop.greenctl(run.store, run.first, win, round_of, load_time)


def static_baselines(run: ServingRun, serving: Serving) -> dict[str, list[PolicyStep]]:
    """The static baselines asked for: the kind's plan for each, kept every interval."""
    out: dict[str, list[PolicyStep]] = {}
    peak = run.peak
    for name in STATIC_BASELINES:
        if name in run.inputs.baselines:
            p = serving.static(run, name)
            if p is not None:
                out[name] = [PolicyStep(p, "start", peak)] + [
                    PolicyStep(p, "keep", peak) for _ in range(1, run.window.intervals)
                ]
    return out


def account_all(
    ev: Evaluator,
    win: TraceWindow,
    at: list[Interval],
    policies: dict[str, list[PolicyStep]],
    live: Mapping[str, LivePolicy],
    fp: Footprint,
) -> dict[str, list[dict[str, Any]]]:
    """Every interval of every policy; a live policy learns from each interval it served
    before it decides the next."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in [*policies, *live]}
    for k, interval in enumerate(at):
        rates = win.interval_rates(k)
        for name, steps in policies.items():
            rows[name].append(account(ev, steps[k], rates, interval, name, fp))
        for name, policy in live.items():
            row = account(ev, policy.decide(interval), rates, interval, name, fp)
            rows[name].append(row)
            policy.learn(row, interval)
    for rs in rows.values():
        for r in rs:
            r.pop("_busy_mean", None)
    return rows
