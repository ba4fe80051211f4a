"""The dispatcher: one serial CPU stage that every request of a plan crosses (issue 22).

Every request of a plan passes through one dispatcher process (one event loop on one core,
``executor/runtime/dispatcher.py``) before its executor; ``greenctl profile serving`` measures its
CPU per request on the dispatcher path (H200 host, 600 KB resnet bodies: 0.43-0.60 ms at
1,500 req/s, 0.81 at 300, 1.15 at 100). With it measured the plan's prediction adds the
dispatcher's wait at the plan's total rate beyond what the serving path's samples already
hold (they were measured through it), and a plan whose total rate reaches its capacity is
overloaded; without it every figure is as before.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.executor.runtime.serving import ServingMeasurement, save_serving, serving_overheads
from greenctl.planner.core.evaluate import (
    DispatcherStage,
    ServingPath,
    dispatcher_note,
    dispatcher_stage,
    planned_dispatcher,
    predict,
)
from greenctl.planner.core.queueing import (
    front_capacity_rps,
    front_wait,
    stage_wait,
    with_stage_wait,
)
from greenctl.planner.core.stages import plus_wait

from tests.planner.test_executor_front import R50_H200  # resnet50's H200 profiles


def _prof(variant, resource, batch, p50, p95, p99=None):
    return Profile(
        variant,
        resource,
        batch,
        throughput_rps=1000.0 * batch / p50,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        power_w=300.0,
        idle_power_w=125.0,
    )


PROFILES = {("r50", "gpu:H200", b): _prof("r50", "gpu:H200", b, *v) for b, v in R50_H200.items()}
PROFILES[("r18", "cpu:2", 1)] = _prof("r18", "cpu:2", 1, 18.0, 25.0, 30.0)
VARIANTS = {
    "r50": Variant("r50", "resnet", accuracy=0.76),
    "r18": Variant("r18", "tiny", accuracy=0.69),
}
GPU = [Deployment("resnet", "r50", "gpu:H200", count=1, batch=32, quota_rps=1500.0)]
OVERHEAD = tuple(3.0 + 0.05 * i for i in range(100))


def _path(dispatcher_ms: float | None, rate: float | None = None, **extra) -> ServingPath:
    """A path measured on the H200 (served runs as profiled, no executor CPU) with the
    dispatcher's CPU per request, its samples taken at ``rate``."""
    return ServingPath(
        OVERHEAD,
        0.0,
        1.0,
        None,
        resource="gpu:H200",
        dispatcher_cpu_ms=dispatcher_ms,
        rate_rps=rate,
        **extra,
    )


def _gpu(rate: float, path: ServingPath | None, **kw) -> dict:
    serving = {"r50@gpu:H200": path} if path is not None else None
    return predict(GPU, PROFILES, VARIANTS, rate_rps=rate, policy="batch", serving=serving, **kw)


# -- the queue -----------------------------------------------------------------------------
def test_a_stage_of_one_cpu_figure_is_the_fronts_queue():
    for rate in (0.0, 300.0, 1500.0, 2200.0):
        assert stage_wait(rate, ((1.0, 0.43),)) == front_wait(rate, 0.43)
    assert stage_wait(2400.0, ((1.0, 0.43),)) is None  # past 1000 / 0.43 = 2,326 req/s
    with pytest.raises(InputError):
        stage_wait(100.0, ((1.0, 0.0),))


def test_a_mixture_of_cpu_figures_queues_longer_than_its_mean():
    """Half the requests at 0.2 ms and half at 0.6 ms: the capacity of the 0.4 ms mean, a
    longer wait than 0.4 ms for every request (M/G/1: the wait grows with E[S^2])."""
    mixed = stage_wait(2000.0, ((1.0, 0.2), (1.0, 0.6)))
    even = front_wait(2000.0, 0.4)
    assert mixed is not None and even is not None
    assert mixed.c_prob == pytest.approx(even.c_prob)  # Erlang C at the same utilisation
    assert mixed.cond_mean_ms > even.cond_mean_ms
    assert stage_wait(2500.0, ((1.0, 0.2), (1.0, 0.6))) is None


