"""A simulated NVML for tests: GPUs, MIG geometry, instances, energy counters, errors.

:class:`FakeNvml` implements :class:`greenctl.profiler.device.GpuBackend`, built from a dict
or a JSON file; ``GREENCTL_FAKE_NVML=<file>`` makes :func:`device.get_backend` return it in
every greenctl process (CLI tests, child runs, executor daemons). The description has
``driver_version``, ``cuda_version``, ``persist``, injected ``errors`` and ``gpus``, each with
``name``, ``uuid``, ``memory_mb``, ``mig``, ``power_w``, ``energy_mj``, ``geometry`` (see
data/datasets/mig_geometry.json) and MIG ``instances``. The energy counter (mJ) grows by
``power_w`` over an injectable clock; MIG placements are refused exactly as the driver
refuses them (INSUFFICIENT_RESOURCES).
"""

from __future__ import annotations

import json
import time
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, HardwareError
from greenctl.data.mig_geometry import find_gpu, load_geometry
from greenctl.profiler import device_api as dev
from greenctl.profiler.device_api import GpuInfo, MigInstance, MigProfile

_ERROR_CODES = {
    "library_not_found": dev.NVML_ERROR_LIBRARY_NOT_FOUND,
    "driver_not_loaded": dev.NVML_ERROR_DRIVER_NOT_LOADED,
    "no_permission": dev.NVML_ERROR_NO_PERMISSION,
    "not_supported": dev.NVML_ERROR_NOT_SUPPORTED,
    "gpu_is_lost": dev.NVML_ERROR_GPU_IS_LOST,
    "in_use": dev.NVML_ERROR_IN_USE,
    "unknown": dev.NVML_ERROR_UNKNOWN,
}


def _geometry(name: str, memory_mb: float) -> Any:
    """The MIG geometry (``data/datasets/mig_geometry.json``) of a GPU name, else the known
    geometry closest in memory size."""
    geo = find_gpu(name)
    if geo is None:
        geo = min(load_geometry(), key=lambda g: abs(g.memory_gib * 1024 - memory_mb))
    return geo


class _Gpu:
    def __init__(self, index: int, spec: dict[str, Any], now: float) -> None:
        self.index = index
        self.name = str(spec.get("name", "NVIDIA A100-SXM4-40GB"))
        self.uuid = str(
            spec.get("uuid", f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'fake{index}')}")
        )
        self.memory_mb = float(spec.get("memory_mb", 40960))
        self.mig: bool | None = spec.get("mig", False)
        self.power_w = float(spec.get("power_w", 60.0))
        self.power_limit_w = float(spec.get("power_limit_w", 400.0))
        self.energy_mj = float(spec.get("energy_mj", 0))
        self.memory_used_mb = float(spec.get("memory_used_mb", 0))
        self.last = now
        geo = _geometry(spec.get("geometry") or self.name, self.memory_mb)
        self.compute_slices = geo.compute_slices
        self.max_per_gpu = {p.name: p.max_per_gpu for p in geo.profiles if p.max_per_gpu}
        self.profiles = [
            MigProfile(
                index,
                p.id,
                p.name,
                p.compute_slices,
                p.memory_gib * 1024,
                min(len(p.starts), p.max_per_gpu or len(p.starts)),
                tuple((st, p.width) for st in p.starts),
            )
            for p in geo.profiles
        ]
        # gi_id -> {"profile": MigProfile, "start": int, "cis": {ci_id: (slices, uuid)}}
        self.gis: dict[int, dict[str, Any]] = {}


