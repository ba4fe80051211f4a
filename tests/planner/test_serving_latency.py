"""Latency beyond the model: cold runs at low load and the measured serving path."""

from __future__ import annotations

import numpy as np
import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.evaluate import (
    ServingPath,
    build_instances,
    cold_fraction,
    predict,
    warm_service,
)
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.queueing import mgc_model, with_overhead

HOT = dict(latency_p50_ms=2.0, latency_p95_ms=2.6, latency_p99_ms=2.9)
COLD = dict(isolated_p50_ms=3.6, isolated_p95_ms=4.0, isolated_p99_ms=4.4)
VARIANTS = {"v": Variant("v", "m", accuracy=0.8)}


def _profiles(**extra):
    return {("v", "cpu:1", 1): Profile("v", "cpu:1", 1, throughput_rps=480.0, **HOT, **extra)}


def _dep(rate):
    return [Deployment("m", "v", "cpu:1", 1, 1, quota_rps=rate)]


def test_with_overhead_is_the_convolution_with_the_samples():
    model = mgc_model(50.0, [ServiceTime.lognormal(median_ms=4.0, sigma=0.3)])
    rng = np.random.default_rng(1)
    overhead = rng.gamma(4.0, 0.5, size=400)
    both = with_overhead(model, np.quantile(overhead, (np.arange(100) + 0.5) / 100))
    # Monte Carlo of T + O with T sampled by inverting the model's survival function.
    ts = np.linspace(0.0, 60.0, 6001)
    cdf = 1.0 - model.sf(ts)
    t_samples = np.interp(rng.random(200_000), cdf, ts)
    mc = t_samples + rng.choice(overhead, size=t_samples.size)
    for q in (0.5, 0.95, 0.99):
        assert both.quantile(q) == pytest.approx(float(np.quantile(mc, q)), rel=0.03)
    assert both.quantile(0.95) > model.quantile(0.95) + overhead.min()
    assert float(both.sf(0.0)[0]) == pytest.approx(1.0)


def test_with_overhead_rejects_bad_samples():
    model = mgc_model(10.0, [ServiceTime.deterministic(1.0)])
    for bad in ([], [-1.0, 2.0], [float("nan")]):
        with pytest.raises(InputError):
            with_overhead(model, bad)


def test_cold_fraction_follows_load():
    assert cold_fraction(0.0, 0.0) == 1.0
    assert cold_fraction(40.0, 0.1) == pytest.approx(0.9 * np.exp(-0.08))
    assert cold_fraction(400.0, 0.99) < 0.01
    assert cold_fraction(100.0, 1.5) == 0.0  # saturated: never idle


def test_warm_service_moves_from_isolated_to_back_to_back_with_load():
    (inst,) = build_instances(_dep(10.0), _profiles(**COLD))
    light = warm_service(inst, 5.0, 5.0 / inst.capacity_rps)
    heavy = warm_service(inst, 450.0, 450.0 / inst.capacity_rps)
    assert light.quantile(0.5) == pytest.approx(2.0 + cold_fraction(5.0, 5 / 480) * 1.6, rel=0.02)
    assert inst.service.quantile(0.5) < heavy.quantile(0.5) < light.quantile(0.5)
    assert heavy.quantile(0.5) < 2.1  # near saturation nearly every run is back-to-back
    (plain,) = build_instances(_dep(10.0), _profiles())
    assert warm_service(plain, 5.0, 0.01) is plain.service  # no isolated figures: unchanged


def test_predict_adds_cold_runs_and_the_serving_path():
    base = predict(_dep(20.0), _profiles(), VARIANTS, rate_rps=20.0, policy="wrr")
    cold = predict(_dep(20.0), _profiles(**COLD), VARIANTS, rate_rps=20.0, policy="wrr")
    assert cold["p50_ms"] > base["p50_ms"] + 1.0  # most requests at 20 req/s run cold
    assert cold["energy_j_per_request"] == base["energy_j_per_request"]
    overhead = list(np.linspace(1.5, 3.5, 100))
    served = predict(
        _dep(20.0), _profiles(**COLD), VARIANTS, rate_rps=20.0, policy="wrr", serving=overhead
    )
    assert served["p50_ms"] == pytest.approx(cold["p50_ms"] + 2.5, abs=0.3)
    assert served["p95_ms"] > cold["p95_ms"] + 1.5
    by_model = predict(
        _dep(20.0), _profiles(**COLD), VARIANTS, rate_rps=20.0, serving={"other": overhead}
    )
    assert by_model["p95_ms"] == pytest.approx(cold["p95_ms"], rel=0.05)  # not this model's
    slo = predict(
        _dep(20.0),
        _profiles(**COLD),
        VARIANTS,
        rate_rps=20.0,
        policy="wrr",
        serving=overhead,
        percentile_slo_ms=5.0,
    )
    assert slo["slo_violation_frac"] > 0.3  # the overhead pushes requests past a tight SLO


def test_a_variants_own_serving_path_wins_over_its_models():
    own = predict(
        _dep(20.0),
        _profiles(),
        VARIANTS,
        rate_rps=20.0,
        serving={"v": [5.0] * 10, "m": [1.0] * 10, "*": [9.0] * 10},
    )
    fam = predict(_dep(20.0), _profiles(), VARIANTS, rate_rps=20.0, serving={"m": [1.0] * 10})
    rest = predict(_dep(20.0), _profiles(), VARIANTS, rate_rps=20.0, serving={"*": [9.0] * 10})
    assert own["p50_ms"] - fam["p50_ms"] == pytest.approx(4.0, abs=0.05)
    assert rest["p50_ms"] - fam["p50_ms"] == pytest.approx(8.0, abs=0.05)


