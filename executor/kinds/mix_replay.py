"""The replay step of single-family serving plans: mix's, and mig's on top of it.

Each second of an interval's arrivals is evaluated on what serves with the evaluation core's
analytic :func:`~greenctl.planner.core.evaluate.predict` (each second in steady state at its
own rate, Poisson within it; the queue carried from one second to the next is not modeled),
and SLO violations (requests over the SLO at the plan's percentile, plus every request an
overloaded configuration cannot serve), accuracy, energy, carbon, water and cost are
accounted per interval. A change pays its reconfiguration: each new instance loads for its
variant's ``load_time_s`` (a profile import's) while the previous configuration serves and
both are paid for; a variant without a load time is not modeled (0 s, and the result says so).

Mix's baselines (:data:`BASELINES`) run on the same intervals and the same seconds:

- ``base``: the most accurate variant sized for the window's peak (static; Clover's BASE);
- ``co2opt``: the variant of least carbon that meets the SLO, sized for the peak (static);
- ``vpa``: one variant on one pod whose CPU request follows the Kubernetes Vertical Pod
  Autoscaler's recommender (:class:`VpaConfig`): the 90th percentile of CPU usage in a
  histogram decaying with a 24 h half-life, plus a 15 % safety margin; the updater (every
  minute) evicts the pod when its request leaves the [50th, 95th percentile] x margin
  bounds and the pod restarts with the target (rounded up to whole cores: the profiles
  are per whole core), unavailable for its model's load time;
- ``infaas`` (only when asked): INFaaS-style greedy, reactive scaling (a simplification of
  its autoscaler, an assumption as modeled here): no forecast; when the last interval's
  peak exceeds what serves, at once the cheapest single-variant configuration that carries
  it (replicas or a faster variant, whichever costs less: ``plan mix --strategy single
  --objective cost`` at that rate, under the request's ``min_accuracy``); after
  :data:`INFAAS_DOWN_AFTER` intervals under :data:`INFAAS_LOW_WATER` of its capacity, down
  to the cheapest that carries the last peak. Each change pays the new instances' load
  time, as greenctl's;
- ``infadapter`` (only when asked): InfAdapter's own loop. Every interval its LSTM
  forecasts the interval's peak (a saved forecaster named ``lstm``, else InfAdapter's LSTM
  fitted on the trace's per-interval peaks before the window; without such history it is
  left out, and the notes say why), rounded up to whole requests per second, and the exact
  ILP sizes the variant mix for it with InfAdapter's objective (accuracy - alpha x cost -
  beta x loading, the request's alpha and beta; no carbon term), the running variants
  counting as loaded: no dwell, threshold, margin or carbon signal. A new plan with the
  running instances only re-routes (new quotas, no reconfiguration); any other change pays
  the new instances' load time, as greenctl's.

Every figure is modeled (profiles, the analytic queueing model, the energy of the profiles);
the result labels them so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError, NotFoundError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import kind_of, parse_resource
from greenctl.executor.kinds.base import PlanKind, get_kind
from greenctl.executor.kinds.replaying import (
    Footprint,
    Interval,
    PolicyStep,
    ReplayInputs,
    ReplayLoop,
    ReplayStep,
    Round,
    TraceWindow,
    intervals,
)
from greenctl.planner.core import forecast as fc
from greenctl.planner.core import solvers
from greenctl.planner.core.evaluate import build_instances, predict, spare_idle_w
from greenctl.planner.core.simulator import pick_profiles, sized_slo_ms
from greenctl.planner.mix.solve import REFERENCE_CARBON_INTENSITY

if TYPE_CHECKING:
    from greenctl.data.store import Store

BASELINES = ("base", "co2opt", "vpa", "infaas", "infadapter")
#: the baselines a replay runs unless told
DEFAULT_BASELINES = ("base", "co2opt", "vpa")
#: INFaaS-style scaling: scale down after this many intervals under the low-water mark
INFAAS_DOWN_AFTER = 5
#: ... of the running configuration's capacity
INFAAS_LOW_WATER = 0.5
#: InfAdapter's loop: a saved forecaster of this name is its LSTM ...
INFADAPTER_FORECASTER = "lstm"
#: ... else InfAdapter's LSTM is fitted on the history before the window, for at least this
#: many optimizer steps (InfAdapter's 8 epochs over 14 days of minutes at batch 512: 320)
INFADAPTER_MIN_STEPS = 320
#: the columns of one interval of one policy
INTERVAL_COLUMNS = (
    "policy",
    "interval",
    "time",
    "offset_s",
    "requests",
    "peak_rps",
    "forecast_rps",
    "carbon_g_per_kwh",
    "action",
    "config",
    "units",
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


@dataclass(frozen=True)
class VpaConfig:
    """The Vertical Pod Autoscaler's recommender and updater, with their defaults
    (kubernetes/autoscaler, vertical-pod-autoscaler/docs/flags.md)."""

    target_percentile: float = 0.9  # --target-cpu-percentile
    lower_percentile: float = 0.5  # --recommendation-lower-bound-cpu-percentile
    upper_percentile: float = 0.95  # --recommendation-upper-bound-cpu-percentile
    margin: float = 0.15  # --recommendation-margin-fraction
    half_life_s: float = 86400.0  # --cpu-histogram-decay-half-life (24h)
    interval_s: float = 60.0  # --recommender-interval / --updater-interval (1m)
    update_threshold: float = 0.1  # --pod-update-threshold
    #: the CPU histogram's buckets: the first 0.01 cores wide, each 5 % wider
    first_bucket: float = 0.01
    bucket_ratio: float = 1.05

    def describe(self) -> str:
        return (
            f"VPA: target p{self.target_percentile * 100:g} of CPU usage x "
            f"{1 + self.margin:g} (decaying histogram, half-life {self.half_life_s / 3600:g} h), "
            f"evict when the request leaves [p{self.lower_percentile * 100:g}, "
            f"p{self.upper_percentile * 100:g}] x {1 + self.margin:g} (the recommender's "
            "confidence widening of the bounds is not modeled), updater every "
            f"{self.interval_s:g} s, min-replicas 1 (the default 2 never evicts a one-pod "
            "deployment), restart = the model's load time without service"
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


def static_plan(
    store: Store, kind_name: str, request: dict[str, Any], *, rate: float, objective: str
) -> tuple[Plan, str | None]:
    """One variant sized for ``rate`` (``strategy single``) for ``objective``; over the budget
    it is sized without the budget, which the note says."""
    req = {**request, "rate_rps": rate, "objective": objective, "strategy": "single"}
    try:
        return get_kind(kind_name).plan(store, req)[0], None
    except InfeasiblePlan:
        req.pop("budgets", None)
        plan = get_kind(kind_name).plan(store, req)[0]
        return plan, "sized without the budget (the budget cannot carry the peak)"


def family_request(request: dict[str, Any]) -> dict[str, Any]:
    """A one-family request (``model``, ``rate_rps``, ...) from one of either shape."""
    fams = request.get("families")
    if isinstance(fams, list) and len(fams) == 1 and isinstance(fams[0], dict):
        out = {k: v for k, v in request.items() if k != "families"}
        out.update(fams[0])
        return out
    if isinstance(fams, list) and len(fams) > 1:
        raise InputError(
            f"the baselines replay one model family; this request has {len(fams)} families",
            hint="pass --baseline none, or replay one family",
        )
    return dict(request)


class Vpa:
    """A one-pod deployment of one variant whose CPU request follows VPA (module docstring)."""

    def __init__(
        self,
        variant: str,
        model: str,
        cores_available: list[int],
        cfg: VpaConfig,
        load_time_s: float | None,
        first_rate: float,
        capacity: Callable[[int], float],
    ) -> None:
        self.variant, self.model, self.cfg = variant, model, cfg
        self.sizes = sorted(cores_available)
        self.load_time_s = load_time_s or 0.0
        self.hist: dict[int, float] = {}
        self.plans: dict[int, Plan] = {}
        # the initial request: the smallest size that carries the first interval's peak
        self.cores = next((c for c in self.sizes if capacity(c) >= first_rate), self.sizes[-1])
        self.last_action_s = -math.inf

    def plan(self) -> Plan:
        """The pod at its current request (one plan per size)."""
        if self.cores not in self.plans:
            dep = Deployment(self.model, self.variant, f"cpu:{self.cores}", 1, 1, None)
            self.plans[self.cores] = Plan(
                kind="mix", request={"model": self.model}, deployments=[dep]
            )
        return self.plans[self.cores]

    def _bucket(self, usage: float) -> int:
        c = self.cfg
        if usage <= c.first_bucket:
            return 0
        return int(math.log(usage / c.first_bucket) / math.log(c.bucket_ratio)) + 1

    def _edge(self, b: int) -> float:  # the upper edge of bucket b
        return self.cfg.first_bucket * self.cfg.bucket_ratio**b

    def observe(self, usage_cores: float, t_s: float) -> None:
        # newer samples weigh more: 2^(t / half-life) (VPA's decaying histogram); each
        # sample weighs the pod's CPU request too, as VPA weighs CPU samples
        w = 2.0 ** (t_s / self.cfg.half_life_s) * max(float(self.cores), 0.1)
        b = self._bucket(usage_cores)
        self.hist[b] = self.hist.get(b, 0.0) + w

    def _percentile(self, p: float) -> float:
        total = sum(self.hist.values())
        acc = 0.0
        for b in sorted(self.hist):
            acc += self.hist[b]
            if acc >= p * total:
                return self._edge(b)
        return self._edge(max(self.hist))

    def step(self, t_s: float) -> bool:
        """The updater at time ``t_s``; True when it evicts (a new request)."""
        if not self.hist or t_s - self.last_action_s < self.cfg.interval_s:
            return False
        m = 1.0 + self.cfg.margin
        target = self._percentile(self.cfg.target_percentile) * m
        lower = self._percentile(self.cfg.lower_percentile) * m
        upper = self._percentile(self.cfg.upper_percentile) * m
        if lower <= self.cores <= upper:
            return False
        want = next((c for c in self.sizes if c >= target - 1e-9), self.sizes[-1])
        if want == self.cores or abs(want - self.cores) / self.cores <= self.cfg.update_threshold:
            return False
        self.cores = want
        self.last_action_s = t_s
        return True


def vpa_pod(
    name: str,
    family: str,
    table: dict[Any, Any],
    variants: dict[str, Any],
    cfg: VpaConfig,
    first_rate: float,
    unmodeled: set[str],
) -> Vpa:
    """VPA's pod of variant ``name`` (its cpu:N profiles are the sizes it can take)."""
    if name not in variants:
        raise InputError(
            f"--vpa-variant '{name}' is not a variant of {family}",
            hint=f"one of {', '.join(sorted(variants))}",
        )
    sizes = sorted(
        cores
        for (v, r, b) in table
        if v == name and b == 1 and (cores := parse_resource(r).cpu_cores) is not None
    )
    if not sizes:
        raise InputError(
            f"--vpa-variant {name}: VPA sizes CPU, and the store has no cpu:N profile of it",
            hint="profile it on CPUs, or pick another variant",
        )

    def capacity(c: int) -> float:
        dep = Deployment(family, name, f"cpu:{c}", 1, 1, None)
        return build_instances([dep], table)[0].capacity_rps

    lt = getattr(variants[name], "load_time_s", None)
    if lt is None:
        unmodeled.add(name)
    return Vpa(name, family, sizes, cfg, lt, first_rate, capacity)


