"""What-if replay: the control loop over a load trace and a carbon trace, beside baselines.

``greenctl replay`` answers "what would greenctl have done over last week's traffic and grid,
and against what I run now?" without applying anything. At each interval of ``every``
seconds:

1. the load is forecast (per-interval peaks of the trace before the interval, through the
   forecasters of :mod:`greenctl.planner.core.forecast`, a saved one by name as ``replan``
   finds it, :func:`greenctl.executor.control.forecasters.get_forecaster`);
2. the running plan is planned again through the decision ``replan`` itself takes
   (:func:`greenctl.executor.control.replan.replan_choice`: the kind's request rewritten for the
   signal and the forecast, planned through the registry, the running plan scored in the
   same problem, the threshold and margin), not sooner than ``min_dwell_s`` after the last
   change (:func:`~greenctl.executor.control.replan.dwell_since`); nothing is saved or applied;
3. a change pays its reconfiguration: each new instance loads for its variant's
   ``load_time_s`` (a profile import's ``load_time_s``), while the previous configuration
   serves and both are paid for; a variant without a load time is not modeled (0 s, and
   the result says so);
4. the interval's actual arrivals are evaluated on what serves, second by second of the
   trace, with the evaluation core's analytic :func:`~greenctl.planner.core.evaluate.predict`
   (each second in steady state at its own rate, Poisson within it; the queue carried from
   one second to the next is not modeled), and SLO violations (requests over the SLO at the
   plan's percentile, plus every request an overloaded configuration cannot serve),
   accuracy, energy, carbon, water and cost are accounted per interval.

Baselines run on the same intervals and the same seconds (:data:`BASELINES`):

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
the result labels them so. A replay solves under
:func:`greenctl.planner.core.solvers.solve_memo`: a HiGHS problem identical to one solved
before in the replay is answered with that solve's outcome (``meta["solver"]`` counts them).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL_S, REPLAN_THRESHOLD
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import parse_resource
from greenctl.executor.control.replay_inputs import iso_at as _iso_at
from greenctl.executor.control.replay_inputs import parse_every
from greenctl.executor.control.replay_inputs import trace_window as _window
from greenctl.planner.core import solvers

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
#: the kinds replay takes so far
REPLAYED = ("mix", "mig")
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


# -- evaluation of what serves ----------------------------------------------------------------
class _ReadCache:
    """The store, with the reads a planning round repeats (variants, profiles) memoised: a
    replay plans hundreds of times from one unchanged store."""

    def __init__(self, store: Any) -> None:
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


def _config_key(deps: Sequence[Deployment]) -> tuple[Any, ...]:
    return tuple(
        sorted((d.model, d.variant, d.resource, d.batch, d.count, d.quota_rps) for d in deps)
    )


def config_label(deps: Sequence[Deployment]) -> str:
    """``resnet50@cpu:6x1 + resnet18@cpu:2x2``."""
    return " + ".join(f"{d.variant}@{d.resource}x{d.count}" for d in deps)


def _units(deps: Sequence[Deployment]) -> float:
    """The configuration's size in its kind's budget units (cores, MIG compute slices)."""
    from greenctl.data.resources import kind_of

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
    from greenctl.data.resources import kind_of

    names = {kind_of(d.resource).budget_unit for d in deps}
    return names.pop() if len(names) == 1 else "budget units"


@dataclass
class _Evaluator:
    """Predicts a configuration at one rate (memoised: traces repeat their rates)."""

    table: dict[Any, Any]
    variants: dict[str, Any]
    slo_ms: float | None
    policy: Callable[[Plan], str]
    memo: dict[Any, dict[str, Any]] = field(default_factory=dict)
    keys: dict[int, tuple[Plan, tuple[Any, ...]]] = field(default_factory=dict)

    def at(self, plan: Plan, rate: float) -> dict[str, Any]:
        from greenctl.planner.core.evaluate import predict, spare_idle_w

        known = self.keys.get(id(plan))
        if known is None or known[0] is not plan:  # (the plan is kept: its id stays its own)
            known = self.keys[id(plan)] = (plan, _config_key(plan.deployments))
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


# -- the policies -----------------------------------------------------------------------------
@dataclass
class _Step:
    """What one policy does in one interval."""

    plan: Plan | None  # what serves after the change (None: nothing)
    action: str
    forecast_rps: float | None = None
    previous: Plan | None = None  # what serves while the new instances load
    reconfig_s: float = 0.0
    down: bool = False  # nothing serves during reconfig_s (an eviction)


def _load_time_s(
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


def _static_plan(
    store: Any, kind_name: str, request: dict[str, Any], *, rate: float, objective: str
) -> tuple[Plan, str | None]:
    """One variant sized for ``rate`` (``strategy single``) for ``objective``; over the budget
    it is sized without the budget, which the note says."""
    from greenctl.executor.kinds import get_kind

    req = {**request, "rate_rps": rate, "objective": objective, "strategy": "single"}
    try:
        return get_kind(kind_name).plan(store, req)[0], None
    except InfeasiblePlan:
        req.pop("budgets", None)
        plan = get_kind(kind_name).plan(store, req)[0]
        return plan, "sized without the budget (the budget cannot carry the peak)"


def _family_request(request: dict[str, Any]) -> dict[str, Any]:
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


class _Vpa:
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


def _vpa_pod(
    name: str,
    family: str,
    table: dict[Any, Any],
    variants: dict[str, Any],
    cfg: VpaConfig,
    first_rate: float,
    unmodeled: set[str],
) -> _Vpa:
    """VPA's pod of variant ``name`` (its cpu:N profiles are the sizes it can take)."""
    from greenctl.planner.core.evaluate import build_instances

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
    return _Vpa(name, family, sizes, cfg, lt, first_rate, capacity)


