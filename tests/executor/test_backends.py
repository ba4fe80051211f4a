"""Backends behind one interface: the backend that runs a plan is recorded when it is applied,
and `status`, `down` and `replan --apply` ask it (local daemons here; Ray against a real
cluster in test_ray_backend.py)."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest
from greenctl.data import carbon_io, deployments
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan, write_plan_file
from greenctl.data.records import Profile, Variant
from greenctl.executor.control import replan
from greenctl.executor.deploy import backends, ray_backend

from tests.conftest import free_port

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"


def test_the_backend_is_picked_in_one_place(store):
    assert isinstance(backends.get_backend("local"), backends.LocalBackend)
    with pytest.raises(InputError, match="'k8s' is not known") as err:
        backends.get_backend("k8s")
    assert "export k8s" in (err.value.hint or "")
    # nothing recorded: local
    assert backends.backend_for(store).name == "local"
    # an address is a Ray cluster's: the local backend refuses it rather than ignore it
    for name in ("local", None):
        with pytest.raises(InputError, match=r"--address 10\.0\.0\.1:6379 names a Ray cluster"):
            backends.backend_for(store, name, address="10.0.0.1:6379")
    assert backends.recorded_backend(store) is None
    # a Ray apply recorded: Ray at its address, with the options it was applied with
    with store.transaction():
        deployments.record_backend(
            store, "ray", plan_id=3, address="127.0.0.1:1", options={"http_port": 8123}
        )
    b = backends.backend_for(store)
    assert (b.name, b.address, b.options) == ("ray", "127.0.0.1:1", {"http_port": 8123})
    assert backends.backend_for(store, "local").name == "local"  # a name wins
    # the same record again adds nothing; taken down: local again, Ray the last one used
    with store.transaction():
        deployments.record_backend(
            store, "ray", plan_id=3, address="127.0.0.1:1", options={"http_port": 8123}
        )
        deployments.stop_backend(store, "ray")
    assert len(list(store.db.table("backend_applies").rows)) == 1
    assert backends.backend_for(store).name == "local"
    last = backends.recorded_backend(store, running_only=False)
    assert last is not None and last.name == "ray"


def test_a_backend_takes_its_own_options_and_refuses_unknown_ones(store):
    local = backends.get_backend("local", options={"host": "127.0.0.1", "port": None})
    own = backends._own(local, {"http_port": 9000, "loader": NOOP})  # Ray's is left out
    assert own == {"host": "127.0.0.1", "port": None, "loader": NOOP}
    with pytest.raises(TypeError, match="no backend takes the option"):
        backends._own(local, {"nonsense": 1})


@pytest.fixture
def plan_file(tmp_path):
    plan = Plan(
        kind="mix",
        deployments=[Deployment("m", "v1", "cpu:1", count=1, batch=2, quota_rps=20.0)],
        predicted={"rate_rps": 20.0, "p95_ms": 10.0},
    )
    path = tmp_path / "plan.json"
    write_plan_file(plan, path)
    return path


def test_a_local_apply_records_its_backend_and_down_clears_it(cli, run_store, plan_file):
    r = cli("apply", plan_file, "--dry-run", "--loader", NOOP, "--json")
    assert r.exit_code == 0, r.output
    assert deployments.running_backend(run_store) is None  # a dry run records nothing
    r = cli("apply", plan_file, "--loader", NOOP, "--json")
    assert r.exit_code == 0, r.output
    plan_id = json.loads(r.stdout)["plan_id"]
    rec = deployments.running_backend(run_store)
    assert rec is not None and rec["backend"] == "local" and rec["plan_id"] == plan_id
    # what `replan --apply` applies again with: the address and the loader (not the default)
    assert rec["options"] == {"host": "127.0.0.1", "port": None, "loader": NOOP}
    # status and down without --backend ask the backend that runs the plan
    doc = json.loads(cli("status", "--json").stdout)
    assert doc["backend"] == "local" and doc["dispatcher"]["plan_id"] == plan_id
    serving = backends.serving(run_store)
    assert serving.live and serving.plan_id == plan_id and serving.backend == "local"
    # applying the running plan again changes nothing, and records nothing new
    r = cli("apply", plan_file, "--loader", NOOP, "--json")
    assert r.exit_code == 0 and not json.loads(r.stdout)["changed"]
    assert run_store.db.table("backend_applies").count == 1
    down = json.loads(cli("down", "--json").stdout)
    assert down["backend"] == "local" and down["stopped"]
    assert deployments.running_backend(run_store) is None
    last = deployments.last_backend(run_store)
    assert last is not None and last["state"] == "stopped"
    assert not backends.serving(run_store).live


@pytest.fixture
def no_ray_init(monkeypatch):
    def refuse():
        raise AssertionError("ray.init reached with an unreachable address")

    monkeypatch.setattr(ray_backend, "_ray", refuse)


def test_status_and_down_ask_the_recorded_ray_cluster(cli, store, no_ray_init):
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with store.transaction():
        deployments.record_ray_app(
            store, plan_id=1, address=address, app="greenctl-p1-x", url="http://127.0.0.1:1"
        )
        deployments.record_backend(store, "ray", plan_id=1, address=address)
    for args in (("status",), ("status", "--json"), ("down",)):
        r = cli(*args)
        assert r.exit_code == 1, r.output
        assert f"no Ray cluster answers at {address}" in r.stderr
    serving = backends.serving(store)
    assert not serving.live and serving.backend == "ray"
    assert "does not answer" in (serving.why or "")
    # the local backend is still there when asked by name
    doc = json.loads(cli("status", "--backend", "local", "--json").stdout)
    assert doc["backend"] == "local" and doc["dispatcher"] is None


# -- replan --apply switches the plan on whichever backend runs it ------------------------------
class FakeBackend:
    """A backend that records what it was asked (registered for one test)."""

    name = "fake"
    option_names = frozenset({"knob"})
    applied: ClassVar[list[tuple[int | None, str | None, dict]]] = []
    live = True

    def __init__(self, address=None, options=None):
        self.address = address
        self.options = dict(options or {})

    def apply(self, plan, *, store, dry_run=False, verify=False, verify_duration_s=10.0,
              policy=None, **options):  # fmt: skip
        own = backends._own(self, options)
        FakeBackend.applied.append((plan.id, self.address, own))
        FakeBackend.live = True
        with store.transaction():
            deployments.record_backend(
                store, "fake", plan_id=plan.id, address=self.address, options=own
            )
        return plan

    def status(self, store):
        return {"backend": "fake"}

    def down(self, store, **options):
        FakeBackend.live = False
        with store.transaction():
            deployments.stop_backend(store, "fake")
        return {"backend": "fake"}

    def serving(self, store):
        rec = deployments.last_backend(store)
        plan_id = rec["plan_id"] if rec and FakeBackend.live else None
        why = None if FakeBackend.live else "the fake cluster was taken down"
        return backends.Serving("fake", FakeBackend.live, plan_id, why)


@pytest.fixture
def tiny_on_fake(store, monkeypatch):
    """The tiny family (modeled profiles), the CISO trace, a mix plan, and that plan running
    on the fake backend at `far-away:1` (applied with knob=7)."""
    from greenctl.executor.kinds import get_kind

    for name, acc in (("tiny-s", 0.70), ("tiny-m", 0.76), ("tiny-l", 0.80)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc, load_time_s=1.0))
    rows = []
    for name, thr, e, lat in (("tiny-s", 400, 0.05, 3), ("tiny-m", 150, 0.2, 8),
                              ("tiny-l", 60, 0.6, 20)):  # fmt: skip
        for c in (1, 2):
            rows.append(
                Profile(
                    name, f"cpu:{c}", 1, thr * c, latency_p50_ms=lat / c,
                    latency_p95_ms=1.5 * lat / c, latency_p99_ms=2 * lat / c, power_w=10 * c,
                    energy_j=e, energy_method="modeled", capacity_rps=thr * c * 0.8,
                    capacity_slo_ms=100, cost_per_hour=0.05 * c, source="synthetic",
                )
            )  # fmt: skip
    store.add_profiles(rows)
    carbon_io.import_bundled(store, "clover-ciso-march")
    request = {"model": "tiny", "rate_rps": 50, "slo_ms": 100, "budgets": {"cpu": 2},
               "carbon_intensity": 124.57, "gamma": 0.5}  # fmt: skip
    plan, _ = get_kind("mix").plan(store, request)
    plan.extra["carbon_region"] = "CISO"
    pid = store.save_plan(plan)
    monkeypatch.setitem(backends.BACKENDS, "fake", FakeBackend)
    monkeypatch.setattr(FakeBackend, "applied", [])
    monkeypatch.setattr(FakeBackend, "live", True)
    with store.transaction():
        deployments.record_backend(store, "fake", plan_id=pid, address="far-away:1",
                                   options={"knob": 7})  # fmt: skip
    return store, pid


def test_replan_apply_switches_the_plan_on_the_backend_that_runs_it(tiny_on_fake):
    store, pid = tiny_on_fake
    # 05:00: 291.6 g/kWh, more than twice the planned signal: a better plan is applied there
    d = replan.replan_once(
        store, plan=str(pid), at="2021-03-01T05:00:00Z", region="CISO", apply=True,
        apply_options={"loader": NOOP},  # a local option: the fake backend leaves it out
    )  # fmt: skip
    assert d["action"] == "apply" and d["running_plan_id"] == pid, d["reason"]
    assert FakeBackend.applied == [(d["new_plan_id"], "far-away:1", {"knob": 7})]
    assert deployments.running_dispatcher(store) is None  # nothing started here
    assert backends.serving(store).plan_id == d["new_plan_id"]


def test_replan_apply_recovers_on_the_backend_that_ran_the_plan(tiny_on_fake, cli):
    store, pid = tiny_on_fake
    assert json.loads(cli("down", "--json").stdout) == {"backend": "fake"}
    assert deployments.running_backend(store) is None
    d = replan.replan_once(
        store, plan=str(pid), at="2021-03-01T00:30:00Z", region="CISO", apply=True
    )
    assert d["action"] == "apply" and d["running_plan_id"] is None
    assert "nothing is serving (the fake cluster was taken down" in d["reason"]
    assert FakeBackend.applied == [(pid, "far-away:1", {"knob": 7})]
    assert deployments.running_backend(store)["backend"] == "fake"


# -- stores from before backends were recorded -------------------------------------------------
def test_the_migration_records_what_already_serves():
    import sqlite_utils
    from greenctl.data.migrations import m0095_backend_applies as migration

    db = sqlite_utils.Database(memory=True)
    db["executor_dispatcher"].insert(
        {"id": 1, "plan_id": 4, "state": "running", "started_at": "2026-01-02T00:00:00Z"}
    )
    db["ray_apps"].insert(
        {"id": 1, "plan_id": 5, "address": "10.0.0.1:6379", "app": "greenctl-p5-x",
         "url": "http://127.0.0.1:8123", "applied_at": "2026-01-03T00:00:00Z", "active": 1}
    )  # fmt: skip
    migration.up(db)
    rows = list(db["backend_applies"].rows_where(order_by="id"))
    assert [(r["backend"], r["plan_id"], r["state"]) for r in rows] == [
        ("local", 4, "running"),
        ("ray", 5, "running"),  # the newer: what `status` asks first
    ]
    assert json.loads(rows[1]["options"]) == {"http_port": 8123}
    assert rows[1]["address"] == "10.0.0.1:6379"