def infaas_steps(
    store: Store,
    kind: str,
    request: dict[str, Any],
    peaks: np.ndarray,
    forecasts: np.ndarray,
    table: dict[Any, Any],
    variants: dict[str, Any],
    unmodeled: set[str],
) -> list[PolicyStep]:
    """INFaaS-style greedy reactive scaling (module docstring) over the intervals."""
    memo: dict[float, Plan] = {}

    def cheapest(rate: float) -> Plan:
        rate = max(float(rate), 1e-3)
        if rate not in memo:
            memo[rate] = static_plan(store, kind, request, rate=rate, objective="cost")[0]
        return memo[rate]

    def capacity(plan: Plan) -> float:
        return sum(i.capacity_rps for i in build_instances(plan.deployments, table))

    running = cheapest(float(forecasts[0]))  # what served before the window, as greenctl's
    out = [PolicyStep(running, "start", None)]
    below = 0
    for k in range(1, len(peaks)):
        seen = float(peaks[k - 1])  # reactive: the load it observed, no forecast
        cap = capacity(running)
        new = None
        if seen > cap:
            new, below = cheapest(seen), 0
        elif seen < INFAAS_LOW_WATER * cap:
            below += 1
            if below >= INFAAS_DOWN_AFTER:
                new, below = cheapest(seen), 0
        else:
            below = 0
        if new is not None and config_key(new.deployments) != config_key(running.deployments):
            lt = load_time_s(running, new, variants, unmodeled)
            out.append(PolicyStep(new, "change", None, running, lt))
            running = new
        else:
            out.append(PolicyStep(running, "keep", None))
    return out


