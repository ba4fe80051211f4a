"""The exact memo of repeated HiGHS problems (planner.core.solvers.solve_memo)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from greenctl.planner.core import solvers
from greenctl.planner.mix import model as mix_model


def _knapsack(load: float, caps=(3.0, 5.0, 7.0), costs=(1.0, 1.6, 2.1)) -> mix_model.Model:
    """min cost . n  s.t.  caps . n >= load, n integer in [0, 20]."""
    m = mix_model.Model()
    cols = [m.col(c, 0.0, 20.0, True) for c in costs]
    m.row(cols, list(caps), load, math.inf)
    return m


def _same(a: mix_model.SolveResult, b: mix_model.SolveResult) -> bool:
    return (a.status, a.x, a.objective, a.bound, a.gap) == (
        b.status,
        b.x,
        b.objective,
        b.bound,
        b.gap,
    )


def test_a_repeated_problem_is_answered_as_a_fresh_run_answers_it():
    fresh = [mix_model.solve_highs(_knapsack(load), None) for load in (10.0, 23.0, 10.0)]
    with solvers.solve_memo() as memo:
        again = [mix_model.solve_highs(_knapsack(load), None) for load in (10.0, 23.0, 10.0)]
        start = [0.0, 0.0, 2.0]  # the same problem with a start is another key
        with_start = mix_model.solve_highs(_knapsack(10.0), None, start)
    assert all(_same(a, b) for a, b in zip(fresh, again, strict=True))
    assert with_start.objective == pytest.approx(fresh[0].objective)
    assert memo.stats() == {
        "highs_runs": 4,
        "highs_memo_hits": 1,
        "highs_solved": 3,
        "highs_saved_s": pytest.approx(memo.saved_s, abs=1e-3),
    }
    assert solvers.active_memo() is None  # only inside the block


def test_infeasible_and_options_are_part_of_the_answer():
    with solvers.solve_memo() as memo:
        bad = mix_model.solve_highs(_knapsack(1000.0), None)
        assert bad.status == "infeasible"
        assert mix_model.solve_highs(_knapsack(1000.0), None).status == "infeasible"
        # another option is another problem (here the relative gap)
        mix_model.solve_highs(_knapsack(10.0), None)
        mix_model.solve_highs(_knapsack(10.0), None, rel_gap=0.5)
    assert (memo.hits, memo.misses) == (1, 3)


def test_a_finished_run_serves_longer_time_limits_only():
    with solvers.solve_memo() as memo:
        mix_model.solve_highs(_knapsack(10.0), 30.0)
        mix_model.solve_highs(_knapsack(10.0), None)  # no limit: at least as long
        assert memo.hits == 1
        memo.entries[next(iter(memo.entries))] = _slow(memo)
        mix_model.solve_highs(_knapsack(10.0), 1.0)  # "took" 5 s: solved again
    assert (memo.hits, memo.misses) == (1, 2)


def _slow(memo: solvers.SolveMemo) -> object:
    from dataclasses import replace

    return replace(next(iter(memo.entries.values())), seconds=5.0)


def test_unknown_calls_solve_for_real():
    """Another method after a remembered run reads the real object, solved."""
    import highspy

    with solvers.solve_memo() as memo:
        for _ in range(2):
            h = solvers.new_highs({"presolve": "off"})
            lp = highspy.HighsLp()
            lp.num_col_, lp.num_row_ = 1, 1
            lp.col_cost_ = np.array([1.0])
            lp.col_lower_, lp.col_upper_ = np.array([0.0]), np.array([10.0])
            lp.row_lower_, lp.row_upper_ = np.array([2.5]), np.array([highspy.kHighsInf])
            lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
            lp.a_matrix_.start_ = np.array([0, 1], dtype=np.int32)
            lp.a_matrix_.index_ = np.array([0], dtype=np.int32)
            lp.a_matrix_.value_ = np.array([1.0])
            h.passModel(lp)
            h.run()
            assert solvers.highs_outcome(h, what="t") == solvers.OPTIMAL
            assert h.getInfo().objective_function_value == pytest.approx(2.5)
            assert h.getObjectiveValue() == pytest.approx(2.5)  # not memoised: real
        assert (memo.hits, memo.misses) == (1, 1)
        # a model built call by call (as pulp builds it) is not keyed: solved as usual
        h = solvers.new_highs()
        h.addVar(0.0, 4.0)
        h.changeColCost(0, -1.0)
        h.run()
        assert h.getInfo().objective_function_value == pytest.approx(-4.0)
        assert memo.unkeyed == 1


def test_pulp_through_the_memo():
    pulp = pytest.importorskip("pulp")
    with solvers.solve_memo() as memo:
        for _ in range(2):
            prob = pulp.LpProblem("t", pulp.LpMinimize)
            x = prob.add_variable("x", lowBound=0, upBound=10, cat=pulp.LpInteger)
            prob += x
            prob += x >= 2.5
            prob.solve(solvers.pulp_highs({"mip_rel_gap": 0.0}))
            assert x.value() == pytest.approx(3.0)
    assert memo.hits == 0 and memo.unkeyed == 2


def test_nested_blocks_share_one_memo_and_it_is_bounded():
    with solvers.solve_memo(max_entries=2) as outer, solvers.solve_memo() as inner:
        assert inner is outer
        for load in (10.0, 11.0, 12.0):
            mix_model.solve_highs(_knapsack(load), None)
        assert len(outer.entries) == 2
        mix_model.solve_highs(_knapsack(10.0), None)  # dropped first: solved again
        assert outer.hits == 0