def _var(w) -> float:
    """The variance of a wait: 0 w.p. 1 - c, else delay + Exp(mean)."""
    d, m = w.delay_ms, w.exp_mean_ms
    return w.c_prob * (d * d + 2 * d * m + 2 * m * m) - (w.c_prob * (d + m)) ** 2


def test_the_samples_hold_the_wait_they_were_measured_with():
    """Measured idle, the whole wait is added (the front's rule, exactly); measured at the
    plan's rate (or above), nothing; in between, the wait's growth: its mean and variance."""
    now = front_wait(2000.0, 0.43)
    assert now is not None
    assert with_stage_wait(OVERHEAD, now) == tuple(plus_wait(OVERHEAD, now))
    assert with_stage_wait(OVERHEAD, now, front_wait(2000.0, 0.43)) == OVERHEAD
    assert with_stage_wait(OVERHEAD, now, front_wait(2200.0, 0.43)) == OVERHEAD
    assert with_stage_wait(OVERHEAD, front_wait(1e-3, 0.43)) == OVERHEAD  # idle: nothing
    then = front_wait(1000.0, 0.43)
    assert then is not None
    grown = np.mean(with_stage_wait(OVERHEAD, now, then)) - np.mean(OVERHEAD)
    mean_now = now.c_prob * now.cond_mean_ms
    mean_then = then.c_prob * then.cond_mean_ms
    assert grown == pytest.approx(mean_now - mean_then, rel=0.03)
    whole = np.mean(with_stage_wait(OVERHEAD, now)) - np.mean(OVERHEAD)
    assert grown < whole
    # and its variance: the samples' plus the wait's now less the wait's then
    spread = np.var(with_stage_wait(OVERHEAD, now, then)) - np.var(OVERHEAD)
    assert spread == pytest.approx(_var(now) - _var(then), rel=0.05)


# -- which plans have one --------------------------------------------------------------------
def test_the_stage_is_shared_by_every_models_requests():
    a = _path(0.4)
    b = ServingPath((1.0,), dispatcher_cpu_ms=0.2)
    rates = {"resnet": 1500.0, "tiny": 500.0}
    stage = dispatcher_stage(rates, {"resnet": [(1.0, a)], "tiny": [(1.0, b)]})
    assert stage is not None
    assert stage.rate_rps == 2000.0  # the total, every model's requests
    assert stage.mean_cpu_ms == pytest.approx(0.35)
    assert stage.capacity_rps == pytest.approx(front_capacity_rps(0.35))
    assert stage.utilisation == pytest.approx(0.7) and not stage.overloaded
    # a model with no figure is charged the measured ones' mean: it crosses the same loop
    half = dispatcher_stage(rates, {"resnet": [(1.0, a)], "tiny": [(1.0, None)]})
    assert half is not None and half.unmeasured == ("tiny",)
    assert half.mean_cpu_ms == pytest.approx(0.4) and half.rate_rps == 2000.0
    # a model's paths (one per instance) weigh by the instances' shares of its requests
    two = dispatcher_stage({"resnet": 1000.0}, {"resnet": [(0.75, a), (0.25, _path(0.8))]})
    assert two is not None and two.mean_cpu_ms == pytest.approx(0.5)
    # nothing measured: no stage (a direct path, bare samples, older rows)
    assert dispatcher_stage({"resnet": 1.0}, {"resnet": [(1.0, _path(None)), (1.0, None)]}) is None
    assert dispatcher_stage({"resnet": 1.0}, {"resnet": [(1.0, (1.0, 2.0))]}) is None


