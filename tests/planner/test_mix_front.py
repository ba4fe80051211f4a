"""The mix planner sizes GPU options with their executor front (planner/mix/solve.py patch)."""

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
REQUEST = {
    "families": [{"model": "resnet", "rate_rps": 1500.0, "slo_ms": 30.0}],
    "percentile": "p95",
    "budgets": {"gpu": 1},
    "objective": "accuracy",
}


def _path(cpu_ms: float) -> dict[str, ServingPath]:
    overhead = tuple(3.0 + 0.05 * i for i in range(100))
    return {"r50@gpu:H200": ServingPath(overhead, cpu_ms, 1.0, None, resource="gpu:H200")}


def test_plan_mix_sizes_a_gpu_executor_by_its_front():
    """Plan 2 of the H200 verification: one GPU for 1,500 req/s of resnet50. Without
    executor CPU measured, the b32 option holds the device's 2,190 req/s; with 0.6 ms per
    request its front leaves ~1,600 within the SLO; with 0.7 ms (1,429 req/s at most) one
    GPU cannot serve the load, and the plan says so rather than overload its executor."""
    sizes = {}
    for cpu in (0.0, 0.6):
        problem = build_mix_problem(REQUEST, VARIANTS, PROFILES, serving=_path(cpu))
        (fam,) = problem.families
        sizes[cpu] = max(o.capacity_rps for o in fam.options)
        plan = plan_mix(problem)
        includes = plan.predicted["latency_includes"]
        assert ("no executor CPU measured" in includes) == (cpu == 0.0)
        assert ("0.6 ms of CPU per request" in includes) == (cpu == 0.6)
    assert sizes[0.0] == pytest.approx(2190, rel=0.01)
    assert 1500 < sizes[0.6] < 1000 / 0.6
    with pytest.raises(InfeasiblePlan, match="budget"):
        plan_mix(build_mix_problem(REQUEST, VARIANTS, PROFILES, serving=_path(0.7)))