def test_service_scale_stretches_cpu_instances_only():
    from greenctl.planner.core.evaluate import ServingPath

    path = ServingPath((1.0,) * 10, 0.0, 1.5)
    plain = predict(_dep(100.0), _profiles(), VARIANTS, rate_rps=100.0, serving=[1.0] * 10)
    slow = predict(_dep(100.0), _profiles(), VARIANTS, rate_rps=100.0, serving=path)
    assert slow["p50_ms"] > plain["p50_ms"] + 0.8  # 2 ms runs become 3 ms
    gpu = {("v", "gpu:A100", 1): Profile("v", "gpu:A100", 1, throughput_rps=480.0, **HOT)}
    dep = [Deployment("m", "v", "gpu:A100", 1, 1, quota_rps=100.0)]
    g_plain = predict(dep, gpu, VARIANTS, rate_rps=100.0, serving=[1.0] * 10)
    g_slow = predict(dep, gpu, VARIANTS, rate_rps=100.0, serving=path)
    assert g_slow["p50_ms"] == pytest.approx(g_plain["p50_ms"])  # measured on CPU: not applied


def test_a_measured_served_run_replaces_the_cold_shift_at_every_load():
    """With service_scale measured, a CPU instance serves at back-to-back x scale whatever the
    load (no cold-run shift); without it (noop stand-in) the cold shift still applies."""
    from greenctl.planner.core.evaluate import served_service

    (inst,) = build_instances(_dep(10.0), _profiles(**COLD))
    measured = ServingPath((0.5,) * 10, 0.0, 1.8)  # served runs 1.8x the 2.0 ms back-to-back
    untimed = ServingPath((0.5,) * 10, 0.0, None)
    for rate in (5.0, 100.0, 400.0):
        busy = rate / inst.capacity_rps
        svc, _ = served_service(inst, rate, busy, measured)
        assert svc.quantile(0.5) == pytest.approx(3.6, rel=1e-6)  # not 3.6 shifted further
        cold, _ = served_service(inst, rate, busy, untimed)
        assert cold.quantile(0.5) == pytest.approx(
            warm_service(inst, rate, busy).quantile(0.5), rel=1e-9
        )
    gpu = build_instances(
        [Deployment("m", "v", "gpu:A100", 1, 1, quota_rps=10.0)],
        {("v", "gpu:A100", 1): Profile("v", "gpu:A100", 1, throughput_rps=480.0, **HOT)},
    )[0]
    svc, demand = served_service(gpu, 5.0, 0.01, measured)  # measured on CPU: not applied
    assert (svc.quantile(0.5), demand) == (pytest.approx(2.0), 0.0)


def test_served_cpu_time_counts_in_utilisation_and_energy():
    prof = _profiles(power_w=40.0, idle_power_w=10.0)
    path = ServingPath((0.5,) * 10, 0.4, 2.0)
    plain = predict(_dep(100.0), prof, VARIANTS, rate_rps=100.0, serving=[0.5] * 10)
    served = predict(_dep(100.0), prof, VARIANTS, rate_rps=100.0, serving=path)
    mean = build_instances(_dep(100.0), prof)[0].service.mean_ms
    stretch = (2.0 * mean + 0.4) / mean
    assert served["utilisation"] == pytest.approx(plain["utilisation"] * stretch, rel=1e-6)
    assert served["energy_j_per_request"] > plain["energy_j_per_request"]
    # 480 req/s back-to-back, but served it holds the core 2x + 0.4 ms per request: 240 req/s
    # would overload it
    assert predict(_dep(240.0), prof, VARIANTS, rate_rps=240.0, serving=path)["overloaded"]
    assert not predict(_dep(240.0), prof, VARIANTS, rate_rps=240.0, serving=[0.5] * 10)[
        "overloaded"
    ]


def test_a_measured_served_tail_shapes_the_service():
    """Served p50/p95/p99 are the back-to-back ones times the measured ratios; p50 alone
    stretches the back-to-back shape; the served instance's p95 then exceeds the plain
    stretch."""
    from greenctl.planner.core.evaluate import served_service, stretched_service

    (inst,) = build_instances(_dep(10.0), _profiles())
    hot = inst.service
    tailed = ServingPath((0.5,) * 10, 0.0, 2.0, (3.0, 3.5))
    svc = stretched_service(hot, tailed)
    for q, r in ((0.5, 2.0), (0.95, 3.0), (0.99, 3.5)):  # a 3-parameter fit: p99 to 2 %
        assert svc.quantile(q) == pytest.approx(hot.quantile(q) * r, rel=0.02)
    plain = stretched_service(hot, ServingPath((0.5,) * 10, 0.0, 2.0))
    assert plain.quantile(0.95) == pytest.approx(hot.quantile(0.95) * 2.0, rel=1e-6)
    assert stretched_service(hot, ServingPath((0.5,) * 10)) is hot  # nothing measured
    assert served_service(inst, 10.0, 0.02, tailed)[0].quantile(0.95) > plain.quantile(0.95)
    low = predict(_dep(10.0), _profiles(), VARIANTS, rate_rps=10.0, serving=tailed)
    flat = predict(
        _dep(10.0), _profiles(), VARIANTS, rate_rps=10.0, serving=ServingPath((0.5,) * 10, 0.0, 2.0)
    )
    assert low["p95_ms"] > flat["p95_ms"] + 1.0  # 2.6 ms x 3 against x 2
    assert low["p50_ms"] == pytest.approx(flat["p50_ms"], rel=0.05)
