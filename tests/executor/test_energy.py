"""Energy and carbon while serving (issue 19): executors' counters against the fake NVML, the
RAPL counter on a fake powercap tree, the modeled source, and what apply hands executors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from greenctl.executor.runtime.metrics import carbon_g

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(120)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"
FAKE_POWER_W = 200.0


def _fake_nvml(tmp_path: Path, *, mig: bool = False, instances=None) -> Path:
    path = tmp_path / "fake_nvml.json"
    gpu = {
        "name": "NVIDIA A100-SXM4-40GB",
        "uuid": GPU_UUID,
        "memory_mb": 40960,
        "mig": mig,
        "power_w": FAKE_POWER_W,
        "energy_mj": 5_000_000,
        "instances": instances or [],
    }
    path.write_text(json.dumps({"gpus": [gpu]}))
    return path


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """Start an executor daemon (no-op model) and wait until it is ready; returns its state."""
    state = tmp_path / f"state-{len(list(tmp_path.glob('state-*')))}.json"
    cmd = [
        sys.executable,
        "-m",
        "greenctl.executor.runtime.daemon",
        "--model",
        "m",
        "--variant",
        "v",
    ]
    cmd += ["--loader", NOOP, "--input-shape", "4", "--state-file", str(state), *args]
    full_env = {**os.environ, "GREENCTL_NOOP_SERVICE_MS": "2", **(env or {})}
    proc = subprocess.Popen(
        cmd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if state.exists():
            doc = json.loads(state.read_text())
            doc["proc"] = proc
            if "error" in doc:
                proc.kill()
                raise AssertionError(doc["error"])
            return doc
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read() if proc.stderr else "daemon exited")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("daemon not ready")


@pytest.fixture
def daemons():
    started: list[dict] = []

    def start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> dict:
        doc = _start(tmp_path, *args, env=env)
        started.append(doc)
        return doc

    yield start
    for doc in started:
        doc["proc"].terminate()
        try:
            doc["proc"].wait(5)
        except subprocess.TimeoutExpired:
            doc["proc"].kill()


def _series(url: str) -> dict[str, float]:
    import urllib.request

    from greenctl.executor.runtime.metrics import parse_prometheus

    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return parse_prometheus(r.read().decode())


def _one(flat: dict[str, float], name: str) -> tuple[str, float]:
    hits = [(k, v) for k, v in flat.items() if k.startswith(name + "{")]
    assert len(hits) == 1, (name, hits)
    return hits[0]


def test_counters_after_a_measured_run_match_energy_times_requests(tmp_path, daemons):
    """The profiler's NVML meter measures energy per request over a load; the executor's
    counter over the same window matches it times the requests served (within 5 %)."""
    from greenctl.executor.runtime.loadgen import run_load
    from greenctl.profiler.energy import NvmlEnergyMeter
    from greenctl.profiler.fake_nvml import FakeNvml

    fake = _fake_nvml(tmp_path)
    doc = daemons(
        tmp_path,
        "--resource",
        "gpu:A100-SXM4-40GB",
        "--carbon-intensity",
        "400",
        "--pue",
        "1.2",
        env={"GREENCTL_FAKE_NVML": str(fake), "CUDA_VISIBLE_DEVICES": GPU_UUID},
    )
    assert doc["energy"]["source"] == "nvml"
    url = doc["url"]
    meter = NvmlEnergyMeter(FakeNvml.from_file(fake), 0)
    before = _series(url)
    meter.start()
    res = run_load(url, "m", duration_s=1.5, rate_rps=80, seed=1)
    after = _series(url)
    reading = meter.stop(requests=res.ok)
    assert res.ok > 50 and res.errors == 0
    key, e1 = _one(after, "greenctl_energy_joules_total")
    e0 = before[key]
    assert 'source="nvml"' in key and 'resource="gpu:A100-SXM4-40GB"' in key
    expected = reading.energy_j_per_request * res.ok
    print(f"counter / (energy per request x requests) = {(e1 - e0) / expected:.4f}")
    assert (e1 - e0) / expected == pytest.approx(1.0, rel=0.05)
    _, c1 = _one(after, "greenctl_carbon_grams_total")
    assert c1 == pytest.approx(carbon_g(e1, 400, 1.2), rel=1e-6)
    _, power = _one(after, "greenctl_power_watts")
    assert power == pytest.approx(FAKE_POWER_W, rel=0.05)
    _, intensity = _one(after, "greenctl_grid_intensity_grams_per_kwh")
    assert intensity == 400


def test_mig_instance_is_attributed_its_compute_share(tmp_path, daemons):
    fake = _fake_nvml(
        tmp_path,
        mig=True,
        instances=[{"profile": "3g.20gb", "start": 4, "compute": [3], "uuids": ["MIG-aaaa"]}],
    )
    doc = daemons(
        tmp_path,
        "--resource",
        "mig:3g.20gb",
        env={"GREENCTL_FAKE_NVML": str(fake), "CUDA_VISIBLE_DEVICES": "MIG-aaaa"},
    )
    assert doc["energy"]["source"] == "nvml-attributed"
    time.sleep(1.3)
    flat = _series(doc["url"])
    key, _ = _one(flat, "greenctl_energy_joules_total")
    assert 'source="nvml-attributed"' in key
    _, power = _one(flat, "greenctl_power_watts")
    assert power == pytest.approx(FAKE_POWER_W * 3 / 7, rel=0.05)
    # no intensity given: no carbon series, and a line that says why (never a silent zero)
    assert not any(k.startswith("greenctl_carbon_grams_total") for k in flat)


def test_modeled_source_fromprofile_figures(tmp_path, daemons):
    from greenctl.executor.runtime.loadgen import run_load

    doc = daemons(
        tmp_path,
        "--resource",
        "cpu:1",
        "--energy-source",
        "modeled",
        "--energy-j-per-request",
        "0.5",
        "--idle-power-w",
        "0",
        "--carbon-intensity",
        "100",
    )
    assert doc["energy"]["source"] == "modeled"
    res = run_load(doc["url"], "m", duration_s=1.0, rate_rps=40, seed=2)
    flat = _series(doc["url"])
    key, joules = _one(flat, "greenctl_energy_joules_total")
    assert 'source="modeled"' in key
    warm = 0  # warm-up runs before the counter starts
    assert joules == pytest.approx(0.5 * (res.ok + warm), rel=1e-6)


def test_gpu_without_nvml_or_figures_says_why(tmp_path, daemons):
    fake = tmp_path / "none.json"
    fake.write_text(json.dumps({"errors": {"init": "driver_not_loaded"}}))
    doc = daemons(
        tmp_path,
        "--resource",
        "gpu:A100-SXM4-40GB",
        env={"GREENCTL_FAKE_NVML": str(fake), "CUDA_VISIBLE_DEVICES": "0"},
    )
    assert doc["energy"]["source"] is None
    import urllib.request

    with urllib.request.urlopen(doc["url"] + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "greenctl_energy_joules_total{" not in text
    assert "# greenctl: no energy series:" in text


# -- RAPL on a fake powercap tree ---------------------------------------------------------------
def _rapl_tree(tmp_path: Path, values: list[int], max_range: int) -> list[Path]:
    files = []
    for i, v in enumerate(values):
        d = tmp_path / f"intel-rapl:{i}"
        d.mkdir()
        (d / "energy_uj").write_text(f"{v}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
        files.append(d / "energy_uj")
    return files


def test_rapl_counter_sums_packages_attributes_share_and_wraps(tmp_path):
    from greenctl.profiler.energy import RaplCounter, serving_counter

    files = _rapl_tree(tmp_path, [1_000_000, 50_000_000], max_range=100_000_000)
    counter, notes = serving_counter(
        "cpu:2",
        cores=2,
        env={},
        busy_s=lambda: 0.0,
        requests=lambda: 0,
        rapl=[str(f) for f in files],
        total_cores=8,
    )
    assert isinstance(counter, RaplCounter) and counter.source == "rapl" and not notes
    assert counter.joules() == 0.0
    files[0].write_text("5000000\n")  # +4 J
    files[1].write_text("58000000\n")  # +8 J
    assert counter.joules() == pytest.approx((4 + 8) * 2 / 8)
    files[1].write_text("2000000\n")  # wrapped: 58e6 -> 100e6 (+42 J), +1 uJ, -> 2e6 (+2 J)
    assert counter.joules() == pytest.approx((4 + 8 + 42.000001 + 2) * 2 / 8)


def test_no_rapl_on_cpu_falls_back_to_the_cpu_power_model(tmp_path):
    from greenctl.profiler.energy import ModeledCounter, serving_counter

    busy = {"s": 0.0}
    counter, notes = serving_counter(
        "cpu:2", cores=2, env={}, busy_s=lambda: busy["s"], requests=lambda: 0, rapl=[]
    )
    assert isinstance(counter, ModeledCounter) and counter.source == "modeled"
    assert any("RAPL" in n for n in notes) and any("modeled" in n for n in notes)
    assert counter.busy_w == pytest.approx(20.0) and counter.idle_w == pytest.approx(6.0)


def test_apply_passes_the_plans_intensity_pue_and_the_stored_profiles_figures(store):
    from greenctl.data.emissions import executor_energy_args
    from greenctl.data.plan import Plan
    from greenctl.data.records import Profile, Variant

    plan = Plan(kind="mix", request={"carbon_intensity": 250.0, "pue": 1.3})
    store.upsert_variant(Variant(name="tiny-s", family="tiny"))
    store.add_profiles(
        [
            Profile("tiny-s", "cpu:2", 1, 100.0, power_w=12.0, idle_power_w=6.0, energy_j=0.12),
            Profile("tiny-s", "cpu:2", 4, 300.0, power_w=18.0, energy_j=0.06),
        ]
    )
    args = executor_energy_args(store, plan, variant="tiny-s", resource="cpu:2", batch=3)
    assert args == [
        "--carbon-intensity", "250", "--pue", "1.3",
        "--power-w", "18.0", "--energy-j-per-request", "0.06",
    ]  # fmt: skip
    bare = executor_energy_args(store, Plan(kind="mix"), variant="x", resource="cpu:1", batch=1)
    assert bare == []


def test_apply_verify_records_the_executors_energy(run_store, cli, tmp_path):
    """A real tiny executor started by apply counts carbon at the plan's intensity and PUE;
    apply --verify records the counters' energy, which report emissions writes."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.deploy.apply import apply_plan, status

    plan = Plan(
        kind="mix",
        request={"carbon_intensity": 400.0, "pue": 1.1},
        deployments=[Deployment("tiny", "tiny-s", "cpu:1", 1, 1, 20.0)],
        predicted={"rate_rps": 20.0, "p95_ms": 20.0, "energy_j_per_request": 0.3},
    )
    run_store.save_plan(plan)
    result = apply_plan(plan, store=run_store, verify=True, verify_duration_s=1.0)
    energy = result.verify["measured"]["energy"]
    assert energy["instances"] == 1 and energy["sources"] in (["modeled"], ["rapl"])
    assert energy["cpu_j"] > 0 and energy["gpu_j"] == 0
    inst = status(run_store)["instances"][0]
    flat = _series(inst["url"])
    _, joules = _one(flat, "greenctl_energy_joules_total")
    _, grams = _one(flat, "greenctl_carbon_grams_total")
    assert grams == pytest.approx(carbon_g(joules, 400, 1.1), rel=1e-3)
    out = tmp_path / "emissions.csv"
    r = cli("report", "emissions", "-o", out)
    assert r.exit_code == 0, r.output
    row = out.read_text().splitlines()[1].split(",")
    assert row[30] == ("modeled" if energy["sources"] == ["modeled"] else "machine")
