"""The lognormal tail integrals stay finite far below a service time's bulk (issue 21: `plan
mig --json` printed ``"p95_fifo_ms": NaN`` at 1,423 req/s on 12 H200s)."""

from __future__ import annotations

import numpy as np
from greenctl.planner.core.latency import ServiceTime, lognormal_terms


def test_exp_smoothed_sf_is_finite_below_the_integration_range():
    s = ServiceTime.lognormal(median_ms=100.0, sigma=0.1)
    # 10 ms is 23 sigmas below the median, under the integral's range (7 sigmas): with a
    # fast exponential (theta 100 per ms) exp(theta (y - x)) overflowed and 0 x inf was NaN
    t = np.array([1.0, 10.0, 40.0, 100.0, 200.0])
    got = s.exp_smoothed_sf(t, 100.0)
    assert np.all(np.isfinite(got))
    assert np.all((got >= 0) & (got <= 1 + 1e-12))
    assert got[0] == got[1] == 1.0  # S is all above t: P(Exp + S > t) = 1
    sf, es = lognormal_terms((s, s), t, 0.0, 100.0)
    assert np.all(np.isfinite(sf)) and np.all(np.isfinite(es))
    np.testing.assert_allclose(es[0], got, atol=1e-12)
