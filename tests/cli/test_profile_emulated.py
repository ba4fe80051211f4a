"""MPS-emulated MIG slices through the CLI (issue 22): `profile --gpus --emulate-mig` against
the fake NVML and a fake MPS control program, the label wherever figures are shown,
`profile compare-emulated`, export/import round trips and `plan mig` on emulated rows."""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from greenctl.data.records import Profile, Variant

HERE = Path(__file__).resolve().parent
FAKE_NVML = HERE.parent / "profiler" / "fake_a100.json"
FAKE_CONTROL = HERE.parent / "profiler" / "fake_mps_control.sh"
H100 = "NVIDIA H100 80GB HBM3"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _wide_tables(monkeypatch):
    from greenctl.cli import common

    monkeypatch.setattr(common.console, "width", 300)
    monkeypatch.setattr(common.err_console, "width", 300)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """The fake NVML's H100 (MIG mode off) alone, and the fake MPS control program."""
    desc = json.loads(FAKE_NVML.read_text())
    desc["gpus"] = desc["gpus"][1:]
    nvml = tmp_path / "fake_h100.json"
    nvml.write_text(json.dumps(desc))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(nvml))
    prog = tmp_path / "nvidia-cuda-mps-control"
    prog.write_text(FAKE_CONTROL.read_text())
    prog.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", str(prog))
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr("greenctl.profiler.hw.MPS_DEFAULT_PIPE", str(tmp_path / "no-mps"))
    yield log
    from greenctl.profiler.mps import processes_with_pipe

    for line in log.read_text().splitlines():
        if line.startswith("start pipe="):
            pipe = line.split()[1].removeprefix("pipe=")
            for pid in processes_with_pipe(pipe):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(os.path.dirname(pipe), ignore_errors=True)


@pytest.fixture
def no_gpu_children(monkeypatch):
    """Child runs on the CPU (this machine has no GPU); returns the environments they got."""
    from greenctl.profiler import harness

    real = harness.run_child
    envs: list[dict] = []

    def on_cpu(item, spec, **kw):
        measurements, doc = real(replace(item, device="cpu"), {**spec, "device": "cpu"}, **kw)
        envs.append(doc["env"])
        return measurements, doc

    monkeypatch.setattr(harness, "run_child", on_cpu)
    return envs


