"""Benchmarks of ``greenctl replay`` (issue 21).

Run: ``python bench/bench_replay.py [--quick] [--forecaster last]``.

(a) Speed: one day (the Twitter trace's second day, ``--from 24h --hours 24``) at one-minute
    intervals for one mix family (InfAdapter's ResNet CPU profiles, SLO 750 ms at p99, 20
    cores), with every baseline: with ``replan``'s defaults (``--min-dwell 1h``, the exact ILP),
    replanning every minute (``--min-dwell 0``), and every minute with ``--strategy greedy``.
    Wall-clock on this machine, printed beside its load average (other jobs share its cores).
(b) InfAdapter vs VPA on the same day: greenctl's replan loop with InfAdapter's objective
    (accuracy - 0.05 x cost - 0.001 x loading, no carbon term; ``--min-dwell 0``) against the
    Kubernetes VPA with one variant each (ResNet18, ResNet50, ResNet152), and beside BASE,
    CO2OPT and INFaaS-style greedy reactive scaling, SLO violations and cost side by side
    with the paper's claim (up to 65 % fewer SLO violations, 33 % lower cost). Every figure is modeled: InfAdapter's measured capacities (third-party), the
    analytic queueing model, assumed prices (0.04 USD per core-hour).
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

HERE = Path(__file__).resolve().parent
TWITTER = HERE.parent.parent / "shared" / "reference" / "twitter" / "requests_per_second.txt.gz"
PAPER = {"violations_fewer_pct": 65.0, "cost_lower_pct": 33.0}
REQUEST = {
    "model": "resnet",
    "slo_ms": 750.0,
    "percentile": "p99",
    "budgets": {"cpu": 20.0},
    "objective": "balanced",
}


def _store(folder: Path) -> Any:
    from greenctl.data.store import open_store

    spec = importlib.util.spec_from_file_location(
        "infadapter_import", HERE / "infadapter_import.py"
    )
    assert spec is not None and spec.loader is not None
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    store = open_store(folder / "bench.db")
    conv.load_into_store(store)
    return store


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def speed(store: Any, hours: float, forecaster: str) -> None:
    from greenctl.executor.replay import replay

    print(f"(a) one mix family, {hours:g} h of the Twitter trace at 60 s intervals, all baselines")
    print(f"    {_load()}")
    cases = [
        ("replan defaults (min-dwell 1h, ilp)", {"min_dwell_s": 3600.0}, {}),
        ("replan every minute (min-dwell 0, ilp)", {"min_dwell_s": 0.0}, {}),
        ("every minute, --strategy greedy", {"min_dwell_s": 0.0}, {"strategy": "greedy"}),
    ]
    print(f"    {'case':42} {'wall s':>7} {'solves':>7} {'memo':>6} {'held':>6} {'evals':>6}")
    for label, opts, req in cases:
        t = time.perf_counter()
        out = replay(
            store, load_trace=str(TWITTER), request={**REQUEST, **req}, start="24h",
            hours=hours, every=60, forecaster=forecaster, **opts,
        )  # fmt: skip
        wall = time.perf_counter() - t
        r = out["meta"]["replan"]
        print(
            f"    {label:42} {wall:7.2f} {r['solves']:7d} {r['cached']:6d} "
            f"{r['dwell_holds']:6d} {out['meta']['evaluations']:6d}"
        )
    print(f"    {_load()}")
    print("    target: one day at 1-min intervals in <= 10 s (issue 21)")


def infadapter_vs_vpa(store: Any, hours: float, forecaster: str) -> None:
    from greenctl.executor.replay import replay

    print(
        f"\n(b) InfAdapter vs VPA, Twitter trace ({hours:g} h from 24h), InfAdapter's ResNet "
        "profiles, SLO 750 ms at p99, 20 cores (MODELED)"
    )
    request = {**REQUEST, "alpha": 0.05, "beta": 0.001, "gamma": 0.0}
    t = time.perf_counter()
    out = replay(
        store, load_trace=str(TWITTER), request=request, start="24h", hours=hours, every=60,
        min_dwell_s=0.0, forecaster=forecaster, baselines=("base", "co2opt", "vpa", "infaas"),
        vpa_variant=("resnet18", "resnet50", "resnet152"),
    )  # fmt: skip
    wall = time.perf_counter() - t
    rows = {s["policy"]: s for s in out["summary"]}
    g = rows["greenctl"]
    print(f"    greenctl loop: forecaster {forecaster}, {out['meta']['replan']['solves']} solves, "
          f"{wall:.1f} s; {_load()}")  # fmt: skip
    print(f"    {'policy':16} {'SLO viol. %':>11} {'accuracy':>9} {'cost USD':>9} "
          f"{'changes':>8} {'viol. fewer':>12} {'cost lower':>11}")  # fmt: skip
    for name, s in rows.items():
        fewer = lower = ""
        if name.startswith("vpa"):
            if s["violations"] > 0:
                fewer = f"{100 * (1 - g['violations'] / s['violations']):.0f} %"
            if s["cost_usd"] > 0:
                lower = f"{100 * (1 - g['cost_usd'] / s['cost_usd']):.0f} %"
        acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.4f}"
        print(
            f"    {name:16} {s['violation_pct']:11.2f} {acc:>9} {s['cost_usd']:9.2f} "
            f"{s['changes']:8d} {fewer:>12} {lower:>11}"
        )
    print(
        f"    paper (InfAdapter vs VPA): up to {PAPER['violations_fewer_pct']:g} % fewer SLO "
        f"violations and {PAPER['cost_lower_pct']:g} % lower cost (measured on a cluster); "
        "the figures above are modeled"
    )
    print(f"    {out['meta']['vpa']['rule']}")
    for note in out["meta"]["notes"]:
        print(f"    note: {note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 hours instead of one day")
    ap.add_argument("--forecaster", default="last")
    ap.add_argument("--only", choices=("speed", "infadapter"), default=None)
    args = ap.parse_args(argv)
    if not TWITTER.exists():
        print(f"the Twitter trace is not at {TWITTER}", file=sys.stderr)
        return 1
    hours = 3.0 if args.quick else 24.0
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        try:
            if args.only in (None, "speed"):
                speed(store, hours, args.forecaster)
            if args.only in (None, "infadapter"):
                infadapter_vs_vpa(store, hours, args.forecaster)
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
