"""BLOVER-style random search for ``plan mig`` (Clover's random baseline).

Samples the raw space: every GPU draws a uniformly random valid maximal layout (a
placement, so multisets with more placements are likelier, as in the raw space) and every
instance a uniformly random variant that fits its slice. Keeps the best by Clover's energy
``h``; stops after 5 evaluations without improvement (the annealer's rule) or at the time
limit.
"""

from __future__ import annotations

import random
import time
from typing import Any

from greenctl.data.mig_geometry import enumerate_layouts, multiset
from greenctl.planner.mig.anneal import better
from greenctl.planner.mig.model import Config, Evaluation, MigModel, SolveResult


def random_config(model: MigModel, rng: random.Random) -> Config:
    """One configuration drawn from the raw (layout per GPU, variant per slice) space."""
    layouts = model.__dict__.get("_all_layouts")
    if layouts is None:
        index = {m: i for i, m in enumerate(model.multisets)}
        layouts = [
            (index[multiset(model.geo, lay)], lay)
            for lay in enumerate_layouts(model.geo, profiles=model.profiles)
        ]
        model.__dict__["_all_layouts"] = layouts
    y = [0] * len(model.multisets)
    n = [0] * len(model.pairs)
    for _ in range(model.problem.gpus):
        m, lay = rng.choice(layouts)
        y[m] += 1
        for pl in lay:
            n[rng.choice(model.pairs_of[pl.profile])] += 1
    return Config(tuple(y), tuple(n))


def random_search(
    model: MigModel,
    *,
    time_limit_s: float | None = None,
    seed: int | None = None,
    patience: int = 5,
    max_evaluations: int = 10000,
) -> SolveResult:
    """Random search with Clover's stopping rule."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    best: Config | None = None
    ev_best: Evaluation | None = None
    stale = 0
    steps = 0
    stop = "patience"
    while stale < patience and steps < max_evaluations:
        if time_limit_s is not None and time.perf_counter() - t0 >= time_limit_s:
            stop = "time limit"
            break
        cfg = random_config(model, rng)
        ev = model.evaluate(cfg)
        steps += 1
        if better(ev, ev_best):
            best, ev_best = cfg, ev
            stale = 0
        else:
            stale += 1
    info: dict[str, Any] = {"name": "random", "steps": steps, "stop": stop, "seed": seed}
    if ev_best is None:
        info["reason"] = "the time limit ran out before any configuration was evaluated"
    elif not ev_best.feasible:
        info["reason"] = ev_best.reason
    return SolveResult(best, info)
