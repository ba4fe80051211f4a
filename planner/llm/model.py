"""The queueing model of one LLM instance on its profiled batching curve.

A profile measured an instance at a few concurrencies (streams in flight): TTFT and TPOT
percentiles and requests/s. A request holds its stream for ``T(k) = TTFT(k) + (M-1) TPOT(k)``
at ``k`` streams (``M`` output tokens; linear between profiled points), and the streams an
arrival finds follow the birth-death law where each of ``k`` streams ends at rate ``1/T(k)``
(Poisson, Little's ``c = rate x T``, on a flat curve). Each point is a lognormal fitted to
its p50 and tail, and a percentile is that of their mixture; past the largest profiled
concurrency nothing is trusted (such arrivals miss). Other lengths: TTFT scales with the
prompt tokens, TPOT stays per token, a request's time follows ``M`` (docs/llm-planning.md).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from greenctl.data.limits import SLO_QUANTILES
from greenctl.data.llm_profiles import LLMProfile

#: the standard normal quantile of each percentile (a lognormal's spread is fitted with it)
Z = {"p50": 0.0, "p95": 1.6448536269514722, "p99": 2.3263478740408408}
#: the Poisson tail left out of the arrival-concurrency law
_TAIL = 1e-9


@dataclass(frozen=True)
class CurvePoint:
    """One profiled concurrency at the request's lengths (times in ms)."""

    concurrency: float
    ttft_ms: float  # median
    ttft_sigma: float  # lognormal spread (0: constant)
    tpot_ms: float
    tpot_sigma: float
    requests_per_s: float | None
    energy_j: float | None  # whole energy of one request at this concurrency (J)


@dataclass(frozen=True)
class TierCurve:
    """One tier (variant) on one resource: its batching curve and what it draws."""

    variant: str
    resource: str
    engine: str
    quality: float
    output_tokens: float
    points: tuple[CurvePoint, ...]
    idle_w: float
    cost_per_hour: float | None
    energy_method: str
    workload: dict[str, object]

    @property
    def max_concurrency(self) -> float:
        return self.points[-1].concurrency

    def at(self, n: float) -> CurvePoint | None:
        """The curve at ``n`` streams: linear between profiled points, the smallest point's
        below it, None above the largest (not trusted)."""
        pts = self.points
        if n > pts[-1].concurrency + 1e-9:
            return None
        if n <= pts[0].concurrency:
            return pts[0]
        for lo, hi in itertools.pairwise(pts):
            if n <= hi.concurrency:
                w = (n - lo.concurrency) / (hi.concurrency - lo.concurrency)
                return CurvePoint(
                    n,
                    _mix(lo.ttft_ms, hi.ttft_ms, w),
                    _mix(lo.ttft_sigma, hi.ttft_sigma, w),
                    _mix(lo.tpot_ms, hi.tpot_ms, w),
                    _mix(lo.tpot_sigma, hi.tpot_sigma, w),
                    _opt_mix(lo.requests_per_s, hi.requests_per_s, w),
                    _opt_mix(lo.energy_j, hi.energy_j, w),
                )
        return pts[-1]

    def request_ms(self, point: CurvePoint) -> float:
        """Mean time in the instance of a request served at ``point``."""
        return _mean(point.ttft_ms, point.ttft_sigma) + max(self.output_tokens - 1, 0) * _mean(
            point.tpot_ms, point.tpot_sigma
        )


@dataclass(frozen=True)
class OperatingPoint:
    """One instance of a tier serving ``rate_rps``: what the model predicts."""

    rate_rps: float
    concurrency: float  # mean streams in flight
    ttft_ms: float  # at the request's percentile
    tpot_ms: float
    latency_ms: float  # TTFT + (M-1) TPOT at the percentile (an upper figure)
    energy_j_per_request: float | None  # whole energy per request (idle share included)
    dynamic_j_per_request: float | None  # above idle power


