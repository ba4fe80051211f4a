"""The replay step of an llm plan: greenctl's replanning over a load trace and a carbon
signal (a carbon-aware plan's tier shares follow it) beside three baselines sized for the
window's peak and kept: ``largest`` (every request on the highest-quality tier), ``smallest``
(on the lowest-quality tier meeting the SLOs) and ``static`` (a carbon plan's shares at
greenctl's own average quality: the same quality all day, which Quality Time's shifting is
measured against).

Each second is evaluated by the llm queueing model at its own rate (steady state): requests
over either SLO, quality, energy (idle watts plus each tier's energy above idle at its
operating point), carbon and cost, summed as the serving replays sum them. All modeled.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.plan import Plan
from greenctl.data.resources import hourly_cost
from greenctl.executor.kinds import llm
from greenctl.executor.kinds.base import get_kind
from greenctl.executor.kinds.replaying import (
    Footprint,
    PolicyStep,
    ReplayInputs,
    ReplayLoop,
    ReplayStep,
    Round,
    intervals,
)
from greenctl.executor.kinds.serving_replay import (
    INTERVAL_COLUMNS,
    SUMMARY_COLUMNS,
    Evaluator,
    account_all,
    config_key,
    config_label,
    first_plan,
    load_time_s,
    summarise,
    units_name,
)
from greenctl.planner.llm.model import TierCurve, concurrency, operating_point, slo_miss
from greenctl.planner.llm.request import LLMRequest
from greenctl.planner.llm.solve import LLMProblem, plan_llm

if TYPE_CHECKING:
    from greenctl.data.store import Store

BASELINES = ("largest", "smallest", "static")
MODELED = (
    "modeled: LLM profiles + the llm queueing model per second of the load trace (steady "
    "state each second); energy from the profiles' joules per token and idle watts"
)


@dataclass
class LLMEvaluator(Evaluator):
    """The serving replay's evaluator on the llm model: a plan of tiers at one rate."""

    problem: LLMProblem | None = None
    curves: dict[tuple[str, str], TierCurve] = field(default_factory=dict)

    def at(self, plan: Plan, rate: float) -> dict[str, Any]:
        key = (config_key(plan.deployments), tuple(d.quota_rps for d in plan.deployments), rate)
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._predict(plan, float(rate))
        return got

    def _predict(self, plan: Plan, rate: float) -> dict[str, Any]:
        assert self.problem is not None
        req = self.problem.request
        planned = sum(float(d.quota_rps or 0.0) for d in plan.deployments) or 1.0
        power = cost = quality = miss = busy = 0.0
        instances = 0
        for d in plan.deployments:
            curve = self.curves[(d.variant, d.resource)]
            r = float(d.quota_rps or 0.0) / planned * rate
            per = r / d.count if d.count else 0.0
            cost += d.count * hourly_cost(d.resource, curve.cost_per_hour)[0]
            power += d.count * curve.idle_w
            instances += d.count
            quality += curve.quality * r
            if per <= 0:
                continue
            miss += r * slo_miss(curve, per, req.ttft_ms, req.tpot_ms)
            busy += d.count * min(concurrency(curve, per) / curve.max_concurrency, 1.0)
            op = operating_point(curve, per, req.percentile)
            if op is not None and op.dynamic_j_per_request is not None:
                power += r * op.dynamic_j_per_request
            elif curve.points[-1].energy_j is not None:  # past the curve: its last point
                last = curve.points[-1]
                idle_share = curve.idle_w / last.requests_per_s if last.requests_per_s else 0.0
                power += r * max(float(last.energy_j or 0.0) - idle_share, 0.0)
        return {
            "served_rps": rate,
            "slo_violation_frac": miss / rate if rate > 0 else 0.0,
            "accuracy": quality / rate if rate > 0 else None,
            "power_w": power,
            "cost_per_hour": cost,
            "utilisation": busy / instances if instances else 0.0,
        }


