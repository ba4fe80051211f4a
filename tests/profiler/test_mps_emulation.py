"""MIG slices emulated with MPS shares (issue 22): the percentage rule, the planned items, the
lifetime of the MPS control daemon (a fake `nvidia-cuda-mps-control` that records its calls)
and what lands in the store; never a real GPU or a real MPS daemon."""

from __future__ import annotations

import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from greenctl.data.errors import HardwareError, InputError
from greenctl.data.mig_geometry import emulated_slices, mps_percentage, resolve_gpu
from greenctl.profiler import harness, hw, mps
from greenctl.profiler.fake_nvml import FakeNvml
from greenctl.profiler.harness import Measurement, plan_runs, profile
from greenctl.profiler.models import builtin_variant

HERE = Path(__file__).resolve().parent
FAKE_NVML = HERE / "fake_a100.json"  # GPU 0: A100 in MIG mode; GPU 1: H100, MIG mode off
FAKE_CONTROL = HERE / "fake_mps_control.sh"
H100 = "NVIDIA H100 80GB HBM3"
H100_UUID = "GPU-99999999-8888-7777-6666-555555555555"

# real (fake) daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(300)


# -- the rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", ["H100-80GB", "H200-141GB"])
def test_percentage_rule_matches_the_geometry(gpu):
    geo = resolve_gpu(gpu)
    slices = emulated_slices(geo)
    assert [(s.compute_slices, s.percentage) for s in slices] == [
        (1, 14),
        (2, 29),
        (3, 43),
        (4, 57),
        (7, 100),
    ]
    for s in slices:
        # NVIDIA lists a Cg profile's SMs as C/7 of the GPU's: the share is that fraction
        assert s.share == s.compute_slices / geo.compute_slices
        assert s.percentage == round(100 * s.compute_slices / geo.compute_slices)
        assert s.profiles == tuple(
            p.name
            for p in geo.profiles
            if p.compute_slices == s.compute_slices and not p.media_extension
        )
    one_g = [p.name for p in geo.profiles if p.compute_slices == 1 and not p.media_extension]
    assert slices[0].profiles == tuple(one_g) and len(one_g) == 2  # 1g.Xgb and 1g.2Xgb
    assert all("+me" not in name for s in slices for name in s.profiles)
    with_me = emulated_slices(geo, include_me=True)
    assert any(name.endswith("+me") for name in with_me[0].profiles)


def test_percentage_rule_on_a_four_slice_gpu_and_out_of_range():
    geo = resolve_gpu("A30")
    assert [(s.compute_slices, s.percentage) for s in emulated_slices(geo)] == [
        (1, 25),
        (2, 50),
        (4, 100),
    ]
    with pytest.raises(InputError, match="4 compute slices, not 5"):
        mps_percentage(geo, 5)
    with pytest.raises(InputError):
        mps_percentage(geo, 0)


# -- planning ------------------------------------------------------------------------------------
@pytest.fixture
def inventory():
    inv = hw.discover(backend=FakeNvml.from_file(FAKE_NVML))
    inv.mps_pipe = None  # whatever this machine runs: no daemon for these tests
    return inv


