"""The exact ``plan mig`` solver: an ILP over counts whose size does not depend on ``N``.

Integer ``y_m`` GPUs per slice multiset (summing to ``N``), integer ``n_k`` instances per
(variant, profile) pair filling every slice, and continuous rates ``x_k`` summing to the
rate with ``x_k <= n_k r_k`` (the linearised p95, see :mod:`greenctl.planner.mig.solve`),
an optional accuracy floor, and a linear objective (idle power is fixed by ``N``). Solved
by HiGHS through PuLP (:func:`greenctl.planner.core.solvers.pulp_highs`), relative gap 0.
The winner is re-evaluated (mixture p95, and the simulator when available); if the p95
exceeds the SLA, the capacity SLA is tightened by 10 % and the ILP re-solved, at most 4
times.
"""

from __future__ import annotations

import time
from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.planner.core import solvers
from greenctl.planner.core.queueing import latency_quantile_ms
from greenctl.planner.mig import sim as mig_sim
from greenctl.planner.mig.model import Config, MigModel, SolveResult, tidy
from greenctl.planner.mig.problem import CAPACITY_TOL, MigProblem

MAX_TIGHTEN = 4
FIFO_SIM_MAX_INSTANCES = 512


def solve_exact(model: MigModel, *, time_limit_s: float | None = None) -> SolveResult:
    """Solve the ILP for ``model``; ``config`` is None when it is infeasible."""
    import pulp

    prob = model.problem
    n_gpus = prob.gpus
    rate = prob.rate_rps
    lp = pulp.LpProblem("greenctl_mig", pulp.LpMaximize)
    y = [
        lp.add_variable(f"y{i}", lowBound=0, upBound=n_gpus, cat=pulp.LpInteger)
        for i in range(len(model.multisets))
    ]
    n_vars = []
    x_vars = []
    for k, _o in enumerate(model.pairs):
        upper = model.max_instances(model.pairs[k].profile)
        nk = lp.add_variable(f"n{k}", lowBound=0, upBound=upper, cat=pulp.LpInteger)
        xk = lp.add_variable(f"x{k}", lowBound=0, upBound=rate)
        n_vars.append(nk)
        x_vars.append(xk)
        # the evaluator accepts the capacity bisection's rounding (CAPACITY_TOL) too
        lp += xk <= model.rate_capacity(k) * (1 + CAPACITY_TOL) * nk, f"cap{k}"
    lp += pulp.lpSum(y) == n_gpus, "gpus"
    for p in model.profiles:
        lp += (
            pulp.lpSum(n_vars[k] for k in model.pairs_of[p])
            == pulp.lpSum(
                model.cnt[i].get(p, 0) * y[i] for i in range(len(y)) if model.cnt[i].get(p)
            ),
            f"slices_{p.replace('.', '_').replace('+', 'p')}",
        )
    lp += pulp.lpSum(x_vars) == rate, "rate"
    if model.floor is not None:
        lp += (
            pulp.lpSum(model.pairs[k].accuracy * x_vars[k] for k in range(len(x_vars)))
            >= model.floor * rate,
            "accuracy_floor",
        )
    lp += pulp.lpSum(model.coef[k] * x_vars[k] for k in range(len(x_vars)))
    options: dict[str, object] = {"mip_rel_gap": 0.0}
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    t0 = time.perf_counter()
    lp.solve(solvers.pulp_highs(options))
    solve_s = time.perf_counter() - t0
    # HiGHS's own status, through the one mapping (pulp folds "not run" into "Not Solved")
    outcome = solvers.highs_outcome(lp.solverModel, what="the MIG ILP", limits=True)
    status = pulp.LpStatus[lp.status]
    info: dict[str, Any] = {
        "name": "exact",
        "backend": "HiGHS via PuLP",
        "status": status,
        "solve_s": solve_s,
        "variables": len(lp.variables()),
        "constraints": len(lp.constraints()),
        "capacity_slo_ms": model.cap_slo_ms,
    }
    if outcome == solvers.INFEASIBLE:
        return SolveResult(None, info)
    has_incumbent = lp.solverModel.getInfo().primal_solution_status == 2
    if outcome == solvers.LIMIT and not has_incumbent:
        info["reason"] = (
            f"time limit of {time_limit_s:g} s reached without a solution"
            if time_limit_s is not None
            else "the solver stopped at a limit without a solution"
        )
        return SolveResult(None, info)
    yv = tuple(round(v.varValue or 0) for v in y)
    nv = tuple(round(v.varValue or 0) for v in n_vars)
    cfg = Config(yv, nv)
    try:
        model.check(cfg)
    except ValueError:
        info["reason"] = "the solver stopped (time limit) with no consistent incumbent"
        return SolveResult(None, info)
    if outcome != solvers.OPTIMAL:
        if not model.evaluate(cfg).feasible:
            info["reason"] = "the solver stopped (time limit) with no feasible incumbent"
            return SolveResult(None, info)
        info["status"] = "time limit: best incumbent, optimality not proven"
    cfg = tidy(model, cfg)
    info["ilp_objective"] = model.const + float(pulp.value(lp.objective) or 0.0)
    return SolveResult(cfg, info)