def tier_curve(
    rows: Sequence[LLMProfile],
    *,
    quality: float,
    percentile: str,
    prompt_tokens: float | None = None,
    output_tokens: float | None = None,
) -> TierCurve:
    """The curve of one (variant, resource) profile run at the request's lengths (None: as
    profiled). TTFT and TPOT are made non-decreasing in concurrency (a noisy row is taken at
    the running maximum: more streams never make a token faster)."""
    rows = sorted(rows, key=lambda r: r.concurrency)
    first = rows[0]
    profiled_out = first.output_tokens or output_tokens or 1.0
    out = float(output_tokens if output_tokens is not None else profiled_out)
    pts: list[CurvePoint] = []
    top = [0.0, 0.0, 0.0, 0.0]
    for r in rows:
        prompt_in = float(r.prompt_tokens or prompt_tokens or 1.0)
        prompt = float(prompt_tokens if prompt_tokens is not None else prompt_in)
        scale = prompt / prompt_in if prompt_in > 0 else 1.0
        ttft50 = float(r.ttft_p50_ms or 0.0) * scale
        tpot50 = float(r.tpot_p50_ms or 0.0)
        ttft_tail, z_t = _tail(r, "ttft", percentile)
        tpot_tail, z_p = _tail(r, "tpot", percentile)
        top = [
            max(top[0], ttft50),
            max(top[1], ttft_tail * scale if ttft_tail else ttft50),
            max(top[2], tpot50),
            max(top[3], tpot_tail or tpot50),
        ]
        pts.append(
            CurvePoint(
                float(r.concurrency),
                top[0],
                _sigma(top[0], top[1], z_t),
                top[2],
                _sigma(top[2], top[3], z_p),
                r.requests_per_s,
                _energy(r, prompt, out),
            )
        )
    return TierCurve(
        variant=first.variant,
        resource=first.resource,
        engine=first.engine,
        quality=float(quality),
        output_tokens=out,
        points=tuple(pts),
        idle_w=float(first.idle_power_w or 0.0),
        cost_per_hour=first.cost_per_hour,
        energy_method=first.energy_method,
        workload=first.workload_dict,
    )


def operating_point(tier: TierCurve, rate_rps: float, percentile: str) -> OperatingPoint | None:
    """What one instance of ``tier`` does at ``rate_rps`` (req/s); None when the load drives
    the percentile's arrivals past the largest profiled concurrency (not trusted)."""
    q = SLO_QUANTILES[percentile]
    law = streams_law(tier, rate_rps)
    c = sum(k * p for k, p in law)
    comps: list[tuple[float, CurvePoint | None]] = [(p, tier.at(k + 1)) for k, p in law]
    trusted = sum(p for p, pt in comps if pt is not None)
    if trusted < q - 1e-12:
        return None
    ttft = _mixture_quantile([(p, pt.ttft_ms, pt.ttft_sigma) for p, pt in comps if pt], q)
    tpot = _mixture_quantile([(p, pt.tpot_ms, pt.tpot_sigma) for p, pt in comps if pt], q)
    energy, dynamic = _energy_at(tier, c)
    return OperatingPoint(
        rate_rps=rate_rps,
        concurrency=c,
        ttft_ms=ttft,
        tpot_ms=tpot,
        latency_ms=ttft + max(tier.output_tokens - 1, 0) * tpot,
        energy_j_per_request=energy,
        dynamic_j_per_request=dynamic,
    )


def slo_miss(tier: TierCurve, rate_rps: float, ttft_ms: float, tpot_ms: float) -> float:
    """The fraction of requests over either SLO at ``rate_rps``: over the streams an arrival
    finds, the chance its TTFT or its TPOT (drawn apart) misses; arrivals past the profiled
    concurrency miss."""
    miss = 0.0
    for k, p in streams_law(tier, rate_rps):
        pt = tier.at(k + 1)
        if pt is None:
            miss += p
            continue
        ok = _below(ttft_ms, pt.ttft_ms, pt.ttft_sigma) * _below(tpot_ms, pt.tpot_ms, pt.tpot_sigma)
        miss += p * (1 - ok)
    return min(max(miss, 0.0), 1.0)


def _below(limit: float, median: float, sigma: float) -> float:
    """P(X <= limit) of a lognormal of ``median`` and ``sigma``."""
    if limit <= 0:
        return 0.0
    z = math.log(limit) - lognormal_mu(median)
    if sigma <= 1e-12:
        return 1.0 if z >= 0 else 0.0
    return 0.5 * (1 + math.erf(z / (sigma * math.sqrt(2))))


def streams_law(tier: TierCurve, rate_rps: float) -> list[tuple[int, float]]:
    """``(k, P(k))``: the streams an arrival finds at ``rate_rps`` (req/s), the stationary
    law of a birth-death queue where each of ``k`` streams ends at rate ``1 / T(k)`` (``T``
    the mean time of a request served at ``k`` streams; beyond the profiled concurrency the
    largest one's). Poisson when ``T`` is flat; heavier as the curve climbs. Its tail below
    1e-9 is left out and the rest renormalised."""
    if rate_rps <= 0:
        return [(0, 1.0)]
    cmax = tier.max_concurrency
    terms = [1.0]
    total = 1.0
    k = 0
    while k < 100_000:
        k += 1
        pt = tier.at(k) or tier.points[-1]
        nxt = terms[-1] * rate_rps * tier.request_ms(pt) / 1000.0 / k
        if not math.isfinite(nxt) or nxt > 1e300:
            break
        terms.append(nxt)
        total += nxt
        if k > cmax and nxt <= _TAIL * total:
            break
    return [(i, t / total) for i, t in enumerate(terms)]


