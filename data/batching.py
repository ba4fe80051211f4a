"""How an executor batches: the one place the padding rule, the pipeline depth and the
default max wait are written down.

The GPU runner runs a batch of ``r`` rows at the smallest prepared size that holds it
(:func:`graph_sizes`, :func:`pick_size`), so a partial batch costs that size's time. The
executor's batcher closes a batch at ``batch`` rows or ``max_wait_ms`` after its first
request and keeps up to ``depth`` batches in flight (:data:`DEFAULT_DEPTH` on the GPU; the
eager CPU runner finishes each batch first). The planner's service model and simulator read
the same rule here, so what they predict is what the executor runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from greenctl.data.resources import kind_of

#: Every batch size up to this one gets its own graph; above it, powers of two and the largest.
DENSE_SIZES = 8
#: Batches in flight at once on a GPU: one running, one being assembled and enqueued.
DEFAULT_DEPTH = 2
#: The longest an executor waits for a batch to fill after taking its first request (ms):
#: the executor daemon's ``--max-wait-ms`` default and ``apply``'s ``max_wait_ms``.
DEFAULT_MAX_WAIT_MS = 2.0


def graph_sizes(max_batch: int) -> list[int]:
    """The static batch sizes a runner of ``max_batch`` rows prepares: 1..8, then the powers of
    two below ``max_batch``, then ``max_batch`` itself (a batch is padded at most to twice its
    rows above 8)."""
    top = max(1, int(max_batch))
    sizes = set(range(1, min(top, DENSE_SIZES) + 1))
    p = DENSE_SIZES * 2
    while p < top:
        sizes.add(p)
        p *= 2
    sizes.add(top)
    return sorted(sizes)


def pick_size(sizes: Sequence[int], rows: int) -> int | None:
    """The smallest prepared size holding ``rows`` rows (None: more rows than any size)."""
    for s in sizes:
        if s >= rows:
            return s
    return None


def dispatcher_slots(batch: int) -> int:
    """Requests the local dispatcher lets into one executor at once under the ``batch``
    policy: a whole batch plus one, so an executor can batch and never idles waiting for the
    next request's round trip (``greenctl apply`` gives each route ``batch + 1`` slots)."""
    return max(1, int(batch)) + 1


@dataclass(frozen=True)
class Batching:
    """How one executor instance batches (module docstring).

    Attributes:
        batch: the most rows in one batch.
        max_wait_ms: how long a batch waits to fill after its first request is taken.
        depth: batches in flight at once; 1: each batch runs to completion before the next
            request is taken (the eager runner), more: the next batch is assembled and queued
            on the device while one runs (the GPU runner).
        sizes: the prepared sizes a batch is padded to; None: a batch runs at its own rows.
        slots: the most requests inside the executor at once (the dispatcher's cap; None: no
            cap).
    """

    batch: int
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS
    depth: int = 1
    sizes: tuple[int, ...] | None = None
    slots: int | None = None

    @property
    def saturated_rows(self) -> int:
        """The most rows a batch holds when the executor is saturated. The eager runner
        (depth 1) takes a whole batch at once. A pipelined one holds ``depth`` batches in
        flight and a closed one waiting for a slot, so with at most ``slots`` requests inside
        the executor its batches settle at about ``slots / (depth + 1)`` rows (with
        ``batch + 1`` slots and depth 2: a third of the batch; never below 2 when the batch
        allows it)."""
        if self.depth <= 1 or self.slots is None:
            return self.batch
        return min(self.batch, max(self.slots // (self.depth + 1), 2))

    def run_size(self, rows: int) -> int:
        """The size a batch of ``rows`` rows runs at (padded to a prepared size)."""
        if self.sizes is None:
            return max(1, int(rows))
        size = pick_size(self.sizes, rows)
        return int(rows) if size is None else size


def executor_batching(resource: str, batch: int, *, max_wait_ms: float | None = None) -> Batching:
    """How an executor of up to ``batch`` rows batches on ``resource``: on a GPU (a whole GPU,
    a MIG instance or an MPS share) the pipelined GPU runner, padded to :func:`graph_sizes`,
    :data:`DEFAULT_DEPTH` batches in flight; elsewhere the eager runner (rows as they are, one
    batch at a time). ``max_wait_ms`` None: :data:`DEFAULT_MAX_WAIT_MS`. Every executor under
    the local dispatcher holds at most :func:`dispatcher_slots` requests."""
    b = max(1, int(batch))
    wait = DEFAULT_MAX_WAIT_MS if max_wait_ms is None else max(float(max_wait_ms), 0.0)
    if kind_of(resource).accelerator:
        return Batching(b, wait, DEFAULT_DEPTH, tuple(graph_sizes(b)), dispatcher_slots(b))
    return Batching(b, wait, 1, None, dispatcher_slots(b))