def test_a_planner_counts_every_measured_path_of_a_models_variants():
    """Before it knows which variant serves, a planner takes the mean dispatcher CPU measured
    for the model's own entry, its variants' and theirs on a resource."""
    serving = {
        "resnet": ServingPath((1.0,), dispatcher_cpu_ms=0.3),
        "r50@gpu:H200": _path(0.5),
        "vgg": ServingPath((1.0,), dispatcher_cpu_ms=0.9),  # another model's variant
    }
    stage = planned_dispatcher(serving, {"resnet": 1000.0}, {"resnet": ["r50"]})
    assert stage is not None and stage.mean_cpu_ms == pytest.approx(0.4)
    assert stage.rate_rps == 1000.0
    assert planned_dispatcher(None, {"resnet": 1000.0}, {"resnet": ["r50"]}) is None
    assert planned_dispatcher({"resnet": _path(None)}, {"resnet": 1.0}, {}) is None


# -- predict -------------------------------------------------------------------------------
def test_near_the_dispatchers_capacity_the_plan_waits_longer():
    """Plan 2 of the H200 verification (resnet50 b32, one executor) at 2,000 req/s, its path
    measured at 300 req/s through a dispatcher spending 0.43 ms per request (2,326 req/s at
    most: 86 % busy): the p95 grows by the dispatcher's wait; the device is unchanged."""
    plain = _gpu(2000.0, _path(None, 300.0))
    staged = _gpu(2000.0, _path(0.43, 300.0))
    assert not staged["overloaded"]
    assert staged["p95_ms"] > plain["p95_ms"] + 1.0
    assert staged["p50_ms"] > plain["p50_ms"]
    for key in ("served_rps", "power_w", "utilisation", "energy_j_per_request"):
        assert staged[key] == plain[key]
    # the further below its capacity, the less it adds
    light = _gpu(1000.0, _path(0.43, 300.0))
    assert light["p95_ms"] - _gpu(1000.0, _path(None, 300.0))["p95_ms"] < 0.5


def test_a_plan_past_the_dispatchers_capacity_is_overloaded():
    """0.6 ms per request: at most 1,667 req/s whatever the GPU could take (about 2,190
    here). At 1,800 req/s the plan is overloaded: the dispatcher forwards its capacity."""
    plain = _gpu(1800.0, _path(None, 300.0), percentile_slo_ms=30.0)
    assert not plain["overloaded"] and plain["served_rps"] == pytest.approx(1800.0)
    out = _gpu(1800.0, _path(0.6, 300.0), percentile_slo_ms=30.0)
    assert out["overloaded"]
    assert math.isinf(out["p95_ms"]) and math.isinf(out["p50_ms"])
    assert out["served_rps"] == pytest.approx(1000.0 / 0.6)
    assert out["dropped_rps"] == pytest.approx(1800.0 - 1000.0 / 0.6)
    assert out["slo_violation_frac"] == 1.0


def test_a_path_measured_at_the_plans_rate_already_holds_the_wait():
    """The H200 path of plan 2 was measured at the plan's 1,500 req/s: its samples hold the
    dispatcher's wait there, so the prediction at 1,500 req/s is the same bit for bit; at a
    higher rate, only the growth is added (less than the whole wait measured idle)."""
    assert _gpu(1500.0, _path(0.43, 1500.0)) == _gpu(1500.0, _path(None, 1500.0))
    assert _gpu(1200.0, _path(0.43, 1500.0)) == _gpu(1200.0, _path(None, 1500.0))
    grown = _gpu(2100.0, _path(0.43, 1500.0))["p95_ms"]
    whole = _gpu(2100.0, _path(0.43, None))["p95_ms"]
    plain = _gpu(2100.0, _path(None, None))["p95_ms"]
    assert plain < grown < whole


def test_without_the_dispatchers_cpu_nothing_changes():
    """No dispatcher figure (a direct path, bare samples, a row that did not measure it):
    every figure equals the path's without the new fields, whatever the measured rate."""
    old = ServingPath(OVERHEAD, 0.0, 1.0, None, resource="gpu:H200")
    assert _gpu(1500.0, _path(None, 1500.0)) == _gpu(1500.0, old)
    assert _gpu(1500.0, _path(None)) == _gpu(1500.0, old)
    assert _gpu(2500.0, _path(None)) == _gpu(2500.0, old)  # the device's own overload


