"""Which glets a new schedule moves, and GPU numbers that keep the glets that stay."""

from __future__ import annotations

from greenctl.planner.glet.moves import align_gpus, layout_moves


def _glet(resource: str, *models: tuple[str, int]) -> dict:
    return {
        "resource": resource,
        "models": [{"model": m, "variant": m, "batch": b, "rate_rps": 10.0} for m, b in models],
    }


RUNNING = [
    {"index": 0, "glets": [_glet("mps:60", ("a", 8)), _glet("mps:40", ("b", 4))]},
    {"index": 1, "glets": [_glet("mps:100", ("c", 16), ("d", 2))]},
]


def test_the_same_schedule_numbered_otherwise_moves_nothing_once_aligned():
    swapped = [{**RUNNING[1], "index": 0}, {**RUNNING[0], "index": 1}]
    assert layout_moves(RUNNING, swapped) == (3, 3)  # as numbered, every glet moves
    aligned = align_gpus(swapped, RUNNING)
    assert [g["index"] for g in aligned] == [0, 1]
    assert aligned == RUNNING
    assert layout_moves(RUNNING, aligned) == (0, 3)


def test_a_new_batch_or_partition_moves_that_glet_only():
    new = [
        {"index": 0, "glets": [_glet("mps:100", ("c", 16), ("d", 4))]},  # d's batch changes
        {"index": 1, "glets": [_glet("mps:60", ("a", 8)), _glet("mps:40", ("b", 4))]},
        {"index": 2, "glets": [_glet("mps:100", ("e", 1))]},  # a new GPU
    ]
    aligned = align_gpus(new, RUNNING)
    # the GPU that keeps a and b keeps its number; c and d stay on GPU 1; e takes GPU 2
    by_models = {tuple(m["model"] for g in gpu["glets"] for m in g["models"]): gpu["index"]
                 for gpu in aligned}  # fmt: skip
    assert by_models == {("a", "b"): 0, ("c", "d"): 1, ("e",): 2}
    assert layout_moves(RUNNING, aligned) == (2, 4)  # (c, d) restarts, e starts


def test_fewer_gpus_count_the_glets_that_stop():
    new = [{"index": 0, "glets": [_glet("mps:100", ("a", 8), ("b", 4), ("c", 16), ("d", 2))]}]
    assert layout_moves(RUNNING, align_gpus(new, RUNNING)) == (3, 3)
