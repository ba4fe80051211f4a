"""The simulator runs the dispatcher stage that ``predict`` models (issue 22).

With the dispatcher's CPU per request measured, every request of a plan crosses one FIFO
server (the dispatcher's event loop) before the split to models and instances; its
executor sees it at ``arrival + wait + CPU``. The serving path's samples were measured
through the dispatcher and hold its wait at the rate they were measured at: the simulator
takes that wait's mean and variance off the samples (as ``predict`` takes them to hold it)
and adds the simulated wait instead. Without a dispatcher figure nothing changes.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from greenctl.data.plan import Deployment
from greenctl.data.records import Variant
from greenctl.planner.core.evaluate import (
    DispatcherStage,
    ServingPath,
    dispatcher_stage,
    predict,
)
from greenctl.planner.core.loads import poisson_arrivals
from greenctl.planner.core.simulator import (
    dispatcher_cpu_by_model,
    dispatcher_queue,
    held_samples,
    held_wait,
    simulate,
)

from tests.planner.test_dispatcher_stage import R50_H200, _prof

PROFILES = {("r50", "gpu:H200", b): _prof("r50", "gpu:H200", b, *v) for b, v in R50_H200.items()}
PROFILES[("r18", "cpu:2", 1)] = _prof("r18", "cpu:2", 1, 18.0, 25.0, 30.0)
PROFILES[("r34", "cpu:2", 1)] = _prof("r34", "cpu:2", 1, 30.0, 40.0, 45.0)
VARIANTS = {
    "r50": Variant("r50", "resnet", accuracy=0.76),
    "r18": Variant("r18", "tiny", accuracy=0.69),
    "r34": Variant("r34", "small", accuracy=0.72),
}
GPU = [Deployment("resnet", "r50", "gpu:H200", count=1, batch=32, quota_rps=1500.0)]
# eight CPU instances: lightly loaded, so the dispatcher is what the p95 is about
CPU = [Deployment("tiny", "r18", "cpu:2", count=8)]
F = 5.0  # ms of dispatcher CPU per request: at most 200 req/s
OVERHEAD = tuple(3.0 + 0.05 * i for i in range(100))


def _mid(x: np.ndarray) -> tuple[float, ...]:
    """100 midpoint quantiles, as ``profile serving`` stores a path's samples."""
    return tuple(float(q) for q in np.quantile(x, (np.arange(100) + 0.5) / 100))


_REST = np.random.default_rng(1).lognormal(math.log(2.0), 0.4, 200_000)
REST = _mid(_REST)  # the serving path's own time, the dispatcher's wait apart


@functools.cache
def _measured(busy: float) -> tuple[float, ...]:
    """Samples measured through a dispatcher spending ``F`` ms per request ``busy`` of the
    time: the path's own time plus the dispatcher's wait there (simulated, independent)."""
    a = poisson_arrivals(busy * 1000.0 / F, n=_REST.size, seed=11) * 1000.0
    wait = dispatcher_queue(a, np.full(a.size, F))
    return _mid(_REST + np.random.default_rng(2).permutation(wait))


def _path(busy: float | None) -> ServingPath:
    """A CPU path through the dispatcher, measured at ``busy`` of it (None: samples without
    its wait, no measured rate: the whole wait is added)."""
    if busy is None:
        return ServingPath(REST, 0.0, dispatcher_cpu_ms=F)
    return ServingPath(_measured(busy), 0.0, dispatcher_cpu_ms=F, rate_rps=busy * 1000.0 / F)


def _sim_p95(deps, path, rate: float, seeds: range, n: int = 200_000, policy="fifo") -> float:
    runs = [
        simulate(deps, PROFILES, VARIANTS, rate_rps=rate, n_requests=n, policy=policy, seed=s,
                 serving=path)["p95_ms"]
        for s in seeds
    ]  # fmt: skip
    return float(np.mean(runs))


# -- the stage ---------------------------------------------------------------------------------
def test_each_model_takes_its_cpu_figure_from_the_stage():
    a = ServingPath((1.0,), dispatcher_cpu_ms=4.0)
    b = ServingPath((1.0,), dispatcher_cpu_ms=2.0)
    rates = {"a": 150.0, "b": 50.0, "idle": 0.0}
    stage = dispatcher_stage(rates, {"a": [(1.0, a)], "b": [(1.0, b)], "idle": [(1.0, a)]})
    assert stage is not None
    assert dispatcher_cpu_by_model(stage, rates) == {"a": 4.0, "b": 2.0, "idle": 3.5}
    # a model without a figure is charged the measured models' mean, as predict charges it
    half = dispatcher_stage({"a": 150.0, "b": 50.0}, {"a": [(1.0, a)], "b": [(1.0, None)]})
    assert half is not None
    assert dispatcher_cpu_by_model(half, {"a": 150.0, "b": 50.0}) == {"a": 4.0, "b": 4.0}
    with pytest.raises(ValueError):  # not the rates it was built from
        dispatcher_cpu_by_model(stage, {"a": 150.0})


