"""The executor's dynamic batching reports the rows of the batch each request ran in."""

from __future__ import annotations

import asyncio

import numpy as np
from greenctl.executor.runtime.daemon import Batcher, Metrics


class Echo:
    numpy_native = True

    def __init__(self) -> None:
        self.batches: list[int] = []

    def run(self, arr: np.ndarray) -> np.ndarray:
        self.batches.append(int(arr.shape[0]))
        return arr * 2


def test_each_request_learns_the_rows_of_its_batch():
    model = Echo()

    async def main() -> list[tuple[np.ndarray, float, float, int]]:
        batcher = Batcher(model, max_batch=4, max_wait_s=0.05, metrics=Metrics())
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        rows = [np.full((1, 2), float(i), dtype=np.float32) for i in range(6)]
        try:
            return await asyncio.gather(*(batcher.submit_timed(r) for r in rows))
        finally:
            worker.cancel()

    got = asyncio.run(main())
    assert model.batches == [4, 2]  # six queued rows under a batch of at most four
    assert [g[3] for g in got] == [4, 4, 4, 4, 2, 2]
    for i, (out, queued_s, ran_s, _rows) in enumerate(got):
        assert out.tolist() == [[2.0 * i, 2.0 * i]]  # each request gets its own rows back
        assert queued_s >= 0 and ran_s >= 0
