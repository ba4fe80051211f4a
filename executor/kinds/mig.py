"""The ``mig`` kind (Clover): MIG layouts and variants of one model under a carbon signal,
planned by :mod:`greenctl.planner.mig`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.limits import floor_request_rate
from greenctl.data.mig_geometry import resolve_gpu
from greenctl.data.plan import Plan
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
from greenctl.planner.mig.request import MigRequest


def _mig_plan(
    store: Store,
    request: dict[str, Any],
    *,
    current: Plan | None = None,
    baseline: str | None = None,
) -> Planned:
    """Plan ``request`` (a :class:`MigRequest` document); ``baseline`` emits that baseline
    instead (the request's own ``baseline`` is what its plan was, not what to plan)."""
    from greenctl.planner.mig import solve as mig

    typed = replace(MigRequest.from_dict(request), baseline=baseline)
    problem = mig.build_problem(
        resolve_gpu(typed.gpu),
        store.latest_profiles(family=typed.model),
        store.variants(typed.model),
        family=typed.model,
        gpus=typed.gpus,
        rate_rps=typed.rate_rps,
        carbon_intensity=typed.carbon_intensity,
        sla_ms=typed.sla_ms,
        lam=typed.lam,
        base_carbon_intensity=typed.base_carbon_intensity,
        max_accuracy_loss_pct=typed.max_accuracy_loss_pct,
        percentile=typed.percentile,
    )
    plan = mig.plan_mig(
        problem,
        solver=typed.solver,
        baseline=typed.baseline,
        current=current,
        time_limit_s=typed.time_limit_s,
        seed=typed.seed,
    )
    return plan, problem


def _mig_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """As :func:`replan_model_rate`, holding the intensity BASE is priced at: Clover's
    objective weighs a plan's carbon against BASE's, and BASE priced at the new signal
    itself cancels the signal out of the objective (the plan would follow the load alone).
    A plan made without ``base_carbon_intensity`` keeps the intensity it was planned at."""
    out = replan_model_rate(running, signal)
    out = replace(out, notes=[*out.notes, *floor_request_rate(out.request)])
    if out.request.get("base_carbon_intensity") is None:
        out.request["base_carbon_intensity"] = running.request.get("carbon_intensity")
    return out


def _mig_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running layouts' objective in ``problem`` (None when they miss the SLA)."""
    from greenctl.planner.mig import solve as mig

    model = mig.MigModel(problem)
    try:
        cfg = mig.config_from_gpus(model, running.extra.get("gpus") or [], source="running plan")
        ev = model.evaluate(cfg)
    except InputError as exc:
        return None, f"running layout not comparable: {exc.message}"
    if not ev.feasible:
        return None, "the running layout misses the SLA at the forecast load"
    return float(ev.objective), None


def _mig_objective(plan: Plan) -> Objective:
    # Clover's f = lambda*dCarbon + (1-lambda)*dAccuracy
    return "clover", finite_number(plan.predicted.get("objective")), True


#: the kind, as the registry holds it
KIND = PlanKind(
    "mig",
    replay="greenctl.executor.kinds.mig_replay:STEP",
    order=20,
    default_policy="wrr",  # the planner splits load by quota per instance class and predicts with wrr
    plan=_mig_plan,
    score=_mig_score,
    replan_request=_mig_replan_request,
    objective=_mig_objective,
    carbon_aware=lambda plan: True,
    request_type=MigRequest,
    plans_at_intensity=True,  # Clover: lambda * dCarbon + (1 - lambda) * dAccuracy
)
