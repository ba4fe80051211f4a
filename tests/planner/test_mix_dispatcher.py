"""The mix planner counts the dispatcher stage (proposed with planner/mix/solve.py patch)."""

from __future__ import annotations

import pytest
from greenctl.data.errors import InfeasiblePlan
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.evaluate import ServingPath
from greenctl.planner.mix.solve import build_mix_problem, plan_mix

R50_H200 = {1: (1.2545, 1.6063, 1.8257), 8: (2.5436, 2.8522, 3.0122), 32: (8.2214, 9.1479, 9.3255)}
PROFILES = [
    Profile("r50", "gpu:H200", b, throughput_rps=1000.0 * b / p50, latency_p50_ms=p50,
            latency_p95_ms=p95, latency_p99_ms=p99, power_w=300.0, idle_power_w=125.0)
    for b, (p50, p95, p99) in R50_H200.items()
]  # fmt: skip
VARIANTS = [Variant("r50", "resnet", accuracy=0.7613, input_shape="3,224,224")]


def _request(rate: float) -> dict:
    return {
        "families": [{"model": "resnet", "rate_rps": rate, "slo_ms": 30.0}],
        "percentile": "p95",
        "budgets": {"gpu": 1},
        "objective": "accuracy",
    }


def _serving(dispatcher_ms: float | None, rate: float = 300.0) -> dict[str, ServingPath]:
    overhead = tuple(3.0 + 0.05 * i for i in range(100))
    path = ServingPath(
        overhead,
        0.0,
        1.0,
        None,
        resource="gpu:H200",
        dispatcher_cpu_ms=dispatcher_ms,
        rate_rps=rate,
    )
    return {"r50@gpu:H200": path, "resnet": path}


def test_the_dispatchers_wait_shrinks_the_latency_budget():
    caps = {}
    for disp in (None, 0.43):
        problem = build_mix_problem(_request(2000.0), VARIANTS, PROFILES, serving=_serving(disp))
        (fam,) = problem.families
        caps[disp] = {o.batch: o.capacity_rps for o in fam.options}
    assert any("the dispatcher: 0.43 ms" in n for n in problem.notes)
    assert all(caps[0.43][b] <= caps[None][b] for b in caps[None])


def test_a_rate_past_the_dispatcher_is_infeasible_and_says_why():
    with pytest.raises(InfeasiblePlan, match="dispatcher carries at most 1,667 req/s"):
        build_mix_problem(_request(1800.0), VARIANTS, PROFILES, serving=_serving(0.6))
    build_mix_problem(_request(1800.0), VARIANTS, PROFILES, serving=_serving(None))


def test_latency_includes_says_whether_the_dispatcher_is_modeled():
    plan = plan_mix(build_mix_problem(_request(1500.0), VARIANTS, PROFILES, serving=_serving(0.43)))
    assert "the dispatcher, a serial stage" in plan.predicted["latency_includes"]
    plain = plan_mix(
        build_mix_problem(_request(1500.0), VARIANTS, PROFILES, serving=_serving(None))
    )
    assert "dispatcher's queueing is not modeled" in plain.predicted["latency_includes"]
