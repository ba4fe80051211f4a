"""``plan mix``: choose variants, their resources, counts and request quotas (InfAdapter/INFaaS).

Pure planning: a :class:`MixProblem` in (from :func:`build_mix_problem` on the plan's
``request``, so ``replan`` can redo a plan), a :class:`greenctl.data.plan.Plan` out. One ILP
for every family: integer instances and quotas ``q_o <= capacity_o x n_o`` per option
covering each family's load, under shared budgets and an accuracy floor; objectives
``accuracy``, ``cost``, ``carbon`` (the evaluation core's accounting, so the carbon
minimised is the carbon reported) and ``balanced``. HiGHS or CBC solves it, several families
first by :mod:`greenctl.planner.mix.decomp`. Holds the strategies, re-pricing and
infeasibility diagnosis, re-exporting its siblings' public names. See docs/plan.md.
"""

from __future__ import annotations

import copy
import math
import time
from typing import Any

from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.plan import Plan
from greenctl.planner.core import solvers
from greenctl.planner.mix import decomp as mix_decomp
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix.budget import TIE_BREAK_STATUS, tie_break_seconds
from greenctl.planner.mix.document import scaling_actions, to_plan
from greenctl.planner.mix.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    MIP_REL_GAP,
    REFERENCE_CARBON_INTENSITY,
    TIE_BREAK_REL_TOL,
    Allocation,
    Layout,
    MixFamily,
    MixOption,
    MixProblem,
    MixVariant,
    Model,
    SolveResult,
    Terms,
    build_model,
    components,
    count_bounds,
    evaluate_allocation,
    extract,
    greedy,
    implied_bounds,
    is_maximise,
    objective_terms,
    objective_unit,
    rounded_solution,
    solve,
    solve_highs,
    warm_start,
)
from greenctl.planner.mix.options import (
    lowest_reachable_slo,
    price_energy,
    prune_dominated,
    served_service_of,
)

# the option builder under the name tests/cli/test_newcomer_defects.py reaches it by
from greenctl.planner.mix.problem import build_mix_problem, normalize_request
from greenctl.planner.mix.request import OBJECTIVES, SOLVERS, STRATEGIES, MixRequest

__all__ = [
    "DECOMPOSITION",
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "DEFAULT_GAMMA",
    "MIP_REL_GAP",
    "OBJECTIVES",
    "REFERENCE_CARBON_INTENSITY",
    "SOLVERS",
    "STRATEGIES",
    "TIE_BREAK_REL_TOL",
    "Allocation",
    "Layout",
    "MixFamily",
    "MixOption",
    "MixProblem",
    "MixRequest",
    "MixVariant",
    "Model",
    "SolveResult",
    "Terms",
    "build_mix_problem",
    "build_model",
    "components",
    "count_bounds",
    "evaluate_allocation",
    "extract",
    "greedy",
    "is_maximise",
    "lowest_reachable_slo",
    "normalize_request",
    "objective_terms",
    "objective_unit",
    "plan_mix",
    "prune_dominated",
    "scaling_actions",
    "served_service_of",
    "solve",
    "solve_highs",
    "warm_start",
]

#: Relative change of a batching option's planned per-instance rate below which its energy
#: terms are not re-priced (:func:`plan_mix`).
ENERGY_RATE_TOL = 1e-6
#: Rounds of re-pricing batching options at the rates a plan gives them and solving again.
ENERGY_ROUNDS = 3

#: Try the exact decomposition for multi-family problems first (see ``_solve_exact``).
DECOMPOSITION = True

_STATUS_RANK = {"optimal": 0, "time_limit": 1, "time_limit_no_solution": 2, "infeasible": 3}


