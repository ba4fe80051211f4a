"""plan mix: exactness against brute force, feasibility, baselines, errors, actions."""

from __future__ import annotations

import math

import pytest
from greenctl.data.errors import InfeasiblePlan, InputError, NotFoundError
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core import solvers
from greenctl.planner.mix import solve as mix
from greenctl.planner.mix.solve import (
    MixFamily,
    MixOption,
    MixProblem,
    MixVariant,
    build_mix_problem,
    count_bounds,
    evaluate_allocation,
    objective_terms,
    plan_mix,
    prune_dominated,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

TOL = 1e-5


# -- brute force ------------------------------------------------------------------------------
def _fill(costs: list[float], caps: list[float], load: float) -> list[float] | None:
    """Exact minimiser of sum(c q) s.t. sum(q) = load, 0 <= q <= cap (fractional knapsack)."""
    if sum(caps) < load - 1e-9:
        return None
    q = [0.0] * len(costs)
    left = load
    for i in sorted(range(len(costs)), key=lambda i: costs[i]):
        q[i] = min(caps[i], left)
        left -= q[i]
    return q


def brute_force(problem: MixProblem, *, single: bool = False) -> float | None:
    """Best objective by enumerating every count vector and solving the quota LP exactly."""
    terms = objective_terms(problem)
    fams = problem.families
    flat = [(fi, oi) for fi, f in enumerate(fams) for oi in range(len(f.options))]
    bounds = {fi: count_bounds(problem, fi) for fi in range(len(fams))}
    maximise = mix.is_maximise(problem.objective)
    best: list[float | None] = [None]

    def quotas(fi: int, n: dict) -> dict | None:
        fam = fams[fi]
        load = fam.load_rps(problem.headroom)
        idx = list(range(len(fam.options)))
        if problem.objective == "accuracy":
            c = [-terms.acc[fi][oi] for oi in idx]
        elif problem.objective == "carbon":
            c = [terms.carbon[fi][oi] for oi in idx]
        elif problem.objective == "balanced":
            c = [-(terms.acc[fi][oi] - problem.gamma * terms.cc[fi][oi]) for oi in idx]
        else:
            c = [0.0 for _ in idx]
        caps = [fam.options[oi].capacity_rps * n[(fi, oi)] for oi in idx]
        if fam.min_accuracy is None:
            q = _fill(c, caps, load)
        else:
            acc = [fam.variants[fam.options[oi].variant].accuracy for oi in idx]
            res = linprog(
                c,
                A_ub=[[-(a - fam.min_accuracy) for a in acc]],
                b_ub=[1e-9 * max(load, 1.0)],
                A_eq=[[1.0] * len(idx)],
                b_eq=[load],
                bounds=[(0, cap) for cap in caps],
                method="highs",
            )
            q = None if res.status != 0 else [float(v) for v in res.x]
        if q is None:
            return None
        return {oi: (n[(fi, oi)], q[oi]) for oi in idx}

    def visit(i: int, n: dict, used: dict) -> None:
        if i == len(flat):
            if single:
                for fi in range(len(fams)):
                    vs = {fams[fi].options[oi].variant for (g, oi), c in n.items() if g == fi and c}
                    if len(vs) > 1:
                        return
            alloc = {}
            for fi in range(len(fams)):
                part = quotas(fi, n)
                if part is None:
                    return
                alloc[fi] = part
            value = evaluate_allocation(problem, alloc, terms)["objective"]
            if best[0] is None or (value > best[0] if maximise else value < best[0]):
                best[0] = value
            return
        fi, oi = flat[i]
        opt = fams[fi].options[oi]
        for c in range(bounds[fi][oi] + 1):
            new_used = {k: used[k] + opt.usage.get(k, 0.0) * c for k in used}
            if any(new_used[k] > problem.budgets[k] + 1e-9 for k in used):
                break
            n[(fi, oi)] = c
            visit(i + 1, n, new_used)
        n.pop((fi, oi), None)

    visit(0, {}, {k: 0.0 for k in problem.budgets})
    return best[0]


# -- random small instances ---------------------------------------------------------------------
@st.composite
def small_problems(draw):
    objective = draw(st.sampled_from(mix.OBJECTIVES))
    nfam = draw(st.integers(1, 2))
    families = []
    for f in range(nfam):
        nvar = draw(st.integers(1, 2))
        total_opts = 0
        variants = {}
        options = []
        for v in range(nvar):
            name = f"f{f}v{v}"
            variants[name] = MixVariant(name, draw(st.floats(0.5, 0.9)), draw(st.floats(1.0, 9.0)))
            for cores in draw(st.sets(st.sampled_from([1, 2, 4]), min_size=1, max_size=2)):
                if total_opts >= (3 if nfam == 1 else 2):
                    break
                total_opts += 1
                options.append(
                    MixOption(
                        variant=name,
                        resource=f"cpu:{cores}",
                        batch=1,
                        capacity_rps=draw(st.floats(3.0, 20.0)) * cores**0.8,
                        cost_per_hour=0.04 * cores * draw(st.floats(0.8, 1.2)),
                        energy_j_per_request=draw(st.floats(0.5, 5.0)),
                        latency_ms=100.0,
                        usage={"cpu": float(cores)},
                        # idle power: a carbon cost per instance (evaluate.energy_terms)
                        idle_power_w=draw(st.sampled_from([0.0, 0.0, 3.0, 20.0])) * cores,
                    )
                )
        floor = None
        if objective in ("cost", "carbon") and draw(st.booleans()):
            floor = draw(st.floats(0.5, 0.8))
        families.append(
            MixFamily(
                name=f"fam{f}",
                rate_rps=draw(st.floats(1.0, 25.0)),
                slo_ms=500.0,
                variants=variants,
                options=options,
                min_accuracy=floor,
            )
        )
    return MixProblem(
        families=families,
        budgets={"cpu": float(draw(st.integers(2, 8)))},
        objective=objective,
        alpha=draw(st.sampled_from([0.0, 0.05, 0.3])),
        beta=draw(st.sampled_from([0.0, 0.001, 0.05])),
        gamma=draw(st.sampled_from([0.0, 0.05, 0.3])),
        carbon_intensity=draw(st.sampled_from([None, 100.0, 700.0])),
        headroom=draw(st.sampled_from([0.0, 0.2])),
        current=[Deployment("fam0", "f0v0", "cpu:1")] if draw(st.booleans()) else [],
    )


def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL * max(1.0, abs(a), abs(b))


def check_feasible(problem: MixProblem, plan) -> None:
    used = {k: 0.0 for k in problem.budgets}
    for fam in problem.families:
        deps = [d for d in plan.deployments if d.model == fam.name]
        load = fam.load_rps(problem.headroom)
        assert math.isclose(sum(d.quota_rps for d in deps), load, rel_tol=1e-6, abs_tol=1e-6)
        cap = 0.0
        for d in deps:
            opt = next(
                o
                for o in fam.options
                if (o.variant, o.resource, o.batch) == (d.variant, d.resource, d.batch)
            )
            assert d.quota_rps <= opt.capacity_rps * d.count * (1 + 1e-6) + 1e-6
            cap += opt.capacity_rps * d.count
            for k, a in opt.usage.items():
                used[k] += a * d.count
        assert cap >= load * (1 - 1e-6)
        if fam.min_accuracy is not None:
            acc = sum(fam.variants[d.variant].accuracy * d.quota_rps for d in deps) / load
            assert acc >= fam.min_accuracy - 1e-6
    for k, b in problem.budgets.items():
        assert used[k] <= b + 1e-6


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems())
def test_ilp_equals_brute_force_and_baselines_are_never_better(problem):
    best = brute_force(problem)
    if best is None:
        with pytest.raises(InfeasiblePlan):
            plan_mix(problem)
        return
    plan = plan_mix(problem)
    assert plan.extra["solver"]["status"] == "optimal"
    assert close(plan.predicted["objective"], best), (plan.predicted["objective"], best)
    check_feasible(problem, plan)
    maximise = mix.is_maximise(problem.objective)
    for strategy in ("greedy", "single"):
        try:
            other = plan_mix(problem, strategy=strategy)
        except InfeasiblePlan:
            continue
        check_feasible(problem, other)
        v = other.predicted["objective"]
        assert (v <= best + TOL) if maximise else (v >= best - TOL), (strategy, v, best)
    single_best = brute_force(problem, single=True)
    if single_best is not None:
        single = plan_mix(problem, strategy="single")
        assert close(single.predicted["objective"], single_best)


