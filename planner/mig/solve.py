"""``plan mig``: carbon-aware MIG layouts with mixed-quality variants (Clover, SC'23).

``N`` GPUs, each cut into MIG instances (a *layout*) hosting one variant of a family each,
serve a Poisson rate under a p95 SLA, maximising ``lambda * dCarbon + (1 - lambda) *
dAccuracy`` against BASE (the most accurate variant on every whole GPU), solved exactly.
Only counts per slice multiset and per (variant, profile) matter, so the problem's size
does not depend on ``N`` (:mod:`greenctl.planner.mig.exact`); :func:`assign_gpus` rebuilds
placement. Solvers share one serving model (quota dispatch to M/G/1 queues, the SLA as each
instance's capacity), the winner checked by the mixture p95 and the simulator. Energy counts
whole GPUs' idle power (:func:`~greenctl.planner.core.evaluate.spare_idle_w`).
"""

from __future__ import annotations

import time
from typing import Any

from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import estimate_label

# The problem and the serving model live in mig_problem / mig_model, which the solvers
# import too (so none of them imports this module); re-exported here for callers.
from greenctl.planner.mig.model import (
    FIFO_MAX_INSTANCES,
    Config,
    Evaluation,
    MigModel,
    SolveResult,
    assign_gpus,
    config_from_gpus,
    describe_config,
    fifo_p95,
    instance_capacity,
    tidy,
)
from greenctl.planner.mig.problem import (
    CAPACITY_TOL,
    J_PER_KWH,
    MigProblem,
    SliceOption,
    build_problem,
)
from greenctl.planner.mig.request import (
    BASELINES,
    SOLVERS,
    MigRequest,
    check_solver_options,
)

__all__ = [
    "BASELINES",
    "CAPACITY_TOL",
    "FIFO_MAX_INSTANCES",
    "J_PER_KWH",
    "SOLVERS",
    "Config",
    "Evaluation",
    "MigModel",
    "MigProblem",
    "MigRequest",
    "SliceOption",
    "SolveResult",
    "assign_gpus",
    "build_problem",
    "config_from_gpus",
    "describe_config",
    "fifo_p95",
    "instance_capacity",
    "plan_mig",
    "tidy",
]


def _predicted(model: MigModel, ev: Evaluation) -> dict[str, Any]:
    methods = sorted({model.pairs[k].energy_method for k, c in enumerate(ev.config.n) if c})
    sources = sorted({model.pairs[k].source for k, c in enumerate(ev.config.n) if c})
    return {
        "rate_rps": model.problem.rate_rps,
        "sla_ms": model.sla_ms,
        "p95_ms": ev.p95_ms,
        "sla_met": bool(ev.feasible and ev.p95_ms <= model.sla_ms * (1 + CAPACITY_TOL)),
        "capacity_rps": ev.capacity_rps,
        "accuracy": ev.accuracy,
        "energy_j_per_request": ev.energy_j_per_request,
        "carbon_g_per_request": ev.carbon_g_per_request,
        "power_w": ev.power_w,
        "delta_carbon_pct": ev.delta_carbon_pct,
        "delta_accuracy_pct": ev.delta_accuracy_pct,
        "objective": ev.objective,
        "instances": sum(ev.config.n),
        "p95_fifo_ms": fifo_p95(model, ev.config),
        "energy_method": ",".join(methods),
        "source": ",".join(sources),
    }


def plan_mig(
    problem: MigProblem,
    *,
    solver: str = "exact",
    baseline: str | None = None,
    current: Plan | None = None,
    time_limit_s: float | None = None,
    seed: int | None = None,
    verify: bool = True,
    require_feasible: bool = True,
) -> Plan:
    """Plan MIG layouts and variants for one GPU model and one family.

    ``solver``: ``exact`` (ILP), ``anneal`` (Clover's graph annealing, seeded by ``seed``) or
    ``random``; ``baseline`` (``base`` or ``co2opt``) emits that baseline instead. ``current``,
    a previous MIG plan, warm-starts ``anneal`` and keeps GPUs' layouts still wanted. ``verify``
    checks the winner with the per-instance p95 and the simulator, tightening the capacity SLA
    and re-solving if they disagree (exact only).

    Raises:
        InputError: bad options.
        InfeasiblePlan: nothing meets the SLA (and floor), with ``require_feasible``.
    """
    check_solver_options(solver, baseline, time_limit_s)
    t0 = time.perf_counter()
    model = MigModel(problem)
    baselines, co2_cfg, co2_desc = _baselines(model)
    current_gpus = _current_gpus(current)
    info: dict[str, Any]
    if baseline == "base":
        config: Config | None = model.base_config
        info = {"name": "baseline:base"}
    elif baseline == "co2opt":
        if co2_cfg is None:
            raise InfeasiblePlan(f"CO2OPT: {co2_desc}", hint="relax --sla-ms or add GPUs")
        config, info = co2_cfg, {"name": "baseline:co2opt"}
    else:
        config, info, model = _solve(
            problem,
            model,
            solver,
            current_gpus,
            time_limit_s=time_limit_s,
            seed=seed,
            verify=verify,
        )
    if config is None or (require_feasible and not model.evaluate(config).feasible):
        raise _infeasible(problem, model, solver, info)
    info["wall_s"] = time.perf_counter() - t0
    info["evaluations"] = model.evaluations
    request = MigRequest(
        gpu=problem.geo.name,
        gpus=problem.gpus,
        model=problem.family,
        rate_rps=problem.rate_rps,
        carbon_intensity=problem.carbon_intensity,
        sla_ms=problem.sla_ms,
        percentile=problem.percentile,
        lam=problem.lam,
        base_carbon_intensity=problem.base_carbon_intensity,
        max_accuracy_loss_pct=problem.max_accuracy_loss_pct,
        solver=solver,
        baseline=baseline,
        seed=seed,
        time_limit_s=time_limit_s,
    )
    return _plan_document(problem, model, config, request, info, baselines, current_gpus)


