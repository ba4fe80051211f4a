"""Benchmarks of ``greenctl plan mix``: InfAdapter's point, the 100-family scale case, one family.

Run: ``python bench/bench_mix.py [--quick] [--time-limit S] [--single] [--scale-only]``.

(a) InfAdapter's point on the real ResNet CPU profiles (``bench/infadapter_import.py``):
    75 req/s, SLO 750 ms at p99, budgets of 8, 14 and 20 cores; the mixed plan (exact ILP,
    objective ``accuracy``) against the best single-variant plan (``--strategy single``) and
    the greedy baseline.
(b0) Problem build at that scale: load-tested service times in closed form, cold and warm
    caches, against the search they replace on the first families, with how far the
    options' energy terms moved; the fleet from plain latency rows, its options sized in
    one vectorised search per family against one search per option.
(b) Scale: a synthetic, seeded instance (documented in :func:`synthetic`) of 100 model
    families x 10 variants x 6 resource sizes (cpu:1/2/4/8, mig:1g.10gb, mig:3g.40gb) sharing
    a cpu and a mig budget, per objective and budget regime (balanced generous and tight,
    accuracy generous and tight, cost and carbon with --min-accuracy 0.7, balanced without
    budgets): ilp (the default path: the exact Lagrangian decomposition of
    ``planner/mix/decomp.py`` where it applies, else the joint ILP; the LP relaxation first)
    beside ilp-nolp (the same without the LP relaxation first), ilp-joint (the joint ILP
    alone, time-limited, greedy warm start) and greedy (``--single``: the single-variant
    baseline too), with wall and CPU seconds, when the optimum was proven, objective, each
    plan's own proven gap and its gap to the tighter proven bound of the exact paths, the
    load average; then a summary per objective.
(c) One family: the InfAdapter family and one synthetic family, median plan time.

All figures are wall-clock on this machine in this run; the machine's load average is
printed beside them because other jobs share its two cores.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from greenctl.data.errors import InfeasiblePlan
from greenctl.data.records import Profile, Variant
from greenctl.planner.core import queueing, service
from greenctl.planner.mix import budget as mix_budget
from greenctl.planner.mix import decomp as mix_decomp
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix import problem as mix_problem
from greenctl.planner.mix import solve as mix
from greenctl.planner.mix.request import MixRequest
from greenctl.planner.mix.solve import build_mix_problem, is_maximise, plan_mix

#: (label, capacity multiplier vs one core, price USD/h, busy power W) of the 6 sizes.
RESOURCES = [
    ("cpu:1", 1.0, 0.04, 10.0),
    ("cpu:2", 1.9, 0.08, 20.0),
    ("cpu:4", 3.6, 0.16, 40.0),
    ("cpu:8", 6.6, 0.32, 80.0),
    ("mig:1g.10gb", 9.0, 0.50, 60.0),
    ("mig:3g.40gb", 24.0, 1.50, 170.0),
]


def synthetic(
    families: int = 100, variants: int = 10, seed: int = 0
) -> tuple[list[Variant], list[Profile], list[dict[str, Any]]]:
    """A seeded synthetic fleet (labelled ``synthetic`` in every record).

    Per family: a rate uniform in [20, 200] req/s; ``variants`` accuracies uniform in
    [0.60, 0.85] (sorted), each variant 1.45x slower than the previous one from a base of
    60 req/s per core (x U(0.7, 1.3) per family); load times 2 s + U(0.5, 1) s per rank.
    Per size: load-tested capacity at 500 ms = speed x the size's multiplier x U(0.9, 1.1),
    throughput 1.15x that, a p99 latency of 1.5..2.5x the service time, the size's price
    and power, energy per request = power / throughput.
    """
    rng = random.Random(seed)
    vs: list[Variant] = []
    ps: list[Profile] = []
    fams = []
    for f in range(families):
        name = f"fam{f:03d}"
        fams.append({"model": name, "rate_rps": round(rng.uniform(20, 200), 1)})
        accs = sorted(rng.uniform(0.6, 0.85) for _ in range(variants))
        base = 60.0 * rng.uniform(0.7, 1.3)
        for i in range(variants):
            vname = f"{name}_v{i}"
            vs.append(
                Variant(
                    vname,
                    name,
                    accuracy=round(accs[i], 5),
                    load_time_s=round(2 + i * rng.uniform(0.5, 1.0), 2),
                    source="synthetic",
                )
            )
            speed = base / (1.45**i)
            for label, mult, price, power in RESOURCES:
                cap = speed * mult * rng.uniform(0.9, 1.1)
                ps.append(
                    Profile(
                        variant=vname,
                        resource=label,
                        batch=1,
                        throughput_rps=round(cap * 1.15, 3),
                        latency_p99_ms=round(
                            1000.0 / (speed * min(mult, 4)) * rng.uniform(1.5, 2.5), 2
                        ),
                        capacity_rps=round(cap, 3),
                        capacity_slo_ms=500.0,
                        cost_per_hour=price,
                        power_w=power,
                        energy_j=round(power / (cap * 1.15), 5),
                        energy_method="synthetic",
                        source="synthetic",
                    )
                )
    return vs, ps, fams


def _run(problem: Any, strategy: str, time_limit: float | None) -> dict[str, Any]:
    """One plan, its wall and CPU seconds; ``ilp-joint`` is the ILP with the decomposition
    switched off, ``ilp-nolp`` the default path without the LP relaxation first
    (``model.LP_FIRST``: no rounded-LP proof, no reduced-cost bounds on the tie-break)."""
    saved = mix.DECOMPOSITION, mix_model.LP_FIRST
    mix.DECOMPOSITION = strategy != "ilp-joint"
    mix_model.LP_FIRST = strategy != "ilp-nolp"
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        plan = plan_mix(
            problem, strategy="ilp" if strategy.startswith("ilp") else strategy,
            time_limit_s=time_limit,
        )  # fmt: skip
    except InfeasiblePlan as exc:
        return {"error": exc.message, "s": time.perf_counter() - t0}
    finally:
        mix.DECOMPOSITION, mix_model.LP_FIRST = saved
    return {"plan": plan, "s": time.perf_counter() - t0, "cpu": time.process_time() - c0}


def bench_infadapter(quick: bool) -> None:
    import infadapter_import as ia

    variants, profiles = ia.to_records(ia.convert_rows())
    print("(a) InfAdapter point: ResNet 18..152 real CPU profiles, 75 req/s, SLO 750 ms p99")
    print(f"{'cores':>5} {'strategy':>8} {'accuracy':>9} {'cores used':>10} {'ms':>8}  deployments")
    for cores in (8, 14, 20):
        req = {
            "model": "resnet",
            "rate_rps": 75,
            "slo_ms": 750,
            "percentile": "p99",
            "budgets": {"cpu": cores},
            "objective": "accuracy",
        }
        problem = build_mix_problem(req, variants, profiles)
        rows = {}
        for strategy in ("ilp", "single", "greedy"):
            r = _run(problem, strategy, None)
            rows[strategy] = r
            if "error" in r:
                print(f"{cores:>5} {strategy:>8} infeasible: {r['error']}")
                continue
            plan = r["plan"]
            used = sum(int(d.resource[4:]) * d.count for d in plan.deployments)
            deps = ", ".join(
                f"{d.count}x{d.variant}@{d.resource}:{d.quota_rps:.0f}rps" for d in plan.deployments
            )
            print(
                f"{cores:>5} {strategy:>8} {plan.predicted['accuracy']:>9.5f} {used:>10} "
                f"{r['s'] * 1000:>8.1f}  {deps}"
            )
        if "plan" in rows["ilp"] and "plan" in rows["single"]:
            gain = (
                rows["ilp"]["plan"].predicted["accuracy"]
                - rows["single"]["plan"].predicted["accuracy"]
            )
            print(f"{'':>5} mixed - best single = {gain * 100:+.3f} accuracy points")
    print()


def _describe(strategy: str, plan: Any, problem: Any) -> str:
    """How an ilp plan was solved: the path, the reason for a fallback, the tie-break."""
    if not strategy.startswith("ilp"):
        return ""
    info = plan.extra["solver"]
    joint = not str(info.get("method", "")).startswith("decomposition")
    text = "joint ILP" if joint else "decomposition"
    if strategy == "ilp" and joint:
        why = info.get("decomposition_fallback")
        text += (
            f" (decomposition gave up: {why})"
            if why and mix_decomp.applicable(problem, single=False, solver="highs")
            else " (decomposition not applicable)"
        )
    if info.get("proof"):
        text += f" ({info['proof']})"
    if info.get("bound_source"):
        text += f", bound from the {info['bound_source']}"
    tb = info.get("tie_break")
    if tb:
        text += f", tie-break {tb.get('objective')}: {_tie_break(tb)}"
    return text


def _tie_break(tb: dict[str, Any]) -> str:
    """The tie-break's status and the budget it had (what was left of the planning budget,
    ``budget.PLANNING_BUDGET_S``, once the optimum was proven)."""
    budget = tb.get("budget_s")
    return f"{tb.get('status')}" + (f" ({budget:.2f} s)" if budget is not None else "")


def _timed_build(req: dict[str, Any], variants: Any, profiles: Any) -> tuple[Any, float, float]:
    """A build of ``req``'s problem, its wall and CPU seconds."""
    t0, c0 = time.perf_counter(), time.process_time()
    problem = build_mix_problem(req, variants, profiles)
    return problem, time.perf_counter() - t0, time.process_time() - c0


