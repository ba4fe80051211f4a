"""The replay step of a mix plan: the shared serving replay with mix's own baselines.

The serving replay (:mod:`greenctl.executor.kinds.serving_replay`) evaluates and accounts
each second; mix's :data:`BASELINES` run on the same intervals and seconds: ``base`` (most
accurate variant sized for the peak), ``co2opt`` (least-carbon variant meeting the SLO),
``vpa`` (one pod sized by the Kubernetes VPA recommender, :class:`VpaConfig`), and when asked
``infaas`` (reactive greedy scaling, :data:`INFAAS_DOWN_AFTER`, :data:`INFAAS_LOW_WATER`),
``infadapter`` (InfAdapter's LSTM forecast and ILP, no carbon term; left out without
history) and ``msplus`` (InfAdapter's MS+: the same loop restricted to one variant at a
time, :func:`msplus_steps`). Each reconfiguration pays the new instances' load time.
Every figure is modeled (profiles, analytic queueing, profiled energy) and labelled so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError, NotFoundError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.resources import parse_resource
from greenctl.executor.kinds.base import get_kind
from greenctl.executor.kinds.replaying import Interval, PolicyStep, ReplayLoop, ReplayStep
from greenctl.executor.kinds.serving_replay import (
    DEFAULT_BASELINES,
    STATIC_BASELINES,
    Extras,
    Serving,
    ServingRun,
    config_key,
    load_time_s,
    replay_serving,
)
from greenctl.planner.core import forecast as fc
from greenctl.planner.core.evaluate import build_instances

if TYPE_CHECKING:
    from greenctl.data.store import Store

BASELINES = (*STATIC_BASELINES, "vpa", "infaas", "infadapter", "msplus")
#: INFaaS-style scaling: scale down after this many intervals under the low-water mark
INFAAS_DOWN_AFTER = 5
#: ... of the running configuration's capacity
INFAAS_LOW_WATER = 0.5
#: InfAdapter's loop: a saved forecaster of this name is its LSTM ...
INFADAPTER_FORECASTER = "lstm"
#: ... else InfAdapter's LSTM is fitted on the history before the window, for at least this
#: many optimizer steps (InfAdapter's 8 epochs over 14 days of minutes at batch 512: 320)
INFADAPTER_MIN_STEPS = 320


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


def static_plan(
    store: Store, kind_name: str, request: dict[str, Any], *, rate: float, objective: str
) -> tuple[Plan, str | None]:
    """One variant sized for ``rate`` (``strategy single``) for ``objective``; over the budget
    it is sized without the budget, which the note says."""
    req = {**request, "rate_rps": rate, "objective": objective, "strategy": "single"}
    try:
        return get_kind(kind_name).solve(store, req)[0], None
    except InfeasiblePlan:
        req.pop("budgets", None)
        plan = get_kind(kind_name).solve(store, req)[0]
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

    def decide(self, at: Interval) -> PolicyStep:
        """The updater's step at interval ``at``: an eviction restarts the pod at its new
        request, serving nothing for its load time."""
        evicted = at.k > 0 and self.step(at.offset_s)
        step = PolicyStep(self.plan(), "evict" if evicted else ("start" if at.k == 0 else "keep"))
        if evicted:
            step.reconfig_s, step.down = self.load_time_s, True
        return step

    def learn(self, row: dict[str, Any], at: Interval) -> None:
        """The usage the pod showed over interval ``at`` (capped at its request, as a limit
        does)."""
        self.observe(min(row["_busy_mean"] * self.cores, float(self.cores)), at.offset_s)


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
        which LSTM forecast them, or why there is none to use).
    """
    try:
        f = loop.forecaster(INFADAPTER_FORECASTER)
    except NotFoundError:
        f = None
    if f is not None and not isinstance(f, fc.LSTMForecaster):
        return None, f"the saved forecaster '{INFADAPTER_FORECASTER}' is no LSTM"
    if f is not None:
        how = f"the saved forecaster '{INFADAPTER_FORECASTER}'"
    else:
        lstm = fc.make_forecaster("lstm", min_steps=INFADAPTER_MIN_STEPS)
        assert isinstance(lstm, fc.LSTMForecaster)
        if history.size <= lstm.window + 1:
            return None, (
                f"InfAdapter's LSTM needs more than {lstm.window + 1} "
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
    return pred, f"forecasts by {how}, rounded up to whole req/s"


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
    *,
    strategy: str = "ilp",
) -> tuple[list[PolicyStep], dict[str, int]]:
    """InfAdapter's own loop (module docstring) over the intervals' ``forecasts``; with
    ``strategy="single"`` its MS+ (:func:`msplus_steps`).

    An interval it cannot plan for keeps the running plan (``ilp``); MS+ (``single``) plans
    it at its ceiling instead: the most whole req/s one variant carries within the budgets.

    Returns:
        (the steps, ``{"plans", "infeasible"}``: plans made, intervals it could not plan).
    """
    pk = get_kind(kind)
    base = {k: v for k, v in request.items() if k != "current"}
    base.update(objective="balanced", gamma=0.0, strategy=strategy)
    # the plan depends on the forecast and on which variants are loaded (InfAdapter's
    # loading term): one plan per pair, as the same inputs give the same plan
    memo: dict[tuple[float, frozenset[str]], Plan | InfeasiblePlan] = {}
    stats = {"plans": 0, "infeasible": 0}
    ceiling: list[float] = []  # found once: feasibility does not depend on what runs

    def solve_at(rate: float, running: Plan | None) -> Plan | InfeasiblePlan:
        loaded = frozenset(d.variant for d in running.deployments) if running else frozenset()
        key = (max(float(rate), 1.0), loaded)
        if key not in memo:
            stats["plans"] += 1
            try:
                memo[key] = pk.solve(store, {**base, "rate_rps": key[0]}, current=running)[0]
            except InfeasiblePlan as exc:
                memo[key] = exc
        return memo[key]

    def plan_at(rate: float, running: Plan | None) -> Plan | InfeasiblePlan:
        got = solve_at(rate, running)
        if isinstance(got, InfeasiblePlan) and strategy == "single":
            if not ceiling:
                top = highest_feasible(lambda r: solve_at(r, None), max(rate, 1.0), got)
                ceiling.append(top)
            if max(rate, 1.0) > ceiling[0]:
                return solve_at(ceiling[0], running)
        return got

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
    if ceiling:  # the intervals MS+ served at its ceiling
        stats["infeasible"] = int(np.sum(np.maximum(forecasts, 1.0) > ceiling[0]))
    return out, stats


