"""`greenctl replan` and `greenctl cron`: threshold, dwell, lock, failures, decisions."""

from __future__ import annotations

import itertools
import json
import os

import pytest
from greenctl.data import carbon_io
from greenctl.data.errors import ExecutorError, LockedError
from greenctl.data.records import Profile, Variant
from greenctl.executor.control import history, replan
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# CISO March (Clover), hourly from 2021-03-01T00:00Z: 124.57, 135.6, 148.61, 167.07, 240.4 ...
T0 = "2021-03-01T00:00:00Z"


@pytest.fixture
def tiny(store):
    """A three-variant family with modeled CPU profiles, the CISO trace and a first plan."""
    for name, acc, load_s in (("tiny-s", 0.70, 0.5), ("tiny-m", 0.76, 1.0), ("tiny-l", 0.80, 2.0)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc, load_time_s=load_s))
    rows = []
    for name, thr, e, lat in (
        ("tiny-s", 400, 0.05, 3),
        ("tiny-m", 150, 0.2, 8),
        ("tiny-l", 60, 0.6, 20),
    ):
        for c in (1, 2):
            rows.append(
                Profile(
                    name,
                    f"cpu:{c}",
                    1,
                    thr * c,
                    latency_p50_ms=lat / c,
                    latency_p95_ms=1.5 * lat / c,
                    latency_p99_ms=2 * lat / c,
                    power_w=10 * c,
                    energy_j=e,
                    energy_method="modeled",
                    capacity_rps=thr * c * 0.8,
                    capacity_slo_ms=100,
                    cost_per_hour=0.05 * c,
                    source="synthetic",
                )
            )
    store.add_profiles(rows)
    carbon_io.import_bundled(store, "clover-ciso-march")
    from greenctl.planner.mix import solve as mix

    req = {
        "model": "tiny",
        "rate_rps": 100,
        "slo_ms": 100,
        "budgets": {"cpu": 4},
        "carbon_intensity": 124.57,
        "gamma": 0.5,
    }
    plan = mix.plan_mix(
        mix.build_mix_problem(req, store.variants("tiny"), store.latest_profiles(family="tiny"))
    )
    plan.extra["carbon_region"] = "CISO"  # replan's default region
    pid = store.save_plan(plan)
    _serve(store, pid)  # applied: it serves when the cron rounds begin
    return store, pid


def _serve(store, plan_id, *, alive=True):
    """Record ``plan_id`` as serving in the executor state, as ``apply_plan`` does, with this
    test process standing in for the dispatcher and its executor (``alive=False``: the rows
    of a machine that rebooted, their pid now another process's)."""
    from greenctl.executor.runtime.procs import proc_start_ticks

    _stop(store)
    pid = os.getpid()
    ticks = proc_start_ticks(pid) if alive else "1"
    n = store.db.table("executor_instances").count
    with store.transaction():
        store.db.table("executor_dispatcher").insert(
            {"plan_id": plan_id, "host": "127.0.0.1", "port": 1, "pid": pid,
             "pid_start": ticks, "state": "running"}
        )  # fmt: skip
        store.db.table("executor_instances").insert(
            {"id": f"t-{n}", "plan_id": plan_id, "model": "tiny", "variant": "tiny-s",
             "resource": "cpu:1", "host": "127.0.0.1", "port": 1, "pid": pid,
             "pid_start": ticks, "state": "ready"}
        )  # fmt: skip


def _stop(store):
    """What `greenctl down` leaves in the executor state."""
    with store.transaction():
        store.db.execute("update executor_dispatcher set state = 'stopped'")
        store.db.execute("update executor_instances set state = 'stopped'")


class _Applier:
    def __init__(self, fail: bool = False) -> None:
        self.applied: list[int] = []
        self.fail = fail

    def __call__(self, plan, *, store, **kw):
        if self.fail:
            raise ExecutorError("executor tiny-l failed to load; rolled back")
        self.applied.append(plan.id)
        _serve(store, plan.id)


