"""The discrete-event simulator against closed forms, and its invariants."""

from __future__ import annotations

import gzip
import math

import numpy as np
import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.data.traces import read_rps_trace as read_trace
from greenctl.planner.core.evaluate import PREDICTED_KEYS, predict
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.loads import poisson_arrivals, trace_arrivals
from greenctl.planner.core.queueing import (
    batch_latency_quantile_ms,
    erlang_c,
    pooled_latency_quantile_ms,
)
from greenctl.planner.core.simulator import (
    batch_queue,
    fifo_queue,
    lindley_queue,
    simulate,
    stride_assign,
    wrr_queues,
)
from scipy.optimize import brentq

N = 1_000_000
WARM = 10_000


# -- closed forms at 10^6 requests ---------------------------------------------------------
def test_mm1_wait_p95_within_2_percent():
    rho, mean = 0.5, 1.0  # ms
    a = poisson_arrivals(rho * 1000 / mean, n=N, seed=1) * 1000
    s = np.random.default_rng(101).exponential(mean, N)
    w = lindley_queue(a, s)
    exact = math.log(rho / 0.05) / ((1 - rho) / mean)  # P(W > t) = rho e^{-(mu - lam) t}
    assert np.quantile(w[WARM:], 0.95) == pytest.approx(exact, rel=0.02)


def _md1_wait_cdf(t: float, rho: float) -> float:
    """Erlang's M/D/1 waiting-time distribution, D = 1."""
    total = 0.0
    for k in range(math.floor(t) + 1):
        x = rho * (t - k)
        total += math.exp(x) * (-x) ** k / math.factorial(k)
    return (1 - rho) * total


def test_md1_wait_p95_within_2_percent():
    rho = 0.7
    exact = brentq(lambda t: _md1_wait_cdf(t, rho) - 0.95, 0.0, 20.0)
    assert exact == pytest.approx(4.1029, abs=1e-3)
    a = poisson_arrivals(rho * 1000, n=N, seed=2) * 1000
    w = lindley_queue(a, np.ones(N))
    assert np.quantile(w[WARM:], 0.95) == pytest.approx(exact, rel=0.02)


def test_mmc_wait_p95_within_2_percent_through_the_central_queue():
    c, rho = 2, 0.6
    lam = rho * c  # per ms, mean service 1 ms
    a = poisson_arrivals(lam * 1000, n=N, seed=0) * 1000
    run = fifo_queue(a, [ServiceTime.exponential(1.0)] * c, np.random.default_rng(2000))
    exact = math.log(erlang_c(c, lam) / 0.05) / (c - lam)
    assert np.quantile(run.wait_ms[WARM:], 0.95) == pytest.approx(exact, rel=0.02)
    # every server took part, about evenly
    counts = np.bincount(run.server, minlength=c)
    assert counts.min() > 0.45 * N


# -- queue mechanics -------------------------------------------------------------------------
def test_central_queue_with_one_server_is_lindley():
    rng = np.random.default_rng(5)
    a = np.sort(rng.uniform(0, 1000, 2000))
    run = fifo_queue(a, [ServiceTime.from_percentiles(0.4, 0.6, 0.9)], rng)
    assert np.allclose(run.wait_ms, lindley_queue(a, run.service_ms))
    hetero = fifo_queue(
        a, [ServiceTime.deterministic(0.4), ServiceTime.exponential(0.5)], rng, queue_limit=None
    )
    assert (hetero.wait_ms >= 0).all() and set(np.unique(hetero.server)) == {0, 1}


def test_bounded_queue_matches_mm1k_blocking():
    rho, places = 0.9, 4  # at most 4 waiting: M/M/1/5
    a = poisson_arrivals(rho * 1000, n=150_000, seed=3) * 1000
    # a bounded queue takes the general (per-request) path of the central queue
    service = ServiceTime.exponential(1.0)
    run = fifo_queue(a, [service], np.random.default_rng(7), queue_limit=places)
    k = places + 1
    exact = (1 - rho) * rho**k / (1 - rho ** (k + 1))
    assert run.dropped.mean() == pytest.approx(exact, rel=0.05)
    waiting_ok = run.wait_ms[~run.dropped]
    assert (waiting_ok >= 0).all()
    wrr = wrr_queues(a, [service], [1.0], np.random.default_rng(7), queue_limit=places)
    assert wrr.dropped.mean() == pytest.approx(exact, rel=0.05)


def test_stride_assignment_is_exactly_proportional():
    shares = [0.5, 0.3, 0.2]
    assign = stride_assign(shares, 10_000)
    counts = np.bincount(assign, minlength=3)
    assert np.abs(counts - np.array(shares) * 10_000).max() <= 1
    # smooth: in every window of 10 requests, the first instance gets 5 +- 1
    for start in range(0, 9990, 97):
        assert 4 <= int((assign[start : start + 10] == 0).sum()) <= 6


