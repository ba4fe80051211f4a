"""The ``llm`` kind (Quality Time, in tokens): quality tiers of one LLM family served on a
budget of cores or GPUs, instances per tier and each tier's share of requests under TTFT and
TPOT SLOs, planned by :mod:`greenctl.planner.llm` on the store's LLM profiles."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from greenctl.data.emissions import plan_carbon
from greenctl.data.errors import InputError
from greenctl.data.limits import SLO_QUANTILES, floor_request_rate
from greenctl.data.llm_profiles import latest_llm_profiles, llm_families
from greenctl.data.plan import Plan
from greenctl.data.resources import hourly_cost
from greenctl.data.store import Store
from greenctl.executor.kinds.base import (
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    finite_number,
    replan_model_rate,
)
from greenctl.planner.llm import solve as llm
from greenctl.planner.llm.model import operating_point
from greenctl.planner.llm.request import REFERENCE_CARBON_INTENSITY, LLMRequest

if TYPE_CHECKING:
    import numpy as np
    from greenctl.planner.llm.sim import SimTier

#: requests a prediction simulates when no duration is given
SIM_REQUESTS = 20_000


def build(store: Store, request: dict[str, Any]) -> llm.LLMProblem:
    """The problem of an llm request: its family's variants and newest LLM profiles.

    Raises:
        InputError: a bad request (field named), or a family without LLM profiles (the known
            ones named). InfeasiblePlan: none profiled on the budget's resources.
    """
    typed = LLMRequest.from_dict(request)
    profiles = latest_llm_profiles(store, family=typed.model)
    if not profiles:
        known = llm_families(store)
        raise InputError(
            f"no LLM profiles of family {typed.model!r}",
            hint=f"known LLM families: {', '.join(known)}"
            if known
            else f"profile its tiers first: `greenctl profile llm --family {typed.model} ...`",
        )
    return llm.build_problem(typed, store.variants(typed.model), profiles)


def _plan(store: Store, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    problem = build(store, request)
    return llm.plan_llm(problem), problem


def running_allocation(
    problem: llm.LLMProblem, running: Plan
) -> tuple[llm.Allocation | None, str | None]:
    """The running plan's instances in ``problem``'s options, its shares scaled to the new
    rate; None (and why) when an option it runs is gone or an instance cannot carry its part."""
    rate = problem.request.rate_rps
    planned = sum(float(d.quota_rps or 0.0) for d in running.deployments) or 1.0
    index = {(o.variant, o.curve.resource): i for i, o in enumerate(problem.options)}
    counts = [0] * len(problem.options)
    rates = [0.0] * len(problem.options)
    for d in running.deployments:
        i = index.get((d.variant, d.resource))
        if i is None:
            return None, f"running {d.variant}@{d.resource} no longer meets the SLOs or budget"
        counts[i] += d.count
        rates[i] += float(d.quota_rps or 0.0) / planned * rate
    for i, o in enumerate(problem.options):
        if rates[i] > counts[i] * o.capacity_rps * (1 + 1e-6):
            return None, (
                f"running {o.variant}@{o.curve.resource} x{counts[i]} cannot carry "
                f"{rates[i]:.2f} req/s of the forecast load"
            )
    return llm.Allocation(tuple(counts), tuple(rates)), None


def _score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running plan's objective in ``problem`` (its shares at the new load and carbon)."""
    alloc, why = running_allocation(problem, running)
    if alloc is None:
        return None, why
    value = llm.evaluate(problem, alloc)["predicted"]["objective"]
    return finite_number(value), None if value is not None else "no energy figures"


def _objective(plan: Plan) -> Objective:
    name = str(plan.predicted.get("objective_name") or "")
    return name, finite_number(plan.predicted.get("objective")), name == "balanced"


def _carbon_aware(plan: Plan) -> bool:
    """``carbon``, and ``balanced`` with its carbon term (``gamma`` > 0)."""
    name = str(plan.predicted.get("objective_name") or plan.request.get("objective") or "")
    gamma = finite_number(plan.request.get("gamma"))
    return name == "carbon" or (name == "balanced" and (gamma is None or gamma > 0))


def _replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """The request at the new carbon intensity, its rate the forecast of the family's load:
    a carbon or balanced plan's shares follow the signal when planned again."""
    out = replan_model_rate(running, signal)
    return replace(out, notes=[*out.notes, *floor_request_rate(out.request)])


