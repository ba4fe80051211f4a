"""``greenctl profile`` refuses a run that cannot finish before it measures anything: a batch,
duration, request count or warm-up beyond its documented bound, a batch whose input alone
cannot fit the device's memory, and a fake-NVML file that is not a description. Each is
exit 2 with one ``Error:`` line naming the option (or the file) and the fix, no traceback,
no child process, and the store neither created nor changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from greenctl.data.records import MAX_BATCH

pytestmark = pytest.mark.timeout(120)


def _children() -> set[int]:
    """The processes this test process started that still run."""
    me = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if ppid == me:
                found.add(int(entry.name))
    return found


def _refused(cli, db_path: Path, *args: str) -> str:
    """Run ``greenctl profile ARGS``, check the contract, return the output."""
    before = db_path.read_bytes() if db_path.exists() else None
    children = _children()
    r = cli("profile", *args)
    out = r.output
    assert r.exit_code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in out, out
    assert _children() <= children, out
    assert (db_path.read_bytes() if db_path.exists() else None) == before, out
    assert not Path(f"{db_path}-wal").exists() or before is not None, out
    return out


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--batch", "100000"), f"--batch 100000: batch sizes must be 1 to {MAX_BATCH}"),
        (("--batch", "1,2,99999999999"), "--batch 99999999999"),
        (("--duration", "1e9"), "--duration 1e+09: at most 3600 s per point"),
        (("--duration", "inf"), "--duration inf"),
        (("--requests", "100000000"), "--requests 100000000: must be 1 to 1,000,000"),
        (("--warmup", "5000"), "--warmup 5000: must be 0 to 1000"),
        (("--cpus", "100000"), "--cpus 100000"),
    ],
)
def test_an_absurd_option_is_refused_at_once(cli, db_path, args, says):
    out = _refused(cli, db_path, *args)
    assert says in out and "hint:" in out, out
    assert not db_path.exists()  # a refused run creates no store


def test_a_refusal_leaves_an_existing_store_as_it_was(cli, store, db_path):
    store.close()
    out = _refused(cli, db_path, "--batch", "100000")
    assert "--batch 100000" in out


def test_a_batch_beyond_the_hosts_memory(cli, db_path, monkeypatch):
    from greenctl.profiler import memory

    monkeypatch.setattr(memory, "host_available_mb", lambda: 1000.0)
    out = _refused(cli, db_path, "--model", "resnet", "--batch", "1,2,4096")
    assert "--batch 4096: one batch of resnet" in out, out
    assert "more than the 1,000 MiB this machine has available" in out, out
    assert "use batch sizes up to 1," in out, out


def test_a_batch_beyond_a_gpus_memory(cli, db_path, tmp_path, monkeypatch):
    fake = tmp_path / "small-gpu.json"
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-1", "memory_mb": 2048, "power_w": 100}
    fake.write_text(json.dumps({"gpus": [gpu]}))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))
    args = ("--gpus", "--cpus", "none", "--variant", "resnet50", "--batch", "8,8192")
    out = _refused(cli, db_path, *args)
    assert "--batch 8192: one batch of resnet50 on gpu:" in out, out
    assert "2,048 MiB the device has" in out, out


def test_the_memory_estimate_is_input_times_batch_plus_weights():
    from greenctl.data.records import Variant
    from greenctl.profiler.memory import batch_memory_mb

    v = Variant("v", "f", memory_mb=10.0, input_shape="256,1024")  # 1 MiB of float32
    assert batch_memory_mb(v, 1) == 11.0
    assert batch_memory_mb(v, 100) == 110.0


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (bytes(range(128, 256)) * 8, "is not UTF-8 text"),
        (b"[1, 2]", "a fake NVML description is a JSON object, got list"),
        (b'{"gpus": ["A100"]}', "bad fake NVML description"),
        (b'{"gpus": [{"name": "x", "memory_mb": "lots"}]}', "bad fake NVML description"),
        (b"{not json", "line 1"),
        (b"{}", "needs 'gpus', a list"),
        (b'{"gpus": "x"}', "needs 'gpus', a list"),
    ],
)
def test_a_fake_nvml_file_that_is_not_a_description(cli, db_path, tmp_path, monkeypatch, content,
                                                     says):  # fmt: skip
    fake = tmp_path / "fake-nvml.bin"
    fake.write_bytes(content)
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))
    out = _refused(cli, db_path, "--gpus")
    assert f"Error: {fake}" in out and says in out and "GREENCTL_FAKE_NVML" in out, out
    assert not db_path.exists()
