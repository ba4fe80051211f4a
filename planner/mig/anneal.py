"""Clover's graph-based simulated annealing over MIG configurations.

Follows the annealer of Clover's artifact (SC'23; ``system/clover.py`` and
``SimulatedAnneling`` in ``system/system_utils.py``), translated from one GPU to ``N``.

A configuration is Clover's bipartite *configuration graph*: a vertex per variant and per
slice profile, and an edge ``(variant, profile)`` whose weight is the number of instances
of that variant on slices of that profile, i.e. the counts ``Config.n``. Clover's graph
describes one GPU, whose partition and variants every GPU of the service runs; greenctl's
graph sums ``N`` GPUs that may differ.

* Distance: the Manhattan distance between the graphs' edge-weight vectors,
  ``sum_k |n_k - n'_k|``. Every vertex is always in Clover's graph (edges of weight 0), so
  there is no vertex term.
* Neighbours: configurations within distance 4 *per GPU* (``4 N`` on the summed graph: a
  Clover step re-partitions or swaps variants on every GPU at once) that this run has not
  evaluated yet, drawn at random: one or two moves, each a partition change of ``c`` GPUs
  from one slice multiset to another (instances on removed slices leave; every new slice
  gets a uniformly random variant, as Clover's random draw gives it) or a variant swap of
  ``c`` instances on one profile, ``c`` uniform over what is there. 400 draws without a new
  neighbour mean every neighbour was evaluated (Clover's ``no_neighbor_limit``).
* Energy: ``h = -f * min(1, SLA / p95)`` (:attr:`Evaluation.h`), Clover's
  ``score * SLA / latency``.
* Schedule: temperature 100, lowered by 5 per evaluation and then held at 10 (the floor is
  not a stop); a worse neighbour becomes the centre with probability ``exp(-dh / (K T))``,
  ``K = 1e-4`` on the objective as a fraction, so ``1e-2`` in ``h``'s percentage points:
  from 1 point at the start to 0.1 at the floor, whatever the size of ``h``.
* Stopping: 5 evaluations in a row without improving the best configuration, or 20
  evaluations, each only once a configuration meeting the SLA has been found; no
  neighbour left, the time limit and a cap of 1,000 evaluations stop it regardless.

Warm start from the previous plan when given (Clover starts each re-plan from the running
configuration).
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
