"""Replay's MS+ baseline (InfAdapter's model switching plus autoscaling): one variant at a
time, its replicas sized to the forecast within the budget, switched by InfAdapter's
objective, on InfAdapter's ResNet CPU profiles (third-party measurements)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from greenctl.executor.control import replay as rp
from greenctl.executor.kinds import get_kind, mix_replay, serving_replay

STEP = [20.0] * 4 + [120.0] * 4 + [20.0] * 2  # 10 minutes: a step up and down
HISTORY = [20.0, 40.0, 80.0, 120.0, 80.0, 40.0] * 5  # 30 minutes of a cycle


def _trace(tmp_path: Path, minutes: list[float]) -> Path:
    """Synthetic: each minute at its rate, second by second."""
    p = tmp_path / "t.txt"
    p.write_text(" ".join(f"{r:g}" for r in np.repeat(minutes, 60)) + "\n")
    return p


def _request(cores: float = 20.0) -> dict:
    return {
        "model": "resnet",
        "slo_ms": 750.0,
        "percentile": "p99",
        "budgets": {"cpu": cores},
        "objective": "balanced",
        "alpha": 0.05,
        "beta": 0.001,
    }


def _variants(config: str) -> set[str]:
    """The variants of a config label (``resnet50@cpu:6x1 + resnet50@cpu:1x2``)."""
    return {part.split("@", 1)[0] for part in config.split(" + ")}


def _replay(store, trace: Path, cores: float = 20.0, **kw):
    kw.setdefault("baselines", ("msplus",))
    return rp.replay(
        store, load_trace=str(trace), request=_request(cores), min_dwell_s=0,
        forecaster="last", **kw,
    )  # fmt: skip


def test_msplus_serves_one_variant_and_scales_its_replicas_with_the_step(resnet, tmp_path):
    out = _replay(resnet, _trace(tmp_path, STEP), baselines=("msplus", "base", "vpa"))
    rows = out["intervals"]["msplus"]
    assert len(rows) == 10 and rows[0]["action"] == "start"
    for r in rows:
        assert len(_variants(r["config"])) == 1, r["config"]  # one variant at a time
        assert 0 < r["units"] <= 20.0  # within the CPU budget
    # "last": interval k plans for interval k-1's peak; the step reaches it at k = 5..8
    low = [rows[k] for k in (1, 2, 3, 4, 9)]
    high = [rows[k] for k in (5, 6, 7, 8)]
    assert all(r["forecast_rps"] == 120.0 for r in high)
    # its instances' cores follow the load up and back down
    assert min(r["units"] for r in high) > max(r["units"] for r in low)
    # it switches the variant with the load (the accurate one at low load)
    assert _variants(rows[1]["config"]) != _variants(rows[5]["config"])
    assert out["meta"]["replan"]["msplus_plans"] >= 2
    assert any(n.startswith("msplus: one variant at a time, for greenctl's forecasts")
               for n in out["meta"]["notes"])  # fmt: skip


def test_msplus_is_the_one_variant_plan_of_infadapters_objective(resnet, tmp_path):
    """Each interval's configuration is the mix kind's one-variant plan (strategy single)
    for its forecast, InfAdapter's objective, the running variant loaded: neither base's
    peak-sized plan nor VPA's pod."""
    out = _replay(resnet, _trace(tmp_path, STEP), baselines=("msplus", "base", "vpa"))
    rows = out["intervals"]["msplus"]
    mix = get_kind("mix")
    base = {**_request(), "gamma": 0.0, "strategy": "single"}
    running = mix.plan(resnet, {**base, "rate_rps": rows[0]["forecast_rps"]})[0]
    assert rows[0]["config"] == serving_replay.config_label(running.deployments)
    for k in range(1, 10):
        want = mix.plan(resnet, {**base, "rate_rps": rows[k]["forecast_rps"]}, current=running)[0]
        assert rows[k]["config"] == serving_replay.config_label(want.deployments), k
        running = want
    configs = {name: [r["config"] for r in rs] for name, rs in out["intervals"].items()}
    assert configs["msplus"] != configs["base"]
    assert configs["msplus"] != configs["vpa"]
    summary = {s["policy"]: s for s in out["summary"]}
    for other in ("base", "vpa"):
        assert summary["msplus"]["mean_units"] != summary[other]["mean_units"], other


def test_msplus_plans_for_infadapters_lstm_forecast_with_history(resnet, tmp_path, monkeypatch):
    monkeypatch.setattr(mix_replay, "INFADAPTER_MIN_STEPS", 30)  # a short fit for the test
    out = _replay(
        resnet, _trace(tmp_path, HISTORY + STEP), start="30m",
        baselines=("msplus", "infadapter"),
    )  # fmt: skip
    ms, ia = out["intervals"]["msplus"], out["intervals"]["infadapter"]
    assert [r["forecast_rps"] for r in ms] == [r["forecast_rps"] for r in ia]
    assert any(
        n.startswith("msplus: one variant at a time, forecasts by InfAdapter's LSTM")
        for n in out["meta"]["notes"]
    )
    assert all(len(_variants(r["config"])) == 1 for r in ms)


def test_msplus_above_what_one_variant_carries_serves_at_its_ceiling(resnet, tmp_path):
    """Over the budget's reach it runs the one-variant plan for the most load the budget
    carries, inside the budget, and the violations show it."""
    out = _replay(resnet, _trace(tmp_path, [20.0] * 2 + [300.0] * 3), cores=4.0)
    rows = out["intervals"]["msplus"]
    assert all(r["units"] <= 4.0 for r in rows)
    assert any(n.startswith("msplus: ") and "ceiling" in n for n in out["meta"]["notes"])
    assert sum(r["violations"] for r in rows[3:]) > 0


def test_cli_replays_msplus_with_its_summary_row(resnet, tmp_path, cli):
    r = cli(
        "replay", "--load-trace", _trace(tmp_path, STEP), "--model", "resnet", "--slo-ms",
        "750", "--percentile", "p99", "--budget", "cpu=20", "--min-dwell", "0",
        "--baseline", "msplus", "--baseline", "vpa", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    rows = {s["policy"]: s for s in doc["summary"]}
    assert set(rows) == {"greenctl", "msplus", "vpa"}
    assert set(rows["msplus"]) == set(rows["vpa"])  # the same columns as every row
    assert rows["msplus"]["requests"] == rows["vpa"]["requests"] > 0
    assert rows["msplus"]["accuracy"] is not None and rows["msplus"]["changes"] >= 1


def test_msplus_is_not_a_default_baseline(resnet, tmp_path):
    out = rp.replay(
        resnet, load_trace=str(_trace(tmp_path, STEP)), request=_request(), min_dwell_s=0
    )
    assert "msplus" not in out["intervals"]
    assert "msplus" in mix_replay.STEP.baselines