def test_plan_emulated_items_come_first_one_child_per_share_and_variant(inventory):
    variants = [builtin_variant("tiny-s"), builtin_variant("tiny-m")]
    items = plan_runs(inventory, variants, cpus=[1], gpus=True, batches=[1, 8], emulate_mig=True)
    emulated = [i for i in items if i.source == "mps-emulated"]
    assert items[: len(emulated)] == emulated  # first: an MPS failure shows at once
    assert [(i.resource, i.variant.name) for i in emulated] == [
        (f"mig:{p}", v)
        for p in ("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
        for v in ("tiny-s", "tiny-m")
    ]
    first = emulated[0]
    assert first.also == ["mig:1g.20gb"] and all(not i.also for i in emulated[2:])
    assert [i.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for i in emulated[::2]] == [
        "14",
        "29",
        "43",
        "57",
        "100",
    ]
    for i in emulated:
        assert i.mps_client and i.in_child and i.device == "cuda:0" and i.batches == [1, 8]
        assert i.env["CUDA_VISIBLE_DEVICES"] == H100_UUID
        assert "CUDA_MPS_PIPE_DIRECTORY" not in i.env  # the private daemon's, added at run time
        assert i.hardware.model_name == H100 and i.hardware.kind == "mps"
        assert i.meter["kind"] == "nvml" and i.meter["gpu_index"] == 1
    assert [i.meter["share"] for i in emulated[::2]] == pytest.approx(
        [1 / 7, 2 / 7, 3 / 7, 4 / 7, 1]
    )
    assert "mps:14" not in {i.resource for i in items}
    # the whole H100 as today, and GPU 0's real MIG instances (MIG mode: not emulated)
    rest = {i.resource for i in items[len(emulated) :]}
    assert {"cpu:1", "gpu:H100-80GB-HBM3", "mig:3g.20gb"} <= rest
    assert not any(i.mps_client for i in items[len(emulated) :])
    assert any("GPU 0 (NVIDIA A100-SXM4-40GB) is in MIG mode" in n for n in inventory.notes)
    assert "(MPS 14 %)" in first.title


def test_plan_adds_explicit_mps_shares_on_the_private_daemon(inventory):
    items = plan_runs(
        inventory, [builtin_variant("tiny-s")], cpus=[], gpus=True, mps=[50], emulate_mig=True
    )
    (share,) = [i for i in items if i.resource == "mps:50"]
    assert share.mps_client and share.source == "measured"
    assert share.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert share.meter["share"] == 0.5 and share.hardware.compute_share == 0.5


def test_plan_uses_a_running_daemon(inventory, tmp_path):
    inventory.mps_pipe = str(tmp_path / "control")
    items = plan_runs(inventory, [builtin_variant("tiny-s")], cpus=[], gpus=True, emulate_mig=True)
    emulated = [i for i in items if i.source == "mps-emulated"]
    assert len(emulated) == 5
    assert all(i.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path) for i in emulated)
    # that daemon's shares as before (the defaults), in the same session: checked too
    shares = [i for i in items if i.resource.startswith("mps:")]
    assert [i.resource for i in shares] == ["mps:25", "mps:50", "mps:100"]
    assert all(i.mps_client for i in shares)
    assert items[:8] == emulated + shares  # one contiguous session


def test_plan_refusals(inventory):
    v = [builtin_variant("tiny-s")]
    with pytest.raises(InputError, match="--emulate-mig needs --gpus"):
        plan_runs(inventory, v, cpus=[1], emulate_mig=True)
    desc = json.loads(FAKE_NVML.read_text())
    desc["gpus"] = [{"name": "NVIDIA L4", "uuid": "GPU-l4", "memory_mb": 23034, "mig": None}]
    inv = hw.discover(backend=FakeNvml(desc))
    with pytest.raises(InputError, match="no MIG geometry for this model") as err:
        plan_runs(inv, v, cpus=[], gpus=True, emulate_mig=True)
    assert "NVIDIA L4" in err.value.message and "H100-80GB" in err.value.message
    # only MIG-mode GPUs: a note, their instances are profiled
    desc = json.loads(FAKE_NVML.read_text())
    desc["gpus"] = desc["gpus"][:1]
    inv = hw.discover(backend=FakeNvml(desc))
    items = plan_runs(inv, v, cpus=[], gpus=True, emulate_mig=True)
    assert items and all(i.hardware.kind == "mig" for i in items)
    assert any("profiled instead of emulated" in n for n in inv.notes)


# -- the daemon's lifetime -----------------------------------------------------------------------
@pytest.fixture
def fake_control(tmp_path, monkeypatch):
    """A copy of the fake control program, its call log, and no stray fake daemons after."""
    if shutil.which("bash") is None or shutil.which("mkfifo") is None:
        pytest.skip("needs bash and mkfifo")
    prog = tmp_path / "nvidia-cuda-mps-control"
    prog.write_text(FAKE_CONTROL.read_text())
    prog.chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", str(prog))
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.delenv("GREENCTL_MPS_VERIFY", raising=False)
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    started: list[str] = []
    yield log, started
    for line in log.read_text().splitlines():  # kill what a test left running on purpose
        if line.startswith("start pipe="):
            pipe = line.split()[1].removeprefix("pipe=")
            for pid in mps.processes_with_pipe(pipe):
                os.kill(pid, signal.SIGKILL)
            shutil.rmtree(os.path.dirname(pipe), ignore_errors=True)  # kept logs, if any


