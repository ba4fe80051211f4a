"""plan mix: the LP relaxation before the ILP (a rounded LP plan as the proven optimum, the
LP's reduced costs bounding the tie-break) decides exactly as the ILPs alone."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix import solve as mix
from greenctl.planner.mix.solve import MixFamily, MixOption, MixProblem, MixVariant, plan_mix
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.planner.test_mix_decomp import feasible, secondary, shared_budget_problems

TOL = 1e-6


@contextmanager
def switches(*, lp_first: bool, decomposition: bool = True) -> Iterator[None]:
    saved = (mix_model.LP_FIRST, mix.DECOMPOSITION)
    mix_model.LP_FIRST, mix.DECOMPOSITION = lp_first, decomposition
    try:
        yield
    finally:
        mix_model.LP_FIRST, mix.DECOMPOSITION = saved


def _plan(problem: MixProblem, *, lp_first: bool, decomposition: bool):
    with switches(lp_first=lp_first, decomposition=decomposition):
        try:
            return plan_mix(problem)
        except mix.InfeasiblePlan:
            return None


@pytest.mark.parametrize("decomposition", [False, True])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_lp_first_decides_as_the_ilp_alone(decomposition: bool, data: st.DataObject) -> None:
    """Same feasibility, the same optimum, a proven status, and a tie-break no worse when
    the two plans tie on the objective (joint ILP and decomposition paths, every objective)."""
    problem = data.draw(shared_budget_problems())
    old = _plan(problem, lp_first=False, decomposition=decomposition)
    new = _plan(problem, lp_first=True, decomposition=decomposition)
    assert (old is None) == (new is None)
    if new is None or old is None:
        return
    info = new.extra["solver"]
    assert info["status"] == "optimal" and info["gap"] <= mix.MIP_REL_GAP
    a, b = new.predicted["objective"], old.predicted["objective"]
    assert abs(a - b) <= TOL * max(1.0, abs(a), abs(b)), (a, b)
    assert feasible(problem, new)
    s_new, s_old = secondary(problem, new), secondary(problem, old)
    tie = abs(a - b) <= 1e-12 * max(1.0, abs(b))
    if (
        tie
        and s_new is not None
        and s_old is not None
        and old.extra["solver"].get("tie_break", {}).get("status") == "finished"
    ):
        assert s_new <= s_old + 1e-6 * max(1.0, abs(s_old)), (s_new, s_old)


def _floored_carbon(n: int) -> MixProblem:
    """``n`` families, two variants each (the accurate one dirtier), an accuracy floor between
    them, generous budgets: the LP relaxation's plan rounds up to the optimum."""
    families = []
    for f in range(n):
        variants = {f"f{f}a": MixVariant(f"f{f}a", 0.6), f"f{f}b": MixVariant(f"f{f}b", 0.8)}
        options = [
            MixOption(variant=v, resource=res, batch=1, capacity_rps=cap, cost_per_hour=price,
                      energy_j_per_request=energy * more, latency_ms=100.0, usage={key: amount})
            for v, energy in ((f"f{f}a", 1.0 + 0.1 * f), (f"f{f}b", 3.0))
            for res, key, amount, cap, price, more in (("cpu:1", "cpu", 1.0, 7.0 + f, 0.04, 1.0),
                                                       ("mig:1g.10gb", "mig", 1.0, 30.0, 0.5, 1.5))
        ]  # fmt: skip
        families.append(MixFamily(f"fam{f}", 40.0 + 3 * f, 500.0, variants, options, 0.7))
    return MixProblem(families=families, budgets={"cpu": 200.0, "mig": 20.0}, objective="carbon")


def test_a_rounded_lp_plan_is_the_proven_optimum() -> None:
    problem = _floored_carbon(4)
    new = _plan(problem, lp_first=True, decomposition=True)
    old = _plan(problem, lp_first=False, decomposition=True)
    assert new is not None and old is not None
    info = new.extra["solver"]
    assert info["method"] == "joint ILP"  # a floor under carbon: no decomposition
    assert info["proof"].startswith("the LP relaxation's plan")
    assert info["status"] == "optimal"
    # within the tie-break's tolerance of the optimum (it may give that up for a cheaper plan)
    rel = 1.01 * mix.TIE_BREAK_REL_TOL
    assert new.predicted["objective"] == pytest.approx(old.predicted["objective"], rel=rel)
    assert info["tie_break"]["objective"] == "cost"
    assert new.predicted["cost_per_hour"] <= old.predicted["cost_per_hour"] + 1e-9


def test_implied_bounds_keep_every_plan_within_the_row_and_cut_the_rest() -> None:
    """Every solution with cost <= rhs lies within the bounds (the ILP optimum does, at the
    optimum's rhs), and they are not vacuous: some quota's upper bound drops below its own."""
    problem = _floored_carbon(3)
    terms = mix.objective_terms(problem)
    model, lay = mix.build_model(problem, terms, single=False)
    unit = mix.objective_unit(problem, model, lay)  # O(1) costs, as the planner solves them
    model.cost = [c / unit for c in model.cost]
    lp = mix.solve_highs(model, None, relax=True)
    ilp = mix.solve_highs(model, None)
    assert lp.row_dual is not None and ilp.x is not None and ilp.objective is not None
    rhs = ilp.objective * (1 + 1e-7)
    lb, ub = mix_model.implied_bounds(model, lp.row_dual, rhs)
    for j, v in enumerate(ilp.x):
        assert lb[j] - 1e-7 <= v <= ub[j] + 1e-7, (j, lb[j], v, ub[j])
    assert all(lo <= hi for lo, hi in zip(lb, ub, strict=True))
    quotas = [j for cols in lay.q.values() for j in cols]
    assert any(ub[j] < 1e-3 * model.ub[j] for j in quotas)
    # a looser rhs never tightens more
    _, ub2 = mix_model.implied_bounds(model, lp.row_dual, rhs + 1.0)
    assert all(u2 >= u - 1e-12 for u, u2 in zip(ub, ub2, strict=True))
    # any prices give valid bounds: zero prices leave only the columns' own costs
    lb0, ub0 = mix_model.implied_bounds(model, [0.0] * len(model.rows), rhs)
    for j, v in enumerate(ilp.x):
        assert lb0[j] - 1e-7 <= v <= ub0[j] + 1e-7


def test_rounded_solution_refuses_a_plan_that_breaks_a_budget() -> None:
    model = mix_model.Model()
    n = model.col(0.0, 0.0, 3.0, True)
    q = model.col(-1.0, 0.0, 10.0)
    model.row([q, n], [1.0, -4.0], -math.inf, 0.0)  # q <= 4 n
    model.row([n], [1.0], -math.inf, 1.5)  # a budget of 1.5 instances
    assert mix_model.rounded_solution(model, [1.5, 6.0]) is None  # n rounds up to 2
    got = mix_model.rounded_solution(model, [0.5, 2.0])
    assert got is not None
    x, value = got
    assert x == [1.0, 2.0] and value == pytest.approx(-2.0)