def _replan(store, pid, at, **kw):
    kw.setdefault("apply_fn", _Applier())
    return replan.replan_once(store, plan=str(pid), at=at, region="CISO", **kw)


def test_threshold_keeps_small_moves_and_acts_on_big_ones(tiny):
    store, pid = tiny
    # 1 h later: 135.6 vs 124.57 moved 8.9 %: with a 10 % threshold and a huge margin -> no act
    d = _replan(store, pid, "2021-03-01T01:00:00Z", threshold=0.10, margin=10.0)
    assert d["action"] in ("hold", "keep")
    assert d["signal_g_per_kwh"] == pytest.approx(135.6)
    assert d["signal_change"] == pytest.approx((135.6 - 124.57) / 124.57)
    # 5 h later: 291.63 g/kWh moved > 100 %: the carbon-heavier plan is replaced
    app = _Applier()
    d = _replan(store, pid, "2021-03-01T05:00:00Z", apply=True, apply_fn=app)
    assert d["action"] == "apply" and d["applied"] is True
    assert "signal moved" in d["reason"] and app.applied == [d["new_plan_id"]]
    assert d["new_objective"] > d["old_objective"]
    new = store.get_plan(d["new_plan_id"])
    old = store.get_plan(pid)
    assert new.predicted["energy_j_per_request"] < old.predicted["energy_j_per_request"]
    assert new.request["carbon_intensity"] == pytest.approx(291.63)
    # the replanned plan says where its intensity came from, as `plan mix --region` does
    src = new.extra["carbon_source"]
    assert (
        src["kind"] == "signal" and src["region"] == "CISO" and new.extra["carbon_region"] == "CISO"
    )
    assert src["at"] == "2021-03-01T05:00:00Z" and src["signal_time"] <= src["at"]


def test_without_apply_the_plan_is_proposed_not_applied(tiny):
    store, pid = tiny
    app = _Applier()
    d = _replan(store, pid, "2021-03-01T05:00:00Z", apply_fn=app)
    assert d["action"] == "propose" and app.applied == []
    assert store.get_plan(d["new_plan_id"]).kind == "mix"
    # nothing applied: the next round still compares against the original plan
    d2 = _replan(store, pid, "2021-03-01T06:00:00Z", apply_fn=app)
    assert d2["running_plan_id"] == pid


def test_min_dwell_blocks_flapping(tiny):
    store, pid = tiny
    d = _replan(store, pid, "2021-03-01T05:00:00Z", apply=True)
    assert d["action"] == "apply"
    # intensity falls back 30 min later: too soon
    d = _replan(store, pid, "2021-03-01T05:30:00Z", apply=True, min_dwell_s=3600)
    assert d["action"] == "hold" and "min dwell" in d["reason"]
    assert d["running_plan_id"] != pid  # the applied plan is now the running one
    d = _replan(store, pid, "2021-03-01T20:00:00Z", apply=True, min_dwell_s=3600)
    assert d["action"] == "apply"  # 96.83 g/kWh, 15 h later: back to the accurate plan


def test_min_dwell_yields_when_the_running_plan_cannot_carry_the_load(tiny):
    """The dwell guards against churn, not against overload: within it, a load the running
    plan cannot carry replaces it at once; a load it carries is held."""
    store, pid = tiny
    d = _replan(store, pid, "2021-03-01T05:00:00Z", apply=True)
    assert d["action"] == "apply"
    running = store.get_plan(d["new_plan_id"])
    capacity = sum(
        p.capacity_rps * dep.count
        for dep in running.deployments
        for p in store.latest_profiles(variant=dep.variant, resource=dep.resource)
    )
    # 10 min later, the same load: held by the dwell (the round plans and scores anyway)
    d = _replan(store, pid, "2021-03-01T05:10:00Z", apply=True, min_dwell_s=3600)
    assert d["action"] == "hold" and d["reason"].startswith("min dwell")
    # 20 min later, twice what the running plan carries: the dwell yields
    app = _Applier()
    rates = {"tiny": 2 * capacity}
    d = _replan(store, pid, "2021-03-01T05:20:00Z", apply=True, apply_fn=app, min_dwell_s=3600,
                rates=rates)  # fmt: skip
    assert d["action"] == "apply" and app.applied == [d["new_plan_id"]]
    assert "min dwell" in d["reason"] and "yields" in d["reason"]
    assert "cannot carry" in d["reason"]
    assert d["old_objective"] is None  # the running plan cannot be scored at that load
    bigger = store.get_plan(d["new_plan_id"])
    assert sum(x.count for x in bigger.deployments) > sum(x.count for x in running.deployments)
    # and the new plan now dwells: the same load 10 min later is held
    d = _replan(store, pid, "2021-03-01T05:30:00Z", apply=True, min_dwell_s=3600, rates=rates)
    assert d["action"] == "hold" and "min dwell" in d["reason"]


