"""Benchmarks of ``greenctl plan mix``: InfAdapter's point, the 100-family scale case, one family.

Run: ``python bench/bench_mix.py [--quick] [--time-limit S]``.

(a) InfAdapter's point on the real ResNet CPU profiles (``bench/infadapter_import.py``):
    75 req/s, SLO 750 ms at p99, budgets of 8, 14 and 20 cores; the mixed plan (exact ILP,
    objective ``accuracy``) against the best single-variant plan (``--strategy single``) and
    the greedy baseline.
(b) Scale: a synthetic, seeded instance (documented in :func:`synthetic`) of 100 model
    families x 10 variants x 6 resource sizes (cpu:1/2/4/8, mig:1g.10gb, mig:3g.40gb) sharing
    a cpu and a mig budget; ilp (the default path: for the balanced objective the exact
    Lagrangian decomposition of ``planner/mix_decomp.py``, else the joint ILP) beside
    ilp-joint (the joint ILP alone, time-limited, greedy warm start: the old path) vs greedy
    vs single, with solve time, objective, the tighter proven bound of the two exact paths
    and each plan's gap to that bound.
(c) One family: the InfAdapter family and one synthetic family, median plan time.

All figures are wall-clock on this machine in this run; the machine's load average is
printed beside them because other jobs share its two cores.
"""

from __future__ import annotations

import argparse
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
from greenctl.planner import mix, mix_decomp
from greenctl.planner.mix import build_mix_problem, is_maximise, plan_mix

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
    """One plan; strategy ``ilp-joint`` is the ILP with the decomposition switched off."""
    joint = strategy == "ilp-joint"
    saved = mix.DECOMPOSITION
    mix.DECOMPOSITION = not joint
    t0 = time.perf_counter()
    try:
        plan = plan_mix(problem, strategy="ilp" if joint else strategy, time_limit_s=time_limit)
    except InfeasiblePlan as exc:
        return {"error": exc.message, "s": time.perf_counter() - t0}
    finally:
        mix.DECOMPOSITION = saved
    return {"plan": plan, "s": time.perf_counter() - t0}


def bench_infadapter(quick: bool) -> None:
    import infadapter_import as ia

    if not ia.SOURCE.exists():
        print(f"(a) skipped: {ia.SOURCE} not found")
        return
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


def bench_scale(quick: bool, time_limit: float) -> None:
    n_fam = 30 if quick else 100
    variants, profiles, fams = synthetic(n_fam)
    total = sum(f["rate_rps"] for f in fams)
    print(
        f"(b) scale: {n_fam} families x 10 variants x 6 sizes (synthetic, seed 0), "
        f"total {total:.0f} req/s, SLO 500 ms p99; ilp time limit {time_limit:g} s"
    )
    # budgets as fractions of what the fleet needs on cpu:8 / mig:3g.40gb for its fastest
    # variants x 12 (loose) and x 5 (tight): both bind for the most accurate variants.
    cases = [
        ("accuracy", {"cpu": round(total / 60 * 12), "mig": round(total / 60 * 2)}),
        ("balanced", {"cpu": round(total / 60 * 12), "mig": round(total / 60 * 2)}),
        ("accuracy", {"cpu": round(total / 60 * 5), "mig": round(total / 60 * 1)}),
        ("balanced", {}),
        # tight budgets under the balanced objective: the decomposition's hardest case here
        ("balanced", {"cpu": round(total / 60 * 5), "mig": round(total / 60 * 1)}),
    ]
    if quick:
        cases = cases[:2]
    print(
        f"{'objective':>9} {'budgets':>18} {'strategy':>9} {'status':>11} {'seconds':>8} "
        f"{'objective':>10} {'gap to bound':>16}  method"
    )
    for objective, budgets in cases:
        req = {"families": fams, "slo_ms": 500, "percentile": "p99", "objective": objective,
               "budgets": budgets}  # fmt: skip
        t0 = time.perf_counter()
        problem = build_mix_problem(req, variants, profiles)
        build_s = time.perf_counter() - t0
        results = {
            s: _run(problem, s, time_limit) for s in ("ilp", "ilp-joint", "greedy", "single")
        }
        # the tighter of the two exact paths' proven bounds
        bounds = [
            r["plan"].extra["solver"].get("objective_bound")
            for s, r in results.items()
            if s.startswith("ilp") and "plan" in r
        ]
        bounds = [b for b in bounds if b is not None]
        pick = min if is_maximise(objective) else max
        bound = pick(bounds) if bounds else None
        btxt = ",".join(f"{k}={v:g}" for k, v in budgets.items()) or "none"
        for strategy, r in results.items():
            if "error" in r:
                print(f"{objective:>9} {btxt:>18} {strategy:>9} {'infeasible':>11} {r['s']:>8.3f}")
                continue
            plan = r["plan"]
            value = plan.predicted["objective"]
            status = plan.extra["solver"]["status"]
            gap = "-"
            if bound is not None:
                diff = (bound - value) if is_maximise(objective) else (value - bound)
                gap = f"{max(diff, 0.0) / max(abs(bound), 1e-12) * 100:.3f} %"
            method = ""
            if strategy.startswith("ilp"):
                info = plan.extra["solver"]
                joint = not str(info.get("method", "")).startswith("decomposition")
                method = "joint ILP" if joint else "decomposition"
                if strategy == "ilp" and joint:
                    why = mix_decomp.LAST_FALLBACK.get("reason")
                    method += (
                        f" (decomposition gave up: {why})"
                        if why and mix_decomp.applicable(problem, single=False, solver="highs")
                        else " (decomposition not applicable)"
                    )
                own = info.get("gap")
                method += f", own proven gap {own:.2g}" if own is not None else ""
            print(
                f"{objective:>9} {btxt:>18} {strategy:>9} {status:>11} {r['s']:>8.3f} "
                f"{value:>10.5f} {gap:>16}  {method}"
            )
        ratio = ""
        if "plan" in results["ilp"] and "plan" in results["ilp-joint"]:
            ratio = (
                f", ilp-joint / ilp time = {results['ilp-joint']['s'] / results['ilp']['s']:.1f}x"
            )
        print(
            f"{'':>9} (problem build from records {build_s:.3f} s, best proven bound {bound}"
            f"{ratio})"
        )
    print()


def bench_one_family(quick: bool) -> None:
    import infadapter_import as ia

    reps = 3 if quick else 7
    print(f"(c) one family, median of {reps} runs (ilp, HiGHS)")
    cases = []
    if ia.SOURCE.exists():
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
    args = ap.parse_args(argv)
    limit = args.time_limit if args.time_limit is not None else (3.0 if args.quick else 10.0)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    bench_infadapter(args.quick)
    bench_one_family(args.quick)
    bench_scale(args.quick, limit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