def test_the_simulated_dispatcher_waits_as_the_stage_models():
    """Two models, 4 and 2 ms of CPU, 150 and 50 req/s: 70 % busy. One FIFO server over
    all the arrivals has the stage's mean wait (Pollaczek-Khinchine) and waits as often."""
    rates = {"a": 150.0, "b": 50.0}
    stage = DispatcherStage(200.0, ((150.0, 4.0), (50.0, 2.0)))
    by_model = dispatcher_cpu_by_model(stage, rates)
    arrivals = poisson_arrivals(200.0, n=400_000, seed=5) * 1000.0
    which = np.random.default_rng(6).choice(2, size=arrivals.size, p=[0.75, 0.25])
    cpu = np.array([by_model["a"], by_model["b"]])[which]
    wait = dispatcher_queue(arrivals, cpu)
    modeled = stage.wait()
    assert modeled is not None
    assert wait.mean() == pytest.approx(modeled.c_prob * modeled.cond_mean_ms, rel=0.04)
    assert (wait > 0).mean() == pytest.approx(modeled.c_prob, abs=0.01)
    # in order: the executors see the requests leave one by one
    assert np.all(np.diff(arrivals + wait + cpu) >= cpu[1:] - 1e-9)


def test_the_held_wait_is_what_predict_takes_the_samples_to_hold():
    """``predict`` adds the wait at the plan's rate less what the samples hold; the simulator
    takes that off the samples: the two agree on each branch of the rule (measured idle or
    unknown rate, measured lighter, at the plan's rate, above it, past capacity, a path with
    no dispatcher figure of its own, no path)."""
    stage = DispatcherStage(170.0, ((1.0, F),))  # 85 % busy
    now = stage.wait()
    assert now is not None
    mean_now = now.c_prob * now.cond_mean_ms
    paths = [
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F),
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F, rate_rps=60.0),
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F, rate_rps=120.0),
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F, rate_rps=170.0),
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F, rate_rps=185.0),
        ServingPath(OVERHEAD, dispatcher_cpu_ms=F, rate_rps=250.0),  # past its capacity
        ServingPath(OVERHEAD, rate_rps=60.0),
        None,
    ]
    for path in paths:
        samples = OVERHEAD if path is not None else (0.0,)
        added = np.mean(stage.overhead_ms(path)) - np.mean(samples)
        mean_held, _ = held_wait(stage, path)
        assert mean_now - mean_held == pytest.approx(added, abs=0.05 + 0.01 * mean_now)
    assert held_wait(stage, paths[0]) == (0.0, 0.0)  # nothing held: the whole wait added
    assert held_wait(stage, paths[3])[0] == pytest.approx(mean_now)  # all of it held
    assert held_wait(DispatcherStage(250.0, ((1.0, F),)), paths[1]) == (0.0, 0.0)
    # the samples less what they hold: their mean less its mean, their variance less its;
    # what is left plus the wait now has predict's mean and variance
    var_now = now.c_prob * (now.delay_ms**2 + 2 * now.delay_ms * now.exp_mean_ms
                            + 2 * now.exp_mean_ms**2) - mean_now**2  # fmt: skip
    path = _path(0.3)  # samples that do hold the wait at 60 req/s
    out = held_samples(stage, path)
    mean_held, var_held = held_wait(stage, path)
    assert 0 < var_held < var_now
    assert np.mean(out) == pytest.approx(np.mean(path.overhead_ms) - mean_held)
    assert np.var(out) == pytest.approx(np.var(path.overhead_ms) - var_held)
    points = stage.overhead_ms(path)
    assert np.var(out) + var_now == pytest.approx(np.var(points), rel=0.03)
    assert np.array_equal(held_samples(stage, paths[0]), OVERHEAD)  # nothing held
    # samples narrower than the wait they are said to hold: their mean, less it
    narrow = held_samples(stage, paths[3])
    assert np.allclose(narrow, np.mean(OVERHEAD) - mean_now)


# -- simulate against predict -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("measured", "busy", "tolerance"),
    [
        (0.3, 0.6, 0.02),
        (0.3, 0.75, 0.03),
        (0.3, 0.9, 0.05),  # the p95 of a 90 % busy queue: 3 % a run at 200,000 requests
        (0.75, 0.75, 0.03),  # measured at the plan's rate: predict adds nothing
        (0.75, 0.6, 0.02),  # measured above it: predict adds nothing, the simulator neither
        (None, 0.75, 0.03),  # the whole wait added
    ],
)
def test_simulate_and_predict_agree_on_the_dispatchers_wait(measured, busy, tolerance):
    """A 5 ms dispatcher 60-90 % busy before eight lightly loaded CPU instances: the
    simulated p95 (8 seeds of 200,000 requests) is predict's within the simulator's noise,
    well above the path's own time without the dispatcher's wait."""
    rate = busy * 1000.0 / F
    path = _path(measured)
    predicted = predict(CPU, PROFILES, VARIANTS, rate_rps=rate, policy="fifo", serving=path)
    simulated = _sim_p95(CPU, path, rate, range(8))
    assert simulated == pytest.approx(predicted["p95_ms"], rel=tolerance)
    alone = ServingPath(REST, 0.0)  # the path's own time: no dispatcher at all
    plain = predict(CPU, PROFILES, VARIANTS, rate_rps=rate, policy="fifo", serving=alone)
    assert simulated > plain["p95_ms"] + 5.0


