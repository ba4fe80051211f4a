"""The measurement harness: plan the points, measure them, store them in one transaction.

A *point* is (variant, resource, batch); :func:`~greenctl.profiler.run_plan.plan_runs` turns
the hardware and the user's choices into run items. ``cpu:N`` runs in this process pinned
to N cores; ``gpu:``, ``mig:`` and ``mps:`` run in a child (``python -m
greenctl.profiler.child``) that sees exactly that device as ``cuda:0``; ``emulate_mig`` runs
MIG slices as MPS shares (:mod:`greenctl.profiler.mps`). :func:`measure` warms up, then
times batches with device synchronisation: a request's latency is its batch's, throughput
is one stream's saturation throughput, peak memory is RSS growth (CPU) or
``torch.cuda.max_memory_allocated`` (GPU). Functions take ``progress(message, fraction)``
and never print. See docs/profile.md.
"""

from __future__ import annotations

import gc
import json
import math
import os
import resource as _resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import HardwareError, InputError, NotFoundError
from greenctl.data.records import Hardware, Profile, Variant
from greenctl.profiler import models
from greenctl.profiler.device import get_backend
from greenctl.profiler.energy import EnergyMeter, EnergyReading, NvmlEnergyMeter, cpu_meter
from greenctl.profiler.hw import choose_cores, discover, usable_cores
from greenctl.profiler.memory import check_memory
from greenctl.profiler.models import (
    builtin_families,
    builtin_variant,
    builtin_variants,
    one_line_error,
)
from greenctl.profiler.mps import control_binary, mps_session
from greenctl.profiler.options import DEFAULT_DURATION_S, DEFAULT_WARMUP, ProfileOptions
from greenctl.profiler.progress import Progress, no_progress
from greenctl.profiler.run_plan import RunItem, group_items, plan_runs
from greenctl.profiler.runner import (
    GPU_REWARM_S,
    GPU_WARMUP_S,
    CudaRunner,
    host_example,
    pipeline_enabled,
)

if TYPE_CHECKING:
    from greenctl.data.store import Store
    from greenctl.profiler.hw import Inventory
    from greenctl.profiler.models import LoadedModel

MIN_BATCHES = 3
#: Requests measured one at a time after an idle gap (the open-loop, low-load case).
DEFAULT_ISOLATED = 20
ISOLATED_GAP_S = 0.02
CHILD_TIMEOUT_S = 3600
#: CUDA devices this process has measured on (see ``measure``: the first point warms longer)
_WARM_DEVICES: set[str] = set()


# -- CPU slices -------------------------------------------------------------------------------
def _thread_ids() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


@contextmanager
def cpu_slice(cores: int) -> Iterator[list[int]]:
    """Run the body on ``cores`` cores: torch threads = cores, every thread pinned to them.

    Yields the CPU ids used. Restores the thread count and affinity afterwards.

    Raises:
        InputError: more cores were asked for than this process may use.
    """
    import torch

    full = set(usable_cores())  # before pinning: a thread started meanwhile gets these back
    chosen = choose_cores(cores)
    old_threads = torch.get_num_threads()
    can_pin = hasattr(os, "sched_setaffinity")
    old_masks: dict[int, set[int]] = {}
    if can_pin:
        for tid in _thread_ids():
            try:
                old_masks[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, chosen)
            except OSError:
                continue  # the thread ended meanwhile
    torch.set_num_threads(cores)
    try:
        yield chosen
    finally:
        torch.set_num_threads(old_threads)
        if can_pin:
            for tid in _thread_ids():
                try:
                    os.sched_setaffinity(tid, old_masks.get(tid, full))
                except OSError:
                    continue