def test_batches_respect_size_and_duty_cycle():
    service = ServiceTime.deterministic(20.0)
    a = poisson_arrivals(150.0, n=20_000, seed=4) * 1000
    run = batch_queue(a, service, 4, np.random.default_rng(1), max_wait_ms=10.0)
    starts = run.arrival_ms + run.wait_ms
    _, sizes = np.unique(starts, return_counts=True)
    assert sizes.max() <= 4 and sizes.min() >= 1
    assert (run.wait_ms >= -1e-9).all()
    # at light load nobody waits longer than the duty cycle plus the running batch
    light = poisson_arrivals(5.0, n=5_000, seed=5) * 1000
    r2 = batch_queue(light, service, 4, np.random.default_rng(2), max_wait_ms=10.0)
    assert r2.wait_ms.max() <= 10.0 + 20.0 + 1e-9


@pytest.mark.parametrize("util", [0.3, 0.7, 0.9])
def test_batch_analytic_within_15_percent_of_simulation(util):
    service = ServiceTime.from_percentiles(18.0, 22.0)
    cap = 8 * 1000 / service.mean_ms
    a = poisson_arrivals(util * cap, n=100_000, seed=6) * 1000
    run = batch_queue(a, service, 8, np.random.default_rng(8))
    sim = np.quantile(run.latency_ms[1000:], 0.95)
    assert batch_latency_quantile_ms(util * cap, service, 8, 0.95) == pytest.approx(sim, rel=0.15)


def test_heterogeneous_central_queue_close_to_pooled_approximation():
    services = [
        ServiceTime.from_percentiles(10.0 + i, 14.0 + 2 * i, 18.0 + 3 * i) for i in range(4)
    ]
    cap = sum(1000 / s.mean_ms for s in services)
    rate = 0.7 * cap
    a = poisson_arrivals(rate, n=100_000, seed=9) * 1000
    run = fifo_queue(a, services, np.random.default_rng(10))
    sim = np.quantile(run.latency_ms[1000:], 0.95)
    assert pooled_latency_quantile_ms(rate, services, 0.95) == pytest.approx(sim, rel=0.1)


# -- whole configurations -------------------------------------------------------------------
PROFILES = {
    ("r18", "cpu:2", 1): Profile(
        "r18",
        "cpu:2",
        1,
        throughput_rps=50.0,
        latency_p50_ms=18.0,
        latency_p95_ms=25.0,
        latency_p99_ms=30.0,
        power_w=30.0,
        idle_power_w=10.0,
        cost_per_hour=0.1,
    ),
    ("r50", "cpu:4", 1): Profile(
        "r50",
        "cpu:4",
        1,
        throughput_rps=25.0,
        latency_p50_ms=35.0,
        latency_p95_ms=50.0,
        power_w=60.0,
        idle_power_w=20.0,
        cost_per_hour=0.2,
    ),
    ("r50", "mig:3g.40gb", 8): Profile(
        "r50",
        "mig:3g.40gb",
        8,
        throughput_rps=400.0,
        latency_p50_ms=18.0,
        latency_p95_ms=22.0,
        power_w=120.0,
        idle_power_w=30.0,
        cost_per_hour=1.5,
    ),
}
VARIANTS = {
    "r18": Variant("r18", "resnet", accuracy=0.69),
    "r50": Variant("r50", "resnet", accuracy=0.76),
}
MIX = [
    Deployment("resnet", "r18", "cpu:2", count=2, quota_rps=40.0),
    Deployment("resnet", "r50", "cpu:4", count=3, quota_rps=30.0),
]


@pytest.mark.parametrize("policy", ["fifo", "wrr"])
def test_simulation_agrees_with_prediction(policy):
    sim = simulate(
        MIX,
        PROFILES,
        VARIANTS,
        rate_rps=100.0,
        policy=policy,
        n_requests=60_000,
        seed=1,
        percentile_slo_ms=60.0,
    )
    pred = predict(MIX, PROFILES, VARIANTS, rate_rps=100.0, policy=policy, percentile_slo_ms=60.0)
    assert list(sim) == list(pred) == list(PREDICTED_KEYS)
    assert sim["p95_ms"] == pytest.approx(pred["p95_ms"], rel=0.12)
    assert sim["accuracy"] == pytest.approx(pred["accuracy"], abs=0.004)
    assert sim["utilisation"] == pytest.approx(pred["utilisation"], rel=0.05)
    assert sim["energy_j_per_request"] == pytest.approx(pred["energy_j_per_request"], rel=0.05)
    assert not sim["overloaded"] and sim["dropped_rps"] == 0.0
    if policy == "wrr":  # quotas 40:30 decide who serves
        assert sim["accuracy"] == pytest.approx((40 * 0.69 + 30 * 0.76) / 70, abs=0.002)