def infadapter_forecasts(
    loop: ReplayLoop, history: np.ndarray, peaks: np.ndarray, every_s: int
) -> tuple[np.ndarray | None, str]:
    """InfAdapter's one-step-ahead LSTM forecast of each interval's peak (``peaks``), from
    the per-interval peaks before the window (``history``) and the window's own before it.

    Returns:
        (the forecasts, rounded up to whole req/s, or None when there is no LSTM to use;
        a note saying which LSTM, or why the baseline is left out).
    """
    try:
        f = loop.forecaster(INFADAPTER_FORECASTER)
    except NotFoundError:
        f = None
    if f is not None and not isinstance(f, fc.LSTMForecaster):
        return None, (
            f"infadapter: left out, the saved forecaster '{INFADAPTER_FORECASTER}' is no LSTM"
        )
    if f is not None:
        how = f"the saved forecaster '{INFADAPTER_FORECASTER}'"
    else:
        lstm = fc.make_forecaster("lstm", min_steps=INFADAPTER_MIN_STEPS)
        assert isinstance(lstm, fc.LSTMForecaster)
        if history.size <= lstm.window + 1:
            return None, (
                f"infadapter: left out, InfAdapter's LSTM needs more than {lstm.window + 1} "
                f"intervals of the trace before the window to learn from ({history.size} "
                "here): start later with --from, or save one with `greenctl forecast fit "
                f"--forecaster lstm --name {INFADAPTER_FORECASTER}`"
            )
        f = lstm.fit(history)
        how = f"InfAdapter's LSTM fitted on the {history.size} per-{every_s}s peaks before it"
    if history.size:
        series = np.concatenate([history, peaks])
        pred = np.asarray(f.predict_series(series, history.size), dtype=float)[: peaks.size]
    else:  # a saved LSTM without history: the first interval plans for its own peak
        pred = np.empty(peaks.size)
        pred[0] = peaks[0]
        if peaks.size > 1:
            pred[1:] = np.asarray(f.predict_series(peaks, 1), dtype=float)[: peaks.size - 1]
    pred = np.ceil(np.maximum(pred, 0.0) - 1e-9)
    return pred, f"infadapter: forecasts by {how}, rounded up to whole req/s"


