"""How a new glet schedule differs from the running one: which glets move, and GPU numbers
that keep the glets that stay where they run.

A glet is identified by where it runs and what its executors are: its GPU, its partition
and, per model, the variant and batch size (:func:`glet_key`). A glet whose key is in both
layouts keeps running (only its rates, the dispatcher's quotas, change); every other glet
of either layout starts or stops: it *moves*. The planners number GPUs from 0 in the order
they open them, so a schedule of the same glets can come back with its GPUs numbered
otherwise; :func:`align_gpus` renumbers a new schedule's GPUs so that each takes the
number of the running GPU it shares the most with (an assignment problem, at most
``max_gpus`` on a side).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

GletKey = tuple[int, str, tuple[tuple[str, str, int], ...]]


def glet_key(gpu_index: int, glet: Mapping[str, Any]) -> GletKey:
    """(GPU, partition, its models' (name, variant, batch) in order): what a glet runs."""
    models = tuple(
        sorted(
            (str(m.get("model")), str(m.get("variant")), int(m.get("batch") or 0))
            for m in glet.get("models") or []
        )
    )
    return int(gpu_index), str(glet.get("resource")), models


def _keys(gpus: Sequence[Mapping[str, Any]]) -> Counter[GletKey]:
    return Counter(
        glet_key(int(g.get("index", n)), gl) for n, g in enumerate(gpus) for gl in g["glets"]
    )


def layout_moves(
    running: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> tuple[int, int]:
    """(glets that move, glets of the larger layout) from ``running`` to ``new`` (plans'
    ``gpus``): a glet moves when the other layout has none with its key (it starts or
    stops); the moved share is ``moved / total``."""
    old_keys, new_keys = _keys(running), _keys(new)
    started = sum((new_keys - old_keys).values())
    stopped = sum((old_keys - new_keys).values())
    total = max(sum(old_keys.values()), sum(new_keys.values()))
    return max(started, stopped), total


def align_gpus(
    new: Sequence[Mapping[str, Any]], running: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``new`` (a plan's ``gpus``) with its GPUs renumbered after ``running``'s: each new GPU
    takes the number of the running GPU whose glets it keeps most of (same partition,
    models, variants and batches; a model that stays on the GPU counts a little, so an
    executor restarted for a new batch stays on its GPU), the others the lowest free
    numbers. Sorted by number."""
    from scipy.optimize import linear_sum_assignment

    if not new or not running:
        return [dict(g) for g in new]
    old_idx = [int(g.get("index", n)) for n, g in enumerate(running)]

    def contents(gpu: Mapping[str, Any]) -> tuple[Counter[Any], set[tuple[str, str]]]:
        glets = Counter(glet_key(0, gl)[1:] for gl in gpu["glets"])
        models = {(str(m["model"]), str(m["variant"])) for gl in gpu["glets"] for m in gl["models"]}
        return glets, models

    old_c = [contents(g) for g in running]
    gain = [
        [-(10.0 * sum((a[0] & b[0]).values()) + len(a[1] & b[1])) for b in old_c]
        for a in (contents(g) for g in new)
    ]
    rows, cols = linear_sum_assignment(gain)
    number: dict[int, int] = {
        int(r): old_idx[int(c)] for r, c in zip(rows, cols, strict=True) if gain[r][c] < 0
    }
    free = (i for i in range(len(new) + len(running)) if i not in set(number.values()))
    out = []
    for n, g in enumerate(new):
        out.append({**g, "index": number[n] if n in number else next(free)})
    return sorted(out, key=lambda g: int(g["index"]))