def test_failed_apply_leaves_running_plan_and_records_it(tiny):
    store, pid = tiny
    with pytest.raises(ExecutorError, match="failed to load"):
        _replan(store, pid, "2021-03-01T05:00:00Z", apply=True, apply_fn=_Applier(fail=True))
    rows = list(store.db.table("decisions").rows)
    assert rows[-1]["action"] == "failed" and rows[-1]["applied"] == 0
    assert "running plan is unchanged" in rows[-1]["reason"]
    d = _replan(store, pid, "2021-03-01T05:00:00Z")
    assert d["running_plan_id"] == pid


def test_lock_keeps_runs_from_overlapping(tiny):
    store, pid = tiny
    with replan.replan_lock(store), pytest.raises(LockedError, match="another greenctl replan"):
        _replan(store, pid, "2021-03-01T05:00:00Z")
    assert store.db.table("decisions").count == 0
    _replan(store, pid, "2021-03-01T05:00:00Z")  # released


def test_forecast_sets_the_planned_rate(tiny):
    store, pid = tiny
    history.record_load(
        store,
        [history.LoadSample(f"2021-03-01T00:0{m}:00Z", 180.0 + m, model="tiny") for m in range(3)],
    )
    d = _replan(store, pid, "2021-03-01T05:00:00Z", forecaster="last")
    assert d["forecast_rps"] == 182.0
    assert store.get_plan(d["new_plan_id"]).predicted["rate_rps"] == 182.0


