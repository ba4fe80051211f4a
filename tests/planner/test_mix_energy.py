"""plan mix prices energy and carbon as the evaluation core accounts them (issue 17).

The solver's energy and carbon terms come from ``evaluate.energy_terms`` (idle power per
instance, busy energy above idle per request served), so a plan's reported
``energy_j_per_request`` and ``carbon_g_per_request`` (the core's ``predict``) are what its
objective terms sum to.
"""

from __future__ import annotations

import math

import pytest
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.evaluate import ServingPath, energy_terms, predict
from greenctl.planner.mix.solve import (
    build_mix_problem,
    evaluate_allocation,
    objective_terms,
    plan_mix,
)

REL = 1e-6


# -- records -------------------------------------------------------------------------------------
def _profile(variant: str, resource: str, p50: float, busy: float, idle: float, **kw) -> Profile:
    return Profile(
        variant=variant,
        resource=resource,
        batch=kw.pop("batch", 1),
        throughput_rps=1000.0 * kw.get("rows", 1) / p50,
        latency_p50_ms=p50,
        latency_p95_ms=p50 * 1.25,
        latency_p99_ms=p50 * 1.5,
        power_w=busy,
        idle_power_w=idle,
        cost_per_hour=0.04 * float(resource.split(":")[1]) if resource.startswith("cpu") else 1.0,
        **{k: v for k, v in kw.items() if k != "rows"},
    )


def _cpu_family(*, isolated: bool = False) -> tuple[list[Variant], list[Profile]]:
    """Two variants on 1, 2 and 4 cores with idle power (and, optionally, slower isolated
    runs: the cold-run shift)."""
    variants = [Variant("small", "m", accuracy=0.70), Variant("large", "m", accuracy=0.78)]
    profiles = []
    for name, base in (("small", 20.0), ("large", 55.0)):
        for cores in (1, 2, 4):
            p50 = base / cores**0.85
            extra = {}
            if isolated:
                extra = {"isolated_p50_ms": p50 * 1.3, "isolated_p95_ms": p50 * 1.6,
                         "isolated_p99_ms": p50 * 2.0}  # fmt: skip
            profiles.append(
                _profile(name, f"cpu:{cores}", p50, 9.0 * cores, 2.0 + 2.5 * cores, **extra)
            )
    return variants, profiles


def _gpu_family() -> tuple[list[Variant], list[Profile]]:
    """One variant batching on a GPU (sizes 1, 8, 32) and unbatched on a MIG slice."""
    variants = [Variant("net", "g", accuracy=0.76)]
    profiles = [
        _profile("net", "gpu:H200", 4.0, 220.0, 110.0),
        _profile("net", "gpu:H200", 10.0, 330.0, 110.0, batch=8, rows=8),
        _profile("net", "gpu:H200", 28.0, 420.0, 110.0, batch=32, rows=32),
        _profile("net", "mig:1g.18gb", 9.0, 45.0, 18.0),
    ]
    return variants, profiles


def _alloc(problem, plan):
    """The plan's deployments as the allocation the solver's terms evaluate."""
    alloc: dict[int, dict[int, tuple[int, float]]] = {}
    for fi, fam in enumerate(problem.families):
        alloc[fi] = {}
        for d in plan.deployments:
            if d.model != fam.name:
                continue
            oi = next(
                i
                for i, o in enumerate(fam.options)
                if (o.variant, o.resource, o.batch) == (d.variant, d.resource, d.batch)
            )
            alloc[fi][oi] = (d.count, float(d.quota_rps))
    return alloc


def _check_reported_equals_objective(problem, plan) -> None:
    terms = objective_terms(problem)
    solver = evaluate_allocation(problem, _alloc(problem, plan), terms)
    pred = plan.predicted
    assert pred["energy_j_per_request"] == pytest.approx(solver["energy_j_per_request"], rel=REL)
    assert pred["carbon_g_per_request"] == pytest.approx(solver["carbon_g_per_request"], rel=REL)
    assert pred["objective"] == pytest.approx(solver["objective"], rel=REL, abs=1e-12)
    assert not [k for k in pred if k.startswith(("planner_", "solver_"))], sorted(pred)


