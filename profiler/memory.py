"""Whether each batch of a profiling run fits the memory of the device it runs on, checked
before anything is measured.

The estimate is a lower bound: one batch holds at least its input tensor (the request's
``input_shape`` times the batch, float32 as :mod:`greenctl.profiler.models` feeds it) and the
model's weights (the variant's ``memory_mb``). A batch whose lower bound exceeds the memory
available (on a CPU: what the kernel reports available now; on a GPU, MIG slice or MPS
share: the device's memory) cannot run, and a run that tried would swap or be killed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from greenctl.data.errors import InputError
from greenctl.data.records import Variant
from greenctl.data.resources import kind_of
from greenctl.profiler.models import parse_input_shape

if TYPE_CHECKING:
    from greenctl.profiler.run_plan import RunItem

#: bytes of one input element (the profiler's example inputs are float32)
INPUT_ELEMENT_BYTES = 4
MIB = 2**20


def request_input_mb(variant: Variant) -> float:
    """MiB of one request's input tensor (0 when the variant declares no input shape)."""
    if not variant.input_shape:
        return 0.0
    elements = 1
    for d in parse_input_shape(variant.input_shape, option=f"{variant.name}'s input_shape"):
        elements *= d
    return elements * INPUT_ELEMENT_BYTES / MIB


def batch_memory_mb(variant: Variant, batch: int) -> float:
    """A lower bound of the MiB one batch of ``variant`` takes: input and weights."""
    return request_input_mb(variant) * batch + float(variant.memory_mb or 0.0)


def host_available_mb(meminfo: str = "/proc/meminfo") -> float | None:
    """The memory the kernel reports available for new work (``MemAvailable``), or None."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(items: Sequence[RunItem], *, host_mb: float | None = None) -> None:
    """Refuse a batch size whose batch cannot fit the memory of the device it would run on.

    ``host_mb``: the host's available memory (default: read now), for CPU items.

    Raises:
        InputError: naming ``--batch``, the variant, the resource, the MiB needed and
            available, and the largest batch that fits.
    """
    host = host_mb if host_mb is not None else host_available_mb()
    for item in items:
        on_host = not kind_of(item.resource).accelerator  # the resource table decides
        avail = host if on_host else item.hardware.memory_mb
        if not avail:
            continue
        per_request = request_input_mb(item.variant)
        for b in sorted(item.batches, reverse=True):
            need = batch_memory_mb(item.variant, b)
            if need <= avail:
                break
            weights = float(item.variant.memory_mb or 0.0)
            fits = int((avail - weights) / per_request) if per_request and avail > weights else 0
            where = "this machine has available" if on_host else "the device has"
            raise InputError(
                f"--batch {b}: one batch of {item.variant.name} on {item.resource} needs at "
                f"least {need:,.0f} MiB ({per_request:.3g} MiB of input per request x {b}, "
                f"{weights:,.0f} MiB of weights), more than the {avail:,.0f} MiB {where}",
                hint=f"use batch sizes up to {fits:,}, e.g. --batch 1,2,4,8"
                if fits
                else "the model's weights alone do not fit: profile it on a larger device",
            )
