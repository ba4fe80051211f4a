"""``greenctl profile`` (measuring): real CPU runs of the tiny family, flags, errors, GPUs."""

from __future__ import annotations

import json
from pathlib import Path

FAKE = Path(__file__).resolve().parent.parent / "profiler" / "fake_a100.json"


def test_profile_alone_measures_the_tiny_family_on_one_core(cli, store):
    # the defaults (tiny family, cpu:1); kept short with --requests/--batch
    r = cli("profile", "--requests", "3", "--batch", "1", "--warmup", "0")
    assert r.exit_code == 0, r.output
    assert "stored" in r.output and "modeled" in r.output
    rows = store.latest_profiles()
    assert sorted((p.variant, p.resource, p.batch) for p in rows) == [
        ("tiny-l", "cpu:1", 1),
        ("tiny-m", "cpu:1", 1),
        ("tiny-s", "cpu:1", 1),
    ]
    listed = cli("profile", "list", "--json")
    assert {p["variant"] for p in json.loads(listed.stdout)} == {"tiny-s", "tiny-m", "tiny-l"}


def test_profile_json_and_repeated_runs_are_kept(cli, store):
    args = ("profile", "--variant", "tiny-s", "--batch", "1,2", "--requests", "4", "--json")
    first = cli(*args)
    assert first.exit_code == 0, first.output
    doc = json.loads(first.stdout)
    assert [(p["variant"], p["batch"]) for p in doc["profiles"]] == [("tiny-s", 1), ("tiny-s", 2)]
    assert all(p["energy_method"] in ("modeled", "rapl") for p in doc["profiles"])
    assert doc["variants"][0]["accuracy_source"].startswith("illustrative")
    assert cli(*args).exit_code == 0
    assert store.profile_count() == 4  # both runs kept
    assert len(store.latest_profiles(variant="tiny-s")) == 2  # list shows the latest


def test_user_model_path(cli, store, tmp_path, monkeypatch):
    (tmp_path / "usermod_cli.py").write_text(
        "from torch import nn\n\ndef build():\n    return nn.Sequential(nn.Flatten(), nn.Linear(12, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    r = cli(
        "profile",
        "--model-path",
        "usermod_cli:build",
        "--input-shape",
        "3,2,2",
        "--accuracy",
        "0.9",
        "--name",
        "mine",
        "--model",
        "toys",
        "--requests",
        "3",
        "--batch",
        "1",
    )
    assert r.exit_code == 0, r.output
    v = store.get_variant("mine")
    assert (v.family, v.accuracy, v.source, v.params) == (
        "toys",
        0.9,
        "module:usermod_cli:build",
        26,
    )
    assert [p.resource for p in store.latest_profiles(variant="mine")] == ["cpu:1"]


def test_bad_flags_are_input_errors_and_store_untouched(cli, store):
    cases = [
        (("--cpus", "0"), "--cpus: '0' is not a whole number"),
        (("--cpus", "64"), "this process may use"),
        (("--batch", "x"), "--batch: 'x'"),
        (("--duration", "1", "--requests", "3"), "either --duration or --requests"),
        (("--requests", "0"), "--requests 0"),
        (("--variant", "resnet9"), "unknown variant 'resnet9'"),
        (("--model", "nosuch"), "no such family"),
        (("--accuracy", "0.5"), "--accuracy only applies to --model-path"),
        (("--model-path", "nosuchmod:f", "--input-shape", "3"), "cannot import module"),
        (("--model-path", "x:y"), "--input-shape is required"),
        (("--mps", "150"), "between 1 and 100"),
    ]
    for args, message in cases:
        r = cli("profile", *args)
        assert r.exit_code == 2, (args, r.output)
        assert message in " ".join(r.output.split()), (args, r.output)
    assert store.profile_count() == 0 and store.variants() == []


def test_gpus_without_a_gpu_is_an_input_error(cli, store, monkeypatch):
    from greenctl.profiler import hw

    monkeypatch.delenv("GREENCTL_FAKE_NVML", raising=False)
    monkeypatch.setattr(hw, "get_backend", lambda: None)
    r = cli("profile", "--variant", "tiny-s", "--gpus", "--requests", "1")
    assert r.exit_code == 2
    assert "--gpus: no NVIDIA GPU found" in r.output and "drop --gpus" in r.output


def test_gpu_child_failure_leaves_store_as_it_was(cli, store, monkeypatch):
    """With fake GPUs but a CPU-only torch, the whole-GPU child run fails: exit 1, and the CPU
    points measured before it are not stored either (one transaction at the end)."""
    import torch

    if torch.cuda.is_available():
        return
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(FAKE))
    r = cli("profile", "--variant", "tiny-s", "--gpus", "--requests", "1", "--batch", "1")
    assert r.exit_code == 1
    assert "failed in its child process" in " ".join(r.output.split())
    assert store.profile_count() == 0
