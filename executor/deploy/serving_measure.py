"""Measure the serving path: what a request spends outside the model.

A profile times inference in-process; a served request also crosses HTTP, the dispatcher
and the executor daemon. :func:`measure_serving` starts one executor and a dispatcher in a
scratch state folder (the running plan is never touched) and sends open-loop Poisson loads
through the dispatcher and straight to the executor. The stand-in is ``model`` (the
variant; its reported queue and run times are subtracted so the queueing model's share is
not counted twice) or ``noop`` (a zero model of the variant's shapes). Rows are
:class:`~greenctl.executor.runtime.serving.ServingMeasurement`; this lives apart from
:mod:`greenctl.executor.runtime.serving` because it runs ``apply``. See docs/serving.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Variant, utcnow_iso
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store, open_store
from greenctl.executor.deploy import apply as apply_module
from greenctl.executor.runtime.daemon import NOOP_LOADER
from greenctl.executor.runtime.loadgen import model_input, run_load
from greenctl.executor.runtime.serving import (
    DEFAULT_RATES,
    PATHS,
    QUANTILE_POINTS,
    STAND_INS,
    ServingMeasurement,
)
from greenctl.profiler.harness import resolve_variants
from greenctl.profiler.hw import cpu_info
from greenctl.profiler.models import load_model
from greenctl.profiler.progress import Progress, no_progress


def output_elements_of(variant: Variant) -> int:
    """Elements per row of ``variant``'s output (loads it on the CPU and runs one row)."""
    loaded = load_model(variant, device="cpu")
    out = loaded.run(loaded.example(1))
    return max(int(math.prod(tuple(out.shape))), 1)  # one row: torch tensor or numpy array


def _cpu_s(pid: int | None) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc), None when unreadable."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ms_per_request(before: float | None, pid: int | None, requests: int) -> float | None:
    """CPU ms a process spent per request since ``before`` (None when unknown)."""
    after = _cpu_s(pid)
    if before is None or after is None or requests <= 0:
        return None
    return 1000.0 * (after - before) / requests


def executor_own_cpu_ms(total_ms: float, runs_ms: Any, *, on_cores: bool) -> float:
    """The executor daemon's own CPU per request (its HTTP front, batching and encoding),
    from the whole process's (``total_ms``) and each request's model run (``runs_ms``).

    On CPU cores the model's run is CPU work of the same process (one thread on ``cpu:1``):
    it is taken off. On a GPU, MIG or MPS resource the run is the device's (the runner
    waits for it asleep): all the process's CPU is the executor's own, which planning
    charges as the instance's executor front (``evaluate.front_cpu_ms``). Taking the run
    off there left nothing: the H200's resnet rows stored 0.0 ms against 0.4-1 ms of CPU
    per request measured by ``bench/bench_gpu_serving.py``.
    """
    import numpy as np

    if not on_cores:
        return max(float(total_ms), 0.0)
    return max(float(total_ms) - float(np.nanmean(np.asarray(runs_ms, dtype=float))), 0.0)


def _midpoint_quantiles(values: Any, n: int = QUANTILE_POINTS) -> list[float]:
    import numpy as np

    arr = np.asarray(values, dtype=float)
    return [float(x) for x in np.quantile(arr, (np.arange(n) + 0.5) / n)]


@contextlib.contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


#: Requests per rate and path at the least (``measure_serving``): the p95 and p99 of fewer
#: are set by a handful of requests.
MIN_REQUESTS = 400


@dataclass(frozen=True)
class ServingOptions:
    """How :func:`measure_serving` measures (each field is described there)."""

    rates: Sequence[float] = DEFAULT_RATES
    duration_s: float = 5.0
    policy: str = "wrr"
    paths: Sequence[str] = PATHS
    output_elements: int | None = None
    cores: list[int] | None = None
    stand_in: str = "model"
    min_requests: int = MIN_REQUESTS
    resource: str = "cpu:1"
    batch: int = 1
    max_wait_ms: float = DEFAULT_MAX_WAIT_MS

    def checked_rates(self) -> list[float]:
        """The rates as floats, after checking every option.

        Raises:
            InputError: bad rates, duration, max wait, stand-in, path, resource or batch.
        """
        rates = [float(r) for r in self.rates]
        if not rates or any(not (r > 0) for r in rates):
            raise InputError(
                "serving rates must be > 0 req/s", hint="for example --rate 10 --rate 40"
            )
        if not self.duration_s > 0:
            raise InputError("--duration must be > 0 seconds")
        if not (0 <= self.max_wait_ms < float("inf")):
            raise InputError(f"--max-wait-ms must be a number of ms >= 0, got {self.max_wait_ms}")
        if self.stand_in not in STAND_INS:
            raise InputError(f"unknown stand-in '{self.stand_in}'", hint="use model or noop")
        bad = [p for p in self.paths if p not in PATHS]
        if bad or not self.paths:
            raise InputError(
                f"unknown serving path {bad[0] if bad else ''!r}", hint="use dispatcher or direct"
            )
        parse_resource(self.resource)
        if not isinstance(self.batch, int) or self.batch < 1:
            raise InputError(f"--batch must be a whole number >= 1, got {self.batch!r}")
        return rates


