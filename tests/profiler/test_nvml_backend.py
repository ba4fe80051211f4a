"""NvmlBackend's MIG code against pynvml with its C calls replaced by a Python stub.

No driver is needed: the stub keeps a tiny A100 state (GPU instances, compute instances,
MIG device handles) and answers the pynvml functions NvmlBackend calls, with ctypes
handle types swapped for ints so handles can be written into the arrays NVML fills.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace as NS

import pytest
from greenctl.data.errors import HardwareError
from greenctl.profiler.device import NvmlBackend

pynvml = pytest.importorskip("pynvml")

# profile index -> (profile id, name, slices, memory MB, instances, placements)
GI_PROFILES = {
    0: (0, "MIG 1g.5gb", 1, 4864, 7, [(i, 1) for i in range(7)]),
    2: (2, "MIG 3g.20gb", 3, 19968, 2, [(0, 4), (4, 4)]),
    4: (4, "MIG 7g.40gb", 7, 40192, 1, [(0, 8)]),
}


class Stub:
    def __init__(self) -> None:
        self.gis: dict[int, dict] = {}  # gi_id -> {pid, start, size, cis: {ci_id: slices}}

    # helpers
    def _prof(self, pid: int):
        return next(v for v in GI_PROFILES.values() if v[0] == pid)

    def gi_profile_info(self, h, p):
        if p not in GI_PROFILES:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pid, name, slices, mem, count, _ = GI_PROFILES[p]
        return NS(
            id=pid, name=name.encode(), sliceCount=slices, memorySizeMB=mem, instanceCount=count
        )

    def possible_placements(self, h, pid, arr, count):
        pl = self._prof(pid)[5]
        for i, (s, z) in enumerate(pl):
            arr[i].start, arr[i].size = s, z
        count.value = len(pl)

    def get_gpu_instances(self, h, pid, arr, count):
        ids = [g for g, v in sorted(self.gis.items()) if v["pid"] == pid]
        for i, g in enumerate(ids):
            arr[i] = g
        count.value = len(ids)

    def gi_info(self, gi):
        v = self.gis[gi]
        return NS(id=gi, placement=NS(start=v["start"], size=v["size"]))

    def ci_profile_info(self, gi, p, eng):
        gi_slices = self._prof(self.gis[gi]["pid"])[2]
        slices = {0: 1, 2: 3, 4: 7}.get(p)
        if slices is None or slices > gi_slices:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return NS(id=p, sliceCount=slices, instanceCount=gi_slices // slices)

    def get_compute_instances(self, gi, ci_pid, arr, count):
        slices = {0: 1, 2: 3, 4: 7}[ci_pid]
        ids = [c for c, s in sorted(self.gis[gi]["cis"].items()) if s == slices]
        for i, c in enumerate(ids):
            arr[i] = gi * 100 + c
        count.value = len(ids)

    def mig_handles(self):
        return [(g, c) for g, v in sorted(self.gis.items()) for c in sorted(v["cis"])]

    def mig_handle(self, h, k):
        handles = self.mig_handles()
        if k >= len(handles):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return ("mig", *handles[k])

    def create_gi(self, h, pid, placement):
        if any(
            v["start"] < placement.start + placement.size
            and placement.start < v["start"] + v["size"]
            for v in self.gis.values()
        ):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi = max([0, *self.gis]) + 1
        self.gis[gi] = {"pid": pid, "start": placement.start, "size": placement.size, "cis": {}}
        return gi

    def create_ci(self, gi, ci_pid):
        cis = self.gis[gi]["cis"]
        ci = max([-1, *cis]) + 1
        cis[ci] = {0: 1, 2: 3, 4: 7}[ci_pid]
        return gi * 100 + ci


@pytest.fixture
def backend(monkeypatch):
    s = Stub()
    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: "h0",
        "nvmlDeviceGetUUID": lambda h: "GPU-0" if h == "h0" else f"MIG-{h[1]}-{h[2]}",
        "nvmlDeviceGetName": lambda h: "NVIDIA A100-SXM4-40GB",
        "nvmlDeviceGetMigMode": lambda h: (1, 1),
        "nvmlDeviceGetMemoryInfo": lambda h: NS(
            total=40 * 2**30 if h == "h0" else 20 * 2**30, used=0
        ),
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 400000,
        "nvmlDeviceGetGpuInstanceProfileInfo": s.gi_profile_info,
        "nvmlDeviceGetGpuInstancePossiblePlacements": s.possible_placements,
        "nvmlDeviceGetGpuInstances": s.get_gpu_instances,
        "nvmlGpuInstanceGetInfo": s.gi_info,
        "nvmlGpuInstanceGetComputeInstanceProfileInfo": s.ci_profile_info,
        "nvmlGpuInstanceGetComputeInstances": s.get_compute_instances,
        "nvmlComputeInstanceGetInfo": lambda ci: NS(id=ci % 100),
        "nvmlDeviceGetMaxMigDeviceCount": lambda h: 7,
        "nvmlDeviceGetMigDeviceHandleByIndex": s.mig_handle,
        "nvmlDeviceGetGpuInstanceId": lambda mh: mh[1],
        "nvmlDeviceGetComputeInstanceId": lambda mh: mh[2],
        "nvmlDeviceCreateGpuInstanceWithPlacement": s.create_gi,
        "nvmlDeviceGetGpuInstanceById": lambda h, gi: gi,
        "nvmlGpuInstanceCreateComputeInstance": s.create_ci,
        "nvmlGpuInstanceGetComputeInstanceById": lambda gi, ci: gi * 100 + ci,
        "nvmlComputeInstanceDestroy": lambda ci: s.gis[ci // 100]["cis"].pop(ci % 100),
        "nvmlGpuInstanceDestroy": lambda gi: s.gis.pop(gi),
        # handles become ints; byref passes the object itself
        "c_nvmlGpuInstance_t": ctypes.c_int,
        "c_nvmlComputeInstance_t": ctypes.c_int,
        "byref": lambda x: x,
    }
    for name, fn in calls.items():
        monkeypatch.setattr(pynvml, name, fn)
    be = NvmlBackend()
    yield be, s
    be.close()


def test_profiles_and_total_slices(backend):
    be, _ = backend
    profs = {p.name: p for p in be.mig_profiles(0)}
    assert set(profs) == {"1g.5gb", "3g.20gb", "7g.40gb"}
    assert profs["3g.20gb"].placements == ((0, 4), (4, 4)) and profs["3g.20gb"].slices == 3
    assert be.total_compute_slices(0) == 7
    assert be.gpus()[0].mig_enabled is True


def test_create_list_destroy_mig_instances(backend):
    be, stub = backend
    gi = be.create_gpu_instance_with_placement(0, "3g.20gb", 4)
    ci = be.create_compute_instance(0, gi)
    assert (ci.profile, ci.placement_start, ci.placement_size, ci.slices) == ("3g.20gb", 4, 4, 3)
    assert ci.uuid == f"MIG-{gi}-0" and ci.memory_mb == 20 * 1024
    gi2 = be.create_gpu_instance_with_placement(0, "1g.5gb", 0)
    be.create_compute_instance(0, gi2, slices=1)
    listed = be.mig_instances(0)
    assert [(m.profile, m.placement_start) for m in listed] == [("1g.5gb", 0), ("3g.20gb", 4)]
    with pytest.raises(HardwareError, match="not enough free MIG slices"):
        be.create_gpu_instance_with_placement(0, "3g.20gb", 4)
    with pytest.raises(HardwareError, match="no MIG profile"):
        be.create_gpu_instance_with_placement(0, "2g.10gb", 0)
    be.destroy_gpu_instance(0, gi)
    assert [m.profile for m in be.mig_instances(0)] == ["1g.5gb"]
    assert gi not in stub.gis
