"""The inputs of a what-if replay (``greenctl replay``): the window of the load trace and the
carbon signal it covers, and the options that cut it (``--from``, ``--hours``, ``--every``).

Read by the replay loop (:mod:`greenctl.executor.control.replay`) for every kind's step.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data import carbon
from greenctl.data.carbon_io import iso, normalise_time, parse_time, read_carbon_file
from greenctl.data.errors import InputError
from greenctl.data.traces import read_rps_trace
from greenctl.executor.control.replan import parse_duration
from greenctl.executor.kinds.replaying import TraceWindow, iso_at
from greenctl.planner.core.forecast import minute_maxima

if TYPE_CHECKING:
    from greenctl.data.store import Store

__all__ = [
    "TraceWindow",
    "forecast_peaks",
    "iso_at",
    "parse_every",
    "parse_from",
    "read_load",
    "trace_window",
]


# -- input parsing ----------------------------------------------------------------------------
def parse_every(every: str | float | int) -> int:
    """``--every`` in whole seconds (>= 1)."""
    seconds = parse_duration(every, option="--every")
    if not math.isfinite(seconds) or seconds < 1 or seconds != int(seconds):
        raise InputError(
            f"--every '{every}' must be a whole number of seconds >= 1",
            hint="for example --every 60s, 5m or 1h",
        )
    return int(seconds)


def parse_from(text: str | None) -> tuple[int, str | None]:
    """``--from``: an offset into the trace (``36h``, ``90m``, seconds) or a time (ISO).

    Returns:
        (offset in seconds, the time or None).
    """
    if text is None or not str(text).strip():
        return 0, None
    try:
        return int(parse_duration(text, option="--from")), None
    except InputError:
        pass
    try:
        return 0, normalise_time(text)
    except ValueError:
        raise InputError(
            f"--from '{text}' is neither an offset nor a time",
            hint="an offset into the trace such as 36h or 90m, or an ISO time "
            "(2026-03-01T00:00:00Z)",
        ) from None


def read_load(path: str) -> np.ndarray:
    try:
        return read_rps_trace(path)
    except InputError as exc:
        raise InputError(f"--load-trace: {exc.message}", hint=exc.hint) from None


def _carbon_points(
    store: Store, *, region: str | None, carbon_trace: str | None
) -> tuple[list[tuple[float, float]], str, str]:
    """(the signal as (epoch seconds, g/kWh) in time order, its first time, its label)."""
    if carbon_trace is not None:
        try:
            _, points = read_carbon_file(carbon_trace, region=region)
        except InputError as exc:
            raise InputError(f"--carbon-trace: {exc.message}", hint=exc.hint) from None
        regions = sorted({p.region for p in points})
        if len(regions) > 1:
            raise InputError(
                f"--carbon-trace {carbon_trace} holds {len(regions)} regions",
                hint=f"name one with --region ({', '.join(regions[:8])})",
            )
        rows = [(p.time, p.carbon_g_per_kwh) for p in points if p.kind == points[0].kind]
        label = f"carbon trace {carbon_trace} ({regions[0]})"
    else:
        assert region is not None
        rows = [(r["time"], float(r["carbon_g_per_kwh"])) for r in carbon.series(store, region)]
        label = f"stored signal of {region}"
    pts = sorted((parse_time(t).timestamp(), float(v)) for t, v in rows)
    return pts, rows[0][0] if rows else "", label


def _carbon_per_interval(
    pts: list[tuple[float, float]], start_epoch: float, every_s: int, n: int, label: str
) -> np.ndarray:
    """The value in force at each interval's start; one step past the last value is held
    (the last value's own interval), further is refused."""
    times = np.asarray([t for t, _ in pts])
    values = np.asarray([v for _, v in pts])
    step = float(np.median(np.diff(times))) if times.size > 1 else 3600.0
    at = start_epoch + every_s * np.arange(n)
    idx = np.searchsorted(times, at, side="right") - 1
    if idx.size and idx[0] < 0:
        raise InputError(
            f"--from starts before the first value of the {label}",
            hint="start later (--from), or use a signal that covers the window",
        )
    if at.size and at[-1] >= times[-1] + step:
        hours = (times[-1] + step - start_epoch) / 3600
        raise InputError(
            f"--hours goes beyond the {label}: it covers {max(hours, 0):.1f} h from the start",
            hint="shorten --hours, or start earlier with --from",
        )
    return values[idx]


def trace_window(
    store: Store,
    *,
    load_trace: str,
    region: str | None,
    carbon_trace: str | None,
    carbon_intensity: float,
    start: str | None,
    hours: float | None,
    every_s: int,
) -> TraceWindow:
    offset_s, start_time = parse_from(start)
    rps = read_load(load_trace)
    if offset_s >= rps.size:
        raise InputError(
            f"--from {start} is past the end of the load trace ({rps.size / 3600:.1f} h)",
            hint="start within the trace",
        )
    left = rps.size - offset_s
    if hours is None:
        seconds = left
    else:
        if not (math.isfinite(hours) and hours > 0):
            raise InputError(f"--hours must be a number > 0, got {hours:g}")
        seconds = round(hours * 3600)
        if seconds > left:
            raise InputError(
                f"--hours {hours:g} goes beyond the load trace: {left / 3600:.2f} h are left "
                f"after --from {start or '0'}",
                hint=f"use --hours {math.floor(left / 36) / 100:g} or less, or start earlier",
            )
    if seconds < 1:
        raise InputError("--hours leaves no second of the load trace")
    n = -(-seconds // every_s)
    if region is None and carbon_trace is None:
        t0 = start_time or iso(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=offset_s))
        return TraceWindow(
            rps,
            offset_s,
            seconds,
            every_s,
            t0,
            np.full(n, float(carbon_intensity)),
            f"constant {carbon_intensity:g} g/kWh (no carbon signal given)",
        )
    pts, first, label = _carbon_points(store, region=region, carbon_trace=carbon_trace)
    if start_time is None:  # the traces are aligned at their starts
        start_time = iso(parse_time(first) + timedelta(seconds=offset_s))
    ci = _carbon_per_interval(pts, parse_time(start_time).timestamp(), every_s, n, label)
    return TraceWindow(rps, offset_s, seconds, every_s, start_time, ci, label)


def forecast_peaks(
    series: np.ndarray, first_s: int, seconds: int, every_s: int, f: Any, name: str
) -> tuple[np.ndarray, np.ndarray, str]:
    """One-step-ahead forecasts of a per-second series' per-interval peaks over the window
    ``[first_s, first_s + seconds)``, each from the peaks before it (the history before the
    window included when the window starts on an interval boundary).

    Returns:
        (forecasts, the window's actual peaks, a note on how they were made).
    """
    n = -(-seconds // every_s)
    end = first_s + seconds
    peaks = np.asarray(
        [float(series[first_s + k * every_s : min(first_s + (k + 1) * every_s, end)].max())
         for k in range(n)]
    )  # fmt: skip
    first_k = first_s // every_s
    if first_k >= 1 and first_s % every_s == 0:
        before = minute_maxima(series[:first_s], interval_s=every_s)[:first_k]
        history = np.concatenate([before, peaks])
        out = np.asarray(f.predict_series(history, first_k), dtype=float)[:n]
        note = f"{name} over per-{every_s}s peaks (history before --from used)"
    else:  # no history before the window: the first interval forecasts its own start
        out = np.empty(n)
        out[0] = float(series[first_s : first_s + min(60, every_s)].max())
        if n > 1:
            out[1:] = np.asarray(f.predict_series(peaks, 1), dtype=float)[: n - 1]
        note = (
            f"{name} over per-{every_s}s peaks (no history before the window: the first "
            "interval plans for its first minute's peak)"
        )
    return np.maximum(out, 0.0), peaks, note