@pytest.mark.skipif(
    solvers.find_cbc() is None, reason="no CBC installed (PuLP 4 bundles none; pip install cbcbox)"
)
def test_cbc_agrees_with_highs():
    problem = _resnet_like_problem(objective="accuracy", budget=9)
    a = plan_mix(problem, solver="highs")
    b = plan_mix(problem, solver="cbc")
    assert b.extra["solver"]["name"] == "cbc"
    assert close(a.predicted["objective"], b.predicted["objective"])


# -- a hand-sized family --------------------------------------------------------------------------
def _resnet_like_problem(*, objective="balanced", budget=8, rate=30.0, floor=None, current=()):
    variants = {
        "small": MixVariant("small", 0.70, 6.0),
        "big": MixVariant("big", 0.78, 9.0),
    }
    options = [
        MixOption("small", "cpu:1", 1, 20.0, 0.04, 0.5, 300.0, {"cpu": 1.0}),
        MixOption("small", "cpu:2", 1, 43.0, 0.08, 0.47, 300.0, {"cpu": 2.0}),
        MixOption("big", "cpu:1", 1, 3.0, 0.04, 2.0, 600.0, {"cpu": 1.0}),
        MixOption("big", "cpu:3", 1, 10.0, 0.12, 2.3, 600.0, {"cpu": 3.0}),
    ]
    fam = MixFamily("resnet", rate, 750.0, variants, options, min_accuracy=floor)
    return MixProblem(
        families=[fam],
        budgets={"cpu": float(budget)},
        objective=objective,
        current=list(current),
        percentile="p99",
    )