def test_cli_replan_history_and_errors(tiny, cli, monkeypatch):
    _store, pid = tiny
    r = cli("replan", "--plan", pid, "--at", "2021-03-01T05:00:00Z", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["action"] == "propose" and d["region"] == "CISO"

    def boom(plan, *, store, **kw):
        raise ExecutorError("port 8000 already taken")

    monkeypatch.setattr(replan, "_default_apply", boom)
    r = cli("replan", "--plan", pid, "--at", "2021-03-01T06:00:00Z", "--apply")
    assert r.exit_code == 1 and "port 8000 already taken" in r.output
    r = cli("replan", "--history", "--plan", pid, "--json")
    hist = json.loads(r.stdout)
    assert [h["action"] for h in hist] == ["propose", "failed"]
    assert set(replan.DECISION_ACTIONS) >= {h["action"] for h in hist}
    for key in (
        "time",
        "signal_g_per_kwh",
        "forecast_rps",
        "old_objective",
        "new_objective",
        "action",
        "reason",
    ):
        assert key in hist[0]
    r = cli("replan", "--plan", pid, "--min-dwell", "soon")
    assert r.exit_code == 2 and "not a duration" in r.output
    r = cli("replan", "--plan", "99")
    assert r.exit_code == 2 and "no plan with id 99" in r.output


def test_plan_file_lineage(tiny, tmp_path):
    from greenctl.data.plan import write_plan_file

    store, pid = tiny
    f = tmp_path / "plan.json"
    write_plan_file(store.get_plan(pid), f)
    d1 = replan.replan_once(
        store,
        plan=str(f),
        at="2021-03-01T05:00:00Z",
        region="CISO",
        apply=True,
        apply_fn=_Applier(),
    )
    d2 = replan.replan_once(
        store, plan=str(f), at="2021-03-01T07:00:00Z", region="CISO", min_dwell_s=3600 * 6
    )
    assert d1["lineage"] == d2["lineage"] == f"file:{f.resolve()}"
    assert d1["running_plan_id"] == pid  # the file carries its store id: no copy is saved
    assert d2["running_plan_id"] == d1["new_plan_id"] and d2["action"] == "hold"


def test_cron_print_install_remove(cli, tmp_path, db_path):
    r = cli(
        "cron", "install", "--every", "15m", "--print", "--", "replan", "--plan", "3", "--apply"
    )
    assert r.exit_code == 0, r.output
    line = r.stdout.strip()
    assert line.startswith("*/15 * * * * GREENCTL_DB=")
    assert str(db_path) in line and "replan --plan 3 --apply" in line
    assert line.endswith("# greenctl:replan") and ">> /" in line
    exe = line.split()[6]
    assert exe.startswith("/")  # absolute path of greenctl
    tab = tmp_path / "crontab"
    tab.write_text("0 1 * * * /usr/bin/backup\n")
    for every in ("15m", "1h"):  # installing twice replaces the line
        r = cli(
            "cron",
            "install",
            "--every",
            every,
            "--crontab-file",
            tab,
            "--",
            "replan",
            "--plan",
            "3",
        )
        assert r.exit_code == 0, r.output
    lines = tab.read_text().splitlines()
    assert lines[0] == "0 1 * * * /usr/bin/backup" and len(lines) == 2
    assert lines[1].startswith("0 * * * * ")
    r = cli("cron", "remove", "--crontab-file", tab)
    assert r.exit_code == 0 and tab.read_text() == "0 1 * * * /usr/bin/backup\n"
    r = cli("cron", "install", "--every", "45s", "--print", "--", "replan")
    assert r.exit_code == 2
    r = cli("cron", "install", "--print")
    assert r.exit_code == 2 and "no greenctl command" in r.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("1h", 3600), ("2d", 172800), ("0", 0), ("30", 30)],
)
def test_parse_duration(text, seconds):
    assert replan.parse_duration(text) == seconds


def test_mig_plan_replans_with_clover_objective(store):
    """A Clover MIG plan (synthetic A30 profiles) is redone at the new carbon intensity."""
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.core.synthetic import synthetic_family
    from greenctl.planner.mig import solve as mig

    geo = resolve_gpu("A30")
    variants, profiles = synthetic_family(geo, "albert")
    for v in variants:
        store.upsert_variant(v)
    store.add_profiles(profiles)
    carbon_io.import_bundled(store, "clover-ciso-march")
    whole = [p for p in profiles if p.resource == f"mig:{geo.whole_profile.name}"]
    best = max(variants, key=lambda v: v.accuracy or 0)
    rate = 0.6 * 2 * next(p for p in whole if p.variant == best.name).throughput_rps
    problem = mig.build_problem(
        geo,
        store.latest_profiles(family="albert"),
        store.variants("albert"),
        family="albert",
        gpus=2,
        rate_rps=rate,
        carbon_intensity=124.57,
        lam=0.5,
    )
    plan = mig.plan_mig(problem)
    plan.extra["carbon_region"] = "CISO"
    pid = store.save_plan(plan)
    _serve(store, pid)
    d = replan.replan_once(
        store, plan=str(pid), at="2021-03-01T14:00:00Z", apply=True, apply_fn=_Applier()
    )
    assert d["signal_g_per_kwh"] == pytest.approx(353.57)
    assert d["old_objective"] is not None and d["new_objective"] is not None
    assert d["new_objective"] >= d["old_objective"] - 1e-9  # never worse than the running one
    assert d["action"] in ("apply", "keep", "hold")
    if d["action"] == "hold":  # another layout that only ties the running one: no change
        assert d["new_objective"] == pytest.approx(d["old_objective"], rel=1e-9)
        assert "only ties the running one" in d["reason"]
    if d["action"] == "apply":
        new = store.get_plan(d["new_plan_id"])
        assert new.kind == "mig" and new.request["carbon_intensity"] == pytest.approx(353.57)
        assert (
            new.predicted["carbon_g_per_request"]
            <= plan.predicted["carbon_g_per_request"] * (353.57 / 124.57) + 1e-12
        )


