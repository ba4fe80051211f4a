"""Analytic fast path: service-time fits, Erlang C, M/G/c and batching approximations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from greenctl.data.errors import InputError
from greenctl.data.records import Profile
from greenctl.planner.core.latency import SIGMA_MAX, ServiceTime
from greenctl.planner.core.queueing import (
    batch_capacity_at_slo,
    batch_latency_quantile_ms,
    capacity_at_slo,
    erlang_c,
    latency_quantile_ms,
    mgc_wait_quantile_ms,
    pooled_latency_quantile_ms,
)
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq


# -- ServiceTime ----------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    p50=st.floats(0.5, 500),
    r95=st.floats(1.01, 3.0),
    r99=st.floats(1.01, 3.0),
)
def test_three_percentile_fit_reproduces_or_bounds_them(p50, r95, r99):
    p95 = p50 * r95
    p99 = p95 * r99
    s = ServiceTime.from_percentiles(p50=p50, p95=p95, p99=p99)
    assert s.quantile(0.5) == pytest.approx(p50, rel=1e-6)
    assert s.quantile(0.95) == pytest.approx(p95, rel=1e-6)
    # Exact; or the fallback without a shift, which over-states p99; or, where the exact fit
    # is wider than SIGMA_MAX, the capped one, which under-states it (a few runs' straggler).
    if s.quantile(0.99) < p99 * (1 - 1e-6):
        assert s.sigma == pytest.approx(SIGMA_MAX)
    assert s.sigma <= SIGMA_MAX * (1 + 1e-9) or s.shift_ms == 0
    assert s.shift_ms >= 0
    assert s.mean_ms > 0 and s.scv >= 0


def test_two_percentile_fit_and_deterministic():
    s = ServiceTime.from_percentiles(p50=20.0, p99=50.0)
    assert s.quantile(0.5) == pytest.approx(20.0)
    assert s.quantile(0.99) == pytest.approx(50.0)
    d = ServiceTime.from_percentiles(p50=12.0)
    assert d.kind == "deterministic" and d.mean_ms == 12.0 and d.scv == 0.0
    assert ServiceTime.from_percentiles(10, 10, 10).kind == "deterministic"


def test_a_straggler_p99_does_not_fit_an_unbounded_tail():
    """tiny-l's back-to-back profile on the 2-core VM: 545 runs, p99 set by about five of
    them. The exact fit had sigma 2.6, p99.99 159 ms and scv 4.9."""
    s = ServiceTime.from_percentiles(3.62, 4.31, 7.71)
    assert s.sigma == pytest.approx(SIGMA_MAX)
    assert s.quantile(0.5) == pytest.approx(3.62) and s.quantile(0.95) == pytest.approx(4.31)
    assert 4.31 < s.quantile(0.99) < 7.71
    assert s.scv < 0.1 and s.quantile(0.9999) < 25.0
    exact = ServiceTime.from_percentiles(3.62, 4.31, 5.2)  # a tail within the cap stays exact
    assert exact.quantile(0.99) == pytest.approx(5.2) and exact.sigma < SIGMA_MAX


def test_exact_three_point_fit_matches_a_known_shifted_lognormal():
    truth = ServiceTime.lognormal(median_ms=5.0, sigma=0.6, shift_ms=10.0)
    fit = ServiceTime.from_percentiles(
        truth.quantile(0.5), truth.quantile(0.95), truth.quantile(0.99)
    )
    assert fit.shift_ms == pytest.approx(10.0, rel=1e-6)
    assert fit.sigma == pytest.approx(0.6, rel=1e-6)
    assert fit.mean_ms == pytest.approx(truth.mean_ms, rel=1e-6)


def test_bad_percentiles_are_input_errors():
    with pytest.raises(InputError, match="must not decrease"):
        ServiceTime.from_percentiles(p50=30.0, p95=20.0)
    with pytest.raises(InputError, match="positive"):
        ServiceTime.from_percentiles(p50=-1.0)


def test_sample_matches_moments():
    s = ServiceTime.from_percentiles(20.0, 30.0, 45.0)
    x = s.sample(np.random.default_rng(1), 200_000)
    assert x.mean() == pytest.approx(s.mean_ms, rel=0.01)
    assert np.quantile(x, 0.95) == pytest.approx(s.quantile(0.95), rel=0.01)
    assert (x >= s.shift_ms).all()


def test_from_profile_uses_percentiles_or_throughput():
    p = Profile("r50", "cpu:4", 1, throughput_rps=40.0, latency_p50_ms=20.0, latency_p95_ms=30.0)
    assert ServiceTime.from_profile(p).quantile(0.95) == pytest.approx(30.0)
    q = Profile("r50", "cpu:4", 4, throughput_rps=100.0)
    assert ServiceTime.from_profile(q) == ServiceTime.deterministic(40.0)
    with pytest.raises(InputError, match="r50 on cpu:4 batch 1"):
        ServiceTime.from_profile(Profile("r50", "cpu:4", 1, throughput_rps=0.0))


# -- Erlang C and M/M/c -----------------------------------------------------------------------
def test_erlang_c_known_values():
    assert erlang_c(1, 0.5) == pytest.approx(0.5)  # M/M/1: P(wait) = rho
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # textbook: c = 10, a = 8 -> 0.409 (to 3 decimals)
    assert erlang_c(10, 8.0) == pytest.approx(0.4092, abs=5e-4)
    assert erlang_c(3, 3.0) == 1.0 and erlang_c(3, 0.0) == 0.0


def test_erlang_c_is_stable_for_many_servers():
    v = erlang_c(5000, 4950.0)
    assert 0.0 < v < 1.0 and math.isfinite(v)
    assert erlang_c(5000, 4990.0) > v


def _mmc_sojourn_quantile(lam, mu, c, q):
    """Exact M/M/c FCFS sojourn quantile: W (atom + Exp(c mu - lam)) plus Exp(mu)."""
    a = lam / mu
    cp = erlang_c(c, a)
    g = c * mu - lam

    def tail(t):
        hypo = (mu * math.exp(-g * t) - g * math.exp(-mu * t)) / (mu - g)
        return (1 - cp) * math.exp(-mu * t) + cp * hypo - (1 - q)

    return brentq(tail, 0.0, 1e6)


@pytest.mark.parametrize(("c", "rho"), [(1, 0.3), (1, 0.8), (2, 0.7), (4, 0.9), (8, 0.5)])
def test_mmc_end_to_end_quantile_matches_closed_form(c, rho):
    mean_ms = 10.0
    mu = 1 / mean_ms
    lam = rho * c * mu
    exact = _mmc_sojourn_quantile(lam, mu, c, 0.95)
    approx = latency_quantile_ms(lam * 1000, ServiceTime.exponential(mean_ms), c, 0.95)
    assert approx == pytest.approx(exact, rel=0.01)


def test_mm1_wait_quantile_closed_form():
    # M/M/1, rho 0.8, mean 10 ms: P(W > t) = rho exp(-(mu - lam) t)
    w = mgc_wait_quantile_ms(80.0, ServiceTime.exponential(10.0), 1, 0.95)
    assert w == pytest.approx(math.log(0.8 / 0.05) / 0.02)
    assert mgc_wait_quantile_ms(4.0, ServiceTime.exponential(10.0), 1, 0.95) == 0.0


def test_md1_uses_exact_service_plus_wait():
    d = ServiceTime.deterministic(10.0)
    assert latency_quantile_ms(20.0, d, 1, 0.5) == pytest.approx(10.0)
    assert latency_quantile_ms(80.0, d, 1, 0.95) == pytest.approx(
        10.0 + mgc_wait_quantile_ms(80.0, d, 1, 0.95)
    )


# -- invariants -------------------------------------------------------------------------------
SERVICES = [
    ServiceTime.deterministic(15.0),
    ServiceTime.exponential(15.0),
    ServiceTime.from_percentiles(12.0, 20.0, 30.0),
    ServiceTime.from_percentiles(50.0, 150.0),
]


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("servers", [1, 3, 16])
def test_overload_is_infinite_and_p95_rises_with_load(service, servers):
    cap = servers * 1000 / service.mean_ms
    assert latency_quantile_ms(cap, service, servers, 0.95) == math.inf
    assert latency_quantile_ms(cap * 1.5, service, servers, 0.95) == math.inf
    values = [
        latency_quantile_ms(cap * u, service, servers, 0.95) for u in np.linspace(0, 0.99, 25)
    ]
    assert all(math.isfinite(v) for v in values)
    assert all(b >= a - 1e-9 * a for a, b in itertools.pairwise(values))
    assert values[0] == pytest.approx(service.quantile(0.95))


@pytest.mark.parametrize("service", SERVICES)
def test_more_servers_never_raise_p95(service):
    rate = 0.9 * 1000 / service.mean_ms
    values = [latency_quantile_ms(rate, service, c, 0.95) for c in range(1, 12)]
    assert all(b <= a + 1e-9 * a for a, b in itertools.pairwise(values))


@settings(max_examples=40, deadline=None)
@given(
    p50=st.floats(1, 200),
    spread=st.floats(1.0, 3.0),
    servers=st.integers(1, 20),
    slo_factor=st.floats(0.5, 5.0),
)
@example(p50=1.0, spread=1.0000000000000002, servers=1, slo_factor=1.0000000000000002)
@example(p50=1.0, spread=1.5, servers=3, slo_factor=1.0000000000000002)
@example(p50=1.0, spread=2.0, servers=5, slo_factor=1.0000000000000002)
def test_capacity_at_slo_is_the_boundary(p50, spread, servers, slo_factor):
    service = ServiceTime.from_percentiles(p50, p50 * spread)
    slo = service.quantile(0.95) * slo_factor
    cap = capacity_at_slo(service, servers=servers, slo_ms=slo, percentile=0.95)
    if service.quantile(0.95) > slo:
        assert cap == 0.0
        return
    # an SLO within float rounding of the service time's own percentile leaves no room to
    # queue: the boundary is that percentile itself (hypothesis found 1-ulp cases both ways)
    at_service_p95 = slo <= service.quantile(0.95) * (1 + 1e-12)
    if cap == 0.0:
        assert latency_quantile_ms(1e-3, service, servers, 0.95) >= slo * (1 - 1e-12)
        return
    assert 0 < cap < servers * 1000 / service.mean_ms
    # latency_quantile_ms resolves a smooth tail to about 1e-6 of its bracket (_grid_quantile)
    assert latency_quantile_ms(cap, service, servers, 0.95) <= slo * (1 + 1e-5)
    beyond = max(cap * 1.01, cap + 2e-4 * servers * 1000 / service.mean_ms)  # bisection tol.
    if not at_service_p95:
        assert latency_quantile_ms(beyond, service, servers, 0.95) > slo


def test_capacity_grows_with_servers_and_slo():
    s = ServiceTime.from_percentiles(20.0, 30.0, 40.0)
    caps = [capacity_at_slo(s, servers=c, slo_ms=100.0) for c in (1, 2, 4, 8)]
    assert caps == sorted(caps) and caps[-1] > 7 * caps[0]
    assert capacity_at_slo(s, slo_ms=200.0) > capacity_at_slo(s, slo_ms=100.0)
    assert capacity_at_slo(s, slo_ms=25.0) == 0.0


def test_pooled_heterogeneous_between_the_homogeneous_extremes():
    fast, slow = ServiceTime.deterministic(10.0), ServiceTime.deterministic(20.0)
    rate = 90.0  # capacity 2 x 100 + 2 x 50 = 300 req/s
    mixed = pooled_latency_quantile_ms(rate, [fast, fast, slow, slow], 0.95)
    assert latency_quantile_ms(rate, fast, 4, 0.95) <= mixed
    assert mixed <= latency_quantile_ms(rate, slow, 4, 0.95)
    assert pooled_latency_quantile_ms(300.0, [fast, fast, slow, slow], 0.95) == math.inf
    same = pooled_latency_quantile_ms(rate, [fast] * 3, 0.95)
    assert same == latency_quantile_ms(rate, fast, 3, 0.95)


def test_batching_latency_rises_with_load_and_overloads():
    lb = ServiceTime.from_percentiles(40.0, 50.0)  # a batch of 8 in ~40 ms
    cap = 8 * 1000 / lb.mean_ms
    values = [batch_latency_quantile_ms(cap * u, lb, 8, 0.95) for u in (0.1, 0.3, 0.5, 0.7, 0.9)]
    assert all(math.isfinite(v) for v in values)
    # At light load batches close on the max wait, so more load can fill them sooner;
    # from half load up the instance's queue dominates and latency rises.
    assert values[2:] == sorted(values[2:])
    assert min(values) >= lb.quantile(0.95)
    # a batch waits at most the max wait to fill (and the running batch), then runs
    assert values[0] <= lb.quantile(0.95) + lb.mean_ms + 1e-6
    assert batch_latency_quantile_ms(cap, lb, 8, 0.95) == math.inf
    assert batch_latency_quantile_ms(50.0, lb, 1, 0.95) == latency_quantile_ms(50.0, lb, 1, 0.95)
    c = batch_capacity_at_slo(lb, 8, slo_ms=150.0)
    assert 0 < c < cap
    assert batch_latency_quantile_ms(c, lb, 8, 0.95) <= 150.0