def _infaas_steps(
    store: Any,
    kind: str,
    request: dict[str, Any],
    peaks: np.ndarray,
    forecasts: np.ndarray,
    table: dict[Any, Any],
    variants: dict[str, Any],
    unmodeled: set[str],
) -> list[_Step]:
    """INFaaS-style greedy reactive scaling (module docstring) over the intervals."""
    from greenctl.planner.core.evaluate import build_instances

    memo: dict[float, Plan] = {}

    def cheapest(rate: float) -> Plan:
        rate = max(float(rate), 1e-3)
        if rate not in memo:
            memo[rate] = _static_plan(store, kind, request, rate=rate, objective="cost")[0]
        return memo[rate]

    def capacity(plan: Plan) -> float:
        return sum(i.capacity_rps for i in build_instances(plan.deployments, table))

    running = cheapest(float(forecasts[0]))  # what served before the window, as greenctl's
    out = [_Step(running, "start", None)]
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
        if new is not None and _config_key(new.deployments) != _config_key(running.deployments):
            lt = _load_time_s(running, new, variants, unmodeled)
            out.append(_Step(new, "change", None, running, lt))
            running = new
        else:
            out.append(_Step(running, "keep", None))
    return out


def _infadapter_forecasts(
    store: Any, history: np.ndarray, peaks: np.ndarray, every_s: int
) -> tuple[np.ndarray | None, str]:
    """InfAdapter's one-step-ahead LSTM forecast of each interval's peak (``peaks``), from
    the per-interval peaks before the window (``history``) and the window's own before it.

    Returns:
        (the forecasts, rounded up to whole req/s, or None when there is no LSTM to use;
        a note saying which LSTM, or why the baseline is left out).
    """
    from greenctl.data.errors import NotFoundError
    from greenctl.executor.control import forecasters
    from greenctl.planner.core import forecast as fc

    try:
        f = forecasters.get_forecaster(store, INFADAPTER_FORECASTER)
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


def _loaded_key(deps: Sequence[Deployment]) -> tuple[Any, ...]:
    """The instances a configuration runs (its quotas aside)."""
    return tuple(sorted((d.model, d.variant, d.resource, d.batch, d.count) for d in deps))


