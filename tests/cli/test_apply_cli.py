"""CLI of apply/status/down/loadgen: JSON contracts, errors, and one real run with a no-op model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data.plan import Deployment, Plan, write_plan_file

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    plan = Plan(
        kind="mix",
        deployments=[
            Deployment(model="m", variant="v1", resource="cpu:1", count=1, batch=2, quota_rps=20.0)
        ],
        predicted={"rate_rps": 20.0, "p95_ms": 10.0},
    )
    path = tmp_path / "plan.json"
    write_plan_file(plan, path)
    return path


def test_dry_run_json(cli, plan_file, state_dir):
    r = cli("apply", plan_file, "--dry-run", "--json", "--loader", NOOP)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["dry_run"] and doc["changed"]
    assert [a["action"] for a in doc["actions"]] == [
        "start-dispatcher",
        "start-executor",
        "switch-routes",
    ]
    r = cli("status", "--json")
    assert r.exit_code == 1  # nothing applied: nothing serves
    assert "nothing is applied" in r.stderr
    assert json.loads(r.stdout) == {
        "backend": "local",  # nothing applied: the local backend answers
        "state": "idle",
        "problems": [],
        "dispatcher": None,
        "instances": [],
        "restarts": 0,
        "last_apply": None,
        "apply_running": False,
        "recovered": [],
    }


def test_bad_inputs_exit_2(cli, tmp_path, state_dir):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "greenctl.plan/v1", "kind": "mix", "deployments": [{"model": "m"}]}')
    r = cli("apply", bad)
    assert r.exit_code == 2 and "deployments[0].variant" in r.output
    r = cli("loadgen", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--duration", "1")
    assert r.exit_code == 2 and "--rate" in r.output
    r = cli(
        "loadgen", "--endpoint", "http://127.0.0.1:9", "--model", "m", "--rate", "5", "--trace", bad
    )
    assert r.exit_code == 2


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--host", "", "--host is empty"),
        ("--verify-duration", "-1", "--verify-duration must be >= 0"),
        ("--verify-duration", "nan", "--verify-duration must be a finite number"),
        ("--ray-http-port", "-1", "--ray-http-port must be >= 1"),
    ],
)
def test_apply_option_values_are_refused_even_in_a_dry_run(cli, plan_file, state_dir, store,
                                                           option, value, says):  # fmt: skip
    before = store.db.execute("select count(*) from executor_apply_history").fetchone()
    r = cli("apply", plan_file, "--dry-run", "--loader", NOOP, option, value)
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output, r.output
    assert store.db.execute("select count(*) from executor_apply_history").fetchone() == before


def test_apply_status_loadgen_verify_down(cli, plan_file, state_dir, store):
    from greenctl.executor.runtime.procs import is_alive

    r = cli("apply", plan_file, "--loader", NOOP, "--verify", "--verify-duration", "1", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["verify"]["measured"]["sent"] > 5 and doc["verify"]["measured"]["errors"] == 0
    runs = list(store.db.table("runs").rows_where("kind = ?", ["verify"]))
    assert len(runs) == 1 and json.loads(runs[0]["predicted"])["p95_ms"] == 10.0
    assert json.loads(runs[0]["measured"])["p95_ms"] is not None
    # where the time went, from the executor's own timing headers, for every answer
    parts = doc["verify"]["measured"]["breakdown"]
    assert parts["timed"] == doc["verify"]["measured"]["sent"]
    assert 0 <= parts["queue_ms"]["p50"] <= parts["queue_ms"]["p95"]
    assert parts["outside_ms"]["p50"] > 0 and parts["run_ms"]["p50"] >= 0
    assert parts["queue_ms"]["p50"] + parts["run_ms"]["p50"] + parts["outside_ms"]["p50"] == (
        pytest.approx(doc["verify"]["measured"]["p50_ms"], rel=0.5)
    )

    r = cli("status", "--json")
    st = json.loads(r.stdout)
    url = st["dispatcher"]["url"]
    assert url.startswith("http://127.0.0.1:")
    (inst,) = st["instances"]
    assert {"variant", "resource", "pid", "port", "ready", "requests", "p95_ms"} <= set(inst)
    assert inst["ready"] and inst["requests"] >= 5

    r = cli(
        "loadgen", "--endpoint", url, "--model", "m", "--rate", "30", "--duration", "1", "--json"
    )
    assert r.exit_code == 0, r.output
    load = json.loads(r.stdout)
    assert load["ok"] == load["sent"] > 0 and load["rejected_503"] == 0
    # the executor's Greenctl-Batch-Rows, via the dispatcher: 1 row per batch on an idle
    # machine, up to the plan's batch of 2 when a busy one (parallel test workers) bunches
    # arrivals within the executor's batch wait
    assert 1.0 <= load["mean_batch_rows"] <= 2.0
    assert load["breakdown"]["timed"] == load["ok"]
    r = cli("loadgen", "--endpoint", url, "--model", "m", "--rate", "30", "--duration", "0.5")
    assert r.exit_code == 0, r.output
    assert "Where the time went" in r.output and "executor queue" in r.output

    r = cli("apply", plan_file, "--loader", NOOP)
    assert r.exit_code == 0 and "already running" in r.output
    # --verify on the running plan changes nothing and still measures it
    r = cli("apply", plan_file, "--loader", NOOP, "--verify", "--verify-duration", "0.5", "--json")
    again = json.loads(r.stdout)
    assert not again["changed"] and again["verify"]["measured"]["sent"] > 0
    assert store.db.table("runs").count_where("kind = ?", ["verify"]) == 2

    r = cli("status")
    assert r.exit_code == 0 and url in r.output and "State: serving" in r.output
    r = cli("down")
    assert r.exit_code == 0 and "Stopped 3" in r.output  # supervisor, dispatcher, executor
    assert not is_alive(inst["pid"]) and not is_alive(st["dispatcher"]["pid"])


# -- refused plans (issue 16): exit 2 naming the field, nothing started, store as it was -------
def _write(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps(doc))
    return path


def _refused_untouched(cli, store, args, *needles):
    before = list(store.db.conn.iterdump())
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    for needle in needles:
        assert needle in r.output, r.output
    assert list(store.db.conn.iterdump()) == before
    status = json.loads(cli("status", "--json").stdout)
    assert status["instances"] == [] and status["dispatcher"] is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(request="fast"), "'request' must be a JSON object"),
        (lambda d: d.update(deployments="v1"), "'deployments' must be a list"),
        (lambda d: d["deployments"].__setitem__(0, "v1"), "'deployments[0]' must be a JSON"),
        (lambda d: d["deployments"][0].update(count="two"), "'deployments[0].count'"),
        (lambda d: d["deployments"][0].update(batch=1.5), "'deployments[0].batch'"),
        (lambda d: d["deployments"][0].update(count=0), "'deployments[0].count'"),
        (lambda d: d["deployments"][0].update(count=1_000_000), "'deployments[0].count'"),
        (lambda d: d["deployments"][0].update(quota_rps=float("nan")), "'deployments[0].quota"),
        (lambda d: d.update(dispatcher="here"), "'dispatcher' must be a JSON object"),
        (lambda d: d.update(gpus=[None]), "'gpus[0]' must be a JSON object"),
    ],
)
def test_apply_refuses_wrong_field_types(cli, store, plan_file, tmp_path, state_dir, change, field):
    doc = json.loads(plan_file.read_text())
    change(doc)
    bad = _write(tmp_path, doc)
    _refused_untouched(cli, store, ("apply", bad, "--loader", NOOP), str(bad), field)


def test_apply_refuses_a_resource_kind_it_cannot_run(cli, store, plan_file, tmp_path, state_dir):
    doc = json.loads(plan_file.read_text())
    doc["deployments"].append(dict(doc["deployments"][0], resource="quantum:7"))
    bad = _write(tmp_path, doc)
    _refused_untouched(
        cli, store, ("apply", bad, "--loader", NOOP), "deployments[1].resource", "quantum:7"
    )


def test_apply_refuses_a_model_that_is_not_the_variants_family(cli, store, tmp_path, state_dir):
    plan = Plan(kind="mix", deployments=[Deployment("resnet", "tiny-s", "cpu:1", quota_rps=5.0)])
    path = tmp_path / "p.json"
    write_plan_file(plan, path)
    _refused_untouched(
        cli, store, ("apply", path, "--dry-run"), "deployments[0].model is 'resnet'", "'tiny'"
    )
