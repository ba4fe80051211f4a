"""Measured load: the samples the control loop records (:class:`LoadSample`), the store's
load history as per-minute peaks, and the running dispatcher's counters read into it."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from greenctl.data import deployments, loop_state
from greenctl.data.carbon_io import parse_time
from greenctl.data.records import utcnow_iso
from greenctl.data.store import Store


@dataclass
class LoadSample:
    """A measured request rate over an interval starting at ``time``."""

    time: str
    rate_rps: float
    interval_s: float = 60.0
    model: str = ""
    source: str = "measured"


def record_load(store: Store, samples: Iterable[LoadSample]) -> int:
    """Append measured load samples to ``load_history`` (one transaction)."""
    rows = [
        {
            "time": s.time,
            "model": s.model,
            "rate_rps": float(s.rate_rps),
            "interval_s": float(s.interval_s),
            "source": s.source,
        }
        for s in samples
    ]
    with store.transaction():
        loop_state.add_load_rows(store, rows)
    return len(rows)


def load_history_minutes(store: Store, *, model: str | None = None) -> Any:
    """The store's measured load as per-minute maxima (numpy array, oldest first)."""
    import numpy as np

    return np.asarray(loop_state.load_minute_peaks(store, model=model), dtype=float)


def _dispatcher_url(store: Store) -> str | None:
    row = deployments.running_dispatcher(store)
    if row is None:
        return None
    host = row["host"] or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{host}:{row['port']}"


def sample_dispatcher_load(
    store: Store, *, url: str | None = None, timeout_s: float = 2.0
) -> list[dict[str, Any]]:
    """Read the running dispatcher's request counters and append the arrival rate since the
    previous reading to ``load_history`` (per model). The first reading only primes the
    counters; a counter that went down (dispatcher restarted) restarts the sampling.

    Returns:
        The samples appended (``model, time, rate_rps, interval_s``); empty when no
        dispatcher runs or it does not answer.
    """

    base = url or _dispatcher_url(store)
    if base is None:
        return []
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return []
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("greenctl_dispatcher_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        model = labels.split('model="', 1)[1].split('"', 1)[0] if 'model="' in labels else ""
        try:
            counts[model] = counts.get(model, 0.0) + float(value)
        except ValueError:
            continue
    now = utcnow_iso()
    source = f"dispatcher:{base}"
    samples = []
    with store.transaction():
        for model, count in sorted(counts.items()):
            prev = loop_state.load_counter(store, source=source, model=model)
            if prev is not None and count >= prev["count"]:
                dt = (parse_time(now) - parse_time(prev["time"])).total_seconds()
                if dt > 0:
                    rate = (count - prev["count"]) / dt
                    samples.append(
                        {
                            "model": model,
                            "time": prev["time"],
                            "rate_rps": rate,
                            "interval_s": dt,
                        }
                    )
            loop_state.set_load_counter(store, source=source, model=model, time=now, count=count)
        if samples:
            record_load(
                store,
                [
                    LoadSample(
                        s["time"],
                        s["rate_rps"],
                        interval_s=s["interval_s"],
                        model=s["model"],
                        source="dispatcher",
                    )
                    for s in samples
                ],
            )
    return samples
