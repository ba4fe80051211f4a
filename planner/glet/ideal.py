"""``--algorithm ideal``: exhaustive search over partition combinations of up to 4 GPUs.

Depth-first branch and bound placing each model's rate in chunks on existing glets (time
sharing), empty glets or a newly split GPU, with symmetric choices explored once. It starts
from glet's schedule as the incumbent, so ``ideal`` is never worse than ``glet``; a lower
bound from each model's best throughput per GPU share prunes, and a node budget bounds
pathological inputs (``Compiled.ideal_exhaustive`` says whether the search completed).
The search is described in docs/models.md ("The ideal glet search").
"""

from __future__ import annotations

from dataclasses import dataclass, field

from greenctl.planner.glet.model import EPS, Compiled, Glet, State, add_entry, model_order

IDEAL_MAX_GPUS = 4
NODE_BUDGET = 60_000


class _Budget(Exception):
    pass


@dataclass
class _Search:
    """What stays fixed over one search (the order, the efficiency bounds, the budget) and
    what it counts (nodes visited, signatures known to fail)."""

    c: Compiled
    order: list[int]
    eff: list[float]
    budget: int
    nodes: list[int]
    failed: set[tuple[object, ...]] = field(default_factory=set)


def run_ideal(
    c: Compiled,
    max_gpus: int,
    *,
    incumbent: State | None,
    node_budget: int = NODE_BUDGET,
) -> State | None:
    """The schedule with the fewest GPUs (at most ``min(max_gpus, 4)``), or None.

    Args:
        c: the compiled problem.
        max_gpus: the most GPUs a schedule may use.
        incumbent: the schedule to beat (``glet``'s), returned when nothing uses fewer GPUs.
        node_budget: the most search nodes before giving up on exhaustiveness.
    """
    limit = min(max_gpus, IDEAL_MAX_GPUS)
    best = incumbent
    # search below the incumbent, within the exhaustive range of 4 GPUs
    target = min(limit, incumbent.used_gpus - 1) if incumbent is not None else limit
    order = model_order(c, "demand_desc")
    # Optimistic req/s per unit of GPU capacity for each model: a whole GPU without
    # interference; a split glet either beside the mildest co-runner of the problem, or
    # alone on its GPU (then the whole GPU's capacity counts).
    eff = [_best_efficiency(c, i) for i in range(c.n)]
    c.ideal_exhaustive = True
    nodes = [0]
    failed: set[tuple[object, ...]] = set()
    while target >= 1:
        state = State(c, target)
        try:
            failed.clear()
            search = _Search(c, order, eff, node_budget, nodes, failed)
            found = _dfs(search, state, 0, c.rate[order[0]] if order else 0.0, (-1, -1))
        except _Budget:
            c.ideal_exhaustive = False
            found = None
        if found is None:
            break
        best = found
        target = found.used_gpus - 1
    return best


def _w_min(c: Compiled, j: int) -> float | None:
    """The mildest co-runner term any problem model puts on a glet beside partition j."""
    if not c.interference_on:
        return None
    return min(c.w_other[m][j] for m in range(c.n))


def _best_efficiency(c: Compiled, i: int) -> float:
    best = c.cap(i, c.full, None) / c.capacity
    for j in c.splits:
        comp = c.complement[j]
        if j == c.full or comp is None:
            continue
        best = max(best, c.cap(i, j, None) / c.capacity)
        best = max(best, c.cap(i, j, _w_min(c, comp)) / c.units[j])
    return best


def _load(c: Compiled, g: Glet, w: float | None) -> float:
    busy = 0.0
    for i, r in g.entries:
        cap = c.cap(i, g.j, w)
        busy += r / cap if cap > 0 else float("inf")
    return busy


def _free_units(c: Compiled, state: State) -> float:
    """An upper bound on the GPU capacity (in units) still usable, matching _best_efficiency."""
    total = float((state.max_gpus - len(state.gpus)) * c.capacity)
    for gi, gpu in enumerate(state.gpus):
        used = [g for g in gpu.glets if g.entries]
        if not used:
            total += c.capacity
        elif len(gpu.glets) == 1:
            total += c.capacity * max(0.0, 1.0 - _load(c, used[0], None))
        elif len(used) == 2:
            for li, g in enumerate(gpu.glets):
                w = state.w_for(gi, li, assume_worst=False)
                total += c.units[g.j] * max(0.0, 1.0 - _load(c, g, w))
        else:
            a = used[0]
            b = gpu.glets[1] if gpu.glets[0] is a else gpu.glets[0]
            alone = c.capacity * max(0.0, 1.0 - _load(c, a, None))
            shared = c.units[a.j] * max(0.0, 1.0 - _load(c, a, _w_min(c, b.j))) + c.units[b.j]
            total += max(alone, shared)
    return total