def _cold() -> None:
    """Empty the caches a build fills: the load tests' service times, capacities (not the
    per-quantile table of the closed form, a few ms once per process)."""
    service.load_test_service_ms.cache_clear()
    queueing.capacity_at_slo.cache_clear()


def bench_build(quick: bool) -> None:
    """Problem build at scale: the closed-form service times of load tests (cold and warm
    caches) against the search they replace (``service.searched_service_ms``, Brent's
    method on ``capacity_at_slo``), on a prefix of the families (that path takes ~0.3 s
    per family), with the largest relative difference in the options' energy terms."""
    n_fam, n_search = (30, 3) if quick else (100, 10)
    variants, profiles, fams = synthetic(n_fam)
    total = sum(f["rate_rps"] for f in fams)
    budgets = {"cpu": round(total / 60 * 12), "mig": round(total / 60 * 2)}
    req = {"families": fams, "slo_ms": 500, "percentile": "p99", "budgets": budgets}
    print(f"(b0) problem build: {n_fam} families x 10 variants x 6 sizes, load-tested rows")
    _cold()
    _, cold_s, cold_cpu = _timed_build(req, variants, profiles)
    print(f"  closed form, cold caches: {cold_s:.3f} s ({cold_cpu:.2f} CPU s), load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    _, warm_s, warm_cpu = _timed_build(req, variants, profiles)
    print(f"  closed form, warm caches: {warm_s:.3f} s ({warm_cpu:.2f} CPU s), load "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    sub = {**req, "families": fams[:n_search]}
    _cold()
    closed, sub_s, sub_cpu = _timed_build(sub, variants, profiles)
    saved = service.load_test_service_ms
    service.load_test_service_ms = functools.cache(service.searched_service_ms)
    try:
        _cold()
        searched, search_s, search_cpu = _timed_build(sub, variants, profiles)
    finally:
        service.load_test_service_ms = saved
    diff = max(
        (abs(a.energy_j_per_request - b.energy_j_per_request) / abs(b.energy_j_per_request)
         for fa, fb in zip(closed.families, searched.families, strict=True)
         for a, b in zip(fa.options, fb.options, strict=True)
         if a.energy_j_per_request and b.energy_j_per_request),
        default=0.0,
    )  # fmt: skip
    per = search_s / n_search
    print(
        f"  search (the path replaced), first {n_search} families: {search_s:.3f} s "
        f"({search_cpu:.2f} CPU s; {per:.3f} s per family, ~{per * n_fam:.1f} s for "
        f"{n_fam}), load {os.getloadavg()[0]:.1f}\n"
        f"  closed form on the same {n_search}, cold: {sub_s:.3f} s ({sub_cpu:.2f} CPU s): "
        f"{search_s / sub_s:.0f}x faster in wall, {search_cpu / max(sub_cpu, 1e-9):.0f}x in "
        f"CPU; energy terms differ by at most {diff:.2g} (relative)"
    )
    _bench_latency_rows(req, variants, profiles, n_fam)
    print()


def _bench_latency_rows(req: dict[str, Any], variants: Any, profiles: Any, n_fam: int) -> None:
    """The same fleet from plain latency rows (no load test: p50 = p99 / 2, p95 = 0.8 p99):
    every family's options sized in one vectorised capacity search against one search per
    option (``problem.latency_capacities`` switched off), capacity caches emptied before
    each (the latency fits stay cached for the second: the ratio errs low)."""
    plain = [
        dataclasses.replace(
            p, capacity_rps=None, capacity_slo_ms=None,
            latency_p50_ms=p.latency_p99_ms / 2, latency_p95_ms=p.latency_p99_ms * 0.8,
        )
        for p in profiles
    ]  # fmt: skip
    queueing.capacity_at_slo.cache_clear()
    batched, b_s, b_cpu = _timed_build(req, variants, plain)
    saved = mix_problem.latency_capacities
    mix_problem.latency_capacities = lambda *a, **k: {}
    try:
        queueing.capacity_at_slo.cache_clear()
        single, s_s, s_cpu = _timed_build(req, variants, plain)
    finally:
        mix_problem.latency_capacities = saved
    same = [o.capacity_rps for f in batched.families for o in f.options] == [
        o.capacity_rps for f in single.families for o in f.options
    ]
    print(
        f"  plain latency rows, {n_fam} families: one search per option {s_s:.3f} s "
        f"({s_cpu:.2f} CPU s), vectorised {b_s:.3f} s ({b_cpu:.2f} CPU s): "
        f"{s_cpu / max(b_cpu, 1e-9):.1f}x in CPU; capacities {'identical' if same else 'DIFFER'}"
        f", load {os.getloadavg()[0]:.1f}"
    )


def bench_scale(quick: bool, time_limit: float, with_single: bool = False) -> None:
    n_fam = 30 if quick else 100
    variants, profiles, fams = synthetic(n_fam)
    total = sum(f["rate_rps"] for f in fams)
    print(
        f"(b) scale: {n_fam} families x 10 variants x 6 sizes (synthetic, seed 0), "
        f"total {total:.0f} req/s, SLO 500 ms p99; time limit {time_limit:g} s per plan"
    )
    print(
        "    ilp = the default path (the exact decomposition of planner/mix/decomp.py where it "
        "applies), ilp-joint = the joint ILP alone (greedy warm start: the old path).\n"
        "    proven = when the optimum was proven (before a tie-break); gap = the plan's own "
        "proven gap; to best = its gap to the tighter proven bound of the two exact paths."
    )
    # budgets as fractions of what the fleet needs on cpu:8 / mig:3g.40gb for its fastest
    # variants x 12 (generous) and x 5 (tight): both bind for the most accurate variants.
    generous = {"cpu": round(total / 60 * 12), "mig": round(total / 60 * 2)}
    tight = {"cpu": round(total / 60 * 5), "mig": round(total / 60 * 1)}
    cases: list[tuple[str, str, dict[str, int], float | None]] = [
        ("balanced, generous", "balanced", generous, None),
        ("balanced, tight", "balanced", tight, None),
        ("accuracy, generous", "accuracy", generous, None),
        ("accuracy, tight", "accuracy", tight, None),
        ("cost, min-acc 0.7", "cost", generous, 0.7),
        ("carbon, min-acc 0.7", "carbon", generous, 0.7),
        ("balanced, no budgets", "balanced", {}, None),
    ]
    if quick:
        cases = cases[:3]
    strategies: tuple[str, ...] = ("ilp", "ilp-nolp", "ilp-joint", "greedy")
    if quick:
        strategies = ("ilp", "ilp-nolp", "ilp-joint")
    if with_single:
        strategies = (*strategies, "single")
    print(
        f"{'case':>20} {'strategy':>9} {'status':>11} {'seconds':>8} {'cpu s':>6} {'proven':>7} "
        f"{'objective':>12} {'gap':>9} {'to best':>9} {'load':>5}  method"
    )
    ratios = []
    summary = []
    built: dict[frozenset[str], Any] = {}
    for label, objective, budgets, floor in cases:
        req: dict[str, Any] = {"families": fams, "slo_ms": 500, "percentile": "p99",
                               "objective": objective, "budgets": budgets}  # fmt: skip
        if floor is not None:
            req["min_accuracy"] = floor
        problem, build_s = _problem(req, variants, profiles, built)
        _run(problem, "ilp", time_limit)  # warm-up: the evaluation core's caches, imports
        results = {}
        for s in strategies:
            results[s] = _run(problem, s, time_limit)
            results[s]["load"] = os.getloadavg()[0]
            results[s]["describe"] = (
                _describe(s, results[s]["plan"], problem) if "plan" in results[s] else ""
            )
        # the tighter of the two exact paths' proven bounds
        bounds = [
            r["plan"].extra["solver"].get("objective_bound")
            for s, r in results.items()
            if s.startswith("ilp") and "plan" in r
        ]
        bounds = [b for b in bounds if b is not None]
        pick = min if is_maximise(objective) else max
        bound = pick(bounds) if bounds else None
        for strategy, r in results.items():
            if "error" in r:
                print(f"{label:>20} {strategy:>9} {'infeasible':>11} {r['s']:>8.3f}")
                continue
            plan = r["plan"]
            info = plan.extra["solver"]
            value = plan.predicted["objective"]
            to_best = "-"
            if bound is not None:
                diff = (bound - value) if is_maximise(objective) else (value - bound)
                to_best = f"{max(diff, 0.0) / max(abs(bound), 1e-12) * 100:.4f}%"
            own = info.get("gap")
            gap = f"{own * 100:.4f}%" if own is not None else "-"
            proven = info.get("proven_s")
            if proven is None and info.get("status") == "optimal" and strategy.startswith("ilp"):
                proven = r["s"]
            ptxt = f"{proven:.3f}" if proven is not None else "-"
            print(
                f"{label:>20} {strategy:>9} {info.get('status', '-'):>11} {r['s']:>8.3f} "
                f"{r['cpu']:>6.2f} {ptxt:>7} {value:>12.6g} {gap:>9} {to_best:>9} "
                f"{r['load']:>5.1f}  {r['describe']}"
            )
        if "plan" in results["ilp"] and "plan" in results["ilp-joint"]:
            ratio = results["ilp-joint"]["s"] / results["ilp"]["s"]
            ratios.append((label, ratio))
            print(
                f"{'':>20} ilp-joint / ilp time = {ratio:.1f}x (problem build "
                f"{'reused' if build_s is None else f'{build_s:.3f} s'}, "
                f"best proven bound {bound:.6g})"
                if bound is not None
                else f"{'':>20} ilp-joint / ilp time = {ratio:.1f}x"
            )
        summary.append((label, results, bound, objective))
    _summary(summary)
    print()


def _summary(rows: list[tuple[str, dict[str, Any], float | None, str]]) -> None:
    """Per case: the default path's wall and CPU seconds, when its optimum was proven,
    whether its plan meets the best proven bound (optimal: gap 0 to it), its tie-break's
    status and budget, and its time against the joint ILP's and against itself without the
    LP relaxation first."""
    print(
        "\n    summary: ilp (the default path); optimal = its plan meets the best proven bound "
        "of the exact paths within the gap tolerance; the tie-break gets what is left of a "
        f"{mix_budget.PLANNING_BUDGET_S:g} s planning budget once the optimum is proven (at "
        f"least {mix_budget.TIE_BREAK_MIN_S:g} s) and keeps its best plan when it stops there"
    )
    print(
        f"{'case':>20} {'wall s':>7} {'cpu s':>6} {'proven':>6} {'<= 1 s':>6} {'optimal':>7} "
        f"{'tie-break (its budget)':>30} {'joint/ilp':>9} {'nolp/ilp':>8}"
    )
    for label, results, bound, objective in rows:
        r = results.get("ilp", {})
        if "plan" not in r:
            print(f"{label:>20} {'-':>7}  {r.get('error', '')}")
            continue
        info = r["plan"].extra["solver"]
        value = r["plan"].predicted["objective"]
        ok = info.get("status") == "optimal"
        if bound is not None:
            diff = (bound - value) if is_maximise(objective) else (value - bound)
            ok = ok and diff <= mix.MIP_REL_GAP * max(abs(bound), 1e-12)
        tb = _tie_break(info["tie_break"]) if info.get("tie_break") else "-"
        proven = info.get("proven_s")
        ptxt = f"{proven:.3f}" if proven is not None else "-"
        print(
            f"{label:>20} {r['s']:>7.3f} {r['cpu']:>6.2f} {ptxt:>6} "
            f"{'yes' if r['s'] <= 1.0 else 'no':>6} {'yes' if ok else 'no':>7} {tb[:30]:>30} "
            f"{_ratio(results, 'ilp-joint'):>9} {_ratio(results, 'ilp-nolp'):>8}"
        )


def _problem(
    req: dict[str, Any], variants: Any, profiles: Any, built: dict[frozenset[str], Any]
) -> tuple[Any, float | None]:
    """The case's problem and its build seconds (None: reused). Options depend on the
    budgets' keys, not on their amounts, the objective or the floor (usage per instance,
    energy at the family's rate, dominance), so one build per key set serves every case
    with those keys, retargeted (each build of 100 families re-derives ~6,000 load-test
    service times)."""
    key = frozenset(req["budgets"])
    if key not in built:
        t0 = time.perf_counter()
        built[key] = build_mix_problem(req, variants, profiles)
        return built[key], time.perf_counter() - t0
    canon = MixRequest.from_dict(req).to_dict()
    problem = copy.copy(built[key])
    problem.families = [copy.copy(f) for f in problem.families]
    for fam, want in zip(problem.families, canon["families"], strict=True):
        fam.min_accuracy = want.get("min_accuracy", canon.get("min_accuracy"))
    problem.objective, problem.budgets, problem.request = (
        canon["objective"], canon["budgets"], canon
    )  # fmt: skip
    problem.notes = list(problem.notes)
    return problem, None


def _ratio(results: dict[str, Any], other: str) -> str:
    """``other``'s wall time over the default path's, in one run."""
    o, r = results.get(other, {}), results["ilp"]
    return f"{o['s'] / r['s']:.1f}x" if "plan" in o else "-"


def bench_one_family(quick: bool) -> None:
    import infadapter_import as ia

    reps = 3 if quick else 7
    print(f"(c) one family, median of {reps} runs (ilp, HiGHS)")
    cases = []
    v, p = ia.to_records(ia.convert_rows())
    cases.append(
        (
            "resnet (InfAdapter), 75 req/s, cpu=14, balanced",
            build_mix_problem(
                {
                    "model": "resnet",
                    "rate_rps": 75,
                    "slo_ms": 750,
                    "percentile": "p99",
                    "budgets": {"cpu": 14},
                },
                v,
                p,
            ),
        )
    )
    v, p, fams = synthetic(1)
    cases.append(
        (
            f"synthetic family, {fams[0]['rate_rps']} req/s, cpu=24 mig=4, balanced",
            build_mix_problem(
                {
                    "families": fams,
                    "slo_ms": 500,
                    "percentile": "p99",
                    "budgets": {"cpu": 24, "mig": 4},
                },
                v,
                p,
            ),
        )
    )
    for label, problem in cases:
        times = []
        status = None
        for _ in range(reps):
            t0 = time.perf_counter()
            plan = plan_mix(problem)
            times.append(time.perf_counter() - t0)
            status = plan.extra["solver"]["status"]
        print(f"  {label}: {statistics.median(times) * 1000:.1f} ms ({status})")
    print()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="plan mix benchmarks")
    ap.add_argument("--quick", action="store_true", help="30 families, fewer cases and repeats")
    ap.add_argument("--time-limit", type=float, default=None, help="ILP time limit (s)")
    ap.add_argument("--single", action="store_true", help="also the single-variant baseline")
    ap.add_argument("--scale-only", action="store_true", help="only (b), the 100 families")
    args = ap.parse_args(argv)
    limit = args.time_limit if args.time_limit is not None else (3.0 if args.quick else 10.0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    if not args.scale_only:
        bench_infadapter(args.quick)
        bench_one_family(args.quick)
    bench_build(args.quick)
    bench_scale(args.quick, limit, args.single)
    return 0


if __name__ == "__main__":
    sys.exit(main())