def _infadapter_steps(
    store: Any,
    kind: str,
    request: dict[str, Any],
    forecasts: np.ndarray,
    variants: dict[str, Any],
    unmodeled: set[str],
) -> tuple[list[_Step], dict[str, int]]:
    """InfAdapter's own loop (module docstring) over the intervals' ``forecasts``.

    Returns:
        (the steps, ``{"plans", "infeasible"}``: ILP plans made, intervals it could not plan).
    """
    from greenctl.executor.kinds import get_kind

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
    out = [_Step(running, "start", float(forecasts[0]))]
    for k in range(1, len(forecasts)):
        rate = float(forecasts[k])
        new = plan_at(rate, running)
        if isinstance(new, InfeasiblePlan):
            stats["infeasible"] += 1
            out.append(_Step(running, "infeasible", rate))
        elif _loaded_key(new.deployments) == _loaded_key(running.deployments):
            running = new  # the same instances, re-routed to the new quotas
            out.append(_Step(running, "keep", rate))
        else:
            lt = _load_time_s(running, new, variants, unmodeled)
            out.append(_Step(new, "change", rate, running, lt))
            running = new
    return out, stats


# -- the replay -------------------------------------------------------------------------------
@solvers.solve_memo()  # a replay solves the same few problems again and again
def replay(
    store: Any,
    *,
    load_trace: str | None = None,
    kind: str = "mix",
    request: dict[str, Any] | None = None,
    plan: int | str | None = None,
    region: str | None = None,
    carbon_trace: str | None = None,
    start: str | None = None,
    hours: float | None = None,
    every: str | float | int = 60,
    threshold: float = REPLAN_THRESHOLD,
    margin: float = REPLAN_MARGIN,
    min_dwell_s: float = REPLAN_MIN_DWELL_S,
    forecaster: str | None = None,
    baselines: Sequence[str] = DEFAULT_BASELINES,
    vpa_variant: str | Sequence[str] | None = None,
    vpa: VpaConfig | None = None,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    out_dir: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    kind_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay the control loop over a load trace and a carbon signal (module docstring).

    A glet or geo plan (``kind``, or the stored ``plan``'s) is replayed by
    :func:`greenctl.executor.control.replay_kinds.replay_kind` with the same options (a geo plan
    reads its load and carbon from its sites and demand files) and ``kind_options``, the
    kind's own; the default ``baselines`` stand for the kind's own defaults there.

    Args:
        load_trace: requests per second (:func:`greenctl.data.traces.read_rps_trace`).
        kind / request: the plan kind and its planning inputs (as ``plan mix`` parses them;
            without ``rate_rps`` the first interval's peak); or ``plan``: a stored plan's id.
        region / carbon_trace: the carbon signal (a stored region's, or a file's); neither:
            the request's ``carbon_intensity`` (else 400 g/kWh), constant.
        start: ``--from``: an offset into the traces (``36h``) or a time; hours: the length
            (default: the rest of the load trace). every: the interval (``60s``).
        threshold / margin / min_dwell_s: as ``replan``; forecaster: as ``replan`` (None:
            :data:`greenctl.planner.core.forecast.DEFAULT_FORECASTER`).
        baselines: of :data:`BASELINES`; vpa_variant: VPA's variant (default: the variant
            carrying most of the first plan's load); several: one VPA policy each
            (``vpa-<variant>``).
        out_dir: also write ``replay.json``, ``summary.csv``, ``intervals.csv`` and
            ``replay.png`` there (:func:`greenctl.data.replay_report.write_replay`).
        kind_options: a glet replay's ``model_traces``, ``gpu_power_w`` and
            ``carbon_intensity`` (:func:`greenctl.executor.control.replay_kinds.replay_glet`).

    Returns:
        ``{"meta", "summary": [per policy], "intervals": {policy: [rows]}}``.

    Raises:
        InputError: a bad option (named), a missing trace, a window beyond a trace.
    """
    from greenctl.executor.control import forecasters, replan, replay_kinds
    from greenctl.executor.kinds import get_kind
    from greenctl.planner.core import forecast as fc
    from greenctl.planner.core.simulator import pick_profiles, sized_slo_ms
    from greenctl.planner.mix.solve import REFERENCE_CARBON_INTENSITY

    forecaster = forecaster or fc.DEFAULT_FORECASTER
    other = replay_kinds.replayed_kind(store, kind=kind, plan=plan)
    if other is not None:  # glet, geo
        return replay_kinds.replay_kind(
            store, kind=other, load_trace=load_trace, request=request, plan=plan, region=region,
            carbon_trace=carbon_trace, start=start, hours=hours, every=every, threshold=threshold,
            margin=margin, min_dwell_s=min_dwell_s, forecaster=forecaster,
            baselines=None if tuple(baselines) == DEFAULT_BASELINES else baselines,
            wue_l_per_kwh=wue_l_per_kwh, ewif_l_per_kwh=ewif_l_per_kwh, out_dir=out_dir,
            progress=progress, options=kind_options,
        )  # fmt: skip
    if kind_options:
        raise InputError(f"a {kind} replay takes no option {sorted(kind_options)[0]!r}")
    if load_trace is None:
        raise InputError(f"a {kind} replay needs --load-trace FILE (requests per second)")
    t_wall = time.perf_counter()
    if out_dir is not None:
        from pathlib import Path

        where = Path(out_dir)
        if where.exists() and not where.is_dir():
            raise InputError(f"-o {out_dir} is a file", hint="name a folder (created if absent)")
    if threshold < 0 or margin < 0:
        raise InputError("--threshold and --margin must be >= 0")
    unknown = sorted(set(baselines) - set(BASELINES))
    if unknown:
        raise InputError(
            f"--baseline {unknown[0]!r} is unknown", hint=f"use one of {', '.join(BASELINES)}"
        )
    every_s = parse_every(every)
    if (request is None) == (plan is None):
        raise InputError("replay needs the kind's planning inputs or --plan ID, not both")
    cached = _ReadCache(store)
    if plan is not None:
        text = str(plan).strip()
        if not text.isdigit():
            raise InputError(f"--plan '{plan}' is not a plan id", hint="see `greenctl plan list`")
        first_plan: Plan | None = store.get_plan(int(text))
        assert first_plan is not None
        kind = first_plan.kind
        request = dict(first_plan.request)
    else:
        first_plan = None
        request = dict(request or {})
    pk = get_kind(kind)
    if kind not in REPLAYED or not pk.replannable or not pk.serves:
        raise InputError(
            f"replay supports {', '.join(REPLAYED + replay_kinds.KINDS)} plans; this is a "
            f"{kind} plan",
            hint="replay a mix, mig, glet or geo plan",
        )
    ci0 = float(request.get("carbon_intensity") or REFERENCE_CARBON_INTENSITY)
    win = _window(
        store,
        load_trace=load_trace,
        region=region,
        carbon_trace=carbon_trace,
        carbon_intensity=ci0,
        start=start,
        hours=hours,
        every_s=every_s,
    )
    n = win.intervals
    # forecasts: one-step-ahead per-interval peaks, each from the peaks before it
    peaks_all = fc.minute_maxima(win.rps[: win.first_s + win.seconds], interval_s=every_s)
    first_k = win.first_s // every_s  # intervals of history before the window
    f = forecasters.get_forecaster(store, forecaster)
    window_peaks = np.asarray([float(win.interval_rates(k).max()) for k in range(n)])
    if first_k >= 1 and win.first_s % every_s == 0:
        history = np.concatenate([peaks_all[:first_k], window_peaks])
        forecasts = np.asarray(f.predict_series(history, first_k), dtype=float)[:n]
        forecast_note = f"{forecaster} over per-{every_s}s peaks (history before --from used)"
    else:  # no history before the window: the first interval forecasts its own start
        forecasts = np.empty(n)
        forecasts[0] = float(win.interval_rates(0)[: min(60, every_s)].max())
        if n > 1:
            forecasts[1:] = np.asarray(f.predict_series(window_peaks, 1), dtype=float)[: n - 1]
        forecast_note = (
            f"{forecaster} over per-{every_s}s peaks (no history before the window: the first "
            "interval plans for its first minute's peak)"
        )
    forecasts = np.maximum(forecasts, 0.0)
    # the first plan
    notes: list[str] = []
    if first_plan is None:
        req = {**request, "carbon_intensity": float(win.carbon[0])}
        if req.get("rate_rps") is None and not req.get("families"):
            req["rate_rps"] = max(float(forecasts[0]), 1e-3)
        first_plan = pk.plan(cached, req)[0]  # type: ignore[misc]
    assert first_plan is not None
    label = (first_plan.extra.get("model") or {}).get("label")
    if label:  # e.g. "synthetic profiles", "mps-emulated profiles"
        notes.append(f"the plans rest on {label}")
    if kind == "mig":  # the SLA stays what the first plan met (replan would re-derive it)
        sla = first_plan.request.get("sla_ms") or first_plan.predicted.get("sla_ms")
        first_plan.request["sla_ms"] = request["sla_ms"] = sla
        notes.append(
            f"mig: SLA p95 {sla:.1f} ms held for every replan; a MIG layout change's own "
            "time (destroying and creating GPU instances) is not modeled"
        )
    family = first_plan.deployments[0].model
    all_variants = {v.name: v for v in cached.variants(family)}
    profiles = cached.latest_profiles(family=family)
    slo_probe = Plan(kind="mix", request=request, deployments=first_plan.deployments)
    slo = sized_slo_ms(slo_probe, all_variants, request.get("sla_ms"))
    slo_ms = next(iter(slo.values()), None) if slo else None
    if slo_ms is not None:
        slo = {v: slo_ms for v in all_variants}  # every variant sized at the family's SLO
    table = pick_profiles(profiles, slo)
    ev = _Evaluator(table, all_variants, slo_ms, lambda p: pk.dispatch_policy(p))
    pue = float(request.get("pue") or 1.0)
    unmodeled: set[str] = set()

    # -- greenctl: the replan loop --------------------------------------------------------------
    rounds = replan.ReplanRounds(min_dwell_s)
    stats = rounds.stats

    def greenctl_steps() -> list[_Step]:
        running = first_plan
        assert running is not None
        ref = float(running.request.get("carbon_intensity") or win.carbon[0])
        last_change: str | None = None
        out = [_Step(running, "start", float(forecasts[0]))]
        for k in range(1, n):
            if progress:
                progress(k, n)
            when = _iso_at(win.start_time, k * every_s)
            rate = float(forecasts[k])
            ci = float(win.carbon[k])
            action, new = rounds.decide(
                (_config_key(running.deployments), ci, ref, rate),
                partial(
                    replan.replan_choice, cached, running, signal=ci, reference=ref,
                    threshold=threshold, margin=margin, rate=max(rate, 1e-3),
                ),
                last_change=last_change, when=when,
            )  # fmt: skip
            if new is None:
                out.append(_Step(running, action, rate))
            else:
                lt = _load_time_s(running, new, all_variants, unmodeled)
                out.append(_Step(new, "change", rate, running, lt))
                running, ref, last_change = new, ci, when
        return out

    policies: dict[str, list[_Step]] = {"greenctl": greenctl_steps()}
    t_greenctl = time.perf_counter() - t_wall

    # -- baselines --------------------------------------------------------------------------------
    peak = float(window_peaks.max())
    statics = set(baselines) & {"base", "co2opt"}
    fam_request = _family_request(request) if statics and kind == "mix" else request
    for name, objective in (("base", "accuracy"), ("co2opt", "carbon")):
        if name not in baselines:
            continue
        if kind == "mig":  # Clover's own baselines, as `plan mig --baseline` makes them
            req = {**first_plan.request, "rate_rps": peak, "carbon_intensity": float(win.carbon[0])}
            try:
                p = get_kind("mig").plan(cached, req, baseline=name)[0]  # type: ignore[call-arg]
            except InfeasiblePlan as exc:
                notes.append(f"{name}: left out, it cannot carry the peak ({exc.message})")
                continue
        else:
            p, note = _static_plan(cached, kind, fam_request, rate=peak, objective=objective)
            if note:
                notes.append(f"{name}: {note}")
        policies[name] = [_Step(p, "start", peak)] + [_Step(p, "keep", peak) for _ in range(1, n)]
    if "infaas" in baselines:
        if kind != "mix":
            notes.append(f"infaas: it scales single-variant CPU/GPU plans; not a {kind} plan")
        else:
            policies["infaas"] = _infaas_steps(
                cached, kind, _family_request(request), window_peaks, forecasts, table,
                all_variants, unmodeled,
            )  # fmt: skip
    if "infadapter" in baselines:
        if kind != "mix":
            notes.append(f"infadapter: it sizes a variant mix; not a baseline of a {kind} plan")
        else:
            aligned = first_k >= 1 and win.first_s % every_s == 0
            ia_fc, ia_note = _infadapter_forecasts(
                cached, peaks_all[:first_k] if aligned else np.empty(0), window_peaks, every_s
            )
            notes.append(ia_note)
            if ia_fc is not None:
                policies["infadapter"], ia_stats = _infadapter_steps(
                    cached, kind, _family_request(request), ia_fc, all_variants, unmodeled
                )
                stats["infadapter_plans"] = ia_stats["plans"]
                if ia_stats["infeasible"]:
                    notes.append(
                        f"infadapter: {ia_stats['infeasible']} intervals could not be planned "
                        "for their forecast within the budgets: the running plan served"
                    )
    vpa_cfg = vpa or VpaConfig()
    pods: dict[str, _Vpa] = {}  # policy name -> its pod
    if "vpa" in baselines and kind != "mix":
        notes.append(f"vpa: it sizes one CPU pod; not a baseline of a {kind} plan")
    elif "vpa" in baselines:
        if isinstance(vpa_variant, str):
            wanted = [vpa_variant]
        elif vpa_variant:
            wanted = list(vpa_variant)
        else:
            main = max(first_plan.deployments, key=lambda d: (d.quota_rps or 0.0) * d.count)
            wanted = [main.variant]
        for vname in wanted:
            policy = "vpa" if len(wanted) == 1 else f"vpa-{vname}"
            pods[policy] = _vpa_pod(
                vname, family, table, all_variants, vpa_cfg, float(window_peaks[0]), unmodeled
            )
    # -- accounting ------------------------------------------------------------------------------
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in [*policies, *pods]}
    for k in range(n):
        rates = win.interval_rates(k)
        t_iso = _iso_at(win.start_time, k * every_s)
        ci = float(win.carbon[k])
        for name, steps in policies.items():
            rows[name].append(
                _account(ev, steps[k], rates, k, t_iso, k * every_s, ci, pue,
                         wue_l_per_kwh, ewif_l_per_kwh, name, float(window_peaks[k]))
            )  # fmt: skip
        t_s = k * every_s
        for name, pod in pods.items():
            evicted = k > 0 and pod.step(t_s)
            step = _Step(pod.plan(), "evict" if evicted else ("start" if k == 0 else "keep"))
            if evicted:
                step.reconfig_s, step.down = pod.load_time_s, True
            row = _account(ev, step, rates, k, t_iso, t_s, ci, pue, wue_l_per_kwh,
                           ewif_l_per_kwh, name, float(window_peaks[k]))  # fmt: skip
            rows[name].append(row)
            # usage the pod showed over the interval (capped at its request, as a limit does)
            pod.observe(min(row["_busy_mean"] * pod.cores, float(pod.cores)), t_s)
    for rs in rows.values():
        for r in rs:
            r.pop("_busy_mean", None)
    summary = [_summarise(name, rs) for name, rs in rows.items()]
    for s in summary:  # what every figure rests on, in the CSV too
        s["basis"] = "modeled" + (f" on {label}" if label else "")
    if unmodeled:
        notes.append(
            "reconfiguration time not modeled for "
            + ", ".join(sorted(unmodeled))
            + " (no load_time_s in the profiles): 0 s"
        )
    wall = time.perf_counter() - t_wall
    meta = {
        "kind": kind,
        "family": family,
        "load_trace": str(load_trace),
        "from_offset_s": win.first_s,
        "start": win.start_time,
        "hours": win.seconds / 3600,
        "every_s": every_s,
        "intervals": n,
        "carbon": win.carbon_source,
        "forecaster": forecaster,
        "forecast": forecast_note,
        "threshold": threshold,
        "margin": margin,
        "min_dwell_s": min_dwell_s,
        "slo_ms": slo_ms,
        "percentile": "p95" if kind == "mig" else request.get("percentile") or "p95",
        "units": units_name(first_plan.deployments),
        "first_plan": config_label(first_plan.deployments),
        "first_plan_id": first_plan.id,
        "baselines": list(baselines),
        "vpa": None
        if not pods
        else {"variants": {k: v.variant for k, v in pods.items()}, "rule": vpa_cfg.describe()},
        "peak_rps": peak,
        "replan": dict(stats),
        "wall_s": round(wall, 3),
        "wall_greenctl_loop_s": round(t_greenctl, 3),
        "evaluations": len(ev.memo),
        "solver": (solvers.active_memo() or solvers.SolveMemo()).stats(),
        "modeled": MODELED,
        # "synthetic profiles", "mps-emulated profiles": what the figures rest on (None: measured)
        "label": label or None,
        "water": None
        if wue_l_per_kwh is None and ewif_l_per_kwh is None
        else {"wue_l_per_kwh": wue_l_per_kwh, "ewif_l_per_kwh": ewif_l_per_kwh},
        "notes": notes
        + (
            []
            if wue_l_per_kwh is not None or ewif_l_per_kwh is not None
            else ["water not modeled: pass --wue/--ewif (L/kWh)"]
        ),
    }
    result: dict[str, Any] = {"meta": meta, "summary": summary, "intervals": rows}
    if out_dir is not None:
        from greenctl.data.replay_report import write_replay

        meta["files"] = write_replay(
            result,
            out_dir,
            interval_columns=list(INTERVAL_COLUMNS),
            summary_columns=list(SUMMARY_COLUMNS),
        )
    return result


def _account(
    ev: _Evaluator,
    step: _Step,
    rates: np.ndarray,
    k: int,
    t_iso: str,
    offset_s: float,
    ci: float,
    pue: float,
    wue: float | None,
    ewif: float | None,
    policy: str,
    peak: float,
) -> dict[str, Any]:
    """One interval of one policy: the seconds of its reconfiguration on what served before
    (or nothing, after an eviction), the rest on its plan."""
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
    water = None if wue is None and ewif is None else kwh * (pue * (ewif or 0.0) + (wue or 0.0))
    deps = step.plan.deployments if step.plan is not None else []
    return {
        "policy": policy,
        "interval": k,
        "time": t_iso,
        "offset_s": offset_s,
        "requests": requests,
        "peak_rps": peak,
        "forecast_rps": step.forecast_rps,
        "carbon_g_per_kwh": ci,
        "action": step.action,
        "config": config_label(deps),
        "units": _units(deps),
        "reconfig_s": float(split),
        "violations": tot.get("violations", 0.0),
        "violation_frac": tot.get("violations", 0.0) / requests if requests > 0 else 0.0,
        "accuracy": tot.get("acc", 0.0) / served if served > 0 else None,
        "energy_j": energy_j,
        "carbon_g": kwh * pue * ci,
        "water_l": water,
        "cost_usd": tot.get("cost_usd", 0.0),
        "_busy_mean": tot.get("busy", 0.0) / max(rates.size, 1),
    }


def _summarise(policy: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
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