def highest_feasible(
    plan_at: Callable[[float], Plan | InfeasiblePlan], above: float, refusal: InfeasiblePlan
) -> float:
    """The most whole req/s below ``above`` that ``plan_at`` can plan (feasibility falls with
    the rate), by bisection; ``refusal`` is raised when not even 1 req/s can be planned."""
    lo, hi = 1, max(math.ceil(above) - 1, 1)
    if isinstance(plan_at(lo), InfeasiblePlan):
        raise refusal
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if isinstance(plan_at(mid), InfeasiblePlan):
            hi = mid - 1
        else:
            lo = mid
    return float(lo)


def msplus_steps(run: ServingRun, forecasts: np.ndarray) -> tuple[list[PolicyStep], dict[str, int]]:
    """InfAdapter's MS+ baseline: model switching plus autoscaling, one variant at a time.

    As InfAdapter's code runs it (its adapter with the MS+ solver): every interval, for the
    same forecast, the one-variant plan (``strategy single``: one variant, its replicas sized
    to the load within the budgets) that maximises InfAdapter's objective (accuracy - alpha x
    cost - beta x loading, no carbon term), the running variant counting as loaded. Above
    what one variant carries within the budgets it serves at that ceiling.
    """
    inputs, served = run.inputs, run.served
    return infadapter_steps(
        run.store, inputs.kind, family_request(inputs.request), forecasts, served.variants,
        run.loop.unmodeled, strategy="single",
    )  # fmt: skip


#: the objective each static baseline of a mix plan is planned for
STATIC_OBJECTIVES = {"base": "accuracy", "co2opt": "carbon"}


def mix_static(run: ServingRun, name: str) -> Plan:
    """A mix plan's static baseline: one variant sized for the peak for its objective."""
    plan, note = static_plan(
        run.store,
        run.inputs.kind,
        family_request(run.request),
        rate=run.peak,
        objective=STATIC_OBJECTIVES[name],
    )
    if note:
        run.loop.notes.append(f"{name}: {note}")
    return plan


