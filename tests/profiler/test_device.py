"""The NVML device layer: the fake's GPUs/MIG/energy, error mapping, backend selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data.errors import FileFormatError, HardwareError
from greenctl.profiler import device as dev
from greenctl.profiler.device import GpuBackend, get_backend, nvml_error
from greenctl.profiler.fake_nvml import FakeNvml

FAKE = Path(__file__).with_name("fake_a100.json")


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml.from_file(FAKE)


def test_fake_is_a_backend(fake):
    assert isinstance(fake, GpuBackend)


def test_lists_gpus_with_mig_mode_and_versions(fake):
    gpus = fake.gpus()
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].name == "NVIDIA A100-SXM4-40GB" and gpus[0].mig_enabled is True
    assert gpus[1].mig_enabled is False and gpus[1].memory_mb == 81559
    assert gpus[0].label == "A100-SXM4-40GB"
    assert gpus[1].label == "H100-80GB-HBM3"
    assert fake.driver_version() == "550.54.15" and fake.cuda_version() == "12.4"


def test_lists_mig_instances_with_profiles_placements_and_uuids(fake):
    inst = fake.mig_instances(0)
    assert [(m.profile, m.placement_start, m.placement_size) for m in inst] == [
        ("2g.10gb", 0, 2),
        ("1g.5gb", 2, 1),
        ("1g.5gb", 3, 1),
        ("3g.20gb", 4, 4),
    ]
    assert inst[-1].uuid == "MIG-aaaaaaaa-0000-0000-0000-000000000001"
    assert all(m.uuid and m.uuid.startswith("MIG-") for m in inst)
    assert len({m.uuid for m in inst}) == 4
    assert sum(m.slices for m in inst) == fake.total_compute_slices(0) == 7
    assert fake.mig_instances(1) == []  # MIG off


def test_mig_create_destroy_and_refusals(fake):
    # the GPU is full: any new instance overlaps
    with pytest.raises(HardwareError, match="not enough free MIG slices"):
        fake.create_gpu_instance_with_placement(0, "1g.5gb", 5)
    three = next(m for m in fake.mig_instances(0) if m.profile == "3g.20gb")
    fake.destroy_gpu_instance(0, three.gi_id)
    gi = fake.create_gpu_instance_with_placement(0, "1g.5gb", 5)
    ci = fake.create_compute_instance(0, gi)
    assert ci.profile == "1g.5gb" and ci.placement_start == 5 and ci.uuid.startswith("MIG-")
    with pytest.raises(HardwareError, match="can start at memory slot 0, 4"):
        fake.create_gpu_instance_with_placement(0, "3g.20gb", 5)
    with pytest.raises(HardwareError, match=r"no MIG profile '3g\.40gb'"):
        fake.create_gpu_instance_with_placement(0, "3g.40gb", 0)
    with pytest.raises(HardwareError, match="MIG mode enabled"):
        fake.create_gpu_instance_with_placement(1, "1g.10gb", 0)
    fake.destroy_compute_instance(0, gi, ci.ci_id)
    assert all(m.gi_id != gi for m in fake.mig_instances(0))
    with pytest.raises(HardwareError, match="not found"):
        fake.destroy_gpu_instance(0, 99)


def test_persisted_fake_shares_mig_changes_between_processes(tmp_path):
    desc = json.loads(FAKE.read_text())
    desc["persist"] = True
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(desc))
    a = FakeNvml.from_file(path)
    gi = next(m.gi_id for m in a.mig_instances(0) if m.profile == "3g.20gb")
    a.destroy_gpu_instance(0, gi)
    b = FakeNvml.from_file(path)
    assert [m.profile for m in b.mig_instances(0)] == ["2g.10gb", "1g.5gb", "1g.5gb"]


def test_energy_counter_integrates_power_over_the_clock():
    now = [100.0]
    fake = FakeNvml(json.loads(FAKE.read_text()), clock=lambda: now[0])
    e0 = fake.energy_mj(0)
    assert e0 == 5_000_000
    now[0] += 2.0
    assert fake.energy_mj(0) - e0 == pytest.approx(280.0 * 2.0 * 1000)
    fake.set_power(0, 100.0)
    now[0] += 1.0
    assert fake.energy_mj(0) - e0 == pytest.approx((560.0 + 100.0) * 1000)


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (dev.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so"),
        (dev.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (dev.NVML_ERROR_NO_PERMISSION, "insufficient permissions"),
        (dev.NVML_ERROR_NOT_SUPPORTED, "does not support"),
        (dev.NVML_ERROR_INSUFFICIENT_RESOURCES, "not enough free MIG slices"),
    ],
)
def test_real_pynvml_errors_map_to_hardware_errors(code, text):
    pynvml = pytest.importorskip("pynvml")
    exc = pynvml.NVMLError(code)  # pynvml turns the code into its subclass
    err = nvml_error(exc, "doing something")
    assert isinstance(err, HardwareError)
    assert "NVML failed while doing something" in str(err) and text in str(err)
    assert err.hint


def test_get_backend_is_none_without_a_driver(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def no_lib() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.delenv(dev.FAKE_ENV, raising=False)
    monkeypatch.setattr(pynvml, "nvmlInit", no_lib)
    assert get_backend() is None
    assert "not found" in dev.no_gpu_reason()


def test_get_backend_raises_for_other_nvml_failures(monkeypatch):
    pynvml = pytest.importorskip("pynvml")

    def denied() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)

    monkeypatch.delenv(dev.FAKE_ENV, raising=False)
    monkeypatch.setattr(pynvml, "nvmlInit", denied)
    with pytest.raises(HardwareError, match="insufficient permissions"):
        get_backend()


def test_env_var_selects_the_fake(monkeypatch):
    monkeypatch.setenv(dev.FAKE_ENV, str(FAKE))
    backend = get_backend()
    assert isinstance(backend, FakeNvml)
    assert len(backend.gpus()) == 2


def test_fake_can_simulate_driver_failures(tmp_path, monkeypatch):
    desc = json.loads(FAKE.read_text())
    desc["errors"] = {"init": "driver_not_loaded"}
    path = tmp_path / "nodriver.json"
    path.write_text(json.dumps(desc))
    with pytest.raises(HardwareError) as info:
        FakeNvml.from_file(path)
    assert dev.is_no_driver(info.value)
    fake = FakeNvml.from_file(FAKE)
    fake.fail("energy", "not_supported")
    with pytest.raises(HardwareError, match="energy counter"):
        fake.energy_mj(0)


def test_bad_fake_description_is_a_file_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"gpus": [')
    with pytest.raises(FileFormatError, match=r"bad\.json, line 1"):
        FakeNvml.from_file(path)


class _Mem:
    def __init__(self, total: int, used: int) -> None:
        self.total, self.used = total, used


def test_nvml_backend_reads_through_pynvml(monkeypatch):
    """NvmlBackend against pynvml functions replaced by plain Python (no driver needed)."""
    pynvml = pytest.importorskip("pynvml")
    calls = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda i: f"h{i}",
        "nvmlDeviceGetMemoryInfo": lambda h: _Mem(16 * 2**30, 2**30),
        "nvmlDeviceGetMigMode": lambda h: (0, 0),
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: 70000,
        "nvmlDeviceGetUUID": lambda h: "GPU-abc",
        "nvmlDeviceGetName": lambda h: b"Tesla T4",
        "nvmlSystemGetDriverVersion": lambda: "535.1",
        "nvmlSystemGetCudaDriverVersion": lambda: 12020,
        "nvmlDeviceGetTotalEnergyConsumption": lambda h: 123456,
        "nvmlDeviceGetPowerUsage": lambda h: 35500,
    }
    for name, fn in calls.items():
        monkeypatch.setattr(pynvml, name, fn)
    be = dev.NvmlBackend()
    (g,) = be.gpus()
    assert (g.name, g.uuid, g.memory_mb, g.mig_enabled, g.power_limit_w) == (
        "Tesla T4",
        "GPU-abc",
        16384.0,
        False,
        70.0,
    )
    assert be.cuda_version() == "12.2" and be.driver_version() == "535.1"
    assert be.energy_mj(0) == 123456 and be.power_w(0) == 35.5
    assert be.memory_used_mb(0) == 1024.0
    assert be.mig_instances(0) == []

    def unsupported(h: object) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", unsupported)
    with pytest.raises(HardwareError, match="energy counter: this GPU or driver does not support"):
        be.energy_mj(0)
    be.close()


def test_fake_geometry_is_the_bundled_mig_geometry(fake):
    from greenctl.data.mig_geometry import find_gpu

    geo = find_gpu("NVIDIA A100-SXM4-40GB")
    profiles = {p.name: p for p in fake.mig_profiles(0)}
    assert set(profiles) == {p.name for p in geo.profiles}
    assert profiles["3g.20gb"].placements == ((0, 4), (4, 4))
    assert fake.total_compute_slices(0) == geo.compute_slices
    # +me profiles: at most one per GPU
    three = next(m for m in fake.mig_instances(0) if m.profile == "3g.20gb")
    fake.destroy_gpu_instance(0, three.gi_id)
    fake.create_gpu_instance_with_placement(0, "1g.5gb+me", 4)
    with pytest.raises(HardwareError, match="not enough free MIG slices"):
        fake.create_gpu_instance_with_placement(0, "1g.5gb+me", 5)
    fake.create_gpu_instance_with_placement(0, "1g.5gb", 5)
