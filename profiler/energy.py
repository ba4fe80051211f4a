"""Energy meters: NVML counters on GPUs, RAPL on CPUs, and a documented CPU power model.

Use a meter as ``meter.start()`` ... work ... ``reading = meter.stop(requests=n)``; it
reports busy and idle power (W), energy per request (J) and its method: ``nvml``,
``nvml-attributed``, ``rapl`` or ``modeled`` (see ``greenctl.data.records``).
GPUs read NVML's total-energy counter (mJ) around the window (older GPUs: sampled power).
MIG, MPS and ``cpu:N`` runs share a device counter, so :func:`attributed_energy_j` charges
them their share of idle power plus all power above idle, which they alone caused; live
served counters (:class:`NvmlCounter`) charge their share of the whole, as all run at once.
RAPL reads ``/sys/class/powercap/intel-rapl:N/energy_uj`` (wrap-around handled).
Without RAPL the CPU is *modeled*: per core, idle ``IDLE_W_PER_CORE`` (3 W) plus
(``TDP_W_PER_CORE`` (10 W) - idle) x utilisation; override with
``GREENCTL_CPU_TDP_W_PER_CORE`` and ``GREENCTL_CPU_IDLE_W_PER_CORE``. See docs/results.md.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from greenctl.data.errors import HardwareError
from greenctl.data.resources import kind_of
from greenctl.profiler.device import NVML_ERROR_NOT_SUPPORTED, GpuBackend, get_backend
from greenctl.profiler.hw import rapl_files

TDP_W_PER_CORE = 10.0
IDLE_W_PER_CORE = 3.0


@dataclass
class EnergyReading:
    """What a meter saw over one measured window."""

    method: str
    power_w: float  # average power while busy (attributed share)
    idle_power_w: float | None
    energy_j: float  # total over the window (attributed share)
    duration_s: float
    energy_j_per_request: float | None = None


class EnergyMeter(Protocol):
    method: str

    def start(self) -> None: ...

    def stop(self, *, requests: int) -> EnergyReading: ...


def _per_request(energy_j: float, requests: int) -> float | None:
    return energy_j / requests if requests > 0 else None


def attributed_energy_j(
    whole_j: float, idle_w: float | None, duration_s: float, share: float
) -> float:
    """The energy (J) an instance on ``share`` of a device caused over a window in which it
    ran alone there: ``share`` of the device's idle energy and all of its energy above idle
    (the rest of the device idled: the power above idle was this instance's). ``whole_j``:
    the device's energy over the window; ``idle_w``: its idle power (whole device; None:
    unknown, then ``share`` of ``whole_j``). A window below idle is charged ``share`` of it.
    """
    if share >= 1.0:
        return whole_j
    if idle_w is None or not math.isfinite(idle_w) or idle_w < 0:
        return whole_j * share
    idle_j = idle_w * duration_s
    return share * min(idle_j, whole_j) + max(whole_j - idle_j, 0.0)


class NvmlEnergyMeter:
    """Whole-GPU energy from NVML, optionally attributed to a share of the GPU that ran alone
    (:func:`attributed_energy_j`).

    Uses the total-energy counter; on GPUs without one (before Volta) it falls back to
    sampling ``nvmlDeviceGetPowerUsage`` every ``sample_s`` in a thread and integrating.
    """

    def __init__(
        self,
        backend: GpuBackend,
        gpu_index: int,
        *,
        share: float = 1.0,
        clock: Callable[[], float] = time.perf_counter,
        sample_s: float = 0.05,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.backend = backend
        self.gpu_index = gpu_index
        self.share = share
        self.method = "nvml" if share >= 1.0 else "nvml-attributed"
        self.sample_s = sample_s
        self._clock = clock
        self._t0 = 0.0
        self._e0: int | None = 0
        self._idle_w: float | None = None
        self._idle_sampled = False
        self._samples: list[float] = []
        self._stop_evt: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def sample_idle(self) -> None:
        """Read the GPU's power now, before the model runs, as its idle power (once)."""
        if self._idle_sampled:
            return
        self._idle_sampled = True
        try:
            self._idle_w = self.backend.power_w(self.gpu_index)
        except HardwareError:
            self._idle_w = None  # power readings are optional

    def settle_idle(
        self,
        *,
        max_s: float = 5.0,
        interval_s: float = 0.1,
        window: int = 5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> float | None:
        """Read the GPU's power until it stops falling, and keep that as its idle power.

        Call it with the model loaded and idle. After work a GPU's power falls for about a
        second (H100: 255 W to 123 W within 1 s of the last run), so one reading taken then
        is the tail of that work. Returns the idle power (W, whole device), the median of
        the last ``window`` readings once they lie within 2 % (at least 2 W) of each other,
        or of the last ones read when ``max_s`` runs out; ``None`` without power readings.
        """
        self._idle_sampled = True
        readings: list[float] = []
        start = self._clock()
        while True:
            try:
                readings.append(self.backend.power_w(self.gpu_index))
            except HardwareError:
                self._idle_w = None  # power readings are optional
                return None
            last = readings[-window:]
            if len(last) == window:
                spread = max(last) - min(last)
                if spread <= max(2.0, 0.02 * statistics.median(last)):
                    break
            if self._clock() - start >= max_s:
                break
            sleep(interval_s)
        self._idle_w = float(statistics.median(readings[-window:]))
        return self._idle_w

    def _sample_loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.sample_s):
            try:
                self._samples.append(self.backend.power_w(self.gpu_index))
            except HardwareError:
                return

    def start(self) -> None:
        self.sample_idle()
        try:
            self._e0 = self.backend.energy_mj(self.gpu_index)
        except HardwareError as err:
            if getattr(err, "nvml_code", None) != NVML_ERROR_NOT_SUPPORTED:
                raise
            self._e0 = None  # no counter on this GPU: sample power instead
            self._samples = [self.backend.power_w(self.gpu_index)]
            self._stop_evt = threading.Event()
            self._thread = threading.Thread(
                target=self._sample_loop, args=(self._stop_evt,), daemon=True
            )
            self._thread.start()
        self._t0 = self._clock()

    def stop(self, *, requests: int) -> EnergyReading:
        dt = max(self._clock() - self._t0, 1e-9)
        if self._e0 is None:
            if self._stop_evt is not None and self._thread is not None:
                self._stop_evt.set()
                self._thread.join()
            power = sum(self._samples) / max(len(self._samples), 1)
            whole_j = power * dt
        else:
            e1 = self.backend.energy_mj(self.gpu_index)
            whole_j = max(e1 - self._e0, 0) / 1000.0
        energy_j = attributed_energy_j(whole_j, self._idle_w, dt, self.share)
        return EnergyReading(
            method=self.method,
            power_w=energy_j / dt,
            idle_power_w=None if self._idle_w is None else self._idle_w * self.share,
            energy_j=energy_j,
            duration_s=dt,
            energy_j_per_request=_per_request(energy_j, requests),
        )