def concurrency(tier: TierCurve, rate_rps: float) -> float:
    """The mean streams in flight at ``rate_rps`` (the mean of :func:`streams_law`)."""
    return sum(k * p for k, p in streams_law(tier, rate_rps))


def capacity(tier: TierCurve, ttft_ms: float, tpot_ms: float, percentile: str) -> float:
    """The largest rate (req/s) one instance serves with the percentile's TTFT and TPOT
    within the SLOs; 0 when it meets them at no load."""

    def ok(rate: float) -> bool:
        op = operating_point(tier, rate, percentile)
        return op is not None and op.ttft_ms <= ttft_ms and op.tpot_ms <= tpot_ms

    tiny = 1e-9
    if not ok(tiny):
        return 0.0
    fastest = min(tier.request_ms(p) for p in tier.points) / 1000.0
    lo, hi = tiny, max(tier.max_concurrency / max(fastest, 1e-9), 1e-6) * 2
    while ok(hi):  # the curve's requests finish faster than its concurrency bounds
        lo, hi = hi, hi * 2
        if hi > 1e9:
            return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-7 * hi:
            break
    return lo


def lognormal_mu(median_ms: float) -> float:
    return math.log(max(median_ms, 1e-9))


def _mixture_quantile(comps: list[tuple[float, float, float]], q: float) -> float:
    """The ``q`` quantile of a mixture of lognormals ``(weight, median, sigma)`` whose
    weights may sum to less than 1 (the rest counts as beyond any time)."""

    def cdf(t: float) -> float:
        lt = math.log(t)
        out = 0.0
        for w, med, sig in comps:
            mu = lognormal_mu(med)
            if sig <= 1e-12:
                out += w if lt >= mu else 0.0
            else:
                out += w * 0.5 * (1 + math.erf((lt - mu) / (sig * math.sqrt(2))))
        return out

    lo = min(math.exp(lognormal_mu(m) - 10 * s) for _, m, s in comps)
    hi = max(math.exp(lognormal_mu(m) + 10 * s) for _, m, s in comps)
    if cdf(lo) >= q:
        return lo
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if cdf(mid) >= q:
            hi = mid
        else:
            lo = mid
        if hi / lo - 1 <= 1e-9:
            break
    return hi


def _tail(row: LLMProfile, what: str, percentile: str) -> tuple[float | None, float]:
    """The row's figure at the request's percentile (p95 standing in for p50's spread)."""
    pct = percentile if percentile != "p50" else "p95"
    value = getattr(row, f"{what}_{pct}_ms")
    if value is None:  # the other tail percentile, fitted with its own z
        other = "p99" if pct == "p95" else "p95"
        value, pct = getattr(row, f"{what}_{other}_ms"), other
    return (None if value is None else float(value)), Z[pct]


def _sigma(median: float, tail: float, z: float) -> float:
    if median <= 0 or tail <= median or z <= 0:
        return 0.0
    return math.log(tail / median) / z


def _mean(median: float, sigma: float) -> float:
    return median * math.exp(0.5 * sigma * sigma)


def _energy(row: LLMProfile, prompt: float, output: float) -> float | None:
    """Whole energy of one request (J): the phase figures at the request's lengths, else
    power over requests/s."""
    joules = row.joules_per_request(prompt, output)
    if joules is None and row.power_w is not None and row.requests_per_s:
        joules = float(row.power_w) / float(row.requests_per_s)
    return joules


def _energy_at(tier: TierCurve, c: float) -> tuple[float | None, float | None]:
    """Whole and dynamic (above idle) energy per request at ``c`` mean streams. The
    profiled figures hold the instance's whole power while serving: its idle share per
    request is idle watts over the requests/s."""
    pt = tier.at(max(c, tier.points[0].concurrency)) or tier.points[-1]
    if pt.energy_j is None:
        return None, None
    idle_share = tier.idle_w / pt.requests_per_s if pt.requests_per_s else 0.0
    return pt.energy_j, max(pt.energy_j - idle_share, 0.0)


def _mix(a: float, b: float, w: float) -> float:
    return a + (b - a) * w


def _opt_mix(a: float | None, b: float | None, w: float) -> float | None:
    return None if a is None or b is None else _mix(a, b, w)