def measure_serving(
    store: Store,
    *,
    variant: str,
    options: ServingOptions | None = None,
    progress: Progress = no_progress,
    **fields: Any,
) -> list[ServingMeasurement]:
    """Measure the serving path for ``variant``'s tensor shapes at each rate (nothing saved).

    ``options`` (:class:`ServingOptions`) says how to measure; ``fields`` override any of its
    fields by name. The measurement runs in a scratch store; ``progress`` is called with a
    message and the fraction done. Measure on an otherwise idle machine for figures that hold.

    Raises:
        TypeError: a field :class:`ServingOptions` does not have.
        InputError: bad rates, duration, max wait, path, or a variant without an input shape.
        NotFoundError: unknown variant.
        ExecutorError: the executor or dispatcher did not start.
    """
    opts = dataclasses.replace(options or ServingOptions(), **fields)
    rates = opts.checked_rates()
    where = parse_resource(opts.resource)
    (v,) = resolve_variants(store, names=[variant])  # NotFoundError names the known ones
    if not v.input_shape:
        raise InputError(
            f"variant '{variant}' has no input shape",
            hint="profile it first (`greenctl profile --variant ...`) so its shape is recorded",
        )
    if opts.stand_in == "noop":
        progress("finding the model's output size", 0.01)
        out_elems = int(opts.output_elements) if opts.output_elements else output_elements_of(v)
    else:
        out_elems = int(opts.output_elements or 0)  # read from the executor's metadata below
    run = _Run(
        v,
        opts,
        rates,
        hardware=cpu_info().model_name if where.spec.pins_cores else where.label,
        stamp=utcnow_iso(),  # one stamp for the whole run: serving_overheads picks runs by it
        out_elems=out_elems,
    )
    tmp = Path(tempfile.mkdtemp(prefix="greenctl-serving-"))
    # A scratch store and state folder: the running plan's state, lock and ports stay apart.
    try:
        with _env(GREENCTL_STATE_DIR=str(tmp / "state")):
            rows = _measure_in(run, tmp / "serving.db", progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    progress("done", 1.0)
    return rows


@dataclass
class _Run:
    """One serving measurement: the variant, the options, and what the served executor
    and dispatcher say once they run (their URLs and pids)."""

    v: Variant
    opts: ServingOptions
    rates: list[float]
    hardware: str
    stamp: str
    out_elems: int
    urls: dict[str, str] = field(default_factory=dict)
    pids: dict[str, int | None] = field(default_factory=dict)
    input_bytes: int = 0


def _measure_in(run: _Run, db: Path, progress: Progress) -> list[ServingMeasurement]:
    """Serve the variant from a scratch store at ``db`` (taken down after) and measure
    every rate and path."""
    v, opts = run.v, run.opts
    where = parse_resource(opts.resource)
    scratch = open_store(db)
    try:
        scratch.upsert_variant(v)
        plan = Plan(
            kind="mix",
            deployments=[
                Deployment(
                    model=v.family,
                    variant=v.name,
                    resource=where.label,
                    count=1,
                    batch=opts.batch,
                    quota_rps=max(run.rates),
                )
            ],
        )
        progress(f"starting a {opts.stand_in} executor and a dispatcher (scratch state)", 0.05)
        with _env(GREENCTL_NOOP_OUTPUT_ELEMENTS=str(run.out_elems), GREENCTL_NOOP_SERVICE_MS="0"):
            res = apply_module.apply_plan(
                plan,
                store=scratch,
                loader=NOOP_LOADER if opts.stand_in == "noop" else None,
                policy=opts.policy,
                cores=opts.cores if where.spec.pins_cores else None,
                max_queue=4096,
                max_wait_ms=opts.max_wait_ms,
            )
        st = apply_module.status(scratch)
        run.urls = {"dispatcher": res.dispatcher_url or "", "direct": st["instances"][0]["url"]}
        run.pids = {"dispatcher": st["dispatcher"]["pid"], "executor": st["instances"][0]["pid"]}
        body, _headers = model_input(run.urls["direct"], v.family)
        run.input_bytes = len(body)
        if not run.out_elems:
            run.out_elems = _output_elements(run.urls["direct"], v.family)
        for url in {run.urls[p] for p in opts.paths}:  # warm both hops up
            run_load(url, v.family, duration_s=0.5, rate_rps=min(run.rates), seed=99)
        rows = []
        steps = len(run.rates) * len(opts.paths)
        for k, (rate, path) in enumerate((r, p) for r in run.rates for p in opts.paths):
            progress(f"{path} at {rate:g} req/s", 0.1 + 0.9 * k / steps)
            rows.append(_measure_one(run, rate, path, seed=k + 1))
        return rows
    finally:
        with contextlib.suppress(Exception):
            apply_module.down(scratch)
        scratch.close()


def _measure_one(run: _Run, rate: float, path: str, *, seed: int) -> ServingMeasurement:
    """One open-loop load at ``rate`` through ``path``: the serving path's latency (less the
    executor's own queue and run, for the model stand-in) and each process's CPU.

    Raises:
        InputError: no request succeeded.
    """
    import numpy as np

    v, opts = run.v, run.opts
    before = {n: _cpu_s(p) for n, p in run.pids.items()}
    out = run_load(
        run.urls[path],
        v.family,
        duration_s=max(opts.duration_s, opts.min_requests / rate),
        rate_rps=rate,
        seed=seed,
    )
    cpu_ms = {
        n: _ms_per_request(before[n], p, out.ok)
        if n == "executor" or path == "dispatcher"
        else None
        for n, p in run.pids.items()
    }
    if not out.latencies_ms:
        raise InputError(
            f"no request succeeded through the {path} path at {rate:g} req/s",
            hint="lower the rate",
        )
    lat = np.asarray(out.latencies_ms)
    runs_ms = np.asarray(out.server_infer_ms, dtype=float)
    timed = opts.stand_in == "model" and bool(np.isfinite(runs_ms).any())
    infer_q = (
        [float(x) for x in np.nanpercentile(runs_ms, [50, 95, 99])] if timed else [None, None, None]
    )
    rows_run = np.asarray(out.server_batch_rows, dtype=float)
    rows_p50 = (
        float(np.nanmedian(rows_run)) if timed and bool(np.isfinite(rows_run).any()) else None
    )
    where = parse_resource(opts.resource)
    if timed and cpu_ms["executor"] is not None:
        cpu_ms["executor"] = executor_own_cpu_ms(
            cpu_ms["executor"], runs_ms, on_cores=where.spec.pins_cores
        )
    if opts.stand_in == "model":
        inside = np.asarray(out.server_queue_ms) + runs_ms
        lat = np.clip(lat - np.nan_to_num(inside, nan=0.0), 0.0, None)
    return ServingMeasurement(
        family=v.family,
        variant=v.name,
        path=path,
        stand_in=opts.stand_in,
        policy=opts.policy,
        rate_rps=rate,
        input_bytes=run.input_bytes,
        output_elements=run.out_elems,
        p50_ms=float(np.percentile(lat, 50)),
        p95_ms=float(np.percentile(lat, 95)),
        p99_ms=float(np.percentile(lat, 99)),
        quantiles_ms=_midpoint_quantiles(lat),
        executor_cpu_ms_per_request=cpu_ms["executor"],
        dispatcher_cpu_ms_per_request=cpu_ms["dispatcher"],
        infer_p50_ms=infer_q[0],
        infer_p95_ms=infer_q[1],
        infer_p99_ms=infer_q[2],
        resource=where.label,
        batch=opts.batch,
        infer_rows_p50=rows_p50,
        samples=len(lat),
        hardware=run.hardware,
        created_at=run.stamp,
    )


def _output_elements(url: str, model: str) -> int:
    """Output elements per row, from the executor's model metadata."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}", timeout=5.0) as resp:
        meta = json.loads(resp.read())
    shape = [d for d in meta["outputs"][0]["shape"] if d >= 0]
    return max(math.prod(shape), 1)