@pytest.mark.parametrize(
    ("measured", "busy", "more"), [(0.3, 0.9, 1.0), (0.6, 0.75, 1.03), (0.75, 0.75, 1.05)]
)
def test_the_wait_the_samples_hold_is_not_counted_twice(measured, busy, more):
    """Samples measured through the dispatcher at ``measured`` of it, simulated at ``busy``:
    the same p95 (same seeds) as the path's own time with the whole simulated wait added,
    the run the samples stand for; the samples taken as holding nothing (no measured rate)
    count the wait they hold twice."""
    rate = busy * 1000.0 / F
    path = _path(measured)
    got = _sim_p95(CPU, path, rate, range(3))
    truth = _sim_p95(CPU, _path(None), rate, range(3))
    assert got == pytest.approx(truth, rel=0.015)
    twice = _sim_p95(CPU, ServingPath(path.overhead_ms, 0.0, dispatcher_cpu_ms=F), rate, range(3))
    assert twice > truth * more  # the more, the busier it was measured


def test_models_cross_one_dispatcher_each_with_its_cpu():
    """Two models, one of them without a figure (charged the other's), 75 % busy together:
    simulate and predict agree; each model alone would leave the dispatcher idler."""
    deps = [*CPU, Deployment("small", "r34", "cpu:2", count=6)]
    serving = {"tiny": _path(0.3), "small": ServingPath(REST, 0.0)}
    rate = 0.75 * 1000.0 / F
    predicted = predict(deps, PROFILES, VARIANTS, rate_rps=rate, policy="fifo", serving=serving)
    simulated = _sim_p95(deps, serving, rate, range(8))
    assert simulated == pytest.approx(predicted["p95_ms"], rel=0.03)
    alone = {"tiny": ServingPath(REST, 0.0), "small": ServingPath(REST, 0.0)}
    plain = predict(deps, PROFILES, VARIANTS, rate_rps=rate, policy="fifo", serving=alone)
    assert simulated > plain["p95_ms"] + 5.0


def test_a_dispatcher_past_its_capacity_saturates_the_run_as_predict_says():
    """0.6 ms per request: at most 1,667 req/s whatever the GPU could take. At 1,800 req/s
    the run is overloaded, serving what the dispatcher forwards, as predict says."""
    path = {"r50@gpu:H200": ServingPath(OVERHEAD, 0.0, 1.0, None, resource="gpu:H200",
                                         dispatcher_cpu_ms=0.6, rate_rps=300.0)}  # fmt: skip
    kw = {"rate_rps": 1800.0, "policy": "batch", "serving": path, "percentile_slo_ms": 30.0}
    predicted = predict(GPU, PROFILES, VARIANTS, **kw)
    simulated = simulate(GPU, PROFILES, VARIANTS, n_requests=100_000, seed=0, **kw)
    for out in (predicted, simulated):
        assert out["overloaded"] and math.isinf(out["p95_ms"])
        assert out["slo_violation_frac"] == 1.0
    assert simulated["served_rps"] == pytest.approx(predicted["served_rps"], rel=0.03)
    assert simulated["dropped_rps"] == pytest.approx(1800.0 - 1000.0 / 0.6, rel=0.3)


# -- nothing measured, nothing changed ----------------------------------------------------------
@pytest.mark.parametrize(
    ("deps", "policy", "rate"),
    [(GPU, "batch", 1500.0), (CPU, "wrr", 150.0), (CPU, "fifo", 150.0), ([*CPU, *GPU], "batch", 1600.0)],
)  # fmt: skip
def test_without_the_dispatchers_cpu_the_run_is_the_same(deps, policy, rate):
    """No dispatcher figure (a direct path, bare samples, a row that did not measure it):
    the run equals the one with paths that lack the new fields, bit for bit, same seed."""
    kw = {"rate_rps": rate, "n_requests": 20_000, "policy": policy, "seed": 3}
    old = {
        "tiny": ServingPath(REST, 0.3),
        "r50@gpu:H200": ServingPath(OVERHEAD, resource="gpu:H200"),
    }
    new = {
        "tiny": ServingPath(REST, 0.3, rate_rps=40.0),
        "r50@gpu:H200": ServingPath(OVERHEAD, resource="gpu:H200", rate_rps=1500.0),
    }
    assert simulate(deps, PROFILES, VARIANTS, serving=new, **kw) == simulate(
        deps, PROFILES, VARIANTS, serving=old, **kw
    )
    bare = simulate(deps, PROFILES, VARIANTS, serving=REST, **kw)
    assert bare == simulate(deps, PROFILES, VARIANTS, serving=ServingPath(REST), **kw)