def test_profile_emulate_mig_measures_labels_and_lists(cli, store, fake_gpu, no_gpu_children):
    r = cli(
        "profile", "--variant", "tiny-s", "--gpus", "--emulate-mig", "--cpus", "none",
        "--batch", "1", "--requests", "2", "--warmup", "0", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    emulated = [p for p in doc["profiles"] if p["source"] == "mps-emulated"]
    assert sorted(p["resource"] for p in emulated) == [
        "mig:1g.10gb",
        "mig:1g.20gb",
        "mig:2g.20gb",
        "mig:3g.40gb",
        "mig:4g.40gb",
        "mig:7g.80gb",
    ]
    assert {p["hardware"] for p in emulated} == {H100}
    # energy: the slice's share of the GPU's (the 7g slice is all of it: plain nvml)
    assert {p["energy_method"] for p in emulated if p["resource"] != "mig:7g.80gb"} == {
        "nvml-attributed"
    }
    pcts = [e.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for e in no_gpu_children]
    assert pcts == ["14", "29", "43", "57", "100", None]  # then the whole GPU, without MPS
    assert len({e["CUDA_MPS_PIPE_DIRECTORY"] for e in no_gpu_children[:5]}) == 1
    calls = [line.split()[0] for line in fake_gpu.read_text().splitlines()]
    assert calls.count("start") == 1 and calls[-1] == "cmd=quit"
    assert any("stopped the control daemon" in n for n in doc["notes"])
    # the label wherever the figures are shown
    listed = cli("profile", "list")
    assert listed.exit_code == 0
    assert "source" in listed.stdout and "mps-emulated" in listed.stdout
    assert "MIG slices emulated" in listed.stdout  # the caption says what the rows are
    shown = cli("profile", "show", "tiny-s")
    assert "mps-emulated" in shown.stdout and "not measured on MIG" in shown.stdout
    assert not any(p["resource"].startswith("cpu:") for p in doc["profiles"])  # --cpus none
    # rows without estimates keep their table
    whole = cli("profile", "list", "--resource", "gpu:H100-80GB-HBM3")
    assert "H100" in whole.stdout
    assert "mps-emulated" not in whole.stdout and "MIG slices emulated" not in whole.stdout


def test_emulate_mig_refusals(cli, store, fake_gpu, monkeypatch, tmp_path):
    r = cli("profile", "--variant", "tiny-s", "--emulate-mig")
    assert r.exit_code == 2 and "--emulate-mig needs --gpus" in r.output
    r = cli("profile", "--variant", "tiny-s", "--cpus", "none")
    assert r.exit_code == 2 and "nothing to measure" in r.output
    monkeypatch.delenv("GREENCTL_MPS_CONTROL")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = cli("profile", "--variant", "tiny-s", "--gpus", "--emulate-mig", "--requests", "2")
    assert r.exit_code == 2
    assert "nvidia-cuda-mps-control" in r.output and "GREENCTL_MPS_CONTROL" in r.output
    assert store.profile_count() == 0  # refused before anything was measured
    r = cli("profile", "--emulate-mig", "list")
    assert r.exit_code == 2 and "option of measuring" in r.output


# -- stored rows -----------------------------------------------------------------------------------
def _row(resource: str, p50: float, *, source: str = "measured", batch: int = 1, **kw) -> Profile:
    return Profile(
        variant="r50",
        resource=resource,
        batch=batch,
        throughput_rps=1000.0 * batch / p50,
        latency_p50_ms=p50,
        latency_p95_ms=p50 * 1.1,
        latency_p99_ms=p50 * 1.2,
        hardware=H100,
        power_w=100.0,
        idle_power_w=20.0,
        energy_j=p50 / 10,
        energy_method="nvml-attributed" if source == "mps-emulated" else "nvml",
        source=source,
        **kw,
    )


@pytest.fixture
def emulated_store(store):
    store.upsert_variant(Variant("r50", "rn", accuracy=0.76, memory_mb=100.0))
    store.add_profiles(
        [
            _row("mig:1g.10gb", 8.0, source="mps-emulated"),
            _row("mig:1g.20gb", 8.0, source="mps-emulated"),
            _row("mig:7g.80gb", 2.2, source="mps-emulated"),
            _row("gpu:H100-80GB-HBM3", 2.0),
            _row("mps:25", 6.0),
            _row("mps:100", 2.1),
            # a real MIG instance of the same GPU model, measured earlier on another machine
            _row("mig:1g.10gb", 10.0, created_at="2026-01-01T00:00:00Z"),
        ]
    )
    return store


def test_compare_emulated_json_and_table(cli, emulated_store):
    r = cli("profile", "compare-emulated", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {row["resource"]: row for row in doc["rows"]}
    assert list(rows) == ["mig:1g.10gb", "mig:1g.20gb", "mig:7g.80gb"]
    one = rows["mig:1g.10gb"]
    assert one["mps_percentage"] == 14 and one["compute_slices"] == 1
    assert one["whole_gpu"]["p50_ratio"] == pytest.approx(4.0)
    assert one["mps"]["resource"] == "mps:25"  # nearest to 14 %
    assert one["mps"]["p50_ratio"] == pytest.approx(8.0 / 6.0)
    assert one["mig"]["resource"] == "mig:1g.10gb" and one["mig"]["p50_ratio"] == pytest.approx(0.8)
    assert one["mig"]["throughput_ratio"] == pytest.approx(1.25)
    assert rows["mig:1g.20gb"]["mig"] is None  # no real 1g.20gb instance
    full = rows["mig:7g.80gb"]
    assert full["whole_gpu"]["p50_ratio"] == pytest.approx(1.1)
    assert full["mps"]["resource"] == "mps:100"
    summary = doc["summary"]
    assert summary["whole-gpu (full slice)"]["pairs"] == 1
    assert summary["whole-gpu (full slice)"]["p50_ratio"]["median"] == pytest.approx(1.1)
    assert summary["mig"]["pairs"] == 1 and summary["mps"]["pairs"] == 3
    # the table, and the family filter handed down from `profile --model`
    r = cli("profile", "--model", "rn", "compare-emulated")
    assert r.exit_code == 0, r.output
    assert "mig:7g.80gb" in r.stdout and "mps:25" in r.stdout and "Summary" in r.stdout
    assert "whole-gpu (full slice)" in r.stdout


def test_compare_emulated_without_emulated_rows(cli, store):
    store.upsert_variant(Variant("r50", "rn", accuracy=0.76))
    store.add_profiles([_row("gpu:H100-80GB-HBM3", 2.0)])
    r = cli("profile", "compare-emulated")
    assert r.exit_code == 2 and "no MPS-emulated profiles" in r.output
    assert "--emulate-mig" in r.output


def test_export_import_keeps_the_source(cli, emulated_store, tmp_path):
    for fmt in ("csv", "json"):
        out = tmp_path / f"p.{fmt}"
        r = cli("profile", "export", "--format", fmt, "-o", str(out), "--all")
        assert r.exit_code == 0, r.output
        other = tmp_path / f"other-{fmt}.db"
        r = cli("--db", str(other), "profile", "import", str(out), "--json")
        assert r.exit_code == 0, r.output
        from greenctl.data.store import open_store

        s2 = open_store(other)
        try:
            sources = sorted(
                (r["resource"], r["source"])
                for r in s2.db.query("select resource, source from profiles")
            )
        finally:
            s2.close()
        assert ("mig:1g.10gb", "measured") in sources
        assert ("mig:1g.10gb", "mps-emulated") in sources
        assert ("mig:7g.80gb", "mps-emulated") in sources
    bad = tmp_path / "bad.csv"
    bad.write_text(
        "variant,model,resource,batch,throughput_rps,latency_ms,source\nv,m,cpu:1,1,2,3,guessed\n"
    )
    r = cli("profile", "import", str(bad))
    assert r.exit_code == 2 and "unknown source 'guessed'" in r.output
    assert "mps-emulated" in r.output  # the hint lists the known ones


def test_plan_mig_on_emulated_rows_carries_the_label(cli, store):
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.core.synthetic import synthetic_family

    variants, profiles = synthetic_family(resolve_gpu("H100-80GB"), "efficientnet")
    with store.transaction():
        for v in variants:
            store.upsert_variant(replace(v, source="builtin"))
        store.add_profiles(
            [replace(p, source="mps-emulated", energy_method="nvml-attributed") for p in profiles]
        )
    base = ["plan", "mig", "--gpu", H100, "--gpus", "2", "--model", "efficientnet",
            "--rate", "60", "--carbon-intensity", "250"]  # fmt: skip
    r = cli(*base, "--json")
    assert r.exit_code == 0, r.output
    plan = json.loads(r.stdout)
    assert plan["model"]["label"] == "mps-emulated profiles"
    assert plan["predicted"]["source"] == "mps-emulated"
    r = cli(*base)
    assert r.exit_code == 0, r.output
    assert "MPS-EMULATED PROFILES" in r.stdout and "SYNTHETIC" not in r.stdout
