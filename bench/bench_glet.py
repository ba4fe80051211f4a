"""Benchmark `plan glet` on the gpulet reference measurements.

1. Interference model: fit on the imported co-location measurements, held-out error.
2. Schedulability (gpulet's experiment): every combination of rates in {0, 100, 200} req/s
   over k reference models (3^k - 1 scenarios): which algorithms schedule it within 4 GPUs,
   and the largest rate scale each one can schedule (binary search), relative to `ideal`.
   `glet-core` is gpulet's elastic partitioning alone (gpulet's order, knee partition,
   worst-case co-runner sizing, no portfolio, no consolidation), to show what the rest adds.
3. Scheduling time per decision: 10 models on 8 GPUs, and fleets of 30 x 24 and 100 x 64
   (synthetic models, each a reference model's profiles under its own name).
4. A glet replan's decision time: `replan` of a 10-model glet plan as its rates
   move (a random walk, +-30 % per round): the whole round (lock, store, rewrite, plan, score
   the running layout, gpulet's rule, decision record) against the schedule alone, and how
   often the rule acts and how many glets move.

5. With ``--gap`` (instead of 2-4): glet's gain over sbp and greedy as the workload moves
   towards gpulet's (interference off, tight SLOs, more models), and how much splitting a
   GPU adds by itself on these profiles (docs/interference.md).

Run: python bench/bench_glet.py [--k 3] [--quick] [--gap | --timing] [--data DIR]
SLOs (ms) are a fixed choice per model, between 2.5x and 6x the batch-1 latency on a
whole GPU; rates are packed at the Poisson 99th percentile of arrivals per duty cycle.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from greenctl.data.bundled import path_of, resolve
from greenctl.data.gpulet_import import (
    import_gpulet,
    load_colocations,
    load_latency_table,
    load_solo_latency,
    load_utilisation,
)
from greenctl.data.store import open_store
from greenctl.planner.core.interference import InterferenceModel, build_samples, fit_interference
from greenctl.planner.glet.solve import Compiled, GletModel, GletProblem, run_elastic, schedule

DATA = path_of("gpulet")
SLO_MS = {
    "resnet50": 25,
    "vgg16": 30,
    "inception": 30,
    "densenet121": 40,
    "mobilenet": 20,
    "resnet101": 40,
    "vgg19": 30,
    "densenet169": 50,
    "resnet152": 50,
    "densenet201": 60,
}
ORDER = list(SLO_MS)  # the first k models are used
ALGOS = ("ideal", "glet", "glet-core", "sbp", "greedy")


IDEAL_CALLS = {"calls": 0, "exhaustive": 0}


def run(c: Compiled, algo: str, max_gpus: int) -> int | None:
    if algo == "glet-core":
        s = run_elastic(c, max_gpus, order="rate_slo_asc", knee=True, assume="worst")
    else:
        s = schedule(c, algo, max_gpus)
    if algo == "ideal":
        IDEAL_CALLS["calls"] += 1
        IDEAL_CALLS["exhaustive"] += int(bool(c.ideal_exhaustive))
    return None if s is None else s.used_gpus


def max_scale(make, algo: str, max_gpus: int, lo: float, rel_tol: float) -> float:
    """Largest rate scale the algorithm schedules within max_gpus (lo is known feasible)."""
    hi = max(lo * 2, 1.0)
    while run(make(hi), algo, max_gpus) is not None:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return lo
    while hi - lo > rel_tol * max(lo, 1e-3):
        mid = (lo + hi) / 2
        if run(make(mid), algo, max_gpus) is not None:
            lo = mid
        else:
            hi = mid
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--k", type=int, default=None, help="models in the schedulability sweep (default 3)"
    )
    ap.add_argument("--quick", action="store_true", help="k=2, fewer timing decisions")
    ap.add_argument(
        "--data", type=resolve, default=DATA, help="gpulet data folder (default bundled:gpulet)"
    )
    ap.add_argument("--max-gpus", type=int, default=4)
    ap.add_argument(
        "--rate-unit", type=float, default=100.0, help="rates are {0, 1, 2} x this (req/s)"
    )
    ap.add_argument("--tol", type=float, default=0.02, help="relative tolerance of the search")
    ap.add_argument(
        "--gap",
        action="store_true",
        help="only the study of glet's gain over sbp and greedy (docs/interference.md)",
    )
    ap.add_argument(
        "--gpulet-form",
        action="store_true",
        help="plan with gpulet's five-coefficient model (least squares on every measurement) "
        "instead of the fitted per-point one",
    )
    ap.add_argument(
        "--timing", action="store_true", help="only the decision times at each size (section 3)"
    )
    args = ap.parse_args()
    k = args.k or (2 if args.quick else 3)
    if not args.data.is_dir():
        sys.exit(f"gpulet reference data not found at {args.data} (pass --data DIR)")

    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "bench.db")
        t0 = time.perf_counter()
        summary = import_gpulet(store, args.data)
        t_import = time.perf_counter() - t0
        fit = fit_interference(
            load_colocations(store), load_solo_latency(store), load_utilisation(store)
        )
        imodel = gpulet_form(store) if args.gpulet_form else fit.model
        latency = load_latency_table(store, ORDER)
        util = load_utilisation(store)
        store.close()

    print("== gpulet reference import ==")
    print(
        f"{summary.profiles} profiles, {summary.utilisations} utilisations, "
        f"{summary.colocations} co-locations imported in {t_import:.2f} s"
    )
    e = fit.errors
    print("\n== interference model (held-out latency error, measured data) ==")
    print(
        "coefficients c1..c5 (L2_self, L2_other, DRAM_self, DRAM_other, 1): "
        + ", ".join(f"{c:+.3f}" for c in fit.model.linear)
        + f"; {fit.model.n_points} measured points with their own self term"
    )
    print(
        f"train {fit.n_train}, held out {fit.n_test}; measured slowdown factor mean "
        f"{fit.measured_factor['mean']:.3f}, p90 {fit.measured_factor['p90']:.3f}"
    )
    print(
        f"error p50 {e['p50']:.2%}  p90 {e['p90']:.2%}  p95 {e['p95']:.2%}  max {e['max']:.2%}"
        f"  mean {e['mean']:.2%}"
    )
    print(
        f"share within 10.26 %: {e['within_gpulet_10_26pct']:.1%} (gpulet reports 90 %); "
        f"ignoring interference: {e['no_model_within_gpulet_10_26pct']:.1%}, "
        f"p90 {e['no_model_p90']:.2%}; gpulet's 5-coefficient form on the same split: "
        f"{e['linear_within_gpulet_10_26pct']:.1%}"
    )
    if args.gpulet_form:
        print(
            "planned below with gpulet's five-coefficient form (least squares, all data): "
            + ", ".join(f"{c:+.3f}" for c in imodel.linear)
        )
    if args.gap:
        gap_study(latency, util, imodel, k=k, max_gpus=args.max_gpus, unit=args.rate_unit)
        return
    if args.timing:
        decision_times(latency, util, imodel, quick=args.quick)
        return

    models = ORDER[:k]

    def problem(rates: dict[str, float], scale: float = 1.0, max_gpus: int = 8) -> Compiled:
        return Compiled(
            GletProblem(
                models=[GletModel(m, r * scale, SLO_MS[m]) for m, r in rates.items() if r > 0],
                latency_ms=latency,
                max_gpus=max_gpus,
                interference=imodel,
                utilisation=util,
            )
        )

    scenarios = [
        dict(zip(models, combo, strict=True))
        for combo in itertools.product((0, args.rate_unit, 2 * args.rate_unit), repeat=k)
        if any(combo)
    ]
    print(
        f"\n== schedulability (modeled: measured profiles, fitted interference): "
        f"{len(scenarios)} scenarios (3^{k} - 1), rates in "
        f"{{0, {args.rate_unit:g}, {2 * args.rate_unit:g}}} req/s over {', '.join(models)}"
        f", within {args.max_gpus} GPUs =="
    )
    t0 = time.perf_counter()
    ok = dict.fromkeys(ALGOS, 0)
    ratio: dict[str, list[float]] = {a: [] for a in ALGOS if a != "ideal"}
    gpus_sum = dict.fromkeys(ALGOS, 0)
    worse = dict.fromkeys(ALGOS, 0)
    for n_done, rates in enumerate(scenarios, start=1):
        if n_done % 10 == 0:
            print(f"  ... {n_done}/{len(scenarios)} scenarios", file=sys.stderr, flush=True)
        base = problem(rates, max_gpus=args.max_gpus)
        got = {a: run(base, a, args.max_gpus) for a in ALGOS}
        for a in ALGOS:
            if got[a] is not None:
                ok[a] += 1
                gpus_sum[a] += got[a]
                if got["ideal"] is not None and got[a] > got["ideal"]:
                    worse[a] += 1

        def make(s: float, rates: dict[str, float] = rates) -> Compiled:
            return problem(rates, s, args.max_gpus)

        scales = {}
        for a in ("sbp", "greedy", "glet-core", "glet"):
            scales[a] = max_scale(make, a, args.max_gpus, 0.0, args.tol)
        scales["ideal"] = max_scale(make, "ideal", args.max_gpus, scales["glet"], args.tol)
        for a in ratio:
            ratio[a].append(scales[a] / scales["ideal"] if scales["ideal"] > 0 else 1.0)
    sweep_s = time.perf_counter() - t0
    n = len(scenarios)
    print(
        f"{'algorithm':<10} {'scheduled':>10} {'not':>5} {'GPUs>ideal':>11} "
        f"{'mean GPUs':>10} {'max rate / ideal':>17} {'min':>6}"
    )
    for a in ALGOS:
        mean_gpus = gpus_sum[a] / ok[a] if ok[a] else float("nan")
        r = ratio.get(a)
        rr = f"{statistics.mean(r):>16.1%}" if r else f"{'(100%)':>16}"
        rmin = f"{min(r):>6.1%}" if r else f"{'':>6}"
        print(f"{a:<10} {ok[a]:>10} {n - ok[a]:>5} {worse[a]:>11} {mean_gpus:>10.2f} {rr} {rmin}")
    print(
        f"(gpulet paper: glet schedules 2.6 % fewer scenarios than ideal and reaches 92.6 % "
        f"of ideal's rate; sweep took {sweep_s:.1f} s; ideal search exhaustive in "
        f"{IDEAL_CALLS['exhaustive']}/{IDEAL_CALLS['calls']} calls)"
    )
    for a in ("glet", "glet-core"):
        print(
            f"{a} modeled max rate vs sbp: "
            f"{statistics.mean(ratio[a]) / statistics.mean(ratio['sbp']):.3f}x"
            f", vs greedy: {statistics.mean(ratio[a]) / statistics.mean(ratio['greedy']):.3f}x"
        )

    decision_times(latency, util, imodel, quick=args.quick)
    replan_decisions(args.data, rounds=10 if args.quick else 40)


def gpulet_form(store) -> InterferenceModel:
    """gpulet's own model: c1..c5 by least squares on every co-location measurement."""
    import numpy as np

    x, y, *_ = build_samples(
        load_colocations(store), load_solo_latency(store), load_utilisation(store)
    )
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return InterferenceModel(tuple(float(c) for c in coef))


