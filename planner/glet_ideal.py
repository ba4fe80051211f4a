"""``--algorithm ideal``: exhaustive search over partition combinations of up to 4 GPUs.

Depth-first branch and bound over every way of building the schedule model by model: each
model's rate is placed in chunks, a chunk either filling a glet to its capacity or holding
the rest of the model's rate, on any existing glet (time sharing, if the duty-cycle rule
holds), any empty glet, or a newly opened GPU split in any allowed way (p and
capacity - p, or whole). Symmetric choices (identical empty GPUs, identical empty glets)
are explored once. The search starts from glet's schedule as the incumbent and looks for
one with fewer GPUs, so ``ideal`` is never worse than ``glet`` (when glet needs more than
4 GPUs, ideal searches 4 and otherwise keeps glet's schedule); a lower bound from each
model's best throughput per GPU share prunes branches that cannot fit. A node budget
keeps pathological inputs bounded (``Compiled.ideal_exhaustive`` says whether the search
completed).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from greenctl.planner.glet import Compiled, State

IDEAL_MAX_GPUS = 4
NODE_BUDGET = 60_000
_EPS = 1e-9


class _Budget(Exception):
    pass


def run_ideal(c: Compiled, max_gpus: int, *, node_budget: int = NODE_BUDGET) -> State | None:
    """The schedule with the fewest GPUs (at most ``min(max_gpus, 4)``), or None."""
    from greenctl.planner.glet import _order, run_algorithm

    limit = min(max_gpus, IDEAL_MAX_GPUS)
    incumbent = run_algorithm(c, "glet", max_gpus)
    best = incumbent
    # search below the incumbent, within the exhaustive range of 4 GPUs
    target = min(limit, incumbent.used_gpus - 1) if incumbent is not None else limit
    order = _order(c, "demand_desc")
    # optimistic req/s per unit of GPU share for each model (no interference)
    eff = [
        max(
            (c.cap(i, j, None) / c.units[j] for j in range(c.n_parts) if c.batches[i][j]),
            default=0.0,
        )
        for i in range(c.n)
    ]
    c.ideal_exhaustive = True
    nodes = [0]
    while target >= 1:
        from greenctl.planner.glet import State as _State

        state = _State(c, target)
        try:
            found = _dfs(
                c, state, order, 0, c.rate[order[0]] if order else 0.0, eff, nodes, node_budget
            )
        except _Budget:
            c.ideal_exhaustive = False
            found = None
        if found is None:
            break
        best = found
        target = found.used_gpus - 1
    return best


def _free_units(c: Compiled, state: State) -> float:
    total = (state.max_gpus - len(state.gpus)) * c.capacity
    for gpu in state.gpus:
        for g in gpu.glets:
            busy = 0.0
            for i, r in g.entries:
                cap = c.cap(i, g.j, None)
                busy += r / cap if cap > 0 else 1.0
            total += c.units[g.j] * max(0.0, 1.0 - busy)
    return total


def _dfs(
    c: Compiled,
    state: State,
    order: list[int],
    pos: int,
    remaining: float,
    eff: list[float],
    nodes: list[int],
    budget: int,
) -> State | None:
    from greenctl.planner.glet import _add_entry

    nodes[0] += 1
    if nodes[0] > budget:
        raise _Budget
    while remaining <= _EPS:
        pos += 1
        if pos >= len(order):
            return state.copy()
        remaining = c.rate[order[pos]]
    i = order[pos]
    need = remaining / eff[i] if eff[i] > 0 else float("inf")
    need += sum(c.rate[k] / eff[k] if eff[k] > 0 else float("inf") for k in order[pos + 1 :])
    if need > _free_units(c, state) + 1e-6:
        return None

    # 1. time-share the whole remainder on a glet already in use
    for gi, gpu in enumerate(state.gpus):
        for li, g in enumerate(gpu.glets):
            if not g.entries:
                continue
            merged = _add_entry(g.entries, i, remaining)
            if state.check_with(gi, li, merged):
                saved = g.entries
                g.entries = merged
                out = _dfs(c, state, order, pos, 0.0, eff, nodes, budget)
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
            out = _try_fill(c, state, gi, li, i, remaining, order, pos, eff, nodes, budget)
            if out is not None:
                return out

    # 3. open a GPU: whole, or split with the model on either part
    if len(state.gpus) < state.max_gpus:
        options = [c.full] + [j for j in c.splits if j != c.full]
        for j in options:
            gi = state.open_gpu(j)
            assert gi is not None
            li = next(n for n, g in enumerate(state.gpus[gi].glets) if g.j == j)
            out = _try_fill(c, state, gi, li, i, remaining, order, pos, eff, nodes, budget)
            state.gpus.pop()
            if out is not None:
                return out
    return None


def _try_fill(
    c: Compiled,
    state: State,
    gi: int,
    li: int,
    i: int,
    remaining: float,
    order: list[int],
    pos: int,
    eff: list[float],
    nodes: list[int],
    budget: int,
) -> State | None:
    glet = state.gpus[gi].glets[li]
    cap = c.cap(i, glet.j, state.w_for(gi, li, assume_worst=True))
    x = min(remaining, cap * (1 - 1e-9))
    if x <= _EPS or not state.check_with(gi, li, [(i, x)]):
        return None
    glet.entries = [(i, x)]
    out = _dfs(c, state, order, pos, remaining - x, eff, nodes, budget)
    glet.entries = []
    return out
