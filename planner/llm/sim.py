"""A discrete-event check of an LLM plan: requests arrive (Poisson, or a trace's arrival
times), go to a tier by the plan's shares and to one of its instances at random, and each is
served on its instance's profiled curve at the streams it finds there (TTFT and TPOT drawn
from the lognormals :mod:`~greenctl.planner.llm.model` fits, the request holding its stream
for TTFT + (M-1) TPOT). The simulated percentiles check the analytic ones, which assume the
streams an arrival finds are Poisson; a request finding more streams than were profiled
counts as missing the SLO.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from greenctl.data.limits import SLO_QUANTILES
from greenctl.planner.llm.model import TierCurve, lognormal_mu


@dataclass(frozen=True)
class SimTier:
    """One tier of a plan as the simulator serves it."""

    curve: TierCurve
    instances: int
    rate_rps: float  # its share of the load


@dataclass(frozen=True)
class SimResult:
    """Percentiles (ms) of the simulated requests, overall and per tier (variant@resource)."""

    requests: int
    ttft_ms: float
    tpot_ms: float
    beyond: float  # fraction of requests that found more streams than profiled
    tiers: dict[str, dict[str, float]]
    #: p50/p95/p99 of a request's whole time (TTFT + (M-1) TPOT), ms
    latency_ms: dict[str, float]
    #: fraction of requests over either SLO (None without SLOs)
    slo_violation_frac: float | None = None


def simulate(
    tiers: Sequence[SimTier],
    percentile: str,
    *,
    duration_s: float = 3600.0,
    seed: int = 0,
    arrivals: Sequence[float] | np.ndarray | None = None,
    slo_ms: tuple[float, float] | None = None,
) -> SimResult:
    """Serve ``duration_s`` of Poisson arrivals at the tiers' summed rate (or the trace's
    ``arrivals``, seconds) and return the ``percentile`` of TTFT and TPOT; with ``slo_ms``
    (TTFT, TPOT) also the fraction of requests over either.

    Raises:
        ValueError: no tier carries load (a bug: plans always serve some).
    """
    rng = np.random.default_rng(seed)
    live = [t for t in tiers if t.instances > 0 and t.rate_rps > 0]
    total = sum(t.rate_rps for t in live)
    if total <= 0:
        raise ValueError("no tier of the plan carries load")
    if arrivals is None:
        gaps = rng.exponential(1.0 / total, size=int(total * duration_s * 1.2) + 100)
        times = np.cumsum(gaps)
        times = times[times <= duration_s]
    else:
        times = np.sort(np.asarray(arrivals, dtype=float))
    probs = np.array([t.rate_rps / total for t in live])
    tier_of = rng.choice(len(live), size=len(times), p=probs)
    inst_of = rng.random(len(times))
    z_ttft = rng.standard_normal(len(times))
    z_tpot = rng.standard_normal(len(times))
    busy: list[list[list[float]]] = [[[] for _ in range(t.instances)] for t in live]
    ttft = np.full(len(times), math.inf)
    tpot = np.full(len(times), math.inf)
    whole = np.full(len(times), math.inf)
    for i, now in enumerate(times):
        ti = int(tier_of[i])
        tier = live[ti]
        heap = busy[ti][min(int(inst_of[i] * tier.instances), tier.instances - 1)]
        while heap and heap[0] <= now:
            heapq.heappop(heap)
        pt = tier.curve.at(len(heap) + 1)
        if pt is None:
            continue  # beyond the profiled concurrency: a miss
        ttft[i] = math.exp(lognormal_mu(pt.ttft_ms) + pt.ttft_sigma * z_ttft[i])
        tpot[i] = math.exp(lognormal_mu(pt.tpot_ms) + pt.tpot_sigma * z_tpot[i])
        hold_ms = ttft[i] + max(tier.curve.output_tokens - 1, 0) * tpot[i]
        whole[i] = hold_ms
        heapq.heappush(heap, float(now) + hold_ms / 1000.0)
    q = 100 * SLO_QUANTILES[percentile]
    per_tier = {}
    for ti, t in enumerate(live):
        mine = tier_of == ti
        per_tier[f"{t.curve.variant}@{t.curve.resource}"] = {
            "requests": float(mine.sum()),
            "ttft_ms": _pct(ttft[mine], q),
            "tpot_ms": _pct(tpot[mine], q),
        }
    return SimResult(
        requests=len(times),
        ttft_ms=_pct(ttft, q),
        tpot_ms=_pct(tpot, q),
        beyond=float(np.isinf(ttft).mean()) if len(times) else 0.0,
        tiers=per_tier,
        latency_ms={p: _pct(whole, 100 * at) for p, at in SLO_QUANTILES.items()},
        slo_violation_frac=None
        if slo_ms is None or not len(times)
        else float(((ttft > slo_ms[0]) | (tpot > slo_ms[1])).mean()),
    )


def _pct(values: np.ndarray, q: float) -> float:
    """The ``q`` percentile, infinite misses included (inf when they pass it)."""
    if values.size == 0:
        return math.nan
    return float(np.percentile(values, q, method="higher"))
