"""`greenctl report`: exports with stable columns, savings, charts."""

from __future__ import annotations

import csv
import io
import json

import pytest
from greenctl.data import carbon_io, reports
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant


def _plan(store, variant, energy_j, acc, cost, p95=40.0, slo=100.0):
    p = Plan(
        kind="mix",
        request={
            "families": [{"model": "tiny", "rate_rps": 20, "slo_ms": slo}],
            "percentile": "p95",
            "pue": 1.2,
            "objective": "balanced",
        },
        deployments=[Deployment("tiny", variant, "cpu:1", 2, 1, 20.0)],
        predicted={
            "rate_rps": 20.0,
            "accuracy": acc,
            "cost_per_hour": cost,
            "p95_ms": p95,
            "energy_j_per_request": energy_j,
            "objective": 0.5,
        },
    )
    return store.save_plan(p)


@pytest.fixture
def scenario(store):
    carbon_io.import_bundled(store, "clover-ciso-march")
    small = _plan(store, "tiny-s", 2.0, 0.70, 2.0)
    large = _plan(store, "tiny-l", 5.0, 0.80, 4.0)
    # replanning switched from the large to the small variant at hour 10
    store.db.table("decisions").insert(
        {
            "time": "2026-01-01T00:00:00Z",
            "at": "2021-03-01T10:00:00Z",
            "lineage": f"plan:{large}",
            "region": "CISO",
            "signal_g_per_kwh": 331.0,
            "action": "apply",
            "applied": 1,
            "running_plan_id": large,
            "new_plan_id": small,
            "reason": "carbon intensity moved 8.1 % > 5 %",
        }
    )
    store.add_run(
        large,
        kind="verify",
        predicted={"p95_ms": 40.0, "rate_rps": 20},
        measured={"p95_ms": 46.0, "rate_rps": 19.5, "errors": 0},
        started_at="t",
    )
    return store, small, large


def test_savings_hand_computed(scenario):
    store, _small, large = scenario
    s = reports.savings(store, plan_id=large, baseline_id=large, region="CISO")
    assert s["period"] == {
        "from": "2021-03-01T00:00:00Z",
        "to": "2021-03-03T01:00:00Z",
        "hours": 49.0,
    }
    reqs_h = 20 * 3600
    # greenctl: 10 h at 5 J/req, then 39 h at 2 J/req; baseline 49 h at 5 J/req
    assert s["greenctl"]["energy_kwh"] == pytest.approx((10 * 5 + 39 * 2) * reqs_h / 3.6e6)
    assert s["baseline"]["energy_kwh"] == pytest.approx(49 * 5 * reqs_h / 3.6e6)
    assert s["greenctl"]["cost"] == pytest.approx(10 * 4 + 39 * 2)
    assert s["savings"]["accuracy_change"] == pytest.approx((10 * 0.8 + 39 * 0.7) / 49 - 0.8)
    assert 0 < s["savings_pct"]["carbon_kg"] < 100
    assert s["greenctl"]["water_l"] is None  # no plan predicts water
    assert s["greenctl"]["slo_compliance"] == 1.0
    assert s["measured_slo"][0]["meets_slo"] is True
    w = reports.savings(store, plan_id=large, baseline_id=large, region="CISO", wue_l_per_kwh=2.0)
    assert w["baseline"]["water_l"] == pytest.approx(w["baseline"]["energy_kwh"] * 1.2 * 2.0)


