"""The ``mig`` kind (Clover): MIG layouts and variants of one model under a carbon signal,
planned by :mod:`greenctl.planner.mig`."""

from __future__ import annotations

from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import (
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    finite_number,
    replan_model_rate,
)


def _mig_plan(
    store: Any,
    request: dict[str, Any],
    *,
    current: Plan | None = None,
    baseline: str | None = None,
) -> Planned:
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.mig import solve as mig

    try:
        geo = resolve_gpu(str(request["gpu"]))
        family = str(request["model"])
        gpus = int(request["gpus"])
        rate = float(request["rate_rps"])
        intensity = float(request["carbon_intensity"])
    except (KeyError, TypeError, ValueError):
        raise InputError(
            "a MIG plan's request needs gpu, gpus, model, rate_rps and carbon_intensity",
            hint="replan MIG plans made by `greenctl plan mig`",
        ) from None
    problem = mig.build_problem(
        geo,
        store.latest_profiles(family=family),
        store.variants(family),
        family=family,
        gpus=gpus,
        rate_rps=rate,
        carbon_intensity=intensity,
        sla_ms=request.get("sla_ms"),
        lam=float(request.get("lambda", 0.5)),
        base_carbon_intensity=request.get("base_carbon_intensity"),
        max_accuracy_loss_pct=request.get("max_accuracy_loss_pct"),
        percentile=float(request.get("percentile") or 0.95),
    )
    plan = mig.plan_mig(
        problem,
        solver=str(request.get("solver") or "exact"),
        baseline=baseline,
        current=current,
        time_limit_s=request.get("time_limit_s"),
        seed=request.get("seed"),
    )
    return plan, problem


def _mig_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """As :func:`replan_model_rate`, holding the intensity BASE is priced at: Clover's
    objective weighs a plan's carbon against BASE's, and BASE priced at the new signal
    itself cancels the signal out of the objective (the plan would follow the load alone).
    A plan made without ``base_carbon_intensity`` keeps the intensity it was planned at."""
    out = replan_model_rate(running, signal)
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
    order=20,
    default_policy="wrr",  # the planner splits load by quota per instance class and predicts with wrr
    plan=_mig_plan,
    score=_mig_score,
    replan_request=_mig_replan_request,
    objective=_mig_objective,
    carbon_aware=lambda plan: True,  # Clover: lambda * dCarbon + (1 - lambda) * dAccuracy
)