def test_dispatcher_counters_become_load_history(store):
    """Each sampling turns the dispatcher's request counters into an arrival rate."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    counts = {"n": 100}

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (
                "# TYPE greenctl_dispatcher_requests_total counter\n"
                f'greenctl_dispatcher_requests_total{{model="tiny",code="200"}} {counts["n"]}\n'
                'greenctl_dispatcher_requests_total{model="tiny",code="503"} 5\n'
            ).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert history.sample_dispatcher_load(store, url=url) == []  # primes the counters
        store.db.execute("update load_counters set time = '2020-01-01T00:00:00Z'")
        store.db.conn.commit()
        counts["n"] = 100 + 600
        (s,) = history.sample_dispatcher_load(store, url=url)
        assert s["model"] == "tiny" and s["rate_rps"] == pytest.approx(600 / s["interval_s"])
        rows = list(store.db.table("load_history").rows)
        assert rows[0]["source"] == "dispatcher" and rows[0]["model"] == "tiny"
        counts["n"] = 10  # the dispatcher restarted: no negative rate
        assert history.sample_dispatcher_load(store, url=url) == []
    finally:
        server.shutdown()
    assert history.sample_dispatcher_load(store, url=url) == []  # nobody answers: no sample


def test_missing_signal_is_a_recorded_failure(tiny):
    store, pid = tiny
    from greenctl.data.errors import NotFoundError

    with pytest.raises(NotFoundError, match="first value"):
        _replan(store, pid, "2020-01-01T00:00:00Z")
    (row,) = list(store.db.table("decisions").rows)
    assert row["action"] == "failed" and "no carbon signal" in row["reason"]


@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    signals=st.lists(st.floats(min_value=50, max_value=600), min_size=4, max_size=8),
    dwell_h=st.sampled_from([0.0, 1.0, 2.0]),
    threshold=st.sampled_from([0.02, 0.05, 0.2]),
)
def test_replan_invariants_on_random_signals(tiny, signals, dwell_h, threshold):
    """Applies are never closer than the dwell time, always have a trigger, and never make
    the objective worse than the running plan's in the same problem."""
    store, pid = tiny
    store.db.execute("delete from decisions")
    store.db.execute("delete from carbon_signals where region = 'RND'")
    store.db.conn.commit()
    _serve(store, pid)
    points = [
        carbon_io.CarbonPoint("RND", f"2030-01-01T{h:02d}:00:00Z", v) for h, v in enumerate(signals)
    ]
    carbon_io.store_points(store, points)
    out = replan.simulate_replans(
        store, plan=str(pid), region="RND", start="2030-01-01T00:00:00Z",
        hours=len(signals) - 1, step_h=1.0, apply=True, apply_fn=_Applier(),
        min_dwell_s=dwell_h * 3600, threshold=threshold, margin=0.02,
    )  # fmt: skip
    applied_at = [int(d["at"][11:13]) for d in out if d["action"] == "apply"]
    # the load does not move here: the running plan always carries it, so the dwell never
    # yields (test_min_dwell_yields_when_the_running_plan_cannot_carry_the_load)
    assert all(b - a >= dwell_h for a, b in itertools.pairwise(applied_at))
    assert not any("yields" in d["reason"] for d in out)
    for d in out:
        if d["action"] == "apply":
            assert (d["signal_change"] is None or d["signal_change"] > threshold) or (
                d["improvement"] is not None and d["improvement"] > 0.02
            )
            assert d["new_objective"] >= d["old_objective"] - 1e-9
        if d["action"] == "hold" and "min dwell" not in d["reason"]:
            assert d["signal_change"] <= threshold