def adapter_forecasts(run: ServingRun) -> tuple[np.ndarray | None, str]:
    """InfAdapter's LSTM forecasts of the window's intervals (:func:`infadapter_forecasts`)
    from the trace before it, when the window starts on an interval boundary."""
    win = run.window
    first_k = win.first_s // win.every_s
    aligned = first_k >= 1 and win.first_s % win.every_s == 0
    history = fc.minute_maxima(win.rps[: win.end_s], interval_s=win.every_s)[:first_k]
    return infadapter_forecasts(
        run.loop, history if aligned else np.empty(0), run.peaks, win.every_s
    )


def scaling_baselines(run: ServingRun) -> dict[str, list[PolicyStep]]:
    """The ``infaas``, ``infadapter`` and ``msplus`` policies asked for; MS+ plans for
    InfAdapter's forecasts, or greenctl's (rounded up) where there is no LSTM to use."""
    store, inputs, loop, served = run.store, run.inputs, run.loop, run.served
    asked = set(inputs.baselines)
    out: dict[str, list[PolicyStep]] = {}
    if "infaas" in asked:
        out["infaas"] = infaas_steps(
            store, inputs.kind, family_request(inputs.request), run.peaks, run.forecasts,
            served.table, served.variants, loop.unmodeled,
        )  # fmt: skip
    if not asked & {"infadapter", "msplus"}:
        return out
    ia_fc, how = adapter_forecasts(run)
    if "infadapter" in asked:
        loop.notes.append(
            f"infadapter: {how}" if ia_fc is not None else f"infadapter: left out, {how}"
        )
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
    if "msplus" in asked:
        if ia_fc is not None:
            ms_fc, note = ia_fc, f"msplus: one variant at a time, {how}"
        else:
            ms_fc = np.ceil(np.maximum(run.forecasts, 0.0) - 1e-9)
            note = f"msplus: one variant at a time, for greenctl's forecasts rounded up ({how})"
        loop.notes.append(note)
        out["msplus"], ms_stats = msplus_steps(run, ms_fc)
        loop.stats["msplus_plans"] = ms_stats["plans"]
        if ms_stats["infeasible"]:
            loop.notes.append(
                f"msplus: {ms_stats['infeasible']} intervals forecast more than one variant "
                "carries within the budgets: it served at that ceiling"
            )
    return out


def vpa_pods(run: ServingRun, cfg: VpaConfig) -> dict[str, Vpa]:
    """VPA's pods by policy name (``vpa``, or ``vpa-<variant>`` for several variants), each
    starting at the size that carries the first interval's peak."""
    if "vpa" not in run.inputs.baselines:
        return {}
    given = run.inputs.options.kind_options.get("vpa_variant")
    if isinstance(given, str):
        wanted = [given]
    elif given:
        wanted = list(given)
    else:
        main = max(run.first.deployments, key=lambda d: (d.quota_rps or 0.0) * d.count)
        wanted = [main.variant]
    served, first_rate = run.served, float(run.peaks[0])
    return {
        ("vpa" if len(wanted) == 1 else f"vpa-{name}"): vpa_pod(
            name, served.family, served.table, served.variants, cfg, first_rate, run.loop.unmodeled
        )
        for name in wanted
    }


def mix_extras(run: ServingRun) -> Extras:
    """Mix's own baselines beside the static ones: INFaaS and InfAdapter planned ahead, VPA's
    pods deciding as they go."""
    policies = scaling_baselines(run)
    cfg = run.inputs.options.kind_options.get("vpa") or VpaConfig()
    pods = vpa_pods(run, cfg)
    rule = {"variants": {k: v.variant for k, v in pods.items()}, "rule": cfg.describe()}
    return Extras(policies, pods, {"vpa": rule if pods else None})


#: mix's replay step
MIX = Serving(
    hold=lambda plan, request, notes: None,
    static=mix_static,
    percentile=lambda request: str(request.get("percentile") or "p95"),
    extras=mix_extras,
)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, MIX),
    baselines=BASELINES,
    default_baselines=DEFAULT_BASELINES,
    options=("vpa_variant", "vpa"),
)