def test_accuracy_objective_mixes_variants_under_a_budget():
    plan = plan_mix(_resnet_like_problem(objective="accuracy", budget=8))
    variants = {d.variant for d in plan.deployments}
    assert variants == {"small", "big"}  # the budget cannot carry 30 req/s of "big" alone
    single = plan_mix(_resnet_like_problem(objective="accuracy", budget=8), strategy="single")
    assert {d.variant for d in single.deployments} == {"small"}
    assert plan.predicted["accuracy"] > single.predicted["accuracy"]
    assert "one variant per family" in single.extra["solver"]["scope"]  # optimal only within it
    assert "scope" not in plan.extra["solver"]
    assert plan.kind == "mix" and plan.extra["solver"]["status"] == "optimal"
    for key in (
        "rate_rps",
        "accuracy",
        "cost_per_hour",
        "p99_ms",
        "energy_j_per_request",
        "carbon_g_per_request",
        "objective",
    ):
        assert key in plan.predicted


def test_cost_objective_respects_min_accuracy():
    cheap = plan_mix(_resnet_like_problem(objective="cost", budget=20))
    assert {d.variant for d in cheap.deployments} == {"small"}
    floor = plan_mix(_resnet_like_problem(objective="cost", budget=20, floor=0.75))
    assert floor.predicted["accuracy"] >= 0.75 - 1e-9
    assert floor.predicted["cost_per_hour"] > cheap.predicted["cost_per_hour"]


def test_carbon_intensity_shifts_the_balanced_plan_towards_low_energy():
    clean = _resnet_like_problem(objective="balanced", budget=20)
    clean.carbon_intensity = 10.0
    clean.gamma = 0.2
    dirty = _resnet_like_problem(objective="balanced", budget=20)
    dirty.carbon_intensity = 2000.0
    dirty.gamma = 0.2
    a, b = plan_mix(clean), plan_mix(dirty)
    assert b.predicted["energy_j_per_request"] <= a.predicted["energy_j_per_request"]
    assert b.predicted["energy_j_per_request"] < a.predicted["energy_j_per_request"] or (
        a.predicted["accuracy"] == b.predicted["accuracy"]
    )


def test_time_limit_is_labelled():
    plan = plan_mix(_resnet_like_problem(objective="accuracy"), time_limit_s=5.0)
    assert plan.extra["solver"]["status"] in ("optimal", "time_limit")
    assert "gap" in plan.extra["solver"] and "solve_s" in plan.extra["solver"]


