"""The mix planner's time budget: how long the tie-break may refine a proven optimum.

The primary optimum is what a plan promises; the tie-break (the best secondary objective
among plans within the optimum's tolerance) is a refinement, so it gets what is left of one
planning budget once the optimum is proven, and keeps its best incumbent when it stops
there. Every solve path (joint ILP, decomposition master, priced plans then the full
tie-break ILP) asks :func:`tie_break_seconds`, the one place that decides it.
"""

from __future__ import annotations

import time

#: The planning budget (s from the start of the solve to the plan written).
PLANNING_BUDGET_S = 1.0
#: The least time a tie-break gets, however much of the budget the proof took.
TIE_BREAK_MIN_S = 0.05
#: Kept per family for writing the plan once solved (its prediction by the evaluation core):
#: it took 0.9-1.7 ms per family at 100 families on a 2-core machine, idle to loaded.
PLAN_WRITE_S_PER_FAMILY = 0.002
#: The tie-break's reported status per solver status (others are reported as they are).
TIE_BREAK_STATUS = {"optimal": "finished", "time_limit": "stopped at its budget"}


def tie_break_seconds(started: float, limit_s: float | None = None, *, families: int = 0) -> float:
    """How long the tie-break may run: the planning budget left since ``started``, less the
    time kept for writing the plan of ``families`` families (at least TIE_BREAK_MIN_S), and
    never past ``limit_s`` (the solve's time limit left) when given."""
    spent = time.perf_counter() - started + PLAN_WRITE_S_PER_FAMILY * families
    left = max(PLANNING_BUDGET_S - spent, TIE_BREAK_MIN_S)
    return left if limit_s is None else min(left, max(limit_s, TIE_BREAK_MIN_S))