#: (models, GPUs) a decision is timed at: the reference models themselves, then fleets of
#: synthetic models (each the profiles and utilisation of reference model ``i mod 10``)
SIZES = ((10, 8), (30, 24), (100, 64))


def fleet(n: int, rng: random.Random) -> list[GletModel]:
    """``n`` models: model ``i`` is reference model ``ORDER[i % 10]`` (its profiles,
    utilisation and SLO) under its own name, at a rate drawn from 50-600 req/s."""
    return [
        GletModel(
            ORDER[i % len(ORDER)] if n <= len(ORDER) else f"{ORDER[i % len(ORDER)]}-{i}",
            float(rng.choice([50, 100, 200, 400, 600])),
            SLO_MS[ORDER[i % len(ORDER)]],
            variant=ORDER[i % len(ORDER)],
        )
        for i in range(n)
    ]


def decision_times(latency: dict, util: dict, imodel, *, quick: bool) -> None:
    """Wall and CPU time of one decision (build the problem from the profiles + schedule)
    per algorithm at each of :data:`SIZES`, with the machine's load beside them."""
    print("\n== scheduling time per decision (modeled problem from the measured profiles) ==")
    print(
        "(one decision = build the problem + schedule; wall clock and CPU time of this "
        "process; the machine may be shared: its load is printed with each size)"
    )
    print(
        f"{'size':<16} {'algorithm':<8} {'wall p50':>9} {'p95':>8} {'CPU p50':>9} {'p95':>8}"
        f" {'GPUs':>7} {'load':>5}"
    )
    for n, gpus in SIZES:
        rng = random.Random(7)
        decisions = (10 if n <= 10 else 3) if quick else (40 if n <= 10 else 10)
        wall: dict[str, list[float]] = {"glet": [], "sbp": [], "greedy": []}
        cpu: dict[str, list[float]] = {a: [] for a in wall}
        used: dict[str, list[int | None]] = {a: [] for a in wall}
        for _ in range(decisions):
            models = fleet(n, rng)
            for a in wall:
                t, tc = time.perf_counter(), time.process_time()
                c = Compiled(
                    GletProblem(
                        models=models,
                        latency_ms=latency,
                        max_gpus=gpus,
                        interference=imodel,
                        utilisation=util,
                    )
                )
                s = schedule(c, a, gpus)
                cpu[a].append((time.process_time() - tc) * 1000)
                wall[a].append((time.perf_counter() - t) * 1000)
                used[a].append(s.used_gpus if s else None)
        load = os.getloadavg()[0]
        for a in wall:
            ws, cs = sorted(wall[a]), sorted(cpu[a])
            ok = [u for u in used[a] if u is not None]
            span = f"{min(ok)}-{max(ok)}" if ok else "-"
            print(
                f"{f'{n} x {gpus} GPUs':<16} {a:<8} {statistics.median(ws):7.1f}ms "
                f"{_p95(ws):6.1f}ms {statistics.median(cs):7.1f}ms {_p95(cs):6.1f}ms "
                f"{span:>7} {load:>5.1f}"
                + (f"  ({len(used[a]) - len(ok)}/{decisions} need > {gpus} GPUs)"
                   if len(ok) < len(used[a]) else "")
            )  # fmt: skip
    print("target: glet under 1 s per decision at 100 models x 64 GPUs")