# -- what really serves (issue 16, item 8) -------------------------------------------------------
def test_nothing_serving_apply_recovers_at_once(tiny):
    """After `greenctl down` a cron round with --apply starts the best plan, whatever the
    dwell and threshold; without --apply it says that nothing serves."""
    store, pid = tiny
    _stop(store)
    d = _replan(store, pid, T0, threshold=0.10)
    assert d["action"] == "keep" and d["running_plan_id"] is None
    assert "nothing is serving: no dispatcher runs" in d["reason"]
    assert "running configuration" not in d["reason"]
    app = _Applier()
    d = _replan(store, pid, T0, apply=True, apply_fn=app, threshold=0.10)
    assert d["action"] == "apply" and d["applied"] is True and d["running_plan_id"] is None
    assert d["reason"].startswith("nothing is serving (no dispatcher runs")
    assert app.applied == [pid] == [d["new_plan_id"]]  # the best plan is the one it ran
    # serving again: the usual rules hold (30 min later: within the dwell)
    d = _replan(store, pid, "2021-03-01T00:30:00Z", apply=True, apply_fn=app)
    assert d["action"] == "hold" and "min dwell" in d["reason"] and d["running_plan_id"] == pid
    assert app.applied == [pid]


def test_after_a_reboot_stale_rows_do_not_count_as_serving(tiny):
    store, pid = tiny
    d = _replan(store, pid, "2021-03-01T05:00:00Z", apply=True)
    _serve(store, d["new_plan_id"], alive=False)  # rows still say running; the pids are gone
    app = _Applier()
    d = _replan(store, pid, "2021-03-01T05:10:00Z", apply=True, apply_fn=app)  # within dwell
    assert d["action"] == "apply" and d["running_plan_id"] is None
    assert "nothing is serving (the dispatcher of plan" in d["reason"]
    assert app.applied == [d["new_plan_id"]]


def _other_plan(store):
    from greenctl.planner.mix import solve as mix

    req = {"model": "tiny", "rate_rps": 250, "slo_ms": 100, "budgets": {"cpu": 4},
           "carbon_intensity": 124.57, "gamma": 0.5}  # fmt: skip
    plan = mix.plan_mix(
        mix.build_mix_problem(req, store.variants("tiny"), store.latest_profiles(family="tiny"))
    )
    plan.extra["carbon_region"] = "CISO"
    return store.save_plan(plan)