def _calls(log: Path) -> list[str]:
    return [line.split()[0] for line in log.read_text().splitlines()]


def _fake_child(seen: list[dict], *, fail_on: str | None = None, interrupt_on: str | None = None):
    """A run_child that runs no process: it records what the child would get (the item's
    environment, merged into this one's as run_child does) and returns a made-up batch."""

    def run_child(item, spec, *, timeout_s=harness.CHILD_TIMEOUT_S, progress=None, what=None):
        env = dict(item.env or {})
        pipe = env.get("CUDA_MPS_PIPE_DIRECTORY")
        seen.append(
            {
                "resource": item.resource,
                "env": env,
                "timeout_s": timeout_s,
                "daemon_up": bool(pipe) and os.path.exists(os.path.join(pipe, "control")),
                "spec": spec,
            }
        )
        if item.resource == fail_on:
            raise HardwareError(f"profiling {item.variant.name} on {item.resource} failed")
        if item.resource == interrupt_on:
            raise KeyboardInterrupt
        pct = float(env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 100))
        lat = 100.0 / pct
        results = []
        for sub in spec.get("items") or [spec]:  # a group of variants runs in one child
            out = [
                Measurement(batch=b, latencies_ms=[lat, lat, lat], duration_s=0.01, memory_mb=1.0)
                for b in sub["batches"]
            ]
            results.append(
                {
                    "measurements": [harness.measurement_to_dict(m) for m in out],
                    "facts": {"params": 10, "memory_mb": 0.5},
                }
            )
        return [], {**results[0], "results": results}

    return run_child


