"""Load forecasters: rule-based exactness, LSTM learns a pattern, scoring, trace parsing."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.traces import read_rps_trace
from greenctl.planner.core import forecast as fc
from hypothesis import given, settings
from hypothesis import strategies as st


def test_minute_maxima():
    rps = np.arange(150, dtype=float)
    assert fc.minute_maxima(rps).tolist() == [59.0, 119.0]
    assert fc.minute_maxima(np.array([3.0, 7.0])).tolist() == [7.0]


def test_rule_based_one_step_ahead():
    s = np.array([1, 5, 2, 8, 3, 4], dtype=float)
    assert fc.make_forecaster("last").predict_series(s, 2).tolist() == [5, 2, 8, 3]
    mm = fc.make_forecaster("moving-max", window=2)
    assert mm.predict_series(s, 2).tolist() == [5, 5, 8, 8]
    assert mm.predict_next(s) == 4.0
    sn = fc.make_forecaster("seasonal-naive", period=3)
    # before one period: last value; then s[t-3]
    assert sn.predict_series(s, 1).tolist() == [1, 5, 1, 5, 2]
    assert sn.predict_next(s) == 8.0


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=500, allow_nan=False), min_size=2, max_size=60),
    st.integers(min_value=1, max_value=12),
)
def test_moving_max_matches_brute_force(values, window):
    s = np.asarray(values)
    pred = fc.make_forecaster("moving-max", window=window).predict_series(s, 1)
    brute = [max(s[max(0, t - window) : t]) for t in range(1, s.size)]
    assert pred.tolist() == pytest.approx(brute)
    # a moving max never predicts below the last value
    assert np.all(pred >= s[:-1])


def test_score_counts_under_prediction():
    s = fc.score("x", np.array([10.0, 20.0, 30.0, 0.0]), np.array([12.0, 20.0, 25.0, 0.0]))
    assert s.under_rate == 0.25 and s.mean_under_rps == 2.0
    assert s.mae_rps == pytest.approx((2 + 0 + 5 + 0) / 4)
    assert s.mape_pct == pytest.approx((2 / 12 + 0 + 5 / 25) / 3 * 100)


def test_lstm_learns_a_periodic_load_and_round_trips():
    series = np.tile([10.0, 80.0, 30.0, 60.0, 20.0], 80)  # a 5-minute cycle
    lstm = fc.make_forecaster("lstm", epochs=20, hidden=16, lr=0.02, batch_size=32)
    lstm.fit(series[:300])
    s_lstm = fc.evaluate(lstm, series, train=300)
    s_last = fc.evaluate(fc.make_forecaster("last"), series, train=300)
    assert s_lstm.mae_rps < s_last.mae_rps / 3  # it learned the cycle
    params, state = lstm.to_state()
    assert state is not None
    again = fc.restore_forecaster("lstm", params, state)
    assert again.predict_next(series) == pytest.approx(lstm.predict_next(series), rel=1e-5)


def test_lstm_needs_history_and_fit():
    with pytest.raises(InputError, match="more than 11 minutes"):
        fc.make_forecaster("lstm").fit(np.ones(5))
    with pytest.raises(InputError, match="not fitted"):
        fc.make_forecaster("lstm").predict_next(np.ones(20))
    with pytest.raises(InputError, match="quantile"):
        fc.make_forecaster("lstm", quantile=1.5)


def test_unknown_forecaster_and_bad_params():
    with pytest.raises(InputError, match="unknown forecaster 'arima'"):
        fc.make_forecaster("arima")
    with pytest.raises(InputError, match="seasonal-naive"):
        fc.make_forecaster("seasonal-naive", window=3)


def test_trace_formats(tmp_path):
    p = tmp_path / "t.txt.gz"
    p.write_bytes(gzip.compress(b"1 2 3\n4 5\n"))
    assert read_rps_trace(p).tolist() == [1, 2, 3, 4, 5]
    c = tmp_path / "t.csv"
    c.write_text("time,rate_rps\n0,3.5\n1,4\n")
    assert read_rps_trace(c).tolist() == [3.5, 4.0]
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n3 x 5\n")
    with pytest.raises(FileFormatError, match="line 2"):
        read_rps_trace(bad)
    neg = tmp_path / "neg.txt"
    neg.write_text("1 -2\n")
    with pytest.raises(FileFormatError, match="not a rate"):
        read_rps_trace(neg)


def test_reference_trace_shape():
    rps = read_rps_trace(path_of("twitter"))
    assert rps.size == 1_899_061 and rps.max() == 388
    minutes = fc.minute_maxima(rps)
    assert minutes.size == 1_899_061 // 60
    last = fc.evaluate(fc.make_forecaster("last"), minutes, train=14 * 1440)
    mm = fc.evaluate(fc.make_forecaster("moving-max"), minutes, train=14 * 1440)
    # a 10-minute max under-predicts far less often than the last value
    assert mm.under_rate < last.under_rate / 2
