"""The forms planning computes without scipy agree with scipy's to double precision: the
normal CDF, log k!, the Poisson tail (regularised incomplete gamma) and Brent's method."""

from __future__ import annotations

import math

import numpy as np
import pytest
from greenctl.planner.core import batch_latency
from greenctl.planner.core.latency import ndtr
from greenctl.planner.core.service import brent_root
from scipy import optimize, special


def test_ndtr_matches_scipy_on_both_paths_and_keeps_shapes() -> None:
    x = np.concatenate([np.linspace(-37.0, 37.0, 2001), [0.0, -0.0, 1e-300, np.inf, -np.inf]])
    small = np.array([ndtr(np.array([v]))[0] for v in x])  # one value at a time: math.erfc
    ref = special.ndtr(x)
    assert np.allclose(small, ref, rtol=1e-13, atol=0.0)
    assert np.array_equal(ndtr(x), ref)  # a large array goes through scipy
    assert ndtr(np.zeros((2, 3))).shape == (2, 3) and ndtr(1.5).shape == ()
    assert math.isnan(float(ndtr(np.nan)))


def test_log_factorial_and_poisson_pmf_match_scipy() -> None:
    k = np.arange(700.0)
    assert np.allclose(batch_latency._log_factorial(k), special.gammaln(k + 1.0), rtol=1e-14)
    mu = np.array([0.0, 0.4, 6.0, 90.0])[:, None]
    kk = np.arange(60)[None, :]
    ref = np.where(mu > 0, np.exp(kk * np.log(np.maximum(mu, 1e-300)) - mu
                   - special.gammaln(kk + 1.0)), (kk == 0).astype(float))  # fmt: skip
    assert np.allclose(batch_latency._poisson_pmf(kk, mu), ref, rtol=1e-12, atol=1e-300)
    with pytest.raises(ValueError, match="whole number"):
        batch_latency._log_factorial(np.array([1.5]))


@pytest.mark.parametrize("k", [1, 2, 5, 16, 64, 300])
def test_poisson_tail_matches_the_incomplete_gamma(k: int) -> None:
    for x in (1e-6, 0.01, 0.5, 1.0, 3.0, k - 0.5, float(k), k + 0.5, 2.0 * k, 4.0 * k + 10):
        ref = float(special.gammainc(k, x))
        got = batch_latency._at_least(k, x)
        assert got == pytest.approx(ref, rel=1e-11, abs=1e-300), (k, x)
    assert batch_latency._at_least(k, 0.0) == 0.0


@pytest.mark.parametrize(
    ("f", "a", "b"),
    [
        (lambda x: x**3 - 2 * x - 5, 0.0, 3.0),
        (lambda x: math.cos(x) - x, -1.0, 5.0),
        (lambda x: math.exp(x) - 10.0, 0.01, 9.0),
        (lambda x: (x - 1.0) ** 5, -3.0, 4.0),
        (lambda x: 1.0 / (x + 0.01) - 3.0, 0.0, 2.5),
    ],
)
def test_brent_root_takes_scipys_steps(f, a: float, b: float) -> None:
    ref = optimize.brentq(f, a, b, xtol=1e-12, rtol=1e-10)
    assert brent_root(f, a, b, xtol=1e-12, rtol=1e-10) == ref


def test_brent_root_needs_a_sign_change() -> None:
    with pytest.raises(ValueError, match="different signs"):
        brent_root(lambda x: x * x + 1.0, -1.0, 1.0, xtol=1e-12, rtol=1e-10)
