"""Faults: each leaves the previous configuration serving and the store consistent."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from greenctl.data.errors import ExecutorError, InfeasiblePlan, InputError, LockedError
from greenctl.data.plan import Deployment, Plan

from tests.conftest import listening_port

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)


def _plan(variant: str, *, count: int = 1, cores: int = 1, model: str = "m") -> Plan:
    return Plan(
        kind="mix",
        deployments=[
            Deployment(
                model=model,
                variant=variant,
                resource=f"cpu:{cores}",
                count=count,
                batch=1,
                quota_rps=10.0,
            )
        ],
        predicted={"rate_rps": 10.0 * count},
    )


def _infer_ok(url: str, model: str = "m") -> bool:
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    )
    req = urllib.request.Request(
        f"{url}/v2/models/{model}/infer", data=body.encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status == 200 and json.loads(resp.read())["outputs"][0]["data"] == [1, 2, 3, 4]


def _snapshot(store) -> tuple[list, list]:
    inst = [
        (r["id"], r["variant"], r["pid"], r["state"])
        for r in store.db.table("executor_instances").rows_where(order_by="id")
    ]
    disp = [
        (r["id"], r["pid"], r["state"])
        for r in store.db.table("executor_dispatcher").rows_where(order_by="id")
    ]
    return inst, disp


@pytest.fixture(scope="module")
def serving(tmp_path_factory, pids_mentioning):
    """One configuration that keeps serving while each fault below is injected beside it."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.executor.runtime.procs import is_alive

    here = Path(__file__).resolve().parent
    loader = f"{here / 'exec_loaders.py'}:broken_loader"  # a no-op model unless named broken*
    root = tmp_path_factory.mktemp("serving")
    store = open_store(root / "greenctl.db")
    state = str(root / "greenctl.db.run")
    url = apply_plan(_plan("good"), store=store, loader=loader).dispatcher_url or ""

    def alive() -> list[int]:
        return sorted(p for p in pids_mentioning(state) if is_alive(p))

    try:
        yield store, url, loader, alive
    finally:
        with contextlib.suppress(Exception):
            down(store)
        for pid in pids_mentioning(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        store.close()


def _still_serving(serving, before) -> None:
    from greenctl.executor.deploy.apply import status

    store, url, _, alive = serving
    assert _snapshot(store)[0] == before[0][0] and _snapshot(store)[1] == before[0][1]
    assert alive() == before[1]  # nothing half-started is left behind
    assert _infer_ok(url)
    assert [i["variant"] for i in status(store)["instances"]] == ["good"]


def test_executor_that_fails_to_load_rolls_back(serving, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    monkeypatch.delenv("GREENCTL_STATE_DIR", raising=False)
    store, _, loader, alive = serving
    before = (_snapshot(store), alive())
    with pytest.raises(ExecutorError) as err:
        apply_plan(_plan("broken-v2"), store=store, loader=loader)
    message = str(err.value)
    assert "weights of broken-v2 are corrupt" in message
    assert "previous configuration is still serving" in message
    _still_serving(serving, before)
    failed = list(store.db.table("executor_apply_history").rows_where("status = ?", ["failed"]))
    assert any("corrupt" in f["error"] for f in failed)


def test_dispatcher_port_taken_rolls_back(serving, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    monkeypatch.delenv("GREENCTL_STATE_DIR", raising=False)
    store, _, loader, alive = serving
    before = (_snapshot(store), alive())
    with (
        listening_port() as taken,
        pytest.raises(InputError, match=f"cannot bind 127.0.0.1:{taken}"),
    ):
        apply_plan(_plan("v2"), store=store, loader=loader, port=taken)
    _still_serving(serving, before)


def test_more_cores_than_exist_changes_nothing(serving, monkeypatch):
    from greenctl.executor.deploy.apply import apply_plan

    monkeypatch.delenv("GREENCTL_STATE_DIR", raising=False)
    store, _, loader, alive = serving
    before = (_snapshot(store), alive())
    with pytest.raises(InfeasiblePlan, match="needs 3 CPU cores but this machine offers 2"):
        apply_plan(_plan("v2", cores=3), store=store, loader=loader, cores=[0, 1])
    # the real machine's cores are the default budget
    with pytest.raises(InfeasiblePlan):
        apply_plan(_plan("v2", cores=len(os.sched_getaffinity(0)) + 1), store=store, loader=loader)
    _still_serving(serving, before)


def test_kill_9_under_load_supervisor_restarts(run_store, loaders, monkeypatch):
    """A killed executor is restarted; in-flight requests are retried on its sibling."""
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.executor.runtime.loadgen import run_load

    monkeypatch.setenv("GREENCTL_NOOP_SERVICE_MS", "5")
    result = apply_plan(
        _plan("v1", count=2), store=run_store, loader=loaders["noop"], policy="fifo"
    )
    url = result.dispatcher_url or ""
    victim = status(run_store)["instances"][0]
    out = {}

    def load() -> None:
        out["res"] = run_load(url, "m", duration_s=3.0, rate_rps=60, seed=3)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(1.0)
    os.kill(victim["pid"], signal.SIGKILL)
    t.join(timeout=60)
    res = out["res"]
    assert res.sent > 100
    assert res.ok == res.sent, res.status_counts  # nothing lost: the one retry covers it
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rows = list(run_store.db.table("executor_restarts").rows)
        if rows:
            break
        time.sleep(0.1)
    assert (
        len(rows) == 1
        and rows[0]["instance_id"] == victim["id"]
        and rows[0]["old_pid"] == victim["pid"]
    )
    after = {i["id"]: i for i in status(run_store)["instances"]}
    assert after[victim["id"]]["pid"] == rows[0]["new_pid"] != victim["pid"]
    assert after[victim["id"]]["restarts"] == 1 and after[victim["id"]]["ready"]
    assert _infer_ok(url)


def test_concurrent_apply_is_locked(run_store, loaders):
    from greenctl.executor.deploy.apply import apply_plan
    from greenctl.executor.runtime.procs import apply_lock, state_dir_for

    with apply_lock(state_dir_for(run_store.path)):
        with pytest.raises(
            LockedError, match=f"another greenctl apply is running \\(pid {os.getpid()}"
        ):
            apply_plan(_plan("v1"), store=run_store, loader=loaders["noop"])
        with pytest.raises(LockedError):  # --wait with a bound gives up too
            apply_plan(
                _plan("v1"), store=run_store, loader=loaders["noop"], wait=True, lock_timeout_s=0.2
            )
    assert run_store.db.table("executor_instances").count == 0


def test_dry_run_changes_nothing(run_store, loaders, leftovers):
    from greenctl.executor.deploy.apply import apply_plan

    res = apply_plan(_plan("v1", count=2), store=run_store, loader=loaders["noop"], dry_run=True)
    assert res.dry_run and res.changed
    kinds = [a["action"] for a in res.actions]
    assert kinds == ["start-dispatcher", "start-executor", "start-executor", "switch-routes"]
    from greenctl.executor.deploy.partition import available_cores

    first_two = available_cores()[:2]
    assert [a["cores"] for a in res.actions if a["action"] == "start-executor"] == [
        [first_two[0]],
        [first_two[1]],
    ]
    assert leftovers() == []
    assert run_store.db.table("executor_apply_history").count == 0