def test_profile_starts_one_private_daemon_and_stops_it(
    store, inventory, fake_control, monkeypatch
):
    log, _ = fake_control
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen))
    result = profile(
        store,
        variants=["tiny-s"],
        cpus=[],
        gpus=True,
        emulate_mig=True,
        batches=[1, 8],
        duration_s=1.0,
        inventory=inventory,
    )
    calls = log.read_text().splitlines()
    starts = [c for c in calls if c.startswith("start ")]
    assert len(starts) == 1  # once for the run
    pipe = starts[0].split()[1].removeprefix("pipe=")
    assert f"cvd={H100_UUID}" in starts[0] and starts[0].endswith(" pct=")  # servers: 100 %
    assert starts[0].split()[2].removeprefix("logdir=") != ""
    assert _calls(log)[-1] == "cmd=quit" and _calls(log).count("cmd=quit") == 1
    # the emulated children: percentages, the private pipe, while the daemon ran
    emulated = [s for s in seen if s["env"].get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")]
    assert [s["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for s in emulated] == [
        "14",
        "29",
        "43",
        "57",
        "100",
    ]
    assert all(s["env"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe and s["daemon_up"] for s in emulated)
    assert all(s["timeout_s"] < 600 for s in emulated)  # a hung MPS child does not eat an hour
    # the whole GPU and the A100's MIG instances after the daemon stopped, without MPS
    later = seen[len(emulated) :]
    assert {s["resource"] for s in later} >= {"gpu:H100-80GB-HBM3", "mig:3g.20gb"}
    assert not any("CUDA_MPS_PIPE_DIRECTORY" in s["env"] for s in later)
    # gone: the daemon, its server, its temporary folder
    assert not mps.processes_with_pipe(pipe)
    assert not os.path.exists(os.path.dirname(pipe))
    assert any("started a private control daemon" in n for n in result.notes)
    assert any("stopped the control daemon" in n for n in result.notes)
    # stored as mig:<profile> rows labelled mps-emulated, hardware the GPU's NVML name
    rows = [p for p in store.latest_profiles(variant="tiny-s") if p.source == "mps-emulated"]
    assert sorted({p.resource for p in rows}) == [
        "mig:1g.10gb",
        "mig:1g.20gb",
        "mig:2g.20gb",
        "mig:3g.40gb",
        "mig:4g.40gb",
        "mig:7g.80gb",
    ]
    assert len(rows) == 12  # x batches 1 and 8
    assert {p.hardware for p in rows} == {H100}
    one = {p.resource: p for p in rows if p.batch == 1}
    assert one["mig:1g.10gb"].latency_p50_ms == one["mig:1g.20gb"].latency_p50_ms  # one run
    whole = store.latest_profiles(variant="tiny-s", resource="gpu:H100-80GB-HBM3")
    assert whole and {p.source for p in whole} == {"measured"}


def test_quit_is_sent_when_a_child_fails(store, inventory, fake_control, monkeypatch):
    log, _ = fake_control
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen, fail_on="mig:3g.40gb"))
    with pytest.raises(HardwareError, match=r"on mig:3g\.40gb failed") as err:
        profile(
            store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
            batches=[1], inventory=inventory,
        )  # fmt: skip
    assert "MPS control.log:" in (err.value.hint or "")  # what the daemon said, with it
    assert _calls(log).count("start") == 1 and _calls(log)[-1] == "cmd=quit"
    pipe = seen[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert not mps.processes_with_pipe(pipe)
    assert os.path.exists(os.path.join(os.path.dirname(pipe), "log"))  # kept for a look
    assert store.profile_count() == 0  # nothing stored
    shutil.rmtree(os.path.dirname(pipe))


def test_quit_is_sent_on_ctrl_c(store, inventory, fake_control, monkeypatch):
    log, _ = fake_control
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen, interrupt_on="mig:2g.20gb"))
    with pytest.raises(KeyboardInterrupt):
        profile(
            store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
            batches=[1], inventory=inventory,
        )  # fmt: skip
    assert _calls(log)[-1] == "cmd=quit"
    pipe = seen[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert not mps.processes_with_pipe(pipe)
    assert store.profile_count() == 0
    shutil.rmtree(os.path.dirname(pipe), ignore_errors=True)


def test_sigterm_stops_the_daemon_too(fake_control):
    log, _ = fake_control
    notes: list[str] = []
    # a known handler before (an earlier test's Ray may have installed its own)
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with (
            pytest.raises(KeyboardInterrupt),
            mps.mps_session(existing_pipe=None, gpu_uuids=[H100_UUID], notes=notes) as daemon,
        ):
            os.kill(os.getpid(), signal.SIGTERM)
        assert _calls(log)[-1] == "cmd=quit"
        assert not mps.processes_with_pipe(daemon.pipe_dir)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    finally:
        signal.signal(signal.SIGTERM, before)
    shutil.rmtree(daemon.root or "", ignore_errors=True)


def test_a_child_that_did_not_reach_mps_fails_the_run(store, inventory, fake_control, monkeypatch):
    log, _ = fake_control
    monkeypatch.setenv("FAKE_MPS_NO_SERVER", "1")  # no server, no client in the log
    monkeypatch.setattr(mps, "VERIFY_WAIT_S", 0.3)
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen))
    with pytest.raises(HardwareError, match="without reaching the MPS control daemon") as err:
        profile(
            store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
            batches=[1], inventory=inventory,
        )  # fmt: skip
    assert "GREENCTL_MPS_VERIFY=0" in (err.value.hint or "")
    assert "Starting control daemon" in err.value.message  # the daemon's log, quoted
    assert len(seen) == 1  # failed after the first child
    assert _calls(log)[-1] == "cmd=quit" and store.profile_count() == 0
    shutil.rmtree(os.path.dirname(seen[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"]))
    # the escape hatch
    monkeypatch.setenv("GREENCTL_MPS_VERIFY", "0")
    seen.clear()
    profile(
        store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
        batches=[1], inventory=inventory,
    )  # fmt: skip
    assert store.profile_count() > 0


def test_a_client_logged_by_the_daemon_counts_as_reaching_it(fake_control, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_NO_SERVER", "1")
    notes: list[str] = []
    with mps.mps_session(existing_pipe=None, gpu_uuids=[H100_UUID], notes=notes) as daemon:
        assert daemon.log_dir
        with open(os.path.join(daemon.log_dir, "control.log"), "a") as f:
            f.write("[2026-01-01 00:00:01.000 Control 1] NEW CLIENT 0 from user 1000: ...\n")
        daemon.verify_client(wait_s=0.2)
        assert daemon.verified


def test_a_daemon_that_does_not_quit_is_reported(fake_control, monkeypatch):
    log, _ = fake_control
    monkeypatch.setenv("FAKE_MPS_IGNORE_QUIT", "1")
    notes: list[str] = []
    with mps.mps_session(existing_pipe=None, gpu_uuids=[H100_UUID], notes=notes) as daemon:
        pass
    assert _calls(log)[-1] == "cmd=quit"
    (warning,) = [n for n in notes if n.startswith("warning")]
    assert "still run" in warning and f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}" in warning
    for pid in mps.processes_with_pipe(daemon.pipe_dir):  # the fixture kills them too
        assert str(pid) in warning


def test_a_daemon_that_does_not_start(fake_control, monkeypatch):
    log, _ = fake_control
    monkeypatch.setenv("FAKE_MPS_FAIL_START", "1")
    with (
        pytest.raises(HardwareError, match="already running"),
        mps.mps_session(existing_pipe=None, gpu_uuids=[H100_UUID], notes=[]),
    ):
        pytest.fail("the body must not run")
    assert _calls(log)[0] == "start"


def test_a_running_daemon_is_used_and_left_running(
    store, inventory, fake_control, tmp_path, monkeypatch
):
    log, _ = fake_control
    pipe = tmp_path / "their-mps"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    (pipe / "server.pid").write_text(f"{os.getpid()}\n")
    inventory.mps_pipe = str(pipe / "control")
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen))
    result = profile(
        store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
        batches=[1], inventory=inventory,
    )  # fmt: skip
    calls = _calls(log)
    assert "start" not in calls and "cmd=quit" not in calls
    assert "cmd=get_server_list" in calls  # the first client was checked
    emulated = seen[:5]
    assert [s["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for s in emulated] == [
        "14",
        "29",
        "43",
        "57",
        "100",
    ]
    assert all(s["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe) for s in emulated)
    assert any("already runs" in n and "left it running" in n for n in result.notes)
    assert (pipe / "control").exists()


def test_a_dead_daemons_pipe_gets_a_private_daemon(
    store, inventory, fake_control, tmp_path, monkeypatch
):
    log, _ = fake_control
    stale = tmp_path / "stale-mps"
    stale.mkdir()
    (stale / "control").write_text("")  # left behind: nothing answers there
    inventory.mps_pipe = str(stale / "control")
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen))
    result = profile(
        store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
        batches=[1], inventory=inventory,
    )  # fmt: skip
    assert any("does not answer" in n for n in result.notes)
    calls = _calls(log)
    assert calls.count("start") == 1 and calls[-1] == "cmd=quit"
    pipes = {s["env"]["CUDA_MPS_PIPE_DIRECTORY"] for s in seen[:5]}
    assert len(pipes) == 1 and str(stale) not in pipes


def test_a_running_daemon_without_the_control_program_here(store, inventory, tmp_path, monkeypatch):
    """A daemon of another container (only its pipe directory shared): used, unchecked."""
    monkeypatch.delenv("GREENCTL_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    pipe = tmp_path / "shared-mps"
    pipe.mkdir()
    os.mkfifo(pipe / "control")
    inventory.mps_pipe = str(pipe / "control")
    seen: list[dict] = []
    monkeypatch.setattr(harness, "run_child", _fake_child(seen))
    result = profile(
        store, variants=["tiny-s"], cpus=[], gpus=True, emulate_mig=True,
        batches=[1], inventory=inventory,
    )  # fmt: skip
    assert any("unchecked that clients reach it" in n for n in result.notes)
    assert seen[0]["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)


def test_missing_control_program_is_an_input_error(monkeypatch, tmp_path):
    monkeypatch.delenv("GREENCTL_MPS_CONTROL", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InputError, match="'nvidia-cuda-mps-control', which is not on PATH") as e:
        mps.control_binary()
    assert "GREENCTL_MPS_CONTROL" in (e.value.hint or "") and e.value.exit_code == 2
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", str(tmp_path / "nope"))
    with pytest.raises(InputError, match="not an executable"):
        mps.control_binary()


def test_mps_child_timeout_is_bounded():
    assert harness.mps_child_timeout(2, 1.0) < 300
    assert harness.mps_child_timeout(2, None) == harness.CHILD_TIMEOUT_S


def test_real_children_get_the_share_and_the_pipe(store, fake_control, monkeypatch, tmp_path):
    """Real child processes (on the CPU: this machine has no GPU) under the fake NVML's
    H100 with MIG mode off: the child sees the percentage and the private pipe."""
    desc = json.loads(FAKE_NVML.read_text())
    desc["gpus"] = desc["gpus"][1:]
    fake = tmp_path / "fake_h100.json"
    fake.write_text(json.dumps(desc))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))
    inv = hw.discover(backend=FakeNvml(desc))
    inv.mps_pipe = None
    docs: list[dict] = []
    real = harness.run_child

    def on_cpu(item, spec, **kw):
        measurements, doc = real(replace(item, device="cpu"), {**spec, "device": "cpu"}, **kw)
        docs.append(doc)
        return measurements, doc

    monkeypatch.setattr(harness, "run_child", on_cpu)
    monkeypatch.setattr(harness, "MPS_CHILD_STARTUP_S", 240.0)  # a busy 2-core machine
    items = plan_runs(inv, [builtin_variant("tiny-s")], cpus=[], gpus=True, emulate_mig=True)
    only = [
        i
        for i in items
        if i.env and i.env.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") in ("14", "100")
    ]
    only += [i for i in items if i.resource.startswith("gpu:")]
    notes: list[str] = []
    result = harness.run_items(only, requests=2, duration_s=None, warmup=0, notes=notes)
    assert [d["env"].get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE") for d in docs] == ["14", "100", None]
    pipes = {d["env"].get("CUDA_MPS_PIPE_DIRECTORY") for d in docs[:2]}
    assert len(pipes) == 1 and None not in pipes
    assert "CUDA_MPS_PIPE_DIRECTORY" not in docs[2]["env"]
    rows = {p.resource: p for p, _hw in result.profiles}
    assert set(rows) == {"mig:1g.10gb", "mig:1g.20gb", "mig:7g.80gb", "gpu:H100-80GB-HBM3"}
    assert rows["mig:1g.10gb"].source == "mps-emulated" and rows["mig:1g.10gb"].hardware == H100
    assert rows["mig:1g.10gb"].energy_method == "nvml-attributed"
    assert rows["gpu:H100-80GB-HBM3"].source == "measured"
    assert result.variants[0].params  # the child's facts
    assert not mps.processes_with_pipe(pipes.pop() or "")


def test_the_one_rule_of_estimate_labels():
    from greenctl.data.records import (
        PROFILE_SOURCES,
        estimate_caption,
        estimate_label,
        is_estimate,
    )

    assert "mps-emulated" in PROFILE_SOURCES
    assert estimate_label(["measured", "imported", None]) is None
    assert estimate_label(["synthetic", "measured"]) == "synthetic profiles"  # as before
    assert estimate_label(["mps-emulated"]) == "mps-emulated profiles"
    assert estimate_label(["synthetic", "mps-emulated"]) == "mps-emulated and synthetic profiles"
    assert is_estimate("mps-emulated") and not is_estimate("measured")
    caption = estimate_caption(["mps-emulated", "measured"]) or ""
    assert caption.startswith("mps-emulated: ") and "memory bandwidth or L2" in caption
    assert estimate_caption(["measured"]) is None
