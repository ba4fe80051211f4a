"""``apply`` and ``down`` refuse what cannot run before they act: exit 2, one ``Error:`` line
naming the option or file and the fix, no traceback, no process started, no history row and
the store's bytes as they were. A fault that shows only at launch is undone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from greenctl.data.plan import Deployment, Plan, write_plan_file

from tests.conftest import listening_port

pytestmark = pytest.mark.timeout(180)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"


def _plan(tmp_path: Path, name: str = "plan.json", variant: str = "v1", **extra) -> Path:
    plan = Plan(
        kind="mix",
        deployments=[Deployment("m", variant, "cpu:1", count=1, batch=1, quota_rps=10.0)],
        predicted={"rate_rps": 10.0},
        extra=extra,
    )
    path = tmp_path / name
    write_plan_file(plan, path)
    return path


def _files(db: Path) -> dict[str, bytes]:
    """The store's bytes: its file and its write-ahead log."""
    return {p.name: p.read_bytes() for p in (db, Path(f"{db}-wal")) if p.exists()}


def _history(db: Path) -> int:
    from greenctl.data.store import open_store

    with open_store(db) as store:
        if "executor_apply_history" not in store.db.table_names():
            return 0
        return store.db.table("executor_apply_history").count


@pytest.fixture
def seeded(run_store, db_path: Path) -> Iterator[Path]:
    """A store that exists (created and migrated), closed so its bytes settle; what a test
    applied is taken down at the end."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import down

    run_store.close()
    yield db_path
    with open_store(db_path) as store:
        down(store)


@pytest.fixture
def squatter() -> Iterator[int]:
    """A loopback port another program listens on."""
    with listening_port() as port:
        yield port


@pytest.fixture
def refused(cli, seeded: Path, leftovers) -> Callable[..., str]:
    """Run a command that must be refused; check the contract, return its output."""

    def run(*args: object) -> str:
        before, history = _files(seeded), _history(seeded)
        pids = leftovers()
        r = cli(*args)
        out = r.output
        assert r.exit_code == 2, out
        errors = [line for line in out.splitlines() if line.startswith("Error:")]
        assert out.startswith("Error:") and len(errors) == 1, out
        assert "Traceback" not in out, out
        assert leftovers() == pids, out
        assert _files(seeded) == before, out
        assert _history(seeded) == history, out
        if not pids:  # nothing ran before: nothing is recorded as running either
            doc = json.loads(cli("status", "--json").stdout)
            assert doc["instances"] == [] and doc["dispatcher"] is None, doc
        return out

    return run


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--port", "70000"), ("--port must be <= 65535",)),
        (("--port", "-1"), ("--port must be >= 0",)),
        (("--host", "192.0.2.1"), ("--host 192.0.2.1", "address of this machine")),
        (("--host", "no-such-host.invalid"), ("--host no-such-host.invalid",)),
    ],
)
def test_an_address_it_cannot_listen_on(refused, tmp_path, options, says):
    out = refused("apply", _plan(tmp_path), "--loader", NOOP, *options)
    for needle in says:
        assert needle in out, out


def test_a_port_in_use(refused, tmp_path, squatter):
    out = refused("apply", _plan(tmp_path), "--loader", NOOP, "--port", str(squatter))
    assert f"--port {squatter}: cannot bind 127.0.0.1:{squatter}" in out, out
    assert "a free port" in out


def test_a_plan_port_in_use_names_the_plan_field(refused, tmp_path, squatter):
    plan = _plan(tmp_path, dispatcher={"port": squatter})
    out = refused("apply", plan, "--loader", NOOP)
    assert f"the plan's dispatcher.port {squatter}" in out, out


@pytest.mark.skipif(os.geteuid() == 0, reason="root may bind a privileged port")
def test_a_privileged_port(refused, tmp_path):
    out = refused("apply", _plan(tmp_path), "--loader", NOOP, "--port", "80")
    assert "--port 80" in out and "1024 or above" in out, out


@pytest.mark.parametrize(
    ("loader", "says"),
    [
        ("no_such_module_xyz:load", "cannot import loader module 'no_such_module_xyz'"),
        ("just-a-name", "must look like module:function"),
        ("greenctl.executor.runtime.daemon:no_such_fn", "has no function 'no_such_fn'"),
        ("{tmp}/syntax.py:load", "SyntaxError"),
        ("{tmp}/raises.py:load", "RuntimeError: no GPU driver"),
        ("{tmp}/absent.py:load", "No such file"),
    ],
)
def test_a_loader_that_does_not_import(refused, tmp_path, loader, says):
    (tmp_path / "syntax.py").write_text("def load(:\n")
    (tmp_path / "raises.py").write_text("raise RuntimeError('no GPU driver')\n")
    loader = loader.format(tmp=tmp_path)
    out = refused("apply", _plan(tmp_path), "--loader", loader)
    assert out.startswith("Error: --loader: ") and says in out, out


def test_a_bad_loader_is_refused_even_when_the_plan_already_runs(cli, seeded, tmp_path, leftovers):
    plan = _plan(tmp_path)
    assert cli("apply", plan, "--loader", NOOP).exit_code == 0
    pids, before, history = leftovers(), _files(seeded), _history(seeded)
    r = cli("apply", plan, "--loader", "no_such_module_xyz:load")
    assert r.exit_code == 2 and "--loader" in r.output, r.output
    assert leftovers() == pids and _files(seeded) == before and _history(seeded) == history


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (bytes(range(256)) * 4, "not UTF-8"),
        (b"", "invalid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b"variant,resource\nv1,cpu:1\n", "invalid JSON"),
    ],
)
def test_a_file_that_is_not_a_plan(refused, tmp_path, content, says):
    path = tmp_path / "not-a-plan.json"
    path.write_bytes(content)
    out = refused("apply", path, "--loader", NOOP)
    assert "not-a-plan.json" in out and says in out, out


def test_a_plan_without_deployments(refused, tmp_path):
    path = tmp_path / "empty-plan.json"
    path.write_text('{"schema": "greenctl.plan/v1", "kind": "mix"}')
    assert "no deployments" in refused("apply", path, "--loader", NOOP)


def test_a_plan_whose_variants_are_not_in_the_store(refused, tmp_path):
    out = refused("apply", _plan(tmp_path, variant="never-profiled"))
    assert "never-profiled" in out and "greenctl profile" in out, out


def test_a_refusal_leaves_the_running_plan_serving(cli, seeded, tmp_path, leftovers, squatter):
    assert cli("apply", _plan(tmp_path), "--loader", NOOP).exit_code == 0
    serving = json.loads(cli("status", "--json").stdout)
    pids, before, history = leftovers(), _files(seeded), _history(seeded)
    other = _plan(tmp_path, "other.json", variant="v2")
    r = cli("apply", other, "--loader", NOOP, "--port", str(squatter))
    assert r.exit_code == 2 and f"--port {squatter}" in r.output, r.output
    assert leftovers() == pids and _files(seeded) == before and _history(seeded) == history
    now = json.loads(cli("status", "--json").stdout)
    assert now["state"] == "serving"
    assert [i["pid"] for i in now["instances"]] == [i["pid"] for i in serving["instances"]]


def test_a_port_taken_at_launch_is_undone(cli, seeded, tmp_path, leftovers, monkeypatch):
    """The port is taken between the check and the launch: what started is stopped."""
    from greenctl.executor.deploy import apply as apply_module

    monkeypatch.setattr(apply_module, "check_apply", lambda *a, **k: None)
    with listening_port() as port:
        r = cli("apply", _plan(tmp_path), "--loader", NOOP, "--port", str(port))
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert f"cannot bind 127.0.0.1:{port}" in r.output and "undid" in r.output, r.output
    assert leftovers() == []
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["instances"] == [] and doc["dispatcher"] is None


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--backend", "nope"), "--backend 'nope' is not known"),
        (("--backend", "ray", "--address", "bogus"), "--address 'bogus'"),
    ],
)
def test_down_refuses_bad_options(refused, options, says):
    out = refused("down", *options)
    assert says in out, out
