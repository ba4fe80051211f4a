"""Replay's InfAdapter baseline (its own loop: LSTM forecast + the exact mix every interval),
the default forecaster, and the exactness of the solver memo a replay runs under."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from greenctl.executor.control import forecasters
from greenctl.executor.control import replay as rp
from greenctl.executor.kinds import get_kind, mix_replay, serving_replay
from greenctl.planner.core import forecast as fc
from greenctl.planner.core import solvers


def _trace(tmp_path: Path, minutes: list[float], name: str = "t.txt") -> Path:
    """Synthetic: each minute at its rate, second by second."""
    p = tmp_path / name
    p.write_text(" ".join(f"{r:g}" for r in np.repeat(minutes, 60)) + "\n")
    return p


STEP = [20.0] * 4 + [120.0] * 4 + [20.0] * 2  # 10 minutes: a step up and down
HISTORY = [20.0, 40.0, 80.0, 120.0, 80.0, 40.0] * 5  # 30 minutes of a cycle


def _request() -> dict:
    return {
        "model": "resnet",
        "slo_ms": 750.0,
        "percentile": "p99",
        "budgets": {"cpu": 20.0},
        "objective": "balanced",
        "alpha": 0.05,
        "beta": 0.001,
    }


def test_infadapter_is_left_out_without_history_to_learn_from(resnet, tmp_path):
    out = rp.replay(
        resnet, load_trace=str(_trace(tmp_path, STEP)), request=_request(), min_dwell_s=0,
        baselines=("infadapter",),
    )  # fmt: skip
    assert "infadapter" not in out["intervals"]
    assert any(n.startswith("infadapter: left out") and "--from" in n for n in out["meta"]["notes"])


def test_infadapter_sizes_the_exact_mix_for_its_lstm_forecast_every_interval(
    resnet, tmp_path, monkeypatch
):
    monkeypatch.setattr(mix_replay, "INFADAPTER_MIN_STEPS", 30)  # a short fit for the test
    trace = _trace(tmp_path, HISTORY + STEP)
    out = rp.replay(
        resnet, load_trace=str(trace), request=_request(), start="30m", min_dwell_s=3600,
        baselines=("infadapter",),
    )  # fmt: skip
    rows = out["intervals"]["infadapter"]
    assert len(rows) == 10 and rows[0]["action"] == "start"
    assert any("fitted on the 30 per-60s peaks" in n for n in out["meta"]["notes"])
    forecasts = [r["forecast_rps"] for r in rows]
    assert all(f == int(f) for f in forecasts)  # rounded up to whole req/s
    # no dwell: greenctl holds its plan for the hour, InfAdapter changes when its ILP does
    assert sum(r["action"] == "change" for r in out["intervals"]["greenctl"]) <= 1
    assert {r["action"] for r in rows[1:]} <= {"keep", "change", "infeasible"}
    # each interval's plan is the exact mix at its forecast, InfAdapter's objective
    # (no carbon term), the running variants counting as loaded
    mix = get_kind("mix")
    base = {**_request(), "objective": "balanced", "gamma": 0.0, "strategy": "ilp"}
    running = mix.plan(resnet, {**base, "rate_rps": max(forecasts[0], 1.0)})[0]
    assert rows[0]["config"] == serving_replay.config_label(running.deployments)
    for k in range(1, 10):
        want = mix.plan(resnet, {**base, "rate_rps": max(forecasts[k], 1.0)}, current=running)[0]
        assert rows[k]["config"] == serving_replay.config_label(want.deployments), k
        assert (rows[k]["action"] == "change") == (
            mix_replay.loaded_key(want.deployments) != mix_replay.loaded_key(running.deployments)
        )
        running = want
    assert out["meta"]["replan"]["infadapter_plans"] >= 1


def test_infadapter_uses_a_saved_lstm(resnet, tmp_path):
    trace = _trace(tmp_path, HISTORY + STEP)
    forecasters.fit_forecaster(
        resnet, kind="lstm", name=mix_replay.INFADAPTER_FORECASTER, trace=str(trace),
        params={"epochs": 2, "hidden": 4, "window": 3},
    )  # fmt: skip
    out = rp.replay(
        resnet, load_trace=str(trace), request=_request(), start="30m", min_dwell_s=0,
        baselines=("infadapter",),
    )  # fmt: skip
    assert len(out["intervals"]["infadapter"]) == 10
    assert any("the saved forecaster 'lstm'" in n for n in out["meta"]["notes"])


def test_the_default_forecaster_is_the_one_constant(resnet, tmp_path):
    out = rp.replay(
        resnet, load_trace=str(_trace(tmp_path, STEP)), request=_request(), baselines=()
    )
    assert out["meta"]["forecaster"] == fc.DEFAULT_FORECASTER


def test_the_solver_memo_changes_no_figure(resnet, tmp_path, monkeypatch):
    """A replay under the memo equals one that solves every problem afresh."""
    trace = str(_trace(tmp_path, HISTORY + STEP))
    kw = {"load_trace": trace, "request": _request(), "start": "30m", "min_dwell_s": 0,
          "forecaster": "last"}  # fmt: skip
    memo = rp.replay(resnet, **kw, baselines=("base", "infaas"))
    assert memo["meta"]["solver"]["highs_memo_hits"] > 0
    monkeypatch.setattr(solvers, "_MemoHighs", lambda h, memo, options: h)  # no memo
    fresh = rp.replay(resnet, **kw, baselines=("base", "infaas"))
    assert fresh["meta"]["solver"]["highs_memo_hits"] == 0
    assert memo["summary"] == fresh["summary"]
    for name, rows in memo["intervals"].items():
        assert rows == fresh["intervals"][name], name


def test_cli_replays_infadapter_and_names_the_forecaster(resnet, tmp_path, cli, monkeypatch):
    import json

    monkeypatch.setattr(mix_replay, "INFADAPTER_MIN_STEPS", 30)
    trace = _trace(tmp_path, HISTORY + STEP)
    r = cli(
        "replay", "--load-trace", trace, "--model", "resnet", "--slo-ms", "750",
        "--percentile", "p99", "--budget", "cpu=20", "--from", "30m", "--min-dwell", "0",
        "--baseline", "infadapter", "--baseline", "base", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {s["policy"] for s in doc["summary"]} == {"greenctl", "infadapter", "base"}
    assert doc["meta"]["forecaster"] == fc.DEFAULT_FORECASTER
    assert doc["meta"]["solver"]["highs_runs"] >= 1
