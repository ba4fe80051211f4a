"""Where the executor runs a batch: a cheap numpy-native model on the event loop (no hop to
the worker thread and back), anything slower or torch-based on the worker thread, and a model
that turns slow while served goes back to the thread."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
from greenctl.executor.runtime.daemon import INLINE_WINDOW, Batcher, Metrics


class Recorder:
    """A numpy model that doubles its input, sleeps ``sleep_s`` per batch and records the
    thread and rows of each batch."""

    numpy_native = True

    def __init__(self, sleep_s: float = 0.0) -> None:
        self.sleep_s = sleep_s
        self.threads: list[int] = []
        self.batches: list[int] = []
        self.input_shape = (2,)

    def example(self, batch: int) -> np.ndarray:
        return np.zeros((batch, 2), dtype=np.float32)

    def run(self, arr: np.ndarray) -> np.ndarray:
        self.threads.append(threading.get_ident())
        self.batches.append(int(arr.shape[0]))
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return arr * 2


class TorchLike(Recorder):
    """Not numpy-native: it would be run through torch (never on the loop)."""

    numpy_native = False


def _serve(model: Recorder, n: int, *, calibrate: bool = True) -> tuple[Batcher, list, int]:
    """Calibrate a batcher of ``model`` (largest batch 4), send ``n`` one-row requests at
    once, and return it, the answers and the event loop's thread."""

    async def main() -> tuple[Batcher, list, int]:
        batcher = Batcher(model, max_batch=4, max_wait_s=0.02, metrics=Metrics())
        if calibrate:
            batcher.calibrate(model.example)
        model.threads.clear()
        model.batches.clear()
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        rows = [np.full((1, 2), float(i), dtype=np.float32) for i in range(n)]
        try:
            got = await asyncio.gather(*(batcher.submit_timed(r) for r in rows))
        finally:
            worker.cancel()
            batcher.shutdown()
        return batcher, got, threading.get_ident()

    return asyncio.run(main())


def _check_answers(got: list) -> None:
    for i, (out, queued_s, ran_s, rows) in enumerate(got):
        assert out.tolist() == [[2.0 * i, 2.0 * i]]  # each request gets its own rows back
        assert queued_s >= 0 and ran_s >= 0 and 1 <= rows <= 4


def test_a_cheap_numpy_model_runs_on_the_loop():
    model = Recorder()
    batcher, got, loop_thread = _serve(model, 6)
    assert batcher.inline
    _check_answers(got)
    assert model.batches == [4, 2]
    assert set(model.threads) == {loop_thread}
    assert batcher.metrics.batch_sum == 6


def test_a_slow_numpy_model_keeps_its_thread():
    model = Recorder(sleep_s=0.002)  # 2 ms a batch: it would stall every other request
    batcher, got, loop_thread = _serve(model, 6)
    assert not batcher.inline
    _check_answers(got)
    assert model.threads and loop_thread not in model.threads


def test_a_torch_model_never_runs_on_the_loop():
    model = TorchLike()

    async def main() -> Batcher:
        return Batcher(model, max_batch=4, max_wait_s=0.0, metrics=Metrics())

    batcher = asyncio.run(main())
    assert batcher.calibrate(model.example) is None
    assert not batcher.inline


def test_an_uncalibrated_batcher_uses_the_thread():
    model = Recorder()
    batcher, got, loop_thread = _serve(model, 3, calibrate=False)
    assert not batcher.inline
    _check_answers(got)
    assert loop_thread not in model.threads


def test_a_model_that_turns_slow_goes_back_to_the_thread():
    model = Recorder()

    async def main() -> tuple[Batcher, list[int], int]:
        batcher = Batcher(model, max_batch=1, max_wait_s=0.0, metrics=Metrics())
        batcher.calibrate(model.example)
        assert batcher.inline
        model.sleep_s = 0.002  # slower than the inline limit from now on
        model.threads.clear()
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        try:
            for i in range(INLINE_WINDOW + 4):  # one at a time: a batch each
                out = await batcher.submit(np.full((1, 2), float(i), dtype=np.float32))
                assert out.tolist() == [[2.0 * i, 2.0 * i]]
        finally:
            worker.cancel()
            batcher.shutdown()
        return batcher, list(model.threads), threading.get_ident()

    batcher, threads, loop_thread = asyncio.run(main())
    assert not batcher.inline
    assert threads[:INLINE_WINDOW] == [loop_thread] * INLINE_WINDOW
    assert loop_thread not in threads[INLINE_WINDOW:]


def test_a_failing_inline_batch_fails_its_requests_not_the_batcher():
    class Flaky(Recorder):
        def run(self, arr: np.ndarray) -> np.ndarray:
            if arr[0, 0] < 0:
                raise RuntimeError("bad row")
            return super().run(arr)

    model = Flaky()

    async def main() -> tuple[BaseException | None, list]:
        batcher = Batcher(model, max_batch=1, max_wait_s=0.0, metrics=Metrics())
        batcher.calibrate(model.example)
        assert batcher.inline
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        try:
            err = None
            try:
                await batcher.submit(np.full((1, 2), -1.0, dtype=np.float32))
            except RuntimeError as exc:
                err = exc
            ok = await batcher.submit(np.full((1, 2), 3.0, dtype=np.float32))
        finally:
            worker.cancel()
            batcher.shutdown()
        return err, ok.tolist()

    err, ok = asyncio.run(main())
    assert isinstance(err, RuntimeError) and "bad row" in str(err)
    assert ok == [[6.0, 6.0]]
