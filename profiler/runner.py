"""How a batch of requests runs through a loaded model: one runner for profiling and serving.

``greenctl profile`` measures a variant through the same runner its executors serve with, so
a profile's latency is the latency a served batch gets (the host-to-device copy, the model and
the copy back), not a figure of another code path.

- :class:`EagerRunner`: CPU models and numpy-native stand-ins: each batch runs to completion
  in :meth:`~EagerRunner.submit` (``torch.inference_mode``; numpy in, numpy out).
- :class:`CudaRunner`: models on a CUDA device. What keeps a GPU busy and a CPU idle:

  * **static shapes**: a fixed set of batch sizes (:func:`graph_sizes`, the padding rule of
    :mod:`greenctl.data.batching`, which the planner models too); a batch of ``r`` rows
    runs at the smallest size >= ``r``, its padding rows ignored;
  * **CUDA graphs** per size where the model allows capture (one memory pool shared by all
    sizes), else the eager module on the same static buffers;
  * **pinned host buffers** and asynchronous copies on one CUDA stream: :meth:`submit`
    copies the rows into a pinned slot and enqueues copy-in, model and copy-out, then returns
    a :class:`Ticket`; :meth:`wait` blocks on the ticket's event. ``depth`` slots let the
    next batch be assembled and enqueued while the GPU runs the current one;
  * **no spinning**: events are created with ``blocking=True`` (``cudaEventBlockingSync``),
    so a thread waiting for the GPU sleeps instead of polling a core;
  * ``cudnn.benchmark`` on: each static shape gets its fastest convolution algorithms,
    chosen during the warm-up;
  * a **warm-up** that runs every size it will serve, then the largest size until
    ``min_s`` has passed and the per-batch time has settled; it reports how long that took.

``GREENCTL_GPU_PIPELINE=0`` selects the eager path on GPUs too (the executor before this
runner: pageable copies, ``torch.cuda.synchronize`` after each batch); ``bench/bench_gpu_serving.py``
runs both in one run. ``GREENCTL_CUDA_GRAPHS=0`` keeps the pipeline without graphs.

torch is imported lazily.
"""

from __future__ import annotations

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

    def submit(self, parts: Sequence[np.ndarray]) -> Ticket:
        arr = parts[0] if len(parts) == 1 else np.concatenate(parts)
        t0 = time.perf_counter()
        out = run_eager(self.loaded, arr, numpy_native=self.numpy_native)
        return Ticket(rows=int(arr.shape[0]), out=out, host_s=time.perf_counter() - t0)

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
    x = torch.from_numpy(np.ascontiguousarray(arr))
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
