"""``greenctl hw``: CPUs always, GPUs/MIG through the device layer (fake NVML here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FAKE = Path(__file__).resolve().parent.parent / "profiler" / "fake_a100.json"


def test_hw_without_nvidia_driver_lists_cpus_and_says_so(cli, monkeypatch):
    from greenctl.profiler import hw

    monkeypatch.delenv("GREENCTL_FAKE_NVML", raising=False)
    monkeypatch.setattr(hw, "get_backend", lambda: None)
    monkeypatch.setattr(hw, "no_gpu_reason", lambda: "the NVML library was not found")
    r = cli("hw")
    assert r.exit_code == 0, r.output
    assert "CPUs on" in r.output and "RAPL" in r.output
    assert "no NVIDIA GPU found" in r.output


def test_hw_with_fake_gpus_shows_mig_instances_and_uuids(cli, monkeypatch):
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE))
    r = cli("hw")
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "NVIDIA GPUs" in text and "MIG instances" in text
    for profile in ("3g.20gb", "2g.10gb", "1g.5gb"):
        assert profile in text


def test_hw_json_in_a_subprocess_uses_the_fake(tmp_path):
    env = {**os.environ, "GREENCTL_FAKE_NVML": str(FAKE), "GREENCTL_DB": str(tmp_path / "x.db")}
    out = subprocess.run(
        [sys.executable, "-c", "from greenctl.cli.main import main; main()", "hw", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["cpu"]["kind"] == "cpu" and doc["cpu"]["logical_cores"] >= 1
    assert [g["model_name"] for g in doc["gpus"]] == [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA H100 80GB HBM3",
    ]
    mig = {m["uuid"]: m for m in doc["mig"]}
    three = mig["MIG-aaaaaaaa-0000-0000-0000-000000000001"]
    assert three["mig_profile"] == "3g.20gb" and three["placement_start"] == 4
    assert abs(three["compute_share"] - 3 / 7) < 1e-9
    assert doc["notes"] == []


def test_hw_with_broken_nvml_is_a_clear_error(cli, monkeypatch, tmp_path):
    desc = json.loads(FAKE.read_text())
    desc["errors"] = {"init": "no_permission"}
    path = tmp_path / "denied.json"
    path.write_text(json.dumps(desc))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(path))
    r = cli("hw")
    assert r.exit_code == 1
    assert "Error: NVML failed while initialising NVML: insufficient permissions" in r.output
