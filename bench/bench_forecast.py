"""Load forecasting on the Twitter trace (InfAdapter's): MAE, and what each forecaster does to
a replay's SLO violations and cost.

(a) Errors. Train on the first 14 days, test on the rest: one-step-ahead predictions of each
    minute's peak rate (per-minute maxima), as InfAdapter's LSTM does from the last 10
    minutes. Per forecaster: MAE, MAPE and the under-prediction rate (how often it predicts
    below the actual peak: what breaks SLOs), with ratios against ``last`` measured in the
    same run.
(b) What matters. ``greenctl replay`` of the day after the training days (``--from 14d
    --hours 24``; ``--quick``: 6 h) with each forecaster, the LSTMs fitted on the first 14
    days and saved in the store as ``greenctl forecast fit`` saves them (the replay reads
    them by name, as ``replan --forecaster NAME`` does): one mix family (InfAdapter's ResNet
    CPU profiles, third-party measurements; SLO 750 ms at p99, 20 cores, balanced objective),
    with replan's defaults (``--min-dwell 1h``) and replanning every minute (``--min-dwell
    0``). Per forecaster: greenctl's SLO violations, cost, accuracy and changes. MODELED
    (the analytic queueing model over the profiles; prices assumed, 0.04 USD per core-hour).
(c) The verdict: per forecaster, its violations over both settings relative to the fewest
    plus its cost relative to the lowest (equal weight to a relative change in either);
    the lowest score wins, and is the default it should be
    (``greenctl.planner.core.forecast.DEFAULT_FORECASTER``), beside the one in force.

Forecasters: ``last``, ``moving-max`` (10 min), ``seasonal-naive`` (a day), ``lstm``
(InfAdapter's: MSE on the next peak), ``lstm-diff`` (learns the change from the last peak),
``lstm-median`` (the pinball loss at 0.5: the MAE's own optimum; 20 epochs), ``lstm-q90``
(the pinball loss at 0.9: an upper forecast), ``lstm-h60`` (the peak of the next 60 minutes,
the span ``--min-dwell 1h`` holds a plan; its MAE is against the next minute's peak, so not
comparable). LSTMs: 1 layer, 25 units, window 10, torch CPU, 1 thread. The replay also says
how many of greenctl's violations fall in intervals where ``--min-dwell`` held a plan
(``in holds %``): the dwell holds a plan unless it cannot carry the forecast
(``executor.control.replan.dwell_yields``), so the violations left there are the forecast's misses.

    python bench/bench_forecast.py [--quick] [--trace PATH] [--epochs N] [--only errors|replay]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DEFAULT_TRACE = "bundled:twitter"
REQUEST = {
    "model": "resnet",
    "slo_ms": 750.0,
    "percentile": "p99",
    "budgets": {"cpu": 20.0},
    "objective": "balanced",
}


def candidates(epochs: int) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, kind, params) of every forecaster compared."""
    return [
        ("last", "last", {}),
        ("moving-max", "moving-max", {"window": 10}),
        ("seasonal-naive", "seasonal-naive", {"period": 1440}),
        ("lstm", "lstm", {"epochs": epochs}),
        ("lstm-diff", "lstm", {"epochs": epochs, "target": "diff"}),
        ("lstm-median", "lstm", {"epochs": max(epochs, 20), "quantile": 0.5}),
        ("lstm-q90", "lstm", {"epochs": epochs, "quantile": 0.9}),
        ("lstm-h60", "lstm", {"epochs": epochs, "horizon": 60}),
    ]


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def errors(trace: str, train_days: float, epochs: int) -> dict[str, Any]:
    """(a): fit each forecaster on the training days and score it on the rest."""
    from greenctl.data.traces import read_rps_trace
    from greenctl.planner.core import forecast as fc

    t0 = time.perf_counter()
    rps = read_rps_trace(trace)
    minutes = fc.minute_maxima(rps)
    train = int(train_days * 1440)
    print(
        f"(a) trace {Path(trace).name}: {rps.size:,} s = {rps.size / 86400:.1f} days; "
        f"{minutes.size:,} minute maxima; train {train:,} min (first {train_days:g} days), "
        f"test {minutes.size - train:,} min; load {time.perf_counter() - t0:.1f} s"
    )
    rows = []
    for name, kind, params in candidates(epochs):
        f = fc.make_forecaster(kind, **params)
        t = time.perf_counter()
        f.fit(minutes[:train])
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        s = fc.evaluate(f, minutes, train=train)
        rows.append((name, s, fit_s, time.perf_counter() - t))
    base = rows[0][1]
    print(
        f"    {'forecaster':<16}{'MAE rps':>9}{'MAPE %':>9}{'under %':>9}{'short rps':>10}"
        f"{'MAE/last':>10}{'under/last':>11}{'fit s':>8}{'pred s':>8}"
    )
    for name, s, fit_s, pred_s in rows:
        print(
            f"    {name:<16}{s.mae_rps:>9.2f}{s.mape_pct:>9.2f}{s.under_rate * 100:>9.1f}"
            f"{s.mean_under_rps:>10.2f}{s.mae_rps / base.mae_rps:>10.2f}"
            f"{s.under_rate / base.under_rate:>11.2f}{fit_s:>8.1f}{pred_s:>8.2f}"
        )
    print(
        "    under % = share of test minutes predicted below the actual peak; short rps = mean "
        f"shortfall when under. {_load()}"
    )
    return {name: s for name, s, _, _ in rows}


