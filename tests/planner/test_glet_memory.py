"""plan glet: the executors a schedule puts on one GPU (MPS partitions share its memory) fit
the GPU's memory; a plan records each executor's memory and each GPU's, which apply checks."""

from __future__ import annotations

import pytest
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.planner.glet.memory import check_gpu_memory, gpu_needs
from greenctl.planner.glet.model import EXECUTOR_OVERHEAD_MB
from greenctl.planner.glet.solve import GletModel, plan_glet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.planner.test_glet import BATCHES, synthetic_problem

GPU_MB = 40960.0
LIGHT = [GletModel("small", 40.0, 60.0), GletModel("medium", 30.0, 80.0)]


def _gpu_totals(plan) -> list[float]:
    return [
        sum(m["memory_mb"] for g in gpu["glets"] for m in g["models"]) for gpu in plan.extra["gpus"]
    ]


def test_light_models_share_a_gpu_until_their_memory_does_not_fit():
    free = plan_glet(synthetic_problem(LIGHT))
    assert free.predicted["gpus"] == 1 and len(free.extra["gpus"][0]["glets"]) >= 1
    # without memory figures nothing is recorded, nothing checked
    assert all(m["memory_mb"] is None for g in free.extra["gpus"][0]["glets"] for m in g["models"])
    # 25 GB of weights each: two executors cannot share a 40 GB GPU
    heavy = plan_glet(
        synthetic_problem(LIGHT, weights_mb={"small": 25000.0, "medium": 25000.0},
                          gpu_memory_mb=GPU_MB)
    )  # fmt: skip
    assert heavy.predicted["gpus"] == 2
    for gpu, total in zip(heavy.extra["gpus"], _gpu_totals(heavy), strict=True):
        assert total == pytest.approx(25000.0 + EXECUTOR_OVERHEAD_MB)
        assert gpu["memory_mb"] == pytest.approx(total)
    assert heavy.request["gpu_memory_mb"] == GPU_MB
    # 15 GB each fit together
    both = plan_glet(
        synthetic_problem(LIGHT, weights_mb={"small": 15000.0, "medium": 15000.0},
                          gpu_memory_mb=GPU_MB)
    )  # fmt: skip
    assert both.predicted["gpus"] == 1


def test_a_model_that_does_not_fit_alone_is_named():
    with pytest.raises(InfeasiblePlan, match=r"even alone: medium \(medium: 50,300 MiB"):
        plan_glet(synthetic_problem(LIGHT, weights_mb={"medium": 50000.0}, gpu_memory_mb=GPU_MB))
    with pytest.raises(InputError, match="GPU memory must be a positive number"):
        plan_glet(synthetic_problem(LIGHT, gpu_memory_mb=0.0))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_request=st.floats(50.0, 600.0),
    weights=st.lists(st.floats(500.0, 12000.0), min_size=4, max_size=4),
    rates=st.lists(st.floats(5.0, 300.0), min_size=4, max_size=4),
    algorithm=st.sampled_from(["glet", "sbp", "greedy"]),
)
def test_every_gpu_of_every_schedule_fits_its_memory(per_request, weights, rates, algorithm):
    """Memory grows with the batch (profiled per point): whatever the batches the duty
    cycles pick, no GPU's executors exceed its memory."""
    names = ["small", "medium", "large", "heavy"]
    memory = {
        n: {
            f"mps:{p}": {b: w + per_request * b for b in BATCHES} for p in (20, 40, 50, 60, 80, 100)
        }
        for n, w in zip(names, weights, strict=True)
    }
    models = [GletModel(n, r, 120.0) for n, r in zip(names, rates, strict=True)]
    problem = synthetic_problem(models, memory_mb=memory, gpu_memory_mb=16384.0, max_gpus=16)
    try:
        plan = plan_glet(problem, algorithm=algorithm)
    except InfeasiblePlan:
        return
    for gpu, total in zip(plan.extra["gpus"], _gpu_totals(plan), strict=True):
        assert total <= 16384.0 + 1e-6
        for g in gpu["glets"]:
            for m in g["models"]:
                want = memory[m["variant"]][g["resource"]][m["batch"]] + EXECUTOR_OVERHEAD_MB
                assert m["memory_mb"] == pytest.approx(want)


def test_apply_check_names_the_gpu_the_models_and_the_mib():
    gpus = [
        {"index": 0, "glets": [
            {"resource": "mps:60", "models": [
                {"model": "a", "variant": "va", "batch": 8, "memory_mb": 20000.0}]},
            {"resource": "mps:40", "models": [
                {"model": "b", "variant": "vb", "batch": 4, "memory_mb": 9000.0},
                {"model": "c", "variant": "vc", "batch": 2, "memory_mb": None}]},
        ]},
        {"index": 1, "glets": [{"resource": "mps:100", "models": [
            {"model": "d", "variant": "vd", "batch": 1, "memory_mb": 1000.0}]}]},
    ]  # fmt: skip
    first, second = gpu_needs(gpus)
    assert first.memory_mb == 29000.0 and first.unknown == ["c (vc, mps:40, batch 2)"]
    assert (second.index, second.memory_mb, second.unknown) == (1, 1000.0, [])
    check_gpu_memory(gpus, {0: ("A100", 40960.0, 0.0), 1: ("A100", 40960.0, 0.0)})  # fits
    with pytest.raises(InputError) as err:
        check_gpu_memory(gpus, {0: ("NVIDIA A10", 24576.0, 0.0), 1: ("A100", 40960.0, 0.0)})
    msg = err.value.message
    assert msg.startswith("GPU 0 (NVIDIA A10) cannot hold its glets: a (va, mps:60, batch 8)")
    assert "vb, mps:40, batch 4) 9,000 MiB = 29,000 MiB needed, 24,576 MiB available" in msg
    assert "c (vc, mps:40, batch 2) not counted" in msg
    # other processes' memory is not available
    with pytest.raises(InputError, match="in use by other processes"):
        check_gpu_memory(gpus, {0: ("A100", 40960.0, 20000.0), 1: ("A100", 40960.0, 0.0)})
    # a plan of another kind (MIG layouts) is no glet plan: nothing to check
    assert gpu_needs([{"index": 0, "layout": []}]) == []
