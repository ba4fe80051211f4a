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
@pytest.mark.parametrize("model", [None, "resnet"])
def test_demo_quick_writes_a_real_report_and_stops_everything(cli, tmp_path, model):
    """The default scenario (tiny) and the ResNet one, each the whole loop on this CPU."""
    out = tmp_path / "report"
    family = model or "tiny"
    r = cli("demo", "--quick", "--out", out, "--json", *(("--model", model) if model else ()))
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["profiles"] >= 3  # three variants of the family measured on cpu:1

    # plans: the carbon-aware plan and the carbon-unaware baseline, with deployments
    plans = list(csv.DictReader((out / "plans.csv").open()))
    by_id = {int(p["id"]): p for p in plans}
    assert by_id[summary["plan_id"]]["source"] == "demo"
    assert by_id[summary["baseline_id"]]["objective_name"] == "accuracy"
    assert all(family in p["deployments"] and "@cpu:1" in p["deployments"] for p in plans)

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
    # greenctl trades accuracy for carbon against the most accurate plan, never the reverse;
    # where the loop applied another plan (a dirtier hour), it saved carbon for accuracy
    assert s["savings"]["carbon_kg"] >= 0 and s["savings"]["accuracy_change"] <= 0
    if len({by_id[p]["deployments"] for p in s["plans_used"]}) > 1:
        assert s["savings"]["carbon_kg"] > 0 and s["savings"]["accuracy_change"] < 0
    assert "modeled" in s["method"]

    # the lowest-carbon plan for the same rate, SLO and budgets, planned beside greenctl's
    # (modeled, not applied): it never emits more per request than greenctl's plan
    low = summary["lowest_carbon"]
    assert low["deployments"].startswith(family) and "@cpu:1" in low["deployments"]
    assert low["plan_objective"] == "balanced" and "modeled" in low["method"]
    assert low["carbon_per_request_less_pct"] >= -1e-6
    assert low["same_as_plan"] == (low["deployments"] == low["plan_deployments"])

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


def test_demo_prints_the_lowest_carbon_plan_it_declined(cli, tmp_path, monkeypatch):
    """The rendering alone (run_demo stubbed): the line naming the lowest-carbon plan, what it
    would save per request and at what accuracy, labelled modeled; none when it is greenctl's."""
    from greenctl.executor import control

    def summary(same: bool) -> dict:
        return {
            "plan_id": 1,
            "baseline_id": 2,
            "decisions": [{"action": "keep"}],
            "verify": {},
            "savings": {"period": {"hours": 26.0}, "region": "CISO"},
            "savings_table": [["carbon (kg CO2)", 0.02, 0.02, 0.0, 0.0]],
            "lowest_carbon": {
                "deployments": "resnet18@cpu:1x1",
                "plan_deployments": "resnet50@cpu:1x1",
                "same_as_plan": same,
                "accuracy": 0.69758,
                "plan_accuracy": 0.7613,
                "carbon_per_request_less_pct": 15.3,
                "plan_objective": "balanced",
                "plan_gamma": 0.5,
                "method": "modeled",
            },
            "verified_later": [
                {
                    "plan_id": 4,
                    "deployments": "resnet18@cpu:1x1",
                    "predicted_p95_ms": 250.0,
                    "measured_p95_ms": 120.0,
                    "measured_rate_rps": 3.9,
                }
            ],
            "out_dir": str(tmp_path),
            "files": [],
            "stopped": 0,
        }

    for same in (False, True):
        monkeypatch.setattr(control, "run_demo", lambda s=same, **_kw: summary(s))
        r = cli("demo", "--out", tmp_path)
        assert r.exit_code == 0, r.output
        text = " ".join(r.output.split())
        assert (
            "plan 4 (resnet18@cpu:1x1), which the replay applied: predicted p95 250.0 ms, "
            "measured p95 120.0 ms at 3.9 req/s" in text
        )
        line = "the lowest-carbon plan for the same rate and SLO, resnet18@cpu:1x1"
        if same:
            assert line not in text
        else:
            assert line in text
            assert "15.3 % less carbon per request at accuracy 0.70" in text
            assert "modeled, not applied" in text and "(gamma 0.5)" in text