def _solve_exact(
    problem: MixProblem,
    terms: Terms,
    *,
    single: bool,
    solver: str,
    time_limit_s: float | None,
    started: float | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    """Solve every independent group of families exactly; merge the allocations.

    Several families go to the exact Lagrangian decomposition of
    :mod:`greenctl.planner.mix.decomp` first; the joint ILP runs when it does not apply or
    gives up (``DECOMPOSITION = False`` forces the joint ILP), warm-started with its best
    plan, reports the tighter of its own bound and the decomposition's, and says why the
    decomposition gave up (``decomposition_fallback``). A tie-break gets what is left of
    the planning budget since ``started`` (default: now; :func:`tie_break_seconds`).
    """
    started = time.perf_counter() if started is None else started
    fallback: mix_decomp.Fallback | None = None
    if DECOMPOSITION and mix_decomp.applicable(problem, single=single, solver=solver):
        t0 = time.perf_counter()
        out = mix_decomp.solve_decomposed(
            problem, terms, time_limit_s=time_limit_s, started=started
        )
        if not isinstance(out, mix_decomp.Fallback):
            return out
        fallback = out
        if time_limit_s is not None:
            time_limit_s = max(time_limit_s - (time.perf_counter() - t0), 0.1)
    # the decomposition's best plan (if any) starts the joint ILP instead of the greedy one
    start_alloc = fallback.incumbent if fallback is not None else None
    lagrangian = fallback.bound if fallback is not None else None
    # One joint model: HiGHS handles independent families inside one tree faster than
    # one tree per family (measured: 100 families without budgets, 0.14 s joint vs 5 s
    # separately for the accuracy objective), so groups are only reported.
    groups = [list(range(len(problem.families)))]
    alloc: Allocation = {}
    infos = []
    for group in groups:
        part, info = _solve_group(
            problem,
            terms,
            group,
            single=single,
            solver=solver,
            time_limit_s=time_limit_s,
            start_alloc=start_alloc,
            started=started,
        )
        infos.append(info)
        if not part:
            info["groups"] = len(groups)
            return {}, info
        alloc.update(part)
    worst = max(infos, key=lambda i: _STATUS_RANK.get(i["status"], 9))
    gaps = [i["gap"] for i in infos if i.get("gap") is not None]
    merged: dict[str, Any] = {
        "name": solver,
        "status": worst["status"],
        "gap": max(gaps) if gaps else (0.0 if worst["status"] == "optimal" else None),
        "solve_s": round(sum(i["solve_s"] for i in infos), 4),
        "build_s": round(sum(i["build_s"] for i in infos), 4),
        "columns": sum(i["columns"] for i in infos),
        "rows": sum(i["rows"] for i in infos),
        "integer_columns": sum(i["integer_columns"] for i in infos),
        "independent_groups": len(components(problem)),
        "mip_rel_gap_tolerance": MIP_REL_GAP,
        "method": "joint ILP",
    }
    if fallback is not None:
        merged["decomposition_fallback"] = fallback.reason
    if len(infos) == 1 and "objective_bound" in infos[0]:
        merged["objective_bound"] = infos[0]["objective_bound"]
    merged["warm_start"] = infos[0].get("warm_start")
    if infos[0].get("proof"):
        merged["proof"], merged["proven_s"] = infos[0]["proof"], infos[0]["proven_s"]
    if lagrangian is not None and alloc and merged["status"] != "optimal":
        # the decomposition's Lagrangian bound holds for the whole problem: report the
        # tighter of the two proven bounds and the gap to it
        maximise = is_maximise(problem.objective)
        value = evaluate_allocation(problem, alloc, terms)["objective"]
        lbound = -lagrangian if maximise else lagrangian
        own = merged.get("objective_bound")
        tighter = own is None or (lbound < own if maximise else lbound > own)
        if tighter:
            merged["objective_bound"] = lbound
            merged["bound_source"] = "decomposition's Lagrangian bound"
            diff = (lbound - value) if maximise else (value - lbound)
            merged["gap"] = max(diff, 0.0) / max(abs(value), 1e-12)
    if any("tie_break" in i for i in infos):
        merged["tie_break"] = infos[0].get("tie_break")
    return alloc, merged


def _solve_group(
    problem: MixProblem,
    terms: Terms,
    group: list[int],
    *,
    single: bool,
    solver: str,
    time_limit_s: float | None,
    start_alloc: Allocation | None = None,
    started: float | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    """One ILP over the families in ``group``, warm-started (by ``start_alloc`` when given,
    else greedily), then tie-broken without giving up the primary optimum, within what is
    left of the planning budget since ``started``; the allocation (empty when no plan was
    found) and the solver's report."""
    started = time.perf_counter() if started is None else started
    model, lay = build_model(problem, terms, single=single, subset=group)
    # In units of the objective's size: carbon per request (~1e-5 g) met HiGHS's absolute
    # MIP gap (1e-9) at 1e-4 relative and stopped "optimal" with a gap of up to 1%.
    unit = objective_unit(problem, model, lay, group)
    if 1e-2 <= unit <= 1e2:  # O(1) already; rescaling it changes HiGHS's search for nothing
        unit = 1.0
    model.cost = [c / unit for c in model.cost]
    res, lp_dual = None, None
    if solver == "highs" and mix_model.LP_FIRST and len(group) > 1:
        # (one family's ILP takes milliseconds: an LP first would only add to them)
        res, lp_dual = _lp_first(model, time_limit_s)
    start = None
    if res is None:
        start = None if single else warm_start(problem, terms, lay, len(model.cost), start_alloc)
        res = solve(model, solver=solver, time_limit_s=time_limit_s, start=start)
    info: dict[str, Any] = {
        "name": solver,
        "status": res.status,
        "gap": res.gap,
        "solve_s": round(res.seconds, 4),
        "build_s": round(res.build_seconds, 4),
        "columns": len(model.cost),
        "rows": len(model.rows),
        "integer_columns": sum(model.integer),
        "warm_start": (
            None if start is None else "greedy" if start_alloc is None else "decomposition"
        ),
    }
    if start is None and res.status == "optimal" and lp_dual is not None and not single:
        info["proof"] = "the LP relaxation's plan, counts rounded up, meets its bound"
        info["proven_s"] = round(res.seconds, 4)
    if res.bound is not None and math.isfinite(res.bound):
        # the proven bound on the objective, in the objective's own sense
        bound = res.bound * unit
        info["objective_bound"] = -bound if is_maximise(problem.objective) else bound
    if res.x is None:
        return {}, info
    alloc = extract(problem, lay, res.x)
    # Tie-break without giving up the primary optimum: accuracy/carbon plans minimise cost
    # among optimal plans, cost plans maximise accuracy among cheapest plans.
    if res.status == "optimal" and problem.objective in ("accuracy", "carbon", "cost"):
        primary = res.objective or 0.0
        # relative to the optimum, and the row scaled to it: carbon per request is ~1e-5
        # g, where an absolute 1e-7 (or HiGHS's absolute row tolerance) let the tie-break
        # give up 20% of the optimum
        unit = abs(primary) if abs(primary) > 1e-300 else 1.0
        tol = TIE_BREAK_REL_TOL * unit
        secondary = "accuracy" if problem.objective == "cost" else "cost"
        m2, lay2 = build_model(problem, terms, single=single, objective=secondary, subset=group)
        idx = [i for i, c in enumerate(model.cost) if c != 0]
        m2.row(idx, [model.cost[i] / unit for i in idx], -math.inf, (primary + tol) / unit)
        if lp_dual is not None:  # the LP's reduced costs bound what the tie-break may move
            m2.lb, m2.ub = implied_bounds(model, lp_dual, primary + tol)
        # what is left of the planning budget: the optimum is proven, the tie-break refines
        limit = None if time_limit_s is None else time_limit_s - res.seconds
        left = tie_break_seconds(started, limit, families=len(problem.families))
        # the primary plan starts it (without one HiGHS may find none in the time left)
        start2 = warm_start(problem, terms, lay2, len(m2.cost), alloc)
        res2 = solve(m2, solver=solver, time_limit_s=left, start=start2)
        info["tie_break"] = {
            "objective": secondary,
            "status": TIE_BREAK_STATUS.get(res2.status, res2.status),
            "budget_s": round(left, 4),
            "solve_s": round(res2.seconds, 4),
        }
        info["solve_s"] = round(res.seconds + res2.seconds, 4)
        if res2.x is not None and res2.status in ("optimal", "time_limit"):
            alloc = extract(problem, lay2, res2.x)
    return alloc, info


def _lp_first(
    model: Model, time_limit_s: float | None
) -> tuple[SolveResult | None, list[float] | None]:
    """The LP relaxation before the ILP: its row duals (they bound the tie-break's columns,
    :func:`implied_bounds`) and, when its plan with counts rounded up is feasible and meets
    the LP bound within the gap tolerance, that plan as the proven optimum (no search)."""
    lp = solve_highs(model, time_limit_s, relax=True)
    if lp.status != "optimal" or lp.x is None or lp.objective is None:
        return None, None
    got = rounded_solution(model, lp.x)
    if got is not None:
        x, value = got
        diff = max(value - lp.objective, 0.0)
        gap = diff / max(abs(value), 1e-12)
        if gap <= MIP_REL_GAP or diff <= 1e-9:
            return SolveResult("optimal", x, value, lp.objective, gap, lp.seconds), lp.row_dual
    return None, lp.row_dual


# --------------------------------------------------------------------------------------------
# Infeasibility diagnosis
# --------------------------------------------------------------------------------------------
def _max_servable_scale(problem: MixProblem, solver: str) -> float:
    """Largest t such that every family's load x t fits the budgets (no accuracy floor)."""
    m = Model()
    inf = math.inf
    tcol = m.col(-1.0, 0.0, inf)
    budget_rows: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in problem.budgets}
    for fam in problem.families:
        load = fam.load_rps(problem.headroom)
        qcols = []
        for o in fam.options:
            ub = math.inf
            for k, a in o.usage.items():
                if a > 0:
                    ub = min(ub, math.floor(problem.budgets[k] / a + 1e-9))
            nc = m.col(0.0, 0.0, ub, True)
            qc = m.col(0.0, 0.0, inf)
            m.row([qc, nc], [1.0, -o.capacity_rps], -inf, 0.0)
            qcols.append(qc)
            for k, a in o.usage.items():
                budget_rows[k][0].append(nc)
                budget_rows[k][1].append(a)
        m.row([*qcols, tcol], [*([1.0] * len(qcols)), -load], 0.0, 0.0)
    for k, (idx, coef) in budget_rows.items():
        if idx:
            m.row(idx, coef, -inf, problem.budgets[k])
    m.ub[tcol] = 1e6
    res = solve(m, solver="highs" if solver == "highs" else solver, time_limit_s=10.0)
    if res.x is None:
        return 0.0
    return float(res.x[tcol])


def _diagnose(problem: MixProblem, solver: str, terms: Terms) -> InfeasiblePlan:
    """Name the binding constraint and the closest feasible alternative."""
    pct = problem.percentile
    for fam in problem.families:
        if not fam.options:
            why = "; ".join(fam.ineligible[:4]) if fam.ineligible else "no profiles"
            hint = "profile a faster resource or relax --slo-ms"
            if fam.lowest_slo is not None:
                hint = (
                    f"lowest reachable SLO: {fam.lowest_slo[0]:.4g} ms ({fam.lowest_slo[1]}); "
                    "relax --slo-ms or profile a faster resource"
                )
            return InfeasiblePlan(
                f"no variant of '{fam.name}' meets the SLO of {fam.slo_ms:g} ms at {pct} on any "
                f"profiled resource ({why})",
                hint=hint,
            )
    for fam in problem.families:
        if fam.min_accuracy is not None:
            top = max(fam.variants[o.variant].accuracy for o in fam.options)
            if top < fam.min_accuracy - 1e-12:
                return InfeasiblePlan(
                    f"accuracy floor unreachable for '{fam.name}': --min-accuracy "
                    f"{fam.min_accuracy:g} is above every variant that meets the SLO",
                    hint=f"highest reachable accuracy: {top:.5g}",
                )
    scale = _max_servable_scale(problem, solver)
    if scale < 1.0 - 1e-9:
        rates = ", ".join(f"{f.name} {f.rate_rps * scale:.4g} req/s" for f in problem.families)
        budgets = ", ".join(f"{k}={v:g}" for k, v in problem.budgets.items())
        err = InfeasiblePlan(
            f"budget too small for the rate: {budgets} serves at most {scale:.4g} x the "
            f"requested load at {pct} within the SLO",
            hint=f"largest servable rate: {rates} (headroom {problem.headroom:g} included); "
            "raise --budget or lower --rate",
        )
        err.servable_scale = scale
        return err
    if all(f.min_accuracy is None for f in problem.families):
        return InfeasiblePlan(
            "no feasible plan within the budgets at this rate",
            hint="raise --budget or lower --rate",
        )
    # the load fits; the floor does not: the best accuracy under the budgets
    relaxed = _copy_problem(problem, objective="accuracy", min_accuracy=None)
    rterms = objective_terms(relaxed)
    alloc, info = _solve_exact(relaxed, rterms, single=False, solver=solver, time_limit_s=10.0)
    if alloc:
        accs = []
        for fi, fam in enumerate(relaxed.families):
            load = fam.load_rps(relaxed.headroom) or 1.0
            acc = sum(
                fam.variants[fam.options[oi].variant].accuracy * qq
                for oi, (_, qq) in alloc[fi].items()
            )
            accs.append(f"{fam.name} {acc / load:.5g}")
        return InfeasiblePlan(
            "accuracy floor unreachable within the budgets at this rate",
            hint=f"highest reachable accuracy: {', '.join(accs)}",
        )
    return InfeasiblePlan(f"no feasible plan (solver status {info.get('status')})")


def _copy_problem(problem: MixProblem, **changes: Any) -> MixProblem:
    """A shallow copy of ``problem`` (families copied too) with the objective or every
    family's accuracy floor changed: the relaxed problem the diagnosis solves."""
    p = copy.copy(problem)
    p.families = [copy.copy(f) for f in problem.families]
    if "objective" in changes:
        p.objective = changes["objective"]
    if "min_accuracy" in changes:
        for f in p.families:
            f.min_accuracy = changes["min_accuracy"]
    return p


def plan_mix(
    problem: MixProblem,
    *,
    strategy: str = "ilp",
    solver: str = "highs",
    time_limit_s: float | None = None,
) -> Plan:
    """Plan deployments and quotas for ``problem``.

    ``strategy``: ``ilp`` (exact), ``greedy`` (INFaaS replicate-or-upgrade) or ``single`` (the
    best one-variant-per-family plan; exact); ``solver``: ``highs`` or ``cbc``;
    ``time_limit_s`` returns the best plan found with its gap (status ``time_limit``).

    Returns:
        A ``kind="mix"`` plan; ``extra["solver"]`` has status, gap and solve time,
        ``extra["actions"]`` the scaling actions when ``problem.current`` is set.
    Raises:
        InputError, InfeasiblePlan (naming the binding constraint), GreenctlError (exit 1).
    """
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r}", hint="use ilp, greedy or single")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}", hint="use highs or cbc")
    if solver == "cbc" and strategy != "greedy":
        solvers.require_cbc()  # before any work: exit 2 with the install hint
    t0 = time.perf_counter()
    terms = objective_terms(problem)
    if any(not f.options for f in problem.families):
        raise _diagnose(problem, solver, terms)
    alloc, info = _solve_once(problem, terms, strategy, solver, time_limit_s, started=t0)
    # Batching options are priced at one rate per instance (their energy per request falls
    # as their batches fill): re-price those the plan uses at the rates it gives them and
    # solve again, until the plan prices every instance at its own rate (then the energy
    # and carbon the solver minimised are the ones the evaluation core reports).
    rounds = 0
    seen = {_alloc_key(alloc)}
    while rounds < ENERGY_ROUNDS and _reprice(problem, alloc):
        rounds += 1
        terms = objective_terms(problem)
        left = None
        if time_limit_s is not None:
            left = max(time_limit_s - (time.perf_counter() - t0), 0.1)
        try:
            alloc, info = _solve_once(problem, terms, strategy, solver, left, started=t0)
        except InfeasiblePlan:  # e.g. out of time: keep the plan, now priced at its rates
            break
        if _alloc_key(alloc) in seen:
            break
        seen.add(_alloc_key(alloc))
    if rounds:
        info["energy_rounds"] = rounds
    info["total_s"] = round(time.perf_counter() - t0, 4)
    if strategy == "single":
        # "optimal" is within the baseline's restriction, not over all plans
        info["scope"] = "one variant per family (the Model-Switching / VPA baseline)"
    if problem.objective == "balanced" and problem.gamma > 0 and not terms.use_cc:
        problem.notes.append(
            "CC (carbon) term dropped from the balanced objective: some profiles have no "
            "energy_j or power_w"
        )
    return to_plan(problem, alloc, terms, strategy=strategy, solver_info=info)


