"""The executor daemon: one planned instance of one variant on one resource.

Run as ``python -m greenctl.executor.runtime.daemon --model M --variant V --resource cpu:1
--port 0 --state-file PATH`` (``greenctl apply`` starts it detached). It pins itself to its
cores or uses the CUDA environment its spawner set, loads and warms the variant, then serves
the Open Inference Protocol (KServe v2 REST, JSON and Triton binary tensors) on loopback,
Prometheus ``/metrics`` (energy, power, carbon) and ``POST /admin/carbon`` for loopback
clients with its token (``$GREENCTL_EXECUTOR_TOKEN``, else a random one in its state file).
Requests are batched up to ``--batch`` rows within ``--max-wait-ms`` and run in a worker
thread (on the loop for a numpy model cheaper than that hop: :meth:`Batcher.calibrate`).
When ready it writes its pid and port to ``--state-file``. See docs/serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.util
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError, NotFoundError, shown
from greenctl.data.records import Variant
from greenctl.data.resources import kind_of
from greenctl.data.store import open_store
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.dispatch_modelless import requirements_of
from greenctl.executor.runtime.metrics import (
    BATCH_BUCKETS,
    LATENCY_BUCKETS_S,
    EnergyExport,
    bucket_index,
    check_carbon,
    histogram_lines,
)
from greenctl.executor.runtime.procs import (
    proc_start_ticks,
    run_async,
    settle_heap,
    write_json_atomic,
)
from greenctl.profiler.energy import serving_counter
from greenctl.profiler.models import ensure_builtin_variant
from greenctl.profiler.user_code import caller_dir, import_user_module, user_path

if TYPE_CHECKING:  # numpy and the runners load with the model (`status` imports this module)
    import numpy as np

DEFAULT_LOADER = "greenctl.profiler.models:load_model"
NOOP_LOADER = "greenctl.executor.runtime.daemon:noop_loader"
INPUT_NAME = "input"
OUTPUT_NAME = "output"
#: the environment variable a launcher may hand the executor its admin token in (else a
#: random one); the token is written to its state file, which only its user can read
TOKEN_ENV = "GREENCTL_EXECUTOR_TOKEN"
#: rows one request may carry, as a multiple of the largest batch (``--max-rows`` overrides;
#: at least this many rows): a request runs as one batch, so the limit bounds how long one
#: request holds the executor (a 2,000-row request held one for 7.8 s)
ROWS_PER_BATCH_LIMIT = 8
#: a numpy-native model whose batches take less than this runs them on the event loop: a
#: hop to the worker thread and back (two cross-thread wake-ups, ~80 us of CPU on a 2-core
#: VM) would cost more than the run; a torch model always keeps its thread
INLINE_MAX_S = 1e-4
#: inline batches whose median decides whether a model stays on the loop
INLINE_WINDOW = 16


# -- models ------------------------------------------------------------------------------
class NoopModel:
    """A model that returns its input: measures serving overhead, not inference.

    ``GREENCTL_NOOP_SERVICE_MS`` adds a fixed sleep per batch (a stand-in service time);
    ``GREENCTL_NOOP_OUTPUT_ELEMENTS`` makes it answer zeros of that many elements per row
    instead (shaped like a real model's output, e.g. 1000 class scores).
    """

    numpy_native = True

    def __init__(
        self,
        input_shape: tuple[int, ...],
        service_ms: float = 0.0,
        output_elements: int | None = None,
    ) -> None:
        self.input_shape = input_shape
        self.module = None
        self.service_s = service_ms / 1000.0
        self.output_elements = output_elements

    def example(self, batch: int) -> np.ndarray:
        import numpy as np

        return np.zeros((batch, *self.input_shape), dtype=np.float32)

    def run(self, x: np.ndarray) -> np.ndarray:
        import numpy as np

        if self.service_s:
            time.sleep(self.service_s)
        if self.output_elements:
            return np.zeros((x.shape[0], self.output_elements), dtype=np.float32)
        return x


def noop_loader(variant: Any, *, device: str = "cpu") -> NoopModel:
    """Loader of :class:`NoopModel` (same signature as ``profiler.models.load_model``)."""
    del device
    shape_text = getattr(variant, "input_shape", None) or "4"
    shape = tuple(int(s) for s in str(shape_text).split(",") if s.strip())
    out = int(os.environ.get("GREENCTL_NOOP_OUTPUT_ELEMENTS", "0") or 0)
    return NoopModel(
        shape, float(os.environ.get("GREENCTL_NOOP_SERVICE_MS", "0") or 0), out or None
    )


def resolve_loader(spec: str) -> Callable[..., Any]:
    """``package.module:function`` or ``/path/file.py:function`` -> the function.

    A module that is not installed, and a relative file, are looked for in the folder
    greenctl was run from (:func:`~greenctl.profiler.user_code.caller_dir`; a daemon is told
    it, as it runs elsewhere).

    Raises:
        InputError: the module or function cannot be found.
    """
    mod_name, sep, func = spec.rpartition(":")
    if not sep or not mod_name or not func:
        raise InputError(f"loader '{spec}' must look like module:function or file.py:function")
    try:
        if mod_name.endswith(".py"):
            path = Path(user_path(mod_name))
            module_spec = importlib.util.spec_from_file_location(
                f"_greenctl_loader_{path.stem}", path
            )
            if module_spec is None or module_spec.loader is None:
                raise ImportError(f"cannot load {path}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = import_user_module(mod_name)
    except (ImportError, OSError) as exc:
        raise InputError(f"cannot import loader module '{mod_name}': {exc}") from None
    fn = getattr(module, func, None)
    if not callable(fn):
        raise InputError(f"loader module '{mod_name}' has no function '{func}'")
    return fn  # type: ignore[no-any-return]


# -- metrics -----------------------------------------------------------------------------
class Metrics:
    """Counters and histograms rendered in Prometheus text format."""

    def __init__(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self.latency_sum_s = 0.0
        self.batch_counts = [0] * (len(BATCH_BUCKETS) + 1)
        self.batch_sum = 0
        self.busy_s = 0.0
        self.window: collections.deque[float] = collections.deque(maxlen=4096)
        self.lock = threading.Lock()

    def observe(self, code: str, latency_s: float) -> None:
        self.requests[code] += 1
        if code == "200":
            self.latency_counts[bucket_index(LATENCY_BUCKETS_S, latency_s)] += 1
            self.latency_sum_s += latency_s
            self.window.append(latency_s)

    def observe_batch(self, rows: int, busy_s: float) -> None:
        with self.lock:
            self.batch_counts[bucket_index(BATCH_BUCKETS, rows)] += 1
            self.batch_sum += rows
            self.busy_s += busy_s

    def quantile_ms(self, q: float) -> float | None:
        if not self.window:
            return None
        import numpy as np

        return float(np.quantile(np.fromiter(self.window, float), q) * 1000.0)

    def render(self, labels: str) -> str:
        lines = [
            "# HELP greenctl_requests_total Inference requests by HTTP status code.",
            "# TYPE greenctl_requests_total counter",
        ]
        for code, n in sorted(self.requests.items()):
            lines.append(f'greenctl_requests_total{{{labels},code="{code}"}} {n}')
        lines += histogram_lines(
            "greenctl_request_latency_seconds",
            "Latency of successful requests inside the executor.",
            labels,
            LATENCY_BUCKETS_S,
            self.latency_counts,
            self.latency_sum_s,
        )
        with self.lock:
            lines += histogram_lines(
                "greenctl_batch_size",
                "Rows per executed batch.",
                labels,
                BATCH_BUCKETS,
                self.batch_counts,
                float(self.batch_sum),
            )
            busy = self.busy_s
        lines += [
            "# HELP greenctl_busy_seconds_total Seconds the worker spent running batches.",
            "# TYPE greenctl_busy_seconds_total counter",
            f"greenctl_busy_seconds_total{{{labels}}} {busy:.6f}",
            "# HELP greenctl_request_latency_window_ms Latency quantiles of the last 4096 requests.",
            "# TYPE greenctl_request_latency_window_ms gauge",
        ]
        for q in (0.5, 0.95, 0.99):
            value = self.quantile_ms(q)
            if value is not None:
                lines.append(
                    f'greenctl_request_latency_window_ms{{{labels},quantile="{q}"}} {value:.4f}'
                )
        return "\n".join(lines) + "\n"


# -- batching ----------------------------------------------------------------------------
class _Item:
    __slots__ = ("arr", "batch_rows", "future", "queued_at", "ran_s", "rows", "started_at")

    def __init__(self, arr: np.ndarray, future: asyncio.Future[np.ndarray]) -> None:
        self.arr = arr
        self.future = future
        self.rows = int(arr.shape[0])
        self.queued_at = time.perf_counter()
        self.started_at = self.queued_at
        self.ran_s = 0.0
        self.batch_rows = self.rows


class Batcher:
    """Dynamic batching: gather requests up to ``max_batch`` rows or ``max_wait_s``.

    Batches run through a runner (:mod:`greenctl.profiler.runner`, the one the profiler
    measures with). A runner of depth > 1 (GPUs) takes the next batch while the current one
    runs: up to ``depth`` batches are in flight, submitted from one thread and waited for in
    another, so assembling and copying a batch overlaps the GPU's work on the one before.
    """

    def __init__(
        self,
        loaded: Any,
        *,
        max_batch: int,
        max_wait_s: float,
        metrics: Metrics,
        runner: Any = None,
    ) -> None:
        self.loaded = loaded
        self.max_batch = max(1, max_batch)
        self.max_wait_s = max(0.0, max_wait_s)
        self.metrics = metrics
        from greenctl.profiler.runner import EagerRunner

        self.runner = runner if runner is not None else EagerRunner(loaded)
        self.depth = max(1, int(getattr(self.runner, "depth", 1)))
        self.queue: asyncio.Queue[_Item] = asyncio.Queue()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")
        self.wait_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer-wait")
        self.numpy_native = bool(getattr(loaded, "numpy_native", False))
        self.in_flight: set[asyncio.Task[None]] = set()
        #: the runner finishes a batch at submit (its wait returns at once): no second hop
        self.eager = isinstance(self.runner, EagerRunner)
        #: run batches on the event loop itself (set by :meth:`calibrate`, never for torch)
        self.inline = False
        self.inline_runs: collections.deque[float] = collections.deque(maxlen=INLINE_WINDOW)

    def calibrate(self, example: Callable[[int], np.ndarray], rounds: int = 5) -> float | None:
        """Time the costliest batch (``max_batch`` one-row requests, copied together) and
        decide whether batches run on the event loop: only a numpy-native model whose
        median batch takes under :data:`INLINE_MAX_S` (a no-op, a lookup), for which the
        worker thread's two wake-ups cost more than the run. Returns that median (s), None
        for a model that keeps its thread whatever it takes."""
        if not (self.eager and self.numpy_native):
            return None
        parts = [example(1) for _ in range(self.max_batch)]
        times = []
        for _ in range(max(1, rounds)):
            t0 = time.perf_counter()
            self.runner.wait(self.runner.submit(parts))
            times.append(time.perf_counter() - t0)
        median = sorted(times)[len(times) // 2]
        self.inline = median < INLINE_MAX_S
        return median

    def _run_inline(self, parts: list[np.ndarray]) -> Any:
        """Run a batch on the loop; a model that turns out slower (the median of its last
        :data:`INLINE_WINDOW` batches over :data:`INLINE_MAX_S`) goes back to the thread."""
        t0 = time.perf_counter()
        try:
            return self.runner.submit(parts)
        finally:
            runs = self.inline_runs
            runs.append(time.perf_counter() - t0)
            if len(runs) == runs.maxlen and sorted(runs)[len(runs) // 2] > INLINE_MAX_S:
                self.inline = False

    async def submit(self, arr: np.ndarray) -> np.ndarray:
        return (await self.submit_timed(arr))[0]

    async def submit_timed(self, arr: np.ndarray) -> tuple[np.ndarray, float, float, int]:
        """The output, the seconds queued before its batch started, the batch's run time and
        the rows of that batch."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        item = _Item(arr, future)
        self.queue.put_nowait(item)
        out = await future
        return out, item.started_at - item.queued_at, item.ran_s, item.batch_rows

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.depth)
        pending: _Item | None = None
        try:
            while True:
                first = pending or await self.queue.get()
                pending = None
                items = [first]
                rows = first.rows
                tail = first.arr.shape[1:]
                deadline = loop.time() + self.max_wait_s
                while rows < self.max_batch:
                    try:
                        item = self.queue.get_nowait()
                    except asyncio.QueueEmpty:
                        timeout = deadline - loop.time()
                        if timeout <= 0:
                            break
                        try:
                            item = await asyncio.wait_for(self.queue.get(), timeout)
                        except TimeoutError:
                            break
                    if item.arr.shape[1:] != tail or rows + item.rows > self.max_batch:
                        pending = item  # starts the next batch
                        break
                    items.append(item)
                    rows += item.rows
                if self.eager:
                    await self._run_eager(items, rows)
                    continue
                await slots.acquire()  # at most `depth` batches in flight
                started = time.perf_counter()
                try:
                    ticket = await loop.run_in_executor(
                        self.pool, self.runner.submit, [i.arr for i in items]
                    )
                except Exception as exc:  # a failing batch fails its requests, not the daemon
                    slots.release()
                    self._fail(items, exc)
                    continue
                task = loop.create_task(self._finish(items, ticket, started, rows, slots))
                self.in_flight.add(task)
                task.add_done_callback(self.in_flight.discard)
        finally:
            for task in list(self.in_flight):
                task.cancel()

    async def _run_eager(self, items: list[_Item], rows: int) -> None:
        """Run a batch on a runner that finishes it at submit: on the loop when
        :attr:`inline`, else one hop to the worker thread and back; then answer it."""
        parts = [i.arr for i in items]
        started = time.perf_counter()
        try:
            if self.inline:
                ticket = self._run_inline(parts)
            else:
                loop = asyncio.get_running_loop()
                ticket = await loop.run_in_executor(self.pool, self.runner.submit, parts)
            out, ran = self.runner.wait(ticket)
        except Exception as exc:  # a failing batch fails its requests, not the daemon
            self._fail(items, exc)
            return
        self._deliver(items, out, ran, started, rows)

    async def _finish(
        self,
        items: list[_Item],
        ticket: Any,
        started: float,
        rows: int,
        slots: asyncio.Semaphore,
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            out, ran = await loop.run_in_executor(self.wait_pool, self.runner.wait, ticket)
        except Exception as exc:
            self._fail(items, exc)
            return
        finally:
            slots.release()
        self._deliver(items, out, ran, started, rows)

    def _deliver(
        self, items: list[_Item], out: np.ndarray, ran: float, started: float, rows: int
    ) -> None:
        """Count the batch and hand each request its rows of the output."""
        self.metrics.observe_batch(rows, ran)
        start = 0
        for i in items:
            i.started_at, i.ran_s, i.batch_rows = started, ran, rows
            if not i.future.done():
                i.future.set_result(out[start : start + i.rows])
            start += i.rows

    @staticmethod
    def _fail(items: list[_Item], exc: BaseException) -> None:
        for i in items:
            if not i.future.done():
                i.future.set_exception(exc)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.wait_pool.shutdown(wait=False, cancel_futures=True)


def default_max_rows(max_batch: int) -> int:
    """Rows one request may carry by default: :data:`ROWS_PER_BATCH_LIMIT` batches."""
    return ROWS_PER_BATCH_LIMIT * max(1, int(max_batch))


def run_model(loaded: Any, arr: np.ndarray, *, numpy_native: bool) -> np.ndarray:
    """Run one batch through a LoadedModel eagerly (see :func:`greenctl.profiler.runner.run_eager`)."""
    from greenctl.profiler.runner import run_eager

    return run_eager(loaded, arr, numpy_native=numpy_native)


# -- the server --------------------------------------------------------------------------
def model_rows(
    model: str, doc: dict[str, Any], tensors: list[tuple[str, Any]], input_shape: Sequence[int]
) -> tuple[np.ndarray, bool]:
    """A decoded request's one input as rows of ``input_shape``, and whether it came as one
    row without the batch dimension: the tensor contract of every front (one input
    ``INPUT_NAME``, outputs only ``OUTPUT_NAME``), the Ray backend's included.

    Raises:
        InputError: another input or output name, a repeated input, a shape that does not
            fit the model, or no rows.
    """
    for name, _ in tensors:
        if name != INPUT_NAME:
            raise InputError(
                f"model '{shown(model)}' has no input '{shown(name)}'; "
                f"its one input is '{INPUT_NAME}'"
            )
    if len(tensors) > 1:
        raise InputError(f"input '{INPUT_NAME}' is given {len(tensors)} times")
    for out in doc.get("outputs") or []:
        if out["name"] != OUTPUT_NAME:
            raise InputError(
                f"model '{shown(model)}' has no output '{shown(out['name'])}'; "
                f"its one output is '{OUTPUT_NAME}'"
            )
    arr = tensors[0][1]
    squeeze = arr.ndim == len(input_shape)
    if squeeze:
        arr = arr[None, ...]
    if tuple(arr.shape[1:]) != tuple(input_shape):
        raise InputError(
            f"input shape {list(arr.shape)} does not match the model's "
            f"[-1, {', '.join(map(str, input_shape))}]"
        )
    if arr.shape[0] < 1:
        raise InputError("the input has no rows")
    return arr, squeeze


class ExecutorServer:
    """The OIP REST app of one loaded model."""

    def __init__(
        self,
        loaded: Any,
        *,
        model: str,
        variant: str,
        resource: str,
        max_batch: int,
        max_wait_s: float,
        runner: Any = None,
        max_rows: int | None = None,
        token: str = "",
    ) -> None:
        self.loaded = loaded
        #: what an admin request must carry (:func:`~greenctl.executor.runtime.httpserver.admin_allowed`)
        self.token = token or secrets.token_hex(16)
        self.model = model
        self.variant = variant
        self.resource = resource
        self.names = {model, variant}
        self.metrics = Metrics()
        # the runner the profiler measures with: on a GPU, graphs of every batch size it will
        # run, pinned buffers and a stream (made here, before serving)
        import numpy as np
        from greenctl.profiler.runner import make_runner

        self.runner = runner if runner is not None else make_runner(loaded, max_batch=max_batch)
        self.batcher = Batcher(
            loaded,
            max_batch=max_batch,
            max_wait_s=max_wait_s,
            metrics=self.metrics,
            runner=self.runner,
        )
        self.warmup: dict[str, Any] = {}
        self.input_shape = tuple(int(d) for d in loaded.input_shape)
        self.max_rows = max(1, max_rows) if max_rows else default_max_rows(max_batch)
        example = np.asarray(_to_numpy(loaded.example(1)))
        self.input_dtype = example.dtype
        self.input_datatype = oip.oip_datatype(example)
        self.output_shape: tuple[int, ...] = ()
        self.output_dtype = "FP32"
        self.ready = False
        self.energy: EnergyExport | None = None

    def warm_up(self, rounds: int = 3) -> None:
        """Run every batch size the runner will serve (on a GPU, then the largest one until
        its time settles, at least ``GPU_WARMUP_S``) so the first requests are not slow."""
        from greenctl.profiler.runner import GPU_WARMUP_S, host_example

        on_gpu = str(getattr(self.loaded, "device", "cpu")).startswith("cuda")
        sizes = list(getattr(self.runner, "sizes", None) or sorted({self.batcher.max_batch, 1}))
        doc = self.runner.warm_up(
            lambda b: host_example(self.loaded, b),
            sizes,
            rounds=rounds,
            min_s=GPU_WARMUP_S if on_gpu else 0.0,
        )
        self.warmup = doc.to_dict()
        if getattr(self.runner, "graph_error", None):
            self.warmup["graph_error"] = self.runner.graph_error
        out = self.runner.run(host_example(self.loaded, 1))
        self.warmup["inline_batch_s"] = self.batcher.calibrate(
            lambda b: host_example(self.loaded, b)
        )
        self.warmup["inline"] = self.batcher.inline
        self.output_shape = tuple(int(d) for d in out.shape[1:])
        self.output_dtype = oip.oip_datatype(out)

    def router(self) -> hs.Router:
        router = hs.Router()
        oip.add_protocol_routes(
            router, server_meta=self.server_meta, live=self.live, ready=self.health_ready,
            model_meta=self.model_meta, model_ready=self.model_ready, infer=self.infer,
            metrics=self.metrics_page,
        )  # fmt: skip
        router.add_post("/admin/carbon", self.admin_carbon)
        return router

    async def admin_carbon(self, request: Any) -> Any:
        """``POST /admin/carbon`` ``{"carbon_g_per_kwh": G, "pue": P}`` (loopback clients
        with the executor's token only): count carbon at a new grid intensity from now on,
        without a restart (the dispatcher sends its plan's after ``replan --apply`` kept
        this executor)."""
        if not hs.admin_allowed(request, self.token):
            return hs.json_response({"error": "forbidden"}, status=403)
        if self.energy is None or self.energy.counter is None:
            return hs.json_response({"error": "this executor counts no energy"}, status=409)
        try:
            doc = await request.json()
            if not isinstance(doc, dict):
                raise InputError("the body must be a JSON object")
            intensity, pue = check_carbon(
                doc.get("carbon_g_per_kwh"),
                doc.get("pue", 1.0),
                names=("carbon_g_per_kwh", "pue"),
            )
        except ValueError as exc:
            return hs.json_response({"error": f"not JSON: {exc}"}, status=400)
        except InputError as exc:
            return hs.json_response({"error": exc.message}, status=400)
        self.energy.set_carbon(intensity, pue)
        return hs.json_response({"carbon_g_per_kwh": intensity, "pue": pue})

    async def server_meta(self, request: Any) -> Any:
        return hs.json_response(
            {"name": "greenctl-executor", "version": "1", "extensions": ["binary_tensor_data"]}
        )

    async def live(self, request: Any) -> Any:
        return hs.json_response({"live": True})

    async def health_ready(self, request: Any) -> Any:
        return hs.json_response({"ready": self.ready}, status=200 if self.ready else 503)

    def _check_name(self, request: Any) -> Any:
        name = request.match_info["name"]
        if name not in self.names:
            return hs.json_response(
                {"error": f"unknown model '{name}'; this executor serves '{self.model}'"},
                status=404,
            )
        return None

    async def model_meta(self, request: Any) -> Any:
        if (bad := self._check_name(request)) is not None:
            return bad
        return hs.json_response(
            {
                "name": self.model,
                "versions": ["1"],
                "platform": getattr(self.batcher.loaded, "platform", None)
                or ("pytorch_torchscript" if not self.batcher.numpy_native else "python"),
                "inputs": [
                    {
                        "name": INPUT_NAME,
                        "datatype": self.input_datatype,
                        "shape": [-1, *self.input_shape],
                    }
                ],
                "outputs": [
                    {
                        "name": OUTPUT_NAME,
                        "datatype": self.output_dtype,
                        "shape": [-1, *self.output_shape],
                    }
                ],
                "parameters": {
                    "variant": self.variant,
                    "resource": self.resource,
                    "max_batch_size": self.batcher.max_batch,
                    "max_rows_per_request": self.max_rows,
                },
            }
        )

    async def model_ready(self, request: Any) -> Any:
        if (bad := self._check_name(request)) is not None:
            return bad
        return hs.json_response(
            {"name": self.model, "ready": self.ready}, status=200 if self.ready else 503
        )

    async def infer(self, request: Any) -> Any:
        t0 = time.perf_counter()
        if (bad := self._check_name(request)) is not None:
            self.metrics.observe("404", 0.0)
            return bad
        body = await request.read()
        try:
            doc, arr, squeeze = self.decode(body, request.headers.get(oip.HEADER_LENGTH))
        except (InputError, ValueError) as exc:  # what the request says is wrong: a 4xx
            self.metrics.observe("400", time.perf_counter() - t0)
            return hs.json_response({"error": str(exc)}, status=400)
        try:
            out, queued_s, ran_s, batch_rows = await self.batcher.submit_timed(arr)
        except Exception as exc:
            self.metrics.observe("500", time.perf_counter() - t0)
            return hs.json_response({"error": f"inference failed: {exc}"}, status=500)
        if squeeze:
            out = out[0]
        payload, headers = oip.encode_response(
            self.model, [(OUTPUT_NAME, out)], request=doc, model_version="1"
        )
        self.metrics.observe("200", time.perf_counter() - t0)
        headers[oip.QUEUE_MS_HEADER] = f"{queued_s * 1000.0:.4f}"
        headers[oip.INFER_MS_HEADER] = f"{ran_s * 1000.0:.4f}"
        headers[oip.BATCH_ROWS_HEADER] = str(batch_rows)
        return hs.Response(body=payload, headers=headers)

    def decode(
        self, body: bytes, header_length: str | None
    ) -> tuple[dict[str, Any], np.ndarray, bool]:
        """A request's JSON, its input as a batch of rows, and whether it came as one row
        without the batch dimension (answered the same way).

        Raises:
            InputError: a malformed request, inputs or outputs this model does not have, a
                shape that does not fit it, more rows than ``max_rows``, or ``parameters``
                the dispatcher would refuse (its rule: ``requirements_of``).
        """
        requirements_of(body, header_length)  # the dispatcher's rule for ``parameters``
        length = oip.header_length(header_length)
        hint = (
            f"send them in several requests: this executor takes at most {self.max_rows} rows "
            f"of {list(self.input_shape)} per request (its --max-rows)"
        )
        try:
            doc, tensors = oip.decode_request(
                body,
                length,
                max_elements=self.max_rows * math.prod(self.input_shape),
                limit_hint=hint,
            )
        except oip.TensorTooLarge as exc:  # refused before its data was converted
            if len(exc.shape) != len(self.input_shape) + 1:
                raise
            raise self._too_many_rows(exc.shape[0], hint) from None
        arr, squeeze = model_rows(self.model, doc, tensors, self.input_shape)
        rows = int(arr.shape[0])
        if rows > self.max_rows:
            raise self._too_many_rows(rows, hint)
        if arr.dtype != self.input_dtype:
            import numpy as np

            with np.errstate(all="ignore"):
                arr = arr.astype(self.input_dtype)
        return doc, arr, squeeze

    def _too_many_rows(self, rows: int, hint: str) -> InputError:
        return InputError(
            f"{rows} rows in one request are over this executor's limit of {self.max_rows}",
            hint=hint,
        )

    async def metrics_page(self, request: Any) -> Any:
        labels = f'model="{self.model}",variant="{self.variant}",resource="{self.resource}"'
        text = self.metrics.render(labels)
        if self.energy is not None:
            text += "\n".join(self.energy.render(labels)) + "\n"
        return hs.Response(text=text, content_type="text/plain")


def _to_numpy(x: Any) -> Any:
    if hasattr(x, "detach"):
        return x.detach().to("cpu").numpy()
    return x


# -- process setup -----------------------------------------------------------------------
def pin_cores(cores: list[int]) -> None:
    """Pin this process to ``cores`` and size torch's thread pool to match."""
    if cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, set(cores))


