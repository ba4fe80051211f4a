"""Crash-consistent apply and supervision (issue 20).

Every long-lived process is journaled in the store before it starts and supervised while it
runs: an apply interrupted by a signal rolls back, one killed at any step leaves nothing that
``down`` (or the next ``apply``) does not stop; a killed dispatcher serves again on its port
with its executors untouched, a killed supervisor comes back, a killed executor's requests
wait for it or go to its sibling, and a crash loop backs off without giving up while
``status`` says so and exits non-zero.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from greenctl.data.plan import Deployment, Plan, write_plan_file

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).resolve().parent
NOOP = "greenctl.executor.runtime.daemon:noop_loader"
SLOW = f"{HERE / 'exec_loaders.py'}:slow_loader"
CRASHY = f"{HERE / 'exec_loaders.py'}:crashy_loader"


def _plan(variant: str = "v1", count: int = 2, model: str = "m") -> Plan:
    return Plan(
        kind="mix",
        deployments=[
            Deployment(model, variant, "cpu:1", count=count, batch=1, quota_rps=20.0 * count)
        ],
        predicted={"rate_rps": 20.0 * count},
    )


def _infer(url: str, model: str = "m", timeout_s: float = 5.0) -> tuple[int | str, dict, str]:
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()
    except (urllib.error.URLError, OSError) as exc:
        return type(exc).__name__, {}, str(exc)


def _wait_for(check, timeout_s: float = 30.0, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def _daemons(pids_mentioning, state_dir: Path, kind: str) -> list[int]:
    """Live processes of one runtime module (daemon, dispatcher, supervisor) of this test."""
    from greenctl.executor.runtime.procs import is_alive

    out = []
    for pid in pids_mentioning(str(state_dir)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"greenctl.executor.runtime.{kind}".encode() in argv and is_alive(pid):
            out.append(pid)
    return sorted(out)


def _cli_env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}


def _greenctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "greenctl.cli.main", *args],
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )


# -- crash-consistent apply ----------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_part_way_rolls_the_apply_back(
    run_store, tmp_path, monkeypatch, pids_mentioning, leftovers, sig
):
    """The issue's orphans: SIGTERM (or ^C) while executors load left a dispatcher and
    executors running that the store did not know; now the apply undoes what it started."""
    from greenctl.data import deployments

    monkeypatch.setenv("GREENCTL_TEST_LOAD_S", "30")
    path = tmp_path / "plan.json"
    write_plan_file(_plan(), path)
    state_dir = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenctl.cli.main", "apply", str(path), "--loader", SLOW],
        env=_cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert _wait_for(lambda: len(_daemons(pids_mentioning, state_dir, "daemon")) == 2, 60)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err
    assert "interrupted" in err and "undid" in err, err
    assert leftovers() == []
    assert deployments.ready_instances(run_store) == []
    assert deployments.running_dispatcher(run_store) is None
    last = deployments.last_apply(run_store)
    assert last is not None and last["status"] == "failed"
    assert "interrupted" in (last["error"] or "")


def _apply_and_die(db: str, where: str, variant: str, loader: str) -> None:
    """Run in a forked child: apply, and SIGKILL this process at ``where``."""
    from greenctl.data import deployments
    from greenctl.data.store import open_store
    from greenctl.executor.deploy import apply as ap
    from greenctl.executor.deploy import processes as pr

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    real_spawn, real_wait, real_finish, real_terminate = (
        pr.spawn_detached,
        pr.wait_for_state_file,
        deployments.finish_apply,
        pr.terminate,
    )

    def spawn(*args, **kwargs):
        if where == "journaled":
            die()
        proc = real_spawn(*args, **kwargs)
        if where == "spawned":
            die()
        return proc

    def wait(*args, **kwargs):
        if where == "executors-loading" and kwargs.get("what", "").startswith("executor"):
            die()
        return real_wait(*args, **kwargs)

    def finish(*args, **kwargs):
        if where == "switched" and kwargs.get("status") == "applied":
            die()  # inside the commit's transaction: the switch happened, the commit did not
        return real_finish(*args, **kwargs)

    def terminate(*args, **kwargs):
        if where == "retiring":
            die()
        return real_terminate(*args, **kwargs)

    pr.spawn_detached = spawn
    pr.wait_for_state_file = wait
    deployments.finish_apply = finish
    pr.terminate = terminate
    try:
        with open_store(db) as store:
            ap.apply_plan(_plan(variant), store=store, loader=loader)
    finally:
        os._exit(0)


KILL_POINTS = ["journaled", "spawned", "executors-loading", "switched", "retiring"]


@pytest.mark.parametrize("where", KILL_POINTS)
def test_kill_9_of_apply_at_any_step_leaves_nothing_down_does_not_stop(
    run_store, tmp_path, pids_mentioning, leftovers, where
):
    from greenctl.executor.deploy.apply import apply_plan, down, status

    state_dir = tmp_path / "state"
    before: list[int] = []
    if where in ("switched", "retiring"):  # a plan serves; the killed apply replaces it
        apply_plan(_plan("v1"), store=run_store, loader=NOOP)
        before = sorted(leftovers())
        assert len(before) == 4  # supervisor, dispatcher, two executors
    loader = SLOW if where == "executors-loading" else NOOP
    child = multiprocessing.get_context("fork").Process(
        target=_apply_and_die, args=(str(run_store.path), where, "v2", loader)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL, where
    if where == "executors-loading":  # executors are loading, unknown to any routing table
        assert len(_daemons(pids_mentioning, state_dir, "daemon")) == len(before) // 2 + 2
    # the store knows everything the killed apply started: down stops it all
    doc = down(run_store)
    assert leftovers() == [], (where, doc)
    assert status(run_store)["state"] == "idle"


@pytest.mark.parametrize("where", ["spawned", "executors-loading", "switched"])
def test_the_next_apply_stops_what_a_killed_apply_left(
    run_store, tmp_path, pids_mentioning, leftovers, where
):
    """The issue's second set pinned to the same cores: the next apply stops the leftovers
    first, and the running plan is the one the store records."""
    from greenctl.executor.deploy.apply import apply_plan, status

    state_dir = tmp_path / "state"
    if where == "switched":
        apply_plan(_plan("v1"), store=run_store, loader=NOOP)
    loader = SLOW if where == "executors-loading" else NOOP
    child = multiprocessing.get_context("fork").Process(
        target=_apply_and_die, args=(str(run_store.path), where, "v2", loader)
    )
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    res = apply_plan(_plan("v2"), store=run_store, loader=NOOP)
    assert len(_daemons(pids_mentioning, state_dir, "daemon")) == 2
    assert len(_daemons(pids_mentioning, state_dir, "dispatcher")) == 1
    assert len(_daemons(pids_mentioning, state_dir, "supervisor")) == 1
    st = status(run_store)
    assert st["state"] == "serving", st["problems"]
    cores = [tuple(i["cores"]) for i in st["instances"]]
    assert len(set(cores)) == 2 and [i["variant"] for i in st["instances"]] == ["v2", "v2"]
    code, _, _ = _infer(res.dispatcher_url or "")
    assert code == 200


# -- supervision -------------------------------------------------------------------------
def test_a_killed_dispatcher_serves_again_on_its_port_and_a_killed_supervisor_returns(
    run_store, cli, pids_mentioning, tmp_path
):
    from greenctl.executor.deploy.apply import apply_plan, status

    url = apply_plan(_plan(), store=run_store, loader=NOOP).dispatcher_url or ""
    st = status(run_store)
    assert st["state"] == "serving"
    disp, sup = st["dispatcher"]["pid"], st["dispatcher"]["supervisor"]["pid"]
    executors = sorted(i["pid"] for i in st["instances"])

    os.kill(disp, signal.SIGKILL)
    t0 = time.monotonic()
    assert _wait_for(lambda: _infer(url, timeout_s=2.0)[0] == 200, 30, every_s=0.01)
    print(f"dispatcher serving again after {time.monotonic() - t0:.2f} s")
    st = _wait_for(lambda: (s := status(run_store))["state"] == "serving" and s)
    assert st and st["dispatcher"]["url"] == url and st["dispatcher"]["pid"] != disp
    assert sorted(i["pid"] for i in st["instances"]) == executors  # untouched
    assert st["dispatcher"]["supervisor"]["pid"] == sup

    os.kill(sup, signal.SIGKILL)
    st = _wait_for(
        lambda: (
            (s := status(run_store))["state"] == "serving"
            and s["dispatcher"]["supervisor"]["pid"] != sup
            and s
        )
    )
    assert st and st["dispatcher"]["supervisor"]["alive"]
    assert _infer(url)[0] == 200

    # both at once: nothing brings them back; status says so and exits non-zero
    disp, sup = st["dispatcher"]["pid"], st["dispatcher"]["supervisor"]["pid"]
    for sig in (signal.SIGSTOP, signal.SIGKILL):  # stopped first: each wakes when the other dies
        for pid in (sup, disp):
            os.kill(pid, sig)
    time.sleep(1.0)
    st = status(run_store)
    assert st["state"] == "down" and any("dispatcher" in p for p in st["problems"])
    r = cli("status", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["state"] == "down"
    # the next apply brings the dispatcher back on the same port, for the same executors
    again = apply_plan(_plan(), store=run_store, loader=NOOP)
    assert again.dispatcher_url == url
    assert [a["action"] for a in again.actions] == ["start-dispatcher", "switch-routes"]
    st = status(run_store)
    assert st["state"] == "serving" and sorted(i["pid"] for i in st["instances"]) == executors
    assert cli("status").exit_code == 0


@pytest.mark.parametrize("policy", ["wrr", "fifo"])
def test_the_only_instance_killed_under_load_loses_nothing(run_store, monkeypatch, policy):
    """The issue's 111 failures: with one executor, its requests now wait in the bounded
    queue while it restarts, and the ones it held are retried on it once it is back."""
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.executor.runtime.loadgen import run_load

    monkeypatch.setenv("GREENCTL_NOOP_SERVICE_MS", "2")
    url = apply_plan(_plan(count=1), store=run_store, loader=NOOP, policy=policy).dispatcher_url
    victim = status(run_store)["instances"][0]
    results = []

    def load(seed: int) -> None:
        results.append(run_load(url or "", "m", duration_s=4.0, rate_rps=20, seed=seed))

    threads = [threading.Thread(target=load, args=(s,)) for s in (1, 2)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    os.kill(victim["pid"], signal.SIGKILL)
    for t in threads:
        t.join(60)
    sent = sum(r.sent for r in results)
    assert sent > 100
    assert [r.status_counts for r in results] == [{"200": r.sent} for r in results]
    after = _wait_for(lambda: (s := status(run_store))["state"] == "serving" and s)
    assert after and after["instances"][0]["pid"] != victim["pid"]
    assert after["instances"][0]["restarts"] == 1


@pytest.mark.slow
def test_a_crash_loop_backs_off_never_gives_up_and_status_says_so(
    run_store, cli, monkeypatch, tmp_path
):
    from greenctl.executor.deploy.apply import apply_plan, status

    flag = tmp_path / "crash"
    flag.write_text("crash 1 s after loading")
    monkeypatch.setenv("GREENCTL_TEST_CRASH_FLAG", str(flag))
    monkeypatch.setenv("GREENCTL_RESTART_BACKOFF", "0.4,1.6")
    url = apply_plan(_plan("v1", count=1), store=run_store, loader=CRASHY).dispatcher_url or ""

    def looping():
        st = status(run_store)
        inst = st["instances"][0]
        return inst["state"] == "crash-loop" and inst["failures"] >= 3 and st

    st = _wait_for(looping, 60)
    assert st, status(run_store)
    assert st["state"] != "serving"
    assert any("crash" in p for p in st["problems"]), st["problems"]
    r = cli("status", "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["instances"][0]["failures"] >= 3
    code, headers, text = _infer(url, timeout_s=30)
    if code == 503:  # not the misleading "at capacity": the answer says why, and when to retry
        assert "at capacity" not in text and "restart" in text, text
        assert int(headers.get("Retry-After", "0")) >= 1
    # past the old supervisor's give-up (5 restarts): it keeps trying
    assert _wait_for(lambda: status(run_store)["instances"][0]["restarts"] >= 6, 90)
    flag.unlink()  # the crash is fixed: the next restart stays up
    st = _wait_for(lambda: (s := status(run_store))["state"] == "serving" and s, 60)
    assert st, status(run_store)
    assert _infer(url)[0] == 200
    assert cli("status").exit_code == 0


def test_down_stops_every_process_and_says_how_many(run_store, cli, tmp_path, leftovers):
    plan_file = tmp_path / "plan.json"
    write_plan_file(_plan(), plan_file)
    r = cli("apply", plan_file, "--loader", NOOP)
    assert r.exit_code == 0, r.output
    assert len(leftovers()) == 4
    r = cli("down")
    assert r.exit_code == 0 and "Stopped 4 process(es)" in r.output, r.output
    assert leftovers() == []


def test_a_dispatcher_running_before_the_upgrade_is_still_stopped(run_store, tmp_path):
    """The migration adds the supervisor's columns; a dispatcher recorded before it (no
    supervisor, no pair file) is stopped by ``down`` as before."""
    import sqlite_utils
    from greenctl.data import deployments
    from greenctl.data.migrations import m0040_executor_state, m0096_supervision
    from greenctl.executor.deploy.apply import down

    db = sqlite_utils.Database(memory=True)
    m0040_executor_state.up(db)
    db["executor_dispatcher"].insert({"id": 1, "pid": 1, "state": "running", "port": 9})
    m0096_supervision.up(db)
    m0096_supervision.up(db)  # idempotent
    cols = db["executor_dispatcher"].columns_dict
    assert {"supervisor_pid", "supervisor_pid_start", "pair_file"} <= set(cols)
    assert db["executor_dispatcher"].get(1)["supervisor_pid"] is None

    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    from greenctl.executor.runtime.procs import proc_start_ticks

    with run_store.transaction():  # as a greenctl before the supervisor recorded it
        row_id = deployments.journal_dispatcher(
            run_store,
            {"host": "127.0.0.1", "port": 9, "pid": old.pid,
             "pid_start": proc_start_ticks(old.pid),
             "state_file": str(tmp_path / "none.json"), "log_file": str(tmp_path / "none.log")},
        )  # fmt: skip
        deployments.commit_dispatcher(run_store, row_id, plan_id=None)
    doc = down(run_store)
    assert {"dispatcher": doc["stopped"][0]["dispatcher"], "pid": old.pid} == doc["stopped"][0]
    assert old.wait(10) is not None


def test_kill_session_kills_a_session_and_what_it_forked_only():
    from greenctl.executor.runtime.procs import is_alive, kill_session

    outside = subprocess.Popen(["sleep", "60"])
    leader = subprocess.Popen(["bash", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        children = Path(f"/proc/{leader.pid}/task/{leader.pid}/children")
        deadline = time.monotonic() + 10
        while len(children.read_text().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # bash has forked both sleeps
        killed = kill_session(leader.pid)
        assert leader.pid in killed and len(killed) == 3, killed
        assert leader.wait(timeout=10) == -signal.SIGKILL
        assert is_alive(outside.pid)
    finally:
        outside.kill()
        outside.wait()