def _alloc_key(alloc: Allocation) -> tuple[tuple[int, int, int], ...]:
    """The instances an allocation deploys, comparable across re-pricing rounds."""
    return tuple(sorted((fi, oi, n) for fi, opts in alloc.items() for oi, (n, _) in opts.items()))


def _reprice(problem: MixProblem, alloc: Allocation) -> bool:
    """Re-price the energy of every option ``alloc`` uses whose terms hold at one rate only
    (batching) at the per-instance rate ``alloc`` gives it; True when any moved."""
    moved = False
    for fi, opts in alloc.items():
        fam = problem.families[fi]
        load = fam.load_rps(problem.headroom)
        for oi, (n, qq) in opts.items():
            o = fam.options[oi]
            if n <= 0 or qq <= 0 or o.energy_linear or o.energy_rate_rps is None or load <= 0:
                continue
            rate = fam.rate_rps * qq / load / n  # what predict's quota split gives each
            if abs(rate - o.energy_rate_rps) <= ENERGY_RATE_TOL * rate:
                continue
            if price_energy(o, fam.name, rate, problem.serving) is None:
                moved = True
    return moved


def _solve_once(
    problem: MixProblem,
    terms: Terms,
    strategy: str,
    solver: str,
    time_limit_s: float | None,
    *,
    started: float | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    """One solve of ``problem`` with ``terms`` by ``strategy`` (a tie-break within the
    planning budget since ``started``); raises InfeasiblePlan."""
    if strategy == "greedy":
        alloc = greedy(problem, terms)
        info: dict[str, Any] = {"name": "greedy", "status": "heuristic", "gap": None}
    else:
        alloc, info = _solve_exact(
            problem, terms, single=strategy == "single", solver=solver,
            time_limit_s=time_limit_s, started=started,
        )  # fmt: skip
        if not alloc:
            if info["status"] == "time_limit_no_solution":
                raise InfeasiblePlan(
                    f"no plan found within the time limit of {time_limit_s:g} s",
                    hint="raise --time-limit",
                )
            if strategy == "single":
                mixed, _ = _solve_exact(
                    problem, terms, single=False, solver=solver, time_limit_s=10.0
                )
                if mixed:
                    raise InfeasiblePlan(
                        "no single variant can serve the load alone within the budgets"
                        + (
                            " and the accuracy floor"
                            if any(f.min_accuracy is not None for f in problem.families)
                            else ""
                        ),
                        hint="try --strategy ilp, which mixes variants",
                    )
            raise _diagnose(problem, solver, terms)
    return alloc, info