def _store(folder: Path) -> Any:
    import infadapter_import  # bench/, the script's own folder

    return infadapter_import.open_bench_store(folder / "bench.db")


def replays(trace: str, train_days: float, epochs: int, hours: float) -> dict[str, Any]:
    """(b): replay the day after the training days with each forecaster."""
    from greenctl.executor.control import forecasters
    from greenctl.executor.control.replay import replay

    start = f"{train_days * 24:g}h"
    print(
        f"\n(b) replay --from {start} --hours {hours:g} (after the training days), one mix "
        "family (InfAdapter's ResNet CPU profiles), SLO 750 ms at p99, 20 cores, balanced; "
        "MODELED"
    )
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = _store(Path(tmp))
        try:
            for name, kind, params in candidates(epochs):
                if name != kind or kind == "lstm":  # saved as `greenctl forecast fit` does
                    t = time.perf_counter()
                    forecasters.fit_forecaster(
                        store, kind=kind, name=name, trace=trace, train_days=train_days,
                        params=params,
                    )  # fmt: skip
                    print(f"    fitted {name} in {time.perf_counter() - t:.1f} s")
            for dwell, label in ((3600.0, "replan defaults (min-dwell 1h)"), (0.0, "every minute")):
                print(f"    {label}; {_load()}")
                print(
                    f"      {'forecaster':<16}{'SLO viol. %':>12}{'violations':>11}{'cost USD':>9}"
                    f"{'accuracy':>9}{'changes':>8}{'in holds %':>11}{'wall s':>7}"
                )
                for name, _, _ in candidates(epochs):
                    t = time.perf_counter()
                    res = replay(
                        store, load_trace=trace, request=dict(REQUEST), start=start,
                        hours=hours, every=60, forecaster=name, min_dwell_s=dwell, baselines=(),
                    )  # fmt: skip
                    g = next(s for s in res["summary"] if s["policy"] == "greenctl")
                    out.setdefault(name, {})[label] = g
                    rows = res["intervals"]["greenctl"]
                    held = sum(r["violations"] for r in rows if r["action"] == "hold")
                    print(
                        f"      {name:<16}{g['violation_pct']:>12.3f}{g['violations']:>11.0f}"
                        f"{g['cost_usd']:>9.3f}{g['accuracy']:>9.4f}{g['changes']:>8d}"
                        f"{100 * held / max(g['violations'], 1e-12):>11.1f}"
                        f"{time.perf_counter() - t:>7.1f}"
                    )
        finally:
            store.close()
    return out


def verdict(results: dict[str, Any]) -> tuple[str, dict[str, float]]:
    """(c): each forecaster's SLO violations and cost summed over both settings, each
    relative to the best of all (1.0: the fewest violations, the lowest cost); the score
    is the sum of the two ratios (equal weight to a relative change in either), lowest
    wins.

    Returns:
        (the winner, each forecaster's score).
    """
    tot = {
        name: (
            sum(g["violations"] for g in by.values()),
            sum(g["cost_usd"] for g in by.values()),
        )
        for name, by in results.items()
    }
    v0 = max(min(v for v, _ in tot.values()), 1e-12)
    c0 = max(min(c for _, c in tot.values()), 1e-12)
    score = {name: v / v0 + c / c0 for name, (v, c) in tot.items()}
    return min(score, key=lambda n: score[n]), score


def main(argv: list[str] | None = None) -> int:
    from greenctl.data.bundled import resolve
    from greenctl.planner.core import forecast as fc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=resolve, default=DEFAULT_TRACE, help="file or bundled:NAME")
    ap.add_argument("--quick", action="store_true", help="3 LSTM epochs; replay 6 h")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--train-days", type=float, default=14.0)
    ap.add_argument("--hours", type=float, default=None, help="replay length (default 24)")
    ap.add_argument("--only", choices=("errors", "replay"), default=None)
    args = ap.parse_args(argv)
    if not args.trace.exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    epochs = args.epochs or (3 if args.quick else 8)
    hours = args.hours or (6.0 if args.quick else 24.0)
    if args.only in (None, "errors"):
        errors(str(args.trace), args.train_days, epochs)
    if args.only in (None, "replay"):
        results = replays(str(args.trace), args.train_days, epochs, hours)
        best, score = verdict(results)
        ranked = ", ".join(f"{n} {v:.3f}" for n, v in sorted(score.items(), key=lambda kv: kv[1]))
        print(
            "\n(c) score = violations / fewest + cost / lowest, both settings summed (lower is "
            f"better): {ranked}\n    verdict: {best}; the default in force: "
            f"{fc.DEFAULT_FORECASTER}"
            + ("" if best == fc.DEFAULT_FORECASTER else f" -> it should be {best}")
            + (
                " (an LSTM needs `greenctl forecast fit` first: a default must work unsaved)"
                if best not in fc.FORECASTERS
                else ""
            )
        )
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
