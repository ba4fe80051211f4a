"""Clover's graph-based simulated annealing over MIG configurations.

A configuration is Clover's bipartite *configuration graph* (networkx): variant vertices,
slice-profile vertices, and an edge ``(variant, profile)`` whose weight is the number of
instances of that variant on slices of that profile.

Graph edit distance: with unit costs (one per vertex inserted or deleted, one per unit of
edge weight added or removed) the GED between two configuration graphs over the same
labelled vertex sets is exactly ``sum |w - w'|`` over edges plus the symmetric difference
of the vertex sets, so it is computed in linear time on the count vectors instead of with
networkx's exponential ``graph_edit_distance`` (labelled vertices leave nothing to match).

Neighbours are drawn from the configurations within distance 4 of the current one: one or
two random moves, each either re-assigning one instance to another variant on the same
slice profile, or re-partitioning one GPU to another slice multiset (instances on removed
slices leave, new slices get a variant that just left when it fits, else a random one).

Annealing as in Clover: energy ``h = -f * min(1, SLA / p95)``; temperature from 1.0, cooled
by 0.05 per step down to 0.1; a worse neighbour is accepted with probability
``exp(-dh / (T * max(1, |h|)))``; stop after 5 evaluations without improving the best, at
the temperature floor, or at the time limit. Warm start from the previous plan when given.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import networkx as nx
from greenctl.planner.mig.model import Config, Evaluation, MigModel, SolveResult

MAX_DISTANCE = 4


def config_graph(model: MigModel, config: Config) -> nx.Graph:
    """Clover's bipartite configuration graph of a configuration."""
    g = nx.Graph()
    for k, c in enumerate(config.n):
        if c:
            o = model.pairs[k]
            g.add_node(("variant", o.variant), bipartite=0)
            g.add_node(("slice", o.profile), bipartite=1)
            g.add_edge(("variant", o.variant), ("slice", o.profile), weight=c)
    return g


def graph_distance(a: nx.Graph, b: nx.Graph) -> int:
    """Unit-cost graph edit distance between two configuration graphs (labelled vertices)."""
    nodes = len(set(a.nodes) ^ set(b.nodes))
    edges = set(a.edges) | set(b.edges)
    weight = 0
    for u, v in edges:
        wa = a.edges[u, v]["weight"] if a.has_edge(u, v) else 0
        wb = b.edges[u, v]["weight"] if b.has_edge(u, v) else 0
        weight += abs(wa - wb)
    return nodes + weight


def _move_variant(model: MigModel, y: list[int], n: list[int], rng: random.Random) -> bool:
    used = [k for k, c in enumerate(n) if c]
    k = rng.choice(used)
    others = [j for j in model.pairs_of[model.pairs[k].profile] if j != k]
    if not others:
        return False
    j = rng.choice(others)
    n[k] -= 1
    n[j] += 1
    return True


def _move_layout(model: MigModel, y: list[int], n: list[int], rng: random.Random) -> bool:
    if len(model.multisets) < 2:
        return False
    i = rng.choice([m for m, c in enumerate(y) if c])
    j = rng.choice([m for m in range(len(model.multisets)) if m != i])
    y[i] -= 1
    y[j] += 1
    left: list[str] = []
    for p in model.profiles:
        d = model.cnt[j].get(p, 0) - model.cnt[i].get(p, 0)
        for _ in range(max(-d, 0)):
            ks = [k for k in model.pairs_of[p] if n[k]]
            k = rng.choices(ks, weights=[n[k] for k in ks])[0]
            n[k] -= 1
            left.append(model.pairs[k].variant)
    for p in model.profiles:
        d = model.cnt[j].get(p, 0) - model.cnt[i].get(p, 0)
        for _ in range(max(d, 0)):
            same = [k for k in model.pairs_of[p] if model.pairs[k].variant in left]
            k = rng.choice(same or model.pairs_of[p])
            if model.pairs[k].variant in left:
                left.remove(model.pairs[k].variant)
            n[k] += 1
    return True


def neighbour(
    model: MigModel, config: Config, rng: random.Random, *, tries: int = 64
) -> Config | None:
    """A random configuration within graph edit distance 1..4 of ``config``."""
    g0 = config_graph(model, config)
    for _ in range(tries):
        y, n = list(config.y), list(config.n)
        ok = True
        for _m in range(rng.choice((1, 1, 2))):
            move = _move_layout if rng.random() < 0.4 else _move_variant
            ok = move(model, y, n, rng) and ok
        if not ok:
            continue
        cand = Config(tuple(y), tuple(n))
        if cand == config:
            continue
        d = graph_distance(g0, config_graph(model, cand))
        if 0 < d <= MAX_DISTANCE:
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
    t_start: float = 1.0,
    cooling: float = 0.05,
    t_min: float = 0.1,
    patience: int = 5,
) -> SolveResult:
    """Clover's simulated annealing from ``start`` (default BASE)."""
    rng = random.Random(seed)
    t0 = time.perf_counter()
    cur = start or model.base_config
    ev_cur = model.evaluate(cur)
    best, ev_best = cur, ev_cur
    temp = t_start
    stale = 0
    steps = 0
    stop = "temperature"
    while temp > t_min + 1e-9:
        if stale >= patience:
            stop = "patience"
            break
        if time_limit_s is not None and time.perf_counter() - t0 >= time_limit_s:
            stop = "time limit"
            break
        cand = neighbour(model, cur, rng)
        if cand is None:
            stop = "no neighbour"
            break
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
            accept = dh < 0 or rng.random() < math.exp(-dh / (temp * max(1.0, abs(ev_cur.h))))
        if accept:
            cur, ev_cur = cand, ev
        temp -= cooling
    info: dict[str, Any] = {
        "name": "anneal",
        "steps": steps,
        "stop": stop,
        "seed": seed,
        "warm_start": start is not None,
        "distance": "unit-cost GED on count vectors (linear time)",
    }
    if not ev_best.feasible:
        info["reason"] = ev_best.reason
    return SolveResult(best, info)
