"""A glet plan is predicted as it was planned (issue 18): its executors batch over their
glet's duty cycle, and each model is held to its own SLO."""

from __future__ import annotations

import json

import pytest
from greenctl.executor.kinds import get_kind

MODELS = [
    {"name": "resnet50", "rate_rps": 400.0, "slo_ms": 25.0},
    {"name": "vgg16", "rate_rps": 300.0, "slo_ms": 30.0},
    {"name": "inception", "rate_rps": 200.0, "slo_ms": 40.0},
]


@pytest.fixture
def planned(gpulet):
    plan, _ = get_kind("glet").plan(gpulet, {"models": MODELS})
    return plan


def test_each_deployment_batches_over_its_glets_duty_cycle(gpulet, planned):
    from greenctl.planner.core.evaluate import build_instances, profiles_by_key

    cycles = {
        (m["variant"], g["resource"], m["batch"]): g["duty_cycle_ms"]
        for gpu in planned.extra["gpus"]
        for g in gpu["glets"]
        for m in g["models"]
    }
    for d in planned.deployments:
        assert d.placement["duty_cycle_ms"] == cycles[(d.variant, d.resource, d.batch)]
    profiles = [p for d in planned.deployments for p in gpulet.latest_profiles(variant=d.variant)]
    instances = build_instances(planned.deployments, profiles_by_key(profiles))
    for inst in instances:
        dep = planned.deployments[inst.deployment]
        if inst.batches is not None:  # `simulate` batches as the glet plan runs
            assert inst.batches.batching.max_wait_ms == dep.placement["duty_cycle_ms"]


def test_each_model_is_held_to_its_own_slo(gpulet, planned):
    from greenctl.data.plan import Plan

    kind = get_kind("glet")
    options = {"n_requests": 20000, "seed": 1}
    # without an SLO asked for, each model's own: the plan meets them (its duty-cycle bound)
    assert kind.predict(gpulet, planned, **options)["slo_violation_frac"] < 0.01
    assert kind.predict(gpulet, planned, analytic=True)["slo_violation_frac"] < 0.01
    # one model's SLO far below its latency: about its share of the requests miss, and only
    # those (an SLO for every request would hold the others to it too)
    strict = json.loads(planned.to_json())
    strict["request"]["models"][0]["slo_ms"] = 0.5
    tight = kind.predict(gpulet, Plan.from_dict(strict), **options)
    assert tight["slo_violation_frac"] == pytest.approx(400.0 / 900.0, abs=0.03)
    one = kind.predict(gpulet, planned, percentile_slo_ms=0.5, **options)
    assert one["slo_violation_frac"] > 0.97  # an explicit --slo-ms still holds every request
