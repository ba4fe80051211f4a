"""How a batch of requests runs through a loaded model: one runner for profiling and serving.

``greenctl profile`` measures through the runner executors serve with, so a profile's
latency is a served batch's latency (copies in and out included).
:class:`EagerRunner` runs CPU models and numpy stand-ins to completion per batch, staging
rows in a reused :class:`Staging` buffer. :class:`CudaRunner` keeps the GPU busy and the CPU
idle: static batch sizes (:func:`graph_sizes`, the padding rule of
:mod:`greenctl.data.batching` that the planner models too), CUDA graphs where capture works,
pinned buffers and asynchronous copies on one stream (:meth:`submit` returns a
:class:`Ticket`), blocking-sync events instead of spinning, ``cudnn.benchmark`` and a warm-up
over every served size. ``GREENCTL_GPU_PIPELINE=0`` selects the eager path on GPUs;
``GREENCTL_CUDA_GRAPHS=0`` keeps the pipeline without graphs. torch is imported lazily.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# The padding rule (prepared sizes, the size a batch runs at) and the pipeline depth live in
# data/, where the planner's service model reads them too.
from greenctl.data.batching import DEFAULT_DEPTH, graph_sizes, pick_size

#: On a GPU the warm-up lasts at least this long. Three runs were not enough on the H100 host:
#: the first run took 700 ms (library start-up), resnet18 at batch 1 then ran at 2.8 ms for
#: about 1.2 s before settling at 1.5 ms, and a profile taken after three runs put resnet50 at
#: batch 1 at 6.2 ms p50 against 3.6-3.9 ms warm (slower than at batch 8).
GPU_WARMUP_S = 2.0
#: Later points of the same process (another batch size or variant): the library is loaded
#: and the clocks are up; the new shapes' kernels and algorithms are chosen in the warm-up runs.
GPU_REWARM_S = 0.5
#: The warm-up has settled when the median of the last ``SETTLE_WINDOW`` batch times is within
#: ``SETTLE_TOLERANCE`` of the median of the window before it.
SETTLE_WINDOW = 20
SETTLE_TOLERANCE = 0.05


def pipeline_enabled() -> bool:
    """Whether GPU models run through :class:`CudaRunner` (``GREENCTL_GPU_PIPELINE``, default on)."""
    return os.environ.get("GREENCTL_GPU_PIPELINE", "1").strip().lower() not in ("0", "off", "no")


def graphs_enabled() -> bool:
    """Whether :class:`CudaRunner` captures CUDA graphs (``GREENCTL_CUDA_GRAPHS``, default on)."""
    return os.environ.get("GREENCTL_CUDA_GRAPHS", "1").strip().lower() not in ("0", "off", "no")


@dataclass
class WarmUp:
    """What a warm-up did: runs, seconds, and when the per-batch time settled."""

    runs: int = 0
    seconds: float = 0.0
    #: seconds from the start of the warm-up until the batch time settled (None: it had not
    #: settled when the warm-up ended)
    settled_after_s: float | None = None
    settled_ms: float | None = None
    first_ms: float | None = None
    sizes: list[int] = field(default_factory=list)
    graphs: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "seconds": round(self.seconds, 4),
            "settled_after_s": None
            if self.settled_after_s is None
            else round(self.settled_after_s, 4),
            "settled_ms": None if self.settled_ms is None else round(self.settled_ms, 4),
            "first_ms": None if self.first_ms is None else round(self.first_ms, 4),
            "sizes": self.sizes,
            "graphs": self.graphs,
        }


def settled_index(times_ms: Sequence[float], *, window: int = SETTLE_WINDOW) -> int | None:
    """The index of the run from which the batch time stays settled: every window of
    ``window`` runs from there on (at a stride of half a window) has its median within
    ``SETTLE_TOLERANCE`` of the last window's. None when fewer than two windows were run."""
    n = len(times_ms)
    if n < 2 * window:
        return None
    arr = np.asarray(times_ms, dtype=float)
    final = float(np.median(arr[n - window :]))
    step = max(1, window // 2)
    starts = list(range(0, n - window + 1, step))
    if starts[-1] != n - window:
        starts.append(n - window)
    settled = starts[-1]
    for s in reversed(starts):
        if abs(float(np.median(arr[s : s + window])) - final) > SETTLE_TOLERANCE * max(final, 1e-9):
            break
        settled = s
    return settled


@dataclass
class Ticket:
    """A batch in flight (returned by ``submit``, redeemed by ``wait``)."""

    rows: int
    out: np.ndarray | None = None  # eager runners: the finished output
    slot: Any = None
    start: Any = None
    end: Any = None
    host_s: float = 0.0


#: A staging buffer holds at most this many bytes (64 rows of a 224x224 float image fit); a
#: bigger batch is assembled in an array of its own, freed with it.
STAGING_MAX_BYTES = 64 * 1024 * 1024
#: Buffers kept per (dtype, row shape) once given back; more in flight at once are made and
#: dropped on return.
STAGING_KEEP = 2


@dataclass(eq=False)  # a buffer is itself, not its contents (never compared by value)
class _Buffer:
    """One staging buffer: ``array`` has room for ``len(array)`` rows; ``tensor`` is the
    (pinned) torch tensor owning its memory, or None for plain numpy memory."""

    key: tuple[np.dtype[Any], tuple[int, ...]]
    array: np.ndarray
    tensor: Any = None
    rows: int = 0  # the rows of the batch it was last taken for


class Staging:
    """Host buffers that batches are assembled in, reused from batch to batch.

    Each buffer is :meth:`take`-n for one batch and :meth:`give`-n back once nothing reads it
    any more; a buffer out is never handed to another batch, so batches in flight at once
    (submitted from several threads, or overlapping a running one) never share memory. A
    batch of ``r`` rows uses the first ``r`` rows of the roomiest free buffer (one buffer
    serves every batch size when batches run one at a time: the least memory for the CPU's
    caches to hold); room grows in powers of two rows, up to ``max_bytes``;
    :data:`STAGING_KEEP` buffers per dtype and row shape are kept.

    ``pin``: allocate page-locked memory through torch (when CUDA is available), so the copy
    to a CUDA device is a direct DMA; plain numpy memory otherwise, or when pinning fails.
    """

    def __init__(self, *, pin: bool = False, max_bytes: int | None = None,
                 keep: int = STAGING_KEEP) -> None:  # fmt: skip
        self.pin = pin
        self.max_bytes = STAGING_MAX_BYTES if max_bytes is None else max_bytes
        self.keep = max(1, keep)
        self.allocations = 0  # buffers made so far (tests: reuse means few)
        # free buffers per (dtype, row shape), roomiest last
        self._free: dict[tuple[np.dtype[Any], tuple[int, ...]], list[_Buffer]] = {}
        self._lock = threading.Lock()

    def take(self, parts: Sequence[np.ndarray]) -> _Buffer | None:
        """A buffer with room for ``parts``' rows in the dtype ``np.concatenate`` would give
        them; None when they are over ``max_bytes`` (or not arrays of rows)."""
        first = parts[0]
        dtype = first.dtype
        rows = 0
        for p in parts:
            if p.ndim == 0:
                return None
            if p.dtype != dtype:
                dtype = np.result_type(*parts)
            rows += p.shape[0]
        tail = first.shape[1:]
        row_bytes = dtype.itemsize * math.prod(tail)
        if row_bytes <= 0 or rows * row_bytes > self.max_bytes or dtype.hasobject:
            return None
        key = (dtype, tail)
        with self._lock:
            free = self._free.get(key)
            if free and len(free[-1].array) >= rows:
                buf = free.pop()
                buf.rows = rows
                return buf
        room = min(1 << (rows - 1).bit_length(), self.max_bytes // row_bytes)
        buf = self._allocate(key, max(room, rows))
        buf.rows = rows
        return buf

    def give(self, buf: _Buffer) -> None:
        """Return ``buf``: nothing reads or writes it any more."""
        with self._lock:
            free = self._free.setdefault(buf.key, [])
            free.append(buf)
            if len(free) > 1:
                free.sort(key=lambda b: len(b.array))
                if len(free) > self.keep:
                    del free[0]  # keep the roomiest

    def _allocate(self, key: tuple[np.dtype[Any], tuple[int, ...]], rows: int) -> _Buffer:
        dtype, tail = key
        self.allocations += 1
        if self.pin and dtype.isnative:
            try:
                import torch

                if torch.cuda.is_available():
                    like = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
                    tensor = torch.empty((rows, *tail), dtype=like, pin_memory=True)
                    return _Buffer(key, tensor.numpy(), tensor)
            except (ImportError, RuntimeError, TypeError, ValueError):
                pass  # unpinned memory works too, a little slower to copy to the device
        return _Buffer(key, np.empty((rows, *tail), dtype=dtype))


class EagerRunner:
    """Runs each batch to completion at submit (CPU models, numpy-native stand-ins, and GPU
    models when the pipeline is off)."""

    depth = 1
    graphs = False

    def __init__(self, loaded: Any) -> None:
        self.loaded = loaded
        self.numpy_native = bool(getattr(loaded, "numpy_native", False))
        self.device = str(getattr(loaded, "device", "cpu"))
        self.sizes: list[int] = []
        # a batch's rows are copied once, into a reused buffer (pinned for a CUDA model)
        self.staging = Staging(pin=self.device.startswith("cuda") and not self.numpy_native)

    def submit(self, parts: Sequence[np.ndarray]) -> Ticket:
        """Assemble the batch and run it to completion; the ticket holds its output."""
        first = parts[0]
        if len(parts) == 1 and (self.numpy_native or first.flags.writeable):
            # the caller's own array (or a numpy model, which takes read-only rows): no copy
            t0 = time.perf_counter()
            out = run_eager(self.loaded, first, numpy_native=self.numpy_native)
            return Ticket(rows=int(first.shape[0]), out=out, host_s=time.perf_counter() - t0)
        # several requests, or a read-only view of one request's body: one copy of the rows
        # into a staging buffer (no new array per batch; pinned for a CUDA model, so no
        # second copy through the driver's bounce buffer on the way to the device)
        buf = self.staging.take(parts)
        if buf is None:  # over the staging limit: a batch array of its own, as before
            arr = first if len(parts) == 1 else np.concatenate(parts)
            t0 = time.perf_counter()
            out = run_eager(self.loaded, arr, numpy_native=self.numpy_native)
            return Ticket(rows=int(arr.shape[0]), out=out, host_s=time.perf_counter() - t0)
        try:
            rows = buf.rows
            arr = buf.array[:rows]
            if len(parts) == 1:
                np.copyto(arr, first, casting="same_kind")
            else:
                np.concatenate(parts, out=arr)  # exactly concatenate's casting, in place
            t0 = time.perf_counter()
            if buf.tensor is not None:
                out = _run_tensor(self.loaded, buf.tensor[:rows])
            else:
                out = run_eager(self.loaded, arr, numpy_native=self.numpy_native)
            host_s = time.perf_counter() - t0
            if np.may_share_memory(out, buf.array):
                # a model answering its input (or a view of it): the next batch would
                # overwrite the answer while it is still being sent
                out = out.copy()
        finally:
            # nothing reads the buffer now (the model ran synchronously, a CUDA model's
            # copy to the device was a blocking one, an answer in it was copied out): the
            # next batch may take it
            self.staging.give(buf)
        return Ticket(rows=rows, out=out, host_s=host_s)

    def wait(self, ticket: Ticket) -> tuple[np.ndarray, float]:
        assert ticket.out is not None
        return ticket.out, ticket.host_s

    def run(self, arr: np.ndarray) -> np.ndarray:
        return self.wait(self.submit([arr]))[0]

    def warm_up(self, example: Callable[[int], np.ndarray], sizes: Sequence[int], *,
                rounds: int = 3, min_s: float = 0.0) -> WarmUp:  # fmt: skip
        return _warm_up(self, example, sizes, rounds=rounds, min_s=min_s)


def run_eager(loaded: Any, arr: np.ndarray, *, numpy_native: bool) -> np.ndarray:
    """One batch through a LoadedModel, eagerly (torch tensors in and out unless numpy-native)."""
    if numpy_native:
        return np.asarray(loaded.run(arr))
    import torch

    if not arr.flags.writeable:  # a view of a request body: torch wants its own memory
        arr = arr.copy()
    return _run_tensor(loaded, torch.from_numpy(np.ascontiguousarray(arr)))


def _run_tensor(loaded: Any, x: Any) -> np.ndarray:
    """One batch (a host tensor) through a torch LoadedModel; the output on the host.

    On a CUDA model the copy to the device is a blocking one (``non_blocking`` left off): when
    this returns, nothing reads ``x`` any more, so its memory may take the next batch.
    """
    import torch

    device = str(getattr(loaded, "device", "cpu"))
    if device != "cpu":  # the batch goes to the model's device
        x = x.to(device)
    with torch.inference_mode():
        out = loaded.run(x)
    return _host(out)


def _first_tensor(out: Any) -> Any:
    if isinstance(out, list | tuple):
        out = out[0]
    if hasattr(out, "logits"):
        out = out.logits
    return out


def _host(out: Any) -> np.ndarray:
    return np.asarray(_first_tensor(out).detach().to("cpu").numpy())


class _Slot:
    """Pinned host buffers of ``max_rows`` rows for one batch in flight."""

    def __init__(self, torch: Any, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 in_dtype: Any, out_dtype: Any, rows: int) -> None:  # fmt: skip
        self.pin_in = torch.empty((rows, *in_shape), dtype=in_dtype, pin_memory=True)
        self.pin_out = torch.empty((rows, *out_shape), dtype=out_dtype, pin_memory=True)
        self.np_in = self.pin_in.numpy()
        self.np_out = self.pin_out.numpy()


class CudaRunner:
    """Static-shape, graph-replaying, pinned-memory, non-spinning runner of a CUDA model."""

    def __init__(self, loaded: Any, *, sizes: Sequence[int], depth: int = DEFAULT_DEPTH,
                 graphs: bool | None = None) -> None:  # fmt: skip
        import torch

        self.torch = torch
        self.loaded = loaded
        self.module = loaded.module
        self.device = torch.device(str(loaded.device))
        self.sizes = sorted({int(s) for s in sizes if int(s) >= 1})
        if not self.sizes:
            raise ValueError("a CUDA runner needs at least one batch size")
        self.depth = max(1, int(depth))
        torch.backends.cudnn.benchmark = True
        self.stream = torch.cuda.Stream(device=self.device)
        shape = tuple(int(d) for d in loaded.input_shape)
        self.input_shape = shape
        self.in_dtype = torch.float32
        top = self.sizes[-1]
        self.static_in = {s: torch.zeros((s, *shape), device=self.device) for s in self.sizes}
        # the output's shape and dtype, from one eager run on the stream
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            probe = _first_tensor(self.module(self.static_in[self.sizes[0]]))
        self.stream.synchronize()
        self.out_shape = tuple(int(d) for d in probe.shape[1:])
        self.out_dtype = probe.dtype
        self.free: queue.Queue[_Slot] = queue.Queue()
        for _ in range(self.depth):
            self.free.put(_Slot(torch, shape, self.out_shape, self.in_dtype, self.out_dtype, top))
        self.static_out: dict[int, Any] = {}
        self.graph: dict[int, Any] = {}
        self.graph_error: str | None = None
        want = graphs_enabled() if graphs is None else graphs
        self.graphs = bool(want) and self._capture()
        self._lock = threading.Lock()  # one submitter at a time (slot order = stream order)

    # -- set-up -------------------------------------------------------------------------------
    def _capture(self) -> bool:
        """Capture one graph per size (largest first, one shared memory pool); False and the
        eager module when the model cannot be captured."""
        torch = self.torch
        try:
            with torch.inference_mode():
                # cudnn.benchmark picks algorithms during these eager runs, before capture
                with torch.cuda.stream(self.stream):
                    for s in self.sizes:
                        for _ in range(3):
                            self.module(self.static_in[s])
                self.stream.synchronize()
                pool = torch.cuda.graph_pool_handle()
                for s in sorted(self.sizes, reverse=True):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool, stream=self.stream):
                        out = _first_tensor(self.module(self.static_in[s]))
                    self.graph[s] = g
                    self.static_out[s] = out
            self.stream.synchronize()
            return True
        except Exception as exc:  # a model that cannot be captured runs eagerly
            self.graph.clear()
            self.static_out.clear()
            self.graph_error = (
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
            torch.cuda.synchronize(self.device)
            return False

    # -- running ------------------------------------------------------------------------------
    def submit(self, parts: Sequence[np.ndarray]) -> Ticket:
        """Copy the batch's rows into a free pinned slot and enqueue copy-in, model and
        copy-out on the stream; returns at once (blocks only while no slot is free)."""
        torch = self.torch
        rows = sum(int(p.shape[0]) for p in parts)
        size = pick_size(self.sizes, rows)
        if size is None:  # more rows than any prepared size: eager, synchronous
            arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
            t0 = time.perf_counter()
            with torch.inference_mode(), torch.cuda.stream(self.stream):
                out = _first_tensor(self.module(torch.from_numpy(arr).to(self.device)))
                host = out.to("cpu")
            return Ticket(rows=rows, out=host.numpy(), host_s=time.perf_counter() - t0)
        slot = self.free.get()
        at = 0
        for p in parts:
            n = int(p.shape[0])
            np.copyto(slot.np_in[at : at + n], p, casting="same_kind")
            at += n
        start = torch.cuda.Event(enable_timing=True, blocking=True)
        end = torch.cuda.Event(enable_timing=True, blocking=True)
        with self._lock, torch.inference_mode(), torch.cuda.stream(self.stream):
            start.record(self.stream)
            static_in = self.static_in[size]
            static_in[:rows].copy_(slot.pin_in[:rows], non_blocking=True)
            if self.graphs:
                self.graph[size].replay()
                out = self.static_out[size]
            else:
                out = _first_tensor(self.module(static_in))
            slot.pin_out[:rows].copy_(out[:rows], non_blocking=True)
            end.record(self.stream)
        return Ticket(rows=rows, slot=slot, start=start, end=end)

    def wait(self, ticket: Ticket) -> tuple[np.ndarray, float]:
        """The batch's output rows (a copy) and its device time in seconds (copy-in, model
        and copy-out, from the stream's events); sleeps, not spins, until it is done."""
        if ticket.out is not None:
            return ticket.out, ticket.host_s
        slot = ticket.slot
        try:
            ticket.end.synchronize()
            out = slot.np_out[: ticket.rows].copy()
            device_s = float(ticket.start.elapsed_time(ticket.end)) / 1000.0
        finally:
            self.free.put(slot)
        return out, device_s

    def run(self, arr: np.ndarray) -> np.ndarray:
        return self.wait(self.submit([arr]))[0]

    def warm_up(self, example: Callable[[int], np.ndarray], sizes: Sequence[int], *,
                rounds: int = 3, min_s: float = 0.0) -> WarmUp:  # fmt: skip
        doc = _warm_up(self, example, sizes, rounds=rounds, min_s=min_s)
        doc.graphs = self.graphs
        return doc


def _warm_up(runner: Any, example: Callable[[int], np.ndarray], sizes: Sequence[int], *,
             rounds: int, min_s: float, clock: Callable[[], float] = time.perf_counter) -> WarmUp:  # fmt: skip
    """Run every size ``rounds`` times, then the largest size until ``min_s`` has passed and
    (on a timed device) its batch time has settled, or ``max(3 * min_s, 1)`` seconds at most."""
    sizes = sorted(set(sizes)) or [1]
    doc = WarmUp(sizes=list(sizes))
    t0 = clock()
    for s in sizes:
        x = example(s)
        for _ in range(max(1, rounds)):
            runner.run(x)
            doc.runs += 1
    top = example(sizes[-1])
    times: list[float] = []
    stamps: list[float] = []
    limit = max(3.0 * min_s, 1.0)
    while min_s > 0:
        a = clock()
        runner.run(top)
        b = clock()
        doc.runs += 1
        times.append((b - a) * 1000.0)
        stamps.append(a - t0)
        over = b - t0 >= limit
        if (b - t0 >= min_s and len(times) % SETTLE_WINDOW == 0) or over:
            k = settled_index(times)
            # settled, with at least one more whole window measured after it
            if k is not None and k <= len(times) - 2 * SETTLE_WINDOW:
                doc.settled_after_s = stamps[k]
                doc.settled_ms = float(np.median(times[-SETTLE_WINDOW:]))
                break
        if over:
            break
    if times:
        doc.first_ms = times[0]
    doc.seconds = clock() - t0
    return doc


def make_runner(loaded: Any, *, max_batch: int, depth: int = DEFAULT_DEPTH) -> Any:
    """The runner an executor serving up to ``max_batch`` rows uses for ``loaded``."""
    device = str(getattr(loaded, "device", "cpu"))
    if getattr(loaded, "numpy_native", False) or not device.startswith("cuda"):
        return EagerRunner(loaded)
    if not pipeline_enabled():
        return EagerRunner(loaded)
    return CudaRunner(loaded, sizes=graph_sizes(max_batch), depth=depth)


def host_example(loaded: Any, batch: int) -> np.ndarray:
    """A host (numpy) input batch of ``batch`` rows for ``loaded``."""
    x = loaded.example(batch)
    if hasattr(x, "detach"):
        x = x.detach().to("cpu").numpy()
    return np.ascontiguousarray(np.asarray(x))
