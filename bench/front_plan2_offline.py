"""Plan 2 of the H200 verification, predicted again with the executor front (offline, no GPU).

Plan 2 put resnet50 at batch 32 on one H200 at 1,500 req/s (``bench/gpu_verify.sh``: ``plan mix
--rate 1500 --slo-ms 30 --budget gpu=1``). Predicted p95 12.2 ms with the measured serving
path; measured 31.8 ms (run 1) and 18.5, 13.9, 215.6 ms (run 3). The evaluation core then
charged the executor of a GPU instance no CPU at all; it now models the executor's front as a
serial CPU stage before the device (``evaluate.front_cpu_ms``, ``queueing.with_front``).

What this script has, from ``bench/results/h200-2026-11-26*`` (nothing else is stored):

- resnet50's H200 profiles at batch 1, 8, 32 (``h200-2026-11-26/profiles.csv``, the first
  window's; the verification re-profiled it and kept only the log's figures);
- the serving path measured at 1,500 req/s (``run1_all_plans.log``, ``run2_plan2_serving.log``:
  p50/p95/p99 3.85/8.33/19.60 ms and 10.10/53.90/72.36 ms; served runs 1.27 ms at 3 rows and
  1.57 ms at 5, no slower than the profile): its 100 stored quantiles were not kept, so a
  shifted lognormal through the three percentiles stands for them;
- no executor CPU per request for it: ``profile serving`` stored 0.0 on every GPU row (it took
  each request's GPU batch run off the process's CPU; fixed in
  ``serving_measure.executor_own_cpu_ms``). The figures that bound it: the executor's whole
  CPU per request in ``bench_gpu_serving.py`` on the same card, 0.39 ms at batch 8 (3,307
  req/s) and 0.76-1.06 ms at batch 1; a linear split per request and per batch puts plan 2's
  3-8 rows per batch at 0.40-0.50 ms. The 0.43 and 0.60 ms per request of the two path runs are
  the *dispatcher's* CPU (another single event loop that every request crosses), shown as a
  second front for comparison, its whole wait at 1,500 req/s added. (The core now models
  the dispatcher as a stage, ``planner.core.evaluate.DispatcherStage``, and adds only the
  wait beyond the one the serving path was measured with: nothing here, where the paths
  were measured at 1,500 req/s.)

    python bench/front_plan2_offline.py              # the table (a few seconds)
    python bench/front_plan2_offline.py --simulate   # and the simulator beside each row
"""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent / "results"
PROFILES = ROOT / "h200-2026-11-26" / "profiles.csv"
RATE = 1500.0
SLO_MS = 30.0
MEASURED_P95 = {"run 1": 31.78, "run 3 a": 18.49, "run 3 b": 13.88, "run 3 c": 215.59}
PATHS = {"run 1 path (p95 8.33 ms)": (3.85, 8.33, 19.60), "run 2 path (p95 53.9 ms)": (10.10, 53.90, 72.36)}  # fmt: skip
FRONTS = (0.0, 0.39, 0.45, 0.50, 0.60)
DISPATCHER = (0.43, 0.60)


def profiles() -> dict:
    from greenctl.data.records import Profile

    rows = {}
    with PROFILES.open() as f:
        for r in csv.DictReader(f):
            if (
                r["variant"] != "resnet50"
                or r["resource"] != "gpu:H200"
                or r["source"] != "measured"
            ):
                continue
            b = int(r["batch"])
            if b in rows:  # the first window's first run of each size
                continue
            rows[b] = Profile(
                "resnet50", "gpu:H200", b,
                throughput_rps=float(r["throughput_rps"]),
                latency_p50_ms=float(r["latency_p50_ms"]),
                latency_p95_ms=float(r["latency_p95_ms"]),
                latency_p99_ms=float(r["latency_p99_ms"]),
                power_w=float(r["power_w"]), idle_power_w=float(r["idle_power_w"]),
            )  # fmt: skip
    return {("resnet50", "gpu:H200", b): p for b, p in rows.items()}


