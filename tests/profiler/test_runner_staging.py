"""The eager runner assembles a batch in a reused staging buffer (greenctl.profiler.runner,
issue 22): one copy of the request rows, the same output as concatenating them, and no
buffer shared by two batches in flight or overwritten under an answer still being sent."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from greenctl.executor.runtime.daemon import Batcher, Metrics
from greenctl.profiler import runner as rn


def body_view(arr: np.ndarray) -> np.ndarray:
    """``arr`` as the executor decodes it: a read-only view of a request body."""
    data = arr.tobytes()
    return np.frombuffer(data, dtype=arr.dtype).reshape(arr.shape)


class NumpyModel:
    numpy_native = True
    device = "cpu"
    input_shape = (3, 4)

    def run(self, x: np.ndarray) -> np.ndarray:
        return np.sin(x).sum(axis=2) * 1.5 + x[:, :, 0]


class Identity:
    """A numpy model answering its input: its output is the staging buffer itself."""

    numpy_native = True
    device = "cpu"
    input_shape = (5,)

    def run(self, x: np.ndarray) -> np.ndarray:
        return x


class TorchModel:
    """A small torch model (numpy in, torch inside), as the built-in loaders give."""

    numpy_native = False
    device = "cpu"
    input_shape = (3, 8, 8)

    def __init__(self, flatten_only: bool = False) -> None:
        import torch

        torch.manual_seed(0)
        self.flatten_only = flatten_only
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def run(self, x):
        if self.flatten_only:  # a view of the input: aliases the staging buffer
            return x.flatten(1)
        return self.fc(self.conv(x).relu().flatten(1))


def batches(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> list[list[np.ndarray]]:  # fmt: skip
    out = []
    for sizes in ([1], [2], [1, 1], [3, 1, 2], [1, 2, 1, 3, 1], [4], [2, 2, 2, 2]):
        out.append([body_view(rng.standard_normal((n, *shape)).astype(dtype) * 10) for n in sizes])
    return out


def old_output(loaded, parts: list[np.ndarray]) -> np.ndarray:
    """What the runner answered before staging: the rows concatenated, then run."""
    arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return rn.run_eager(loaded, arr, numpy_native=bool(getattr(loaded, "numpy_native", False)))


@pytest.mark.parametrize("make", [NumpyModel, TorchModel], ids=["numpy", "torch"])
def test_staged_batches_answer_bit_for_bit_what_concatenated_ones_did(make):
    loaded = make()
    runner = rn.EagerRunner(loaded)
    rng = np.random.default_rng(7)
    for parts in batches(rng, loaded.input_shape, "float32") * 3:
        out, _ = runner.wait(runner.submit(parts))
        want = old_output(loaded, parts)
        assert out.dtype == want.dtype and out.shape == want.shape
        assert out.tobytes() == want.tobytes()
    # buffers are reused: a handful made for 21 batches of 1 to 8 rows, not one per batch
    assert runner.staging.allocations <= 4


def test_mixed_dtypes_are_promoted_as_concatenate_does():
    loaded = NumpyModel()
    runner = rn.EagerRunner(loaded)
    rng = np.random.default_rng(1)
    for dtypes in (("float32", "float64"), ("int16", "float32"), ("int64", "int8"), (">f4", "<f4")):
        parts = [
            body_view((rng.standard_normal((n, 3, 4)) * 100).astype(dt))
            for n, dt in zip((2, 3), dtypes, strict=True)
        ]
        out, _ = runner.wait(runner.submit(parts))
        want = old_output(loaded, parts)
        assert out.dtype == want.dtype and out.tobytes() == want.tobytes()


def test_a_writeable_single_array_runs_as_it_is_and_a_batch_over_the_limit_as_before(monkeypatch):
    loaded = TorchModel()
    runner = rn.EagerRunner(loaded)
    x = np.random.default_rng(2).standard_normal((3, 3, 8, 8)).astype("float32")
    out, _ = runner.wait(runner.submit([x]))
    assert out.tobytes() == old_output(loaded, [x]).tobytes()
    assert runner.staging.allocations == 0  # the caller's own array: no copy at all
    small = rn.EagerRunner(loaded)
    small.staging.max_bytes = 2 * 3 * 8 * 8 * 4  # two rows
    parts = [body_view(x[:2]), body_view(x[2:])]
    out, _ = small.wait(small.submit(parts))
    assert out.tobytes() == old_output(loaded, parts).tobytes()
    assert small.staging.allocations == 0


@pytest.mark.parametrize(
    "loaded", [Identity(), TorchModel(flatten_only=True)], ids=["numpy-identity", "torch-view"]
)
def test_an_answer_sharing_the_buffer_survives_the_next_batch(loaded):
    runner = rn.EagerRunner(loaded)
    shape = loaded.input_shape
    first = [body_view(np.full((1, *shape), 1.0, "float32")), body_view(np.full((2, *shape), 2.0, "float32"))]  # fmt: skip
    out1, _ = runner.wait(runner.submit(first))
    kept = out1.copy()
    for k in range(5):  # later batches take the same buffers
        later = [body_view(np.full((n, *shape), 9.0 + k, "float32")) for n in (2, 1)]
        runner.wait(runner.submit(later))
    assert np.array_equal(out1, kept)
    assert out1.reshape(3, -1)[:, 0].tolist() == [1.0, 2.0, 2.0]


class Gated:
    """A numpy model that holds each batch until both threads' batches are inside it, then
    checks its input did not change while it ran."""

    numpy_native = True
    device = "cpu"
    input_shape = (4,)

    def __init__(self) -> None:
        self.barrier = threading.Barrier(2, timeout=10)
        self.changed = False

    def run(self, x: np.ndarray) -> np.ndarray:
        before = x.copy()
        self.barrier.wait()  # the other batch is assembled and running too
        self.barrier.wait()
        self.changed |= not np.array_equal(before, x)
        return x * 2


def test_batches_in_flight_at_once_never_share_a_buffer():
    loaded = Gated()
    runner = rn.EagerRunner(loaded)
    results: dict[int, np.ndarray] = {}

    def client(k: int) -> None:
        for j in range(10):
            v = float(100 * k + j)
            parts = [body_view(np.full((2, 4), v, "float32")), body_view(np.full((1, 4), v, "float32"))]  # fmt: skip
            out, _ = runner.wait(runner.submit(parts))
            assert np.all(out == 2 * v), (k, j)
            results[k * 100 + j] = out

    threads = [threading.Thread(target=client, args=(k,)) for k in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(results) == 20 and not loaded.changed
    assert runner.staging.allocations == 2  # two batches in flight: two buffers, reused


def test_the_batcher_answers_every_request_its_own_rows_through_reused_buffers():
    """Identity model behind the executor's batcher: batches of several requests assembled
    in reused buffers while earlier answers are still being handed out."""
    runner = rn.EagerRunner(Identity())

    async def main() -> list[np.ndarray]:
        batcher = Batcher(None, max_batch=6, max_wait_s=0.002, metrics=Metrics(), runner=runner)
        worker = asyncio.get_running_loop().create_task(batcher.run_forever())
        try:
            jobs = []
            for i in range(120):
                rows = 1 + i % 3
                jobs.append(batcher.submit(body_view(np.full((rows, 5), float(i), "float32"))))
                if i % 7 == 0:
                    await asyncio.sleep(0)
            return await asyncio.wait_for(asyncio.gather(*jobs), 30)
        finally:
            worker.cancel()
            batcher.shutdown()

    got = asyncio.run(main())
    for i, out in enumerate(got):
        assert out.shape == (1 + i % 3, 5) and np.all(out == float(i)), i
    assert runner.staging.allocations <= 4


def test_staging_keeps_few_buffers_and_pins_only_where_it_can():
    st = rn.Staging(keep=2)
    parts = [np.zeros((3, 2), "float32")]
    taken = [st.take(parts) for _ in range(4)]
    assert all(b is not None for b in taken) and len({id(b) for b in taken}) == 4
    for b in taken:
        assert b is not None
        st.give(b)
    assert len(st._free[(np.dtype("float32"), (2,))]) == 2
    assert len(taken[0].array) == 4  # room in powers of two rows
    assert st.take([np.array(1.0, "float32")]) is None  # not rows
    # asked to pin without CUDA (this machine, CI): plain memory that works the same
    pinned = rn.Staging(pin=True).take(parts)
    assert pinned is not None and pinned.array.shape == (4, 2)
