"""Load forecasting benchmark on the Twitter requests-per-second trace (InfAdapter's).

Train on the first 14 days, test on the rest: one-step-ahead predictions of each minute's
peak rate (per-minute maxima), as InfAdapter's LSTM does from the last 10 minutes. Prints
each forecaster's MAE, MAPE and under-prediction rate (how often it predicts below the
actual peak: what breaks SLOs), with ratios against the `last` value baseline measured in
the same run.

    python bench/bench_forecast.py [--quick] [--trace PATH] [--epochs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference"
DEFAULT_TRACE = REFERENCE / "twitter" / "requests_per_second.txt.gz"


def main(argv: list[str] | None = None) -> int:
    from greenctl.data.traces import read_rps_trace
    from greenctl.planner.core import forecast as fc

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--quick", action="store_true", help="3 LSTM epochs, no quantile LSTM")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--train-days", type=float, default=14.0)
    args = ap.parse_args(argv)
    if not Path(args.trace).exists():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rps = read_rps_trace(args.trace)
    minutes = fc.minute_maxima(rps)
    train = int(args.train_days * 1440)
    print(
        f"trace {Path(args.trace).name}: {rps.size:,} s = {rps.size / 86400:.1f} days; "
        f"{minutes.size:,} minute maxima; train {train:,} min (first {args.train_days:g} days), "
        f"test {minutes.size - train:,} min; load {time.perf_counter() - t0:.1f} s"
    )
    epochs = args.epochs or (3 if args.quick else 8)
    candidates = [
        fc.make_forecaster("last"),
        fc.make_forecaster("moving-max", window=10),
        fc.make_forecaster("seasonal-naive", period=1440),
        fc.make_forecaster("lstm", epochs=epochs),
    ]
    if not args.quick:
        candidates.append(fc.make_forecaster("lstm", epochs=epochs, quantile=0.9))
    rows = []
    for f in candidates:
        t = time.perf_counter()
        f.fit(minutes[:train])
        fit_s = time.perf_counter() - t
        t = time.perf_counter()
        s = fc.evaluate(f, minutes, train=train)
        pred_s = time.perf_counter() - t
        label = f.name
        if f.name == "lstm":
            q = f.params.get("quantile")
            label = f"lstm (q={q})" if q else "lstm (mse)"
        rows.append((label, s, fit_s, pred_s))
    base = rows[0][1]
    print()
    print(
        f"{'forecaster':<16}{'MAE rps':>9}{'MAPE %':>9}{'under %':>9}{'short rps':>10}"
        f"{'MAE/last':>10}{'under/last':>11}{'fit s':>8}{'pred s':>8}"
    )
    for label, s, fit_s, pred_s in rows:
        print(
            f"{label:<16}{s.mae_rps:>9.2f}{s.mape_pct:>9.2f}{s.under_rate * 100:>9.1f}"
            f"{s.mean_under_rps:>10.2f}{s.mae_rps / base.mae_rps:>10.2f}"
            f"{s.under_rate / base.under_rate:>11.2f}{fit_s:>8.1f}{pred_s:>8.2f}"
        )
    print(
        "\nunder % = share of test minutes predicted below the actual peak; short rps = mean "
        "shortfall when under. LSTM: 1 layer, 25 units, window 10, torch CPU, 1 thread, "
        f"{epochs} epochs."
    )
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
