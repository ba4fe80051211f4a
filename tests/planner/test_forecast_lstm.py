"""The LSTM's options: learning the change from the last value, a minimum of optimizer steps,
and the one default forecaster."""

from __future__ import annotations

import numpy as np
import pytest
from greenctl.data.errors import InputError
from greenctl.planner.core import forecast as fc


def test_the_diff_target_learns_a_cycle_and_round_trips():
    series = np.tile([10.0, 80.0, 30.0, 60.0, 20.0], 80)  # a 5-minute cycle
    lstm = fc.make_forecaster("lstm", epochs=20, hidden=16, lr=0.02, batch_size=32, target="diff")
    lstm.fit(series[:300])
    s_lstm = fc.evaluate(lstm, series, train=300)
    s_last = fc.evaluate(fc.make_forecaster("last"), series, train=300)
    assert s_lstm.mae_rps < s_last.mae_rps / 3
    params, state = lstm.to_state()
    assert params["target"] == "diff"
    again = fc.restore_forecaster("lstm", params, state)
    assert again.predict_next(series) == pytest.approx(lstm.predict_next(series), rel=1e-5)


def test_an_untrained_diff_lstm_starts_near_the_last_value():
    """Predictions are the last value plus what the net adds: one epoch on a flat series
    leaves them at that level."""
    flat = np.full(200, 50.0)
    lstm = fc.make_forecaster("lstm", epochs=1, hidden=4, target="diff").fit(flat)
    assert lstm.predict_next(flat) == pytest.approx(50.0, abs=5.0)


def test_min_steps_trains_a_short_history_for_longer(monkeypatch):
    steps = []
    import torch

    real = torch.optim.Adam.step

    def counting(self, *a, **kw):
        steps.append(1)
        return real(self, *a, **kw)

    monkeypatch.setattr(torch.optim.Adam, "step", counting)
    series = np.tile([10.0, 20.0, 30.0], 30)  # 90 minutes: one batch of 512 per epoch
    fc.make_forecaster("lstm", epochs=2, hidden=4).fit(series)
    assert len(steps) == 2
    steps.clear()
    fc.make_forecaster("lstm", epochs=2, hidden=4, min_steps=7).fit(series)
    assert len(steps) == 7


def test_bad_lstm_options():
    with pytest.raises(InputError, match="target"):
        fc.make_forecaster("lstm", target="ratio")
    with pytest.raises(InputError, match="min_steps"):
        fc.make_forecaster("lstm", min_steps=0)


def test_the_default_forecaster_is_a_known_one():
    assert fc.DEFAULT_FORECASTER in fc.FORECASTERS
    assert fc.make_forecaster(fc.DEFAULT_FORECASTER).name == fc.DEFAULT_FORECASTER


def test_horizon_targets_the_peak_of_the_next_minutes():
    s = np.array([1.0, 5.0, 2.0, 8.0, 3.0, 4.0])
    x, y = fc._windows(s, 2, 3)
    assert x.tolist() == [[1, 5], [5, 2]]
    assert y.tolist() == [8.0, 8.0]  # max(2, 8, 3), max(8, 3, 4)
    x1, y1 = fc._windows(s, 2)
    assert y1.tolist() == s[2:].tolist() and len(x1) == 4
    with pytest.raises(InputError, match="more than 13 minutes"):
        fc.make_forecaster("lstm", horizon=3).fit(np.ones(13))