# -- the core's one function -------------------------------------------------------------------
@pytest.mark.parametrize(
    "serving",
    [
        None,
        ServingPath((1.0, 2.0), executor_cpu_ms=0.8, service_scale=1.4),  # served CPU runs
        ServingPath((1.0,), executor_cpu_ms=0.5),  # no scale: cold runs, rate-dependent
    ],
)
@pytest.mark.parametrize("isolated", [False, True])
def test_energy_terms_sum_to_predicts_power(serving, isolated):
    variants, profiles = _cpu_family(isolated=isolated)
    by_key = {(p.variant, p.resource, p.batch): p for p in profiles}
    records = {v.name: v for v in variants}
    deps = [
        Deployment("m", "small", "cpu:1", count=3, quota_rps=60.0),
        Deployment("m", "large", "cpu:4", count=2, quota_rps=40.0),
    ]
    rate = 100.0
    out = predict(deps, by_key, records, rate_rps={"m": rate}, policy="wrr",
                  serving={"m": serving} if serving else None, carbon_g_per_kwh=300.0)  # fmt: skip
    power = 0.0
    for d in deps:
        per = rate * d.quota_rps / 100.0 / d.count  # the quota split predict serves
        t = energy_terms(d, by_key, rate_rps=per, serving={"m": serving} if serving else None)
        assert t is not None and t.idle_w == by_key[(d.variant, d.resource, 1)].idle_power_w
        power += d.count * t.power_w(per)
        if serving is None or serving.service_scale is not None:
            assert t.linear  # the same terms at any rate: exact for every plan
            half = energy_terms(d, by_key, rate_rps=per / 2, serving=None if serving is None
                                else {"m": serving})  # fmt: skip
            assert half.dynamic_j_per_request == pytest.approx(t.dynamic_j_per_request, rel=1e-9)
    assert power == pytest.approx(out["power_w"], rel=1e-9)
    assert out["energy_j_per_request"] == pytest.approx(power / rate, rel=1e-9)


def test_energy_terms_of_a_batching_instance_hold_at_their_rate():
    _, profiles = _gpu_family()
    by_key = {(p.variant, p.resource, p.batch): p for p in profiles}
    dep = Deployment("g", "net", "gpu:H200", batch=32, quota_rps=300.0)
    t = energy_terms(dep, by_key, rate_rps=300.0)
    assert t is not None and not t.linear
    out = predict([dep], by_key, {}, rate_rps={"g": 300.0}, policy="batch")
    assert t.power_w(300.0) == pytest.approx(out["power_w"], rel=1e-9)
    # partial batches at a lower rate: more busy time per request than at 300 req/s
    low = energy_terms(dep, by_key, rate_rps=60.0)
    assert low.dynamic_j_per_request > t.dynamic_j_per_request


# -- plans report what the solver minimised ----------------------------------------------------
@pytest.mark.parametrize("objective", ["carbon", "balanced", "accuracy", "cost"])
@pytest.mark.parametrize(
    ("budgets", "headroom"), [({"cpu": 12}, 0.0), ({"cpu": 7}, 0.2), ({}, 0.0)]
)
@pytest.mark.parametrize("isolated", [False, True])
def test_reported_energy_and_carbon_are_the_objectives(objective, budgets, headroom, isolated):
    variants, profiles = _cpu_family(isolated=isolated)
    req = {"model": "m", "rate_rps": 90.0, "slo_ms": 400.0, "objective": objective,
           "budgets": budgets, "headroom": headroom, "carbon_intensity": 250.0,
           "pue": 1.2}  # fmt: skip
    problem = build_mix_problem(req, variants, profiles)
    plan = plan_mix(problem)
    assert sum(o.idle_power_w > 0 for o in problem.families[0].options)
    _check_reported_equals_objective(problem, plan)
    g = plan.predicted["energy_j_per_request"] / 3.6e6 * 1.2 * 250.0
    assert plan.predicted["carbon_g_per_request"] == pytest.approx(g, rel=1e-12)


def test_reported_energy_is_the_objectives_with_a_serving_path_and_two_families():
    variants, profiles = _cpu_family()
    variants2 = [Variant("tiny", "t", accuracy=0.6)]
    profiles2 = [_profile("tiny", f"cpu:{c}", 6.0 / c**0.9, 8.0 * c, 3.0 * c) for c in (1, 2)]
    path = ServingPath((1.5, 2.5, 3.0), executor_cpu_ms=0.6, service_scale=1.2)
    req = {"families": [{"model": "m", "rate_rps": 60.0, "slo_ms": 300.0},
                        {"model": "t", "rate_rps": 150.0, "slo_ms": 60.0}],
           "objective": "carbon", "budgets": {"cpu": 16}, "carbon_intensity": 500.0}  # fmt: skip
    problem = build_mix_problem(req, variants + variants2, profiles + profiles2,
                                serving={"m": path, "t": path})  # fmt: skip
    plan = plan_mix(problem)
    _check_reported_equals_objective(problem, plan)


