"""`greenctl forecast fit/predict/list` on a small trace and on the store's load."""

from __future__ import annotations

import json

import numpy as np


def _trace(tmp_path, minutes=120):
    rng = np.random.default_rng(0)
    t = np.arange(minutes * 60)
    rps = 50 + 20 * np.sin(2 * np.pi * t / 1800) + rng.poisson(5, t.size)
    p = tmp_path / "rps.txt"
    p.write_text(" ".join(str(int(v)) for v in rps))
    return p


def test_fit_predict_list(cli, tmp_path):
    p = _trace(tmp_path)
    r = cli("forecast", "fit", "-f", "moving-max", "--window", "5", "--trace", p, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["train_minutes"] == 96 and out["test_minutes"] == 24
    assert set(out["metrics"]) >= {"mae_rps", "mape_pct", "under_rate"}
    r = cli("forecast", "predict", "-f", "moving-max", "--trace", p, "--json")
    pred = json.loads(r.stdout)
    assert pred["history_minutes"] == 120 and pred["predicted_peak_rps"] >= pred["last_peak_rps"]
    r = cli("forecast", "fit", "-f", "lstm", "--name", "tiny", "--epochs", "1", "--trace", p)
    assert r.exit_code == 0, r.output
    r = cli("forecast", "list", "--json")
    assert {x["name"] for x in json.loads(r.stdout)} == {"moving-max", "tiny"}
    r = cli("forecast", "predict", "-f", "tiny", "--trace", p, "--json")
    assert json.loads(r.stdout)["kind"] == "lstm"


def test_store_history_and_errors(cli, store):
    from greenctl.executor.control import history

    r = cli("forecast", "predict")
    assert r.exit_code == 2 and "no measured load" in r.output
    history.record_load(
        store,
        [
            history.LoadSample(time=f"2024-01-01T00:{m:02d}:{s:02d}Z", rate_rps=m + s / 10)
            for m in range(3)
            for s in (0, 30)
        ],
    )
    r = cli("forecast", "predict", "--json")
    out = json.loads(r.stdout)
    assert out["history_minutes"] == 3 and out["last_peak_rps"] == 5.0
    r = cli("forecast", "predict", "-f", "nope")
    assert r.exit_code == 2 and "no forecaster named 'nope'" in r.output
