"""plan mix: the tie-break after the proven optimum runs within what is left of the planning
budget, keeps its best plan when it stops there (optimal in the primary objective all the
same) and says in the solver report whether it finished or stopped at its budget."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from greenctl.planner.mix import budget as mix_budget
from greenctl.planner.mix import decomp as mix_decomp
from greenctl.planner.mix import solve as mix
from greenctl.planner.mix.solve import MixFamily, MixOption, MixProblem, MixVariant, plan_mix

from tests.planner.test_mix_decomp import feasible

#: (resource, budget key, amount, capacity multiplier, price USD/h, power W) of each size.
SIZES = [
    ("cpu:1", "cpu", 1.0, 1.0, 0.04, 10.0),
    ("cpu:4", "cpu", 4.0, 3.6, 0.16, 40.0),
    ("mig:1g.10gb", "mig", 1.0, 9.0, 0.50, 60.0),
]


def fleet(objective: str, families: int = 12, floored: bool = False) -> MixProblem:
    """A seeded fleet of ``families`` x 4 variants x 3 sizes sharing a cpu and a mig budget
    (binding for the most accurate variants), as bench/bench_mix.py's scale case; ``floored``:
    an accuracy floor just below the least accurate family's best variant."""
    rng = random.Random(7)
    fams = []
    for f in range(families):
        accs = sorted(rng.uniform(0.6, 0.85) for _ in range(4))
        base = 60.0 * rng.uniform(0.7, 1.3)
        variants, options = {}, []
        for i, acc in enumerate(accs):
            name = f"fam{f}v{i}"
            variants[name] = MixVariant(name, acc, 2.0 + i)
            speed = base / 1.45**i
            for label, key, amount, mult, price, power in SIZES:
                cap = speed * mult * rng.uniform(0.9, 1.1)
                options.append(
                    MixOption(variant=name, resource=label, batch=1, capacity_rps=cap,
                              cost_per_hour=price, energy_j_per_request=power / (1.15 * cap),
                              latency_ms=100.0, usage={key: amount})
                )  # fmt: skip
        fams.append(MixFamily(f"fam{f}", rng.uniform(20, 200), 500.0, variants, options))
    if floored:
        floor = min(max(v.accuracy for v in fam.variants.values()) for fam in fams) - 0.03
        for fam in fams:
            fam.min_accuracy = floor
    total = sum(f.rate_rps for f in fams)
    budgets = {"cpu": round(total / 60 * 6), "mig": round(total / 60 * 1)}
    return MixProblem(families=fams, budgets=budgets, objective=objective)


@contextmanager
def budget(seconds: float, floor: float) -> Iterator[None]:
    """The planning budget and the tie-break's least time, for one block."""
    saved = (mix_budget.PLANNING_BUDGET_S, mix_budget.TIE_BREAK_MIN_S)
    mix_budget.PLANNING_BUDGET_S, mix_budget.TIE_BREAK_MIN_S = seconds, floor
    try:
        yield
    finally:
        mix_budget.PLANNING_BUDGET_S, mix_budget.TIE_BREAK_MIN_S = saved


def test_the_budget_is_what_is_left_of_the_planning_budget() -> None:
    now = time.perf_counter()
    assert mix_budget.tie_break_seconds(now - 5.0) == mix_budget.TIE_BREAK_MIN_S
    assert mix_budget.tie_break_seconds(now - 5.0, 0.01) == mix_budget.TIE_BREAK_MIN_S
    fresh = mix_budget.tie_break_seconds(time.perf_counter())
    assert mix_budget.TIE_BREAK_MIN_S < fresh <= mix_budget.PLANNING_BUDGET_S
    assert mix_budget.tie_break_seconds(time.perf_counter(), 0.3) == 0.3


def test_the_budget_keeps_time_for_writing_the_plan_of_every_family() -> None:
    """The tie-break stops early enough for the plan's prediction to end within the budget:
    the time kept grows with the families, down to the least time at the largest fleets."""
    per = mix_budget.PLAN_WRITE_S_PER_FAMILY
    few = mix_budget.tie_break_seconds(time.perf_counter(), families=10)
    many = mix_budget.tie_break_seconds(time.perf_counter(), families=100)
    assert many <= mix_budget.PLANNING_BUDGET_S - 100 * per < few
    assert few <= mix_budget.PLANNING_BUDGET_S - 10 * per
    huge = round(mix_budget.PLANNING_BUDGET_S / per) + 1
    assert mix_budget.tie_break_seconds(time.perf_counter(), families=huge) == (
        mix_budget.TIE_BREAK_MIN_S
    )


CASES = [("accuracy", False), ("cost", True), ("carbon", True)]


@pytest.mark.parametrize(("objective", "floored"), CASES)
def test_a_stopped_tie_break_keeps_the_proven_optimum(objective: str, floored: bool) -> None:
    """With no budget left the tie-break stops at once: the plan is still the proven optimum
    of the primary objective, feasible, and the report says the tie-break stopped."""
    problem = fleet(objective, 4, floored)
    full = plan_mix(fleet(objective, 4, floored))
    with budget(0.0, 1e-6):
        cut = plan_mix(problem)
    tb_full, tb_cut = full.extra["solver"]["tie_break"], cut.extra["solver"]["tie_break"]
    assert tb_full["objective"] == tb_cut["objective"] == mix_decomp.tie_break(objective)
    assert tb_full["status"] in ("finished", "stopped at its budget")  # (tiny: it finishes)
    assert 0.0 < tb_full["budget_s"] <= mix_budget.PLANNING_BUDGET_S
    assert tb_cut["status"] == "stopped at its budget"
    assert cut.extra["solver"]["status"] == "optimal"
    a, b = cut.predicted["objective"], full.predicted["objective"]
    assert a == pytest.approx(b, rel=1.01 * mix.TIE_BREAK_REL_TOL, abs=1e-15)
    assert feasible(problem, cut)
