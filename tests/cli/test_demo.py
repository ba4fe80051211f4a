"""`greenctl demo --quick`: the whole loop on CPU, report files checked for content."""

from __future__ import annotations

import csv
import json
import os

import pytest


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie still answers kill(0); treat it as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_demo_quick_writes_a_real_report_and_stops_everything(cli, tmp_path):
    out = tmp_path / "report"
    r = cli("demo", "--quick", "--out", out, "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["profiles"] >= 3  # tiny-s, tiny-m, tiny-l measured on cpu:1

    # plans: the carbon-aware plan and the carbon-unaware baseline, with deployments
    plans = list(csv.DictReader((out / "plans.csv").open()))
    by_id = {int(p["id"]): p for p in plans}
    assert by_id[summary["plan_id"]]["source"] == "demo"
    assert by_id[summary["baseline_id"]]["objective_name"] == "accuracy"
    assert all("tiny-" in p["deployments"] and "@cpu:1" in p["deployments"] for p in plans)

    # one decision per replanning round over the trace, each with a reason
    decisions = list(csv.DictReader((out / "decisions.csv").open()))
    assert len(decisions) == len(summary["decisions"]) == 5
    assert [d["at"][:13] for d in decisions] == [
        "2021-03-01T00",
        "2021-03-01T03",
        "2021-03-01T06",
        "2021-03-01T09",
        "2021-03-01T12",
    ]
    assert all(
        d["action"] in ("apply", "keep", "hold", "propose") and d["reason"] for d in decisions
    )
    assert float(decisions[0]["signal_g_per_kwh"]) == pytest.approx(124.57)
    assert all(d["forecaster"] == "moving-max" and float(d["forecast_rps"]) > 0 for d in decisions)

    # the verification load went through the dispatcher and was recorded beside predictions
    runs = list(csv.DictReader((out / "runs.csv").open()))
    assert runs and float(runs[0]["measured_p95_ms"]) > 0
    assert float(runs[0]["measured_rate_rps"]) > 0

    carbon_rows = list(csv.DictReader((out / "carbon.csv").open()))
    assert len(carbon_rows) == 15 and carbon_rows[0]["region"] == "CISO"

    s = json.loads((out / "savings.json").read_text())
    assert s["baseline_id"] == summary["baseline_id"] and s["period"]["hours"] == 15
    assert s["greenctl"]["carbon_kg"] > 0 and s["baseline"]["carbon_kg"] > 0
    # greenctl trades accuracy for carbon against the most accurate plan, never the reverse
    assert s["savings"]["carbon_kg"] >= 0 and s["savings"]["accuracy_change"] <= 0
    assert "modeled" in s["method"]

    for name in ("carbon.png", "latency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    # nothing left running
    from greenctl.data.store import open_store

    with open_store(summary["db"]) as store:
        pids = [r["pid"] for r in store.db.table("executor_instances").rows if r["pid"]]
        pids += [r["pid"] for r in store.db.table("executor_dispatcher").rows if r["pid"]]
        assert pids
        assert not [p for p in pids if _alive(p)]
        assert store.db.table("executor_dispatcher").count_where("state = 'running'") == 0
