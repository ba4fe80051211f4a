"""M/G/c queues: the waits, latency distributions and quantiles planners call in inner loops.

Rates in requests per second, times in ms, ``q`` a quantile such as 0.95; a latency is
``math.inf`` when the load reaches the capacity. Every queue of a plan is M/G/c with the
Allen-Cunneen correction: the wait probability is Erlang C, the conditional wait a
shifted exponential with the Allen-Cunneen mean and the exact M/G/1 squared coefficient
of variation (so deterministic service waits a residual, not an exponential), and the
latency ``T = W + S`` with ``W`` and ``S`` independent, its quantile found by a vectorised
grid search (closed form for deterministic service). Results are cached
(``functools.lru_cache``): planners evaluate the same configuration many times.
See docs/simulate.md ("One service model").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.planner.core.latency import ServiceTime, lognormal_terms

_GRID = 33  # points per level of the quantile grid search
_LEVELS = 2


def check_quantile(q: float) -> None:
    if not 0.0 < q < 1.0:
        raise InputError(f"quantile must be strictly between 0 and 1, got {q}")


@lru_cache(maxsize=65536)
def erlang_c(servers: int, offered_load: float) -> float:
    """Erlang C: the probability that an arrival waits in an M/M/c queue.

    Computed through the Erlang B recursion ``B_k = a B_{k-1} / (k + a B_{k-1})``, which
    never overflows (stable for thousands of servers).

    Args:
        servers: number of servers ``c`` (>= 1).
        offered_load: ``a = arrival rate x mean service time`` in Erlangs.

    Returns:
        P(wait > 0); 1.0 when ``a >= c`` (unstable), 0.0 when ``a <= 0``.
    """
    if servers < 1:
        raise InputError(f"servers must be >= 1, got {servers}")
    a = float(offered_load)
    if a <= 0:
        return 0.0
    if a >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = a * b / (k + a * b)
    return servers * b / (servers - a * (1.0 - b))


@dataclass(frozen=True)
class WaitTime:
    """The waiting time before service: 0 with probability ``c_prob`` not waiting, else
    ``delay_ms`` plus an exponential of mean ``exp_mean_ms`` (a shifted exponential with
    the conditional mean and squared coefficient of variation of the wait)."""

    c_prob: float
    delay_ms: float
    exp_mean_ms: float

    @property
    def cond_mean_ms(self) -> float:
        """E[W | W > 0]."""
        return self.delay_ms + self.exp_mean_ms

    def sf(self, x: np.ndarray) -> np.ndarray:
        """P(W > x | W > 0) for x >= 0."""
        return np.minimum(np.exp(-(np.asarray(x) - self.delay_ms) / self.exp_mean_ms), 1.0)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of W (0 when fewer than ``1 - q`` wait)."""
        if self.c_prob <= 1.0 - q:
            return 0.0
        return self.delay_ms - math.log((1.0 - q) / self.c_prob) * self.exp_mean_ms


def _cond_wait_scv(mean: float, m2: float, m3: float, rho: float) -> float:
    """Squared coefficient of variation of the conditional wait in an M/G/1 queue at ``rho``.

    From the Pollaczek-Khinchine and Takacs moments of W: exactly 1 for exponential
    service, 1/3 .. 1 for deterministic service as the load rises (a request that queues
    behind one job waits for that job's residual, far from exponential at light load).
    Simulated M/D/c queues show about the same value for every c, so it is used for all.
    """
    rho = min(max(rho, 1e-9), 1.0 - 1e-9)
    m1_1 = m2 / (2.0 * mean * (1.0 - rho))  # E[W | W > 0]
    ew = rho * m1_1
    m2_1 = 2.0 * ew * ew / rho + m3 / (3.0 * mean * (1.0 - rho))
    scv = m2_1 / (m1_1 * m1_1) - 1.0
    if not math.isfinite(scv) or scv <= 0:
        return 1.0
    return scv