class FakeNvml:
    """A :class:`GpuBackend` that simulates NVML. See the module docstring for the format."""

    def __init__(
        self,
        description: dict[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
        path: str | Path | None = None,
    ) -> None:
        self._desc = description
        self._clock = clock
        self._path = Path(path) if path else None
        self._errors: dict[str, str] = dict(description.get("errors") or {})
        self._raise_if("init", "initialising NVML")
        now = clock()
        self._gpus = [_Gpu(i, g, now) for i, g in enumerate(description.get("gpus") or [])]
        for gpu in self._gpus:
            spec = (description.get("gpus") or [])[gpu.index]
            for inst in spec.get("instances") or []:
                gi_id = self._create_gi(gpu, str(inst["profile"]), int(inst.get("start", 0)))
                uuids = list(inst.get("uuids") or [])
                for k, slices in enumerate(inst.get("compute") or [None]):
                    self._create_ci(gpu, gi_id, slices, uuids[k] if k < len(uuids) else None)

    @classmethod
    def from_file(cls, path: str | Path, **kw: Any) -> FakeNvml:
        """Load a description file (``GREENCTL_FAKE_NVML``).

        Raises:
            FileFormatError: naming the file, when it cannot be read, is not UTF-8 JSON, is
                not a JSON object, or describes GPUs with fields of the wrong type.
        """
        p = Path(path)
        hint = (
            "GREENCTL_FAKE_NVML names a JSON description of simulated GPUs "
            '({"gpus": [{"name": "A100-SXM4-40GB", "memory_mb": 40960}]}); unset it to use '
            "the real NVML"
        )
        try:
            desc = json.loads(p.read_bytes().decode("utf-8"))
        except OSError as exc:
            raise FileFormatError(
                str(p), f"cannot read the fake NVML description: {exc.strerror}", hint=hint
            ) from None
        except UnicodeDecodeError as exc:
            raise FileFormatError(
                str(p), f"the fake NVML description is not UTF-8 text (byte {exc.start})", hint=hint
            ) from None
        except json.JSONDecodeError as exc:
            raise FileFormatError(str(p), exc.msg, line=exc.lineno, hint=hint) from None
        if not isinstance(desc, dict):
            raise FileFormatError(
                str(p), f"a fake NVML description is a JSON object, got {type(desc).__name__}",
                hint=hint,
            )  # fmt: skip
        if not desc.keys() & {"gpus", "errors"} or not isinstance(desc.get("gpus", []), list):
            raise FileFormatError(
                str(p),
                "a fake NVML description needs 'gpus', a list (empty: no GPU), or the 'errors' "
                "NVML raises",
                hint=hint,
            )
        try:
            return cls(desc, path=p if desc.get("persist") else None, **kw)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise FileFormatError(str(p), f"bad fake NVML description: {exc}", hint=hint) from None

    # -- simulation controls (tests) -------------------------------------------------------
    def set_power(self, gpu_index: int, power_w: float) -> None:
        """Change the power a GPU draws from now on."""
        gpu = self._gpu(gpu_index)
        self._tick(gpu)
        gpu.power_w = power_w

    def fail(self, what: str, error: str | None) -> None:
        """Make an operation (``init``, ``energy``, ``power``, ``mig``, ``create``) fail."""
        if error is None:
            self._errors.pop(what, None)
        else:
            self._errors[what] = error

    def description(self) -> dict[str, Any]:
        """The current state as a description (round-trips through the constructor)."""
        gpus = []
        for gpu, spec in zip(self._gpus, self._desc.get("gpus") or [], strict=False):
            self._tick(gpu)
            g = dict(spec)
            g["energy_mj"] = int(gpu.energy_mj)
            g["instances"] = [
                {
                    "profile": gi["profile"].name,
                    "start": gi["start"],
                    "compute": [s for s, _ in gi["cis"].values()],
                    "uuids": [u for _, u in gi["cis"].values()],
                }
                for gi in gpu.gis.values()
            ]
            gpus.append(g)
        return {**self._desc, "gpus": gpus}

    # -- internals -------------------------------------------------------------------------
    def _raise_if(self, what: str, action: str) -> None:
        err = self._errors.get(what)
        if err:
            raise dev.nvml_error(_ERROR_CODES.get(err, dev.NVML_ERROR_UNKNOWN), action)

    def _gpu(self, index: int) -> _Gpu:
        if not 0 <= index < len(self._gpus):
            raise dev.nvml_error(dev.NVML_ERROR_INVALID_ARGUMENT, f"opening GPU {index}")
        return self._gpus[index]

    def _tick(self, gpu: _Gpu) -> None:
        now = self._clock()
        gpu.energy_mj += gpu.power_w * (now - gpu.last) * 1000.0
        gpu.last = now

    def _save(self) -> None:
        if self._path is not None:
            self._path.write_text(json.dumps(self.description(), indent=2))

    def _create_gi(self, gpu: _Gpu, profile: str, start: int) -> int:
        action = f"creating MIG {profile} at slot {start} on GPU {gpu.index}"
        self._raise_if("create", action)
        if not gpu.mig:
            raise dev.nvml_error(dev.NVML_ERROR_INVALID_STATE, action)
        prof = next((p for p in gpu.profiles if p.name == profile), None)
        if prof is None:
            known = ", ".join(p.name for p in gpu.profiles)
            raise HardwareError(
                f"GPU {gpu.index} has no MIG profile '{profile}'", hint=f"its profiles: {known}"
            )
        size = next((s for st, s in prof.placements if st == start), None)
        if size is None:
            err = dev.nvml_error(dev.NVML_ERROR_INVALID_ARGUMENT, action)
            starts = ", ".join(str(st) for st, _ in prof.placements)
            err.hint = f"{profile} can start at memory slot {starts}"
            raise err
        used = set()
        for gi in gpu.gis.values():
            used |= set(range(gi["start"], gi["start"] + gi["size"]))
        busy_slices = sum(gi["profile"].slices for gi in gpu.gis.values())
        same = sum(1 for gi in gpu.gis.values() if gi["profile"].name == profile)
        if (
            used & set(range(start, start + size))
            or busy_slices + prof.slices > gpu.compute_slices
            or same >= gpu.max_per_gpu.get(profile, same + 1)
        ):
            raise dev.nvml_error(dev.NVML_ERROR_INSUFFICIENT_RESOURCES, action)
        gi_id = max([0, *gpu.gis]) + 1
        gpu.gis[gi_id] = {"profile": prof, "start": start, "size": size, "cis": {}}
        return gi_id

    def _create_ci(self, gpu: _Gpu, gi_id: int, slices: int | None, uuid: str | None) -> int:
        gi = gpu.gis.get(gi_id)
        action = f"creating a compute instance in GPU instance {gi_id}"
        if gi is None:
            raise dev.nvml_error(dev.NVML_ERROR_NOT_FOUND, action)
        slices = gi["profile"].slices if slices is None else int(slices)
        used = sum(s for s, _ in gi["cis"].values())
        if slices < 1 or used + slices > gi["profile"].slices:
            raise dev.nvml_error(dev.NVML_ERROR_INSUFFICIENT_RESOURCES, action)
        ci_id = max([-1, *gi["cis"]]) + 1
        name = f"{gpu.uuid}/{gi_id}/{ci_id}"
        gi["cis"][ci_id] = (slices, uuid or f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, name)}")
        return ci_id

    # -- GpuBackend ------------------------------------------------------------------------
    def driver_version(self) -> str | None:
        return str(self._desc.get("driver_version", "550.54.15"))

    def cuda_version(self) -> str | None:
        return str(self._desc.get("cuda_version", "12.4"))

    def gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(g.index, g.uuid, g.name, g.memory_mb, g.mig, g.power_limit_w)
            for g in self._gpus
        ]

    def mig_profiles(self, gpu_index: int) -> list[MigProfile]:
        gpu = self._gpu(gpu_index)
        if gpu.mig is None:
            return []
        return list(gpu.profiles)

    def total_compute_slices(self, gpu_index: int) -> int:
        gpu = self._gpu(gpu_index)
        if gpu.mig is None:
            raise dev.nvml_error(
                dev.NVML_ERROR_NOT_SUPPORTED, f"reading MIG profiles of GPU {gpu_index}"
            )
        return gpu.compute_slices

    def mig_instances(self, gpu_index: int) -> list[MigInstance]:
        self._raise_if("mig", "listing MIG GPU instances")
        gpu = self._gpu(gpu_index)
        if not gpu.mig:
            return []
        out = []
        for gi_id, gi in gpu.gis.items():
            prof: MigProfile = gi["profile"]
            for ci_id, (slices, uuid) in gi["cis"].items():
                out.append(
                    MigInstance(
                        gpu_index=gpu.index,
                        gpu_uuid=gpu.uuid,
                        gi_id=gi_id,
                        ci_id=ci_id,
                        profile=prof.name,
                        gi_profile_id=prof.profile_id,
                        placement_start=gi["start"],
                        placement_size=gi["size"],
                        slices=slices,
                        gi_slices=prof.slices,
                        memory_mb=prof.memory_mb,
                        uuid=uuid,
                    )
                )
        return sorted(out, key=lambda m: (m.placement_start, m.gi_id, m.ci_id))

    def energy_mj(self, gpu_index: int) -> int:
        self._raise_if("energy", f"reading GPU {gpu_index}'s energy counter")
        gpu = self._gpu(gpu_index)
        self._tick(gpu)
        return int(gpu.energy_mj)

    def power_w(self, gpu_index: int) -> float:
        self._raise_if("power", f"reading GPU {gpu_index}'s power")
        return self._gpu(gpu_index).power_w

    def memory_used_mb(self, gpu_index: int) -> float:
        return self._gpu(gpu_index).memory_used_mb

    def create_gpu_instance_with_placement(self, gpu_index: int, profile: str, start: int) -> int:
        gi_id = self._create_gi(self._gpu(gpu_index), profile, start)
        self._save()
        return gi_id

    def create_compute_instance(
        self, gpu_index: int, gi_id: int, slices: int | None = None
    ) -> MigInstance:
        ci_id = self._create_ci(self._gpu(gpu_index), gi_id, slices, None)
        self._save()
        return next(
            m for m in self.mig_instances(gpu_index) if m.gi_id == gi_id and m.ci_id == ci_id
        )

    def destroy_compute_instance(self, gpu_index: int, gi_id: int, ci_id: int) -> None:
        gpu = self._gpu(gpu_index)
        gi = gpu.gis.get(gi_id)
        if gi is None or ci_id not in gi["cis"]:
            raise dev.nvml_error(dev.NVML_ERROR_NOT_FOUND, f"opening compute instance {ci_id}")
        self._raise_if("destroy", f"destroying compute instance {gi_id}/{ci_id}")
        del gi["cis"][ci_id]
        self._save()

    def destroy_gpu_instance(self, gpu_index: int, gi_id: int) -> None:
        gpu = self._gpu(gpu_index)
        if gi_id not in gpu.gis:
            raise dev.nvml_error(dev.NVML_ERROR_NOT_FOUND, f"opening GPU instance {gi_id}")
        self._raise_if("destroy", f"destroying GPU instance {gi_id}")
        del gpu.gis[gi_id]
        self._save()

    def close(self) -> None:
        return None
