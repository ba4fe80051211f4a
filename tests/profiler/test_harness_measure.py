"""The harness: planning (CPU, whole GPU, per-MIG-instance child runs, MPS), CPU slices,
real CPU measurement of the tiny family, child processes, one-transaction storage."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from greenctl.data.errors import InputError
from greenctl.profiler import harness, hw
from greenctl.profiler.fake_nvml import FakeNvml
from greenctl.profiler.harness import (
    cpu_slice,
    measure,
    percentile,
    plan_runs,
    profile,
    run_child,
)
from greenctl.profiler.models import builtin_variant, builtin_variants, load_model

FAKE = Path(__file__).with_name("fake_a100.json")
CORES = len(os.sched_getaffinity(0))


@pytest.fixture
def gpu_inventory():
    return hw.discover(backend=FakeNvml.from_file(FAKE))


def test_percentile_interpolates():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == 2.5
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)


def test_plan_cpu_points_in_process():
    inv = hw.discover(backend=None)
    items = plan_runs(inv, builtin_variants("tiny"), cpus=[1], batches=[1, 4])
    assert [(i.variant.name, i.resource, i.in_child) for i in items] == [
        ("tiny-s", "cpu:1", False),
        ("tiny-m", "cpu:1", False),
        ("tiny-l", "cpu:1", False),
    ]
    assert all(i.batches == [1, 4] and i.cores == 1 and i.meter["kind"] == "cpu" for i in items)
    with pytest.raises(InputError, match=f"may use {CORES} core"):
        plan_runs(inv, builtin_variants("tiny"), cpus=[CORES + 1])
    with pytest.raises(InputError, match="no NVIDIA GPU"):
        plan_runs(inv, builtin_variants("tiny"), gpus=True)


def test_plan_gpu_mig_child_runs(gpu_inventory):
    v = builtin_variant("resnet50")
    items = plan_runs(gpu_inventory, [v], cpus=[1], gpus=True, batches=[1, 8])
    by_res = {i.resource: i for i in items}
    # GPU 0 is in MIG mode: no whole-GPU run, one child per distinct MIG profile
    assert set(by_res) == {
        "cpu:1",
        "gpu:H100-80GB-HBM3",
        "mig:2g.10gb",
        "mig:1g.5gb",
        "mig:3g.20gb",
    }
    whole = by_res["gpu:H100-80GB-HBM3"]
    assert whole.in_child and whole.device == "cuda:0"
    assert whole.env["CUDA_VISIBLE_DEVICES"] == "GPU-99999999-8888-7777-6666-555555555555"
    assert whole.meter == {"kind": "nvml", "gpu_index": 1, "share": 1.0}
    mig = by_res["mig:3g.20gb"]
    assert mig.env["CUDA_VISIBLE_DEVICES"] == "MIG-aaaaaaaa-0000-0000-0000-000000000001"
    assert mig.meter == {"kind": "nvml", "gpu_index": 0, "share": pytest.approx(3 / 7)}
    assert mig.hardware.kind == "mig" and mig.hardware.mig_profile == "3g.20gb"
    assert by_res["mig:1g.5gb"].meter["share"] == pytest.approx(1 / 7)
    assert all(
        i.env["CUDA_VISIBLE_DEVICES"].startswith("MIG-") for i in items if i.hardware.kind == "mig"
    )
    assert not any(i.resource.startswith("mps:") for i in items)  # no MPS daemon


def test_plan_mps_shares_when_a_daemon_runs(gpu_inventory, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    gpu_inventory.mps_pipe = str(tmp_path / "control")
    items = plan_runs(gpu_inventory, [builtin_variant("tiny-s")], cpus=[], gpus=True, mps=[30, 100])
    mps = [i for i in items if i.resource.startswith("mps:")]
    assert [i.resource for i in mps] == ["mps:30", "mps:100"]
    assert mps[0].env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert mps[0].env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)
    assert mps[0].meter["share"] == 0.3 and mps[0].hardware.compute_share == 0.3
    assert mps[0].hardware.kind == "mps" and mps[0].hardware.device_index == 1


def test_cpu_slice_sets_threads_and_affinity_and_restores():
    import torch

    before_threads, before_mask = torch.get_num_threads(), os.sched_getaffinity(0)
    with cpu_slice(1) as used:
        assert torch.get_num_threads() == 1
        assert os.sched_getaffinity(0) == set(used) and len(used) == 1
    assert torch.get_num_threads() == before_threads
    assert os.sched_getaffinity(0) == before_mask
    with pytest.raises(InputError, match="cores"), cpu_slice(CORES + 1):
        pass


def test_measure_tiny_on_one_core():
    m = load_model(builtin_variant("tiny-s"))
    seen = []
    with cpu_slice(1):
        r = measure(m, batch=4, requests=20, warmup=1, progress=lambda s, f: seen.append(f))
    assert len(r.latencies_ms) == 5 and r.requests == 20  # ceil(20 / 4) batches
    assert all(x > 0 for x in r.latencies_ms)
    assert r.duration_s >= sum(r.latencies_ms) / 1000 * 0.99
    assert seen[-1] == 1.0
    p = r.to_profile("tiny-s", "cpu:1", None)
    assert p.latency_p50_ms <= p.latency_p95_ms <= p.latency_p99_ms
    assert p.throughput_rps == pytest.approx(20 / (sum(r.latencies_ms) / 1000))
    assert p.samples == 5 and p.memory_mb is not None and p.memory_mb >= 0
    short = measure(m, batch=8, requests=1, warmup=0)
    assert len(short.latencies_ms) == harness.MIN_BATCHES


def test_measure_records_isolated_runs_after_idle_gaps(monkeypatch):
    m = load_model(builtin_variant("tiny-s"))
    gaps = []
    monkeypatch.setattr(harness.time, "sleep", lambda s: gaps.append(s))
    r = measure(m, batch=1, requests=5, warmup=0, isolated=7)
    assert len(r.isolated_ms) == 7 and all(x > 0 for x in r.isolated_ms)
    assert gaps == [harness.ISOLATED_GAP_S] * 7  # one idle gap before every isolated run
    p = r.to_profile("tiny-s", "cpu:1", None)
    assert p.isolated_p50_ms <= p.isolated_p95_ms <= p.isolated_p99_ms
    assert p.isolated_p50_ms == pytest.approx(percentile(r.isolated_ms, 50))
    back = harness.measurement_from_dict(harness.measurement_to_dict(r))
    assert back.isolated_ms == r.isolated_ms  # survives the child-process round trip
    none = measure(m, batch=1, requests=5, warmup=0, isolated=0)
    assert (
        none.isolated_ms == [] and none.to_profile("tiny-s", "cpu:1", None).isolated_p50_ms is None
    )


def test_gpu_warm_up_lasts_its_minimum_time():
    """Three warm-up runs left resnet50 (batch 1, H100) at 6.2 ms p50 against 3.6-3.9 ms
    warm: on a GPU the warm-up also lasts GPU_WARMUP_S."""

    class Model:
        def __init__(self) -> None:
            self.t = 0.0
            self.runs = 0

        def run(self, x: object) -> None:
            self.runs += 1
            self.t += 0.1

    m = Model()
    assert harness.warm_up(m, None, runs=3, clock=lambda: m.t) == 3  # CPU: the count
    m = Model()
    assert harness.warm_up(m, None, runs=3, min_s=2.0, clock=lambda: m.t) == 20
    m = Model()
    assert harness.warm_up(m, None, runs=50, min_s=2.0, clock=lambda: m.t) == 50
    assert harness.GPU_WARMUP_S >= 1.5  # covers the 1.2 s slow start seen on the H100


def test_gpu_idle_power_is_read_with_the_model_loaded_and_settled(monkeypatch):
    """Read before the model was loaded, the idle power was whatever the previous variant
    left (70, 133 and 159 W for three variants on one H100)."""
    from greenctl.profiler import models
    from greenctl.profiler.energy import EnergyReading

    events: list[str] = []
    real_load = models.load_model

    def load(variant, *, device="cpu"):
        events.append("load")
        return real_load(variant, device=device)

    class Meter:
        method = "nvml"

        def settle_idle(self) -> float:
            events.append("settle")
            return 123.0

        def start(self) -> None:
            events.append("start")

        def stop(self, *, requests: int) -> EnergyReading:
            return EnergyReading("nvml", 200.0, 123.0, 1.0, 1.0)

    monkeypatch.setattr(models, "load_model", load)
    monkeypatch.setattr(harness, "make_meter", lambda spec: (Meter(), lambda: None))
    spec = {
        "variant": {"name": "tiny-s", "family": "tiny", "input_shape": "3,32,32"},
        "batches": [1, 2],
        "requests": 4,
        "warmup": 0,
    }
    (a, b), _load_s, _facts = harness.measure_variant(spec)
    assert events == ["load", "settle", "start", "start"]  # once per variant, after loading
    assert a.energy.idle_power_w == 123.0 and b.batch == 2


def test_profile_tiny_family_stores_one_transaction(store):
    result = profile(store, cpus=[1], batches=[1, 2], requests=4, warmup=1)
    rows = store.latest_profiles(family="tiny")
    assert {(p.variant, p.resource, p.batch) for p in rows} == {
        (v, "cpu:1", b) for v in ("tiny-s", "tiny-m", "tiny-l") for b in (1, 2)
    }
    hw_rows = store.hardware()
    assert len(hw_rows) == 1 and hw_rows[0].kind == "cpu"
    for p in rows:
        assert p.hardware_id == hw_rows[0].id and p.source == "measured"
        assert p.energy_method in ("modeled", "rapl") and p.energy_j > 0 and p.power_w > 0
        assert p.torch_version and p.samples >= harness.MIN_BATCHES
    assert store.get_variant("tiny-m").accuracy == 0.68
    assert len(result.profiles) == 6


def test_failed_profile_leaves_the_store_untouched(store, monkeypatch):
    calls = {"n": 0}
    real = harness.measure

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash in the middle")
        return real(*a, **kw)

    monkeypatch.setattr(harness, "measure", flaky)
    with pytest.raises(RuntimeError):
        profile(store, cpus=[1], batches=[1], requests=3, warmup=0)
    assert store.profile_count() == 0 and store.variants() == [] and store.hardware() == []


def test_unknown_variant_names_the_builtins(store):
    with pytest.raises(InputError, match=r"built-in variants: .*resnet101"):
        profile(store, variants=["resnet9"], requests=1)


def test_child_process_run_with_mig_environment_and_attributed_energy(gpu_inventory, monkeypatch):
    """The MIG item as planned, run in a real child process (device swapped to CPU since
    this machine has no GPU; NVML is the fake, shared through GREENCTL_FAKE_NVML)."""
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE))
    items = plan_runs(gpu_inventory, [builtin_variant("tiny-s")], cpus=[], gpus=True, batches=[2])
    item = replace(next(i for i in items if i.resource == "mig:3g.20gb"), device="cpu")
    spec = item.to_spec(duration_s=None, requests=6, warmup=1)
    seen: list[tuple[str, float]] = []
    (m,), doc = run_child(item, spec, timeout_s=300, progress=lambda s, f: seen.append((s, f)))
    assert seen and seen[-1] == ("batch 2", 1.0)  # progress streamed from the child
    assert doc["env"]["CUDA_VISIBLE_DEVICES"] == "MIG-aaaaaaaa-0000-0000-0000-000000000001"
    assert doc["pid"] != os.getpid()
    assert m.batch == 2 and len(m.latencies_ms) == 3
    assert m.energy.method == "nvml-attributed"
    # the fake GPU draws 280 W: the instance is charged 3/7 of it
    assert m.energy.power_w == pytest.approx(280.0 * 3 / 7, rel=0.05)
    assert m.energy.idle_power_w == pytest.approx(280.0 * 3 / 7)  # settled with the model loaded
    p = m.to_profile("tiny-s", item.resource, item.hardware)
    assert p.energy_method == "nvml-attributed" and p.hardware == "NVIDIA A100-SXM4-40GB"


def test_variants_of_one_resource_share_one_child_process(gpu_inventory, monkeypatch):
    """The items of one resource and environment run in one child (one interpreter, torch
    import and CUDA context), each variant's rows returned in order; CPU items stay alone."""
    from greenctl.profiler.harness import group_items, run_items

    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE))
    tiny = [builtin_variant("tiny-s"), builtin_variant("tiny-m")]
    items = plan_runs(gpu_inventory, tiny, cpus=[1], gpus=True, batches=[2])
    groups = group_items(items)
    assert [len(g) for g in groups if not g[0].in_child] == [1, 1]  # cpu:1, each variant alone
    for g in groups:
        assert len({i.resource for i in g}) == 1
    assert any(len(g) == 2 for g in groups if g[0].in_child)
    mig = [replace(i, device="cpu") for i in items if i.resource == "mig:3g.20gb"]
    assert len(mig) == 2 and len(group_items(mig)) == 1
    pids: list[int] = []
    real = harness.run_child

    def spy(*a, **kw):
        out = real(*a, **kw)
        pids.append(out[1]["pid"])
        return out

    monkeypatch.setattr(harness, "run_child", spy)
    result = run_items(mig, duration_s=None, requests=4, warmup=1)
    assert len(pids) == 1  # one child for both variants
    assert [(p.variant, p.resource, p.batch) for p, _ in result.profiles] == [
        ("tiny-s", "mig:3g.20gb", 2),
        ("tiny-m", "mig:3g.20gb", 2),
    ]
    assert all(p.energy_method == "nvml-attributed" for p, _ in result.profiles)


