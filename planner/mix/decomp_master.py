"""The decomposition's master problems: which plan each family runs, under the shared budgets.

The master MILP picks one listed plan per family (hard families enter with their own ILP
rows), the restricted LP over the pool of plans prices the budgets for column generation,
and the tie-break stage reruns the master on the secondary objective, as the joint ILP does.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from greenctl.planner.mix import budget as mix_budget
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix.family_search import FamilyPlan
from greenctl.planner.mix.model import Allocation, MixProblem, Terms

#: The master's relative gap tolerance (below the plan's, which it must meet).
MASTER_REL_GAP = 1e-7
#: Below this much of its budget left (s) the tie-break's full ILP is not started: building
#: the 100-family model alone takes about that long.
MIN_STAGE_S = 0.02


@dataclass
class Fallback:
    """The decomposition gave up: why, and what it hands the joint ILP that runs instead."""

    reason: str
    rounds: list[dict[str, Any]]
    #: its best plan (it warm-starts the joint ILP)
    incumbent: Allocation | None = None
    #: its best Lagrangian bound, in the model's sense (minimisation; it can tighten the
    #: joint ILP's)
    bound: float | None = None
    #: the column generation's price rounds before it gave up (None: before pricing)
    price_rounds: list[dict[str, Any]] | None = None


def tie_break(objective: str) -> str | None:
    """The joint ILP's tie-break objective among optimal plans (None: no tie-break)."""
    return {"accuracy": "cost", "carbon": "cost", "cost": "accuracy"}.get(objective)


