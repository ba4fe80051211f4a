"""Hardware discovery: CPUs (``/proc/cpuinfo``, affinity, RAPL) and NVIDIA GPUs, MIG, MPS.

:func:`discover` returns an :class:`Inventory` of :class:`greenctl.data.records.Hardware`
records: one ``cpu`` record, one ``gpu`` record per GPU, one ``mig`` record per MIG compute
instance (with its ``MIG-...`` UUID for ``CUDA_VISIBLE_DEVICES``). It never fails because NVML
is missing: then ``gpus`` is empty and ``notes`` says why.
"""

from __future__ import annotations

import glob
import os
import platform
import socket
import stat
from dataclasses import dataclass, field
from pathlib import Path

from greenctl.data.errors import HardwareError, InputError
from greenctl.data.records import Hardware
from greenctl.profiler.device import GpuBackend, MigInstance, get_backend, no_gpu_reason

RAPL_GLOB = "/sys/class/powercap/intel-rapl:*/energy_uj"
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"


@dataclass
class CpuInfo:
    """What profiling needs to know about this machine's CPUs."""

    model_name: str
    logical_cores: int
    physical_cores: int | None
    usable_cores: list[int]  # sched_getaffinity of this process
    rapl_files: list[str]  # readable package energy counters

    @property
    def rapl_readable(self) -> bool:
        return bool(self.rapl_files)


@dataclass
class Inventory:
    """Everything ``greenctl hw`` shows."""

    host: str
    cpu: Hardware
    cpu_info: CpuInfo
    gpus: list[Hardware] = field(default_factory=list)
    mig: list[Hardware] = field(default_factory=list)
    mig_instances: list[MigInstance] = field(default_factory=list)
    mps_pipe: str | None = None
    mig_enabled: set[int] = field(default_factory=set)  # indices of GPUs in MIG mode
    notes: list[str] = field(default_factory=list)

    @property
    def hardware(self) -> list[Hardware]:
        return [self.cpu, *self.gpus, *self.mig]


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, int | None]:
    model = None
    cores: set[tuple[str, str]] = set()
    phys = core = None
    try:
        text = Path(path).read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "physical id":
            phys = value
        elif key == "core id":
            core = value
        elif not line.strip():
            if core is not None:
                cores.add((phys or "0", core))
            phys = core = None
    if core is not None:
        cores.add((phys or "0", core))
    if model is None:
        model = platform.processor() or platform.machine() or "unknown CPU"
    return model, (len(cores) or None)


def rapl_files(pattern: str = RAPL_GLOB) -> list[str]:
    """The package-level RAPL energy counters this user can read."""
    out = []
    for path in sorted(glob.glob(pattern)):
        try:
            int(Path(path).read_text().strip())
        except (OSError, ValueError):
            continue
        out.append(path)
    return out


def usable_cores() -> list[int]:
    """The CPU ids this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def choose_cores(n: int, *, flag: str = "--cpus") -> list[int]:
    """The ``n`` cores a measurement of ``cpu:n`` runs on: the first ``n`` this process may
    use, the one rule every profiler pins by.

    Raises:
        InputError: more cores than this process may use (``flag`` named in the fix).
    """
    avail = usable_cores()
    if n > len(avail):
        raise InputError(
            f"cpu:{n} asks for {n} cores but this process may use {len(avail)}",
            hint=f"use {flag} with values up to {len(avail)}",
        )
    return avail[:n]


def cpu_info() -> CpuInfo:
    """Describe this machine's CPUs."""
    model, physical = _cpuinfo()
    return CpuInfo(
        model_name=model,
        logical_cores=os.cpu_count() or 1,
        physical_cores=physical,
        usable_cores=usable_cores(),
        rapl_files=rapl_files(),
    )


def mps_pipe() -> str | None:
    """The control pipe of a running MPS daemon, or None.

    The daemon listens on ``$CUDA_MPS_PIPE_DIRECTORY/control`` (default /tmp/nvidia-mps): a
    named pipe, or a UNIX socket with recent drivers ("Starting control daemon using socket
    /tmp/nvidia-mps/control"). One left behind by a daemon that died is caught when the run
    asks it something (:func:`greenctl.profiler.mps.mps_session`).
    """
    base = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_DEFAULT_PIPE
    control = os.path.join(base, "control")
    try:
        mode = os.stat(control).st_mode
    except OSError:
        return None
    return control if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None


def discover(*, backend: GpuBackend | bool | None = True) -> Inventory:
    """Discover CPUs and GPUs.

    Args:
        backend: a device layer to use; ``True`` (default) asks :func:`get_backend`;
            ``None``/``False`` skips GPUs.

    Raises:
        HardwareError: NVML is present but fails (not when it is simply missing).
    """
    host = socket.gethostname()
    info = cpu_info()
    cpu = Hardware(
        host=host,
        kind="cpu",
        model_name=info.model_name,
        cores=len(info.usable_cores),
        rapl_readable=info.rapl_readable,
    )
    inv = Inventory(host=host, cpu=cpu, cpu_info=info)
    owned = backend is True
    be = get_backend() if backend is True else (backend or None)
    if be is None:
        if backend is True:
            inv.notes.append(f"no NVIDIA GPU found ({no_gpu_reason()})")
        return inv
    try:
        _add_gpus(inv, be)
    finally:
        if owned:
            be.close()
    if inv.gpus:
        inv.mps_pipe = mps_pipe()
    elif backend is not None:
        inv.notes.append("no NVIDIA GPU found (NVML lists none)")
    return inv


def _add_gpus(inv: Inventory, be: GpuBackend) -> None:
    driver, cuda = be.driver_version(), be.cuda_version()
    for g in be.gpus():
        inv.gpus.append(
            Hardware(
                host=inv.host,
                kind="gpu",
                model_name=g.name,
                device_index=g.index,
                memory_mb=round(g.memory_mb, 1),
                uuid=g.uuid,
                driver_version=driver,
                cuda_version=cuda,
            )
        )
        if not g.mig_enabled:
            continue
        inv.mig_enabled.add(g.index)
        try:
            total = be.total_compute_slices(g.index)
            instances = be.mig_instances(g.index)
        except HardwareError as err:
            inv.notes.append(f"GPU {g.index}: cannot list MIG instances: {err.message}")
            continue
        for m in instances:
            inv.mig_instances.append(m)
            inv.mig.append(
                Hardware(
                    host=inv.host,
                    kind="mig",
                    model_name=g.name,
                    device_index=g.index,
                    memory_mb=round(m.memory_mb, 1),
                    compute_share=m.slices / total,
                    mig_profile=m.profile,
                    uuid=m.uuid,
                    parent_uuid=g.uuid,
                    driver_version=driver,
                    cuda_version=cuda,
                )
            )