def test_each_family_is_held_to_its_own_slo():
    """The violation share counts each family's requests against its own SLO, not the
    loosest of all."""
    variants, profiles = _cpu_family()
    variants2 = [Variant("tiny", "t", accuracy=0.6)]
    profiles2 = [_profile("tiny", "cpu:1", 6.0, 8.0, 3.0)]
    req = {"families": [{"model": "m", "rate_rps": 30.0, "slo_ms": 2000.0},
                        {"model": "t", "rate_rps": 100.0, "slo_ms": 12.0}],
           "objective": "cost", "percentile": "p99"}  # fmt: skip
    problem = build_mix_problem(req, variants + variants2, profiles + profiles2)
    plan = plan_mix(problem)
    by_key = {(p.variant, p.resource, p.batch): p for p in profiles + profiles2}
    records = {v.name: v for v in variants + variants2}
    want = 0.0
    for fam in problem.families:
        deps = [d for d in plan.deployments if d.model == fam.name]
        one = predict(deps, by_key, records, rate_rps={fam.name: fam.rate_rps}, policy="wrr",
                      percentile_slo_ms=fam.slo_ms)  # fmt: skip
        want += one["slo_violation_frac"] * fam.rate_rps / 130.0
    assert plan.predicted["slo_violation_frac"] == pytest.approx(want, rel=1e-9, abs=1e-15)


def test_idle_power_makes_fewer_bigger_instances_win():
    """Per request busy, one core is greener (0.64 J against 0.72 on four cores), and the
    old per-request pricing planned 5 one-core instances; each draws 7.5 W idle, so one
    four-core instance uses less energy, which the core's prediction confirms."""
    variants = [Variant("v", "m", accuracy=0.7)]
    profiles = [_profile("v", "cpu:1", 80.0, 8.0, 7.5), _profile("v", "cpu:4", 20.0, 36.0, 10.0)]
    req = {"model": "m", "rate_rps": 40.0, "slo_ms": 500.0, "objective": "carbon",
           "carbon_intensity": 300.0}  # fmt: skip
    problem = build_mix_problem(req, variants, profiles)
    plan = plan_mix(problem)
    assert [(d.resource, d.count) for d in plan.deployments] == [("cpu:4", 1)]
    _check_reported_equals_objective(problem, plan)
    # the plan the per-request pricing picked: more energy by the core's own account
    small = next(o for o in problem.families[0].options if o.resource == "cpu:1")
    n = math.ceil(40.0 / small.capacity_rps)
    by_key = {(p.variant, p.resource, p.batch): p for p in profiles}
    other = predict([Deployment("m", "v", "cpu:1", count=n, quota_rps=40.0)], by_key,
                    {"v": variants[0]}, rate_rps={"m": 40.0}, policy="wrr")  # fmt: skip
    assert other["energy_j_per_request"] > plan.predicted["energy_j_per_request"] * 1.1
    assert profiles[0].power_w / profiles[0].throughput_rps < (
        profiles[1].power_w / profiles[1].throughput_rps
    )


@pytest.mark.parametrize(("rate", "objective"), [(300.0, "accuracy"), (120.0, "carbon"),
                                                 (900.0, "balanced"), (2000.0, "accuracy")])  # fmt: skip
def test_batching_plans_are_priced_at_the_rates_they_get(rate, objective):
    """A batching option is first priced at its family's rate over the instances that
    would serve it alone; a plan that gives it another rate is re-priced and solved again
    (at 2,000 req/s: one batch-32 GPU instance takes 600 req/s, not the 1,000 it was
    priced at), until the energy the solver minimised is the core's."""
    variants, profiles = _gpu_family()
    req = {"model": "g", "rate_rps": rate, "slo_ms": 80.0, "objective": objective,
           "budgets": {"gpu": 1}, "carbon_intensity": 400.0}  # fmt: skip
    problem = build_mix_problem(req, variants, profiles)
    plan = plan_mix(problem)
    assert not plan.predicted["overloaded"]
    # every batching deployment the plan runs was priced at the rate each instance gets
    fam = problem.families[0]
    for d in plan.deployments:
        o = next(o for o in fam.options if (o.resource, o.batch) == (d.resource, d.batch))
        per = rate * d.quota_rps / fam.load_rps(problem.headroom) / d.count
        assert o.energy_linear or o.energy_rate_rps == pytest.approx(per, rel=1e-6)
    if rate == 2000.0:
        assert {d.batch for d in plan.deployments} == {1, 32}
        assert plan.extra["solver"]["energy_rounds"] >= 1
    _check_reported_equals_objective(problem, plan)
