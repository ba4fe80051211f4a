"""The llm planner: the queueing model on the profiled curve, the exact MILP against brute
force, infeasibility naming the closest tier, and the simulator agreeing with the model."""

from __future__ import annotations

import itertools
import math

import pytest
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.llm_profiles import llm_variant
from greenctl.planner.llm.model import capacity, operating_point, streams_law, tier_curve
from greenctl.planner.llm.request import LLMRequest
from greenctl.planner.llm.sim import SimTier, simulate
from greenctl.planner.llm.solve import (
    Allocation,
    build_problem,
    evaluate,
    objective_coefficients,
    plan_llm,
    solve,
)

from tests.planner.llm.rows import TIERS, quality, tier_rows


def curve(name: str = "llm-medium", pct: str = "p95", **kw):
    return tier_curve(tier_rows(name, **kw), quality=quality(name), percentile=pct)


def request(**kw) -> LLMRequest:
    doc = {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60, "budget": {"cpu": 4}}
    return LLMRequest.from_dict({**doc, **kw})


def problem(req: LLMRequest, tiers=tuple(TIERS), **kw):
    variants = [llm_variant(n, "llm", quality(n)) for n in tiers]
    rows = [r for n in tiers for r in tier_rows(n, **kw)]
    return build_problem(req, variants, rows)


# -- the model --------------------------------------------------------------------------------
def test_latency_and_concurrency_grow_with_the_rate() -> None:
    c = curve()
    ops = [operating_point(c, r, "p95") for r in (0.1, 0.5, 1.0, 2.0)]
    assert all(op is not None for op in ops)
    conc = [op.concurrency for op in ops]
    ttft = [op.ttft_ms for op in ops]
    assert conc == sorted(conc) and conc[0] < conc[-1]
    assert ttft == sorted(ttft) and ttft[0] < ttft[-1]
    # at no load an arrival finds no one: the p95 TTFT is the profile's at one stream
    assert operating_point(c, 1e-9, "p95").ttft_ms == pytest.approx(120 * 1.4, rel=1e-3)


def test_little_holds_on_a_flat_curve() -> None:
    """A curve that does not climb: streams are Poisson with mean rate x time (Little)."""
    flat = tier_curve(tier_rows("llm-medium", concurrencies=(1,)), quality=0.75, percentile="p95")
    hold_s = flat.request_ms(flat.points[0]) / 1000
    law = streams_law(flat, 0.5)
    mean = sum(k * p for k, p in law)
    assert mean == pytest.approx(0.5 * hold_s, rel=1e-6)
    assert law[0][1] == pytest.approx(math.exp(-0.5 * hold_s), rel=1e-6)


def test_capacity_meets_the_slo_and_is_monotonic() -> None:
    c = curve()
    caps = [capacity(c, ttft, 60, "p95") for ttft in (200, 300, 500, 800, 2000)]
    assert caps == sorted(caps) and caps[0] < caps[-1]
    for ttft, cap in zip((200, 300, 500, 800, 2000), caps, strict=True):
        op = operating_point(c, cap, "p95")
        assert op is not None and op.ttft_ms <= ttft * (1 + 1e-6) and op.tpot_ms <= 60
        beyond = operating_point(c, cap * 1.01, "p95")
        assert beyond is None or beyond.ttft_ms > ttft or beyond.tpot_ms > 60
    # a stricter percentile never carries more
    assert capacity(curve(pct="p99"), 800, 60, "p99") <= capacity(c, 800, 60, "p95")
    # an SLO missed at no load: no capacity
    assert capacity(c, 100, 60, "p95") == 0.0


def test_the_largest_profiled_concurrency_bounds_the_load() -> None:
    """A generous SLO: capacity stops where the p95 arrival would find more streams than
    were profiled (4), not where the SLO binds."""
    c = curve()
    cap = capacity(c, 1e6, 1e6, "p95")
    law = streams_law(c, cap)
    past = sum(p for k, p in law if k + 1 > c.max_concurrency)
    assert past == pytest.approx(0.05, abs=2e-3)
    assert operating_point(c, cap * 1.05, "p95") is None


def test_longer_prompts_slow_the_first_token_only() -> None:
    base = curve()
    longer = tier_curve(tier_rows("llm-medium"), quality=0.75, percentile="p95", prompt_tokens=128)
    assert longer.points[0].ttft_ms == pytest.approx(2 * base.points[0].ttft_ms)
    assert longer.points[0].tpot_ms == pytest.approx(base.points[0].tpot_ms)
    more_out = tier_curve(tier_rows("llm-medium"), quality=0.75, percentile="p95", output_tokens=32)
    assert more_out.request_ms(more_out.points[0]) > base.request_ms(base.points[0])
    assert capacity(more_out, 800, 60, "p95") < capacity(base, 800, 60, "p95")