def _baselines(model: MigModel) -> tuple[dict[str, Any], Config | None, str]:
    """BASE and CO2OPT as a plan reports them, CO2OPT's configuration and description."""
    base_ev = model.evaluate(model.base_config)
    co2_cfg, co2_desc = model.co2opt_config()
    baselines: dict[str, Any] = {
        "base": {
            **_predicted(model, base_ev),
            # BASE defines the default SLA through the pooled M/G/N queue of its N GPUs
            "p95_ms": model.base_p95_ms,
            "sla_met": model.base_p95_ms <= model.sla_ms * (1 + CAPACITY_TOL),
            "description": f"{model.pairs[model.base_pair].variant} on every whole GPU",
            **describe_config(model, model.base_config),
        }
    }
    if co2_cfg is not None:
        baselines["co2opt"] = {
            **_predicted(model, model.evaluate(co2_cfg)),
            "description": co2_desc,
            **describe_config(model, co2_cfg),
        }
    else:
        baselines["co2opt"] = {"feasible": False, "description": co2_desc}
    return baselines, co2_cfg, co2_desc


def _current_gpus(current: Plan | None) -> list[Any] | None:
    """The GPUs of the MIG plan running now (``--current``), None without one."""
    if current is None:
        return None
    if current.kind != "mig":
        raise InputError(f"--current plan is a '{current.kind}' plan, expected 'mig'")
    gpus = current.extra.get("gpus")
    if not isinstance(gpus, list):
        raise InputError("--current plan has no 'gpus' list")
    return gpus


def _solve(
    problem: MigProblem,
    model: MigModel,
    solver: str,
    current_gpus: list[Any] | None,
    *,
    time_limit_s: float | None,
    seed: int | None,
    verify: bool,
) -> tuple[Config | None, dict[str, Any], MigModel]:
    """The solver's configuration, its report and the model it was verified in."""
    if solver == "exact":
        from greenctl.planner.mig.exact import solve_exact_verified

        res = solve_exact_verified(problem, model, time_limit_s=time_limit_s, verify=verify)
        return res.config, res.info, res.info.pop("_model", model)
    if solver == "anneal":
        from greenctl.planner.mig.anneal import anneal

        start = (
            config_from_gpus(model, current_gpus, source="--current plan") if current_gpus else None
        )
        res = anneal(model, start=start, time_limit_s=time_limit_s, seed=seed)
    else:
        from greenctl.planner.mig.random_search import random_search

        res = random_search(model, time_limit_s=time_limit_s, seed=seed)
    return res.config, res.info, model


def _infeasible(
    problem: MigProblem, model: MigModel, solver: str, info: dict[str, Any]
) -> InfeasiblePlan:
    return InfeasiblePlan(
        f"no MIG configuration of {problem.gpus} x {problem.geo.name} serves "
        f"{problem.rate_rps:g} req/s within the p{round(problem.percentile * 100)} SLA of "
        f"{model.sla_ms:.4g} ms"
        + (f" at accuracy >= {model.floor:.4g}" if model.floor is not None else "")
        + (f" ({info['reason']})" if info.get("reason") else ""),
        hint="add GPUs, lower --rate, relax --sla-ms or --max-accuracy-loss"
        + ("" if solver == "exact" else ", or use --solver exact"),
    )


def _plan_document(
    problem: MigProblem,
    model: MigModel,
    config: Config,
    request: MigRequest,
    info: dict[str, Any],
    baselines: dict[str, Any],
    current_gpus: list[Any] | None,
) -> Plan:
    """The plan of ``config``: its deployments, GPUs, prediction and the model's facts."""
    ev = model.evaluate(config)
    deployments = [
        Deployment(
            model=problem.family,
            variant=o.variant,
            resource=f"mig:{o.profile}",
            count=config.n[k],
            batch=1,
            quota_rps=round(ev.split[k], 6),
        )
        for k, o in enumerate(model.pairs)
        if config.n[k] > 0
    ]
    # profiles that estimate their slices (synthetic, MPS-emulated) label the whole plan
    label = estimate_label(o.source for o in model.pairs)
    extra: dict[str, Any] = {
        "gpus": assign_gpus(model, config, current=current_gpus),
        "baselines": baselines,
        "solver": info,
        "model": {
            "sla_ms": model.sla_ms,
            "sla_source": model.sla_source,
            "capacity_slo_ms": model.cap_slo_ms,
            "gpu_idle_w": problem.gpu_idle_w,
            "dispatch": "quota per (variant, profile) class split evenly over its instances "
            "(policy wrr); each instance an M/G/1 FIFO queue; p95 = mixture of the queues "
            "(analytic, evaluation core); p95_fifo_ms = one central FIFO queue, for reference",
            "notes": problem.notes,
            **({"label": label} if label else {}),
        },
        "configuration": describe_config(model, config),
    }
    return Plan(
        kind="mig",
        request={**request.to_dict(), "policy": "wrr"},  # the planner predicts with wrr
        deployments=deployments,
        predicted=_predicted(model, ev),
        extra=extra,
    )
