"""Energy of an LLM engine while it serves: the meter that reads it, and the split of a
window into joules per prompt token (prefill) and per output token (decode).

Sources, in order: NVML when the engine runs on a GPU, RAPL where readable (the engine's
share of the cores), else the CPU power model of :mod:`greenctl.profiler.energy` fed by the
CPU time of the engine's process tree (``/proc``), stored and labelled ``modeled``. A server
greenctl only reaches (``openai``) on no GPU of this machine: energy unknown.
Split: a prefill-only pass (``max_tokens`` 1) gives a prompt's joules (with its first
token) per prompt token; the full run's energy less that per request, over the tokens made,
is decode J/token, so ``prompt x prefill + output x decode`` is a request's measured energy.
Both include the resource's idle power while serving, as every greenctl profile's does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from greenctl.data.errors import HardwareError
from greenctl.profiler.energy import EnergyMeter, EnergyReading, ModeledCpuMeter, NvmlEnergyMeter
from greenctl.profiler.energy import cpu_meter as rapl_or_model_meter
from greenctl.profiler.hw import rapl_files, usable_cores

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user + system CPU seconds) of a process, None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    # state ppid ... utime (14th field of the line, 12th after the name) stime
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and every process below it.

    Children that have ended are lost unless their parent waited for them; an engine's
    worker processes live as long as it does, so a window's difference is what it used.
    """
    stats: dict[int, tuple[int, float]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None:
                stats[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for child, (parent, _cpu) in stats.items():
        children.setdefault(parent, []).append(child)
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        if p in stats:
            total += stats[p][1]
            todo.extend(children.get(p, []))
    return total


@dataclass(frozen=True)
class PhaseEnergy:
    """Joules per token of each phase, from one full run and one prefill-only pass."""

    prefill_j_per_token: float | None
    decode_j_per_token: float | None


def engine_meter(
    *, pid: int | None, cores: int, gpu_index: int | None, rapl: list[str] | None = None
) -> EnergyMeter | None:
    """The meter of an engine: NVML on GPU ``gpu_index``, else RAPL (``rapl``: the counter
    files, default :func:`~greenctl.profiler.hw.rapl_files`) or the modeled CPU fed by process
    ``pid``'s tree on ``cores`` cores; None when nothing can say (a remote server on no GPU
    of this machine).

    Raises:
        HardwareError: ``gpu_index`` given but NVML is not there.
    """
    if gpu_index is not None:
        from greenctl.profiler.device import get_backend, no_gpu_reason

        backend = get_backend()
        if backend is None:
            raise HardwareError(f"--gpu {gpu_index}: no NVML here ({no_gpu_reason()})")
        return NvmlEnergyMeter(backend, gpu_index)
    if pid is None:
        return None
    files = rapl_files() if rapl is None else rapl
    if files:
        return rapl_or_model_meter(cores, total_cores=len(usable_cores()), rapl=files)
    return ModeledCpuMeter(cores, cpu_clock=lambda: tree_cpu_seconds(pid))


def split_phases(
    full: EnergyReading,
    *,
    requests: int,
    prompt_tokens: float,
    output_tokens: float,
    prefill: EnergyReading,
    prefill_requests: int,
) -> PhaseEnergy:
    """Prefill and decode joules per token of a full run (``requests`` of ``prompt_tokens``
    in and ``output_tokens`` out on average) given a prefill-only pass of
    ``prefill_requests`` requests of the same prompt (module docstring)."""
    if prefill_requests <= 0 or prompt_tokens <= 0:
        return PhaseEnergy(None, None)
    per_prompt_j = prefill.energy_j / prefill_requests
    prefill_j = per_prompt_j / prompt_tokens
    decode_tokens = requests * output_tokens
    if decode_tokens <= 0:
        return PhaseEnergy(prefill_j, None)
    decode_j = max(full.energy_j - requests * per_prompt_j, 0.0) / decode_tokens
    return PhaseEnergy(prefill_j, decode_j)