def _signature(
    state: State, pos: int, remaining: float, min_key: tuple[int, int]
) -> tuple[object, ...]:
    """The search state: what is placed where, what is left, and the order constraint."""
    gpus = tuple(
        tuple((g.j, tuple(sorted((i, round(r, 6)) for i, r in g.entries))) for g in gpu.glets)
        for gpu in state.gpus
    )
    return (pos, round(remaining, 6), gpus, min_key)


def _dfs(
    search: _Search, state: State, pos: int, remaining: float, min_key: tuple[int, int]
) -> State | None:
    """Place the rest of model ``order[pos]`` (``remaining``), then the following models.

    ``min_key``: the (gpu, glet) of the model's previous full chunk; full chunks of one model
    go to glets in increasing position, so permutations of the same chunks are tried once.
    """
    c, order, eff, failed = search.c, search.order, search.eff, search.failed
    search.nodes[0] += 1
    if search.nodes[0] > search.budget:
        raise _Budget
    while remaining <= EPS:
        pos += 1
        min_key = (-1, -1)
        if pos >= len(order):
            return state.copy()
        remaining = c.rate[order[pos]]
    i = order[pos]
    need = remaining / eff[i] if eff[i] > 0 else float("inf")
    need += sum(c.rate[k] / eff[k] if eff[k] > 0 else float("inf") for k in order[pos + 1 :])
    if need > _free_units(c, state) + 1e-6:
        return None
    sig = _signature(state, pos, remaining, min_key)
    if sig in failed:
        return None

    # 1. time-share the whole remainder on a glet already in use
    for gi, gpu in enumerate(state.gpus):
        for li, g in enumerate(gpu.glets):
            if not g.entries:
                continue
            merged = add_entry(g.entries, i, remaining)
            if state.check_with(gi, li, merged):
                saved = g.entries
                g.entries = merged
                out = _dfs(search, state, pos, 0.0, min_key)
                g.entries = saved
                if out is not None:
                    return out

    # 2. an empty glet of an opened GPU (one per distinct (size, co-runner) class)
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for gi, gpu in enumerate(state.gpus):
        for li, g in enumerate(gpu.glets):
            if g.entries:
                continue
            mate = state.mate(gi, li)
            key = (g.j, tuple(sorted(k for k, _ in mate.entries)) if mate else (-1,))
            if key in seen:
                continue
            seen.add(key)
            out = _try_fill(search, state, (gi, li), i, remaining, pos, min_key)
            if out is not None:
                return out

    # 3. open a GPU: whole, or split with the model on either part
    if len(state.gpus) < state.max_gpus:
        options = [c.full] + [j for j in c.splits if j != c.full]
        for j in options:
            opened = state.open_gpu(j)
            assert opened is not None
            li = next(n for n, g in enumerate(state.gpus[opened].glets) if g.j == j)
            out = _try_fill(search, state, (opened, li), i, remaining, pos, min_key)
            state.gpus.pop()
            if out is not None:
                return out
    failed.add(sig)
    return None


def _try_fill(
    search: _Search,
    state: State,
    at: tuple[int, int],
    i: int,
    remaining: float,
    pos: int,
    min_key: tuple[int, int],
) -> State | None:
    """Put a chunk of model ``i`` on the empty glet ``at`` (gpu, glet): as much of the rest
    as fits, then search on."""
    c = search.c
    gi, li = at
    glet = state.gpus[gi].glets[li]
    cap = c.cap(i, glet.j, state.w_for(gi, li, assume_worst=True))
    x = min(remaining, cap * (1 - 1e-9))
    full = x < remaining
    if x <= EPS or (full and (gi, li) < min_key):
        return None
    if not state.check_with(gi, li, [(i, x)]):
        return None
    glet.entries = [(i, x)]
    out = _dfs(search, state, pos, remaining - x, (gi, li) if full else min_key)
    glet.entries = []
    return out