def _set_torch_threads(n: int) -> None:
    """Size torch's pool to the pinned cores; seed it so replicas of a randomly initialised
    built-in variant hold the same weights (and answer alike)."""
    try:
        import torch
    except ImportError:
        return
    torch.manual_seed(0)
    torch.set_num_threads(max(1, n))
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)


def _load_variant(args: argparse.Namespace) -> Any:
    """The Variant record: from the store when it knows it, else a minimal one."""
    if args.variant_json:
        return Variant(**json.loads(args.variant_json))
    if args.db:
        with open_store(args.db) as store:
            try:
                return store.get_variant(args.variant)
            except NotFoundError:
                if args.loader == DEFAULT_LOADER:
                    ensure_builtin_variant(store, args.variant)
                    return store.get_variant(args.variant)
    return Variant(name=args.variant, family=args.model, input_shape=args.input_shape)


@contextlib.contextmanager
def _in_folder(folder: str) -> Iterator[None]:
    """Run the body in ``folder`` (when it exists), then back in the daemon's own folder.

    Nothing is imported from the current folder (``python -P``), so this only decides where
    relative file names in the user's loader resolve, as when they profiled from there.
    """
    home = os.getcwd()
    try:
        os.chdir(folder)
    except OSError:
        yield
        return
    try:
        yield
    finally:
        os.chdir(home)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m greenctl.executor.runtime.daemon", description=__doc__
    )
    p.add_argument("--model", required=True, help="model (family) name served")
    p.add_argument("--variant", required=True, help="variant to load")
    p.add_argument("--resource", default="cpu:1", help="resource label, e.g. cpu:2, mig:1g.10gb")
    p.add_argument("--cores", default="", help="CPU cores to pin to, comma separated")
    p.add_argument("--batch", type=int, default=1, help="largest batch (rows)")
    p.add_argument("--max-wait-ms", type=float, default=2.0, help="longest wait for a batch")
    p.add_argument(
        "--max-rows",
        type=int,
        default=None,
        help=f"most rows in one request (default {ROWS_PER_BATCH_LIMIT} x --batch)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    p.add_argument("--state-file", default=None, help="where to write pid/port when ready")
    p.add_argument("--db", default=None, help="greenctl store (for the variant record)")
    p.add_argument("--loader", default=DEFAULT_LOADER, help="module:function loading a variant")
    p.add_argument("--input-shape", default=None, help="input shape when the store lacks it")
    p.add_argument("--instance-id", default=None, help="id recorded in the state file")
    p.add_argument(
        "--variant-json", default=None, help="the Variant record as JSON (then no store is read)"
    )
    e = p.add_argument_group("energy and carbon (greenctl_energy_joules_total, ...)")
    e.add_argument(
        "--energy-source",
        default="auto",
        choices=("auto", "nvml", "rapl", "modeled"),
        help="where energy comes from (auto: NVML on GPUs, RAPL on CPUs, else modeled)",
    )
    e.add_argument("--carbon-intensity", type=float, default=None, help="grid gCO2/kWh")
    e.add_argument("--pue", type=float, default=1.0, help="facility over IT energy (>= 1)")
    # the modeled source's figures: apply passes the stored profile's (the daemon does not
    # open the store for them: that costs over a second at start)
    e.add_argument("--power-w", type=float, default=None, help="modeled busy power (W)")
    e.add_argument("--idle-power-w", type=float, default=None, help="modeled idle power (W)")
    e.add_argument(
        "--energy-j-per-request", type=float, default=None, help="modeled J per request row"
    )
    return p


def energy_export(server: ExecutorServer, args: argparse.Namespace, cores: int) -> EnergyExport:
    """The executor's energy counter (:func:`greenctl.profiler.energy.serving_counter`) and
    the intensity and PUE its carbon is counted with.

    Raises:
        InputError: a negative intensity or a PUE under 1.
    """
    intensity, pue = check_carbon(args.carbon_intensity, args.pue)
    m = server.metrics
    counter, notes = serving_counter(
        args.resource,
        cores=cores,
        env=dict(os.environ),
        busy_s=lambda: m.busy_s,
        requests=lambda: m.batch_sum,
        source=args.energy_source,
        busy_w=args.power_w,
        idle_w=args.idle_power_w,
        energy_j_per_request=args.energy_j_per_request,
    )
    return EnergyExport(counter, carbon_g_per_kwh=intensity, pue=pue, notes=notes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_file = Path(args.state_file) if args.state_file else None

    def report(doc: dict[str, Any]) -> None:
        doc.update(
            pid=os.getpid(), pid_start=proc_start_ticks(os.getpid()), instance_id=args.instance_id
        )
        if state_file is not None:
            write_json_atomic(state_file, doc)

    cores = [int(c) for c in args.cores.split(",") if c.strip()]
    try:
        pin_cores(cores)
    except OSError as exc:
        report({"error": f"cannot pin to cores {cores}: {exc.strerror}"})
        return 3
    device = "cuda" if kind_of(args.resource).accelerator else "cpu"
    try:
        if args.loader != NOOP_LOADER:
            _set_torch_threads(len(cores) or os.cpu_count() or 1)
        variant = _load_variant(args)
        with _in_folder(caller_dir()):  # user code may open files relative to its folder
            loaded = resolve_loader(args.loader)(variant, device=device)
        server = ExecutorServer(
            loaded,
            model=args.model,
            variant=args.variant,
            resource=args.resource,
            max_batch=args.batch,
            max_wait_s=args.max_wait_ms / 1000.0,
            max_rows=args.max_rows,
            token=os.environ.pop(TOKEN_ENV, ""),
        )
        server.warm_up()
        server.energy = energy_export(server, args, len(cores) or os.cpu_count() or 1)
        settle_heap()  # no full-heap collection pauses (tens of ms with torch) while serving
    except Exception as exc:
        traceback.print_exc()
        report({"error": f"loading variant '{args.variant}' failed: {type(exc).__name__}: {exc}"})
        return 3
    return int(run_async(_serve(server, args, report)))


async def _serve(
    server: ExecutorServer, args: argparse.Namespace, report: Callable[[dict[str, Any]], None]
) -> int:
    http = hs.Server(server.router())
    try:
        port = await http.start(args.host, args.port)
    except OSError as exc:
        report({"error": f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}"})
        return 4
    batcher_task = asyncio.get_running_loop().create_task(server.batcher.run_forever())
    if server.energy is not None:
        server.energy.start()
    server.ready = True
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    report(
        {
            "ready": True,
            "host": args.host,
            "port": port,
            "url": f"http://{args.host}:{port}",
            "token": server.token,
            "model": args.model,
            "variant": args.variant,
            "resource": args.resource,
            "env": {
                k: os.environ[k]
                for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                if k in os.environ
            },
            "cores": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "warmup": server.warmup,
            "energy": {
                "source": server.energy.source if server.energy else None,
                "notes": server.energy.notes if server.energy else [],
                "carbon_g_per_kwh": args.carbon_intensity,
                "pue": args.pue,
            },
        }
    )
    print(
        f"executor {args.model}/{args.variant} on {args.resource} ready at {args.host}:{port}",
        flush=True,
    )
    await stop.wait()
    server.ready = False
    if server.energy is not None:
        server.energy.stop()
    await http.shutdown()
    batcher_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await batcher_task
    server.batcher.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