# -- the MILP --------------------------------------------------------------------------------
def _brute(prob) -> float | None:
    """The least objective over every count vector, the rates of each by scipy's LP."""
    from scipy.optimize import linprog

    req = prob.request
    opts = prob.options
    per_n, per_r = objective_coefficients(prob)
    best = None
    for counts in itertools.product(*(range(o.max_count + 1) for o in opts)):
        used = {}
        for o, n in zip(opts, counts, strict=True):
            used[o.kind] = used.get(o.kind, 0) + n * o.amount
        if any(v > req.budget[k] + 1e-9 for k, v in used.items()):
            continue
        a_ub = []
        b_ub = []
        if req.min_quality is not None:
            a_ub.append([req.min_quality - o.quality for o in opts])
            b_ub.append(0.0)
        res = linprog(
            per_r,
            A_ub=a_ub or None,
            b_ub=b_ub or None,
            A_eq=[[1.0] * len(opts)],
            b_eq=[req.rate_rps],
            bounds=[(0, n * o.capacity_rps) for o, n in zip(opts, counts, strict=True)],
        )
        if res.status != 0:
            continue
        value = res.fun + sum(a * n for a, n in zip(per_n, counts, strict=True))
        best = value if best is None else min(best, value)
    return best


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"min_quality": 0.7},
        {"min_quality": 0.8, "rate_rps": 1.5},
        {"objective": "energy", "min_quality": 0.6},
        {"objective": "cost", "min_quality": 0.7},
        {"objective": "balanced", "carbon_intensity": 700},
        {"objective": "balanced", "carbon_intensity": 50, "budget": {"cpu": 5}},
        {"rate_rps": 6.0, "budget": {"cpu": 3}, "min_quality": 0.6},
    ],
)
def test_the_milp_matches_brute_force(kw) -> None:
    prob = problem(request(**kw))
    alloc = solve(prob)
    want = _brute(prob)
    assert alloc is not None and want is not None
    per_n, per_r = objective_coefficients(prob)
    got = sum(a * n for a, n in zip(per_n, alloc.counts, strict=True)) + sum(
        b * r for b, r in zip(per_r, alloc.rates, strict=True)
    )
    assert got == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert sum(alloc.rates) == pytest.approx(prob.request.rate_rps)
    for o, n, r in zip(prob.options, alloc.counts, alloc.rates, strict=True):
        assert r <= n * o.capacity_rps * (1 + 1e-7)


def test_the_plan_document() -> None:
    plan = plan_llm(problem(request(min_quality=0.7, carbon_intensity=300)))
    doc = plan.to_dict()
    assert doc["kind"] == "llm"
    shares = doc["llm"]["shares"]
    assert sum(shares.values()) == pytest.approx(1.0)
    assert doc["predicted"]["quality"] >= 0.7 - 1e-9
    assert doc["predicted"]["ttft_p95_ms"] <= 800 and doc["predicted"]["tpot_p95_ms"] <= 60
    assert doc["predicted"]["energy_method"] == "modeled"
    assert doc["predicted"]["objective_name"] == "carbon"
    assert doc["predicted"]["carbon_g_per_request"] == pytest.approx(
        doc["predicted"]["energy_j_per_request"] * 300 / 3.6e6
    )
    for d in doc["deployments"]:
        assert d["batch"] >= 1 and d["quota_rps"] > 0
        assert doc["llm"]["engines"][d["variant"]]["model"] == f"/models/{d['variant']}"
    assert {t["variant"] for t in doc["llm"]["tiers"]} == set(shares)


def test_a_higher_floor_costs_carbon() -> None:
    """Quality Time's trade: more quality, more energy per request."""
    low = evaluate_plan(problem(request(min_quality=0.6)))
    high = evaluate_plan(problem(request(min_quality=0.85)))
    assert high["quality"] > low["quality"]
    assert high["carbon_g_per_request"] > low["carbon_g_per_request"]


def test_balanced_shares_follow_the_carbon_signal() -> None:
    """A dirtier grid weighs carbon more: the balanced plan serves less quality."""
    clean = evaluate_plan(problem(request(objective="balanced", carbon_intensity=20, gamma=0.3)))
    dirty = evaluate_plan(problem(request(objective="balanced", carbon_intensity=900, gamma=0.3)))
    assert dirty["quality"] < clean["quality"]
    assert dirty["energy_j_per_request"] < clean["energy_j_per_request"]


def evaluate_plan(prob) -> dict:
    alloc = solve(prob)
    assert alloc is not None
    return evaluate(prob, alloc)["predicted"]


# -- infeasible ------------------------------------------------------------------------------
def test_slos_no_tier_meets_name_the_closest() -> None:
    with pytest.raises(InfeasiblePlan) as exc:
        plan_llm(problem(request(ttft_ms=60)))
    msg = exc.value.message
    assert "closest: llm-small on cpu:1" in msg and "p95 TTFT 70 ms (SLO 60)" in msg
    assert exc.value.exit_code == 3


def test_an_unreachable_floor_names_the_best_quality() -> None:
    with pytest.raises(InfeasiblePlan, match=r"best tier that meets them is llm-medium"):
        plan_llm(problem(request(ttft_ms=300, min_quality=0.8)))


