"""Shared fixtures: every test gets a fresh store under tmp_path."""

from __future__ import annotations

import contextlib
import os
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A loopback TCP port nothing listens on now: bound to port 0, read, released.

    The one helper every test module uses to pick a port (``from tests.conftest import
    free_port``); another program may take the port before the caller binds it.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def processes_of(text: str | Path) -> list[int]:
    """The processes (other than this one) whose command line (arguments joined by spaces)
    names ``text``: the daemons a test started with their files in its folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                if str(text) in argv.decode(errors="replace"):
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def listening_port() -> Iterator[int]:
    """A loopback port another program listens on while the block runs (what a command
    asked to bind it must refuse, or a probe must find open)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        yield int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _isolated_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point GREENCTL_DB at a per-test file so no test touches the user's store."""
    db = tmp_path / "greenctl.db"
    monkeypatch.setenv("GREENCTL_DB", str(db))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    return db


@pytest.fixture
def db_path(_isolated_store: Path) -> Path:
    return _isolated_store


@pytest.fixture
def store(db_path: Path):
    from greenctl.data.store import open_store

    s = open_store(db_path)
    yield s
    s.close()


@pytest.fixture
def cli():
    """Invoke the greenctl app in-process: ``cli("profile", "list")`` -> click Result."""
    from greenctl.cli.main import app

    runner = CliRunner()

    def invoke(*args: str, input: str | None = None):
        return runner.invoke(app, [str(a) for a in args], input=input, catch_exceptions=False)

    return invoke


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding a 40k-parameter Llama with random weights and its word-level
    tokenizer, made here (nothing downloaded): the LLM tests' model."""
    pytest.importorskip("transformers")
    from greenctl.profiler.llm_models import random_llama

    folder = tmp_path_factory.mktemp("tiny-llama")
    random_llama(folder, "tiny")
    return folder


@pytest.fixture
def gpulet(store):
    """The test's store with gpulet's bundled measurements (profiles, utilisation) and an
    interference model fitted on it: what `plan glet` plans with."""
    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.executor.control.interference import fit_and_store

    import_gpulet(store, "bundled:gpulet")
    fit_and_store(store, source="test")
    return store


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("GREENCTL_TEST", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules holding a ``slow`` test first, then the others by number of tests, most first.

    pytest-xdist (``--dist loadscope --no-loadscope-reorder``, set in pyproject.toml) hands
    whole modules to its workers in this order: a minute-long module handed out last would
    run alone at the end while the other workers idle; started first, it overlaps the many
    short ones. The order within a module is kept.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    count = Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in slow, -count[item.path]))  # stable sort
