"""InfAdapter's bursty-load experiment, replayed: InfAdapter's own loop vs VPA vs MS+.

Run: ``python bench/bench_infadapter_bursty.py [--quick] [--every 60]``.

The window is the one InfAdapter's load generator sends (its ``experiments/workload.py``):
the bundled Twitter trace (``bundled:twitter``, the trace InfAdapter ships) from day 15 +
82 min to day 15 + 103 min, 21 minutes in which the load bursts from about 60 to 274 req/s
and falls back. As in InfAdapter's setup: its ResNet 18..152 CPU profiles
(``bench/infadapter_import.py``, third-party measurements), SLO 750 ms at p99, 20 cores,
alpha 0.05, beta 0.001. Policies, all on the same seconds (``greenctl replay`` with
``--min-dwell 0``): ``infadapter`` (InfAdapter's loop: its LSTM fitted on the trace before
the window, the exact mix every interval), ``msplus`` (MS+: the same loop, one variant at a
time), VPA with one variant each (ResNet18, ResNet50, ResNet152, as InfAdapter compares) and
greenctl's own loop. Per policy: SLO violations %, average accuracy, mean cores, cost; then
InfAdapter's ratios against each. ``--quick`` fits the LSTM on the last day before the
window only (the full run: the 15 days before it, as InfAdapter's LSTM learned from 14).

Every figure is MODELED (profiles + analytic queueing per second), not measured on a
cluster; InfAdapter's adapter also adds 10 % to its forecast, decides every 30 s and waits 4
decisions before scaling down, which the replayed loop does not (it decides each interval
for the forecast as is).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from greenctl.data.bundled import path_of

HERE = Path(__file__).resolve().parent
DAY_S = 86400
#: InfAdapter's bursty window of the Twitter trace (its load generator's slice)
WINDOW_START_S = 15 * DAY_S + 82 * 60
WINDOW_S = 21 * 60
REQUEST = {
    "model": "resnet",
    "slo_ms": 750.0,
    "percentile": "p99",
    "budgets": {"cpu": 20.0},
    "objective": "balanced",
    "alpha": 0.05,
    "beta": 0.001,
    "gamma": 0.0,
}
VPA_VARIANTS = ("resnet18", "resnet50", "resnet152")
#: the paper's headline against VPA (Salmani et al., EuroMLSys'23, abstract): up to
PAPER = {"violations_fewer_pct": 65.0, "cost_lower_pct": 33.0}


def _store(folder: Path) -> Any:
    """A store holding InfAdapter's ResNet CPU profiles."""
    import infadapter_import  # bench/, the script's own folder

    return infadapter_import.open_bench_store(folder / "bench.db")


def _trace(folder: Path, history_days: float) -> tuple[Path, int]:
    """The Twitter trace cut to ``history_days`` before the window plus the window; (its
    file, the window's offset in it)."""
    with gzip.open(path_of("twitter"), "rt") as fh:
        rps = np.array(fh.read().split(), dtype=np.int64)
    first = max(0, WINDOW_START_S - int(history_days * DAY_S))
    cut = rps[first : WINDOW_START_S + WINDOW_S]
    path = folder / "twitter_bursty.txt"
    path.write_text(" ".join(map(str, cut.tolist())) + "\n")
    return path, WINDOW_START_S - first


def run(store: Any, trace: Path, offset_s: int, every: int) -> dict[str, Any]:
    from greenctl.executor.control.replay import replay

    return replay(
        store, load_trace=str(trace), request=REQUEST, start=f"{offset_s}s",
        hours=WINDOW_S / 3600, every=every, min_dwell_s=0.0,
        baselines=("vpa", "msplus", "infadapter"), vpa_variant=VPA_VARIANTS,
    )  # fmt: skip


def _pct_lower(a: float, b: float) -> str:
    """How much lower ``a`` is than ``b``, in percent of ``b``."""
    return "-" if b <= 0 else f"{100 * (1 - a / b):.0f} %"


def report(out: dict[str, Any], wall_s: float) -> None:
    rows = {s["policy"]: s for s in out["summary"]}
    meta = out["meta"]
    print(
        f"    {meta['peak_rps']:.0f} req/s peak, {meta['replan']['solves']} greenctl solves, "
        f"{meta['replan'].get('infadapter_plans', 0)} InfAdapter plans, "
        f"{meta['replan'].get('msplus_plans', 0)} MS+ plans; {wall_s:.1f} s wall"
    )
    for n in meta["notes"]:
        print(f"    note: {n}")
    print(f"    {'policy':16} {'SLO viol. %':>11} {'accuracy':>9} {'cores':>6} {'cost USD':>9} "
          f"{'changes':>8}")  # fmt: skip
    for name, s in rows.items():
        acc = "-" if s["accuracy"] is None else f"{100 * s['accuracy']:.2f} %"
        print(
            f"    {name:16} {s['violation_pct']:11.2f} {acc:>9} {s['mean_units']:6.2f} "
            f"{s['cost_usd']:9.4f} {s['changes']:8d}"
        )
    ia = rows.get("infadapter")
    if ia is None:
        return
    print("\n    InfAdapter against each (fewer SLO violations, fewer cores, accuracy +points):")
    for name, s in rows.items():
        if name == "infadapter":
            continue
        d_acc = ""
        if ia["accuracy"] is not None and s["accuracy"] is not None:
            d_acc = f"{100 * (ia['accuracy'] - s['accuracy']):+.2f}"
        print(
            f"    vs {name:13} {_pct_lower(ia['violations'], s['violations']):>8} "
            f"{_pct_lower(ia['mean_units'], s['mean_units']):>8} {d_acc:>7}"
        )
    print(
        f"    paper (real cluster, vs VPA): up to {PAPER['violations_fewer_pct']:.0f} % fewer "
        f"SLO violations, up to {PAPER['cost_lower_pct']:.0f} % lower cost"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="LSTM fitted on one day (< 1 min)")
    ap.add_argument("--every", type=int, default=60, help="decision interval, s (default 60)")
    args = ap.parse_args()
    history_days = 1.0 if args.quick else 15.0
    one, five, _ = os.getloadavg()
    print(
        "InfAdapter's bursty load (Twitter trace, day 15 + 82..103 min), ResNet CPU "
        f"profiles, SLO 750 ms p99, 20 cores, every {args.every} s (MODELED)\n"
        f"    LSTM history {history_days:g} day(s); load average {one:.2f} / {five:.2f} on "
        f"{os.cpu_count()} cores"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = _store(folder)
        trace, offset_s = _trace(folder, history_days)
        t = time.perf_counter()
        out = run(store, trace, offset_s, args.every)
        report(out, time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