def test_child_timeout_kills_it(gpu_inventory):
    from greenctl.data.errors import HardwareError

    item = plan_runs(gpu_inventory, [builtin_variant("tiny-s")], cpus=[1], batches=[1])[0]
    with pytest.raises(HardwareError, match=r"timed out after 0\.2 s"):
        run_child(item, item.to_spec(duration_s=60, requests=None, warmup=0), timeout_s=0.2)


@pytest.mark.skipif(CORES < 2, reason="needs 2 usable cores")
def test_cpu_slice_of_two_gives_the_model_two_threads_on_two_cores():
    """cpu:2 runs the model on two pinned cores with two torch threads (what makes its p50
    fall: measured side by side with cpu:1 in bench/bench_profile.py, not here)."""
    import torch

    v = replace(builtin_variant("resnet18"), input_shape="3,64,64")
    m = load_model(v)
    with cpu_slice(2) as used:
        assert torch.get_num_threads() == 2
        assert os.sched_getaffinity(0) == set(used) and len(used) == 2
        r = measure(m, batch=2, requests=4, warmup=1)
    assert r.requests >= 4 and r.latencies_ms and all(x > 0 for x in r.latencies_ms)


def test_mig_gpu_without_instances_is_not_profiled_as_a_whole_gpu():
    import json

    desc = json.loads(FAKE.read_text())
    desc["gpus"][0]["instances"] = []
    inv = hw.discover(backend=FakeNvml(desc))
    items = plan_runs(inv, [builtin_variant("tiny-s")], cpus=[], gpus=True)
    assert [i.resource for i in items] == ["gpu:H100-80GB-HBM3"]
    assert any("GPU 0 is in MIG mode without usable instances" in n for n in inv.notes)


def test_busy_machine_note(monkeypatch):
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (9.5, 5.0, 1.0))
    assert "load average 9.5 on 2 usable cores" in harness.busy_note(2)
    monkeypatch.setattr(harness.os, "getloadavg", lambda: (0.5, 0.5, 0.5))
    assert harness.busy_note(2) is None
