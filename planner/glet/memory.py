"""Whether a glet plan's executors fit their GPUs' memory (what ``apply`` checks first).

A glet plan runs one executor per model on each glet (MPS partitions of one GPU share its
memory, which MPS does not divide); the planner records each one's memory
(``memory_mb``: the profile's peak at its batch plus the executor overhead, see
:data:`~greenctl.planner.glet.model.EXECUTOR_OVERHEAD_MB`) and each GPU's total. The
planner keeps a GPU within the memory it planned for; ``apply`` checks the GPUs it finds,
which may have less, or hold other processes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from greenctl.data.errors import InputError


@dataclass
class GpuNeed:
    """What the executors of one GPU of a glet plan need."""

    index: int
    memory_mb: float = 0.0  # the known part
    executors: list[str] = field(default_factory=list)  # "model (variant, resource, batch N)"
    unknown: list[str] = field(default_factory=list)  # executors without a memory figure


def gpu_needs(gpus: Sequence[Mapping[str, Any]] | None) -> list[GpuNeed]:
    """Per GPU of a plan's ``gpus`` (glet plans: each with ``glets``; others are skipped),
    the memory its executors need, from the figures the planner recorded."""
    out = []
    for n, gpu in enumerate(gpus or []):
        if not isinstance(gpu, Mapping) or not isinstance(gpu.get("glets"), list):
            continue
        need = GpuNeed(int(gpu.get("index", n)))
        for g in gpu["glets"]:
            for m in g.get("models") or []:
                what = (
                    f"{m.get('model')} ({m.get('variant')}, {g.get('resource')}, "
                    f"batch {m.get('batch')})"
                )
                mb = m.get("memory_mb")
                if isinstance(mb, int | float) and not isinstance(mb, bool):
                    need.memory_mb += float(mb)
                    need.executors.append(f"{what} {float(mb):,.0f} MiB")
                else:
                    need.unknown.append(what)
        out.append(need)
    return out


def check_gpu_memory(
    gpus: Sequence[Mapping[str, Any]] | None,
    available: Mapping[int, tuple[str, float, float]],
) -> None:
    """Refuse a glet plan whose executors on one GPU need more memory than it has.

    Args:
        gpus: the plan's ``gpus``.
        available: per GPU index here, ``(name, total MiB, MiB other processes use)``.

    Raises:
        InputError: naming the GPU, its executors with their MiB, the MiB needed and the
            MiB available.
    """
    for need in gpu_needs(gpus):
        here = available.get(need.index)
        if here is None or not need.executors:
            continue  # a GPU that is not here is apply's other check; nothing known: no check
        name, total, others = here
        free = total - max(others, 0.0)
        if need.memory_mb <= free:
            continue
        used = f" ({others:,.0f} MiB of its {total:,.0f} MiB in use by other processes)"
        unknown = (
            f"; {', '.join(need.unknown)} not counted (no memory figure)" if need.unknown else ""
        )
        raise InputError(
            f"GPU {need.index} ({name}) cannot hold its glets: "
            + " + ".join(need.executors)
            + f" = {need.memory_mb:,.0f} MiB needed, {free:,.0f} MiB available"
            + (used if others > 0 else "")
            + unknown,
            hint="plan for this GPU's memory (request.gpu_memory_mb in the glet request, or "
            "profile on this GPU) or free the GPU; nothing was started",
        )
