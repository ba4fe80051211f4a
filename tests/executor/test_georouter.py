"""The geo router: a geo plan routed over three local sites (a greenctl dispatcher each,
serving the built-in tiny model), shares against the plan, drain and retry, replan without
a restart, the Envoy export; real processes and sockets."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)

SITES = ("west", "central", "east")
T0 = "2024-01-01T00:30:00Z"  # slot 0


def write_geo_inputs(folder: Path) -> dict[str, Path]:
    """Three sites of 1 MW, three gateways of 0.8 MW, two hourly steps, routes that give each
    gateway a different split."""
    sites = ["time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw"]
    prices = {0: (40, 60, 80), 1: (90, 50, 70)}
    for t, hour in enumerate(("00", "01")):
        for j, s in enumerate(SITES):
            sites.append(f"2024-01-01T{hour}:00:00Z,{s},{prices[t][j]},{300 - 100 * j},2,1.0")
    demand = ["time,gateway,load_mw"] + [
        f"2024-01-01T{h}:00:00Z,{g},0.8" for h in ("00", "01") for g in ("g1", "g2", "g3")
    ]
    routes = ["gateway,site", "g1,west", "g1,central", "g2,central", "g2,east"]
    routes += ["g3,west", "g3,central", "g3,east"]
    out = {}
    for name, lines in (("sites", sites), ("demand", demand), ("routes", routes)):
        out[name] = folder / f"{name}.csv"
        out[name].write_text("\n".join(lines) + "\n")
    return out


def geo_plan(store, folder: Path) -> Plan:
    from greenctl.executor.kinds import get_kind

    files = write_geo_inputs(folder)
    request = {k: str(v) for k, v in files.items()} | {"algorithm": "eglb"}
    plan, _ = get_kind("geo").plan(store, request)
    store.save_plan(plan)
    return plan


def _site_plan() -> Plan:
    return Plan(
        kind="mix",
        deployments=[
            Deployment(
                model="tiny", variant="tiny-s", resource="cpu:1", count=1, batch=1, quota_rps=100.0
            )
        ],
        predicted={"rate_rps": 100.0},
    )


@pytest.fixture(scope="module")
def geo(tmp_path_factory):
    """Three sites (their own store and state folder each), a geo plan over them and its
    router, pinned to slot 0; everything is stopped afterwards."""
    from greenctl.data.plan import write_plan_file
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import down
    from greenctl.executor.deploy.georouter import apply_geo, stop_router

    root = tmp_path_factory.mktemp("geo")
    saved = os.environ.pop("GREENCTL_STATE_DIR", None)  # each store: its own <db>.run
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    stores = {s: open_store(root / f"{s}.db") for s in SITES}
    main = open_store(root / "router.db")
    try:
        # the three sites start side by side, each applied by its own `greenctl apply`
        write_plan_file(_site_plan(), root / "site.json")
        procs = {
            s: subprocess.Popen(
                [sys.executable, "-m", "greenctl.cli.main", "--db", str(root / f"{s}.db"),
                 "apply", str(root / "site.json"), "--json"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "200"},
            )
            for s in SITES
        }  # fmt: skip
        urls = {}
        for s, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err.decode()
            urls[s] = json.loads(out)["dispatcher"]["url"]
        plan = geo_plan(main, root)
        applied = apply_geo(plan, store=main, sites=urls, at=T0, health_interval_s=0.25)
        yield {"root": root, "stores": stores, "main": main, "urls": urls, "plan": plan,
               "router": applied["router_url"]}  # fmt: skip
    finally:
        with contextlib.suppress(Exception):
            stop_router(main)
        for st in stores.values():
            with contextlib.suppress(Exception):
                down(st, wait=True)
            st.close()
        main.close()
        if saved is not None:
            os.environ["GREENCTL_STATE_DIR"] = saved


def _load(router: str, gateway: str, *, rate: float, duration: float, seed: int = 0):
    from greenctl.executor.runtime.loadgen import run_load

    return run_load(router, "tiny", duration_s=duration, rate_rps=rate, seed=seed,
                    gateway=gateway, connections=32)  # fmt: skip


def test_each_gateway_is_split_as_planned_within_3_points(geo):
    from greenctl.executor.deploy.georouter import gateway_fractions, router_status, routing_table

    table = routing_table(geo["plan"], geo["main"])
    with ThreadPoolExecutor(3) as pool:
        jobs = {g: pool.submit(_load, geo["router"], g, rate=200, duration=5.6, seed=i)
                for i, g in enumerate(("g1", "g2", "g3"))}  # fmt: skip
        results = {g: j.result() for g, j in jobs.items()}
    doc = router_status(geo["main"])
    assert doc is not None and doc["state"] == "serving" and doc["slot"] == 0
    for g, res in results.items():
        assert res.errors == 0 and res.ok >= 1000, (g, res)
        gw = doc["gateways"][g]
        assert gw["served"] == res.ok
        planned = gateway_fractions(table, 0, g)
        for site in SITES:
            row = gw["sites"].get(site, {"served_share": 0.0, "planned_share": 0.0})
            want = planned.get(site, 0.0)
            assert abs((row["planned_share"] or 0.0) - want) < 1e-9
            assert abs((row["served_share"] or 0.0) - want) <= 0.03, (g, site, row, want)


def test_replan_moves_the_running_router_to_the_next_slot_without_a_restart(geo):
    from greenctl.executor.deploy.georouter import (
        read_json,
        replan_if_routed,
        router_dir,
        router_status,
    )

    before = read_json(router_dir(geo["main"]) / "supervisor.json")
    out = replan_if_routed(geo["main"], plan=str(geo["plan"].id))
    assert out is not None and out["slot"] == 1 and out["action"] == "update-router"
    doc = router_status(geo["main"])
    assert doc is not None and doc["slot"] == 1
    assert doc["gateways"]["g3"]["sites"]["west"]["slot_fraction"] == pytest.approx(0.0)
    after = read_json(router_dir(geo["main"]) / "supervisor.json")
    assert after == before  # same processes: no restart
    res = _load(geo["router"], "g2", rate=100, duration=2)
    assert res.errors == 0
    # back to slot 0 for the tests after this one
    assert replan_if_routed(geo["main"], plan=str(geo["plan"].id), at=T0)["slot"] == 0


def test_replan_takes_one_online_step_from_the_stored_state_and_records_a_decision(geo):
    from greenctl.data import loop_state, reports
    from greenctl.executor.deploy.georouter import replan_if_routed, router_status, routing_table

    store, plan = geo["main"], geo["plan"]
    lineage = f"plan:{plan.id}"
    whole = routing_table(plan, store)  # the whole-horizon solve, for comparison
    first = replan_if_routed(store, plan=str(plan.id), at=T0)  # state of slot 0 stored
    assert first is not None and first["slot"] == 0
    out = replan_if_routed(store, plan=str(plan.id))  # the next slot: one online step
    assert out is not None and out["slot"] == 1 and out["action"] == "update-router"
    assert out["online"]["warm"] and out["online"]["steps"] == 1
    step = loop_state.last_geo_step(store, lineage)
    assert step is not None and step["slot"] == 1 and step["algorithm"] == "eglb"
    assert step["state"]["slot"] == 1 and len(step["state"]["gamma_carbon"]) == len(SITES)
    # unchanged files: the step's fractions are the whole solve's for that slot
    assert step["fractions"].keys() == whole["slots"][1].keys()
    for gw, fr in whole["slots"][1].items():
        assert step["fractions"][gw] == pytest.approx(fr, abs=1e-9)
    doc = router_status(store)
    assert doc is not None and doc["slot"] == 1
    for gw, fr in whole["slots"][1].items():
        got = {s: r["slot_fraction"] for s, r in doc["gateways"][gw]["sites"].items()}
        assert {s: f for s, f in got.items() if f} == pytest.approx(fr, abs=1e-9)
    last = reports.decisions(store, lineage=lineage)[-1]  # oldest first
    assert last["id"] == out["decision_id"] and last["action"] == "apply"
    assert "eGLB online step (eglb, from the stored state" in last["reason"]
    assert last["signal_g_per_kwh"] is not None  # the slot's load-weighted intensity
    assert replan_if_routed(store, plan=str(plan.id), at=T0)["slot"] == 0  # back to slot 0


def test_a_killed_router_is_restarted_on_its_port_with_its_table_and_slot(geo):
    from greenctl.executor.deploy.georouter import read_json, router_dir, router_status

    folder = router_dir(geo["main"])
    before = read_json(folder / "supervisor.json")
    assert before is not None
    os.kill(before["router_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        now = read_json(folder / "supervisor.json") or {}
        state = read_json(folder / "state.json") or {}
        restarted = now.get("router_pid") not in (None, before["router_pid"])
        if restarted and state.get("ready") and state.get("pid") == now["router_pid"]:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the router was not restarted")
    assert now["port"] == before["port"] and now["restarts"] == before.get("restarts", 0) + 1
    doc = router_status(geo["main"])
    assert doc is not None and doc["state"] == "serving" and doc["slot"] == 0
    assert _load(geo["router"], "g1", rate=100, duration=1).errors == 0


def test_a_site_killed_under_load_is_drained_within_5_s_and_no_request_fails(geo):
    from greenctl.executor.deploy.apply import status
    from greenctl.executor.deploy.georouter import router_status

    victim = "central"
    st = status(geo["stores"][victim])
    pids = [st["dispatcher"]["supervisor"]["pid"], st["dispatcher"]["pid"]]
    box = {}

    def load() -> None:
        box["g3"] = _load(geo["router"], "g3", rate=150, duration=4.5, seed=7)

    t = threading.Thread(target=load)
    t.start()
    time.sleep(1.5)
    killed_at = time.time()
    # the whole site at once: its dispatcher and the supervisor that would revive it (each
    # wakes the moment the other exits, so both are stopped before either is killed)
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            os.kill(pid, sig)
    t.join()
    res = box["g3"]
    assert res.errors == 0 and res.ok == res.sent, res  # at most one retry each, none failed
    doc = router_status(geo["main"])
    assert doc is not None and doc["state"] == "degraded"
    site = doc["sites"][victim]
    assert not site["healthy"]
    assert site["drained_at"] - killed_at <= 5.0
    # its share went to g3's other sites in proportion to their fractions: in slot 0 only
    # west has one (east: 0), so all of it
    served = doc["gateways"]["g3"]["sites"]
    assert "east" not in served or served["east"]["served"] == 0
    assert served["west"]["served"] + served[victim]["served"] >= res.ok


def test_status_says_degraded_and_down_stops_the_router(geo, cli):
    from greenctl.executor.deploy.georouter import router_status

    db = str(geo["main"].path)
    r = cli("--db", db, "status", "--json")
    assert r.exit_code == 1  # a drained site: not fully serving
    doc = json.loads(r.stdout)["geo"]
    assert doc["state"] == "degraded" and not doc["sites"]["central"]["healthy"]
    assert doc["gateways"]["g1"]["sites"]["west"]["planned_share"] == pytest.approx(1.0)
    r = cli("--db", db, "status")
    assert "Geo routing" in r.output and "DRAINED" in r.output
    r = cli("--db", db, "down")
    assert r.exit_code == 0 and "Stopped 2 process(es)" in r.output
    assert router_status(geo["main"]) is None


def test_unit_a_drained_share_goes_to_the_others_in_proportion():
    from greenctl.executor.deploy.georouter import GeoRouter

    table = {
        "plan_id": 1,
        "start": "2024-01-01T00:00:00Z",
        "step_h": 1.0,
        "times": ["2024-01-01T00:00:00Z"],
        "sites": ["a", "b", "c"],
        "gateways": ["g"],
        "allowed": {"g": ["a", "b", "c"]},
        "slots": [{"g": {"a": 0.5, "b": 0.3, "c": 0.2}}],
        "overall": {"g": {"a": 1.0}},
    }
    r = GeoRouter(table=table, sites={s: f"http://127.0.0.1:1/{s}" for s in "abc"},
                  at="2024-01-01T00:10:00Z")  # fmt: skip
    picks = [r.pick("g", set())[0] for _ in range(1000)]
    assert [picks.count(s) for s in "abc"] == [500, 300, 200]
    r.sites["a"].drain("test")
    picks = [r.pick("g", set())[0] for _ in range(1000)]
    assert picks.count("a") == 0 and abs(picks.count("b") - 600) <= 1
    r.sites["b"].drain("test")
    r.sites["c"].drain("test")
    assert r.pick("g", set())[0] is None


def test_sites_without_an_endpoint_are_refused_before_anything_starts(store, tmp_path, cli):
    from greenctl.data.plan import write_plan_file
    from greenctl.executor.deploy.georouter import apply_geo, router_dir

    plan = geo_plan(store, tmp_path)
    with pytest.raises(InputError, match="central, east") as err:
        apply_geo(plan, store=store, sites={"west": "http://127.0.0.1:9"})
    assert "--site central=" in (err.value.hint or "")
    assert not (router_dir(store) / "supervisor.json").exists()
    write_plan_file(plan, tmp_path / "geo.json")
    res = cli("apply", tmp_path / "geo.json", "--site", "west=http://127.0.0.1:9")
    assert res.exit_code == 2 and "central" in res.output and "--site" in res.output
    res = cli("apply", tmp_path / "geo.json", "--site", "nowhere")
    assert res.exit_code == 2 and "NAME=URL" in res.output


def test_export_envoy_writes_weighted_clusters_per_gateway(store, tmp_path, cli):
    from greenctl.data.plan import write_plan_file
    from greenctl.executor.deploy.envoy_export import TOTAL_WEIGHT, integer_weights

    plan = geo_plan(store, tmp_path)
    write_plan_file(plan, tmp_path / "geo.json")
    res = cli("export", "envoy", tmp_path / "geo.json", "--at", "2024-01-01T01:10:00Z",
              "-o", tmp_path / "envoy", "--site", "west=http://10.0.0.5:8001")  # fmt: skip
    assert res.exit_code == 0, res.output
    files = sorted((tmp_path / "envoy").glob("*.yaml"))
    assert [f.name for f in files] == ["gateway-g1.yaml", "gateway-g2.yaml", "gateway-g3.yaml"]
    for f in files:
        doc = yaml.safe_load(f.read_text())
        hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        route = hcm["typed_config"]["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
        weights = route["weighted_clusters"]["clusters"]
        assert sum(w["weight"] for w in weights) == TOTAL_WEIGHT
        names = {c["name"] for c in doc["static_resources"]["clusters"]}
        assert {w["name"] for w in weights} <= names
    g3 = yaml.safe_load((tmp_path / "envoy" / "gateway-g3.yaml").read_text())
    clusters = {c["name"]: c for c in g3["static_resources"]["clusters"]}
    ep = clusters["site-west"]["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    assert ep["endpoint"]["address"]["socket_address"] == {
        "address": "10.0.0.5",
        "port_value": 8001,
    }
    assert integer_weights({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}) == {"a": 334, "b": 333, "c": 333}
    res = cli("export", "envoy", tmp_path / "geo.json", "-o", tmp_path / "x", "--at", "nonsense")
    assert res.exit_code == 2


def test_unit_health_checks_drain_a_failing_site_and_bring_it_back():
    import asyncio
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from greenctl.executor.deploy.georouter import GeoRouter

    state = {"code": 200}

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(state["code"])
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        table = {
            "plan_id": 1, "start": "2024-01-01T00:00:00Z", "step_h": 1.0,
            "times": ["2024-01-01T00:00:00Z"], "sites": ["a"], "gateways": ["g"],
            "allowed": {"g": ["a"]}, "slots": [{"g": {"a": 1.0}}], "overall": {},
        }  # fmt: skip
        url = f"http://127.0.0.1:{server.server_address[1]}"
        r = GeoRouter(table=table, sites={"a": url})
        site = r.sites["a"]
        check = lambda: asyncio.run(r._check(site))  # noqa: E731
        state["code"] = 503
        check()
        assert site.healthy  # one failure is not enough
        check()
        assert not site.healthy and r.pick("g", set())[0] is None
        state["code"] = 200
        check()
        assert not site.healthy  # one pass is not enough
        check()
        assert site.healthy and r.pick("g", set())[0] == "a"
    finally:
        server.shutdown()


def test_the_router_is_journaled_in_the_store_recovered_and_swept_by_down(store, tmp_path):
    from greenctl.data import deployments
    from greenctl.executor.deploy.apply import down, status
    from greenctl.executor.deploy.georouter import apply_geo, router_dir
    from greenctl.executor.runtime.procs import is_alive, read_json

    plan = geo_plan(store, tmp_path)
    nowhere = dict.fromkeys(SITES, "http://127.0.0.1:9")
    apply_geo(plan, store=store, sites=nowhere, at=T0, health_interval_s=5)
    row = deployments.running_router(store)
    assert row is not None and row["plan_id"] == plan.id and row["port"] > 0
    procs = [(row["supervisor_pid"], row["supervisor_pid_start"]),
             (row["router_pid"], row["router_pid_start"])]  # fmt: skip
    assert all(is_alive(*p) for p in procs)
    # an apply killed before it committed leaves its router `starting`: status stops it
    store.db.table("geo_routers").update(row["id"], {"state": deployments.STARTING})
    doc = status(store)
    assert [a["action"] for a in doc.get("recovered", [])] == ["stop-georouter"]
    assert not any(is_alive(*p) for p in procs)
    assert deployments.routers_in(store, [deployments.STARTING, deployments.RUNNING]) == []
    # a router nothing records (row and files gone) is still swept by down
    apply_geo(plan, store=store, sites=nowhere, at=T0, health_interval_s=5)
    sup = read_json(router_dir(store) / "supervisor.json") or {}
    store.db.execute("delete from geo_routers")
    for name in ("supervisor.json", "router.json"):
        (router_dir(store) / name).unlink()
    stray = [(sup["pid"], sup["pid_start"]), (sup["router_pid"], sup["router_pid_start"])]
    assert all(is_alive(*p) for p in stray)
    down(store)
    assert not any(is_alive(*p) for p in stray)