def test_infeasible_messages_name_the_binding_constraint():
    with pytest.raises(InfeasiblePlan, match="budget too small for the rate") as e:
        plan_mix(_resnet_like_problem(budget=1, rate=100.0))
    assert "largest servable rate" in str(e.value)
    assert e.value.servable_scale is not None and 0 < e.value.servable_scale < 1
    with pytest.raises(InfeasiblePlan, match="accuracy floor unreachable for") as e:
        plan_mix(_resnet_like_problem(objective="cost", floor=0.9))
    assert "highest reachable accuracy: 0.78" in str(e.value)
    with pytest.raises(InfeasiblePlan, match="accuracy floor unreachable within") as e:
        plan_mix(_resnet_like_problem(objective="cost", floor=0.77, budget=3, rate=30.0))
    assert "highest reachable accuracy" in str(e.value)


def test_dominated_options_are_pruned_exactly():
    a = MixOption("v", "cpu:2", 1, 40.0, 0.08, 1.0, None, {"cpu": 2.0})
    b = MixOption("v", "cpu:2", 2, 30.0, 0.08, 1.2, None, {"cpu": 2.0})  # worse in all
    c = MixOption("v", "cpu:1", 1, 19.0, 0.04, 1.0, None, {"cpu": 1.0})  # 2 x c < a
    kept, pruned = prune_dominated([a, b, c])
    assert pruned == 1 and b not in kept and a in kept and c in kept


# -- building from records ----------------------------------------------------------------------
def _records(latency_only: bool = False):
    variants = [
        Variant("m-small", "m", accuracy=0.70, load_time_s=2.0),
        Variant("m-big", "m", accuracy=0.80, load_time_s=5.0),
    ]
    profiles = []
    for name, base in (("m-small", 8.0), ("m-big", 30.0)):
        for cores in (1, 2, 4):
            p50 = base / cores**0.8
            p = Profile(
                variant=name,
                resource=f"cpu:{cores}",
                batch=1,
                throughput_rps=1000.0 / p50,
                latency_p50_ms=p50,
                latency_p95_ms=p50 * 1.3,
                latency_p99_ms=p50 * 1.6,
                energy_j=0.01 * cores * p50,
                cost_per_hour=0.04 * cores,
            )
            if not latency_only:
                p.capacity_rps = 0.7 * 1000.0 / p50
                p.capacity_slo_ms = 50.0
            profiles.append(p)
    return variants, profiles


def test_every_instance_meets_the_slo_under_the_evaluation_core():
    from greenctl.planner.core.latency import ServiceTime
    from greenctl.planner.core.queueing import latency_quantile_ms

    variants, profiles = _records(latency_only=True)
    req = {
        "model": "m",
        "rate_rps": 300.0,
        "slo_ms": 60.0,
        "budgets": {"cpu": 16},
        "objective": "accuracy",
        "percentile": "p95",
    }
    problem = build_mix_problem(req, variants, profiles)
    assert all(o.capacity_source == "queueing" for o in problem.families[0].options)
    plan = plan_mix(problem)
    check_feasible(problem, plan)
    by_key = {(p.variant, p.resource, p.batch): p for p in profiles}
    for d in plan.deployments:
        service = ServiceTime.from_profile(by_key[(d.variant, d.resource, d.batch)])
        lat = latency_quantile_ms(d.quota_rps / d.count, service, 1, 0.95)
        assert lat <= 60.0 * (1 + 1e-3), (d, lat)
    # the evaluation core's predict() fills the latency of the plan; the planner keeps no
    # figures of its own beside the core's (its energy terms are the core's)
    assert plan.predicted["p95_ms"] <= 60.0 * 1.05
    assert not [k for k in plan.predicted if k.startswith(("planner_", "solver_"))]


def test_load_tested_capacity_uses_largest_slo_not_above_request():
    variants, profiles = _records()
    extra = [
        Profile(
            variant=p.variant,
            resource=p.resource,
            batch=1,
            throughput_rps=p.throughput_rps,
            latency_p50_ms=p.latency_p50_ms,
            capacity_rps=p.capacity_rps * 1.2,
            capacity_slo_ms=80.0,
        )
        for p in profiles
    ]
    req = {"model": "m", "rate_rps": 50.0, "slo_ms": 70.0}
    prob = build_mix_problem(req, variants, profiles + extra)
    assert {o.capacity_source for o in prob.families[0].options} == {"load-tested@50ms"}
    prob = build_mix_problem({**req, "slo_ms": 90.0}, variants, profiles + extra)
    assert {o.capacity_source for o in prob.families[0].options} == {"load-tested@80ms"}


