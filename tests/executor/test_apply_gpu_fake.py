"""MIG and MPS paths of apply/down against the fake NVML device layer (never a real GPU)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from greenctl.data.errors import ExecutorError, HardwareError, InfeasiblePlan
from greenctl.data.plan import Deployment, Plan

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)


def _fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, mig: bool | None = True, instances=None
) -> Path:
    desc = {
        "persist": True,
        "gpus": [
            {
                "name": "NVIDIA A100-SXM4-40GB",
                "uuid": "GPU-11111111-2222-3333-4444-555555555555",
                "memory_mb": 40960,
                "mig": mig,
                "instances": instances or [],
            }
        ],
    }
    path = tmp_path / "fake_nvml.json"
    path.write_text(json.dumps(desc))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(path))
    return path


def _layout(path: Path) -> list[tuple[str, int]]:
    gpu = json.loads(path.read_text())["gpus"][0]
    return sorted((i["profile"], i["start"]) for i in gpu.get("instances") or [])


def _mig_plan(layout: list[tuple[str, int, str]]) -> Plan:
    deployments: dict[tuple[str, str], Deployment] = {}
    for profile, _start, variant in layout:
        d = deployments.setdefault(
            (variant, profile),
            Deployment(
                model="m",
                variant=variant,
                resource=f"mig:{profile}",
                count=0,
                batch=1,
                quota_rps=5.0,
            ),
        )
        d.count += 1
    return Plan(
        kind="mig",
        deployments=list(deployments.values()),
        extra={
            "gpus": [
                {
                    "index": 0,
                    "model": "A100-SXM4-40GB",
                    "layout": [{"profile": p, "start": s, "variant": v} for p, s, v in layout],
                }
            ]
        },
        predicted={"rate_rps": 10.0},
    )


def _executor_env(run_store) -> dict[str, dict[str, str]]:
    from greenctl.executor.runtime.procs import read_json

    out = {}
    for row in run_store.db.table("executor_instances").rows_where("state = ?", ["ready"]):
        spawn = json.loads(row["spawn"])
        out[row["variant"]] = (read_json(spawn["state_file"]) or {}).get("env", {})
    return out


def test_mig_apply_checkpoint_and_restore(run_store, loaders, tmp_path, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.profiler.device import get_backend

    fake = _fake(tmp_path, monkeypatch, instances=[{"profile": "7g.40gb", "start": 0}])
    plan = _mig_plan([("3g.20gb", 0, "big"), ("2g.10gb", 4, "small")])
    dry = apply_plan(plan, store=run_store, loader=loaders["noop"], dry_run=True)
    kinds = [a["action"] for a in dry.actions]
    assert kinds[:4] == ["mig-checkpoint", "mig-destroy", "mig-create", "mig-create"]
    assert _layout(fake) == [("7g.40gb", 0)]  # the dry run changed nothing

    apply_plan(plan, store=run_store, loader=loaders["noop"])
    assert _layout(fake) == [("2g.10gb", 4), ("3g.20gb", 0)]
    uuids = {(i.profile, i.placement_start): i.uuid for i in get_backend().mig_instances(0)}
    env = _executor_env(run_store)
    assert env["big"]["CUDA_VISIBLE_DEVICES"] == uuids[("3g.20gb", 0)]
    assert env["small"]["CUDA_VISIBLE_DEVICES"] == uuids[("2g.10gb", 4)]
    assert all(v.startswith("MIG-") for v in uuids.values())
    assert {i["resource"] for i in status(run_store)["instances"]} == {"mig:3g.20gb", "mig:2g.10gb"}
    # the same plan again: no MIG change, nothing to do
    assert not apply_plan(plan, store=run_store, loader=loaders["noop"]).changed

    # a second layout keeps the first checkpoint (the layout before greenctl touched it)
    apply_plan(
        _mig_plan([("3g.20gb", 0, "big"), ("3g.20gb", 4, "big")]),
        store=run_store,
        loader=loaders["noop"],
    )
    assert _layout(fake) == [("3g.20gb", 0), ("3g.20gb", 4)]
    checkpoints = list(run_store.db.table("executor_mig_checkpoints").rows)
    assert len(checkpoints) == 1 and json.loads(checkpoints[0]["layout"]) == [
        {"profile": "7g.40gb", "start": 0}
    ]

    down(run_store, restore_mig=True)
    assert _layout(fake) == [("7g.40gb", 0)]
    assert run_store.db.table("executor_mig_checkpoints").get(checkpoints[0]["id"])["restored_at"]


def test_mig_layout_checked_before_any_change(run_store, loaders, tmp_path, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    fake = _fake(tmp_path, monkeypatch, instances=[{"profile": "7g.40gb", "start": 0}])
    with pytest.raises(InfeasiblePlan, match=r"4g\.20gb@0 overlaps 3g\.20gb@0"):
        apply_plan(
            _mig_plan([("3g.20gb", 0, "a"), ("4g.20gb", 0, "b")]),
            store=run_store,
            loader=loaders["noop"],
        )
    with pytest.raises(InfeasiblePlan, match="cannot start at memory slot 1"):
        apply_plan(_mig_plan([("2g.10gb", 1, "a")]), store=run_store, loader=loaders["noop"])
    assert _layout(fake) == [("7g.40gb", 0)]


def test_mig_driver_failure_restores_layout(run_store, loaders, tmp_path, monkeypatch):
    """The driver refuses the second GPU instance: apply undoes the first and the destroy."""
    from greenctl.executor.deploy import partition
    from greenctl.executor.deploy.apply import apply_plan
    from greenctl.profiler import device as dev

    fake = _fake(tmp_path, monkeypatch, instances=[{"profile": "7g.40gb", "start": 0}])
    real = partition.gpu_backend
    calls = {"create": 0}

    def flaky_backend():
        backend = real()
        create = backend.create_gpu_instance_with_placement

        def refuse_second(gpu, profile, start):
            calls["create"] += 1
            if calls["create"] == 2:
                raise dev.nvml_error(
                    dev.NVML_ERROR_INSUFFICIENT_RESOURCES, "creating a GPU instance"
                )
            return create(gpu, profile, start)

        backend.create_gpu_instance_with_placement = refuse_second
        return backend

    monkeypatch.setattr(partition, "gpu_backend", flaky_backend)
    with pytest.raises(ExecutorError, match="changing the MIG layout") as err:
        apply_plan(
            _mig_plan([("3g.20gb", 0, "a"), ("3g.20gb", 4, "b")]),
            store=run_store,
            loader=loaders["noop"],
        )
    assert "previous configuration is still serving" in str(err.value)
    assert _layout(fake) == [("7g.40gb", 0)]
    assert run_store.db.table("executor_instances").count == 0
    (failed,) = run_store.db.table("executor_apply_history").rows
    assert failed["status"] == "failed" and "recreate MIG 7g.40gb@0" in failed["undone"]


def test_mig_mode_off_and_no_gpu_say_so(run_store, loaders, tmp_path, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    _fake(tmp_path, monkeypatch, mig=False)
    with pytest.raises(HardwareError, match="MIG mode is off on GPU 0") as err:
        apply_plan(_mig_plan([("3g.20gb", 0, "a")]), store=run_store, loader=loaders["noop"])
    assert "nvidia-smi -i 0 -mig 1" in str(err.value)
    # --mig-parted: the layout is someone else's; greenctl only looks for the instances
    with pytest.raises(ExecutorError, match=r"no MIG instance 3g\.20gb at slot 0"):
        apply_plan(
            _mig_plan([("3g.20gb", 0, "a")]),
            store=run_store,
            loader=loaders["noop"],
            mig_parted=True,
        )


def test_mps_shares_start_control_daemon(run_store, loaders, tmp_path, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan, down

    _fake(tmp_path, monkeypatch, mig=None)
    log = tmp_path / "mps-calls.txt"
    script = tmp_path / "fake-mps-control"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-d" ]; then echo "start pipe=$CUDA_MPS_PIPE_DIRECTORY" >> {log}; '
        f'else read cmd; echo "cmd=$cmd" >> {log}; fi\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", str(script))
    plan = Plan(
        kind="glet",
        deployments=[
            Deployment(
                model="a",
                variant="va",
                resource="mps:40",
                batch=4,
                quota_rps=10.0,
                placement={"gpus": [0]},  # as plan glet writes it: the GPU of each instance
            ),
            Deployment(model="b", variant="vb", resource="mps:60", batch=2, quota_rps=10.0),
        ],
    )
    res = apply_plan(plan, store=run_store, loader=loaders["noop"])
    assert res.actions[0]["action"] == "start-mps-control"
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].startswith("start pipe=") and "mps/pipe" in calls[0]
    env = _executor_env(run_store)
    assert env["va"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["vb"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    assert env["va"]["CUDA_VISIBLE_DEVICES"] == "GPU-11111111-2222-3333-4444-555555555555"
    # the routing policy of a glet plan is "batch"
    from greenctl.data.deployments import running_dispatcher
    from greenctl.executor.deploy.admin import admin as _admin

    routes = _admin(running_dispatcher(run_store), "GET")
    assert {m["policy"] for m in routes["models"].values()} == {"batch"}
    assert {b["slots"] for m in routes["models"].values() for b in m["instances"]} == {5, 3}
    down(run_store)
    assert log.read_text().splitlines()[-1] == "cmd=quit"


def test_mps_over_100_percent_is_infeasible(run_store, loaders, tmp_path, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    _fake(tmp_path, monkeypatch, mig=None)
    plan = Plan(
        kind="mix",
        deployments=[Deployment(model="a", variant="va", resource="mps:60", count=2)],
    )
    with pytest.raises(InfeasiblePlan, match="add up to 120 %"):
        apply_plan(plan, store=run_store, loader=loaders["noop"])


def test_mig_rollback_brings_back_executors_on_recreated_slices(
    run_store, loaders, tmp_path, monkeypatch
):
    """Layout A serves; layout B replaces a slice but the driver refuses the new one: the old
    slice is re-created (new UUID) and the supervisor restarts its executor there."""
    import time

    from greenctl.executor.deploy import partition
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.profiler import device as dev
    from greenctl.profiler.device import get_backend

    fake = _fake(tmp_path, monkeypatch)
    apply_plan(
        _mig_plan([("3g.20gb", 0, "big"), ("2g.10gb", 4, "small")]),
        store=run_store,
        loader=loaders["noop"],
    )
    small = next(i for i in status(run_store)["instances"] if i["variant"] == "small")
    old_uuid = _executor_env(run_store)["small"]["CUDA_VISIBLE_DEVICES"]

    real = partition.gpu_backend

    def refusing_backend():
        backend = real()
        create = backend.create_gpu_instance_with_placement

        def refuse_3g_at_4(gpu, profile, start):
            if (profile, start) == ("3g.20gb", 4):
                raise dev.nvml_error(
                    dev.NVML_ERROR_INSUFFICIENT_RESOURCES, "creating a GPU instance"
                )
            return create(gpu, profile, start)

        backend.create_gpu_instance_with_placement = refuse_3g_at_4
        return backend

    monkeypatch.setattr(partition, "gpu_backend", refusing_backend)
    with pytest.raises(ExecutorError, match="changing the MIG layout"):
        apply_plan(
            _mig_plan([("3g.20gb", 0, "big"), ("3g.20gb", 4, "big")]),
            store=run_store,
            loader=loaders["noop"],
        )
    assert _layout(fake) == [("2g.10gb", 4), ("3g.20gb", 0)]
    new_uuid = next(i.uuid for i in get_backend().mig_instances(0) if i.placement_start == 4)
    del old_uuid  # (the fake derives UUIDs from the placement; a real driver mints new ones)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        now = next(i for i in status(run_store)["instances"] if i["variant"] == "small")
        if now["pid"] != small["pid"] and now["ready"]:
            break
        time.sleep(0.2)
    assert now["pid"] != small["pid"] and now["ready"] and now["restarts"] == 1
    assert _executor_env(run_store)["small"]["CUDA_VISIBLE_DEVICES"] == new_uuid


def test_serving_path_measured_on_a_whole_gpu(run_store, tmp_path, monkeypatch):
    """`profile serving --resource gpu:...` applies its scratch plan on that GPU (checked
    against the fake NVML) and records where it ran; the no-op stand-in runs without CUDA.
    A GPU this machine does not have is refused before anything starts."""
    from greenctl.executor.deploy.serving_measure import measure_serving
    from greenctl.profiler.hw import discover

    _fake(tmp_path, monkeypatch, mig=False)
    (gpu,) = discover().gpus
    label = f"gpu:{gpu.model_name.removeprefix('NVIDIA ').replace(' ', '-')}"
    (row,) = measure_serving(
        run_store,
        variant="tiny-s",
        rates=(20.0,),
        duration_s=0.5,
        min_requests=20,
        paths=("direct",),
        stand_in="noop",
        output_elements=10,
        resource=label,
        batch=4,
    )
    assert (row.resource, row.batch, row.hardware) == (label, 4, label)
    assert row.samples >= 20 and row.infer_p50_ms is None  # a no-op times no model run
    from greenctl.executor.deploy.checks import same_gpu as _same_gpu

    assert _same_gpu("A100", "A100-SXM4-40GB") and _same_gpu("a100-sxm4-40gb", "A100-SXM4-40GB")
    assert not _same_gpu("H100-80GB-HBM3", "A100-SXM4-40GB") and not _same_gpu("A10", "A100")
    with pytest.raises(HardwareError, match="GPU 0 here is gpu:A100-SXM4-40GB"):
        measure_serving(
            run_store,
            variant="tiny-s",
            stand_in="noop",
            output_elements=10,
            resource="gpu:H100-80GB-HBM3",
            rates=(20.0,),
            duration_s=0.5,
            min_requests=20,
        )
