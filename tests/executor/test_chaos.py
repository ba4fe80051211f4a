"""The chaos test, one minute of it (``bench/chaos.py`` runs ten by default): open-loop load
while random kill -9s hit executors, the dispatcher and its supervisor; and its quick mode,
whose faults of the commands around a serving plan (SIGTERM and kill -9 of an apply, a
refused plan, a port in use, a read-only store, apply and down at once) must each lose no
request, leave no process and change the store only as the fault allows.

The minute holds what two minutes at the bench's defaults hold: twice the rate (80 req/s, so
over 3,000 requests) and kills twice as often (every 1.5-4.5 s, a dozen or more; each waits
until the plan serves again, so kills never overlap however dense).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_minute_of_kill_9_lose_no_request_and_leave_nothing(tmp_path: Path):
    argv = [sys.executable, str(REPO / "bench" / "chaos.py"), "--duration", "60", "--rate", "80"]
    argv += ["--kill-min", "1.5", "--kill-max", "4.5", "--settle", "5"]
    argv += ["--seed", "0", "--json", "--work", str(tmp_path / "chaos")]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    where = json.dumps({k: v for k, v in report.items() if k != "kills"}, indent=1)
    req = report["requests"]
    assert req["sent"] > 3000, where
    assert req["failed"] == 0, where  # each request needed at most one retry
    assert len(report["kills"]) >= 8, report["kills"]
    assert all(k["recovery_s"] is not None for k in report["kills"]), report["kills"]
    assert {k["kind"] for k in report["kills"]} == {"executor", "dispatcher", "supervisor"}
    assert report["final_state"] == "serving", where
    assert report["left_after_down"] == [], where
    assert report["target_met"] and proc.returncode == 0, where


def test_the_quick_faults_lose_nothing_and_leave_nothing(tmp_path: Path):
    argv = [sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", "--json"]
    argv += ["--seed", "1", "--work", str(tmp_path / "chaos")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=540)
    assert proc.stdout.strip(), proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    faults = {f["fault"]: f for f in report["faults"]}
    where = json.dumps(report["faults"], indent=1)
    assert set(faults) == {
        "sigterm-apply", "kill9-apply", "refused-plan", "port-in-use", "readonly-replan",
        "apply-and-down",
    }  # fmt: skip
    ran = [f for f in faults.values() if "skipped" not in f]
    assert all(f["as_expected"] for f in ran), where
    assert all(f["processes_left"] == 0 for f in ran), where
    for name in ("sigterm-apply", "kill9-apply", "refused-plan", "port-in-use"):
        assert faults[name]["requests_lost"] == 0 and faults[name]["requests_sent"] > 50, where
    assert faults["sigterm-apply"]["exit_code"] == 1, where
    assert "previous configuration is still serving" in faults["sigterm-apply"]["message"]
    assert faults["kill9-apply"]["orphans_before_recovery"] >= 1, where  # then recovered
    for name in ("refused-plan", "port-in-use"):
        assert faults[name]["exit_code"] == 2 and faults[name]["store_rows_changed"] == 0, where
        assert faults[name]["message"].startswith("Error: "), where
    if "skipped" not in faults["readonly-replan"]:
        assert faults["readonly-replan"]["store_rows_changed"] == 0, where
    assert report["requests"]["failed"] == 0 and report["left_after_down"] == []
    assert report["target_met"] and proc.returncode == 0, where