def _p95(sorted_ms: list[float]) -> float:
    return sorted_ms[int(0.95 * (len(sorted_ms) - 1))]


def partition_scaling(latency: dict) -> None:
    """How much throughput splitting a GPU can add by itself: a batch's solo throughput on
    p % of the GPU, times 100 / p, over its throughput on the whole GPU (1.0: splitting
    gains nothing over time-sharing the whole GPU; 2.0 on 50 %: two halves serve twice)."""
    print("\n-- throughput of 100/p partitions of p % each, relative to the whole GPU --")
    print(f"{'model':<12} {'batch':>5}" + "".join(f"{f'p={p}':>8}" for p in (20, 40, 50)))
    for m in ORDER:
        table = latency.get(m) or {}
        full = table.get("mps:100") or {}
        for b in (1, 8, 32):
            if b not in full:
                continue
            cells = [full[b] / (table.get(f"mps:{p}", {}).get(b, float("inf")) * p / 100)
                     for p in (20, 40, 50)]  # fmt: skip
            print(f"{m:<12} {b:>5}" + "".join(f"{c:>8.2f}" for c in cells))


def gap_study(latency: dict, util: dict, imodel, *, k: int, max_gpus: int, unit: float) -> None:
    """glet's largest schedulable rate over sbp's and greedy's (mean over scenarios) as the
    workload moves towards gpulet's: interference off, SLOs tightened, more models."""

    def slo_of(m: str, scale: float) -> float:
        one = latency[m]["mps:100"][1]
        return max(SLO_MS[m] * scale, 2.2 * one)  # still feasible alone at batch 1

    _, c2, _, c4, _ = imodel.linear
    # the co-runner's load alone: factor 1 beside the lightest co-runner measured, growing
    # with the co-runner's L2 and DRAM use by the fitted c2, c4 (no per-point offset)
    lightest = min(imodel.other_term(a / 100, b / 100) for a, b in util.values())
    load_only = type(imodel)((0.0, c2, 0.0, c4, 1.0 - lightest))
    chosen = {"on": imodel, "off": None, "load": load_only}

    def ratios(models: list[str], slo_scale: float, interference: str, sample: int | None):
        combos = [c for c in itertools.product((0, unit, 2 * unit), repeat=len(models)) if any(c)]
        if sample and len(combos) > sample:
            combos = random.Random(0).sample(combos, sample)
        got: dict[str, list[float]] = {"glet": [], "sbp": [], "greedy": []}
        for combo in combos:

            def make(s: float, combo: tuple = combo) -> Compiled:
                gm = [
                    GletModel(m, r * s, slo_of(m, slo_scale))
                    for m, r in zip(models, combo, strict=True)
                    if r > 0
                ]
                return Compiled(
                    GletProblem(
                        models=gm,
                        latency_ms=latency,
                        max_gpus=max_gpus,
                        interference=chosen[interference],
                        utilisation=util,
                    )
                )

            for a in got:
                got[a].append(max_scale(make, a, max_gpus, 0.0, 0.02))
        g = statistics.mean(got["glet"])
        return g / statistics.mean(got["sbp"]), g / statistics.mean(got["greedy"]), len(combos)

    print("\n== what separates glet from sbp and greedy (modeled max rate, mean over scenarios) ==")
    print(f"{'workload':<58} {'scen.':>5} {'vs sbp':>8} {'vs greedy':>10}")
    few, six = ORDER[:k], ORDER[:6]
    cases = [
        (f"{k} models, SLOs as benchmarked, interference on", few, 1.0, "on", None),
        (f"{k} models, interference off", few, 1.0, "off", None),
        (f"{k} models, interference of the co-runner's load only", few, 1.0, "load", None),
        (f"{k} models, SLOs x 0.5 (floor 2.2 x batch-1 latency)", few, 0.5, "on", None),
        (f"{k} models, SLOs x 0.5, interference off", few, 0.5, "off", None),
        ("6 models, SLOs x 0.5, interference on (40 scenarios)", six, 0.5, "on", 40),
        ("6 models, SLOs x 0.5, interference off", six, 0.5, "off", 40),
        ("6 models, SLOs x 0.5, co-runner's load only", six, 0.5, "load", 40),
    ]
    for label, models, scale, inter, sample in cases:
        vs_sbp, vs_greedy, n = ratios(models, scale, inter, sample)
        print(f"{label:<58} {n:>5} {vs_sbp:>7.3f}x {vs_greedy:>9.3f}x", flush=True)
    print("(gpulet paper: +61.7 % over sbp, +81.2 % over greedy)")
    partition_scaling(latency)


