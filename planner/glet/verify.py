"""Simulated check of a glet schedule (Poisson arrivals, time-shared duty cycles).

Each glet runs its models' batches back to back in a fixed order every duty cycle ``d``:
model ``i``'s batch starts at offset ``o_i`` (the sum of the batch latencies before it)
plus ``k d``, takes the requests that arrived before that start, at most ``batch`` of them
(the rest wait for the next cycle), and completes ``L_i`` later (latency with
interference). This is the execution the duty-cycle rule assumes; the simulation adds what
the rule leaves out: Poisson bursts larger than a batch, which spill into the next cycle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def simulate_glet_chunk(
    rate_rps: float,
    batch: int,
    duty_cycle_ms: float,
    offset_ms: float,
    latency_ms: float,
    *,
    duration_s: float,
    rng: np.random.Generator,
) -> np.ndarray:
    """Latencies (ms) of the requests of one model on one time-shared glet."""
    if rate_rps <= 0 or duration_s <= 0:
        return np.empty(0)
    n = rng.poisson(rate_rps * duration_s)
    arrivals = np.sort(rng.uniform(0.0, duration_s * 1000.0, n))
    d = max(duty_cycle_ms, 1e-6)
    # index of the first cycle start at or after each arrival
    first = np.ceil((arrivals - offset_ms) / d).clip(min=0).astype(np.int64)
    # FIFO with at most `batch` requests per cycle: request j (0-based, in arrival order)
    # is served in cycle max(first_j, served cycle of request j - batch + 1 ... ) —
    # computed by the recursion c_j = max(first_j, c_{j - batch} + 1).
    served = first.copy()
    for j in range(batch, n):
        prev = served[j - batch] + 1
        if prev > served[j]:
            served[j] = prev
    return offset_ms + served * d + latency_ms - arrivals


def simulate_glet_plan(
    gpus: Sequence[Mapping[str, Any]],
    slo_ms: Mapping[str, float],
    *,
    duration_s: float = 10.0,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Per model: simulated p99 latency (ms), SLO-violation share and requests simulated.

    ``gpus`` is a plan's ``extra["gpus"]`` (each model entry needs ``batch``, ``rate_rps``,
    ``duty_cycle_ms`` and ``latency_ms``).
    """
    rng = np.random.default_rng(seed)
    lat: dict[str, list[np.ndarray]] = {}
    for gpu in gpus:
        for g in gpu["glets"]:
            offset = 0.0
            for m in g["models"]:
                le = float(m.get("latency_ms", 0.0))
                lat.setdefault(m["model"], []).append(
                    simulate_glet_chunk(
                        float(m["rate_rps"]),
                        int(m["batch"]),
                        float(m["duty_cycle_ms"]),
                        offset,
                        le,
                        duration_s=duration_s,
                        rng=rng,
                    )
                )
                offset += le
    out = {}
    for model, parts in lat.items():
        allv = np.concatenate(parts) if parts else np.empty(0)
        slo = slo_ms.get(model, float("inf"))
        out[model] = {
            "p99_ms": float(np.quantile(allv, 0.99)) if allv.size else 0.0,
            "violation": float((allv > slo + 1e-9).mean()) if allv.size else 0.0,
            "requests": int(allv.size),
        }
    return out