def test_simulation_is_deterministic_for_a_seed():
    kwargs = dict(rate_rps=80.0, policy="fifo", n_requests=5_000)
    a = simulate(MIX, PROFILES, VARIANTS, seed=3, **kwargs)
    b = simulate(MIX, PROFILES, VARIANTS, seed=3, **kwargs)
    c = simulate(MIX, PROFILES, VARIANTS, seed=4, **kwargs)
    assert a == b and a != c


@pytest.mark.parametrize("policy", ["fifo", "wrr"])
def test_overloaded_simulation_is_reported_as_such(policy):
    result = simulate(
        MIX,
        PROFILES,
        VARIANTS,
        rate_rps=260.0,
        policy=policy,
        duration_s=120,
        seed=2,
        percentile_slo_ms=100.0,
    )
    assert result["overloaded"] is True
    assert result["p95_ms"] == math.inf
    assert result["dropped_rps"] > 0
    assert result["slo_violation_frac"] == 1.0


def test_bounded_queue_drops_instead_of_growing():
    result = simulate(
        MIX,
        PROFILES,
        VARIANTS,
        rate_rps=260.0,
        policy="fifo",
        duration_s=60,
        seed=2,
        queue_limit=10,
    )
    assert result["dropped_rps"] > 50
    assert result["served_rps"] == pytest.approx(190.6, rel=0.05)


def test_batch_policy_simulation():
    deps = [Deployment("resnet", "r50", "mig:3g.40gb", count=2, batch=8, device="gpu0")]
    sim = simulate(
        deps,
        PROFILES,
        VARIANTS,
        rate_rps=500.0,
        policy="batch",
        n_requests=50_000,
        seed=5,
        device_idle_power_w=50.0,
    )
    pred = predict(
        deps, PROFILES, VARIANTS, rate_rps=500.0, policy="batch", device_idle_power_w=50.0
    )
    assert sim["p95_ms"] == pytest.approx(pred["p95_ms"], rel=0.15)
    assert sim["accuracy"] == pytest.approx(0.76)
    assert sim["power_w"] == pytest.approx(pred["power_w"], rel=0.1)
    with pytest.raises(InputError, match="batch"):
        simulate(deps, PROFILES, VARIANTS, rate_rps=10.0, policy="fifo", n_requests=100)


# -- loads ---------------------------------------------------------------------------------
def test_poisson_and_trace_arrivals():
    a = poisson_arrivals(200.0, duration_s=50.0, seed=1)
    assert a.size == pytest.approx(10_000, rel=0.05) and (np.diff(a) >= 0).all() and a[-1] < 50
    assert np.array_equal(a, poisson_arrivals(200.0, duration_s=50.0, seed=1))
    series = np.array([0, 100, 300, 50] * 50, dtype=float)
    t = trace_arrivals(series, seed=2, scale=0.5)
    per_second = np.bincount(t.astype(int), minlength=series.size)
    assert per_second.sum() == pytest.approx(series.sum() * 0.5, rel=0.05)
    assert per_second[0::4].sum() == 0  # the silent seconds stay silent
    with pytest.raises(InputError):
        poisson_arrivals(0.0, n=10)
    with pytest.raises(InputError):
        trace_arrivals([1.0, -2.0])


def test_read_trace_files(tmp_path):
    p = tmp_path / "t.txt.gz"
    p.write_bytes(gzip.compress(b"# requests per second\n1 2 3\n4,5\n"))
    assert read_trace(p).tolist() == [1, 2, 3, 4, 5]
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\n3 x 4\n")
    with pytest.raises(FileFormatError, match=r"line 2.*'x' is not a number"):
        read_trace(bad)
    with pytest.raises(InputError, match="does not exist"):
        read_trace(tmp_path / "missing.txt")


def test_twitter_trace_replay():
    series = read_trace(path_of("twitter"))
    assert series.size == 1_899_061
    assert series.mean() == pytest.approx(63.6, abs=0.1)
    arrivals = trace_arrivals(series[:600], seed=1)
    result = simulate(MIX, PROFILES, VARIANTS, arrivals_s=arrivals, policy="wrr", seed=1)
    assert result["rate_rps"] == pytest.approx(series[:600].mean(), rel=0.05)
    assert result["served_rps"] > 0


def test_arrivals_beyond_the_one_limit_are_refused_before_allocating():
    """Every run (simulate, loadgen, direct callers) holds at most MAX_ARRIVALS arrivals."""
    from greenctl.data.errors import InputError
    from greenctl.planner.core.loads import MAX_ARRIVALS, poisson_arrivals

    with pytest.raises(InputError, match="at most 10,000,000"):
        poisson_arrivals(1e6, duration_s=1e5)
    with pytest.raises(InputError, match="at most"):
        poisson_arrivals(10.0, n=MAX_ARRIVALS + 1)
    assert len(poisson_arrivals(10.0, n=1000)) == 1000
