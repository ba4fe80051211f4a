"""plan glet: schedules obey the duty-cycle rule with interference, algorithm invariants."""

from __future__ import annotations

import math

import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.planner.core.interference import InterferenceModel
from greenctl.planner.glet.solve import (
    ALGORITHMS,
    Compiled,
    GletModel,
    GletProblem,
    plan_glet,
    schedule,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GPULET = path_of("gpulet")
PARTS = (20, 40, 50, 60, 80, 100)
BATCHES = (1, 2, 4, 8, 16, 32, 64)
SYNTH_IMODEL = InterferenceModel((0.3, 0.5, 0.2, 0.4, 1.0))


def synthetic_model(name: str, base_ms: float, per_ms: float, alpha: float, util: float):
    """L(b, p) = (base + per * b) * (100 / p) ** alpha; utilisation grows with b and p."""
    lat = {
        f"mps:{p}": {b: (base_ms + per_ms * b) * (100 / p) ** alpha for b in BATCHES} for p in PARTS
    }
    ut = {
        (name, b, p): (
            min(99.0, util * p / 100 * (1 + math.log2(b) / 6)),
            min(99.0, 0.8 * util * p / 100 * (1 + math.log2(b) / 6)),
        )
        for b in BATCHES
        for p in PARTS
    }
    return lat, ut


SYNTH = {
    "small": (1.0, 0.15, 0.6, 20.0),
    "medium": (3.0, 0.4, 0.8, 40.0),
    "large": (6.0, 0.9, 0.9, 60.0),
    "heavy": (10.0, 1.6, 1.0, 80.0),
}


def synthetic_problem(models: list[GletModel], **kw) -> GletProblem:
    lat, util = {}, {}
    for name, params in SYNTH.items():
        lat[name], u = synthetic_model(name, *params)
        util.update(u)
    kw.setdefault("interference", SYNTH_IMODEL)
    return GletProblem(models=models, latency_ms=lat, utilisation=util, **kw)


@pytest.fixture(scope="module")
def ref():
    """Latency table, utilisation and fitted interference model of the gpulet reference."""
    from greenctl.data.gpulet_import import read_gpulet_dir
    from greenctl.planner.core.interference import fit_interference

    data = read_gpulet_dir(GPULET)
    lat: dict = {}
    for r in data.solo:
        lat.setdefault(r.model, {}).setdefault(f"mps:{r.partition}", {})[r.batch] = r.latency_ms
    util = {
        (u.model, u.batch, u.partition): (u.l2_util_pct, u.dram_util_pct) for u in data.utilisation
    }
    solo = {(r.model, r.batch, r.partition): r.latency_ms for r in data.solo}
    fit = fit_interference(data.colocations, solo, util)
    return lat, util, fit.model


REF_SLO = {
    "vgg16": 30,
    "vgg19": 30,
    "resnet50": 25,
    "resnet101": 40,
    "resnet152": 50,
    "densenet121": 40,
    "densenet169": 50,
    "densenet201": 60,
    "inception": 30,
    "mobilenet": 20,
}


def ref_problem(ref, rates: dict[str, float], **kw) -> GletProblem:
    lat, util, imodel = ref
    models = [GletModel(n, r, REF_SLO[n]) for n, r in rates.items()]
    return GletProblem(models=models, latency_ms=lat, utilisation=util, interference=imodel, **kw)


# -- an independent check of the duty-cycle rule --------------------------------------------


def _poisson_cdf(k: int, lam: float) -> float:
    """P(Poisson(lam) <= k), summed in log space (independent of the planner's code)."""
    if lam <= 0:
        return 1.0
    return sum(math.exp(n * math.log(lam) - lam - math.lgamma(n + 1)) for n in range(k + 1))


def check_plan(plan, problem: GletProblem) -> None:
    """Recompute every glet's rule from the problem's raw data (not the planner's caches)."""
    q = problem.rate_percentile / 100
    imodel = problem.interference
    by_name = {m.name: m for m in problem.models}
    served = dict.fromkeys(by_name, 0.0)
    assert plan.predicted["gpus"] == len(plan.extra["gpus"]) <= problem.max_gpus
    for gpu in plan.extra["gpus"]:
        glets = gpu["glets"]
        assert 1 <= len(glets) <= 2
        assert sum(g["partition"] for g in glets) <= 100
        for n, g in enumerate(glets):
            mate = glets[1 - n] if len(glets) == 2 else None
            d = g["duty_cycle_ms"]
            total = 0.0
            for m in g["models"]:
                spec = by_name[m["model"]]
                lat_tab = problem.latency_ms[m["variant"]][g["resource"]]
                need = 0.0
                for b in sorted(lat_tab):
                    if b > m["batch"]:
                        break
                    factor = 1.0
                    if imodel is not None and mate is not None and mate["models"]:
                        me = problem.utilisation[(m["variant"], b, g["partition"])]
                        worst = 1.0
                        for other in mate["models"]:
                            for b2 in BATCHES:
                                ot = problem.utilisation.get(
                                    (other["variant"], b2, mate["partition"])
                                )
                                if ot is None:
                                    continue
                                worst = max(
                                    worst,
                                    imodel.factor(
                                        me[0] / 100, ot[0] / 100, me[1] / 100, ot[1] / 100
                                    ),
                                )
                        factor = worst
                    need = max(need, lat_tab[b] * factor)
                assert m["latency_ms"] >= need - 1e-6, (m, need)
                assert d + m["latency_ms"] <= spec.slo_ms + 1e-6
                lam = m["rate_rps"] * d / 1000
                assert _poisson_cdf(m["batch"], lam) >= q - 1e-6, (m, lam)
                total += m["latency_ms"]
                served[m["model"]] += m["rate_rps"]
            assert total <= d + 1e-6
    for name, m in by_name.items():
        assert served[name] == pytest.approx(m.rate_rps, rel=1e-6, abs=1e-6)
    for p in plan.predicted["per_model"]:
        assert p["slo_met"] and p["p99_ms"] <= p["slo_ms"] + 1e-6


# -- tests -----------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reference_schedules_meet_slo(ref, algorithm):
    problem = ref_problem(
        ref, {"resnet50": 400, "vgg16": 300, "mobilenet": 800, "inception": 200}, max_gpus=4
    )
    plan = plan_glet(problem, algorithm=algorithm)
    assert plan.kind == "glet"
    check_plan(plan, problem)
    dep_rates = {}
    for d in plan.deployments:
        dep_rates[d.model] = dep_rates.get(d.model, 0.0) + d.quota_rps
        assert d.resource.startswith("mps:") and d.count >= 1
    assert dep_rates == pytest.approx(
        {"resnet50": 400, "vgg16": 300, "mobilenet": 800, "inception": 200}
    )


def test_reference_schedule_under_simulated_poisson_load(ref):
    """The schedule holds up in simulation: time-shared cycles and the core's batch policy."""
    import numpy as np
    from greenctl.planner.core.latency import ServiceTime
    from greenctl.planner.core.simulator import batch_queue
    from greenctl.planner.glet.verify import simulate_glet_plan

    rates = {"resnet50": 800, "vgg19": 400, "densenet121": 200, "mobilenet": 100, "inception": 400}
    problem = ref_problem(ref, rates)
    plan = plan_glet(problem, simulate_s=10, seed=1)
    check_plan(plan, problem)
    sim = simulate_glet_plan(plan.extra["gpus"], REF_SLO, duration_s=10, seed=2)
    for name in rates:
        assert sim[name]["violation"] <= 0.02, (name, sim[name])
    rng = np.random.default_rng(0)
    for gpu in plan.extra["gpus"]:
        for g in gpu["glets"]:
            for m in g["models"]:
                arr = np.sort(rng.uniform(0, 10_000, rng.poisson(m["rate_rps"] * 10)))
                run = batch_queue(
                    arr,
                    ServiceTime.deterministic(m["latency_ms"]),
                    m["batch"],
                    rng,
                    max_wait_ms=m["duty_cycle_ms"],
                    depth=2,  # a GPU executor: the next batch fills while one runs
                )
                assert np.quantile(run.latency_ms, 0.99) <= REF_SLO[m["model"]] + 1e-6


def test_interference_matters(ref):
    rates = {n: 600 for n in ("resnet50", "vgg16", "vgg19", "inception", "densenet121")}
    with_i = plan_glet(ref_problem(ref, rates))
    without_problem = ref_problem(ref, rates)
    without_problem.interference = None
    without = plan_glet(without_problem)
    check_plan(with_i, ref_problem(ref, rates))
    assert without.predicted["gpus"] <= with_i.predicted["gpus"]
    factors = [
        m["interference_factor"]
        for gpu in with_i.extra["gpus"]
        for g in gpu["glets"]
        for m in g["models"]
    ]
    assert max(factors) > 1.0
    assert all(
        m["interference_factor"] == 1.0
        for gpu in without.extra["gpus"]
        for g in gpu["glets"]
        for m in g["models"]
    )


def test_infeasible_model_is_named():
    problem = synthetic_problem([GletModel("small", 100, 50), GletModel("heavy", 10, 5)])
    with pytest.raises(InfeasiblePlan, match="heavy") as exc:
        plan_glet(problem)
    assert "small (" not in str(exc.value)
    assert exc.value.exit_code == 3


def test_too_few_gpus_is_infeasible():
    problem = synthetic_problem([GletModel("heavy", 5000, 100)], max_gpus=1)
    with pytest.raises(InfeasiblePlan, match="max-gpus 1"):
        plan_glet(problem)


def test_bad_inputs():
    with pytest.raises(InputError, match="unknown algorithm"):
        plan_glet(synthetic_problem([GletModel("small", 1, 50)]), algorithm="magic")
    with pytest.raises(InputError, match="no profiles"):
        plan_glet(synthetic_problem([GletModel("nope", 1, 50)]))
    with pytest.raises(InputError, match="whole GPU"):
        plan_glet(synthetic_problem([GletModel("small", 1, 50)], partitions=["mps:20", "mps:80"]))
    with pytest.raises(InputError, match="twice"):
        plan_glet(synthetic_problem([GletModel("small", 1, 50), GletModel("small", 2, 50)]))


def test_zero_rate_model_gets_nothing():
    plan = plan_glet(synthetic_problem([GletModel("small", 0, 50), GletModel("large", 300, 60)]))
    per = {p["model"]: p for p in plan.predicted["per_model"]}
    assert per["small"]["rate_rps"] == 0 and per["large"]["rate_rps"] == pytest.approx(300)


def test_time_sharing_merges_small_models():
    models = [GletModel(n, 20, 100) for n in SYNTH]
    plan = plan_glet(synthetic_problem(models))
    assert plan.predicted["gpus"] == 1
    shared = [g for gpu in plan.extra["gpus"] for g in gpu["glets"] if len(g["models"]) > 1]
    assert shared, plan.extra["gpus"]


def test_no_rate_percentile_packs_tighter_or_equal():
    models = [GletModel("medium", 1500, 40), GletModel("large", 900, 60)]
    strict = plan_glet(synthetic_problem(models))
    loose = plan_glet(synthetic_problem(models, rate_percentile=0))
    assert loose.predicted["gpus"] <= strict.predicted["gpus"]


model_st = st.tuples(
    st.sampled_from(sorted(SYNTH)),
    st.sampled_from([0, 20, 100, 300, 800, 2000]),
    st.sampled_from([40, 60, 100, 200]),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(model_st, min_size=1, max_size=4, unique_by=lambda t: t[0]))
def test_glet_never_worse_than_sbp_or_greedy_and_ideal_never_worse(specs):
    problem = synthetic_problem([GletModel(n, r, s) for n, r, s in specs], max_gpus=6)
    c = Compiled(problem)
    got = {a: schedule(c, a) for a in ALGORITHMS}
    gpus = {a: (s.used_gpus if s is not None else 99) for a, s in got.items()}
    assert gpus["glet"] <= gpus["sbp"]
    assert gpus["glet"] <= gpus["greedy"]
    assert gpus["ideal"] <= gpus["glet"]
    for a in ALGORITHMS:
        if got[a] is not None:
            plan = plan_glet(problem, algorithm=a)
            assert plan.predicted["gpus"] == gpus[a]
            check_plan(plan, problem)


def test_mig_partitions_have_no_interference():
    lat = {
        "m": {
            "mig:3g.40gb": {1: 3.0, 4: 6.0, 16: 18.0},
            "mig:4g.40gb": {1: 2.5, 4: 5.0, 16: 14.0},
            "mig:7g.80gb": {1: 2.0, 4: 3.0, 16: 8.0},
        }
    }
    problem = GletProblem(
        models=[GletModel("m", 300, 20)],
        latency_ms=lat,
        partitions=["mig:3g.40gb", "mig:4g.40gb", "mig:7g.80gb"],
        interference=SYNTH_IMODEL,
    )
    plan = plan_glet(problem)
    for gpu in plan.extra["gpus"]:
        for g in gpu["glets"]:
            assert g["resource"].startswith("mig:")
            assert all(m["interference_factor"] == 1.0 for m in g["models"])
