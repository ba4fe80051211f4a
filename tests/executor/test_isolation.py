"""Daemons are isolated from the folder they are started in, and their files are private.

A daemon (executor, dispatcher) runs ``python -P`` in its state folder: a file in the caller's
folder named like a module it imports is never executed, while the user's own loader modules
are still found there because the folder is passed explicitly. The state folder is 0700 and
logs, state files and the store 0600 whatever the umask.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.procs import python_module_argv, spawn_detached, wait_dead
from greenctl.profiler.user_code import CALLER_DIR_ENV

from tests.conftest import processes_of

pytestmark = pytest.mark.timeout(180)

PLANTED = ("httptools", "uvloop", "aiohttp", "numpy", "greenctl", "sitecustomize")


def _plan(batch: int = 2) -> Plan:
    return Plan(
        kind="mix",
        deployments=[Deployment(model="m", variant="v", resource="cpu:1", count=1, batch=batch)],
    )


def _infer(url: str) -> np.ndarray:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    body, headers = oip.encode_request([("input", x)])
    req = urllib.request.Request(f"{url}/v2/models/m/infer", data=body, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return oip.decode_response(resp.read())["output"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _daemon_pids(state_dir: Path) -> list[int]:
    """The greenctl daemons started with their files in ``state_dir``."""
    return [
        pid
        for pid in processes_of(state_dir)
        if b"greenctl.executor." in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]


def test_modules_planted_in_the_callers_folder_are_not_run_by_the_daemons(
    run_store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from greenctl.executor.deploy.apply import apply_plan

    caller = tmp_path / "caller"
    caller.mkdir()
    markers = tmp_path / "markers"
    markers.mkdir()
    for name in PLANTED:  # each would leave a marker, then break the daemon importing it
        (caller / f"{name}.py").write_text(
            f"open({str(markers / name)!r}, 'w').close()\nraise SystemExit('planted {name}')\n"
        )
    # the user's own loader, in the same folder: found there on purpose, and run there
    (caller / "myloader.py").write_text(
        "import os\n"
        "def load(variant, *, device='cpu'):\n"
        f"    open({str(markers / 'loader-cwd')!r}, 'w').write(os.getcwd())\n"
        "    from greenctl.executor.runtime.daemon import noop_loader\n"
        "    return noop_loader(variant, device=device)\n"
    )
    (caller / "weights.txt").write_text("relative files resolve in the caller's folder\n")
    monkeypatch.chdir(caller)
    # an empty PYTHONPATH entry means "the current folder": it must not let them in either
    monkeypatch.setenv("PYTHONPATH", os.pathsep + os.environ.get("PYTHONPATH", ""))

    result = apply_plan(_plan(), store=run_store, loader="myloader:load")
    assert result.dispatcher_url
    assert np.array_equal(_infer(result.dispatcher_url), np.arange(4).reshape(1, 4))
    assert sorted(p.name for p in markers.iterdir()) == ["loader-cwd"]
    assert (markers / "loader-cwd").read_text() == str(caller)

    state_dir = Path(os.environ["GREENCTL_STATE_DIR"])
    pids = _daemon_pids(state_dir)
    assert len(pids) == 3  # the supervisor, the dispatcher and the executor
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert argv[1] == b"-P"
        assert os.readlink(f"/proc/{pid}/cwd") == str(state_dir)  # not the caller's folder
        env = dict(
            line.split(b"=", 1)
            for line in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            if b"=" in line
        )
        assert env[CALLER_DIR_ENV.encode()] == str(caller).encode()
        if b"PYTHONPATH" in env:
            assert b"" not in env[b"PYTHONPATH"].split(os.pathsep.encode())

    # a loader given as a file relative to the caller's folder works too
    result = apply_plan(_plan(batch=3), store=run_store, loader="myloader.py:load")
    assert np.array_equal(_infer(result.dispatcher_url or ""), np.arange(4).reshape(1, 4))
    assert sorted(p.name for p in markers.iterdir()) == ["loader-cwd"]


def test_state_folder_logs_and_store_are_private_whatever_the_umask(run_store, loaders):
    from greenctl.executor.deploy.apply import apply_plan, status

    state_dir = Path(os.environ["GREENCTL_STATE_DIR"])
    state_dir.mkdir()
    state_dir.chmod(0o777)  # as an older greenctl left it under umask 000
    db = Path(run_store.path)
    db.chmod(0o666)
    old = os.umask(0)
    try:
        result = apply_plan(_plan(), store=run_store, loader=loaders["noop"])
        assert result.dispatcher_url
        status(run_store)
    finally:
        os.umask(old)
    assert _mode(state_dir) == 0o700
    files = [p for p in state_dir.iterdir() if p.is_file()]
    assert {p.suffix for p in files} >= {".log", ".json", ".lock"}
    for path in files:
        assert _mode(path) == 0o600, path
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        if path.exists():
            assert _mode(path) == 0o600, path


def test_daemon_command_lines_use_safe_path_and_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    argv = python_module_argv(
        "greenctl.executor.runtime.daemon", "--db", "rel.db", "--state-file=run/x.json",
        "--routes", "/abs/r.json", "--model", "rel",
    )  # fmt: skip
    assert argv == [
        sys.executable, "-P", "-m", "greenctl.executor.runtime.daemon",
        "--db", str(tmp_path / "rel.db"), f"--state-file={tmp_path / 'run/x.json'}",
        "--routes", "/abs/r.json", "--model", "rel",
    ]  # fmt: skip


def test_spawn_detached_runs_in_the_state_folder_with_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    caller = tmp_path / "caller"
    state = tmp_path / "state"
    caller.mkdir()
    state.mkdir()
    monkeypatch.chdir(caller)
    monkeypatch.delenv(CALLER_DIR_ENV, raising=False)
    monkeypatch.setenv("PYTHONPATH", f"{os.pathsep}lib{os.pathsep}/abs/lib")
    keys = ("PYTHONPATH", "GREENCTL_DB", CALLER_DIR_ENV)
    code = (
        "import json, os, sys; print(json.dumps({'cwd': os.getcwd(), 'path': sys.path, "
        f"'env': {{k: os.environ.get(k) for k in {keys!r}}}}}))"
    )
    old = os.umask(0)
    try:
        proc = spawn_detached(
            [sys.executable, "-P", "-c", code],
            env={"GREENCTL_DB": "rel.db"},
            log_file=state / "x.log",
        )
    finally:
        os.umask(old)
    proc.wait(timeout=30)
    doc = json.loads((state / "x.log").read_text())
    assert doc["cwd"] == str(state)
    assert doc["env"] == {
        "PYTHONPATH": f"{caller / 'lib'}{os.pathsep}/abs/lib",
        "GREENCTL_DB": str(caller / "rel.db"),
        CALLER_DIR_ENV: str(caller),
    }
    assert str(caller) not in doc["path"] and str(state) not in doc["path"]
    assert _mode(state / "x.log") == 0o600
    # a daemon restarting another (the supervisor) passes its own caller's folder on
    monkeypatch.setenv(CALLER_DIR_ENV, str(caller))
    monkeypatch.chdir(state)
    proc = spawn_detached(
        [sys.executable, "-P", "-c", code], env={"GREENCTL_DB": "rel.db"}, log_file="y.log"
    )
    proc.wait(timeout=30)
    doc = json.loads((caller / "y.log").read_text())
    assert doc["env"]["GREENCTL_DB"] == str(caller / "rel.db")
    assert wait_dead(proc.pid, 1.0)