def wait_time(
    rate_rps: float, moments: tuple[float, float, float], servers: int, ca2: float
) -> WaitTime | None:
    """The M/G/c wait: Erlang C, Allen-Cunneen conditional mean, M/G/1 conditional scv
    (as a shifted exponential; scv >= 1 stays exponential); None if unstable.
    ``moments`` are E[S], E[S^2], E[S^3] (ms)."""
    mean, m2, m3 = moments
    lam = rate_rps / 1000.0
    a = lam * mean
    if a >= servers:
        return None
    if lam <= 0:
        return WaitTime(0.0, 0.0, mean)
    scv = max(m2 / (mean * mean) - 1.0, 0.0)
    cond_mean = max(ca2 + scv, 1e-12) / 2.0 / (servers / mean - lam)
    root = math.sqrt(min(_cond_wait_scv(mean, m2, m3, a / servers), 1.0))
    return WaitTime(erlang_c(servers, a), cond_mean * (1.0 - root), cond_mean * root)


def wait_arrays(
    rates_rps: np.ndarray, moments: tuple[Any, Any, Any], servers: int, ca2: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`wait_time` for many rates at once: (P(wait), delay, exponential mean), with
    an infinite delay where the rate reaches capacity. The moments may be arrays that
    broadcast against the rates (one service per row)."""
    mean, m2, m3 = moments
    lam = np.maximum(np.asarray(rates_rps, dtype=float), 0.0) / 1000.0
    a = lam * mean
    stable = a < servers
    a_s = np.where(stable, a, 0.0)
    b = np.ones_like(a_s)  # Erlang B recursion, vectorised over the rates
    for k in range(1, servers + 1):
        b = a_s * b / (k + a_s * b)
    c_prob = np.where(stable, servers * b / (servers - a_s * (1.0 - b)), 1.0)
    scv = np.maximum(m2 / (mean * mean) - 1.0, 0.0)
    slack = np.where(stable, servers / mean - lam, 1.0)
    cond_mean = np.maximum(ca2 + scv, 1e-12) / 2.0 / slack
    rho = np.clip(a_s / servers, 1e-9, 1.0 - 1e-9)
    m1_1 = m2 / (2.0 * mean * (1.0 - rho))
    m2_1 = 2.0 * rho * m1_1 * m1_1 + m3 / (3.0 * mean * (1.0 - rho))
    v = m2_1 / (m1_1 * m1_1) - 1.0
    v = np.where(np.isfinite(v) & (v > 0), np.minimum(v, 1.0), 1.0)
    root = np.sqrt(v)
    delay = np.where(stable, cond_mean * (1.0 - root), np.inf)
    exp_mean = np.where(stable, cond_mean * root, 1.0)
    return c_prob, delay, exp_mean


def service_moments(service: ServiceTime) -> tuple[float, float, float]:
    return service.mean_ms, service.moment(2), service.moment(3)


@lru_cache(maxsize=65536)
def mgc_wait_quantile_ms(
    rate_rps: float, service: ServiceTime, servers: int, q: float, *, ca2: float = 1.0
) -> float:
    """The ``q`` quantile of the waiting time (before service) in an M/G/c queue, ms.

    ``P(W > 0)`` is Erlang C, ``E[W | W > 0]`` Allen-Cunneen, and the conditional wait a
    shifted exponential with the M/G/1 variability (exponential for exponential service;
    see module docstring).

    Returns:
        0.0 when fewer than ``1 - q`` of requests wait; ``math.inf`` when
        ``rate_rps >= servers * 1000 / service.mean_ms``.
    """
    check_quantile(q)
    if rate_rps <= 0:
        return 0.0
    wait = wait_time(rate_rps, service_moments(service), servers, ca2)
    return math.inf if wait is None else wait.quantile(q)


def _exp_wait_quantile(c_prob: float, theta: float, q: float) -> float:
    if c_prob <= 1.0 - q:
        return 0.0
    return math.log(c_prob / (1.0 - q)) / theta


class LatencyModel:
    """An end-to-end latency distribution of one queue: survival function and quantiles.

    Built by :func:`mgc_model` or :func:`batch_model`; several combine with
    :func:`mixture_quantile` (requests of different queues pooled into one distribution).
    """

    def __init__(
        self,
        tail: Callable[[np.ndarray], np.ndarray],
        bracket: Callable[[float], tuple[float, float]],
        exact: Callable[[float], float] | None = None,
    ) -> None:
        self._tail = tail
        self._bracket = bracket
        self._exact = exact

    def sf(self, t_ms: np.ndarray | float) -> np.ndarray:
        """P(T > t) for an array of times in ms."""
        return self._tail(np.atleast_1d(np.asarray(t_ms, dtype=float)))

    def bracket(self, q: float) -> tuple[float, float]:
        """An interval that holds (or starts the search for) the ``q`` quantile."""
        return self._bracket(q)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in ms."""
        check_quantile(q)
        if self._exact is not None:
            return self._exact(q)
        lo, hi = self._bracket(q)
        return grid_quantile(self._tail, q, lo, hi)


def mixture_model(parts: Sequence[tuple[float, LatencyModel | None]]) -> LatencyModel | None:
    """One latency model of requests that follow ``parts[k]``'s with weight ``w_k`` (weights
    need not sum to 1); None when a part with weight is None (overloaded)."""
    live = [(float(w), m) for w, m in parts if w > 0]
    if not live or any(m is None for _, m in live):
        return None
    items = [(w, m) for w, m in live if m is not None]
    if len(items) == 1:
        return items[0][1]
    total = sum(w for w, _ in items)

    def tail(t: np.ndarray) -> np.ndarray:
        out = np.zeros_like(t)
        for w, m in items:
            out += (w / total) * m.sf(t)
        return out

    def bracket(q: float) -> tuple[float, float]:
        ends = [m.bracket(q) for _, m in items]
        lo = min(b[0] for b in ends)
        return lo, max(max(b[1] for b in ends), lo * 1.001 + 1e-9)

    return LatencyModel(tail, bracket)


def mixture_quantile(parts: Sequence[tuple[float, LatencyModel]], q: float) -> float:
    """The ``q`` quantile of a mixture of latency models with the given weights."""
    return mixture_quantiles(parts, (q,))[0]


def mixture_quantiles(
    parts: Sequence[tuple[float, LatencyModel]], qs: Sequence[float]
) -> list[float]:
    """Several quantiles of a mixture of latency models (weights need not sum to 1).

    Parts that share a model (identical instances) are merged; the quantiles share the
    first, coarse grid of the search.
    """
    for q in qs:
        check_quantile(q)
    merged: dict[int, list[Any]] = {}
    for w, m in parts:
        if w > 0:
            merged.setdefault(id(m), [0.0, m])[0] += w
    if not merged:
        return [math.nan for _ in qs]
    items = [(float(w), m) for w, m in merged.values()]
    if len(items) == 1:
        return [items[0][1].quantile(q) for q in qs]
    total = sum(w for w, _ in items)

    def tail(t: np.ndarray) -> np.ndarray:
        out = np.zeros_like(t)
        for w, m in items:
            out += (w / total) * m.sf(t)
        return out

    brackets = [m.bracket(q) for q in qs for _, m in items]
    lo = min(b[0] for b in brackets)
    hi = max(max(b[1] for b in brackets), lo * 1.001 + 1e-9)
    ts = np.linspace(lo, hi, 4 * _GRID)
    vals = tail(ts)
    out = []
    for q in qs:
        target = 1.0 - q
        ok = vals <= target
        if not ok.any():
            out.append(grid_quantile(tail, q, float(ts[-1]), 2 * float(ts[-1]) - lo))
            continue
        j = int(np.argmax(ok))
        if j == 0:
            out.append(float(ts[0]))
            continue
        out.append(grid_quantile(tail, q, float(ts[j - 1]), float(ts[j]), levels=1))
    return out


def with_overhead(model: LatencyModel, overhead_ms: Sequence[float] | np.ndarray) -> LatencyModel:
    """``T + O``: a queue's latency plus an independent overhead given by equiprobable samples.

    ``overhead_ms`` are points of the overhead's distribution (for example 100 midpoint
    quantiles of a measured serving path: client, dispatcher and executor hops); the
    survival function is the average of ``P(T > t - o)`` over them.

    Raises:
        InputError: no samples, or a negative or non-finite one.
    """
    o = np.sort(np.asarray(overhead_ms, dtype=float).ravel())
    if o.size == 0 or not np.all(np.isfinite(o)) or float(o[0]) < 0:
        raise InputError("serving overhead samples must be finite, >= 0 ms and not empty")
    lo_o, hi_o = float(o[0]), float(o[-1])

    def tail(t: np.ndarray) -> np.ndarray:
        shifted = (t[:, None] - o[None, :]).ravel()
        vals = np.ones_like(shifted)
        pos = shifted > 0
        if pos.any():
            vals[pos] = model.sf(shifted[pos])
        return vals.reshape(t.shape[0], o.size).mean(axis=1)

    def bracket(q: float) -> tuple[float, float]:
        lo, hi = model.bracket(q)
        return lo + lo_o, max(hi + hi_o, (lo + lo_o) * 1.001 + 1e-9)

    return LatencyModel(tail, bracket)


def mgc_model(
    rate_rps: float,
    services: Sequence[ServiceTime],
    *,
    ca2: float = 1.0,
    demand_ms: float = 0.0,
) -> LatencyModel | None:
    """Latency model of one FIFO queue over ``len(services)`` servers; None if overloaded.

    Identical servers: M/G/c with Erlang C and the Allen-Cunneen wait (module docstring).
    Heterogeneous servers: the pooled approximation of :func:`pooled_latency_quantile_ms`.

    ``demand_ms`` is extra work each request puts on its server that delays the requests
    behind it but is not part of its own latency here (an executor's request handling on the
    instance's cores, whose own share is counted in the measured serving path): the wait
    is that of service + ``demand_ms``, the request's own time the plain service.
    """
    if not services:
        return None
    key = tuple(sorted(services, key=lambda s: (s.kind, s.shift_ms, s.scale_ms, s.sigma)))
    return mgc_model_of(float(rate_rps), key, float(ca2), max(float(demand_ms), 0.0))


def shifted_model(model: LatencyModel, delta_ms: float) -> LatencyModel:
    """``T + delta`` (delta may be negative when T >= -delta surely)."""

    def tail(t: np.ndarray) -> np.ndarray:
        return model.sf(t - delta_ms)

    def bracket(q: float) -> tuple[float, float]:
        lo, hi = model.bracket(q)
        return lo + delta_ms, hi + delta_ms

    return LatencyModel(tail, bracket, lambda q: model.quantile(q) + delta_ms)


@lru_cache(maxsize=16384)
def mgc_model_of(
    rate_rps: float, services: tuple[ServiceTime, ...], ca2: float, demand_ms: float = 0.0
) -> LatencyModel | None:
    c = len(services)
    lam = max(rate_rps, 0.0) / 1000.0
    if demand_ms > 0:
        # W + (S + d) of the loaded servers, less d: their wait, each request's plain service
        full = mgc_model_of(rate_rps, tuple(s.shifted(demand_ms) for s in services), ca2)
        return None if full is None else shifted_model(full, -demand_ms)
    if len(set(services)) == 1:
        service = services[0]
        wait = wait_time(lam * 1000.0, service_moments(service), c, ca2)
        if wait is None:
            return None
        return _wait_plus_service_model(wait, ((1.0, service),))
    mus = np.array([1.0 / s.mean_ms for s in services])
    total_mu = float(mus.sum())
    rho = lam / total_mu
    if rho >= 1.0:
        return None
    weights = _pooled_shares(lam * 1000.0, services)
    mix = tuple(float(weights @ np.array([s.moment(k) for s in services])) for k in (1, 2, 3))
    # Pooled servers: the mixture's moments, at the pooled capacity's utilisation.
    pooled_mean = c / total_mu
    scale = pooled_mean / mix[0]  # keep the mixture's shape, match the pooled capacity
    moments = (pooled_mean, mix[1] * scale**2, mix[2] * scale**3)
    wait = wait_time(lam * 1000.0, moments, c, ca2)
    if wait is None:
        return None
    comps = tuple((float(w), s) for w, s in zip(weights, services, strict=True))
    return _wait_plus_service_model(wait, comps)


def _erlang_b(servers: int, offered_load: float) -> float:
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return b


def pooled_shares(rate_rps: float, services: Sequence[ServiceTime]) -> np.ndarray:
    """The fraction of requests each server of one FIFO queue serves (same order).

    The dispatcher gives a request to the fastest idle server, else the first to free up.
    Requests that find a server idle (probability ``1 - C``) fill servers in order of
    speed, an ordered-entry system: server ``k`` takes the overflow of the ``k - 1``
    faster ones, ``B_{k-1} - B_k`` with ``B_k`` Erlang B of the first ``k`` servers at their
    mean speed. Requests that queue (probability ``C``) go to whichever server frees first,
    in proportion to speed. Checked against the simulator within a few % for instances up
    to 5x apart in speed; with extreme differences (tens of x) it over-states the slow
    instances' share and the p95 (conservative: 122 ms predicted vs 67-97 ms simulated for
    one 2.4 ms and two 105 ms instances at 20-60 % load).
    """
    return _pooled_shares(float(rate_rps), tuple(services))


@lru_cache(maxsize=16384)
def _pooled_shares(rate_rps: float, services: tuple[ServiceTime, ...]) -> np.ndarray:
    c = len(services)
    mus = np.array([1.0 / s.mean_ms for s in services])
    total_mu = float(mus.sum())
    lam = max(rate_rps, 0.0) / 1000.0
    order = np.argsort(-mus, kind="stable")
    if lam <= 0:
        out = np.zeros(c)
        out[order[0]] = 1.0
        return out
    a = min(lam / total_mu, 1.0 - 1e-12) * c
    c_prob = erlang_c(c, a)
    overflow = [1.0]
    cum = 0.0
    for k, i in enumerate(order, start=1):
        cum += mus[i]
        overflow.append(_erlang_b(k, lam * k / cum))
    carried = -np.diff(np.array(overflow))
    carried = np.maximum(carried, 0.0)
    entry = np.zeros(c)
    entry[order] = carried / carried.sum() if carried.sum() > 0 else 1.0 / c
    return (1.0 - c_prob) * entry + c_prob * mus / total_mu


def _wait_plus_service_model(
    wait: WaitTime, comps: tuple[tuple[float, ServiceTime], ...]
) -> LatencyModel:
    """W + S, W independent of S, S a mixture of ``comps``."""
    c_prob = wait.c_prob

    theta = 1.0 / wait.exp_mean_ms
    logn = tuple(s for _, s in comps if s.kind == "lognormal")
    logn_w = np.array([w for w, s in comps if s.kind == "lognormal"])
    others = tuple((w, s) for w, s in comps if s.kind != "lognormal")

    def tail(t: np.ndarray) -> np.ndarray:
        out = np.zeros_like(t)
        if len(logn) > 1:  # one vectorised pass over every lognormal component
            sf, es = lognormal_terms(logn, t, wait.delay_ms, theta)
            out += logn_w @ ((1.0 - c_prob) * sf + c_prob * es)
        rest = others if len(logn) > 1 else comps
        for w, s in rest:
            part = (1.0 - c_prob) * s.sf(t)
            if c_prob > 0:
                part = part + c_prob * s.exp_smoothed_sf(t - wait.delay_ms, theta)
            out += w * part
        return out

    def bracket(q: float) -> tuple[float, float]:
        lo = min(s.quantile(q) for _, s in comps)
        hi = max(s.quantile(q) for _, s in comps) + wait.quantile(q)
        return lo, max(hi, lo * 1.001 + 1e-9)

    exact = None
    if len(comps) == 1 and comps[0][1].kind == "deterministic":
        d = comps[0][1].shift_ms

        def exact(q: float) -> float:
            return d + wait.quantile(q)

    return LatencyModel(tail, bracket, exact)


@lru_cache(maxsize=65536)
def latency_quantile_ms(
    rate_rps: float, service: ServiceTime, servers: int, q: float, *, ca2: float = 1.0
) -> float:
    """The ``q`` quantile of end-to-end latency (wait + service) in an M/G/c queue, ms.

    ``servers`` identical instances behind one FIFO queue. See the module docstring for
    the approximation (Erlang C x Allen-Cunneen exponential wait, convolved with the
    service-time distribution).

    Returns:
        ``math.inf`` when the load reaches capacity (``rate >= servers / E[S]``).
    """
    check_quantile(q)
    if servers < 1:
        raise InputError(f"servers must be >= 1, got {servers}")
    if rate_rps <= 0:
        return service.quantile(q)
    model = mgc_model_of(float(rate_rps), (service,) * servers, float(ca2))
    return math.inf if model is None else model.quantile(q)


def pooled_latency_quantile_ms(
    rate_rps: float, services: Sequence[ServiceTime], q: float, *, ca2: float = 1.0
) -> float:
    """End-to-end latency quantile of one FIFO queue over heterogeneous servers, ms.

    ``services[i]`` is server ``i``'s service time; the dispatcher gives a request to the
    fastest idle server. Approximation: an M/G/c queue with ``c = len(services)`` servers
    of the pooled capacity (``sum mu_i``, Erlang C at ``a = c rate / sum mu_i``); requests
    are served by server ``i`` with the weights of :func:`pooled_shares`, and the service
    part of the latency is that mixture of the servers' distributions, whose moments
    (heterogeneity included, scaled to the pooled mean) feed the wait.
    """
    check_quantile(q)
    model = mgc_model(rate_rps, services, ca2=ca2)
    return math.inf if model is None else model.quantile(q)


def grid_quantile(
    tail: Callable[[np.ndarray], np.ndarray],
    q: float,
    lo: float,
    hi: float,
    levels: int = _LEVELS,
) -> float:
    """Smallest ``t`` in ``[lo, inf)`` with ``tail(t) <= 1 - q`` (``tail`` non-increasing).

    A grid of ``_GRID`` points over the bracket (widened until it holds the answer), then
    ``_LEVELS - 1`` finer grids inside the cell that holds it, then linear interpolation:
    typically two vectorised evaluations of ``tail``. A smooth tail is resolved to about
    1e-6 of the bracket; a step (a deterministic service time) to its cell, 1/1024.
    """
    target = 1.0 - q
    for _ in range(64):
        ts = np.linspace(lo, hi, _GRID)
        vals = tail(ts)
        if vals[-1] <= target:
            break
        lo, hi = hi, hi + 2.0 * (hi - lo)
    else:
        return math.inf
    for level in range(levels):
        j = int(np.argmax(vals <= target))
        if j == 0:
            return float(ts[0])
        if level == levels - 1:
            t0, t1 = float(ts[j - 1]), float(ts[j])
            v0, v1 = float(vals[j - 1]), float(vals[j])
            return t1 if v0 == v1 else t0 + (t1 - t0) * (v0 - target) / (v0 - v1)
        ts = np.linspace(float(ts[j - 1]), float(ts[j]), _GRID)
        vals = tail(ts)
    return float(ts[-1])  # pragma: no cover - the loop always returns