def finish_proof(
    problem: MixProblem,
    terms: Terms,
    pool: list[dict[tuple[tuple[int, int], ...], FamilyPlan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    model: Any,
    inc: float,
    ld: float,
    lam: list[float],
    info: dict[str, Any],
    alloc: Allocation,
    lp_dual: list[float] | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    """The result when the pool's best plan already meets the Lagrangian bound.

    With a tie-break objective :func:`tie_break_stage` picks the best tie-break among
    plans within the joint ILP's tolerance of the optimum (``lp_dual``: the LP relaxation's
    row duals of ``model``, which bound the columns the tie-break may move).
    """
    t0, deadline, unit = info.pop("t0"), info.pop("deadline"), info.pop("unit")
    started = info.pop("started")
    second = tie_break(problem.objective)
    maximise = mix_model.is_maximise(problem.objective)
    info["proven_s"] = round(time.perf_counter() - t0, 4)
    if second is not None:
        alloc, info["tie_break"] = tie_break_stage(
            problem, terms, pool, keys, budgets, model=model,
            rhs=inc + mix_model.TIE_BREAK_REL_TOL * abs(inc), alloc=alloc,
            started=started, deadline=deadline, lp_dual=lp_dual,
        )  # fmt: skip
    gap = max(inc - ld, 0.0) / max(abs(inc), 1e-12)
    out: dict[str, Any] = {
        "name": "highs",
        "method": "decomposition: Lagrangian prices (LP duals refined by column "
        "generation); the best plan over the priced plans meets the Lagrangian bound",
        "status": "optimal",
        "gap": gap,
        "objective_bound": (-ld if maximise else ld) * unit,
        "lagrangian_bound": (-ld if maximise else ld) * unit,
        "prices": dict(zip(keys, lam, strict=True)),
        **info,
        "solve_s": round(time.perf_counter() - t0, 4),
        **solver_sizes(
            problem,
            columns=sum(len(p) for p in pool),
            rows=len(pool) + len(keys),
            integer=sum(len(p) for p in pool),
        ),
    }
    return alloc, out


def solver_sizes(problem: MixProblem, *, columns: int, rows: int, integer: int) -> dict[str, Any]:
    """The size keys a proven decomposition reports in ``extra.solver`` (as the joint ILP)."""
    return {
        "build_s": 0.0,
        "columns": columns,
        "rows": rows,
        "integer_columns": integer,
        "independent_groups": len(mix_model.components(problem)),
        "mip_rel_gap_tolerance": mix_model.MIP_REL_GAP,
        "warm_start": None,
    }


def tie_break_stage(
    problem: MixProblem,
    terms: Terms,
    pool: list[dict[tuple[tuple[int, int], ...], FamilyPlan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    model: Any,
    rhs: float,
    alloc: Allocation,
    started: float,
    deadline: float,
    lp_dual: list[float] | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    """The joint ILP's tie-break after the primary optimum is proven.

    First the best tie-break over the priced plans (a master MILP with the row ``primary
    <= rhs``: the optimum plus the joint ILP's tolerance), then, as the joint ILP does, the
    full tie-break ILP warm-started with it; both within what is left of the planning budget
    since ``started`` (:func:`~greenctl.planner.mix.budget.tie_break_seconds`). Its status
    says whether it finished or stopped at that budget with its best plan.
    """
    second = tie_break(problem.objective)
    # objective: the tie-break cost; the row: the primary cost
    swapped = {
        fi: (0.0, [FamilyPlan(p.second, p.usage, p.counts, p.cost) for p in plans.values()])
        for fi, plans in enumerate(pool)
    }
    maximise = mix_model.is_maximise(problem.objective)
    proven = mix_model.evaluate_allocation(problem, alloc, terms)
    limit = mix_model.TIE_BREAK_REL_TOL * abs(proven["objective"]) + 1e-15

    def acceptable(cand: Allocation) -> bool:
        # HiGHS's row tolerances (1e-6 on MIP rows) may stretch the row: check it here
        value = mix_model.evaluate_allocation(problem, cand, terms)["objective"]
        diff = (proven["objective"] - value) if maximise else (value - proven["objective"])
        return diff <= limit

    budget = mix_budget.tie_break_seconds(
        started, deadline - time.perf_counter(), families=len(problem.families)
    )
    until = time.perf_counter() + budget
    got, _ = master_with_row(problem, terms, swapped, keys, budgets, rhs, until, start=alloc)
    if got is not None and acceptable(got):
        alloc = got
    info: dict[str, Any] = {"objective": second, "budget_s": round(budget, 4)}
    left = until - time.perf_counter()
    if left < MIN_STAGE_S:  # the budget went on the priced plans: the best among them
        info["status"] = mix_budget.TIE_BREAK_STATUS["time_limit"]
        info["stage"] = "the master over the priced plans"
        return alloc, info
    m2, lay2 = mix_model.build_model(problem, terms, single=False, objective=second)
    idx = [i for i, c in enumerate(model.cost) if c != 0]
    m2.row(idx, [model.cost[i] for i in idx], -math.inf, rhs)
    if lp_dual is not None:  # what every plan within rhs can move (reduced-cost fixing)
        m2.lb, m2.ub = mix_model.implied_bounds(model, lp_dual, rhs)
    start = mix_model.warm_start(problem, terms, lay2, len(m2.cost), alloc)
    res = mix_model.solve_highs(m2, max(until - time.perf_counter(), MIN_STAGE_S), start)
    info["status"] = mix_budget.TIE_BREAK_STATUS.get(res.status, res.status)
    info["solve_s"] = round(res.seconds, 4)
    if res.x is not None and res.status in ("optimal", "time_limit"):
        cand = mix_model.extract(problem, lay2, res.x)
        if acceptable(cand):
            alloc = cand
        else:
            info["status"] += " (its plan gave up more than the tolerance: kept the one before)"
    return alloc, info


def master_with_row(
    problem: MixProblem,
    terms: Terms,
    results: dict[int, tuple[float, list[FamilyPlan]]],
    keys: list[str],
    budgets: tuple[float, ...],
    rhs: float,
    deadline: float,
    *,
    start: Allocation | None = None,
) -> tuple[Allocation | None, float | None]:
    """The master MILP over ``results`` with the row ``sum second <= rhs``, started from
    ``start`` when each family's plan in it is among ``results`` (stopped at ``deadline``,
    its answer is then never worse than ``start``)."""
    master, cols, _ = build_master(problem, terms, results, [], keys, budgets)
    idx = list(cols)
    master.row(idx, [cols[j][1].second for j in idx], -math.inf, rhs)
    x0: list[float] | None = None
    if start is not None:
        x0 = [0.0] * len(master.cost)
        for j, (fi, plan) in cols.items():
            x0[j] = 1.0 if dict(plan.counts) == start.get(fi) else 0.0
        if sum(x0) != len(results):
            x0 = None
    left = max(deadline - time.perf_counter(), 0.05)
    res = mix_model.solve_highs(master, left, x0, rel_gap=MASTER_REL_GAP)
    if res.x is None or res.objective is None:
        return None, None
    xs = res.x
    return {fi: dict(p.counts) for j, (fi, p) in cols.items() if xs[j] > 0.5}, res.objective


def restricted_lp(
    pool: list[dict[tuple[tuple[int, int], ...], FamilyPlan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    big: float,
    second_rhs: float | None = None,
) -> tuple[float, list[float], list[bool]] | None:
    """The LP over the pool's plans (a convex combination per family, shared budgets).

    Its value bounds the Lagrangian dual from above and its budget duals are the prices
    that maximise the Lagrangian bound over the pool (column generation). Budget overuse
    costs ``big`` per unit, which keeps the LP feasible and caps the prices.
    """
    m = mix_model.Model()
    nrow = len(keys) + (second_rhs is not None)
    rows_k: list[tuple[list[int], list[float]]] = [([], []) for _ in range(nrow)]
    for plans in pool:
        idx = []
        for plan in plans.values():
            c = m.col(plan.cost, 0.0, 1.0)
            idx.append(c)
            for k, u in enumerate(plan.usage):
                if u != 0:
                    rows_k[k][0].append(c)
                    rows_k[k][1].append(u)
            if second_rhs is not None:
                rows_k[-1][0].append(c)
                rows_k[-1][1].append(plan.second)
        m.row(idx, [1.0] * len(idx), 1.0, 1.0)
    first = len(m.rows)
    slacks = []
    rhs: list[float] = [*budgets]
    if second_rhs is not None:
        rhs.append(second_rhs)
    for k, b in enumerate(rhs):
        slack = m.col(big, 0.0, math.inf)
        slacks.append(slack)
        m.row([*rows_k[k][0], slack], [*rows_k[k][1], -1.0], -math.inf, b)
    # per-family costs of order 1 (HiGHS's reduced-cost tolerance is absolute, 1e-7)
    f = float(max(len(pool), 1))
    m.cost = [c * f for c in m.cost]
    res = mix_model.solve_highs(m, None, relax=True)
    if res.status != "optimal" or res.row_dual is None or res.objective is None:
        return None
    if res.x is None:
        return None
    lam = [max(0.0, -float(res.row_dual[first + k]) / f) for k in range(nrow)]
    over = [res.x[slacks[k]] > 1e-9 for k in range(nrow)]
    return res.objective / f, lam, over


def fallback_of(
    reason: str,
    rounds: list[dict[str, Any]],
    incumbent: Allocation | None = None,
    bound: float | None = None,
) -> Fallback:
    """Why the decomposition gives up, its best plan (it warm-starts the joint ILP) and its
    best Lagrangian bound (model sense: minimisation; it can tighten the joint ILP's).
    """
    finite = bound is not None and math.isfinite(bound)
    return Fallback(reason, rounds, incumbent, bound if finite else None)


def budget_keys_used(problem: MixProblem, fis: Any) -> list[str]:
    """Budget keys some option of families ``fis`` uses, in budgets order."""
    used = {k for fi in fis for o in problem.families[fi].options for k in o.usage}
    return [k for k in problem.budgets if k in used]


def priced_bound(
    problem: MixProblem,
    terms: Terms,
    fi: int,
    keys: list[str],
    lam: list[float],
    plan_out: dict[int, tuple[int, float]] | None = None,
    *,
    unit: float = 1.0,
) -> float | None:
    """A lower bound on family ``fi``'s priced optimum: the dual bound of its own ILP.

    ``plan_out`` receives the ILP's plan (counts and quotas per option).
    """
    m, lay = mix_model.build_model(problem, terms, single=False, subset=[fi], cuts=False)
    m.cost = [c / unit for c in m.cost]
    fam = problem.families[fi]
    for oi, o in enumerate(fam.options):
        m.cost[lay.n[fi][oi]] += sum(
            lk * o.usage.get(k, 0.0) for lk, k in zip(lam, keys, strict=True)
        )
    res = mix_model.solve_highs(m, None)
    if res.status != "optimal" or res.bound is None or not math.isfinite(res.bound):
        return None
    if plan_out is not None and res.x is not None:
        plan_out.update(mix_model.extract(problem, lay, res.x).get(fi, {}))
    return min(res.bound, res.objective if res.objective is not None else res.bound)


def build_master(
    problem: MixProblem,
    terms: Terms,
    results: dict[int, tuple[float, list[FamilyPlan]]],
    hard: list[int],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    unit: float = 1.0,
) -> tuple[Any, dict[int, tuple[int, FamilyPlan]], Any]:
    """One binary per (family, plan), hard families in full; the shared budget rows."""
    m, lay = mix_model.build_model(problem, terms, single=False, subset=hard)
    m.cost = [c / unit for c in m.cost]
    rows_k: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in keys}
    hard_keys = budget_keys_used(problem, hard)
    if hard_keys:
        tail = m.rows[len(m.rows) - len(hard_keys) :]
        del m.rows[len(m.rows) - len(hard_keys) :]
        for k, (idx, coef, _, _) in zip(hard_keys, tail, strict=True):
            rows_k[k] = (list(idx), list(coef))
    cols: dict[int, tuple[int, FamilyPlan]] = {}
    for fi, (_, plans) in sorted(results.items()):
        idx = []
        for plan in plans:
            c = m.col(plan.cost, 0.0, 1.0, True)
            cols[c] = (fi, plan)
            idx.append(c)
            for k, u in zip(keys, plan.usage, strict=True):
                if u != 0:
                    rows_k[k][0].append(c)
                    rows_k[k][1].append(u)
        m.row(idx, [1.0] * len(idx), 1.0, 1.0)
    for k, b in zip(keys, budgets, strict=True):
        idx, coef = rows_k[k]
        if idx:
            m.row(idx, coef, -math.inf, b)
    return m, cols, lay