def overhead(p50: float, p95: float, p99: float) -> tuple[float, ...]:
    from greenctl.planner.core.latency import ServiceTime

    fit = ServiceTime.from_percentiles(p50, p95, p99)
    return tuple(fit.quantile((k + 0.5) / 100) for k in range(100))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--simulate", action="store_true", help="also simulate each row (slower)")
    args = ap.parse_args()
    from greenctl.data.plan import Deployment
    from greenctl.data.records import Variant
    from greenctl.planner.core.evaluate import (
        ServingPath,
        build_instances,
        predict,
        served_batches,
    )
    from greenctl.planner.core.queueing import (
        batch_capacity_at_slo,
        dynamic_batch,
        front_capacity_rps,
        front_wait,
        with_overhead,
    )
    from greenctl.planner.core.simulator import simulate
    from greenctl.planner.core.stages import plus_wait

    table = profiles()
    variants = {"resnet50": Variant("resnet50", "resnet", accuracy=0.7613)}
    deps = [Deployment("resnet", "resnet50", "gpu:H200", count=1, batch=32, quota_rps=RATE)]
    (inst,) = build_instances(deps, table)
    print(f"resnet50 b32 on the H200: device capacity {inst.capacity_rps:,.0f} req/s "
          f"(under the dispatcher's batch + 1 slots); plan at {RATE:,.0f} req/s, SLO {SLO_MS:g} ms p95")  # fmt: skip
    print("measured p95: " + ", ".join(f"{k} {v:g} ms" for k, v in MEASURED_P95.items()))
    base = predict(deps, table, variants, rate_rps=RATE, policy="batch")
    print(f"model only (no serving path): p50 {base['p50_ms']:.2f}  p95 {base['p95_ms']:.2f} ms\n")
    head = f"{'serving path':<26} {'front ms':>8} {'front cap':>9} {'p50':>7} {'p95':>7} {'p99':>7}"
    head += f" {'+disp .43':>9} {'+disp .60':>9} {'cap@SLO':>8}"
    if args.simulate:
        head += f" {'sim p95':>8}"
    print(head + "   (ms; req/s)")
    for name, pct in PATHS.items():
        samples = overhead(*pct)
        for front in FRONTS:
            path = ServingPath(samples, front, 1.0, None, resource="gpu:H200")
            serving = {"resnet50@gpu:H200": path}
            out = predict(deps, table, variants, rate_rps=RATE, policy="batch", serving=serving)
            cap = front_capacity_rps(front)
            # the dispatcher as a second front at the plan's rate, its whole wait:
            # the path's overhead plus both stages' waits, then the device
            disp = []
            (fronted,) = build_instances(deps, table, serving=serving)
            got = served_batches(fronted, RATE, path)
            dev = dynamic_batch(RATE, got[0]) if got is not None else None
            for d in DISPATCHER:
                waits = [front_wait(RATE, f) for f in (front, d) if f > 0]
                if dev is None or any(w is None for w in waits):
                    disp.append(math.inf)
                    continue
                extra = np.asarray(samples)
                for w in waits:
                    extra = plus_wait(extra, w)
                disp.append(with_overhead(dev.latency, extra).quantile(0.95))
            budget = SLO_MS - float(np.quantile(samples, 0.95))
            slo_cap = math.nan
            if got is not None and budget > 0:
                slo_cap = batch_capacity_at_slo(got[0], slo_ms=budget, percentile=0.95, front_ms=front)  # fmt: skip
            row = (
                f"{name:<26} {front:>8.2f} {cap:>9,.0f} {out['p50_ms']:>7.2f} {out['p95_ms']:>7.2f} "
                f"{out['p99_ms']:>7.2f} {disp[0]:>9.2f} {disp[1]:>9.2f} {'-' if math.isnan(slo_cap) else format(slo_cap, ',.0f'):>8}"
            )
            if args.simulate:
                sim = simulate(deps, table, variants, rate_rps=RATE, policy="batch", n_requests=150_000, seed=1, serving=serving)  # fmt: skip
                row += f" {sim['p95_ms']:>8.2f}"
            print(row)
    print(
        "\nfront ms 0.00: today's figure where no executor CPU is measured (every stored H200 "
        "row).\ncap@SLO: the mix planner's capacity for one executor within the SLO less the "
        "path's p95 (30 - 8.33 ms), front included;\n+disp: p95 with the dispatcher's measured "
        "CPU per request as a second serial stage, its whole wait added (the core adds only the "
        "wait beyond the one the path was measured with)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