def verify_config(model: MigModel, config: Config) -> dict[str, Any]:
    """Check a configuration's p95 against the SLA with the evaluation core.

    Returns ``{"analytic_p95_ms", "analytic_ok", "class_p95_ms", "simulated_p95_ms",
    "simulated_ok"}`` (simulated fields None when no simulator is available).
    """
    ev = model.evaluate(config)
    q = model.problem.percentile
    per_class = {}
    for k, c in enumerate(config.n):
        if c and ev.split[k] > 0:
            o = model.pairs[k]
            per_class[f"{o.variant}@{o.profile}"] = latency_quantile_ms(
                ev.split[k], o.service, c, q
            )
    tol = 1 + CAPACITY_TOL
    out: dict[str, Any] = {
        "analytic_p95_ms": ev.p95_ms,
        "class_p95_ms": per_class,
        "analytic_ok": bool(
            ev.p95_ms <= model.sla_ms * tol
            and all(v <= model.sla_ms * tol for v in per_class.values())
        ),
        "simulated_p95_ms": None,
        "simulated_ok": None,
    }
    sim = mig_sim.simulate_p95(model, config, ev.split)
    if sim is not None:
        out["simulated_p95_ms"] = sim
        # the simulator samples: allow its statistical noise (2 %)
        out["simulated_ok"] = bool(sim <= model.sla_ms * 1.02)
        if sum(config.n) <= FIFO_SIM_MAX_INSTANCES:
            # for reference only: the same instances behind Clover's central FIFO queue
            out["simulated_fifo_p95_ms"] = mig_sim.simulate_p95(
                model, config, ev.split, requests=20000, policy="fifo"
            )
    return out


def solve_exact_verified(
    problem: MigProblem,
    model: MigModel,
    *,
    time_limit_s: float | None = None,
    verify: bool = True,
) -> SolveResult:
    """Solve, verify the winner, tighten the capacity SLA and re-solve if it disagrees."""
    t_start = time.perf_counter()
    history = []
    current = model
    scale = 1.0
    for attempt in range(MAX_TIGHTEN + 1):
        left = None
        if time_limit_s is not None:
            left = max(time_limit_s - (time.perf_counter() - t_start), 0.05)
        res = solve_exact(current, time_limit_s=left)
        if res.config is None:
            if attempt == 0:
                raise InfeasiblePlan(
                    f"no MIG configuration of {problem.gpus} x {problem.geo.name} serves "
                    f"{problem.rate_rps:g} req/s within the p{round(problem.percentile * 100)} "
                    f"SLA of {model.sla_ms:.4g} ms"
                    + (f" at accuracy >= {model.floor:.4g}" if model.floor is not None else "")
                    + (f" ({res.info['reason']})" if res.info.get("reason") else ""),
                    hint="add GPUs, lower --rate, relax --sla-ms or --max-accuracy-loss",
                )
            break
        if not verify:
            res.info["_model"] = current
            return res
        check = verify_config(current, res.config)
        history.append({"capacity_slo_ms": current.cap_slo_ms, **check})
        ok = check["analytic_ok"] and check["simulated_ok"] is not False
        if ok:
            res.info["verification"] = history
            res.info["tightenings"] = attempt
            res.info["_model"] = current
            return res
        scale *= 0.9
        current = MigModel(problem, sla_scale=scale)
        current.sla_ms = model.sla_ms
    raise InfeasiblePlan(
        "the exact plan's p95 kept exceeding the SLA in verification after "
        f"{MAX_TIGHTEN} tightenings",
        hint="relax --sla-ms or add GPUs; verification: "
        + "; ".join(
            f"cap SLO {h['capacity_slo_ms']:.4g} ms -> p95 {h['analytic_p95_ms']:.4g} ms"
            for h in history
        ),
    )


def ilp_size(model: MigModel) -> dict[str, int]:
    """Variables of the ILP (no solve): independent of the number of GPUs."""
    return {
        "multisets": len(model.multisets),
        "pairs": len(model.pairs),
        "variables": len(model.multisets) + 2 * len(model.pairs),
    }