def test_cpu_plans_cross_the_dispatcher_too():
    """A CPU instance's requests cross the same dispatcher (the executor's own CPU shares
    the instance's cores; the dispatcher is a process of its own)."""
    deps = [Deployment("tiny", "r18", "cpu:2", count=1, quota_rps=40.0)]
    path = ServingPath(tuple(1.0 + 0.01 * i for i in range(100)), 0.3, dispatcher_cpu_ms=20.0)
    kw = {"rate_rps": 40.0, "policy": "wrr"}
    base = predict(deps, PROFILES, VARIANTS, serving=ServingPath(path.overhead_ms, 0.3), **kw)
    out = predict(deps, PROFILES, VARIANTS, serving=path, **kw)
    assert out["p95_ms"] > base["p95_ms"]  # a 20 ms dispatcher 80 % busy at 40 req/s
    over = predict(deps, PROFILES, VARIANTS, serving=path, rate_rps=60.0, policy="wrr")
    assert over["overloaded"] and over["served_rps"] <= 50.0 + 1e-9  # 1000 / 20 ms
    assert not predict(deps, PROFILES, VARIANTS, serving=path, rate_rps=45.0, policy="wrr")[
        "overloaded"
    ]


def test_the_note_says_whether_the_stage_is_modeled():
    assert "not modeled" in dispatcher_note(None)
    stage = DispatcherStage(1500.0, ((1.0, 0.43),))
    note = dispatcher_note(stage)
    assert "0.43 ms of CPU per request" in note and "2,326 req/s" in note
    assert "% busy at 1,500 req/s" in note and "overloaded" not in note
    assert "overloaded" in dispatcher_note(DispatcherStage(1800.0, ((1.0, 0.6),)))
    with pytest.raises(InputError, match="overloaded"):
        DispatcherStage(1800.0, ((1.0, 0.6),)).overhead_ms(None)


# -- from the stored measurements ----------------------------------------------------------------
def _row(rate: float, dispatcher_ms: float | None, *, path: str = "dispatcher"):
    q = [1.0 + i / 100 for i in range(100)]
    return ServingMeasurement(
        family="tiny",
        variant="tiny-s",
        path=path,
        stand_in="model",
        policy="wrr",
        rate_rps=rate,
        input_bytes=100,
        output_elements=10,
        p50_ms=q[50],
        p95_ms=q[95],
        p99_ms=q[99],
        quantiles_ms=q,
        executor_cpu_ms_per_request=0.2,
        dispatcher_cpu_ms_per_request=dispatcher_ms,
        samples=100,
        created_at="2026-02-01T00:00:00Z",
    )


def test_serving_overheads_takes_the_dispatcher_cpu_at_the_plans_total_rate(store):
    """The samples come from the row nearest the family's rate; the dispatcher's CPU from
    the run's row nearest the plan's total rate (the dispatcher carries every family), and
    the path records the rate its samples were measured at."""
    save_serving(store, [_row(10, 1.5), _row(100, 0.6), _row(400, 0.3)])
    one = serving_overheads(store, {"tiny": 12.0})["tiny"]
    assert (one.rate_rps, one.dispatcher_cpu_ms) == (10.0, 1.5)
    many = serving_overheads(store, {"tiny": 12.0, "other": 380.0})["tiny"]
    assert (many.rate_rps, many.dispatcher_cpu_ms) == (10.0, 0.3)
    assert many.overhead_ms == one.overhead_ms


def test_serving_overheads_of_a_direct_path_have_no_dispatcher(store):
    save_serving(store, [_row(100, None, path="direct")])
    got = serving_overheads(store, {"tiny": 100.0}, path="direct")["tiny"]
    assert got.dispatcher_cpu_ms is None and got.rate_rps == 100.0
