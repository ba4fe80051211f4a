"""INFaaS's load-change experiment, greenctl's way: cost of model-vertical scaling against a
single-variant (model-horizontal) baseline as the load steps and spikes.

INFaaS (ATC'21) scales a model "vertically" (to another variant) as well as horizontally
(replicas), and shows the cost this saves as the load changes. Here, over a SYNTHETIC load
(:func:`step_spike`: steps 40 -> 120 -> 60 req/s, a 3-minute spike to 250, a step down to
20; Poisson arrivals each second, seeded), ``greenctl replay`` runs the same replan loop
(every minute, ``--min-dwell 0``, replay's default forecaster, objective ``cost`` under an
accuracy floor, SLO 750 ms at p99, 64 cores) two ways:

- ``vertical``: greenctl's mix replan choosing among InfAdapter's five ResNet variants and
  their CPU sizes (third-party profiles, ``bench/infadapter_import.py``), the floor on the
  plan's mean accuracy (InfAdapter's semantics: a mix may pair a faster, less accurate
  variant with a more accurate one);
- ``single``: the same loop over a store that holds one variant, the cheapest that meets
  the floor alone (ResNet-50 for a floor of 0.74): only replicas and CPU sizes change;

beside replay's ``infaas`` baseline (INFaaS-style greedy reactive scaling, one variant at a
time; see :mod:`greenctl.executor.control.replay`). Printed per 10-minute bucket: the load, each
policy's cost and SLO violations, and the cost ratio vertical / single; then the totals with
mean accuracy. Every figure is MODELED (the profiles, the analytic queueing model, an assumed
0.04 USD per core-hour) on a SYNTHETIC trace.

    python bench/bench_infaas_loadchange.py [--floor 0.74] [--bucket-min 10] [--seed 0]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
#: (minutes, req/s) of the synthetic load, in order
SHAPE = [(30, 40.0), (30, 120.0), (20, 60.0), (3, 250.0), (17, 60.0), (20, 20.0)]


def step_spike(seed: int = 0) -> np.ndarray:
    """The synthetic per-second load of :data:`SHAPE` (Poisson counts each second)."""
    rate = np.concatenate([np.full(m * 60, r) for m, r in SHAPE])
    return np.random.default_rng(seed).poisson(rate).astype(float)


def _converter() -> Any:
    spec = importlib.util.spec_from_file_location(
        "infadapter_import", HERE / "infadapter_import.py"
    )
    assert spec is not None and spec.loader is not None
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    return conv


def _store(path: Path, only: set[str] | None = None) -> Any:
    """InfAdapter's ResNet profiles (``only``: these variants alone)."""
    from greenctl.data.store import open_store

    conv = _converter()
    variants, profiles = conv.to_records(conv.convert_rows(conv.SOURCE))
    store = open_store(path)
    with store.transaction():
        for v in variants:
            if only is None or v.name in only:
                store.upsert_variant(v)
        store.add_profiles([p for p in profiles if only is None or p.variant in only])
    return store


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    from greenctl.executor.control.replay import replay

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--floor", type=float, default=0.74, help="accuracy floor (mean)")
    ap.add_argument("--bucket-min", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--forecaster", default=None, help="replay's (default: its default)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    conv = _converter()
    accuracy = {f"resnet{a}": acc for a, acc in conv.ACCURACY.items()}
    meeting = [v for v, acc in accuracy.items() if acc >= args.floor]
    if not meeting:
        print(f"no variant meets the floor {args.floor}", file=sys.stderr)
        return 2
    # the cheapest variant that meets the floor alone: the fastest of those (same prices)
    single = min(meeting, key=lambda v: accuracy[v])
    request = {
        "model": "resnet",
        "slo_ms": 750.0,
        "percentile": "p99",
        "budgets": {"cpu": 64.0},
        "objective": "cost",
        "min_accuracy": args.floor,
    }
    load = step_spike(args.seed)
    print(
        "INFaaS-style load change (SYNTHETIC load; MODELED figures): "
        + ", ".join(f"{m} min at {r:g}" for m, r in SHAPE)
        + f" req/s, Poisson each second (seed {args.seed}); accuracy floor {args.floor:g} "
        f"(mean); single variant: {single}; {_load()}"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "step_spike.txt"
        trace.write_text(" ".join(f"{r:g}" for r in load) + "\n")
        common = {"load_trace": str(trace), "request": request, "every": 60, "min_dwell_s": 0.0,
                  "forecaster": args.forecaster}  # fmt: skip
        for name, only, baselines in (
            ("vertical", None, ("infaas",)),
            ("single", {single}, ()),
        ):
            store = _store(Path(tmp) / f"{name}.db", only)
            try:
                t = time.perf_counter()
                res = replay(store, baselines=baselines, **common)
                print(f"    replay {name}: {time.perf_counter() - t:.1f} s")
            finally:
                store.close()
            out[name] = res["intervals"]["greenctl"]
            if name == "vertical":
                out["infaas"] = res["intervals"]["infaas"]
                forecaster = res["meta"]["forecaster"]
                notes = res["meta"]["notes"]
    policies = ("vertical", "single", "infaas")
    per = args.bucket_min
    n = len(out["vertical"])
    print(f"\n  per {per}-minute bucket (forecaster {forecaster}; replanned every minute):")
    print(
        f"  {'minutes':>9} {'mean rps':>9} {'peak rps':>9} "
        + " ".join(f"{p + ' USD':>13} {p + ' viol':>13}" for p in policies)
        + f" {'vert/single':>12}"
    )
    for a in range(0, n, per):
        rows = {p: out[p][a : a + per] for p in policies}
        secs = load[a * 60 : (a + per) * 60]
        cost = {p: sum(r["cost_usd"] for r in rows[p]) for p in policies}
        viol = {p: sum(r["violations"] for r in rows[p]) for p in policies}
        ratio = cost["vertical"] / cost["single"] if cost["single"] > 0 else float("nan")
        print(
            f"  {f'{a}-{min(a + per, n)}':>9} {secs.mean():9.1f} {secs.max():9.0f} "
            + " ".join(f"{cost[p]:13.4f} {viol[p]:13.0f}" for p in policies)
            + f" {ratio:12.3f}"
        )
    print("\n  totals:")
    print(
        f"  {'policy':10} {'cost USD':>9} {'violations':>11} {'viol. %':>8} {'accuracy':>9} "
        f"{'changes':>8} {'variants used':>14}"
    )
    total_cost = {}
    for p in policies:
        rows = out[p]
        req = sum(r["requests"] for r in rows)
        acc_n = sum((r["accuracy"] or 0.0) * r["requests"] for r in rows if r["accuracy"])
        acc_d = sum(r["requests"] for r in rows if r["accuracy"])
        used = sorted({part.split("@")[0] for r in rows for part in r["config"].split(" + ")})
        total_cost[p] = sum(r["cost_usd"] for r in rows)
        viol = sum(r["violations"] for r in rows)
        print(
            f"  {p:10} {total_cost[p]:9.4f} {viol:11.0f} {100 * viol / req:8.3f} "
            f"{acc_n / max(acc_d, 1e-12):9.4f} "
            f"{sum(r['action'] == 'change' for r in rows):8d} {len(used):>14}"
        )
    print(
        f"\n  cost ratio vertical / single: {total_cost['vertical'] / total_cost['single']:.3f} "
        f"({100 * (1 - total_cost['vertical'] / total_cost['single']):.1f} % lower); "
        "INFaaS reports model-vertical scaling saving cost over horizontal-only scaling as "
        "the load changes (its own workloads and hardware; not comparable figure for figure)"
    )
    for note in notes:
        print(f"  note: {note}")
    print(f"  total {time.perf_counter() - t0:.1f} s; {_load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