class RaplMeter:
    """CPU package energy from RAPL (``energy_uj``), attributed by core share to cores that ran
    alone (:func:`attributed_energy_j`: the share of the packages' idle power, all above it)."""

    method = "rapl"

    def __init__(
        self,
        files: list[str],
        *,
        share: float = 1.0,
        idle_window_s: float = 0.2,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not files:
            raise HardwareError("no readable RAPL counters")
        self.files = files
        self.share = share
        self.idle_window_s = idle_window_s
        self._clock = clock
        self._sleep = sleep
        self._ranges = [self._max_range(f) for f in files]
        self._e0: list[int] = []
        self._t0 = 0.0
        self._idle_w: float | None = None

    @staticmethod
    def _max_range(path: str) -> int | None:
        try:
            return int(Path(path).with_name("max_energy_range_uj").read_text().strip())
        except (OSError, ValueError):
            return None

    def _read(self) -> list[int]:
        try:
            return [int(Path(f).read_text().strip()) for f in self.files]
        except (OSError, ValueError) as exc:
            raise HardwareError(f"cannot read RAPL counter: {exc}") from None

    def _delta_j(self, before: list[int], after: list[int]) -> float:
        total = 0
        for b, a, rng in zip(before, after, self._ranges, strict=True):
            d = a - b
            if d < 0:  # the counter wrapped around
                d += (rng if rng else 2**32) + 1
            total += d
        return total / 1e6

    def start(self) -> None:
        if self.idle_window_s > 0:
            e, t = self._read(), self._clock()
            self._sleep(self.idle_window_s)
            dt = max(self._clock() - t, 1e-9)
            self._idle_w = self._delta_j(e, self._read()) / dt * self.share
        self._e0 = self._read()
        self._t0 = self._clock()

    def stop(self, *, requests: int) -> EnergyReading:
        after = self._read()
        dt = max(self._clock() - self._t0, 1e-9)
        idle = None if self._idle_w is None else self._idle_w / self.share  # the packages'
        energy_j = attributed_energy_j(self._delta_j(self._e0, after), idle, dt, self.share)
        return EnergyReading(
            method=self.method,
            power_w=energy_j / dt,
            idle_power_w=self._idle_w,
            energy_j=energy_j,
            duration_s=dt,
            energy_j_per_request=_per_request(energy_j, requests),
        )


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


class ModeledCpuMeter:
    """The CPU power model of the module docstring (method ``modeled``)."""

    method = "modeled"

    def __init__(
        self,
        cores: int,
        *,
        tdp_w_per_core: float | None = None,
        idle_w_per_core: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        self.cores = cores
        self.tdp_w_per_core = (
            tdp_w_per_core
            if tdp_w_per_core is not None
            else _env_float("GREENCTL_CPU_TDP_W_PER_CORE", TDP_W_PER_CORE)
        )
        self.idle_w_per_core = (
            idle_w_per_core
            if idle_w_per_core is not None
            else _env_float("GREENCTL_CPU_IDLE_W_PER_CORE", IDLE_W_PER_CORE)
        )
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._t0 = self._c0 = 0.0

    def power_at(self, utilisation: float) -> float:
        """Modeled power (W) of ``cores`` cores at ``utilisation`` in [0, 1]."""
        u = min(max(utilisation, 0.0), 1.0)
        return self.cores * (
            self.idle_w_per_core + (self.tdp_w_per_core - self.idle_w_per_core) * u
        )

    def start(self) -> None:
        self._t0, self._c0 = self._clock(), self._cpu_clock()

    def stop(self, *, requests: int) -> EnergyReading:
        dt = max(self._clock() - self._t0, 1e-9)
        util = (self._cpu_clock() - self._c0) / (dt * self.cores)
        power = self.power_at(util)
        energy_j = power * dt
        return EnergyReading(
            method=self.method,
            power_w=power,
            idle_power_w=self.power_at(0.0),
            energy_j=energy_j,
            duration_s=dt,
            energy_j_per_request=_per_request(energy_j, requests),
        )


def model_caption() -> str:
    """The line shown under tables holding ``modeled`` energy."""
    tdp = _env_float("GREENCTL_CPU_TDP_W_PER_CORE", TDP_W_PER_CORE)
    idle = _env_float("GREENCTL_CPU_IDLE_W_PER_CORE", IDLE_W_PER_CORE)
    return (
        f"energy 'modeled' = CPU power model, not measured: per core {idle:g} W idle + up to "
        f"{tdp - idle:g} W when busy (greenctl.profiler.energy)"
    )


def cpu_meter(cores: int, *, total_cores: int, rapl: list[str] | None = None) -> EnergyMeter:
    """RAPL when counters are readable, else the modeled meter, for a ``cpu:N`` run."""
    if rapl:
        return RaplMeter(rapl, share=min(cores / max(total_cores, 1), 1.0))
    return ModeledCpuMeter(cores)


# -- serving: cumulative counters an executor exports -----------------------------------------
#: The sources of a serving energy counter (``greenctl_energy_joules_total{source=...}``).
SERVING_SOURCES = ("nvml", "nvml-attributed", "rapl", "modeled")


class EnergyCounter(Protocol):
    """Energy (J) used since the counter was made, read as often as wanted."""

    source: str

    def joules(self) -> float: ...


class NvmlCounter:
    """The GPU's NVML total-energy counter since start, times ``share`` (the same
    attribution as :class:`NvmlEnergyMeter`: a MIG instance's compute slices over the GPU's,
    an MPS share's active-thread percentage). GPUs without the counter (before Volta) are
    integrated from power readings taken at each read."""

    def __init__(
        self,
        backend: GpuBackend,
        gpu_index: int,
        *,
        share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self.backend = backend
        self.gpu_index = gpu_index
        self.share = share
        self.source = "nvml" if share >= 1.0 else "nvml-attributed"
        self._clock = clock
        self._lock = threading.Lock()
        self._acc = 0.0
        self._t = clock()
        self._e0: int | None
        try:
            self._e0 = backend.energy_mj(gpu_index)
        except HardwareError as err:
            if getattr(err, "nvml_code", None) != NVML_ERROR_NOT_SUPPORTED:
                raise
            self._e0 = None
            self._p = backend.power_w(gpu_index)  # raises when there is no reading either

    def joules(self) -> float:
        with self._lock:
            if self._e0 is not None:
                return (
                    max(self.backend.energy_mj(self.gpu_index) - self._e0, 0)
                    / 1000.0
                    * (self.share)
                )
            now, p = self._clock(), self.backend.power_w(self.gpu_index)
            self._acc += (self._p + p) / 2.0 * (now - self._t) * self.share  # trapezoids
            self._t, self._p = now, p
            return self._acc


class RaplCounter:
    """CPU package energy since start from RAPL, by core share (as :class:`RaplMeter`).

    Each read adds the change since the last one, so a counter that wraps (at
    ``max_energy_range_uj``) between two reads is counted right; reads must come more often
    than a wrap (minutes at full power), which the executor's sampler ensures.
    """

    source = "rapl"

    def __init__(self, files: list[str], *, share: float = 1.0) -> None:
        self._meter = RaplMeter(files, share=share, idle_window_s=0.0)
        self.share = share
        self._lock = threading.Lock()
        self._last = self._meter._read()
        self._acc = 0.0

    def joules(self) -> float:
        with self._lock:
            now = self._meter._read()
            self._acc += self._meter._delta_j(self._last, now) * self.share
            self._last = now
            return self._acc


class ModeledCounter:
    """Energy from the profile's figures, by the rule the planners predict with
    (:func:`greenctl.planner.core.evaluate.account`): ``busy_w`` while running batches and
    ``idle_w`` otherwise; without a busy power, ``energy_j_per_request`` per request served.
    Shown as ``modeled`` (an estimate, not a measurement)."""

    source = "modeled"

    def __init__(
        self,
        *,
        busy_s: Callable[[], float],
        requests: Callable[[], int],
        busy_w: float | None = None,
        idle_w: float | None = None,
        energy_j_per_request: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if busy_w is None and energy_j_per_request is None:
            raise ValueError("a modeled counter needs a busy power or an energy per request")
        self.busy_w = busy_w
        self.idle_w = idle_w or 0.0
        self.energy_j_per_request = energy_j_per_request
        self._busy_s = busy_s
        self._requests = requests
        self._clock = clock
        self._t0 = clock()

    def joules(self) -> float:
        elapsed = max(self._clock() - self._t0, 0.0)
        busy = min(max(self._busy_s(), 0.0), elapsed)
        if self.busy_w is not None:
            busy_j = busy * self.busy_w
        else:
            busy_j = self._requests() * float(self.energy_j_per_request or 0.0)
        return busy_j + (elapsed - busy) * self.idle_w


def _gpu_location(backend: GpuBackend, visible: str) -> tuple[int, float] | None:
    """(GPU index, compute share) of the device ``CUDA_VISIBLE_DEVICES`` names: a GPU index
    or UUID (share 1), or a MIG UUID (its compute slices over the GPU's)."""
    first = visible.split(",")[0].strip()
    gpus = backend.gpus()
    if first.isdigit():
        return (int(first), 1.0) if any(g.index == int(first) for g in gpus) else None
    for g in gpus:
        if g.uuid == first:
            return g.index, 1.0
    if first.startswith("MIG-"):
        for g in gpus:
            if not g.mig_enabled:
                continue
            for m in backend.mig_instances(g.index):
                if m.uuid == first:
                    return g.index, m.slices / backend.total_compute_slices(g.index)
    return None


def serving_counter(
    resource: str,
    *,
    cores: int,
    env: dict[str, str],
    busy_s: Callable[[], float],
    requests: Callable[[], int],
    busy_w: float | None = None,
    idle_w: float | None = None,
    energy_j_per_request: float | None = None,
    source: str = "auto",
    rapl: list[str] | None = None,
    total_cores: int | None = None,
) -> tuple[EnergyCounter | None, list[str]]:
    """The energy counter of an executor on ``resource``, and notes saying why a source was
    passed over.

    ``auto`` picks, in order: NVML on GPUs, MIG instances and MPS shares (the device
    ``CUDA_VISIBLE_DEVICES`` names; attributed by compute share as the profiler does), RAPL
    on CPUs where readable (``rapl``: the counter files, default :func:`~greenctl.profiler.
    hw.rapl_files`; by ``cores`` over ``total_cores``), else the profile's figures
    (:class:`ModeledCounter`); on a CPU without figures, the CPU power model of this module.
    ``source`` forces one. None (with the reason in the notes) when nothing can say.
    """
    notes: list[str] = []
    accel = kind_of(resource).accelerator
    if source in ("auto", "nvml", "nvml-attributed") and accel:
        try:
            backend = get_backend()
            where = None
            if backend is not None:
                where = _gpu_location(backend, env.get("CUDA_VISIBLE_DEVICES", "0"))
            if backend is None:
                notes.append("no NVML: no GPU energy counter")
            elif where is None:
                notes.append(f"NVML knows no device {env.get('CUDA_VISIBLE_DEVICES', '0')!r}")
            else:
                share = where[1]
                pct = env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
                if pct:
                    share *= min(max(float(pct) / 100.0, 1e-6), 1.0)
                return NvmlCounter(backend, where[0], share=share), notes
        except (HardwareError, ValueError) as exc:
            notes.append(f"NVML energy unreadable: {exc}")
    if source in ("auto", "rapl") and not accel:
        files = rapl_files() if rapl is None else rapl
        if files:
            share = min(cores / max(total_cores or os.cpu_count() or 1, 1), 1.0)
            try:
                return RaplCounter(files, share=share), notes
            except HardwareError as exc:
                notes.append(str(exc))
        else:
            notes.append("RAPL is not readable (/sys/class/powercap)")
    if busy_w is None and energy_j_per_request is None and not accel:
        model = ModeledCpuMeter(max(cores, 1))
        busy_w, idle_w = model.power_at(1.0), model.power_at(0.0)
        notes.append(model_caption())
    if busy_w is None and energy_j_per_request is None:
        notes.append("no profile figures (power_w or energy_j) to model energy from")
        return None, notes
    counter = ModeledCounter(
        busy_s=busy_s,
        requests=requests,
        busy_w=busy_w,
        idle_w=idle_w,
        energy_j_per_request=energy_j_per_request,
    )
    return counter, notes
