"""The chaos test, one minute of it (``bench/chaos.py`` runs ten by default): open-loop load
while random kill -9s hit executors, the dispatcher and its supervisor.

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