@pytest.mark.parametrize(
    ("change", "error", "text"),
    [
        ({"model": "nope"}, NotFoundError, "unknown model family 'nope'"),
        ({"rate_rps": -1}, InputError, "must be > 0"),
        ({"slo_ms": 0}, InputError, "must be > 0"),
        ({"budgets": {"tpu": 2}}, InputError, "budget for unknown resource kind 'tpu'"),
        ({"budgets": {"gpu": 2}}, InputError, "no profile of m uses it"),
        ({"objective": "speed"}, InputError, "unknown objective"),
        ({"percentile": "p90"}, InputError, "percentile must be p95 or p99"),
    ],
)
def test_bad_requests(change, error, text):
    variants, profiles = _records()
    req = {"model": "m", "rate_rps": 50.0, "slo_ms": 70.0, **change}
    with pytest.raises(error, match=text):
        build_mix_problem(req, variants, profiles)


def test_slo_below_every_latency_names_lowest_reachable_slo():
    variants, profiles = _records(latency_only=True)
    prob = build_mix_problem({"model": "m", "rate_rps": 5.0, "slo_ms": 2.0}, variants, profiles)
    with pytest.raises(InfeasiblePlan, match="no variant of 'm' meets the SLO") as e:
        plan_mix(prob)
    assert "lowest reachable SLO" in str(e.value)


def test_replan_from_plan_request_round_trips():
    variants, profiles = _records()
    req = {"model": "m", "rate_rps": 50.0, "slo_ms": 70.0, "budgets": {"cpu": 8}}
    plan = plan_mix(build_mix_problem(req, variants, profiles))
    again = plan_mix(
        build_mix_problem({**plan.request, "carbon_intensity": 300.0}, variants, profiles)
    )
    assert again.request["carbon_intensity"] == 300.0
    assert again.request["budgets"] == {"cpu": 8.0}


# -- actions against --current --------------------------------------------------------------------
def test_actions_replicate_keep_upgrade_start_stop():
    cur = [Deployment("resnet", "small", "cpu:1", count=1, quota_rps=10.0)]
    prob = _resnet_like_problem(objective="accuracy", budget=8, rate=30.0, current=cur)
    plan = plan_mix(prob)
    actions = {a["variant"]: a["action"] for a in plan.extra["actions"]}
    assert actions["big"] == "start"  # nothing of the family stopped
    assert actions["small"] in ("replicate", "upgrade", "downgrade", "keep")
    same = plan_mix(
        _resnet_like_problem(
            objective="accuracy",
            budget=8,
            rate=30.0,
            current=[
                Deployment(d.model, d.variant, d.resource, d.count, d.batch, d.quota_rps)
                for d in plan.deployments
            ],
        )
    )
    assert {a["action"] for a in same.extra["actions"]} == {"keep"}
    # a larger budget: all-big replaces the small variant -> upgrade + stop
    up = plan_mix(_resnet_like_problem(objective="accuracy", budget=20, rate=30.0, current=cur))
    acts = {a["variant"]: a["action"] for a in up.extra["actions"]}
    assert acts == {"big": "upgrade", "small": "stop"}
    # more load on the same variant -> replicate
    more = mix.scaling_actions(
        prob, [Deployment("resnet", "small", "cpu:1", count=3, quota_rps=30.0)]
    )
    assert more[0]["action"] == "replicate"


def test_running_variant_costs_no_loading_time():
    base = _resnet_like_problem(objective="balanced", budget=20, rate=30.0)
    base.beta = 1.0
    plan = plan_mix(base)
    started = {d.variant for d in plan.deployments}
    assert plan.predicted["terms"]["LC"] > 0
    cur = [Deployment("resnet", v, "cpu:1") for v in started]
    again = _resnet_like_problem(objective="balanced", budget=20, rate=30.0, current=cur)
    again.beta = 1.0
    assert plan_mix(again).predicted["terms"]["LC"] == 0.0