def loaded_key(deps: Sequence[Deployment]) -> tuple[Any, ...]:
    """The instances a configuration runs (its quotas aside)."""
    return tuple(sorted((d.model, d.variant, d.resource, d.batch, d.count) for d in deps))


def infadapter_steps(
    store: Store,
    kind: str,
    request: dict[str, Any],
    forecasts: np.ndarray,
    variants: dict[str, Any],
    unmodeled: set[str],
) -> tuple[list[PolicyStep], dict[str, int]]:
    """InfAdapter's own loop (module docstring) over the intervals' ``forecasts``.

    Returns:
        (the steps, ``{"plans", "infeasible"}``: ILP plans made, intervals it could not plan).
    """
    pk = get_kind(kind)
    base = {k: v for k, v in request.items() if k != "current"}
    base.update(objective="balanced", gamma=0.0, strategy="ilp")
    # the plan depends on the forecast and on which variants are loaded (InfAdapter's
    # loading term): one plan per pair, as the same inputs give the same plan
    memo: dict[tuple[float, frozenset[str]], Plan | InfeasiblePlan] = {}
    stats = {"plans": 0, "infeasible": 0}

    def plan_at(rate: float, running: Plan | None) -> Plan | InfeasiblePlan:
        loaded = frozenset(d.variant for d in running.deployments) if running else frozenset()
        key = (max(float(rate), 1.0), loaded)
        if key not in memo:
            stats["plans"] += 1
            try:
                memo[key] = pk.plan(store, {**base, "rate_rps": key[0]}, current=running)[0]
            except InfeasiblePlan as exc:
                memo[key] = exc
        return memo[key]

    first = plan_at(float(forecasts[0]), None)
    if isinstance(first, InfeasiblePlan):
        raise first
    running = first
    out = [PolicyStep(running, "start", float(forecasts[0]))]
    for k in range(1, len(forecasts)):
        rate = float(forecasts[k])
        new = plan_at(rate, running)
        if isinstance(new, InfeasiblePlan):
            stats["infeasible"] += 1
            out.append(PolicyStep(running, "infeasible", rate))
        elif loaded_key(new.deployments) == loaded_key(running.deployments):
            running = new  # the same instances, re-routed to the new quotas
            out.append(PolicyStep(running, "keep", rate))
        else:
            lt = load_time_s(running, new, variants, unmodeled)
            out.append(PolicyStep(new, "change", rate, running, lt))
            running = new
    return out, stats


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
@dataclass(frozen=True)
class Serving:
    """What a single-family serving kind (mix, mig) sets in the replay they share."""

    #: hold(first plan, request, notes): what every replan keeps of the first plan
    hold: Callable[[Plan, dict[str, Any], list[str]], None]
    #: static(store, kind, first plan, request, baseline, peak rps, carbon, notes): the plan a
    #: static baseline (``base``, ``co2opt``) runs, sized for the window's peak; None: it is
    #: left out (a note says why)
    static: Callable[..., Plan | None]
    #: the percentile the SLO is held at, of the request
    percentile: Callable[[dict[str, Any]], str]