def test_exports_columns_are_the_contract(scenario, cli, tmp_path):
    _store, small, large = scenario
    for what in reports.EXPORTS:
        out = tmp_path / f"{what}.csv"
        r = cli("report", what, "--format", "csv", "-o", out)
        assert r.exit_code == 0, r.output
        header = out.read_text().splitlines()[0].split(",")
        assert header == reports.COLUMNS[what]
    runs = list(csv.DictReader(io.StringIO((tmp_path / "runs.csv").read_text())))
    assert runs[0]["p95_error_pct"] == "15.0" and runs[0]["measured_p95_ms"] == "46.0"
    r = cli("report", "decisions", "--format", "json")
    rows = json.loads(r.stdout)
    assert rows[0]["action"] == "apply" and rows[0]["applied"] is True
    r = cli("report", "decisions", "--plan", large, "--format", "json")
    assert len(json.loads(r.stdout)) == 1
    r = cli("report", "decisions", "--plan", small, "--format", "json")
    assert json.loads(r.stdout) == []
    r = cli("report", "plans", "--format", "json")
    plans = json.loads(r.stdout)
    assert [p["deployments"] for p in plans] == ["tiny-s@cpu:1x2", "tiny-l@cpu:1x2"]
    r = cli(
        "report", "carbon", "--region", "CISO", "--to", "2021-03-01T02:00:00Z", "--format", "json"
    )
    assert len(json.loads(r.stdout)) == 3
    r = cli("report", "plans", "--format", "xml")
    assert r.exit_code == 2 and "--format 'xml'" in r.output


def test_profiles_export(store, cli):
    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.7))
    store.add_profiles([Profile("tiny-s", "cpu:1", 1, 120.0, latency_p95_ms=9.5, energy_j=0.4)])
    r = cli("report", "profiles", "--format", "json")
    rows = json.loads(r.stdout)
    assert rows[0]["family"] == "tiny" and rows[0]["latency_p95_ms"] == 9.5
    assert list(rows[0]) == reports.COLUMNS["profiles"]


def test_savings_cli_and_charts(scenario, cli, tmp_path):
    _store, _small, large = scenario
    r = cli("report", "savings", "--plan", large, "--baseline", large, "--region", "CISO")
    assert r.exit_code == 0, r.output
    assert "carbon (kg CO2)" in r.output and "modeled" in r.output
    r = cli("report", "savings", "--plan", large, "--baseline", large, "--region", "CISO", "--json")
    assert json.loads(r.stdout)["changes"] == 1
    out = tmp_path / "charts"
    r = cli(
        "report",
        "charts",
        "--plan",
        large,
        "--baseline",
        large,
        "--region",
        "CISO",
        "--out",
        out,
        "--json",
    )
    assert r.exit_code == 0, r.output
    written = {w["chart"] for w in json.loads(r.stdout)["written"]}
    assert written == {"carbon", "latency"}
    for name in ("carbon.png", "latency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_sites_chart_for_geo_plan(store, tmp_path):
    sites = [
        {"site": s, "load_mwh": 1.0, "energy_cost_usd": 2.0, "carbon_kg": c, "water_l": w}
        for s, c, w in (("Texas", 400.0, 3000.0), ("Germany", 300.0, 2000.0))
    ]
    p = Plan(
        kind="geo",
        deployments=[Deployment("m", "v", "site:Texas")],
        extra={"sites": sites, "algorithm": "eglb-off"},
    )
    pid = store.save_plan(p)
    res = reports.chart_sites(store, tmp_path / "sites.png", plan_id=pid)
    assert res["sites"] == 2 and (tmp_path / "sites.png").stat().st_size > 5_000
    mix = _plan(store, "x", 1.0, 0.5, 1.0)
    from greenctl.data.errors import InputError

    with pytest.raises(InputError, match="not a geo plan"):
        reports.chart_sites(store, tmp_path / "x.png", plan_id=mix)


def test_a_verified_run_meets_its_slo_only_with_every_request_answered():
    from greenctl.data.reports import meets_slo

    assert meets_slo({"p95_ms": 90.0}, 100.0) is True
    assert meets_slo({"p95_ms": 120.0}, 100.0) is False
    assert meets_slo({"p95_ms": 90.0, "errors": 2}, 100.0) is False
    assert meets_slo({"p95_ms": 90.0, "rejected_503": 1}, 100.0) is False
    assert meets_slo({"p95_ms": 90.0}, None) is None
    assert meets_slo({"p95_ms": None}, 100.0) is None