def test_single_strategy_infeasible_when_only_a_mix_fits():
    # 8 cores: "big" alone carries at most 24 req/s, "small" alone is fine; floor 0.72 needs
    # a share of "big", so only a mix meets both
    problem = _resnet_like_problem(objective="cost", budget=8, rate=30.0, floor=0.72)
    assert plan_mix(problem).predicted["accuracy"] >= 0.72 - 1e-9
    with pytest.raises(InfeasiblePlan, match="no single variant can serve the load alone"):
        plan_mix(problem, strategy="single")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_problems(), st.floats(1.6, 2.4))
def test_pruning_by_multiples_keeps_the_optimum(problem, scale):
    # add a sublinear cpu:2 twin of every cpu:1 option (two cpu:1 instances may beat it)
    for fam in problem.families:
        for o in list(fam.options):
            if o.resource == "cpu:1" and len(fam.options) < 3:
                fam.options.append(
                    MixOption(o.variant, "cpu:2", 1, o.capacity_rps * scale, o.cost_per_hour * 2,
                              o.energy_j_per_request * 1.05, 100.0, {"cpu": 2.0})
                )  # fmt: skip
    problem.gamma = 0.0  # CC is normalised by a reference plan that pruning may change
    best = brute_force(problem)
    for fam in problem.families:
        fam.options, fam.pruned = prune_dominated(fam.options)
    if best is None:
        with pytest.raises(InfeasiblePlan):
            plan_mix(problem)
        return
    assert close(plan_mix(problem).predicted["objective"], best)


def test_sublinear_sizes_are_pruned():
    small = MixOption("v", "cpu:1", 1, 10.0, 0.04, 1.0, None, {"cpu": 1.0})
    big = MixOption("v", "cpu:2", 1, 19.0, 0.08, 1.1, None, {"cpu": 2.0})  # 2 x small wins
    super_ = MixOption("v", "cpu:4", 1, 45.0, 0.16, 1.1, None, {"cpu": 4.0})  # superlinear
    kept, pruned = prune_dominated([small, big, super_])
    assert pruned == 1 and kept == [small, super_]


def test_a_slow_served_run_sizes_the_plan_on_served_capacity():
    """A CPU variant whose served runs take 2x its back-to-back profile (plus executor CPU)
    gets about half the capacity per instance, so the plan needs about twice the cores; the
    predicted latency counts the served runs; off CPU the CPU-measured path is not applied."""
    from greenctl.planner.core.evaluate import ServingPath

    variants = [Variant("v", "m", accuracy=0.8)]
    profiles = [
        Profile("v", "cpu:1", 1, throughput_rps=400.0, latency_p50_ms=2.5, latency_p95_ms=3.0),
        Profile("v", "gpu:A100", 1, throughput_rps=400.0, latency_p50_ms=2.5, latency_p95_ms=3.0),
    ]
    request = {"families": [{"model": "m", "rate_rps": 1000.0, "slo_ms": 40.0}]}

    def cpu_plan(serving):
        req = dict(request, budgets={"gpu": 0})
        return plan_mix(build_mix_problem(req, variants, profiles, serving=serving))

    plain = cpu_plan({"m": ServingPath((1.0,) * 10, 0.0, None)})
    slow = cpu_plan({"m": ServingPath((1.0,) * 10, 0.5, 2.0)})
    n_plain = sum(d.count for d in plain.deployments)
    n_slow = sum(d.count for d in slow.deployments)
    assert n_slow >= 2 * n_plain - 1
    (cap,) = [c for c in slow.extra["capacity"] if c["resource"] == "cpu:1"]
    assert cap["source"].startswith("queueing, served x2.")
    assert slow.predicted["p50_ms"] > 5.0 + 1.0  # served runs of ~5 ms, plus the 1 ms path
    assert not slow.predicted["overloaded"]
    problem = build_mix_problem(
        dict(request, budgets={"cpu": 0}),
        variants,
        profiles,
        serving={"m": ServingPath((1.0,) * 10, 0.5, 2.0)},
    )
    (gpu_opt,) = problem.families[0].options
    assert gpu_opt.capacity_source == "queueing"  # measured on CPU: the GPU keeps its profile