def test_a_small_budget_names_what_it_serves() -> None:
    with pytest.raises(InfeasiblePlan, match=r"budget cpu=1 serves at most") as exc:
        plan_llm(problem(request(rate_rps=20, budget={"cpu": 1})))
    assert 0 < exc.value.servable_scale < 1


def test_tiers_without_energy_are_left_out_of_a_carbon_plan() -> None:
    variants = [llm_variant(n, "llm", quality(n)) for n in TIERS]
    rows = tier_rows("llm-small", energy=False) + tier_rows("llm-medium")
    prob = build_problem(request(), variants, rows)
    assert [o.variant for o in prob.options] == ["llm-medium"]
    assert "llm-small on cpu:1 has no energy figures" in prob.notes[0]
    cost = build_problem(request(objective="cost"), variants, rows)
    assert len(cost.options) == 2


def test_bad_requests_name_the_field() -> None:
    cases = {
        "rate_rps": ({"rate_rps": 0}, "rate_rps (--rate) must be > 0"),
        "ttft": ({"ttft_ms": "x"}, "ttft_ms (--ttft-ms) must be a number"),
        "pct": ({"percentile": "p90"}, "unknown percentile"),
        "quality": ({"min_quality": 1.5}, "min_quality (--min-quality) must be <= 1"),
        "budget": ({"budget": {"mig": 2}}, "budget mig: an llm plan budgets cpu cores or gpu GPUs"),
        "no budget": ({"budget": None}, "no budget given"),
        "objective": ({"objective": "accuracy"}, "unknown objective"),
        "tokens": ({"prompt_tokens": 0}, "prompt_tokens (--prompt-tokens) must be >= 1"),
        "field": ({"slo_ms": 3}, "unknown llm request field(s): slo_ms"),
        "ci": ({"carbon_intensity": -1}, "carbon_intensity"),
    }
    for name, (kw, text) in cases.items():
        with pytest.raises(InputError) as exc:
            request(**kw)
        assert text in exc.value.message, name


def test_the_request_round_trips() -> None:
    req = request(min_quality=0.7, prompt_tokens=100, objective="balanced")
    assert LLMRequest.from_dict(req.to_dict()) == req


# -- the simulator ---------------------------------------------------------------------------
@pytest.mark.parametrize("serial", [0.0, 0.5, 1.0])
def test_the_simulator_agrees_with_the_model(serial: float) -> None:
    """Below capacity the simulated p95 TTFT and TPOT are within 12 % of the model's; at
    capacity the model is the safe side (the simulated percentiles meet the SLOs)."""
    c = curve(serial=serial)
    cap = capacity(c, 800, 60, "p95")
    for frac in (0.3, 0.6):
        rate = cap * frac
        op = operating_point(c, rate, "p95")
        sim = simulate([SimTier(c, 2, 2 * rate)], "p95", duration_s=20_000 / rate, seed=3)
        assert sim.ttft_ms == pytest.approx(op.ttft_ms, rel=0.12), (frac, sim, op)
        assert sim.tpot_ms == pytest.approx(op.tpot_ms, rel=0.12), (frac, sim, op)
    sim = simulate([SimTier(c, 1, cap)], "p95", duration_s=20_000 / cap, seed=4, slo_ms=(800, 60))
    assert sim.ttft_ms <= 800 and sim.tpot_ms <= 60
    assert sim.slo_violation_frac is not None and sim.slo_violation_frac <= 0.05


def test_a_plan_checked_by_the_simulator() -> None:
    prob = problem(request(min_quality=0.7, rate_rps=4.0, budget={"cpu": 6}))
    alloc = solve(prob)
    tiers = [
        SimTier(o.curve, n, r)
        for o, n, r in zip(prob.options, alloc.counts, alloc.rates, strict=True)
        if n
    ]
    sim = simulate(tiers, "p95", duration_s=5000, seed=1, slo_ms=(800, 60))
    pred = evaluate(prob, alloc)["predicted"]
    assert sim.ttft_ms <= pred["ttft_p95_ms"] * 1.12
    assert sim.tpot_ms <= pred["tpot_p95_ms"] * 1.12
    assert sim.slo_violation_frac <= 0.05


def test_an_allocation_over_capacity_is_seen_by_the_simulator() -> None:
    c = curve()
    cap = capacity(c, 1e6, 1e6, "p95")
    sim = simulate([SimTier(c, 1, 3 * cap)], "p95", duration_s=2000, seed=0)
    assert sim.beyond > 0.05 and math.isinf(sim.ttft_ms)
    assert Allocation((1,), (1.0,)).counts == (1,)


def test_slo_misses_grow_with_the_load() -> None:
    from greenctl.planner.llm.model import slo_miss

    c = curve()
    assert slo_miss(c, 1e-9, 1e6, 1e6) == pytest.approx(0.0, abs=1e-9)
    # at no load the TTFT SLO at the profile's p95 at one stream: 5 % miss
    assert slo_miss(c, 1e-9, 120 * 1.4, 1e6) == pytest.approx(0.05, abs=1e-3)
    misses = [slo_miss(c, r, 800, 60) for r in (0.5, 1.5, 2.5, 4.0)]
    assert misses == sorted(misses) and misses[-1] > 0.05
