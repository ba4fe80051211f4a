"""Hardware discovery: /proc/cpuinfo parsing, RAPL files, MPS pipe, GPU/MIG records."""

from __future__ import annotations

import os
from pathlib import Path

from greenctl.profiler import hw
from greenctl.profiler.fake_nvml import FakeNvml

FAKE = Path(__file__).with_name("fake_a100.json")

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 7763 64-Core Processor
physical id\t: 0
core id\t: 0

processor\t: 1
model name\t: AMD EPYC 7763 64-Core Processor
physical id\t: 0
core id\t: 0

processor\t: 2
model name\t: AMD EPYC 7763 64-Core Processor
physical id\t: 0
core id\t: 1
"""


def test_cpuinfo_model_and_physical_cores(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    model, physical = hw._cpuinfo(str(path))
    assert model == "AMD EPYC 7763 64-Core Processor"
    assert physical == 2  # 3 logical CPUs, two distinct (package, core) pairs


def test_rapl_files_lists_only_readable_counters(tmp_path):
    ok = tmp_path / "intel-rapl:0"
    ok.mkdir()
    (ok / "energy_uj").write_text("123456\n")
    bad = tmp_path / "intel-rapl:1"
    bad.mkdir()
    (bad / "energy_uj").write_text("not a number\n")
    assert hw.rapl_files(str(tmp_path / "intel-rapl:*" / "energy_uj")) == [str(ok / "energy_uj")]


def test_mps_pipe_detected_only_when_the_control_fifo_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert hw.mps_pipe() is None
    (tmp_path / "control").write_text("")  # a plain file is not a daemon
    assert hw.mps_pipe() is None
    (tmp_path / "control").unlink()
    os.mkfifo(tmp_path / "control")
    assert hw.mps_pipe() == str(tmp_path / "control")


def test_discover_cpu_only_never_fails():
    inv = hw.discover(backend=None)
    assert inv.cpu.kind == "cpu" and inv.cpu.cores == len(os.sched_getaffinity(0))
    assert inv.cpu.rapl_readable == bool(hw.rapl_files())
    assert inv.gpus == [] and inv.mig == []


def test_discover_without_driver_says_no_gpu(monkeypatch):
    monkeypatch.setattr(hw, "get_backend", lambda: None)
    monkeypatch.setattr(hw, "no_gpu_reason", lambda: "the NVML library was not found")
    inv = hw.discover()
    assert inv.gpus == []
    assert inv.notes == ["no NVIDIA GPU found (the NVML library was not found)"]


def test_discover_with_fake_gpus_gives_gpu_and_mig_records():
    inv = hw.discover(backend=FakeNvml.from_file(FAKE))
    assert [g.model_name for g in inv.gpus] == ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]
    assert all(g.kind == "gpu" and g.driver_version == "550.54.15" for g in inv.gpus)
    assert inv.gpus[1].cuda_version == "12.4"
    shares = {(m.mig_profile, m.compute_share) for m in inv.mig}
    assert shares == {("2g.10gb", 2 / 7), ("1g.5gb", 1 / 7), ("3g.20gb", 3 / 7)}
    three = next(m for m in inv.mig if m.mig_profile == "3g.20gb")
    assert three.uuid == "MIG-aaaaaaaa-0000-0000-0000-000000000001"
    assert three.parent_uuid == inv.gpus[0].uuid and three.memory_mb == 20 * 1024
    assert inv.mps_pipe is None


def test_discover_reports_mig_listing_failures_as_notes():
    fake = FakeNvml.from_file(FAKE)
    fake.fail("mig", "no_permission")
    inv = hw.discover(backend=fake)
    assert len(inv.gpus) == 2 and inv.mig == []
    assert any("insufficient permissions" in n for n in inv.notes)


def test_hardware_records_store_round_trip(store):
    inv = hw.discover(backend=FakeNvml.from_file(FAKE))
    ids = [store.add_hardware(h) for h in inv.hardware]
    assert len(set(ids)) == len(inv.hardware)
    assert [store.add_hardware(h) for h in inv.hardware] == ids  # identical rows are reused
