"""The device layer's interface: the :class:`GpuBackend` protocol, the records it returns
and the NVML error codes mapped to greenctl errors (:func:`nvml_error`).

Both implementations import this: :class:`greenctl.profiler.device.NvmlBackend` (real NVML)
and :class:`greenctl.profiler.fake_nvml.FakeNvml`; :mod:`greenctl.profiler.device` chooses
between them and re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from greenctl.data.errors import HardwareError

# NVML return codes (nvml.h); kept here so mapping works without importing pynvml.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_INVALID_STATE = 29
NVML_ERROR_UNKNOWN = 999

_NO_DRIVER = (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED)

_REASONS: dict[int, tuple[str, str | None]] = {
    NVML_ERROR_UNINITIALIZED: (
        "NVML is not initialised",
        "this is a greenctl bug; please report it",
    ),
    NVML_ERROR_INVALID_ARGUMENT: ("NVML rejected an argument", None),
    NVML_ERROR_NOT_SUPPORTED: (
        "this GPU or driver does not support the operation",
        "MIG needs an A100/A30/H100-class GPU; energy counters need Volta or newer",
    ),
    NVML_ERROR_NO_PERMISSION: (
        "insufficient permissions",
        "MIG changes need root (run with sudo) or the nvidia-capabilities mig/config capability",
    ),
    NVML_ERROR_NOT_FOUND: ("the GPU, instance or profile was not found", "see `greenctl hw`"),
    NVML_ERROR_DRIVER_NOT_LOADED: (
        "the NVIDIA driver is not loaded",
        "install/load the NVIDIA driver, or profile CPUs only",
    ),
    NVML_ERROR_LIBRARY_NOT_FOUND: (
        "the NVML library (libnvidia-ml.so) was not found",
        "install the NVIDIA driver, or profile CPUs only",
    ),
    NVML_ERROR_FUNCTION_NOT_FOUND: (
        "the installed driver lacks this NVML function",
        "upgrade the NVIDIA driver",
    ),
    NVML_ERROR_GPU_IS_LOST: ("the GPU has fallen off the bus", "check the machine; reboot it"),
    NVML_ERROR_IN_USE: (
        "the GPU or instance is in use",
        "stop the processes using it (nvidia-smi lists them) and retry",
    ),
    NVML_ERROR_INSUFFICIENT_RESOURCES: (
        "not enough free MIG slices at that placement",
        "destroy the overlapping instances or choose another placement (`greenctl hw`)",
    ),
    NVML_ERROR_INVALID_STATE: (
        "the GPU is in the wrong state (is MIG mode enabled?)",
        "enable MIG mode: sudo nvidia-smi -i N -mig 1 (then reset the GPU)",
    ),
}


def nvml_error(exc_or_code: BaseException | int, action: str) -> HardwareError:
    """Turn an NVML error (a ``pynvml.NVMLError`` or a return code) into a HardwareError.

    Args:
        exc_or_code: the exception raised by pynvml (its ``value`` is the NVML return code)
            or the code itself.
        action: what greenctl was doing, for the message (``"reading the energy counter"``).
    """
    code = exc_or_code if isinstance(exc_or_code, int) else getattr(exc_or_code, "value", None)
    reason, hint = _REASONS.get(code if isinstance(code, int) else -1, (None, None))
    if reason is None:
        reason = str(exc_or_code) if not isinstance(exc_or_code, int) else f"NVML error {code}"
    err = HardwareError(f"NVML failed while {action}: {reason}", hint=hint)
    err.nvml_code = code  # type: ignore[attr-defined]
    return err


def is_no_driver(err: BaseException) -> bool:
    """True when ``err`` means there is simply no NVIDIA driver/library on this machine."""
    return getattr(err, "nvml_code", None) in _NO_DRIVER


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU."""

    index: int
    uuid: str
    name: str
    memory_mb: float
    mig_enabled: bool | None  # None: the GPU has no MIG support
    power_limit_w: float | None = None

    @property
    def label(self) -> str:
        """The ``gpu:MODEL`` resource size: ``NVIDIA A100-SXM4-40GB`` -> ``A100-SXM4-40GB``."""
        name = self.name.removeprefix("NVIDIA ").strip()
        return "-".join(name.split()) or "GPU"


@dataclass(frozen=True)
class MigProfile:
    """A GPU-instance profile a MIG-capable GPU offers (``3g.40gb``)."""

    gpu_index: int
    profile_id: int
    name: str
    slices: int  # compute slices
    memory_mb: float
    max_instances: int
    placements: tuple[tuple[int, int], ...]  # possible (start, size) in memory slots


@dataclass(frozen=True)
class MigInstance:
    """One compute instance inside a MIG GPU instance, addressable as ``MIG-<uuid>``."""

    gpu_index: int
    gpu_uuid: str
    gi_id: int
    ci_id: int
    profile: str  # GPU-instance profile name, e.g. "3g.40gb"
    gi_profile_id: int
    placement_start: int
    placement_size: int
    slices: int  # compute slices of this compute instance
    gi_slices: int  # compute slices of its GPU instance
    memory_mb: float
    uuid: str | None  # "MIG-..." (None until the driver exposes the device)


@runtime_checkable
class GpuBackend(Protocol):
    """What greenctl needs from NVML. Indices are NVML device indices."""

    def driver_version(self) -> str | None: ...

    def cuda_version(self) -> str | None: ...

    def gpus(self) -> list[GpuInfo]: ...

    def mig_profiles(self, gpu_index: int) -> list[MigProfile]: ...

    def mig_instances(self, gpu_index: int) -> list[MigInstance]: ...

    def total_compute_slices(self, gpu_index: int) -> int: ...

    def energy_mj(self, gpu_index: int) -> int: ...

    def power_w(self, gpu_index: int) -> float: ...

    def memory_used_mb(self, gpu_index: int) -> float: ...

    def create_gpu_instance_with_placement(self, gpu_index: int, profile: str, start: int) -> int:
        """Create a GPU instance of ``profile`` at memory slot ``start``; returns its GI id."""
        ...

    def create_compute_instance(
        self, gpu_index: int, gi_id: int, slices: int | None = None
    ) -> MigInstance:
        """Create a compute instance (default: all the GI's slices) and return it."""
        ...

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        """Destroy a GPU instance and its compute instances."""
        ...

    def close(self) -> None: ...


def nvml_reason(code: int) -> str | None:
    """What an NVML return code means, in words; None for a code greenctl does not know."""
    reason = _REASONS.get(code)
    return reason[0] if reason else None