def run(store: Store, inputs: ReplayInputs, loop: ReplayLoop) -> dict[str, Any]:
    """Replay an llm plan over ``--load-trace`` and the carbon signal beside the baselines."""
    opts = inputs.options
    if opts.load_trace is None:
        raise InputError("an llm replay needs --load-trace FILE (requests per second)")
    kind = get_kind(inputs.kind)
    request = dict(inputs.request)
    ci0 = LLMRequest.from_dict({**request, "rate_rps": request.get("rate_rps") or 1.0})
    win = loop.window(opts.load_trace, ci0.intensity)
    forecasts, peaks, forecast_note = loop.forecast(win.rps[: win.end_s], win)
    first = first_plan(store, kind, inputs, win, float(forecasts[0]))
    peak = float(peaks.max())
    problem = llm.build(store, {**first.request, "rate_rps": max(peak, 1e-3)})
    curves = {(c.variant, c.resource): c for c in problem.curves}
    ev = LLMEvaluator({}, {}, problem.request.ttft_ms, kind.dispatch_policy, problem=problem)
    ev.curves = curves
    variants = {v.name: v for v in store.variants(problem.request.model)}

    def round_of(running: Plan, k: int, reference: float) -> Round:
        rate, ci = float(forecasts[k]), float(win.carbon[k])
        key = (config_key(running.deployments), ci, reference, rate)
        return Round(key, {"signal": ci, "reference": reference, "rate": max(rate, 1e-3)}, rate)

    def load_time(old: Plan, new: Plan) -> float:
        return load_time_s(old, new, variants, loop.unmodeled)

    policies = {"greenctl": loop.greenctl(store, first, win, round_of, load_time)}
    fp = Footprint(float(request.get("pue") or 1.0), opts.wue_l_per_kwh, opts.ewif_l_per_kwh)
    at = intervals(win, peaks)
    rows = account_all(ev, win, at, policies, {}, fp)
    mean_quality = summarise("greenctl", rows["greenctl"])["accuracy"]
    for name in inputs.baselines:
        plan = _baseline(problem, name, mean_quality, loop.notes)
        if plan is not None:
            steps = [PolicyStep(plan, "start", peak)]
            steps += [PolicyStep(plan, "keep", peak) for _ in range(1, win.intervals)]
            rows.update(account_all(ev, win, at, {name: steps}, {}, fp))
    summary = [summarise(name, rs) for name, rs in rows.items()]
    for s in summary:
        s["basis"] = "modeled"
    meta = {
        "kind": inputs.kind,
        "family": problem.request.model,
        "load_trace": str(opts.load_trace),
        **loop.window_meta(win, forecast_note),
        # the TTFT SLO, as the serving tables show one SLO; the TPOT SLO beside it
        "slo_ms": problem.request.ttft_ms,
        "tpot_slo_ms": problem.request.tpot_ms,
        "percentile": f"{problem.request.percentile} TTFT (TPOT {problem.request.tpot_ms:g} ms; "
        "a request over either counts)",
        "units": units_name(first.deployments),
        "first_plan": config_label(first.deployments),
        "first_plan_id": first.id,
        "baselines": list(inputs.baselines),
        "peak_rps": peak,
        "evaluations": len(ev.memo),
        "modeled": MODELED,
        "label": None,
    }
    return loop.finish(meta, summary, rows, INTERVAL_COLUMNS, SUMMARY_COLUMNS)


def _baseline(
    problem: LLMProblem, name: str, mean_quality: float | None, notes: list[str]
) -> Plan | None:
    """A baseline's plan for the peak (``problem``'s rate); None and a note when it cannot
    carry it."""
    req = problem.request
    opts = problem.options
    if not opts:
        return None
    if name == "largest":
        top = max(o.quality for o in opts)
        chosen = replace(problem, options=[o for o in opts if o.quality == top])
        typed = replace(req, objective="carbon")
    elif name == "smallest":
        low = min(o.quality for o in opts)
        chosen = replace(problem, options=[o for o in opts if o.quality == low])
        typed = replace(req, objective="carbon")
    else:  # static: greenctl's average quality, shared as a carbon plan shares it
        floor = mean_quality if mean_quality is not None else req.min_quality
        typed = replace(req, objective="carbon", min_quality=floor)
        chosen = problem
    try:
        return plan_llm(replace(chosen, request=typed, notes=[]))
    except InfeasiblePlan as exc:
        notes.append(f"{name}: left out, it cannot carry the peak ({exc.message})")
        return None


#: the llm kind's replay step
STEP = ReplayStep(run=run, baselines=BASELINES, default_baselines=BASELINES)