# -- memory -----------------------------------------------------------------------------------
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mb() -> float:
    """Current resident set size of this process in MB (falls back to peak RSS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE / 2**20
    except (OSError, ValueError, IndexError):
        return _resource.getrusage(_resource.RUSAGE_SELF).ru_maxrss / 1024


# -- one point --------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (``q`` in [0, 100]) of a non-empty sequence."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of an empty sequence")
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Measurement:
    """The raw result of one (variant, resource, batch) point."""

    batch: int
    latencies_ms: list[float]
    duration_s: float
    memory_mb: float | None
    energy: EnergyReading | None = None
    isolated_ms: list[float] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return self.batch * len(self.latencies_ms)

    def to_profile(self, variant: str, resource: str, hardware: Hardware | None) -> Profile:
        """Summarise into a :class:`Profile` record."""
        import torch

        lat, iso = self.latencies_ms, self.isolated_ms
        busy_s = sum(lat) / 1000.0
        e = self.energy
        return Profile(
            variant=variant,
            resource=resource,
            batch=self.batch,
            throughput_rps=self.requests / busy_s if busy_s > 0 else 0.0,
            latency_p50_ms=percentile(lat, 50),
            latency_p95_ms=percentile(lat, 95),
            latency_p99_ms=percentile(lat, 99),
            isolated_p50_ms=percentile(iso, 50) if iso else None,
            isolated_p95_ms=percentile(iso, 95) if iso else None,
            isolated_p99_ms=percentile(iso, 99) if iso else None,
            hardware=hardware.model_name if hardware else None,
            power_w=e.power_w if e else None,
            idle_power_w=e.idle_power_w if e else None,
            energy_j=e.energy_j_per_request if e else None,
            energy_method=e.method if e else "modeled",
            memory_mb=self.memory_mb,
            samples=len(lat),
            duration_s=self.duration_s,
            torch_version=str(torch.__version__),
            source="measured",
        )


def measure(
    loaded: LoadedModel,
    *,
    batch: int,
    duration_s: float | None = DEFAULT_DURATION_S,
    requests: int | None = None,
    warmup: int = DEFAULT_WARMUP,
    meter: EnergyMeter | None = None,
    baseline_rss_mb: float | None = None,
    isolated: int = DEFAULT_ISOLATED,
    progress: Progress = no_progress,
) -> Measurement:
    """Measure one batch size of a loaded model on its current device and CPU slice.

    Args:
        loaded: the model (see :func:`greenctl.profiler.models.load_model`).
        batch: requests per batch.
        duration_s: measure for this long (at least ``MIN_BATCHES`` batches) ...
        requests: ... or for this many requests (``ceil(requests / batch)`` batches, at least
            ``MIN_BATCHES``); wins over ``duration_s``.
        warmup: un-timed batches first.
        meter: an energy meter started after warm-up and stopped at the end.
        baseline_rss_mb: RSS before the model was built (CPU peak memory is the growth).
        isolated: then this many batches, each after an idle gap of ``ISOLATED_GAP_S``
            (the latency of a request that finds the instance idle; bounded to about half of
            ``duration_s`` or 1 s, and at least 5 batches); 0 skips it.
        progress: called with (message, fraction of this point done).
    """
    if batch < 1:
        raise InputError(f"batch must be >= 1, got {batch}")
    if requests is None and (duration_s is None or duration_s <= 0):
        raise InputError("give a positive --duration or --requests")
    on_gpu = loaded.device.startswith("cuda")
    runs: Any = loaded
    x: Any
    if on_gpu and pipeline_enabled() and not getattr(loaded, "numpy_native", False):
        # the executors' runner (greenctl.profiler.runner): the batch's copy to the GPU, its
        # graph replay and the copy back, as a served batch of this size runs
        runs = CudaRunner(loaded, sizes=[batch], depth=1)
        x = host_example(loaded, batch)
    else:
        x = loaded.example(batch)
    min_s = 0.0
    if on_gpu:
        # the first GPU point of a process pays the library start-up and the clocks' ramp;
        # later points (another batch size, the next variant of the same child) warm the
        # new shapes only
        min_s = GPU_REWARM_S if _WARM_DEVICES else GPU_WARMUP_S
    warm_up(runs, x, runs=warmup, min_s=min_s)
    if on_gpu:
        _WARM_DEVICES.add(str(loaded.device))
    # as the executors do before serving (greenctl.executor.runtime.procs.settle_heap): a full
    # collection of torch's objects mid-loop would put a pause of tens of ms into the p99
    gc.collect()
    gc.freeze()
    if on_gpu:
        import torch

        torch.cuda.reset_peak_memory_stats(loaded.device)
    target_batches = max(MIN_BATCHES, math.ceil(requests / batch)) if requests else None
    base = rss_mb() if baseline_rss_mb is None else baseline_rss_mb
    peak = rss_mb()
    lat: list[float] = []
    if meter is not None:
        meter.start()
    start = time.perf_counter()
    last_report = start
    while True:
        t0 = time.perf_counter()
        runs.run(x)
        t1 = time.perf_counter()
        lat.append((t1 - t0) * 1000.0)
        if not on_gpu:
            peak = max(peak, rss_mb())
        elapsed = t1 - start
        if target_batches is not None:
            frac = len(lat) / target_batches
            done = len(lat) >= target_batches
        else:
            assert duration_s is not None
            frac = min(elapsed / duration_s, 1.0)
            done = elapsed >= duration_s and len(lat) >= MIN_BATCHES
        if done:
            break
        if t1 - last_report > 0.1:
            progress(f"batch {batch}", min(frac, 0.99))
            last_report = t1
    duration = time.perf_counter() - start
    energy = meter.stop(requests=batch * len(lat)) if meter is not None else None
    iso = _isolated(runs, x, isolated, budget_s=max(0.5 * (duration_s or duration), 1.0))
    if on_gpu:
        import torch

        memory: float | None = torch.cuda.max_memory_allocated(loaded.device) / 2**20
    else:
        memory = max(peak - base, 0.0)
    progress(f"batch {batch}", 1.0)
    return Measurement(
        batch, lat, duration, round(memory, 2) if memory is not None else None, energy, iso
    )


def check_first_run(loaded: Any) -> None:
    """Run one request through the model before measuring it.

    A user's model that does not take its ``--input-shape`` fails here, and the failure is
    the user's to fix, so it becomes one line naming the shape and the model's own error
    (not a traceback from deep inside torch).

    Raises:
        InputError: the model raised on a one-request input of its input shape.
        HardwareError: the device ran out of memory.
    """
    try:
        loaded.run(loaded.example(1))
    except Exception as exc:  # the user's model may raise anything
        reason = one_line_error(exc)
        if "OutOfMemoryError" in type(exc).__name__:
            raise HardwareError(
                f"{loaded.variant.name} ran out of memory on {loaded.device}: {reason}"
            ) from None
        shape = ",".join(str(d) for d in loaded.input_shape)
        raise InputError(
            f"model '{loaded.variant.name}' failed on one request of --input-shape {shape}: "
            f"{reason}",
            hint="give --input-shape as the shape of one request without the batch dimension, "
            "the shape the model's first layer expects (for example 3,224,224)",
        ) from None


def warm_up(
    loaded: Any,
    x: Any,
    *,
    runs: int,
    min_s: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> int:
    """Run ``x`` un-timed ``runs`` times, and on until ``min_s`` seconds have passed (GPUs:
    ``GPU_WARMUP_S``); returns the runs made."""
    done = 0
    start = clock()
    while done < max(runs, 0) or (min_s > 0 and clock() - start < min_s):
        loaded.run(x)
        done += 1
    return done


def _isolated(loaded: Any, x: Any, count: int, *, budget_s: float) -> list[float]:
    """Latencies (ms) of ``count`` runs, each after an idle gap; stops at ``budget_s``."""
    out: list[float] = []
    start = time.perf_counter()
    while len(out) < count:
        time.sleep(ISOLATED_GAP_S)
        t0 = time.perf_counter()
        loaded.run(x)
        t1 = time.perf_counter()
        out.append((t1 - t0) * 1000.0)
        if t1 - start > budget_s and len(out) >= 5:
            break
    return out


# -- running ----------------------------------------------------------------------------------
def make_meter(spec: dict[str, Any]) -> tuple[EnergyMeter | None, Callable[[], None]]:
    """Build the energy meter a run item names; returns (meter, close)."""
    kind = spec.get("kind")
    if kind == "cpu":
        meter = cpu_meter(
            int(spec["cores"]), total_cores=int(spec["total_cores"]), rapl=spec.get("rapl")
        )
        return meter, lambda: None
    if kind == "nvml":
        backend = get_backend()
        if backend is None:
            raise HardwareError("NVML is not available to read the GPU energy counter")
        return (
            NvmlEnergyMeter(backend, int(spec["gpu_index"]), share=float(spec.get("share", 1.0))),
            backend.close,
        )
    return None, lambda: None


def measure_variant(
    spec: dict[str, Any], *, progress: Progress = no_progress
) -> tuple[list[Measurement], float | None, dict[str, Any]]:
    """Measure every batch of one run item *in this process* (used directly for CPUs and by
    the child for GPUs). Returns (measurements, load_time_s, variant facts)."""
    variant = Variant(**spec["variant"])
    cores = spec.get("cores")
    slice_ctx = cpu_slice(int(cores)) if cores else nullcontext()
    batches = list(spec["batches"])
    out: list[Measurement] = []
    meter, close = make_meter(spec.get("meter") or {})
    try:
        with slice_ctx:
            base = rss_mb()
            loaded = models.load_model(variant, device=spec.get("device") or "cpu")
            check_first_run(loaded)
            params = sum(int(p.numel()) for p in loaded.module.parameters())
            settle_idle = getattr(meter, "settle_idle", None)
            if settle_idle is not None:
                # A GPU's idle power as a served instance sees it: the model loaded and run
                # once (its CUDA context open), then left until the reading stops falling.
                # Read before loading, it was the previous variant's cooling tail: 70, 133
                # and 159 W for three variants on the same H100 (settled: 123 W).
                warm_up(loaded, loaded.example(batches[0] if batches else 1), runs=1)
                settle_idle()
            for i, b in enumerate(batches):

                def inner(msg: str, frac: float, i: int = i) -> None:
                    progress(msg, (i + frac) / len(batches))

                out.append(
                    measure(
                        loaded,
                        batch=b,
                        duration_s=spec.get("duration_s"),
                        requests=spec.get("requests"),
                        warmup=int(spec.get("warmup", DEFAULT_WARMUP)),
                        meter=meter,
                        baseline_rss_mb=base,
                        progress=inner,
                    )
                )
    finally:
        close()
    facts = {"params": params, "memory_mb": round(params * 4 / 2**20, 2)}
    return out, loaded.load_time_s, facts


PROGRESS_PREFIX = "@@greenctl-progress "


def run_child(
    item: RunItem,
    spec: dict[str, Any],
    *,
    timeout_s: float = CHILD_TIMEOUT_S,
    progress: Progress = no_progress,
    what: str | None = None,
) -> tuple[list[Measurement], dict[str, Any]]:
    """Run one item (or, with ``spec["items"]``, a group of items of ``item``'s resource and
    environment) in ``python -m greenctl.profiler.child`` with the item's environment.

    The child reports progress as ``@@greenctl-progress FRACTION MESSAGE`` lines on stderr
    (forwarded to ``progress``) and its result as one JSON line on stdout. ``what`` names the
    variants in messages (default ``item``'s).
    """
    what = what or item.variant.name

    env = {**os.environ, **(item.env or {})}
    proc = subprocess.Popen(
        # -P: a file in the caller's folder named like a module the child imports is not run
        [sys.executable, "-P", "-m", "greenctl.profiler.child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    errors: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith(PROGRESS_PREFIX):
                frac, _, msg = line[len(PROGRESS_PREFIX) :].strip().partition(" ")
                try:
                    progress(msg, float(frac))
                except ValueError:
                    continue
            else:
                errors.append(line.rstrip())

    killed: list[bool] = []

    def kill() -> None:
        killed.append(True)
        proc.kill()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(spec))
            proc.stdin.close()
        except BrokenPipeError:
            pass  # the child died at once; its stderr says why
        stdout = proc.stdout.read()
        proc.wait()
    except BaseException:  # interrupted (Ctrl-C, SIGTERM under an MPS session): no orphan
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    reader.join(timeout=5)
    if killed:
        raise HardwareError(f"profiling {what} on {item.resource} timed out after {timeout_s:g} s")
    if proc.returncode == InputError.exit_code:  # the child refused the input: say so
        said = [e.removeprefix("Error: ") for e in errors if e.startswith("Error: ")]
        hints = [e.strip().removeprefix("hint: ") for e in errors if e.strip().startswith("hint:")]
        if said:
            raise InputError(said[-1], hint=hints[-1] if hints else None)
    if proc.returncode != 0:
        tail = [e for e in errors if e.strip()][-3:] or stdout.strip().splitlines()[-3:]
        raise HardwareError(
            f"profiling {what} on {item.resource} failed in its child process: " + " | ".join(tail),
            hint=f"the child ran with {', '.join(f'{k}={v}' for k, v in (item.env or {}).items())}",
        )
    try:
        doc = json.loads(stdout.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        raise HardwareError(f"the child for {item.resource} printed no result") from None
    return [measurement_from_dict(m) for m in doc["measurements"]], doc


def measurement_to_dict(m: Measurement) -> dict[str, Any]:
    return asdict(m)


def measurement_from_dict(d: dict[str, Any]) -> Measurement:
    energy = d.get("energy")
    return Measurement(
        batch=int(d["batch"]),
        latencies_ms=[float(x) for x in d["latencies_ms"]],
        duration_s=float(d["duration_s"]),
        memory_mb=d.get("memory_mb"),
        energy=EnergyReading(**energy) if energy else None,
        isolated_ms=[float(x) for x in d.get("isolated_ms") or []],
    )


@dataclass
class ProfileResult:
    """What one ``greenctl profile`` measured, ready to store."""

    variants: list[Variant]
    profiles: list[tuple[Profile, Hardware]]
    items: list[RunItem]
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def run_items(
    items: Sequence[RunItem],
    *,
    duration_s: float | None = DEFAULT_DURATION_S,
    requests: int | None = None,
    warmup: int = DEFAULT_WARMUP,
    progress: Progress = no_progress,
    mps_pipe: str | None = None,
    notes: list[str] | None = None,
) -> ProfileResult:
    """Measure every item (CPU in-process, GPU/MIG/MPS in child processes).

    Items that are MPS clients (``mps_client``) run inside one MPS session
    (:func:`greenctl.profiler.mps.mps_session`: the daemon at ``mps_pipe`` when one runs, else
    a private one started just before the first of them and stopped right after the last,
    also when a run fails or is interrupted); after the first of them the session checks that
    it reached MPS. What the session did goes to ``notes``.
    """
    t0 = time.perf_counter()
    profiles: list[tuple[Profile, Hardware]] = []
    variants: dict[str, Variant] = {}
    notes = notes if notes is not None else []
    session: Any = None
    groups = group_items(items)
    done = 0
    with ExitStack() as stack:
        for group in groups:
            item = group[0]
            if item.mps_client and session is None:
                uuids = sorted({str(i.hardware.uuid) for i in items if i.mps_client})
                session = stack.enter_context(
                    mps_session(existing_pipe=mps_pipe, gpu_uuids=uuids, notes=notes)
                )
            elif not item.mps_client and session is not None:
                stack.close()  # the daemon's clients are done: stop it before the rest
                session = None
            label = item.title if len(group) == 1 else f"{len(group)} variants on {item.resource}"
            progress(label, done / max(len(items), 1))

            def inner(msg: str, frac: float, k: int = done, n: int = len(group),
                      label: str = label) -> None:  # fmt: skip
                progress(f"{label}: {msg}", (k + frac * n) / len(items))

            specs = [
                i.to_spec(duration_s=duration_s, requests=requests, warmup=warmup) for i in group
            ]
            results: list[tuple[list[Measurement], dict[str, Any]]] = []
            if item.in_child:
                run = item
                timeout_s: float = CHILD_TIMEOUT_S
                if session is not None:
                    run = replace(item, env={**(item.env or {}), **session.client_env()})
                    timeout_s = len(group) * mps_child_timeout(len(item.batches), duration_s)
                spec = specs[0] if len(group) == 1 else {"items": specs}
                what = ", ".join(i.variant.name for i in group)
                try:
                    _first, doc = run_child(
                        run, spec, timeout_s=timeout_s, progress=inner, what=what
                    )
                except HardwareError as exc:
                    tail = session.log_tail() if session is not None else ""
                    if tail:  # what the MPS daemon said belongs to the child's failure
                        exc.hint = f"{exc.hint}; MPS {tail}" if exc.hint else f"MPS {tail}"
                    raise
                docs = doc.get("results") or [doc]
                if len(docs) != len(group):
                    raise HardwareError(
                        f"the child for {what} on {item.resource} answered for {len(docs)} of "
                        f"{len(group)} variants"
                    )
                for d in docs:
                    ms = [measurement_from_dict(m) for m in d["measurements"]]
                    results.append((ms, d.get("facts") or {}))
                if session is not None:
                    session.verify_client()
            else:
                measurements, _load_s, facts = measure_variant(specs[0], progress=inner)
                results.append((measurements, facts))
            for member, (measurements, facts) in zip(group, results, strict=True):
                v = variants.setdefault(member.variant.name, member.variant)
                if v.params is None and facts.get("params") is not None:
                    variants[v.name] = replace(
                        v, params=facts["params"], memory_mb=facts.get("memory_mb")
                    )
                for m in measurements:
                    row = m.to_profile(member.variant.name, member.resource, member.hardware)
                    if member.source != row.source:
                        row = replace(row, source=member.source)
                    for resource in (member.resource, *member.also):
                        profiles.append((replace(row, resource=resource), member.hardware))
            done += len(group)
    progress("done", 1.0)
    return ProfileResult(
        list(variants.values()), profiles, list(items), time.perf_counter() - t0, notes
    )


#: A child on an MPS share that takes longer than this has hung (an MPS server that waits for
#: another user's to end, a client that cannot reach its daemon): start-up (python, torch,
#: CUDA, the model) plus per batch size the warm-up, the timed runs and the isolated runs.
MPS_CHILD_STARTUP_S = 120.0
MPS_CHILD_PER_BATCH_S = 20.0


def mps_child_timeout(batches: int, duration_s: float | None) -> float:
    """How long a child on an MPS share may run before it counts as hung (see above); with
    ``--requests`` (no duration) the usual :data:`CHILD_TIMEOUT_S`."""
    if duration_s is None:
        return CHILD_TIMEOUT_S
    per_batch = MPS_CHILD_PER_BATCH_S + GPU_WARMUP_S + 2 * duration_s
    return MPS_CHILD_STARTUP_S + batches * per_batch


def save_result(store: Store, result: ProfileResult) -> list[int]:
    """Store hardware, variants and profiles in one transaction; returns the profile ids."""
    with store.transaction():
        ids: dict[int, int] = {}
        for v in result.variants:
            store.upsert_variant(v)
        rows = []
        for p, hw in result.profiles:
            key = id(hw)
            if key not in ids:
                ids[key] = store.add_hardware(hw)
            rows.append(replace(p, hardware_id=ids[key]))
        return store.add_profiles(rows)


def resolve_variants(
    store: Store,
    *,
    names: Sequence[str] = (),
    family: str | None = None,
    user: Variant | None = None,
) -> list[Variant]:
    """The variants to profile: named ones, a family, a user model; default the tiny family.

    Built-in names come from the catalog; other names must be loadable variants in the store.
    """
    out: list[Variant] = []
    if user is not None:
        out.append(user)
    builtin = {v.name for v in builtin_variants()}
    for name in names:
        if name in builtin:
            out.append(builtin_variant(name))
            continue
        try:
            out.append(store.get_variant(name))
        except NotFoundError:
            raise NotFoundError(
                f"unknown variant '{name}'",
                hint=f"built-in variants: {', '.join(sorted(builtin))}; or profile your own "
                "model with --model-path module:callable --input-shape 3,224,224",
            ) from None
    if family is not None:
        if family in builtin_families():
            out += builtin_variants(family)
        else:
            stored = [v for v in store.variants(family) if v.source not in ("builtin", "imported")]
            if not stored:
                raise InputError(
                    f"--model {family}: no such family to profile",
                    hint=f"built-in families: {', '.join(builtin_families())}",
                )
            out += stored
    if not out:
        out = builtin_variants("tiny")
    seen: set[str] = set()
    unique = []
    for v in out:
        if v.name not in seen:
            seen.add(v.name)
            unique.append(v)
    for v in unique:
        if v.source in ("imported", "synthetic") or not v.input_shape:
            raise InputError(
                f"variant '{v.name}' was imported and has no model to run",
                hint="profile a built-in variant or give --model-path",
            )
    return unique


@dataclass
class ProfilePlan:
    """A profiling run checked and laid out (:func:`prepare_profile`), not yet measured."""

    options: ProfileOptions
    inventory: Inventory
    items: list[RunItem]


def prepare_profile(
    store: Store,
    options: ProfileOptions | None = None,
    *,
    inventory: Inventory | None = None,
    **choices: Any,
) -> ProfilePlan:
    """Check a run's choices and lay out its points; reads ``store`` (its variants), writes
    nothing, so a run it refuses leaves no trace.

    Raises:
        InputError: bad choices (unknown variant, an option out of its bound, too many
            cores, --gpus without a GPU, --emulate-mig without --gpus or without
            ``nvidia-cuda-mps-control``, a batch that cannot fit its device's memory, a
            malformed ``GREENCTL_FAKE_NVML`` file).
    """
    opts = options if options is not None else ProfileOptions.of(**choices)
    opts.check()
    chosen = resolve_variants(store, names=opts.variants, family=opts.family, user=opts.user)
    inv = inventory if inventory is not None else discover(backend=True if opts.gpus else None)
    items = plan_runs(
        inv,
        chosen,
        cpus=opts.cpus,
        gpus=opts.gpus,
        batches=opts.batches,
        mps=opts.mps,
        emulate_mig=opts.emulate_mig,
    )
    check_memory(items)
    if inv.mps_pipe is None and any(i.mps_client for i in items):
        control_binary()  # missing: an input error now, before anything is measured
    return ProfilePlan(opts, inv, items)


def profile(
    store: Store,
    options: ProfileOptions | None = None,
    *,
    inventory: Inventory | None = None,
    progress: Progress = no_progress,
    prepared: ProfilePlan | None = None,
    **choices: Any,
) -> ProfileResult:
    """Discover, plan, measure and store (one transaction at the end; nothing on failure).

    ``options`` says what to measure; without it, the keywords named as its fields
    (``variants=``, ``cpus=``, ``emulate_mig=``, ...) build one; ``prepared`` is a run
    :func:`prepare_profile` checked already. With ``emulate_mig``, every MIG slice of each
    whole GPU is also emulated as an MPS share (see :func:`plan_runs`), under an MPS daemon
    that runs already or one started for the run and stopped after it.

    Raises:
        InputError: bad choices (see :func:`prepare_profile`).
        HardwareError: the hardware or a child run failed, or an MPS child did not reach MPS.
    """
    run = prepared or prepare_profile(store, options, inventory=inventory, **choices)
    opts, inv, items = run.options, run.inventory, run.items
    session_notes: list[str] = []
    result = run_items(
        items,
        duration_s=opts.duration_s,
        requests=opts.requests,
        warmup=opts.warmup,
        progress=progress,
        mps_pipe=inv.mps_pipe,
        notes=session_notes,
    )
    result.notes = list(inv.notes) + session_notes
    busy = busy_note(len(inv.cpu_info.usable_cores))
    if busy and any(i.cores for i in items):
        result.notes.append(busy)
    save_result(store, result)
    return result


def busy_note(usable_cores: int) -> str | None:
    """A warning when other work oversubscribes the CPUs (1-minute load average above the
    usable cores): multi-core latencies then include waiting for preempted threads."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    if load <= usable_cores:
        return None
    return (
        f"warning: this machine was busy (load average {load:.1f} on {usable_cores} usable "
        "cores): CPU latencies include contention from other processes; re-measure on a "
        "quiet machine for planning figures"
    )


def child_main(stdin_text: str, *, progress: Progress = no_progress) -> str:
    """The child-process entry: JSON spec in, JSON measurements out.

    The spec is one run item's (:meth:`RunItem.to_spec`) or ``{"items": [spec, ...]}``: run
    items of one resource and environment measured one after the other in this process (one
    interpreter, torch import and CUDA context for all of them); the answer then holds
    ``results``, one per item, in order.
    """
    spec = json.loads(stdin_text)
    subs = spec["items"] if isinstance(spec, dict) and "items" in spec else [spec]
    results = []
    for k, sub in enumerate(subs):

        def inner(msg: str, frac: float, k: int = k) -> None:
            progress(msg, (k + frac) / len(subs))

        measurements, load_s, facts = measure_variant(sub, progress=inner)
        results.append(
            {
                "measurements": [measurement_to_dict(m) for m in measurements],
                "load_time_s": load_s,
                "facts": facts,
            }
        )
    return json.dumps(
        {
            **results[0],
            "results": results,
            "pid": os.getpid(),
            "cwd": str(Path.cwd()),
            "env": {
                k: v
                for k, v in os.environ.items()
                if k.startswith(("CUDA_VISIBLE", "CUDA_MPS", "CUDA_DEVICE"))
            },
        }
    )