def test_running_plan_id_is_the_plan_that_really_serves(tiny, cli):
    """Plan 2 (another lineage) serves: replanning plan 1 says so, and changes nothing."""
    store, p1 = tiny
    p2 = _other_plan(store)
    assert not replan.same_config(store.get_plan(p1), store.get_plan(p2))
    _serve(store, p2)
    plans = store.db.table("plans").count
    app = _Applier()
    d = _replan(store, p1, "2021-03-01T05:00:00Z", apply=True, apply_fn=app)
    assert d["running_plan_id"] == p2 and d["action"] == "hold" and app.applied == []
    assert f"plan {p2} serves, not plan {p1} of plan:{p1}" in d["reason"]
    assert f"greenctl replan --plan {p2}" in d["reason"]
    assert store.db.table("plans").count == plans
    r = cli("replan", "--plan", p1, "--at", "2021-03-01T06:00:00Z", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["running_plan_id"] == p2


def test_a_proposal_applied_by_hand_is_the_running_plan(tiny):
    store, p1 = tiny
    proposed = _replan(store, p1, "2021-03-01T05:00:00Z")["new_plan_id"]
    _serve(store, proposed)  # `greenctl apply` of the proposal
    d = _replan(store, p1, "2021-03-01T05:00:00Z")
    assert d["running_plan_id"] == proposed and d["action"] == "keep"
    assert d["reason"].endswith("the best plan is the running configuration")


def test_a_plan_file_lineage_keeps_its_plan_when_another_serves(tiny, tmp_path):
    from greenctl.data.plan import write_plan_file

    store, p1 = tiny
    doc = store.get_plan(p1)
    doc.id = None  # a plan file that is not in the store
    f = tmp_path / "plan.json"
    write_plan_file(doc, f)
    p2 = _other_plan(store)
    _serve(store, p2)
    d = replan.replan_once(store, plan=str(f), at=T0, region="CISO")
    assert d["action"] == "hold" and d["running_plan_id"] == p2
    _stop(store)
    app = _Applier()
    d = replan.replan_once(store, plan=str(f), at=T0, region="CISO", apply=True, apply_fn=app)
    (copy,) = [r["id"] for r in store.db.table("plans").rows_where("source = 'file'")]
    assert d["action"] == "apply" and app.applied == [copy]  # the file's plan, saved once


@pytest.mark.timeout(120)
def test_nothing_serving_recovers_with_real_executors(tiny, tmp_path, monkeypatch):
    """Real tiny executors: apply, `down`, then one replan --apply round starts them again."""
    from greenctl.executor.deploy.apply import apply_plan, down, status

    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GREENCTL_NOOP_SERVICE_MS", "0")
    store, pid = tiny
    _stop(store)
    opts = {"loader": "greenctl.executor.runtime.daemon:noop_loader", "cores": [0]}
    try:
        apply_plan(store.get_plan(pid), store=store, **opts)
        assert status(store)["dispatcher"]["plan_id"] == pid
        down(store)
        d = replan.replan_once(
            store, plan=str(pid), at=T0, region="CISO", apply=True, apply_options=opts
        )
        assert d["action"] == "apply" and "nothing is serving" in d["reason"]
        st = status(store)
        assert st["dispatcher"]["alive"] and st["dispatcher"]["plan_id"] == d["new_plan_id"]
        assert all(i["alive"] for i in st["instances"]) and st["instances"]
    finally:
        down(store)


# -- glet plans (issue 18): new per-model rates, gpulet's rescheduling rule, no region ----------
def test_a_glet_plan_is_replanned_at_given_rates_without_a_region(cli, gpulet):
    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--model", "vgg16:300:30",
        "--model", "inception:200:40", "--simulate-seconds", "0", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    planned = json.loads(r.stdout)
    # the planned rates: the running layout carries them, nothing is saved: no change (no
    # region needed; the new schedule, packed with the replan headroom, may differ)
    r = cli("replan", "--plan", planned["id"], "--min-dwell", "0", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["action"] in ("keep", "hold") and d["new_plan_id"] is None, d["reason"]
    assert (d["region"], d["signal_g_per_kwh"]) == (None, None)
    # a model's rate given (by its name) and a family's (shared by its models as planned)
    r = cli(
        "replan", "--plan", planned["id"], "--rate", "resnet50=1500", "--rate", "vgg=10",
        "--min-dwell", "0", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["action"] == "propose" and "at the new load" in d["reason"], d["reason"]
    new = gpulet.get_plan(d["new_plan_id"])
    rates = {m["name"]: m["rate_rps"] for m in new.request["models"]}
    assert rates == {"resnet50": 1500.0, "vgg16": 10.0, "inception": 200.0}
    assert d["forecast_rps"] == pytest.approx(1510.0)
    # bad input names the option and the fix
    for bad, msg in (
        ("resnet50", "is not MODEL=RPS"),
        ("resnet50=-1", "is not MODEL=RPS"),
        ("resnet50=x", "is not MODEL=RPS"),
        ("resnet50=1e308", "<= 1e+06"),
        ("bert=10", "the plan serves no model 'bert'"),
    ):
        r = cli("replan", "--plan", planned["id"], "--rate", bad, "--min-dwell", "0")
        assert r.exit_code == 2 and "--rate" in r.output and msg in r.output, r.output
    r = cli("replan", "--plan", planned["id"], "--rate", "vgg=1", "--rate", "vgg=2")
    assert r.exit_code == 2 and "names vgg twice" in r.output
