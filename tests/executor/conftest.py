"""Fixtures for executor tests: every daemon a test starts is stopped when it ends."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NOOP = "greenctl.executor.runtime.daemon:noop_loader"
BROKEN = f"{HERE / 'exec_loaders.py'}:broken_loader"


def _pids_mentioning(text: str) -> list[int]:
    """Processes whose command line names ``text`` (the test's own state dir)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="session")
def pids_mentioning():
    """A function listing the processes whose command line names a given text."""
    return _pids_mentioning


@pytest.fixture
def run_store(store, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The test's store; at teardown ``down`` runs and any daemon left over is killed."""
    state_dir = tmp_path / "state"
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(state_dir))
    monkeypatch.setenv("GREENCTL_NOOP_SERVICE_MS", "0")
    yield store
    from greenctl.executor.deploy.apply import down

    with contextlib.suppress(Exception):
        down(store, wait=True)
    for pid in _pids_mentioning(str(state_dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def leftovers(tmp_path: Path):
    """A function listing this test's daemons that still run."""
    from greenctl.executor.runtime.procs import is_alive

    def alive() -> list[int]:
        return [p for p in _pids_mentioning(str(tmp_path / "state")) if is_alive(p)]

    return alive


@pytest.fixture
def loaders() -> dict[str, str]:
    """Loader specs for the daemons: a no-op model and one that fails for ``broken*``."""
    return {"noop": NOOP, "broken": BROKEN}
