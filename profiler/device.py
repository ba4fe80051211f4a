"""The NVIDIA device layer: one small interface over NVML, and the errors it maps.

Everything in greenctl that talks to a GPU goes through a :class:`GpuBackend`:
:class:`NvmlBackend` (real NVML through ``pynvml``, imported lazily) or
:class:`greenctl.profiler.fake_nvml.FakeNvml` (a simulator for tests, selected for the whole
process by ``GREENCTL_FAKE_NVML=<path of a JSON description>``).

NVML failures become :class:`greenctl.data.errors.HardwareError` with a message that says what
was attempted and what to do (:func:`nvml_error`). Units are in names: memory in MB (MiB),
energy in mJ (NVML's native unit), power in W.

The MIG operations (create/destroy GPU and compute instances) change a real GPU; greenctl's
profiler never calls them, only the executor does when it applies a plan.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any, TypeVar

from greenctl.data.errors import HardwareError

# The interface both backends share lives in device_api, so fake_nvml need not import this
# module (which imports fake_nvml for the factory); re-exported here for callers.
from greenctl.profiler.device_api import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_FUNCTION_NOT_FOUND,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_IN_USE,
    NVML_ERROR_INSUFFICIENT_RESOURCES,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_INVALID_STATE,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    GpuBackend,
    GpuInfo,
    MigInstance,
    MigProfile,
    is_no_driver,
    nvml_error,
    nvml_reason,
)
from greenctl.profiler.fake_nvml import FakeNvml

__all__ = [
    "FAKE_ENV",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_INSUFFICIENT_RESOURCES",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_INVALID_STATE",
    "NVML_ERROR_IN_USE",
    "NVML_ERROR_LIBRARY_NOT_FOUND",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_UNKNOWN",
    "FakeNvml",
    "GpuBackend",
    "GpuInfo",
    "MigInstance",
    "MigProfile",
    "NvmlBackend",
    "get_backend",
    "is_no_driver",
    "mig_profile_name",
    "no_gpu_reason",
    "nvml_error",
    "nvml_reason",
]

FAKE_ENV = "GREENCTL_FAKE_NVML"


def mig_profile_name(raw: str) -> str:
    """``"MIG 3g.40gb"`` -> ``"3g.40gb"``."""
    return raw.removeprefix("MIG").strip()


T = TypeVar("T")


class NvmlBackend:
    """The real device layer over ``pynvml`` (package nvidia-ml-py).

    Raises:
        HardwareError: from the constructor when NVML cannot be initialised.
    """

    def __init__(self) -> None:
        try:
            import pynvml
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise HardwareError(
                "the pynvml module is missing", hint="pip install nvidia-ml-py"
            ) from exc
        self._n: Any = pynvml
        self._call("initialising NVML", pynvml.nvmlInit)
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------
    def _call(self, action: str, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        except self._n.NVMLError as exc:
            raise nvml_error(exc, action) from None

    def _handle(self, index: int) -> Any:
        return self._call(f"opening GPU {index}", self._n.nvmlDeviceGetHandleByIndex, index)

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with contextlib.suppress(self._n.NVMLError):
                self._n.nvmlShutdown()

    # -- reading ---------------------------------------------------------------------------
    def driver_version(self) -> str | None:
        return self._text(
            self._call("reading the driver version", self._n.nvmlSystemGetDriverVersion)
        )

    def cuda_version(self) -> str | None:
        v = int(self._call("reading the CUDA version", self._n.nvmlSystemGetCudaDriverVersion))
        return f"{v // 1000}.{(v % 1000) // 10}"

    def gpus(self) -> list[GpuInfo]:
        n = self._n
        out = []
        for i in range(int(self._call("counting GPUs", n.nvmlDeviceGetCount))):
            h = self._handle(i)
            mem = self._call(f"reading memory of GPU {i}", n.nvmlDeviceGetMemoryInfo, h)
            try:
                current, _pending = n.nvmlDeviceGetMigMode(h)
                mig: bool | None = bool(current == n.NVML_DEVICE_MIG_ENABLE)
            except n.NVMLError:
                mig = None
            try:
                limit: float | None = n.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0
            except n.NVMLError:
                limit = None
            out.append(
                GpuInfo(
                    index=i,
                    uuid=self._text(self._call(f"reading GPU {i}'s UUID", n.nvmlDeviceGetUUID, h)),
                    name=self._text(self._call(f"reading GPU {i}'s name", n.nvmlDeviceGetName, h)),
                    memory_mb=mem.total / 2**20,
                    mig_enabled=mig,
                    power_limit_w=limit,
                )
            )
        return out

    def _gi_profiles(self, h: Any) -> list[Any]:
        n = self._n
        infos = []
        for p in range(n.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                infos.append(n.nvmlDeviceGetGpuInstanceProfileInfo(h, p))
            except n.NVMLError:
                continue  # profile not offered by this GPU
        return infos

    def mig_profiles(self, gpu_index: int) -> list[MigProfile]:
        n = self._n
        h = self._handle(gpu_index)
        out = []
        for info in self._gi_profiles(h):
            arr = (n.c_nvmlGpuInstancePlacement_t * max(int(info.instanceCount), 8))()
            count = n.c_uint(len(arr))
            try:
                n.nvmlDeviceGetGpuInstancePossiblePlacements(h, info.id, arr, n.byref(count))
                placements = tuple((int(p.start), int(p.size)) for p in arr[: count.value])
            except n.NVMLError:
                placements = ()
            out.append(
                MigProfile(
                    gpu_index=gpu_index,
                    profile_id=int(info.id),
                    name=mig_profile_name(self._text(info.name)),
                    slices=int(info.sliceCount),
                    memory_mb=float(info.memorySizeMB),
                    max_instances=int(info.instanceCount),
                    placements=placements,
                )
            )
        return out

    def total_compute_slices(self, gpu_index: int) -> int:
        profiles = self.mig_profiles(gpu_index)
        if not profiles:
            raise nvml_error(NVML_ERROR_NOT_SUPPORTED, f"reading MIG profiles of GPU {gpu_index}")
        return max(p.slices for p in profiles)

    def _mig_uuids(self, h: Any) -> dict[tuple[int, int], tuple[str, float]]:
        n = self._n
        out: dict[tuple[int, int], tuple[str, float]] = {}
        for k in range(
            int(self._call("counting MIG devices", n.nvmlDeviceGetMaxMigDeviceCount, h))
        ):
            try:
                mh = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
            except n.NVMLError:
                continue  # empty slot
            key = (int(n.nvmlDeviceGetGpuInstanceId(mh)), int(n.nvmlDeviceGetComputeInstanceId(mh)))
            mem = n.nvmlDeviceGetMemoryInfo(mh).total / 2**20
            out[key] = (self._text(n.nvmlDeviceGetUUID(mh)), mem)
        return out

    def mig_instances(self, gpu_index: int) -> list[MigInstance]:
        n = self._n
        h = self._handle(gpu_index)
        gpu_uuid = self._text(self._call("reading the GPU UUID", n.nvmlDeviceGetUUID, h))
        try:
            current, _ = n.nvmlDeviceGetMigMode(h)
        except n.NVMLError:
            return []
        if current != n.NVML_DEVICE_MIG_ENABLE:
            return []
        uuids = self._mig_uuids(h)
        out = []
        for info in self._gi_profiles(h):
            arr = (n.c_nvmlGpuInstance_t * max(int(info.instanceCount), 1))()
            count = n.c_uint(0)
            self._call(
                "listing MIG GPU instances",
                n.nvmlDeviceGetGpuInstances,
                h,
                info.id,
                arr,
                n.byref(count),
            )
            for gi in arr[: count.value]:
                gi_info = self._call("reading a GPU instance", n.nvmlGpuInstanceGetInfo, gi)
                out.extend(self._compute_instances(gpu_index, gpu_uuid, gi, gi_info, info, uuids))
        return sorted(out, key=lambda m: (m.placement_start, m.gi_id, m.ci_id))

    def _compute_instances(
        self,
        gpu_index: int,
        gpu_uuid: str,
        gi: Any,
        gi_info: Any,
        gi_prof: Any,
        uuids: dict[tuple[int, int], tuple[str, float]],
    ) -> list[MigInstance]:
        n = self._n
        out = []
        for p in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                ci_prof = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, p, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except n.NVMLError:
                continue
            arr = (n.c_nvmlComputeInstance_t * max(int(ci_prof.instanceCount), 1))()
            count = n.c_uint(0)
            self._call(
                "listing MIG compute instances",
                n.nvmlGpuInstanceGetComputeInstances,
                gi,
                ci_prof.id,
                arr,
                n.byref(count),
            )
            for ci in arr[: count.value]:
                ci_info = self._call("reading a compute instance", n.nvmlComputeInstanceGetInfo, ci)
                uuid, mem = uuids.get((int(gi_info.id), int(ci_info.id)), (None, None))
                out.append(
                    MigInstance(
                        gpu_index=gpu_index,
                        gpu_uuid=gpu_uuid,
                        gi_id=int(gi_info.id),
                        ci_id=int(ci_info.id),
                        profile=mig_profile_name(self._text(gi_prof.name)),
                        gi_profile_id=int(gi_prof.id),
                        placement_start=int(gi_info.placement.start),
                        placement_size=int(gi_info.placement.size),
                        slices=int(ci_prof.sliceCount),
                        gi_slices=int(gi_prof.sliceCount),
                        memory_mb=float(mem if mem is not None else gi_prof.memorySizeMB),
                        uuid=uuid,
                    )
                )
        return out

    def energy_mj(self, gpu_index: int) -> int:
        return int(
            self._call(
                f"reading GPU {gpu_index}'s energy counter",
                self._n.nvmlDeviceGetTotalEnergyConsumption,
                self._handle(gpu_index),
            )
        )

    def power_w(self, gpu_index: int) -> float:
        mw = self._call(
            f"reading GPU {gpu_index}'s power",
            self._n.nvmlDeviceGetPowerUsage,
            self._handle(gpu_index),
        )
        return float(mw) / 1000.0

    def memory_used_mb(self, gpu_index: int) -> float:
        mem = self._call(
            f"reading GPU {gpu_index}'s memory",
            self._n.nvmlDeviceGetMemoryInfo,
            self._handle(gpu_index),
        )
        return float(mem.used) / 2**20

    # -- changing MIG (executor only) ----------------------------------------------------
    def _profile(self, gpu_index: int, name: str) -> MigProfile:
        for p in self.mig_profiles(gpu_index):
            if p.name == name:
                return p
        known = ", ".join(p.name for p in self.mig_profiles(gpu_index)) or "none"
        raise HardwareError(
            f"GPU {gpu_index} has no MIG profile '{name}'", hint=f"its profiles: {known}"
        )

    def create_gpu_instance_with_placement(self, gpu_index: int, profile: str, start: int) -> int:
        n = self._n
        prof = self._profile(gpu_index, profile)
        placement = n.c_nvmlGpuInstancePlacement_t()
        placement.start = start
        placement.size = next((s for st, s in prof.placements if st == start), 0)
        gi = self._call(
            f"creating MIG {profile} at slot {start} on GPU {gpu_index}",
            n.nvmlDeviceCreateGpuInstanceWithPlacement,
            self._handle(gpu_index),
            prof.profile_id,
            n.byref(placement),
        )
        return int(self._call("reading a GPU instance", n.nvmlGpuInstanceGetInfo, gi).id)

    def create_compute_instance(
        self, gpu_index: int, gi_id: int, slices: int | None = None
    ) -> MigInstance:
        n = self._n
        h = self._handle(gpu_index)
        gi = self._call(f"opening GPU instance {gi_id}", n.nvmlDeviceGetGpuInstanceById, h, gi_id)
        chosen = None
        for p in range(n.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, p, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except n.NVMLError:
                continue
            if (slices is None and (chosen is None or info.sliceCount > chosen.sliceCount)) or (
                slices is not None and info.sliceCount == slices
            ):
                chosen = info
        if chosen is None:
            raise nvml_error(NVML_ERROR_NOT_SUPPORTED, f"finding a {slices}-slice compute profile")
        ci = self._call(
            f"creating a compute instance in GPU instance {gi_id}",
            n.nvmlGpuInstanceCreateComputeInstance,
            gi,
            chosen.id,
        )
        ci_id = int(self._call("reading a compute instance", n.nvmlComputeInstanceGetInfo, ci).id)
        for m in self.mig_instances(gpu_index):
            if m.gi_id == gi_id and m.ci_id == ci_id:
                return m
        raise HardwareError(f"compute instance {gi_id}/{ci_id} vanished after creation")

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        n = self._n
        gi = self._call(
            f"opening GPU instance {gi_id}",
            n.nvmlDeviceGetGpuInstanceById,
            self._handle(gpu_index),
            gi_id,
        )
        ci = self._call(
            f"opening compute instance {ci_id}", n.nvmlGpuInstanceGetComputeInstanceById, gi, ci_id
        )
        self._call(f"destroying compute instance {gi_id}/{ci_id}", n.nvmlComputeInstanceDestroy, ci)

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        n = self._n
        for m in self.mig_instances(gpu_index):
            if m.gi_id == gi_id:
                self.destroy_compute_instance(gpu_index, gi_id, m.ci_id)
        gi = self._call(
            f"opening GPU instance {gi_id}",
            n.nvmlDeviceGetGpuInstanceById,
            self._handle(gpu_index),
            gi_id,
        )
        self._call(f"destroying GPU instance {gi_id}", n.nvmlGpuInstanceDestroy, gi)


def get_backend() -> GpuBackend | None:
    """The device layer for this process, or None when there is no NVIDIA driver.

    ``GREENCTL_FAKE_NVML=<path>`` selects the fake described by that JSON file.

    Raises:
        HardwareError: NVML exists but failed for another reason (permissions, lost GPU), or
            the fake description is malformed.
    """
    fake = os.environ.get(FAKE_ENV)
    if fake:
        return FakeNvml.from_file(fake)
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return None
    try:
        return NvmlBackend()
    except HardwareError as err:
        if is_no_driver(err):
            return None
        raise


def no_gpu_reason() -> str:
    """Why :func:`get_backend` found no GPU, in words (for ``greenctl hw``)."""
    try:
        import pynvml
    except ImportError:
        return "the pynvml module is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return nvml_reason(getattr(exc, "value", -1)) or str(exc)
    pynvml.nvmlShutdown()
    return "NVML found no GPU"
