"""What `status` and the replanning decision records say agrees with what happened, the same
on every backend: `status` exits 1 unless a plan serves; a `keep` that re-applied the running
configuration at a new intensity records it applied (and names the plan), one that did not
says nothing was; no reason says one clause twice; and a `replan` refused for a bad option
writes nothing (no decision row, no plan, no lock file).

Real processes where it matters: a dispatcher and a no-op executor started by
``apply_plan``, `greenctl` through typer's runner. The CISO trace (Clover), hourly from
2021-03-01T00:00Z: 124.57, 135.6, 148.61, 166.42, 240.4, 291.63, 295.64, 302.89 ... g/kWh.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from greenctl.data import carbon_io
from greenctl.data.plan import write_plan_file
from greenctl.data.records import Profile, Variant
from greenctl.executor.control import replan as replan_mod

from tests.conftest import free_port

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)

OPTS = {"loader": "greenctl.executor.runtime.daemon:noop_loader", "cores": [0]}
T = "2021-03-01T{:02d}:{:02d}:00Z"


def _tiny(store: Any, *, builtin: bool = False) -> int:
    """The tiny family (modeled CPU profiles), the CISO trace and a plan of one tiny-l on
    cpu:1 made at 00:00 (124.57 g/kWh): the best configuration until 10:00 (``builtin``:
    the built-in variants, which Ray's replicas load, at these accuracies)."""
    from dataclasses import replace

    from greenctl.executor.kinds import get_kind
    from greenctl.profiler.models import builtin_variant

    for name, acc in (("tiny-s", 0.70), ("tiny-m", 0.76), ("tiny-l", 0.80)):
        plain = Variant(name, "tiny", accuracy=acc, input_shape="3,32,32")
        store.upsert_variant(replace(builtin_variant(name), accuracy=acc) if builtin else plain)
    rows = []
    for name, thr, e, lat in (("tiny-s", 400, 0.05, 3), ("tiny-m", 150, 0.2, 8),
                              ("tiny-l", 60, 0.6, 20)):  # fmt: skip
        rows.append(
            Profile(name, "cpu:1", 1, thr, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                    latency_p99_ms=2 * lat, power_w=10.0, idle_power_w=5.0, energy_j=e,
                    energy_method="modeled", capacity_rps=thr * 0.8, capacity_slo_ms=100,
                    cost_per_hour=0.05, source="synthetic")
        )  # fmt: skip
    store.add_profiles(rows)
    carbon_io.import_bundled(store, "clover-ciso-march")
    request = {"model": "tiny", "rate_rps": 20, "slo_ms": 100, "budgets": {"cpu": 1},
               "carbon_intensity": 124.57, "gamma": 0.5}  # fmt: skip
    plan, _ = get_kind("mix").plan(store, request)
    plan.extra["carbon_region"] = "CISO"
    return int(store.save_plan(plan))


def _clauses(reason: str) -> list[str]:
    """A reason's clauses: the parts between ``;``, ``(`` and ``)``."""
    return [c.strip() for c in re.split(r"[;()]", reason) if c.strip()]


def _says_what_happened(d: dict[str, Any]) -> None:
    """A decision's action, ``applied`` and reason agree, and no clause is said twice."""
    reason = d["reason"]
    clauses = _clauses(reason)
    assert len(clauses) == len(set(clauses)), reason
    if re.search(r"\bapplied (plan|the best plan)\b", reason):
        assert d["applied"], d
    if d["applied"]:
        assert d["action"] in ("apply", "keep") and d["new_plan_id"] is not None, d
    if d["applied"] and d["action"] == "keep":  # no change of plan: the reason names it
        assert f"applied plan {d['new_plan_id']}," in reason, d
    assert (d["action"] == "apply") <= bool(d["applied"]), d


def _rows(store: Any, table: str) -> list[dict[str, Any]]:
    return list(store.db.table(table).rows)


# -- decision records ------------------------------------------------------------------------
def test_a_keep_that_applied_says_so_and_one_that_did_not_says_nothing_was(run_store):
    """Local backend, real processes: the running configuration re-applied at 05:00's
    intensity is a ``keep`` recorded applied, naming the plan that serves now; the next
    round measures from the lineage's own reference and knows that plan as the running
    configuration; without ``--apply`` nothing is applied and the record says so."""
    from greenctl.executor.deploy.apply import apply_plan, status

    store = run_store
    pid = _tiny(store)
    apply_plan(store.get_plan(pid), store=store, **OPTS)

    def replan(hour: int, minute: int = 0, **kw: Any) -> dict[str, Any]:
        return replan_mod.replan_once(
            store, plan=str(pid), at=T.format(hour, minute), region="CISO", threshold=0.1, **kw
        )

    d = replan(5, apply=True, apply_options=OPTS)
    assert d["action"] == "keep" and d["applied"] is True, d
    serving = status(store)["dispatcher"]["plan_id"]
    assert d["new_plan_id"] == serving != pid
    assert f"applied plan {serving}," in d["reason"]
    assert "counts carbon at 291.63 g/kWh from now on (was 124.57 g/kWh)" in d["reason"]
    _says_what_happened(d)
    (row,) = [r for r in _rows(store, "decisions") if r["id"] == d["id"]]
    assert (row["action"], row["applied"], row["new_plan_id"]) == ("keep", 1, serving)

    d = replan(6, apply=True, apply_options=OPTS)  # no change of plan: the reference stays
    assert d["reference_g_per_kwh"] == pytest.approx(124.57)
    assert d["running_plan_id"] == serving and d["action"] == "keep"
    _says_what_happened(d)

    d = replan(7)  # without --apply: nothing is applied, and the record says so
    assert d["action"] == "keep" and d["applied"] is False and d["new_plan_id"] is None
    assert "applied" not in d["reason"]
    _says_what_happened(d)

    # 10:00: another configuration is best, applied; 10:20 with three times the load it
    # carries, the dwell yields to the overload and says it once
    d = replan(10, apply=True, apply_options=OPTS)
    assert d["action"] == "apply" and d["applied"] is True
    _says_what_happened(d)
    applied: list[int] = []

    def record_apply(plan: Any, *, store: Any, **kw: Any) -> None:
        applied.append(int(plan.id))

    d = replan(10, 20, apply=True, apply_fn=record_apply, min_dwell_s=3600,
               rates={"tiny": 300.0})  # fmt: skip
    assert d["action"] == "apply" and applied == [d["new_plan_id"]], d
    assert "min dwell" in d["reason"] and "cannot carry" in d["reason"]
    assert d["reason"].count("cannot carry") == 1, d["reason"]
    _says_what_happened(d)
    for row in _rows(store, "decisions"):
        _says_what_happened({**row, "applied": bool(row["applied"])})


@pytest.fixture(scope="module")
def ray_cluster(ray_cluster_of) -> Iterator[str]:
    """A local Ray cluster (one head on loopback, no token): its address."""
    with ray_cluster_of(3) as address:
        yield address


@pytest.mark.slow
def test_a_keep_on_ray_records_what_it_applied(ray_cluster, store):
    """The same records on Ray: the running configuration re-applied at a new intensity (its
    group's routes, in place) is a ``keep`` recorded applied, naming the plan that serves."""
    from greenctl.executor.deploy.ray_backend import apply_ray, down_ray, status_ray

    pid = _tiny(store, builtin=True)
    # a region of two close values: the same configuration stays best, its intensity moves
    carbon_io.store_points(
        store,
        [carbon_io.CarbonPoint("NEAR", T.format(h, 0), v) for h, v in ((0, 124.57), (1, 126.0))],
    )
    apply_ray(store.get_plan(pid), store=store, address=ray_cluster, http_port=free_port(),
              timeout_s=180)  # fmt: skip
    try:
        d = replan_mod.replan_once(
            store, plan=str(pid), at=T.format(1, 0), region="NEAR", threshold=0.001, apply=True
        )
        assert d["action"] == "keep" and d["applied"] is True, d
        serving = status_ray(store=store)["plan_id"]
        assert d["new_plan_id"] == serving != pid and d["running_plan_id"] == pid
        _says_what_happened(d)
    finally:
        down_ray(store=store, address=ray_cluster)


# -- a refused replan writes nothing ----------------------------------------------------------
BAD_OPTIONS = {
    "threshold nan": (["--threshold", "nan"], "--threshold"),
    "threshold negative": (["--threshold", "-0.1"], "--threshold"),
    "margin nan": (["--margin", "nan"], "--margin"),
    "margin negative": (["--margin", "-1"], "--margin"),
    "rate of no model": (["--rate", "bert=10"], "bert"),
    "unknown forecaster": (["--forecaster", "nope"], "nope"),
    "time": (["--at", "yesterday"], "--at"),
    "region": (["--region", "NOWHERE"], "NOWHERE"),
}


@pytest.mark.parametrize("case", list(BAD_OPTIONS))
@pytest.mark.parametrize("apply", [False, True], ids=["propose", "apply"])
def test_a_refused_replan_writes_nothing(cli, store, db_path, tmp_path, case, apply):
    """Every option is checked before the round writes: exit 2, one ``Error:`` line naming
    the option, no decision row, no plan saved (not even a plan file's first copy), no lock
    file; for a stored plan and a plan file alike."""
    pid = _tiny(store)
    plan_file = tmp_path / "plan.json"
    plan = store.get_plan(pid)
    plan.id = None
    plan.deployments[0].count += 1  # a configuration the store does not hold yet
    write_plan_file(plan, plan_file)
    args, named = BAD_OPTIONS[case]
    lock = Path(str(db_path) + ".replan.lock")
    for target in (str(pid), str(plan_file)):
        plans = len(_rows(store, "plans"))
        r = cli("replan", "--plan", target, *args, *(["--apply"] if apply else []), "--json")
        assert r.exit_code == 2, r.output
        assert r.stdout == "" and "Traceback" not in r.output
        (line,) = [x for x in r.stderr.splitlines() if x.startswith("Error:")]
        assert named in line, r.stderr
        assert _rows(store, "decisions") == []
        assert len(_rows(store, "plans")) == plans
        assert not lock.exists()


@pytest.mark.parametrize("limit", ["0", "-3"])
def test_a_history_limit_under_1_is_refused(cli, store, limit):
    r = cli("replan", "--history", "--limit", limit, "--json")
    assert r.exit_code == 2 and r.stdout == "", r.output
    assert r.stderr.startswith(f"Error: --limit {limit} ")


def test_a_good_replan_still_writes_its_record(cli, store):
    """The control: the same command with good options records its decision."""
    pid = _tiny(store)
    r = cli("replan", "--plan", pid, "--at", T.format(5, 0), "--threshold", "0.1", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    (row,) = _rows(store, "decisions")
    assert row["id"] == d["id"] and row["action"] == d["action"]
    _says_what_happened(d)


# -- status: exit 1 unless a plan serves ------------------------------------------------------
@pytest.mark.parametrize("backend", ["local", "ray"])
@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_status_exits_1_when_nothing_serves(cli, store, backend, json_out):
    r = cli("status", "--backend", backend, *(["--json"] if json_out else []))
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    assert r.stderr.startswith("Error:") and "serv" in r.stderr
    if json_out:  # the document still says what runs: nothing
        assert json.loads(r.stdout)["state"] == "idle"


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_nothing_applied_reads_idle_on_both_backends(cli, store, backend):
    """The status document of nothing applied is the same shape on both backends."""
    doc = json.loads(cli("status", "--backend", backend, "--json").stdout)
    assert (doc["backend"], doc["state"], doc["instances"]) == (backend, "idle", [])
    assert doc["problems"] == [] and doc["dispatcher"] is None


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_status_exits_0_while_serving(cli, run_store, loaders, json_out):
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.deploy.apply import apply_plan, down

    plan = Plan(kind="mix", deployments=[Deployment("m", "v", "cpu:1", count=1, batch=2)])
    apply_plan(plan, store=run_store, loader=loaders["noop"])
    extra = ["--json"] if json_out else []
    r = cli("status", *extra)
    assert r.exit_code == 0, r.output
    if json_out:
        assert json.loads(r.stdout)["state"] == "serving"
    else:
        assert "Dispatcher:" in r.stdout
    down(run_store, wait=True)  # (after it: test_status_exits_1_when_nothing_serves)
