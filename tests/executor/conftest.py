"""Fixtures for executor tests: every daemon a test starts is stopped when it ends."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import free_port, processes_of

HERE = Path(__file__).resolve().parent
NOOP = "greenctl.executor.runtime.daemon:noop_loader"
BROKEN = f"{HERE / 'exec_loaders.py'}:broken_loader"


@pytest.fixture(scope="session")
def pids_mentioning():
    """A function listing the processes whose command line names a given text."""
    return processes_of


@pytest.fixture
def resnet(store):
    """InfAdapter's ResNet CPU profiles (third-party measurements) in the test store, as
    ``bench/infadapter_import.py`` converts them."""
    import importlib.util

    from greenctl.data.bundled import path_of

    bench = Path(__file__).resolve().parents[2] / "bench" / "infadapter_import.py"
    spec = importlib.util.spec_from_file_location("infadapter_import", bench)
    assert spec is not None and spec.loader is not None
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    conv.load_into_store(store, path_of("infadapter"))
    return store


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
    for pid in processes_of(str(state_dir)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def leftovers(tmp_path: Path):
    """A function listing this test's daemons that still run."""
    from greenctl.executor.runtime.procs import is_alive

    def alive() -> list[int]:
        return [p for p in processes_of(str(tmp_path / "state")) if is_alive(p)]

    return alive


@pytest.fixture
def loaders() -> dict[str, str]:
    """Loader specs for the daemons: a no-op model and one that fails for ``broken*``."""
    return {"noop": NOOP, "broken": BROKEN}


# -- Ray test clusters ------------------------------------------------------------------------
#: a local test cluster without token auth (a stale ~/.ray/auth_token would make a join fail)
RAY_SETTINGS = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
}


def _start_node(cmd: list[str]) -> int:
    """Run ``ray start ...`` in a session of its own: the session id (its processes' group)."""
    proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    _, err = proc.communicate(timeout=180)
    if proc.returncode != 0:
        _stop_session(proc.pid)
        raise AssertionError(f"ray start failed: {err.decode(errors='replace')[-2000:]}")
    return proc.pid


def _stop_session(sid: int) -> None:
    """Kill the processes of session ``sid`` (`ray stop` would stop every Ray cluster on the
    machine)."""
    from greenctl.executor.runtime.procs import kill_session

    kill_session(sid)


@contextlib.contextmanager
def _ray_cluster(
    num_cpus: int, *, resources: dict[str, float] | None = None, worker_cpus: int | None = None
) -> Iterator[str]:
    """A Ray cluster on loopback (a head, and a worker node when ``worker_cpus``), every port
    chosen free so that clusters of modules running side by side never meet: its address."""
    ray = pytest.importorskip("ray")
    ray_bin = shutil.which("ray")
    if ray_bin is None:
        pytest.skip("the ray command is not installed")
    saved = {k: os.environ.get(k) for k in RAY_SETTINGS}
    os.environ.update(RAY_SETTINGS)
    common = ["--object-store-memory", str(80 * 1024 * 1024), "--disable-usage-stats",
              "--node-ip-address", "127.0.0.1"]  # fmt: skip
    gcs, client, dashboard, agent = (free_port() for _ in range(4))
    head = [ray_bin, "start", "--head", "--port", str(gcs), "--num-cpus", str(num_cpus),
            "--ray-client-server-port", str(client), "--dashboard-port", str(dashboard),
            "--dashboard-agent-listen-port", str(agent), "--include-dashboard", "false",
            *(["--resources", json.dumps(resources)] if resources else []), *common]  # fmt: skip
    sessions = [_start_node(head)]
    address = f"127.0.0.1:{gcs}"
    try:
        if worker_cpus:
            sessions.append(_start_node([
                ray_bin, "start", "--address", address, "--num-cpus", str(worker_cpus),
                "--dashboard-agent-listen-port", str(free_port()), *common]))  # fmt: skip
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for sid in reversed(sessions):
            _stop_session(sid)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def ray_cluster_of() -> Callable[..., contextlib.AbstractContextManager[str]]:
    """``with ray_cluster_of(num_cpus, resources=..., worker_cpus=...) as address``: a
    module's own Ray test cluster (skips where ray is not installed)."""
    return _ray_cluster
