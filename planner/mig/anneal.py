"""Clover's graph-based simulated annealing over MIG configurations.

Follows the annealer of Clover's artifact (SC'23, ``system/clover.py``), from one GPU to
``N``. A configuration is the bipartite graph of (variant, slice profile) instance counts
``Config.n``, summed over ``N`` GPUs; distance is the Manhattan distance of the counts.
Neighbours: unevaluated configurations within ``4 N``, one or two random moves (a
partition change or a variant swap of ``c`` GPUs or instances). Energy
``h = -f * min(1, SLA / p95)`` (:attr:`Evaluation.h`). Temperature 100, minus 5 per
evaluation, held at 10; stop after 5 evaluations without improvement or 20 in all, once
the SLA is met, or on no neighbour, the time limit or 1,000 evaluations. Warm-starts from
the previous plan when given, as Clover re-plans from the running configuration.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Collection
from typing import Any

import networkx as nx
from greenctl.planner.mig.model import Config, Evaluation, MigModel, SolveResult

MAX_DISTANCE = 4  # per GPU (Clover's neighbor_thres)
NEIGHBOUR_TRIES = 400  # Clover's no_neighbor_limit
T_START, T_STEP, T_FINAL = 100.0, 5.0, 10.0  # Clover's init_temp, delta_temp, final_temp
K = 1e-4  # Clover's K, on the objective as a fraction
PATIENCE = 5  # Clover's no_improv_limit
BUDGET = 20  # Clover's iter_limit: evaluations per re-plan
MAX_EVALUATIONS = 1000  # a guard for problems where nothing meets the SLA
P_REPARTITION = 0.4  # share of partition changes among the moves


def config_graph(model: MigModel, config: Config) -> nx.Graph:
    """Clover's configuration graph: every variant and profile, edges weighted by counts."""
    g = nx.Graph()
    for o in model.pairs:
        g.add_node(("variant", o.variant), bipartite=0)
        g.add_node(("slice", o.profile), bipartite=1)
    for k, o in enumerate(model.pairs):
        g.add_edge(("variant", o.variant), ("slice", o.profile), weight=config.n[k])
    return g


def graph_distance(a: nx.Graph, b: nx.Graph) -> int:
    """Clover's distance: Manhattan distance between the graphs' edge-weight vectors."""
    edges = set(a.edges) | set(b.edges)
    return sum(
        abs(
            (a.edges[e]["weight"] if a.has_edge(*e) else 0)
            - (b.edges[e]["weight"] if b.has_edge(*e) else 0)
        )
        for e in edges
    )


def distance(a: Config, b: Config) -> int:
    """:func:`graph_distance` of two configurations' graphs, on their counts."""
    return sum(abs(x - y) for x, y in zip(a.n, b.n, strict=True))


def _swap_variants(model: MigModel, y: list[int], n: list[int], rng: random.Random) -> bool:
    used = [k for k, c in enumerate(n) if c]
    k = rng.choice(used)
    others = [j for j in model.pairs_of[model.pairs[k].profile] if j != k]
    if not others:
        return False
    j = rng.choice(others)
    c = rng.randint(1, n[k])
    n[k] -= c
    n[j] += c
    return True


def _repartition(model: MigModel, y: list[int], n: list[int], rng: random.Random) -> bool:
    if len(model.multisets) < 2:
        return False
    i = rng.choice([m for m, c in enumerate(y) if c])
    j = rng.choice([m for m in range(len(model.multisets)) if m != i])
    c = rng.randint(1, y[i])
    y[i] -= c
    y[j] += c
    for p in model.profiles:
        d = c * (model.cnt[j].get(p, 0) - model.cnt[i].get(p, 0))
        for _ in range(-d):  # a removed slice: one of its instances leaves
            ks = [k for k in model.pairs_of[p] if n[k]]
            n[rng.choices(ks, weights=[n[k] for k in ks])[0]] -= 1
        for _ in range(d):  # a new slice: a random variant that fits it
            n[rng.choice(model.pairs_of[p])] += 1
    return True


def neighbour(
    model: MigModel,
    config: Config,
    rng: random.Random,
    *,
    seen: Collection[Config] = (),
    tries: int = NEIGHBOUR_TRIES,
) -> Config | None:
    """A random configuration within distance ``4 N`` of ``config``, not in ``seen``."""
    radius = MAX_DISTANCE * model.problem.gpus
    for _ in range(tries):
        y, n = list(config.y), list(config.n)
        ok = True
        for _m in range(rng.choice((1, 2))):
            move = _repartition if rng.random() < P_REPARTITION else _swap_variants
            ok = move(model, y, n, rng) and ok
        if not ok:
            continue
        cand = Config(tuple(y), tuple(n))
        if cand == config or cand in seen:
            continue
        if distance(config, cand) <= radius:
            return cand
    return None


def better(a: Evaluation, b: Evaluation | None) -> bool:
    """Feasible beats infeasible; then lower ``h``."""
    if b is None:
        return True
    if a.feasible != b.feasible:
        return a.feasible
    return a.h < b.h - 1e-12


def anneal(
    model: MigModel,
    *,
    start: Config | None = None,
    time_limit_s: float | None = None,
    seed: int | None = None,
    t_start: float = T_START,
    cooling: float = T_STEP,
    t_final: float = T_FINAL,
    k: float = K,
    patience: int = PATIENCE,
    budget: int = BUDGET,
    max_evaluations: int = MAX_EVALUATIONS,
) -> SolveResult:
    """Clover's simulated annealing from ``start`` (default BASE); see the module doc."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    cur = start or model.base_config
    ev_cur = model.evaluate(cur)
    best, ev_best = cur, ev_cur
    seen = {cur}
    temp = t_start
    scale = k * 100.0  # K is on the objective as a fraction; h is in percentage points
    stale = 0
    steps = 0
    while True:
        if ev_best.feasible and stale >= patience:
            stop = "patience"
            break
        if ev_best.feasible and steps >= budget:
            stop = "budget"
            break
        if steps >= max_evaluations:
            stop = "evaluation cap"
            break
        if time_limit_s is not None and time.perf_counter() - t0 >= time_limit_s:
            stop = "time limit"
            break
        cand = neighbour(model, cur, rng, seen=seen)
        if cand is None:
            stop = "no neighbour"
            break
        seen.add(cand)
        ev = model.evaluate(cand)
        steps += 1
        if better(ev, ev_best):
            best, ev_best = cand, ev
            stale = 0
        else:
            stale += 1
        dh = ev.h - ev_cur.h
        if not math.isfinite(dh):
            accept = dh < 0
        else:
            accept = dh <= 0 or rng.random() < math.exp(-dh / (scale * temp))
        if accept:
            cur, ev_cur = cand, ev
        temp = max(temp - cooling, t_final)
    info: dict[str, Any] = {
        "name": "anneal",
        "steps": steps,
        "stop": stop,
        "seed": seed,
        "warm_start": start is not None,
        "distance": f"Manhattan on the configuration graph's edge weights, <= "
        f"{MAX_DISTANCE} per GPU",
    }
    if not ev_best.feasible:
        info["reason"] = ev_best.reason
    return SolveResult(best, info)
