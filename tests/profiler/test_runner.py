"""The batch runner shared by the profiler and the executors (greenctl.profiler.runner).

The CUDA runner itself needs a GPU (bench/bench_gpu_serving.py runs it on one); here: the
batch sizes it prepares, the warm-up's settling rule, the choice of runner, and that the
executor's batcher keeps ``depth`` batches in flight so the next batch is assembled and
submitted while the current one runs.
"""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from greenctl.executor.runtime.daemon import Batcher, Metrics
from greenctl.profiler import runner as rn


def test_graph_sizes_cover_every_batch_with_at_most_double_padding():
    assert rn.graph_sizes(1) == [1]
    assert rn.graph_sizes(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rn.graph_sizes(32) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]
    assert rn.graph_sizes(50) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 50]
    for top in (1, 3, 8, 9, 17, 50, 64, 100):
        sizes = rn.graph_sizes(top)
        for rows in range(1, top + 1):
            size = rn.pick_size(sizes, rows)
            assert size is not None and rows <= size <= max(2 * rows, 8)
        assert rn.pick_size(sizes, top + 1) is None


def test_settled_index_finds_where_the_batch_time_stops_falling():
    slow = [3.0] * 60  # clocks ramping up
    fast = [1.5 + 0.01 * (i % 3) for i in range(200)]
    k = rn.settled_index(slow + fast)
    assert k is not None and 50 <= k <= 60
    assert rn.settled_index(fast) == 0
    assert rn.settled_index([1.0] * 10) is None  # too few runs to say


class Clocked:
    """A fake model whose batch time falls from 3 ms to 1 ms over its first 0.5 s (a fake
    clock: the warm-up's decisions, not this machine's speed)."""

    depth = 1

    def __init__(self) -> None:
        self.t = 0.0
        self.runs = 0

    def run(self, x: np.ndarray) -> np.ndarray:
        self.runs += 1
        self.t += 0.003 if self.t < 0.5 else 0.001
        return x


def test_warm_up_runs_every_size_then_until_settled_and_says_when():
    fake = Clocked()
    doc = rn._warm_up(
        fake, lambda b: np.zeros((b, 2)), [1, 2, 4], rounds=3, min_s=0.6, clock=lambda: fake.t
    )
    assert doc.sizes == [1, 2, 4]
    assert doc.runs == fake.runs >= 9
    assert doc.settled_after_s is not None and 0.45 <= doc.settled_after_s <= 0.55
    assert doc.settled_ms == pytest.approx(1.0)
    assert doc.first_ms == pytest.approx(3.0)
    # CPU: no minimum time, just every size `rounds` times
    fake2 = Clocked()
    doc2 = rn._warm_up(fake2, lambda b: np.zeros((b, 2)), [1, 8], rounds=3, min_s=0.0,
                       clock=lambda: fake2.t)  # fmt: skip
    assert doc2.runs == 6 and doc2.settled_after_s is None


class Loaded:
    numpy_native = True
    device = "cpu"
    input_shape = (2,)

    def example(self, batch: int) -> np.ndarray:
        return np.ones((batch, 2), dtype=np.float32)

    def run(self, x: np.ndarray) -> np.ndarray:
        return x * 3


def test_cpu_and_numpy_models_get_the_eager_runner(monkeypatch):
    r = rn.make_runner(Loaded(), max_batch=8)
    assert isinstance(r, rn.EagerRunner) and r.depth == 1
    out, seconds = r.wait(r.submit([np.ones((2, 2)), np.zeros((1, 2))]))
    assert out.tolist() == [[3, 3], [3, 3], [0, 0]] and seconds >= 0
    gpu = Loaded()
    gpu.device = "cuda:0"
    monkeypatch.setenv("GREENCTL_GPU_PIPELINE", "0")
    assert isinstance(rn.make_runner(gpu, max_batch=8), rn.EagerRunner)  # numpy-native anyway


class TwoDeep:
    """A runner of depth 2 whose batches finish only when the test releases them: the batcher
    must submit the second batch while the first is still running."""

    depth = 2

    def __init__(self) -> None:
        self.submitted: list[int] = []
        self.release: list[threading.Event] = []

    def submit(self, parts: list[np.ndarray]) -> rn.Ticket:
        arr = np.concatenate(parts)
        self.submitted.append(int(arr.shape[0]))
        gate = threading.Event()
        self.release.append(gate)
        return rn.Ticket(rows=int(arr.shape[0]), out=arr * 2, slot=gate)

    def wait(self, ticket: rn.Ticket) -> tuple[np.ndarray, float]:
        assert ticket.slot.wait(5.0), "never released"
        assert ticket.out is not None
        return ticket.out, 0.001


def test_the_batcher_submits_the_next_batch_while_one_runs():
    fake = TwoDeep()

    async def main() -> list[tuple[np.ndarray, float, float, int]]:
        batcher = Batcher(None, max_batch=2, max_wait_s=0.0, metrics=Metrics(), runner=fake)
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        rows = [np.full((1, 2), float(i), dtype=np.float32) for i in range(6)]
        jobs = [asyncio.ensure_future(batcher.submit_timed(r)) for r in rows]
        deadline = time.monotonic() + 5
        while len(fake.submitted) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        # two batches in flight, none finished, the third waits for a slot
        assert fake.submitted == [2, 2]
        assert not any(j.done() for j in jobs)
        fake.release[0].set()
        while len(fake.submitted) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake.submitted == [2, 2, 2]
        for gate in fake.release:
            gate.set()
        await asyncio.sleep(0)
        while len(fake.release) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for gate in fake.release:
            gate.set()
        try:
            return await asyncio.wait_for(asyncio.gather(*jobs), 5)
        finally:
            worker.cancel()
            batcher.shutdown()

    got = asyncio.run(main())
    for i, (out, queued_s, ran_s, batch_rows) in enumerate(got):
        assert out.tolist() == [[2.0 * i, 2.0 * i]]
        assert batch_rows == 2 and queued_s >= 0 and ran_s == pytest.approx(0.001)
