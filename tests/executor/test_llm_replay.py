"""Replay of an llm plan over a day of CISO's carbon signal (modeled): greenctl's shares
follow the signal and, at the same average quality, emit less carbon than a static share
(Quality Time's headline); the largest and smallest tiers bound it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data import carbon_io
from greenctl.executor.control import replay as rp

from tests.planner.llm.rows import add_family

REQUEST = {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60,
           "budget": {"cpu": 8}, "objective": "balanced", "gamma": 0.3}  # fmt: skip
DAY = {"region": "CISO", "every": "1h", "start": "2021-03-01T00:00:00Z", "hours": 24}


@pytest.fixture
def day(store, tmp_path: Path):
    """The synthetic tiers, CISO's March signal and a flat load of 3 req/s for a day."""
    add_family(store)
    carbon_io.import_bundled(store, "clover-ciso-march")
    trace = tmp_path / "load.txt"
    trace.write_text(" ".join(["3"] * (24 * 3600)) + "\n")
    return store, trace


def test_shares_follow_carbon_and_beat_a_static_share(day) -> None:
    store, trace = day
    out = rp.replay(store, kind="llm", request=REQUEST, load_trace=str(trace), min_dwell_s=0, **DAY)
    by = {s["policy"]: s for s in out["summary"]}
    assert set(by) == {"greenctl", "largest", "smallest", "static"}
    green, static = by["greenctl"], by["static"]
    # the same average quality, less carbon
    assert green["accuracy"] == pytest.approx(static["accuracy"], abs=1e-6)
    assert green["carbon_g"] <= 0.9 * static["carbon_g"]
    assert by["largest"]["accuracy"] == pytest.approx(0.9)
    assert by["smallest"]["accuracy"] == pytest.approx(0.55)
    assert by["smallest"]["carbon_g"] < green["carbon_g"] < by["largest"]["carbon_g"]
    # the shares follow the signal: less quality in the dirtiest hour than in the cleanest
    rows = out["intervals"]["greenctl"]
    dirtiest = max(rows, key=lambda r: r["carbon_g_per_kwh"])
    cleanest = min(rows, key=lambda r: r["carbon_g_per_kwh"])
    assert dirtiest["accuracy"] < cleanest["accuracy"]
    assert green["changes"] >= 2
    assert out["meta"]["kind"] == "llm" and out["meta"]["slo_ms"] == 800


def test_on_the_cli_with_a_request_file(day, cli, tmp_path) -> None:
    _, trace = day
    req = tmp_path / "req.json"
    req.write_text(json.dumps(REQUEST))
    args = ("replay", "llm", "--request", req, "--load-trace", trace, "--region", "CISO",
            "--every", "1h", "--from", "2021-03-01T00:00:00Z", "--hours", "6")  # fmt: skip
    r = cli(*args, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [s["policy"] for s in doc["summary"]] == ["greenctl", "largest", "smallest", "static"]
    r = cli(*args)
    assert r.exit_code == 0 and "Replay of llm" in r.output and "TPOT 60 ms" in r.output
    r = cli("replay", "llm", "--request", req, "--region", "CISO")
    assert r.exit_code == 2 and "--load-trace" in r.output and "Traceback" not in r.output
