"""Analytic queueing approximations: the fast path planners call in their inner loops.

One name space over the queue models, each in its own module: M/G/c queues
(:mod:`greenctl.planner.core.mgc`), the serial CPU stages in front of a device, the executor
front and the dispatcher (:mod:`greenctl.planner.core.stages`), and dynamic batching
(:mod:`greenctl.planner.core.batch_latency`). Here: an instance's capacity at an SLO, which
combines the first two.

Conventions: rates in requests per second (``rate_rps``), times in milliseconds, ``q`` a
quantile such as 0.95; a latency is ``math.inf`` when the offered load reaches the capacity.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from greenctl.data.errors import InputError
from greenctl.planner.core.batch_latency import (
    BatchPrediction,
    as_batch_service,
    batch_capacity_at_slo,
    batch_capacity_rps,
    batch_latency_quantile_ms,
    batch_model,
    dynamic_batch,
)
from greenctl.planner.core.latency import ServiceTime, lognormal_smoothed_sf
from greenctl.planner.core.mgc import (
    LatencyModel,
    WaitTime,
    check_quantile,
    erlang_c,
    latency_quantile_ms,
    mgc_model,
    mgc_model_of,
    mgc_wait_quantile_ms,
    mixture_model,
    mixture_quantile,
    mixture_quantiles,
    pooled_latency_quantile_ms,
    pooled_shares,
    service_moments,
    wait_arrays,
    with_overhead,
)
from greenctl.planner.core.stages import (
    front_capacity_rps,
    front_wait,
    stage_wait,
    wait_growth,
    wait_moments,
    with_front,
    with_stage_wait,
)

__all__ = [
    "BatchPrediction",
    "LatencyModel",
    "WaitTime",
    "as_batch_service",
    "batch_capacity_at_slo",
    "batch_capacity_rps",
    "batch_latency_quantile_ms",
    "batch_model",
    "capacities_at_slo",
    "capacity_at_slo",
    "dynamic_batch",
    "erlang_c",
    "front_capacity_rps",
    "front_wait",
    "latency_quantile_ms",
    "mgc_model",
    "mgc_wait_quantile_ms",
    "mixture_model",
    "mixture_quantile",
    "mixture_quantiles",
    "pooled_latency_quantile_ms",
    "pooled_shares",
    "stage_wait",
    "wait_growth",
    "wait_moments",
    "with_front",
    "with_overhead",
    "with_stage_wait",
]


@lru_cache(maxsize=16384)
def capacity_at_slo(
    service: ServiceTime,
    *,
    servers: int = 1,
    slo_ms: float,
    percentile: float = 0.95,
    ca2: float = 1.0,
    front_ms: float = 0.0,
) -> float:
    """The largest rate (req/s) whose ``percentile`` latency stays within ``slo_ms``.

    ``servers`` identical instances behind one FIFO queue (:func:`latency_quantile_ms`'s model);
    the rate where ``P(T > slo)`` crosses ``1 - percentile``, found on a grid to about 1e-5 of
    capacity, rounded down, and cached. ``front_ms`` is an accelerator's executor front, a
    serial stage (:func:`with_front`) that caps the capacity at :func:`front_capacity_rps`.

    Returns:
        0.0 when the service time alone exceeds the SLO at that percentile.
    """
    check_quantile(percentile)
    if servers < 1:
        raise InputError(f"servers must be >= 1, got {servers}")
    if front_ms > 0 and servers != 1:
        raise InputError("an executor front is modeled per instance: servers must be 1")
    if service.quantile(percentile) > slo_ms:
        return 0.0
    cap = servers * 1000.0 / service.mean_ms
    target = 1.0 - percentile
    sf_slo = float(service.sf(np.array([float(slo_ms)]))[0])
    moments = service_moments(service)

    def fronted(rates: np.ndarray) -> np.ndarray:
        out = np.ones(rates.size)
        for k, r in enumerate(rates.tolist()):
            m = with_front(mgc_model_of(r, (service,), float(ca2)), r, front_ms, ca2=ca2)
            if m is not None:
                out[k] = float(m.sf(float(slo_ms))[0])
        return out

    def tails(rates: np.ndarray) -> np.ndarray:
        if front_ms > 0:
            return fronted(rates)
        c_prob, delay, exp_mean = wait_arrays(rates, moments, servers, ca2)
        finite = np.isfinite(delay)
        smoothed = np.ones(rates.size)
        if finite.any():
            smoothed[finite] = service.exp_smoothed_sf(
                slo_ms - delay[finite], 1.0 / exp_mean[finite]
            )
        out = (1.0 - c_prob) * sf_slo + c_prob * smoothed
        out[~finite] = 1.0
        return out

    lo, hi = 0.0, min(cap, front_capacity_rps(front_ms))
    for _ in range(4):
        rates = np.linspace(lo, hi, 17)
        bad = tails(rates[1:-1]) > target
        j = int(np.argmax(bad)) if bad.any() else 15
        lo, hi = float(rates[j]), float(rates[j + 1])
    return lo


def capacities_at_slo(
    services: Sequence[ServiceTime], slo_ms: Sequence[float], percentile: float = 0.95
) -> list[float]:
    """:func:`capacity_at_slo` of many single servers (Poisson arrivals, no executor front),
    ``services[k]`` within ``slo_ms[k]``: one vectorised grid search over all of them for
    deterministic and lognormal service (others one by one, cached).

    The same grid, tail tests and rounding as the one-server search, so the same
    capacities (to the last bits of the quadrature's sums); a mix problem over thousands
    of latency profiles sizes them in a few array passes instead of thousands of searches.
    """
    check_quantile(percentile)
    out = [0.0] * len(services)
    rows: list[int] = []
    for k, (s, limit) in enumerate(zip(services, slo_ms, strict=True)):
        if s.quantile(percentile) > limit:
            continue
        if s.kind == "exponential":
            out[k] = capacity_at_slo(s, slo_ms=float(limit), percentile=percentile)
        else:
            rows.append(k)
    if not rows:
        return out
    svc = [services[k] for k in rows]
    slo = np.array([float(slo_ms[k]) for k in rows])[:, None]
    mean = np.array([s.mean_ms for s in svc])[:, None]
    moments = (mean, np.array([s.moment(2) for s in svc])[:, None],
               np.array([s.moment(3) for s in svc])[:, None])  # fmt: skip
    sf_slo = np.array(
        [float(s.sf(np.array([float(slo_ms[k])]))[0]) for s, k in zip(svc, rows, strict=True)]
    )
    logn = np.array([s.kind == "lognormal" for s in svc])
    shift = np.array([s.shift_ms for s in svc])[:, None]
    scale = np.array([s.scale_ms if s.kind == "lognormal" else 1.0 for s in svc])[:, None]
    sigma = np.array([s.sigma if s.kind == "lognormal" else 1.0 for s in svc])[:, None]
    target = 1.0 - percentile
    at = np.arange(len(rows))
    lo, hi = np.zeros(len(rows)), 1000.0 / mean[:, 0]
    for _ in range(4):
        rates = np.linspace(lo, hi, 17, axis=1)
        inner = rates[:, 1:-1]
        c_prob, delay, exp_mean = wait_arrays(inner, moments, 1, 1.0)
        finite = np.isfinite(delay)
        smoothed = np.ones(inner.shape)
        theta = 1.0 / exp_mean
        x = np.maximum((slo - delay) - shift, 0.0)
        det = finite & ~logn[:, None]
        smoothed[det] = np.exp(-theta[det] * x[det])
        ln = finite & logn[:, None]
        if ln.any():
            shape = np.broadcast_to
            smoothed[ln] = lognormal_smoothed_sf(
                x[ln], theta[ln], shape(scale, x.shape)[ln], shape(sigma, x.shape)[ln], erfc=True
            )
        tails = (1.0 - c_prob) * sf_slo[:, None] + c_prob * smoothed
        tails[~finite] = 1.0
        bad = tails > target
        j = np.where(bad.any(axis=1), np.argmax(bad, axis=1), 15)
        lo, hi = rates[at, j], rates[at, j + 1]
    for i, k in enumerate(rows):
        out[k] = float(lo[i])
    return out