#: the objective each static baseline of a mix plan is planned for
STATIC_OBJECTIVES = {"base": "accuracy", "co2opt": "carbon"}


def mix_static(
    store: Any,
    kind: str,
    first: Plan,
    request: dict[str, Any],
    name: str,
    peak: float,
    carbon: float,
    notes: list[str],
) -> Plan:
    """A mix plan's static baseline: one variant sized for the peak for its objective."""
    plan, note = static_plan(
        store, kind, family_request(request), rate=peak, objective=STATIC_OBJECTIVES[name]
    )
    if note:
        notes.append(f"{name}: {note}")
    return plan


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
    def of(cls, store: Any, kind: PlanKind, first: Plan, request: dict[str, Any]) -> Served:
        family = first.deployments[0].model
        variants = {v.name: v for v in store.variants(family)}
        profiles = store.latest_profiles(family=family)
        probe = Plan(kind="mix", request=request, deployments=first.deployments)
        slo = sized_slo_ms(probe, variants, request.get("sla_ms"))
        slo_ms = next(iter(slo.values()), None) if slo else None
        if slo_ms is not None:
            slo = {v: slo_ms for v in variants}  # every variant sized at the family's SLO
        table = pick_profiles(profiles, slo)
        ev = Evaluator(table, variants, slo_ms, kind.dispatch_policy)
        return cls(family, variants, table, slo_ms, ev)


