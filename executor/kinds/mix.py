"""The ``mix`` kind (InfAdapter / INFaaS): families served by a mix of variants on a budget,
planned by :mod:`greenctl.planner.mix`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from greenctl.data.limits import floor_rates, floor_request_rate
from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.executor.kinds.base import (
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    base_request,
    finite_number,
    forecast_rates,
    replan_model_rate,
    serving_paths,
)
from greenctl.planner.mix import solve as mix
from greenctl.planner.mix.model import REFERENCE_CARBON_INTENSITY
from greenctl.planner.mix.request import MixRequest


def _mix_plan(store: Store, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    request = dict(request)
    if current is not None:
        request["current"] = [d.to_dict() for d in current.deployments]
    typed = MixRequest.from_dict(request)
    names = [f.model for f in typed.families]
    for name in names:
        store.require_family(name)  # the store knows every family: name them and a close one
    variants = [v for f in names for v in store.variants(f)]
    profiles = [p for f in names for p in store.latest_profiles(family=f)]
    serving = serving_paths(store, {f.model: f.rate_rps for f in typed.families})
    problem = mix.build_mix_problem(typed, variants, profiles, serving=serving)
    plan = mix.plan_mix(
        problem, strategy=typed.strategy, solver=typed.solver, time_limit_s=typed.time_limit_s
    )
    return plan, problem


def _mix_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running plan's objective in ``problem`` (its quotas scaled to the new load)."""
    alloc: dict[int, dict[int, tuple[int, float]]] = {}
    for fi, fam in enumerate(problem.families):
        deps = [d for d in running.deployments if d.model == fam.name]
        old_quota = sum(float(d.quota_rps or 0.0) for d in deps) or 1.0
        load = fam.load_rps(problem.headroom)
        for d in deps:
            idx = next(
                (
                    i
                    for i, o in enumerate(fam.options)
                    if (o.variant, o.resource, o.batch) == (d.variant, d.resource, d.batch)
                ),
                None,
            )
            if idx is None:
                return None, f"running option {d.variant}@{d.resource} is no longer eligible"
            q = float(d.quota_rps or 0.0) / old_quota * load
            if q > fam.options[idx].capacity_rps * d.count * (1 + 1e-6):
                return None, (
                    f"running {d.variant}@{d.resource} x{d.count} cannot carry "
                    f"{q:.1f} req/s of the forecast load"
                )
            prev_n, prev_q = alloc.setdefault(fi, {}).get(idx, (0, 0.0))
            alloc[fi][idx] = (prev_n + d.count, prev_q + q)
    return float(mix.evaluate_allocation(problem, alloc)["objective"]), None


def _mix_objective(plan: Plan) -> Objective:
    name = str(plan.predicted.get("objective_name") or "")
    value = finite_number(plan.predicted.get("objective"))
    return name, value, mix.is_maximise(name or "balanced")


def _mix_carbon_aware(plan: Plan) -> bool:
    """``carbon``, and ``balanced`` with its carbon term (``gamma`` > 0, the default)."""
    name = str(plan.predicted.get("objective_name") or plan.request.get("objective") or "")
    if name == "carbon":
        return True
    gamma = plan.request.get("gamma")
    return name in ("balanced", "") and (
        finite_number(gamma) is None or (finite_number(gamma) or 0.0) > 0
    )


def _mix_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """A mix request at the new signal: one family's (``model`` or one of ``families``) rate
    is the forecast of its load; several families each take their own."""
    fams = running.request.get("families")
    if not isinstance(fams, list) or not fams:
        out = replan_model_rate(running, signal)
        return replace(out, notes=[*out.notes, *floor_request_rate(out.request)])
    request = base_request(running)
    request["carbon_intensity"] = signal.carbon_intensity
    planned = {
        str(f.get("model")): finite_number(f.get("rate_rps")) or 0.0
        for f in fams
        if isinstance(f, dict)
    }
    new, forecast, notes = forecast_rates(planned, signal)
    new, floored = floor_rates(new)
    notes = [*notes, *floored]
    request["families"] = [
        {**f, "rate_rps": new[str(f.get("model"))]}
        if isinstance(f, dict) and str(f.get("model")) in new
        else f
        for f in fams
    ]
    return ReplanRequest(request, forecast, notes)


#: the kind, as the registry holds it
KIND = PlanKind(
    "mix",
    replay="greenctl.executor.kinds.mix_replay:STEP",
    order=10,
    default_policy="wrr",  # requests follow the quotas (InfAdapter)
    plan=_mix_plan,
    score=_mix_score,
    replan_request=_mix_replan_request,
    objective=_mix_objective,
    carbon_aware=_mix_carbon_aware,
    request_type=MixRequest,
    plans_at_intensity=True,
    reference_intensity=lambda request: float(
        request.get("reference_carbon_intensity") or REFERENCE_CARBON_INTENSITY
    ),
)
