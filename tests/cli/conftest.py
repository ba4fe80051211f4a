"""Fixtures of the command-line tests."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import processes_of


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_path: Path) -> Iterator[Path]:
    """A private state dir; any process of it that survives the test is stopped (``down``)
    or killed."""
    d = tmp_path / "state"
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(d))
    yield d
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import down

    with contextlib.suppress(Exception), open_store(db_path) as store:
        down(store)
    for pid in processes_of(d):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