def first_plan(
    store: Any, kind: PlanKind, inputs: ReplayInputs, window: TraceWindow, forecast: float
) -> Plan:
    """The stored plan, else the request planned at the first interval's carbon (and the
    first forecast, without a rate)."""
    if inputs.first_plan is not None:
        return inputs.first_plan
    req = {**inputs.request, "carbon_intensity": float(window.carbon[0])}
    if req.get("rate_rps") is None and not req.get("families"):
        req["rate_rps"] = max(forecast, 1e-3)
    assert kind.plan is not None
    return kind.plan(store, req)[0]


def replay_serving(
    store: Store, inputs: ReplayInputs, loop: ReplayLoop, serving: Serving
) -> dict[str, Any]:
    """Replay a mix or mig plan over a load trace and a carbon signal, beside its baselines."""
    opts = inputs.options
    if opts.load_trace is None:
        raise InputError(f"a {inputs.kind} replay needs --load-trace FILE (requests per second)")
    cached = ReadCache(store)
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

    def round_of(running: Plan, k: int, reference: float) -> Round:
        rate, ci = float(forecasts[k]), float(win.carbon[k])
        key = (config_key(running.deployments), ci, reference, rate)
        return Round(key, {"signal": ci, "reference": reference, "rate": max(rate, 1e-3)}, rate)

    def load_time(old: Plan, new: Plan) -> float:
        return load_time_s(old, new, served.variants, loop.unmodeled)

    policies = {"greenctl": loop.greenctl(cached, first, win, round_of, load_time)}
    peak = float(peaks.max())
    for name in ("base", "co2opt"):
        if name in inputs.baselines:
            p = serving.static(cached, inputs.kind, first, request, name, peak, ci0, loop.notes)
            if p is not None:
                n = win.intervals
                policies[name] = [PolicyStep(p, "start", peak)] + [
                    PolicyStep(p, "keep", peak) for _ in range(1, n)
                ]
    policies.update(scaling_baselines(cached, inputs, loop, served, (win, peaks, forecasts)))
    vpa_cfg = opts.kind_options.get("vpa") or VpaConfig()
    pods = vpa_pods(inputs, first, served, vpa_cfg, float(peaks[0]), loop.unmodeled)
    fp = Footprint(float(request.get("pue") or 1.0), opts.wue_l_per_kwh, opts.ewif_l_per_kwh)
    rows = account_all(served.evaluator, win, intervals(win, peaks), policies, pods, fp)
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
        "vpa": None
        if not pods
        else {"variants": {k: v.variant for k, v in pods.items()}, "rule": vpa_cfg.describe()},
        "peak_rps": peak,
        "evaluations": len(served.evaluator.memo),
        "solver": (solvers.active_memo() or solvers.SolveMemo()).stats(),
        "modeled": MODELED,
        # "synthetic profiles", "mps-emulated profiles": what the figures rest on (None: measured)
        "label": label or None,
    }
    return loop.finish(meta, summary, rows, INTERVAL_COLUMNS, SUMMARY_COLUMNS)