def predict(
    store: Store, plan: Plan, *, policy: str | None = None, **options: Any
) -> dict[str, Any]:
    """What an llm plan does under a load (``rate_rps``, or a per-second ``trace`` times
    ``trace_scale``; default the planned rate): the simulator of :mod:`greenctl.planner.llm.sim`
    on its tiers' profiled curves (``analytic``: the queueing model alone), with energy,
    carbon and cost by the planner's accounting at the tiers' operating points."""
    import numpy as np  # numpy: not at start-up, where the kinds are loaded
    from greenctl.planner.llm.sim import SimTier, simulate

    problem = build(store, plan.request)
    req = problem.request
    curves = {(c.variant, c.resource): c for c in problem.curves}
    planned = sum(float(d.quota_rps or 0.0) for d in plan.deployments) or req.rate_rps
    rng = np.random.default_rng(int(options.get("seed") or 0))
    arrivals = _trace_arrivals(options, rng)
    rate = finite_number(options.get("rate_rps"))
    if arrivals is not None:
        span = float(len(options["trace"]))
        rate = len(arrivals) / span if span > 0 else planned
    rate = rate or planned
    tiers: list[SimTier] = []
    power = cost = quality = 0.0
    energy_known, trusted = True, True
    worst_ttft = worst_tpot = 0.0
    for d in plan.deployments:
        curve = curves.get((d.variant, d.resource))
        if curve is None:
            raise InputError(
                f"the store has no LLM profile of {d.variant} on {d.resource}",
                hint="profile it with `greenctl profile llm`, or plan again",
            )
        r = float(d.quota_rps or 0.0) / planned * rate
        tiers.append(SimTier(curve, d.count, r))
        quality += curve.quality * r / rate
        cost += d.count * hourly_cost(d.resource, curve.cost_per_hour)[0]
        power += d.count * curve.idle_w
        if r <= 0 or d.count <= 0:
            continue
        op = operating_point(curve, r / d.count, req.percentile)
        if op is None:  # beyond the profiled concurrency
            trusted = energy_known = False
            continue
        worst_ttft, worst_tpot = max(worst_ttft, op.ttft_ms), max(worst_tpot, op.tpot_ms)
        if op.dynamic_j_per_request is None:
            energy_known = False
        else:
            power += r * op.dynamic_j_per_request
    intensity, pue = plan_carbon(plan)
    ci = finite_number(options.get("carbon_g_per_kwh"))
    ci = ci if ci is not None else (intensity if intensity is not None else req.intensity)
    pue = finite_number(options.get("pue")) or pue
    j_req = power / rate if energy_known else None
    pct = req.percentile
    out: dict[str, Any] = {"rate_rps": rate, "accuracy": quality, "quality": quality}
    if options.get("analytic"):
        out.update({f"ttft_{pct}_ms": worst_ttft, f"tpot_{pct}_ms": worst_tpot})
        out["overloaded"] = not trusted
    else:
        n = options.get("n_requests") or SIM_REQUESTS
        duration = finite_number(options.get("duration_s")) or float(n) / rate
        sim = simulate(
            tiers,
            pct,
            duration_s=duration,
            seed=int(options.get("seed") or 0),
            arrivals=arrivals,
            slo_ms=(req.ttft_ms, req.tpot_ms),
        )
        out.update(
            {
                "served_rps": rate * (1 - sim.beyond),
                f"ttft_{pct}_ms": sim.ttft_ms,
                f"tpot_{pct}_ms": sim.tpot_ms,
                **{f"{p}_ms": v for p, v in sim.latency_ms.items()},
                "slo_violation_frac": sim.slo_violation_frac,
                "overloaded": sim.beyond > 1 - SLO_QUANTILES[pct],
                "requests": sim.requests,
            }
        )
    out.update(
        {
            "power_w": power if energy_known else None,
            "energy_j_per_request": j_req,
            "carbon_g_per_request": None if j_req is None else j_req * pue * ci / 3.6e6,
            "cost_per_hour": cost,
            "energy_method": plan.predicted.get("energy_method", "modeled"),
            "latency_includes": "the profiled engine (TTFT + (M-1) TPOT); no dispatcher path",
        }
    )
    return out


def _trace_arrivals(options: dict[str, Any], rng: np.random.Generator) -> np.ndarray | None:
    """Arrival times (s) of a per-second rate trace (times its scale): Poisson in each second."""
    import numpy as np

    trace = options.get("trace")
    if trace is None or not len(trace):
        return None
    scale = float(options.get("trace_scale") or 1.0)
    rates = np.asarray(trace, dtype=float) * scale
    counts = rng.poisson(np.maximum(rates, 0.0))
    starts = np.repeat(np.arange(len(rates), dtype=float), counts)
    return np.sort(starts + rng.random(len(starts)))


#: the kind, as the registry holds it
KIND = PlanKind(
    "llm",
    replay="greenctl.executor.kinds.llm_replay:STEP",
    order=50,
    default_policy="wrr",  # requests follow the tiers' shares
    plan=_plan,
    score=_score,
    replan_request=_replan_request,
    objective=_objective,
    carbon_aware=_carbon_aware,
    request_type=LLMRequest,
    plans_at_intensity=True,
    reference_intensity=lambda request: float(
        request.get("reference_carbon_intensity") or REFERENCE_CARBON_INTENSITY
    ),
    predict=predict,
    local_engines=True,  # its planner names every tier's engine (llm_plan.engine_tiers)
)