def replan_decisions(data: Path, *, rounds: int) -> None:
    """Time `greenctl replan` of a glet plan (the library twin, no apply) as rates move."""

    from greenctl.executor.control import replan
    from greenctl.executor.control.interference import fit_and_store
    from greenctl.executor.kinds import get_kind

    print("\n== glet replan decision time: 10 models, rates +-30 % per round ==")
    rng = random.Random(11)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "replan.db")
        import_gpulet(store, data)
        fit_and_store(store, source="bench")
        rates = {m: float(rng.choice([100, 200, 300])) for m in ORDER}
        request = {
            "models": [{"name": m, "rate_rps": r, "slo_ms": SLO_MS[m]} for m, r in rates.items()]
        }
        plan, _ = get_kind("glet").plan(store, request)
        plan_id = store.save_plan(plan)
        whole: list[float] = []
        whole_cpu: list[float] = []
        planning: list[float] = []
        scheduling: list[float] = []
        actions: dict[str, int] = {}
        moved: list[str] = []
        for _ in range(rounds):
            rates = {m: max(10.0, r * rng.uniform(0.7, 1.3)) for m, r in rates.items()}
            t, tc = time.perf_counter(), time.process_time()
            d = replan.replan_once(store, plan=str(plan_id), min_dwell_s=0, rates=rates)
            whole.append((time.perf_counter() - t) * 1000)
            whole_cpu.append((time.process_time() - tc) * 1000)
            actions[d["action"]] = actions.get(d["action"], 0) + 1
            moved += [p for p in d["reason"].split("; ") if "glets move" in p]
            running = store.get_plan(int(d["new_plan_id"] or plan_id))
            t = time.perf_counter()
            replan._replan_kind(store, running, intensity=None, rates=rates)
            planning.append((time.perf_counter() - t) * 1000)
            _, problem = get_kind("glet").plan(store, {**running.request, "models": [
                {**m, "rate_rps": rates[m["name"]]} for m in running.request["models"]
            ]})  # fmt: skip
            t = time.perf_counter()
            schedule(Compiled(problem), "glet", 8)
            scheduling.append((time.perf_counter() - t) * 1000)
            if d["action"] == "propose":  # as if applied: the next round starts from it
                plan_id = int(d["new_plan_id"])
        store.close()

    def line(name: str, ts: list[float]) -> str:
        ts = sorted(ts)
        return (
            f"{name:<34} median {statistics.median(ts):7.1f} ms  p95 "
            f"{ts[int(0.95 * (len(ts) - 1))]:7.1f} ms  max {ts[-1]:7.1f} ms"
        )

    print(line("replan round (decision, recorded)", whole))
    print(line("  the same, CPU time of this process", whole_cpu))
    print(line("  rewrite + plan + score (registry)", planning))
    print(line("  schedule alone (glet)", scheduling))
    print(
        f"round / schedule: {statistics.median(whole) / statistics.median(scheduling):.1f}x "
        f"(median); actions over {rounds} rounds: "
        + ", ".join(f"{k} {v}" for k, v in sorted(actions.items()))
    )
    if moved:
        print(f"e.g. {moved[0]}; {moved[-1]}")


if __name__ == "__main__":
    main()