def scaling_baselines(
    store: Any,
    inputs: ReplayInputs,
    loop: ReplayLoop,
    served: Served,
    load: tuple[TraceWindow, np.ndarray, np.ndarray],
) -> dict[str, list[PolicyStep]]:
    """The ``infaas`` and ``infadapter`` policies asked for; ``load``: the window, its
    intervals' peaks and greenctl's forecasts of them."""
    win, peaks, forecasts = load
    out: dict[str, list[PolicyStep]] = {}
    if "infaas" in inputs.baselines:
        out["infaas"] = infaas_steps(
            store, inputs.kind, family_request(inputs.request), peaks, forecasts, served.table,
            served.variants, loop.unmodeled,
        )  # fmt: skip
    if "infadapter" in inputs.baselines:
        first_k = win.first_s // win.every_s
        aligned = first_k >= 1 and win.first_s % win.every_s == 0
        history = fc.minute_maxima(win.rps[: win.end_s], interval_s=win.every_s)[:first_k]
        ia_fc, ia_note = infadapter_forecasts(
            loop, history if aligned else np.empty(0), peaks, win.every_s
        )
        loop.notes.append(ia_note)
        if ia_fc is not None:
            out["infadapter"], ia_stats = infadapter_steps(
                store, inputs.kind, family_request(inputs.request), ia_fc, served.variants,
                loop.unmodeled,
            )  # fmt: skip
            loop.stats["infadapter_plans"] = ia_stats["plans"]
            if ia_stats["infeasible"]:
                loop.notes.append(
                    f"infadapter: {ia_stats['infeasible']} intervals could not be planned "
                    "for their forecast within the budgets: the running plan served"
                )
    return out


def vpa_pods(
    inputs: ReplayInputs,
    first: Plan,
    served: Served,
    cfg: VpaConfig,
    first_rate: float,
    unmodeled: set[str],
) -> dict[str, Vpa]:
    """VPA's pods by policy name (``vpa``, or ``vpa-<variant>`` for several variants)."""
    if "vpa" not in inputs.baselines:
        return {}
    given = inputs.options.kind_options.get("vpa_variant")
    if isinstance(given, str):
        wanted = [given]
    elif given:
        wanted = list(given)
    else:
        main = max(first.deployments, key=lambda d: (d.quota_rps or 0.0) * d.count)
        wanted = [main.variant]
    return {
        ("vpa" if len(wanted) == 1 else f"vpa-{name}"): vpa_pod(
            name, served.family, served.table, served.variants, cfg, first_rate, unmodeled
        )
        for name in wanted
    }


def account_all(
    ev: Evaluator,
    win: TraceWindow,
    at: list[Interval],
    policies: dict[str, list[PolicyStep]],
    pods: dict[str, Vpa],
    fp: Footprint,
) -> dict[str, list[dict[str, Any]]]:
    """Every interval of every policy; a VPA pod observes the usage of each interval it
    served before the updater's next step."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in [*policies, *pods]}
    for k, interval in enumerate(at):
        rates = win.interval_rates(k)
        for name, steps in policies.items():
            rows[name].append(account(ev, steps[k], rates, interval, name, fp))
        for name, pod in pods.items():
            evicted = k > 0 and pod.step(interval.offset_s)
            step = PolicyStep(pod.plan(), "evict" if evicted else ("start" if k == 0 else "keep"))
            if evicted:
                step.reconfig_s, step.down = pod.load_time_s, True
            row = account(ev, step, rates, interval, name, fp)
            rows[name].append(row)
            # usage the pod showed over the interval (capped at its request, as a limit does)
            pod.observe(min(row["_busy_mean"] * pod.cores, float(pod.cores)), interval.offset_s)
    for rs in rows.values():
        for r in rs:
            r.pop("_busy_mean", None)
    return rows


#: mix's replay step
MIX = Serving(
    hold=lambda plan, request, notes: None,
    static=mix_static,
    percentile=lambda request: str(request.get("percentile") or "p95"),
)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, MIX),
    baselines=BASELINES,
    default_baselines=DEFAULT_BASELINES,
    options=("vpa_variant", "vpa"),
)
