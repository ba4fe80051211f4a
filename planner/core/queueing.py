"""Analytic queueing approximations: the fast path planners call in their inner loops.

Conventions: rates in requests per second (``rate_rps``), times in milliseconds, ``q`` a
quantile such as 0.95. Every function returns ``math.inf`` for a latency when the offered
load reaches the capacity (an overloaded queue grows without bound).

The model (M/G/c with the Allen-Cunneen correction, written out once here):

- The probability that a request waits is Erlang C, ``C(c, a)`` with ``a = rate * E[S]``
  (exact for M/M/c; the usual approximation for M/G/c).
- Given that it waits, the wait has the Allen-Cunneen mean
  ``E[W | W > 0] = (ca2 + cs2) / 2 / (c / E[S] - rate)``, ``ca2`` the arrivals' squared
  coefficient of variation (1 for Poisson) and ``cs2`` the service time's, and the
  squared coefficient of variation ``v`` of the exact M/G/1 conditional wait at the same
  utilisation (Pollaczek-Khinchine and Takacs moments): 1 for exponential service, from
  1/3 up for deterministic service, where a queued request waits for a residual service
  rather than an exponential time. The conditional wait is the shifted exponential with
  that mean and ``v`` (delay ``m (1 - sqrt v)`` plus an exponential of mean ``m sqrt v``;
  ``v >= 1`` keeps Kingman's plain exponential, exact for M/M/c).
- End-to-end latency ``T = W + S`` with ``W`` and ``S`` independent; its distribution is
  the convolution ``P(T > t) = (1 - C) P(S > t) + C P(E + S > t - delay)`` (closed form
  for deterministic or exponential service, Gauss-Legendre quadrature over the lognormal's
  probability range), and the quantile is found by a
  vectorised three-level grid search. Deterministic service is closed form: ``T_q = W_q + D``.

Batching (:func:`dynamic_batch`): an executor batches dynamically
(``greenctl.executor.runtime.daemon.Batcher``, rules in :mod:`greenctl.data.batching`): the batcher
takes the first waiting request, adds requests until the batch holds ``b`` rows or
``max_wait`` (``w``) has passed since it took the first, and submits it; a batch of ``n`` rows
runs for ``L(pad(n))``, the service model at its padded size
(:class:`~greenctl.planner.core.latency.BatchService`). So the batch a request sees depends on the
load: the requests that queued while the batcher could not take a batch, plus the window's.

- The eager runner (CPUs, depth 1) takes a batch only when the last one has finished. Exact
  up to the per-request split: a Markov chain on the number ``Q`` of requests waiting when a
  batch is taken (``N = b`` at once if ``Q >= b``, else ``Q`` plus the window's Poisson
  arrivals up to ``b``; then ``Q' = max(Q - b, 0) + Poisson(lam L(N))``), solved for its
  stationary law. A request's wait before its run is the window (or its rest), plus, when it
  queued during the previous run, that run's residual (``Uniform(0, s)``, ``s`` that run's
  mean given ``Q``); requests left over from a full batch wait one more batch per ``b``
  ahead of them.
- The pipelined GPU runner (depth ``d`` = 2) takes the next batch while one runs and holds
  at most ``d`` in flight. Batch ``k`` closes at ``c_k``; its wait for the device is
  ``W_k``; the batcher is held after closing it until the batch ``d`` places ahead has
  finished, for ``B_k = (W_k - C_k)^+`` with ``C_k`` the runs of the ``d - 1`` batches
  between. Then exactly
  ``W_{k+1} = (min(W_k - E, C_k) + L_k - X_{k+1})^+`` (``E ~ Exp(lam)`` the gap to the next
  arrival, ``X`` the window): the Lindley recursion of a batch queue whose wait is capped at
  the batches in flight. Approximation: the runs, the window and ``W`` independent; ``W``'s
  law is solved on a grid, the batch size is ``max(1, Poisson(lam B)) + `` the window's
  arrivals, and the two are iterated to a fixed point. A request's latency is ``U + W + L``
  with ``U`` its wait for the batch to close (``X + Uniform(0, B)`` when it queued while the
  batcher was held, ``X`` for the request that opened it, ``Uniform(0, X)`` for the
  window's), independent of ``W``. At light load it is the M/G/1 queue of batches with
  service ``L - w`` (exact when ``L >= w``); at heavy load the wait of a held batch is the
  ``d - 1`` runs ahead, ``L_{k-1} + L_k - w``.
- The local dispatcher lets ``slots = b + 1`` requests into an executor. With ``d + 1``
  batches holding them (running, queued, waiting for a slot) a saturated pipelined executor
  runs batches of about ``slots / (d + 1)`` rows, which caps the modeled batch; its capacity
  (:func:`batch_capacity_rps`) is taken at the slowest split of ``slots`` over ``d + 1``
  batches (padding makes uneven splits slower); and a request waits at the dispatcher when
  all slots are held (Erlang C over the slots, each held for the mean time in the executor,
  exponential wait). The eager runner takes a whole batch at once, so the cap costs it
  nothing.

Checked against the simulator (:func:`greenctl.planner.core.simulator.batch_queue`, which runs
the batcher itself) on the H200 ResNet profiles: p50 and p95 within 5 % up to 90 % of the
capacity at batch 32 (resnet18, 50 and 152), within 10 % up to 80 % at batch 8, where the
dispatcher's cap binds at 3 rows per batch; nearer the capacity the dispatcher's queue is
modeled coarsely and the tail is off either way. The eager model is within 5 % up to 90 %.
``b == 1`` is M/G/1.

The executor front (:func:`with_front`): an instance on a GPU, MIG or MPS resource is served
through one executor process whose event loop receives, decodes and enqueues every request
on one core (a 224x224 image is 600 KB) before the device sees it. With ``f`` ms of CPU per
request it is a single server with a deterministic service ``f`` in series with the device:
the instance serves at most :func:`front_capacity_rps` (``1000 / f``), and a request adds
the front's wait, this module's M/D/1 wait (within 1 % of the simulated M/D/1 at p99), taken
independent of the device's latency; where the serving path's samples were measured through
the same front they hold its wait at their rate, and only its growth since is added (as for
the dispatcher below). That sum is conservative where both stages are busy:
the front releases requests that queued ``f`` apart, smoother than Poisson, and they tend to
share the batch their predecessor opened. Against the simulator, which runs the front and
then the batcher (resnet50 at batch 32 on the H200 profiles): behind a 0.6 ms front the p95
within 5 % at 72 % and 90 % of the front (the median 6-7 % high); behind a 0.4 ms front at
1,200 / 1,500 / 1,800 req/s, p95 5 / 11 / 17 % high (the device at 55-82 % of its capacity).

The dispatcher (:func:`stage_wait`, :func:`with_stage_wait`): every request of a plan crosses
one dispatcher process (one event loop on one core) before its executor, so it is one more
serial CPU stage, shared by all the plan's requests: the same single-server queue as the
front, at the plan's total rate, its service the mixture of each model's measured CPU per
request (deterministic within a model). It caps the plan at :func:`front_capacity_rps` of
the mixture's mean, and adds its wait to the serving path's overhead samples, which were
measured through it and so already hold its service and its wait at the rate they were
measured at: what is added is the wait's growth from that rate to the plan's, an
independent wait with the growth's mean and variance (:func:`wait_growth`,
:func:`with_stage_wait`), nothing when they were measured at the plan's rate or above.

Results are cached (``functools.lru_cache``): planners evaluate the same configuration
many times.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS, Batching
from greenctl.data.errors import InputError
from greenctl.planner.core.latency import BatchService, ServiceTime, lognormal_terms

_GRID = 33  # points per level of the quantile grid search
_LEVELS = 2


def _check_q(q: float) -> None:
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


def _wait_time(
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


def _wait_arrays(
    rates_rps: np.ndarray, moments: tuple[float, float, float], servers: int, ca2: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_wait_time` for many rates at once: (P(wait), delay, exponential mean), with
    an infinite delay where the rate reaches capacity."""
    mean, m2, m3 = moments
    lam = np.maximum(np.asarray(rates_rps, dtype=float), 0.0) / 1000.0
    a = lam * mean
    stable = a < servers
    a_s = np.where(stable, a, 0.0)
    b = np.ones_like(a_s)  # Erlang B recursion, vectorised over the rates
    for k in range(1, servers + 1):
        b = a_s * b / (k + a_s * b)
    c_prob = np.where(stable, servers * b / (servers - a_s * (1.0 - b)), 1.0)
    scv = max(m2 / (mean * mean) - 1.0, 0.0)
    slack = np.where(stable, servers / mean - lam, 1.0)
    cond_mean = max(ca2 + scv, 1e-12) / 2.0 / slack
    rho = np.clip(a_s / servers, 1e-9, 1.0 - 1e-9)
    m1_1 = m2 / (2.0 * mean * (1.0 - rho))
    m2_1 = 2.0 * rho * m1_1 * m1_1 + m3 / (3.0 * mean * (1.0 - rho))
    v = m2_1 / (m1_1 * m1_1) - 1.0
    v = np.where(np.isfinite(v) & (v > 0), np.minimum(v, 1.0), 1.0)
    root = np.sqrt(v)
    delay = np.where(stable, cond_mean * (1.0 - root), np.inf)
    exp_mean = np.where(stable, cond_mean * root, 1.0)
    return c_prob, delay, exp_mean


def _moments(service: ServiceTime) -> tuple[float, float, float]:
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
    _check_q(q)
    if rate_rps <= 0:
        return 0.0
    wait = _wait_time(rate_rps, _moments(service), servers, ca2)
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
        _check_q(q)
        if self._exact is not None:
            return self._exact(q)
        lo, hi = self._bracket(q)
        return _grid_quantile(self._tail, q, lo, hi)


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
        _check_q(q)
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
            out.append(_grid_quantile(tail, q, float(ts[-1]), 2 * float(ts[-1]) - lo))
            continue
        j = int(np.argmax(ok))
        if j == 0:
            out.append(float(ts[0]))
            continue
        out.append(_grid_quantile(tail, q, float(ts[j - 1]), float(ts[j]), levels=1))
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


# -- the executor front -----------------------------------------------------------------------
#: cells per mean of the exponential part of the front's wait (:func:`with_front`): a step in
#: the queue's latency (a deterministic run) is resolved to 1/32 of that mean at the worst
_FRONT_CELLS_PER_MEAN = 16
#: the front's wait beyond the share of requests below this is taken at its edge
_FRONT_TAIL = 1e-5
#: points standing for a serving path's overhead plus an executor front's wait, and the grid
#: their distribution is found on
_FRONT_POINTS = 200
_FRONT_GRID = 4096


def _plus_wait(overhead_ms: Sequence[float] | np.ndarray, wait: WaitTime) -> np.ndarray:
    """``O + W`` at :data:`_FRONT_POINTS` midpoint quantiles: ``O`` equiprobable on
    ``overhead_ms``, ``W`` the front's wait (0 with probability ``1 - c_prob``, else
    ``delay + Exp(exp_mean)``), independent; from its CDF on a grid."""
    o = np.sort(np.asarray(overhead_ms, dtype=float).ravel())
    if o.size == 0 or not np.all(np.isfinite(o)) or float(o[0]) < 0:
        raise InputError("serving overhead samples must be finite, >= 0 ms and not empty")
    top = wait.delay_ms + wait.exp_mean_ms * math.log(max(wait.c_prob, 1e-12) / 1e-6)
    x = np.linspace(float(o[0]), float(o[-1]) + max(top, 0.0), _FRONT_GRID)
    w = x[:, None] - o[None, :]
    below = np.where(
        w < 0,
        0.0,
        (1.0 - wait.c_prob)
        + wait.c_prob
        * (w >= wait.delay_ms)
        * -np.expm1(-np.maximum(w - wait.delay_ms, 0.0) / wait.exp_mean_ms),
    )
    cdf = np.maximum.accumulate(below.mean(axis=1))
    u = (np.arange(_FRONT_POINTS) + 0.5) / _FRONT_POINTS
    return np.interp(u, cdf, x)


def front_capacity_rps(front_ms: float) -> float:
    """Requests per second an executor front spending ``front_ms`` of CPU on each request
    handles on its one core: ``1000 / front_ms`` (``math.inf`` without a front)."""
    return 1000.0 / front_ms if front_ms > 0 else math.inf


def front_wait(rate_rps: float, front_ms: float, *, ca2: float = 1.0) -> WaitTime | None:
    """The wait of a request at an executor front before its CPU work starts: this module's
    single-server queue (Erlang C, Allen-Cunneen, the M/G/1 conditional variability) with a
    deterministic service of ``front_ms``; None when ``rate_rps`` reaches
    :func:`front_capacity_rps`. ``ca2``: the arrivals' squared coefficient of variation."""
    return stage_wait(rate_rps, ((1.0, float(front_ms)),), ca2=ca2)


def stage_wait(
    rate_rps: float, cpu_ms: Sequence[tuple[float, float]], *, ca2: float = 1.0
) -> WaitTime | None:
    """The wait at a serial CPU stage (one event loop on one core, FIFO) whose requests each
    take a fixed CPU time: ``cpu_ms`` is ``(share of the requests, ms)`` pairs (shares need
    not sum to 1; one pair is :func:`front_wait`'s deterministic service). The single-server
    queue of :func:`front_wait` with the mixture's moments; None when ``rate_rps`` reaches
    :func:`front_capacity_rps` of the mixture's mean.

    Raises:
        InputError: no pair with a share and a CPU time > 0.
    """
    live = [(float(w), float(f)) for w, f in cpu_ms if w > 0]
    total = sum(w for w, _ in live)
    if not live or not all(math.isfinite(f) and f > 0 for _, f in live):
        raise InputError("a serial stage needs CPU times > 0 ms per request")
    m1 = sum(w * f for w, f in live) / total
    m2 = sum(w * f * f for w, f in live) / total
    m3 = sum(w * f * f * f for w, f in live) / total
    return _wait_time(float(rate_rps), (m1, m2, m3), 1, float(ca2))


def wait_moments(wait: WaitTime) -> tuple[float, float]:
    """The mean and variance of a :class:`WaitTime` (0 with probability ``1 - c_prob``, else
    ``delay + Exp(exp_mean)``)."""
    c, d, m = wait.c_prob, wait.delay_ms, wait.exp_mean_ms
    mean = c * (d + m)
    return mean, max(c * (d * d + 2.0 * d * m + 2.0 * m * m) - mean * mean, 0.0)


def wait_growth(wait: WaitTime, measured: WaitTime) -> WaitTime | None:
    """How much longer a request waits at a stage now (``wait``) than when it was measured
    (``measured``), as a wait ``X`` independent of the measured one: ``measured + X`` has the
    mean and variance of ``wait``. ``X`` is 0 with some probability, else an exponential
    (``Var X >= E[X]^2``), or a delay plus an exponential that never is 0 (less spread);
    None when the wait has not grown (the measured rate was the plan's, or above).

    Checked by simulation (a 0.43 ms M/D/1 stage; lognormal samples with medians 1.5 and
    4 ms measured through it at 40-1,500 req/s, 100 midpoint quantiles, moved to 1,000-2,200
    req/s, 62-95 % busy): the p95 of samples plus ``X`` within -2.1 / +3.0 % of the simulated
    samples plus the wait at the new rate (the 100 points alone: 2 % low), the p99 within
    -7 / +4 %. The growth taken quantile by quantile (``Q_wait(U) - Q_measured(U)``,
    independent of the samples, the mean alone exact) put the p95 up to 9 % low; the whole
    wait added, nothing taken off, up to 15 % high.
    """
    m_now, v_now = wait_moments(wait)
    m_then, v_then = wait_moments(measured)
    grow = m_now - m_then
    if grow <= 1e-9 * max(m_now, 1e-9):
        return None
    spread = max(v_now - v_then, 0.0)
    if spread >= grow * grow:  # 0 w.p. 1 - c, else Exp(m): c m = grow, 2 c m^2 = spread + grow^2
        m = (spread + grow * grow) / (2.0 * grow)
        return WaitTime(grow / m, 0.0, m)
    m = max(math.sqrt(spread), 1e-6 * grow)  # delay + Exp(m): m^2 = spread
    return WaitTime(1.0, grow - m, m)


def with_stage_wait(
    overhead_ms: Sequence[float] | np.ndarray,
    wait: WaitTime,
    measured: WaitTime | None = None,
) -> tuple[float, ...]:
    """A serving path's overhead samples with a shared serial stage's wait at the plan's rate
    (``wait``), where they were measured through that stage at another rate, its wait then
    ``measured`` (None: an idle stage, nothing held).

    The samples already hold the measured wait: what is added is its growth
    (:func:`wait_growth`), independent of the samples, as :func:`with_front` adds the front's
    wait (:func:`_plus_wait`): the whole wait when nothing was measured, nothing when the
    samples were measured at the plan's rate or above (the measurement stands, never less).

    Returns:
        ``O + X`` as :data:`_FRONT_POINTS` equiprobable points; the samples themselves when
        nothing is added or the stage waits for fewer than ``1e-5`` of the requests.

    Raises:
        InputError: no samples, or a negative or non-finite one.
    """
    o = np.asarray(overhead_ms, dtype=float).ravel()
    if o.size == 0 or not np.all(np.isfinite(o)) or float(o.min()) < 0:
        raise InputError("serving overhead samples must be finite, >= 0 ms and not empty")
    grown: WaitTime | None = wait
    if measured is not None and measured.c_prob > 0:
        grown = wait_growth(wait, measured)
    if grown is None or wait.c_prob <= _FRONT_TAIL:
        return tuple(float(x) for x in o)
    return tuple(float(x) for x in _plus_wait(o, grown))


def with_front(
    model: LatencyModel | None,
    rate_rps: float,
    front_ms: float,
    *,
    ca2: float = 1.0,
    overhead_ms: Sequence[float] | np.ndarray = (),
    held: WaitTime | None = None,
) -> LatencyModel | None:
    """``T + W``: a queue's latency ``T`` after an executor front, ``W`` the front's wait
    (:func:`front_wait`), independent of ``T``.

    ``held``: the front's wait that ``overhead_ms`` already hold (they were measured through
    that front, at another rate: ``evaluate.front_held_wait``); ``W`` is then only the wait's
    growth since (:func:`wait_growth`, the dispatcher's rule), nothing when the samples were
    measured at this rate or above. None: nothing held, the whole wait is added. On the H200
    (resnet50 at batch 32, 1,500 req/s, a 0.47 ms front 70 % busy, the samples measured at
    that rate) the whole wait added put the plan's p95 at 10.09 ms, the growth alone at
    9.25 ms, against 9.24 and 10.10 ms measured in two runs; resnet152 at batch 8 and 300
    req/s (a 0.95 ms front): 11.51 and 11.25 ms against 9.07 and 9.75.

    The front is the executor daemon's inbound side (receive, decode, enqueue; encode on the
    way back) on an accelerator instance: one event loop on one core that handles each
    request for ``front_ms`` in series with the device, FIFO. Its own ``front_ms`` is not
    added: it is part of the measured serving path (the time a request spends outside the
    executor's batch queue and run), as an executor's CPU ``demand_ms`` on CPU instances is
    (:func:`mgc_model`). The device queue is taken to see the requests as they arrive; the
    front's departures are smoother (requests that queued leave it ``front_ms`` apart and
    tend to share a batch), so the sum over-states the tail where both stages are busy
    (module docstring, "The executor front").

    ``P(T + W > t) = (1 - C) P(T > t) + C E[P(T > t - delay - X)]`` with ``X`` exponential:
    the expectation over cells of ``1/16`` of its mean, each weighted by its exact
    probability (the last one holding the rest beyond ``1e-5`` of the requests).

    ``overhead_ms``: a serving path's overhead samples (:func:`with_overhead`), added in the
    same step: ``O + W`` as :data:`_FRONT_POINTS` equiprobable points (its exact law, with
    ``O`` equiprobable on its samples), one convolution with ``T`` rather than two.

    Returns:
        ``model`` (plus ``overhead_ms``) when ``front_ms <= 0`` or the front is idle; None
        when ``model`` is None or the rate reaches :func:`front_capacity_rps`.
    """
    if model is None:
        return None
    now = front_wait(rate_rps, front_ms, ca2=ca2) if front_ms > 0 else None
    if front_ms > 0 and now is None:
        return None
    wait = now
    if now is not None and held is not None and held.c_prob > 0:
        wait = wait_growth(now, held)
    if wait is None or now is None or now.c_prob <= _FRONT_TAIL:
        return with_overhead(model, overhead_ms) if len(overhead_ms) else model
    if len(overhead_ms):
        return with_overhead(model, _plus_wait(overhead_ms, wait))
    c = wait.c_prob
    m = wait.exp_mean_ms
    cells = max(1, math.ceil(_FRONT_CELLS_PER_MEAN * math.log(c / _FRONT_TAIL)))
    edges = np.arange(cells + 1) * (m / _FRONT_CELLS_PER_MEAN)
    above = np.exp(-edges / m)
    weights = np.append(above[:-1] - above[1:], above[-1])  # sums to 1
    at = wait.delay_ms + np.append(0.5 * (edges[:-1] + edges[1:]), edges[-1])

    def tail(t: np.ndarray) -> np.ndarray:
        shifted = (t[:, None] - at[None, :]).ravel()
        vals = np.ones_like(shifted)
        pos = shifted > 0
        if pos.any():
            vals[pos] = model.sf(shifted[pos])
        waited = vals.reshape(t.shape[0], at.size) @ weights
        return (1.0 - c) * model.sf(t) + c * waited

    def bracket(q: float) -> tuple[float, float]:
        lo, hi = model.bracket(q)
        return lo, max(hi + wait.quantile(q) + m, lo * 1.001 + 1e-9)

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
    return _mgc_model(float(rate_rps), key, float(ca2), max(float(demand_ms), 0.0))


def _shifted(model: LatencyModel, delta_ms: float) -> LatencyModel:
    """``T + delta`` (delta may be negative when T >= -delta surely)."""

    def tail(t: np.ndarray) -> np.ndarray:
        return model.sf(t - delta_ms)

    def bracket(q: float) -> tuple[float, float]:
        lo, hi = model.bracket(q)
        return lo + delta_ms, hi + delta_ms

    return LatencyModel(tail, bracket, lambda q: model.quantile(q) + delta_ms)


@lru_cache(maxsize=16384)
def _mgc_model(
    rate_rps: float, services: tuple[ServiceTime, ...], ca2: float, demand_ms: float = 0.0
) -> LatencyModel | None:
    c = len(services)
    lam = max(rate_rps, 0.0) / 1000.0
    if demand_ms > 0:
        # W + (S + d) of the loaded servers, less d: their wait, each request's plain service
        full = _mgc_model(rate_rps, tuple(s.shifted(demand_ms) for s in services), ca2)
        return None if full is None else _shifted(full, -demand_ms)
    if len(set(services)) == 1:
        service = services[0]
        wait = _wait_time(lam * 1000.0, _moments(service), c, ca2)
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
    wait = _wait_time(lam * 1000.0, moments, c, ca2)
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
    _check_q(q)
    if servers < 1:
        raise InputError(f"servers must be >= 1, got {servers}")
    if rate_rps <= 0:
        return service.quantile(q)
    model = _mgc_model(float(rate_rps), (service,) * servers, float(ca2))
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
    _check_q(q)
    model = mgc_model(rate_rps, services, ca2=ca2)
    return math.inf if model is None else model.quantile(q)


def _grid_quantile(
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

    ``servers`` identical instances behind one FIFO queue (:func:`latency_quantile_ms`'s
    model). ``P(T > slo)`` rises with the rate, so the answer is where it crosses
    ``1 - percentile``: found on a grid of rates evaluated at once (four levels of 16, to
    about 1e-5 of capacity, rounded down); cached.

    ``front_ms``: the executor front's CPU per request of an accelerator instance (one
    server), a stage in series (:func:`with_front`): the capacity is then at most
    :func:`front_capacity_rps` and the latency holds the front's wait.

    Returns:
        0.0 when the service time alone exceeds the SLO at that percentile.
    """
    _check_q(percentile)
    if servers < 1:
        raise InputError(f"servers must be >= 1, got {servers}")
    if front_ms > 0 and servers != 1:
        raise InputError("an executor front is modeled per instance: servers must be 1")
    if service.quantile(percentile) > slo_ms:
        return 0.0
    cap = servers * 1000.0 / service.mean_ms
    target = 1.0 - percentile
    sf_slo = float(service.sf(np.array([float(slo_ms)]))[0])
    moments = _moments(service)

    def fronted(rates: np.ndarray) -> np.ndarray:
        out = np.ones(rates.size)
        for k, r in enumerate(rates.tolist()):
            m = with_front(_mgc_model(r, (service,), float(ca2)), r, front_ms, ca2=ca2)
            if m is not None:
                out[k] = float(m.sf(float(slo_ms))[0])
        return out

    def tails(rates: np.ndarray) -> np.ndarray:
        if front_ms > 0:
            return fronted(rates)
        c_prob, delay, exp_mean = _wait_arrays(rates, moments, servers, ca2)
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


# -- batching -------------------------------------------------------------------------------
@dataclass(frozen=True)
class BatchPrediction:
    """What one dynamically batching instance does at a load (:func:`dynamic_batch`).

    Attributes:
        latency: the end-to-end latency of its requests (wait + run).
        batch_sizes: ``(rows, share of batches)``, rows ascending.
        busy_frac: the share of time its device runs a batch.
    """

    latency: LatencyModel
    batch_sizes: tuple[tuple[int, float], ...]
    busy_frac: float

    @property
    def mean_batch(self) -> float:
        """The mean rows per batch."""
        return float(sum(n * p for n, p in self.batch_sizes))


def as_batch_service(
    service: BatchService | ServiceTime,
    batch: int | None = None,
    *,
    max_wait_ms: float | None = None,
) -> BatchService:
    """``service`` as a batch service model: a :class:`BatchService` as it is (with
    ``max_wait_ms`` in place of its own when given); a plain :class:`ServiceTime` as the time
    of every batch of up to ``batch`` rows (the eager runner, no padding)."""
    if isinstance(service, BatchService):
        if max_wait_ms is None or float(max_wait_ms) == service.batching.max_wait_ms:
            return service
        return BatchService(
            service.points, replace(service.batching, max_wait_ms=float(max_wait_ms))
        )
    b = max(1, int(batch or 1))
    wait = DEFAULT_MAX_WAIT_MS if max_wait_ms is None else float(max_wait_ms)
    return BatchService(((b, service),), Batching(b, wait))


@lru_cache(maxsize=4096)
def batch_capacity_rps(service: BatchService) -> float:
    """Requests per second one batching instance completes when saturated.

    The eager runner (depth 1) runs full batches back to back. A pipelined one under the
    dispatcher's cap holds ``slots`` requests in its ``depth + 1`` batches (running, queued,
    waiting for a slot), and the sizes they settle at depend on history; the rate is taken
    at the slowest split of ``slots`` into ``depth + 1`` batches (each at most ``batch``):
    with run times linear in rows every split is alike, while padding makes uneven ones
    slower (resnet152 at batch 32 on an H200: 1,148 req/s by this rule, about 1,170
    simulated, 1,286 for equal thirds)."""
    how = service.batching
    if how.depth <= 1 or how.slots is None:
        return 1000.0 * how.batch / service.at(how.batch).mean_ms
    parts, total, top = how.depth + 1, int(how.slots), how.batch
    if total < parts or total > parts * top:
        n = how.saturated_rows
        return 1000.0 * n / service.at(n).mean_ms
    run = np.array([0.0] + [service.at(n).mean_ms for n in range(1, top + 1)])
    # slowest[k][s]: the longest total run of k batches holding s rows (1..top each)
    slowest = np.full((parts + 1, total + 1), -np.inf)
    slowest[0, 0] = 0.0
    for k in range(1, parts + 1):
        for n in range(1, top + 1):
            slowest[k, n:] = np.maximum(slowest[k, n:], slowest[k - 1, : total + 1 - n] + run[n])
    return 1000.0 * total / float(slowest[parts, total])


def _check_wait(service: BatchService) -> float:
    w = service.batching.max_wait_ms
    if not (math.isfinite(w) and w >= 0):
        raise InputError(f"the max wait must be a number of ms >= 0, got {w}")
    return float(w)


@lru_cache(maxsize=16384)
def dynamic_batch(rate_rps: float, service: BatchService) -> BatchPrediction | None:
    """Latency, batch sizes and busy time of one executor batching dynamically (module
    docstring, "Batching"); None when ``rate_rps`` reaches its :func:`batch_capacity_rps`.

    Args:
        rate_rps: the Poisson rate this instance receives.
        service: its batch service model (run time at every size, max batch, max wait,
            pipeline depth, padding, the dispatcher's cap).
    """
    w = _check_wait(service)
    lam = max(float(rate_rps), 0.0) / 1000.0
    one = service.at(1)
    if service.batch == 1:  # no batching: a FIFO single server
        model = _mgc_model(lam * 1000.0, (one,), 1.0)
        if model is None:
            return None
        return BatchPrediction(model, ((1, 1.0),), min(lam * one.mean_ms, 1.0))
    if lam <= 0:  # a lone request waits the whole window, then runs alone
        alone = _mgc_model(0.0, (one,), 1.0)
        assert alone is not None
        return BatchPrediction(_shifted(alone, w), ((1, 1.0),), 0.0)
    if lam * 1000.0 >= batch_capacity_rps(service):
        return None
    if service.batching.depth <= 1:
        return _eager_batching(lam, service, w)
    return _pipelined_batching(lam, service, w)


def _poisson_pmf(k: np.ndarray, mu: float | np.ndarray) -> np.ndarray:
    """P(Poisson(mu) = k), broadcasting ``k`` against ``mu``."""
    from scipy.special import gammaln

    k = np.asarray(k, dtype=float)
    mu = np.asarray(mu, dtype=float)
    with np.errstate(divide="ignore"):
        logp = k * np.log(np.maximum(mu, 1e-300)) - mu - gammaln(k + 1.0)
    out = np.exp(logp)
    return np.where(mu > 0, out, (k == 0).astype(float))


def _fill_time_ms(k: int, lam: float, limit_ms: float) -> float:
    """The mean time until the ``k``-th of Poisson(``lam``/ms) arrivals, given it comes
    within ``limit_ms`` (how long a batch that fills in its window waited to fill)."""
    from scipy.special import gammainc

    if k <= 0 or lam <= 0 or limit_ms <= 0:
        return 0.0
    x = lam * limit_ms
    pk = float(gammainc(k, x))
    if pk <= 1e-300:
        return limit_ms
    return min(limit_ms, k / lam * float(gammainc(k + 1, x)) / pk)


def _window_sizes(lam: float, window_ms: float, top: int) -> np.ndarray:
    """``p[n]``, n = 0..top: a batch is its first request plus the Poisson arrivals of a
    window, at most ``top`` rows."""
    p = np.zeros(top + 1)
    if top <= 1:
        p[1] = 1.0
        return p
    p[1:top] = _poisson_pmf(np.arange(top - 1), lam * window_ms)
    p[top] = max(1.0 - float(p[1:top].sum()), 0.0)
    return p


def _runs(service: BatchService, top: int) -> tuple[tuple[ServiceTime, ...], np.ndarray]:
    """The distinct run times of batches of 1..top rows (padded sizes), and for each row
    count n (index n, 0 unused) the index of its run time."""
    sizes = sorted({service.batching.run_size(n) for n in range(1, top + 1)})
    where = {s: i for i, s in enumerate(sizes)}
    index = np.zeros(top + 1, dtype=int)
    for n in range(1, top + 1):
        index[n] = where[service.batching.run_size(n)]
    return tuple(service.at(s) for s in sizes), index


def _compress(values: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``k`` points standing for a weighted sample: the weighted means of ``k``
    bins of equal probability (keeps the mean, and the quantiles to a bin's width)."""
    if values.size <= k:
        return values, weights
    order = np.argsort(values, kind="stable")
    v, wt = values[order], weights[order]
    cum = np.cumsum(wt)
    total = float(cum[-1])
    if total <= 0:
        return values[:k], weights[:k]
    # bin of each point by the probability below its middle
    which = np.minimum(((cum - 0.5 * wt) / total * k).astype(int), k - 1)
    mass = np.bincount(which, wt, minlength=k)
    sums = np.bincount(which, wt * v, minlength=k)
    keep = mass > 0
    return sums[keep] / mass[keep], mass[keep]


def _interp_matrix(
    at: np.ndarray, grid: np.ndarray, weights: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(M, c)`` with ``M @ f + c == (np.interp(at, grid, f, left=1, right=0) @ weights)``
    for any ``f`` on the uniform ``grid`` (``at``: points by row, ``weights`` by column)."""
    step = float(grid[1] - grid[0])
    rows = at.shape[0]
    pos = (at - float(grid[0])) / step
    wt = np.broadcast_to(weights[None, :], at.shape)
    below = np.where(pos < 0, wt, 0.0).sum(axis=1)
    inside = (pos >= 0) & (pos <= grid.size - 1)
    r = np.broadcast_to(np.arange(rows)[:, None], at.shape)[inside]
    p = pos[inside]
    k = np.minimum(np.floor(p).astype(int), grid.size - 2)
    f = p - k
    w_in = wt[inside]
    flat = r * grid.size + k
    n = rows * grid.size
    out = np.bincount(flat, w_in * (1.0 - f), minlength=n)
    out += np.bincount(flat + 1, w_in * f, minlength=n + 1)[:n]
    return out.reshape(rows, grid.size), below


def _grid_pmf(values: np.ndarray, weights: np.ndarray, dz: float, size: int) -> np.ndarray:
    """A weighted sample as probabilities on the grid ``0, dz, 2 dz, ...`` (split linearly
    between the two nearest points; beyond the grid: its last point)."""
    pos = np.clip(values / dz, 0.0, size - 1.0)
    k = np.minimum(np.floor(pos).astype(int), size - 2) if size > 1 else np.zeros(pos.size, int)
    f = pos - k
    out = np.zeros(size)
    np.add.at(out, k, weights * (1.0 - f))
    if size > 1:
        np.add.at(out, k + 1, weights * f)
    return out


_W_GRID = 256  # points of a batch's wait for the device (pipelined model)
_B_POINTS = 32  # points standing for the time the batcher is held (pipelined model)
_D_POINTS = 128  # points standing for a run time less the next batch's window


def _pipelined_batching(lam: float, service: BatchService, w: float) -> BatchPrediction | None:
    """The pipelined executor (depth >= 2; module docstring): the batch-level recursion
    ``W' = (min(W - E, C) + S - X)^+`` solved on a grid, the batch sizes it implies, and the
    requests' pre-run wait built from both."""
    from scipy.signal import lfilter

    how = service.batching
    top = how.saturated_rows
    runs, index = _runs(service, top)
    nodes = [s.nodes for s in runs]
    smax = max(float(x.max()) for x in nodes)
    size = _W_GRID
    wmax = how.depth * smax + w
    dz = wmax / (size - 1)
    z = np.arange(size) * dz
    # a batch: j requests already waiting when the batcher takes it (at least the one that
    # opens it), then the window's m arrivals until it holds `top` rows
    span = top + 1
    pm = _poisson_pmf(np.arange(span), lam * w)
    rows = np.zeros((span, span), dtype=int)
    chance = np.zeros((span, span))
    window = np.zeros((span, span))
    for j in range(span):
        base = max(j, 1)
        if base >= top:
            rows[j, 0], chance[j, 0] = top, 1.0
            continue
        k = top - base
        rows[j, :k] = base + np.arange(k)
        chance[j, :k] = pm[:k]
        window[j, :k] = w
        rows[j, k] = top
        chance[j, k] = max(1.0 - float(pm[:k].sum()), 0.0)
        window[j, k] = _fill_time_ms(k, lam, w)
    run_of = index[rows]
    lo_v = -(smax + dz)
    ext = np.arange(lo_v, wmax + w + 2.0 * dz, dz)
    decay = math.exp(-lam * dz)
    held = np.zeros(span)
    held[0] = 1.0
    wait = np.zeros(size)
    wait[0] = 1.0
    step, last = 1.0, math.inf
    for _ in range(100):
        joint = held[:, None] * chance
        shares = np.bincount(run_of.ravel(), joint.ravel(), minlength=len(runs))
        shares = shares / shares.sum()
        full = float(joint[rows == top].sum())
        x_full = float((joint * window)[rows == top].sum()) / full if full > 0 else 0.0
        # C: the runs of the depth - 1 batches ahead of the last one in flight (the most a
        # closed batch can wait before the batcher is held); D: a run less the next window
        sv = np.concatenate(nodes)
        sp = np.concatenate([np.full(x.size, shares[r] / x.size) for r, x in enumerate(nodes)])
        cap_pmf = _grid_pmf(sv - lo_v, sp, dz, ext.size)
        one = cap_pmf
        for _ in range(how.depth - 2):
            cap_pmf = np.convolve(cap_pmf, one)[: ext.size]
            cap_pmf = np.roll(cap_pmf, round(lo_v / dz))  # keep the grid's origin
        cap_sf = 1.0 - np.cumsum(cap_pmf)
        dv, dp = _compress(
            np.concatenate([sv - w, sv - x_full]),
            np.concatenate([sp * (1.0 - full), sp * full]),
            _D_POINTS,
        )
        # P(Z > z_j) = sum_k dp_k g(z_j - d_k), g on `ext`: one matrix for the whole solve
        shift, below = _interp_matrix(z[:, None] - dv[None, :], ext, dp)
        neg = ext < 0
        grow = np.exp(lam * ext[neg])
        at_z = np.interp(ext[~neg], z, np.arange(size, dtype=float))
        k_z = np.minimum(np.floor(at_z).astype(int), size - 2)
        f_z = at_z - k_z
        for _ in range(2000):
            near = lfilter([1.0], [1.0, -decay], wait[::-1])[::-1]  # sum_i>=j m_i e^-lam(zi-zj)
            above = np.cumsum(wait[::-1])[::-1] - wait  # P(W > z_j)
            pz = above - (near - wait)  # P(W - E > z_j)
            pv = np.empty_like(ext)
            pv[neg] = 1.0 - grow * near[0]
            pv[~neg] = pz[k_z] * (1.0 - f_z) + pz[k_z + 1] * f_z
            g = pv * cap_sf  # P(min(W - E, C) > v)
            after = shift @ g + below
            new = -np.diff(np.concatenate(([1.0], np.clip(after, 0.0, 1.0))))
            new = np.maximum(new, 0.0)
            new /= new.sum()
            moved = float(np.abs(new - wait).sum())
            wait = new
            if moved < 1e-9:
                break
        # how long the batcher is held: B = (W - C)^+, then the waiting count j ~ Poisson(lam B)
        c_below = 1.0 - np.interp(z[None, :] - z[:, None], ext, cap_sf, left=1.0, right=0.0)
        b_sf = (c_below * wait[None, :]).sum(axis=1)
        b_pmf = np.maximum(-np.diff(np.concatenate(([1.0], np.clip(b_sf, 0.0, 1.0)))), 0.0)
        b_pmf /= b_pmf.sum()
        new_held = _poisson_pmf(np.arange(span)[:, None], lam * z[None, :]) @ b_pmf
        new_held[top] += max(1.0 - float(new_held.sum()), 0.0)
        moved = float(np.abs(new_held - held).sum())
        if moved > last:  # going round: take smaller steps
            step = max(0.5 * step, 0.125)
        last = moved
        held = (1.0 - step) * held + step * new_held
        if moved < 1e-3:  # the grids shift batch shares by ~1e-4 from one step to the next
            break
    joint = held[:, None] * chance
    p_rows = np.bincount(rows.ravel(), joint.ravel(), minlength=top + 1)
    mean_n = float((np.arange(top + 1) * p_rows).sum())
    # the pre-run wait U of each request, by the run time of its batch: its batch's waiting
    # requests arrived over the held time (U = window + Uniform(0, B)), the one that opened
    # an idle batcher waits the window, the window's arrivals Uniform(0, window)
    bv, bw = _compress(z, b_pmf, _B_POINTS)
    pj = _poisson_pmf(np.arange(span)[None, :], lam * bv[:, None])  # (points, j)
    pj[:, top] += np.maximum(1.0 - pj.sum(axis=1), 0.0)
    opened = np.maximum(np.arange(span), 1)  # requests already there when a batch is taken
    arrivals = np.where(rows > opened[:, None], rows - opened[:, None], 0)
    ng = size + math.ceil((w + dz) / dz) + 2
    # by class: 0 a batch opened by an arrival (the batcher was free), 1 a batch taken with
    # requests already waiting (the batcher was held): its wait for the device is then the
    # runs of the batches ahead less its window, and its requests waited longer to close
    steps = np.zeros((2, len(runs), ng + 2))
    ramps = np.zeros((2, len(runs), ng + 3))

    def put_step(c: int, r: np.ndarray, at: np.ndarray, wt: np.ndarray) -> None:
        np.add.at(steps[c], (r, np.minimum(np.ceil(at / dz - 1e-9).astype(int), ng - 1)), wt)

    def put_ramp(c: int, r: np.ndarray, at: np.ndarray, width: np.ndarray, wt: np.ndarray) -> None:
        # wt * clip((v - at) / width, 0, 1) = wt / width * (R(v - at) - R(v - at - width))
        for edge, sign in ((at, 1.0), (at + width, -1.0)):
            pos = np.minimum(edge / dz, ng - 1.0)
            k = np.floor(pos).astype(int)
            f = pos - k
            coef = sign * wt / width * dz
            np.add.at(ramps[c], (r, k + 1), coef * (1.0 - f))
            np.add.at(ramps[c], (r, k + 2), coef * f)

    weight = bw[:, None, None] * pj[:, :, None] * chance[None, :, :]  # (points, j, m)
    r_all = np.broadcast_to(run_of[None, :, :], weight.shape)
    x_all = np.broadcast_to(window[None, :, :], weight.shape)
    b_all = np.broadcast_to(bv[:, None, None], weight.shape)
    jj = np.broadcast_to(np.arange(span)[None, :, None], weight.shape)
    mm = np.broadcast_to(arrivals[None, :, :], weight.shape)
    live = weight > 1e-14
    first = live & (jj == 0)
    put_step(0, r_all[first], x_all[first], weight[first])
    queued = live & (jj > 0) & (b_all > 0)
    put_ramp(
        1,
        r_all[queued],
        x_all[queued],
        b_all[queued],
        weight[queued] * np.minimum(jj[queued], top),
    )
    for c, cls in ((0, jj == 0), (1, jj > 0)):
        fills = live & cls & (mm > 0) & (x_all > 0)
        put_ramp(
            c, r_all[fills], np.zeros(int(fills.sum())), x_all[fills], weight[fills] * mm[fills]
        )
        instant = live & cls & (mm > 0) & (x_all <= 0)
        put_step(c, r_all[instant], np.zeros(int(instant.sum())), weight[instant] * mm[instant])
    cdf_u = (
        np.cumsum(steps[:, :, :ng], axis=2) + np.cumsum(np.cumsum(ramps, axis=2), axis=2)[:, :, :ng]
    )
    cdf_u /= max(mean_n, 1e-300)
    # the wait of a batch taken from a held batcher: (C + S - X)^+; the others' the rest of W
    cv, cp = _compress(sv, sp, _D_POINTS)
    pair_v = (cv[:, None] + cv[None, :]).ravel()
    pair_p = (cp[:, None] * cp[None, :]).ravel()
    held_w = _grid_pmf(
        np.concatenate([pair_v - w, pair_v - x_full]),
        np.concatenate([pair_p * (1.0 - full), pair_p * full]),
        dz,
        size,
    )
    p_held = min(max(1.0 - float(held[0]), 0.0), 1.0)
    free_w = wait
    if 1e-9 < p_held < 1.0 - 1e-9:
        free_w = np.maximum(wait - p_held * held_w, 0.0)
        free_w = free_w / free_w.sum() if free_w.sum() > 0 else wait
    pmfs = [  # U + W by class
        np.convolve(np.diff(np.concatenate(([0.0], cdf_u[0, r]))), free_w)
        + np.convolve(np.diff(np.concatenate(([0.0], cdf_u[1, r]))), held_w)
        for r in range(len(runs))
    ]
    # the dispatcher's cap: a request holds one of `slots` places for its time in the
    # executor; with all taken it waits (Erlang C over the places, exponential wait)
    if how.slots is not None:
        span_t = np.arange(pmfs[0].size) * dz
        mean_t = sum(
            float((pm * span_t).sum()) + float(pm.sum()) * runs[r].mean_ms
            for r, pm in enumerate(pmfs)
        )
        places = int(how.slots)
        if lam * mean_t >= places:
            return None
        late = erlang_c(places, lam * mean_t)
        if late > 1e-6:
            mean_d = 1.0 / (places / mean_t - lam)
            k = np.arange(math.ceil(12.0 * mean_d / dz) + 2)
            delay = -np.diff(np.exp(-k * dz / mean_d))  # Exp(mean_d) on the grid
            delay = np.concatenate(([1.0 - late], late * delay))
            pmfs = [np.convolve(pm, delay) for pm in pmfs]
    cdfs = [np.cumsum(pm) for pm in pmfs]
    grid = np.arange(cdfs[0].size) * dz
    mass = [float(f[-1]) for f in cdfs]

    def tail(t: np.ndarray) -> np.ndarray:
        out = np.zeros_like(t)
        for f, wt, x in zip(cdfs, mass, nodes, strict=True):
            if wt > 0:
                got = np.interp(t[:, None] - x[None, :], grid, f, left=0.0, right=wt)
                out += wt - got.mean(axis=1)
        return out

    def bracket(q: float) -> tuple[float, float]:
        lo_t = 0.5 * min(s.quantile(q) for s in runs)
        return lo_t, max(max(s.quantile(q) for s in runs) + float(grid[-1]), lo_t + 1e-6)

    shares = np.bincount(index[1:], weights=p_rows[1:], minlength=len(runs))
    busy = lam / mean_n * float(sum(shares[r] * s.mean_ms for r, s in enumerate(runs)))
    sizes = tuple((k, float(p_rows[k])) for k in range(1, top + 1) if p_rows[k] > 1e-12)
    return BatchPrediction(LatencyModel(tail, bracket), sizes, min(busy, 1.0))


_U_GRID = 1024  # points of the pre-run wait's distribution (eager model)


def _eager_batching(lam: float, service: BatchService, w: float) -> BatchPrediction | None:
    """The eager executor (depth 1; module docstring): a Markov chain on the requests
    waiting when the executor takes its next batch."""
    b = service.batch
    runs, index = _runs(service, b)
    full = runs[index[b]]
    load = lam * min(full.quantile(0.999), 3.0 * full.mean_ms)  # the rest lumps at the top
    qmax = int(b + load + 8.0 * math.sqrt(load + 1.0) + 10)
    qs = np.arange(qmax + 1)
    # N | q: the waiting requests (at least the one that opens the batch) plus the window's
    # arrivals, at most b; q >= b: b at once.
    pw = _poisson_pmf(np.arange(b), lam * w)
    size_of = np.zeros((qmax + 1, b + 1))
    for q in range(qmax + 1):
        q1 = max(q, 1)
        if q1 >= b:
            size_of[q, b] = 1.0
            continue
        size_of[q, q1:b] = pw[: b - q1]
        size_of[q, b] = max(1.0 - float(pw[: b - q1].sum()), 0.0)
    # arrivals during a run of each run time, and the run time's share given them
    arrive = []
    seen = []
    for s in runs:
        x = s.nodes
        if x.size % 4 == 0 and x.size > 16:  # 16 block means: plenty for a Poisson mixture
            x = x.reshape(-1, 4).mean(axis=1)
        pm = _poisson_pmf(qs[:, None], lam * x[None, :])
        arrive.append(pm.mean(axis=1))
        seen.append((pm * x[None, :]).mean(axis=1))
    by_run = np.zeros((qmax + 1, len(runs)))
    for k in range(1, b + 1):
        by_run[:, index[k]] += size_of[:, k]
    trans = by_run @ np.array(arrive)
    for q in range(b, qmax + 1):  # a full batch leaves q - b waiting for the next
        trans[q] = 0.0
        trans[q, q - b :] = arrive[index[b]][: qmax + 1 - (q - b)]
    trans[:, -1] += np.maximum(1.0 - trans.sum(axis=1), 0.0)
    a = trans.T - np.eye(qmax + 1)
    a[-1, :] = 1.0
    rhs = np.zeros(qmax + 1)
    rhs[-1] = 1.0
    try:
        pi = np.linalg.solve(a, rhs)
    except np.linalg.LinAlgError:
        return None
    pi = np.maximum(pi, 0.0)
    pi /= pi.sum()
    # mean run time of the batch during which the waiting requests arrived, given how many
    weight = pi @ by_run
    num = np.array(seen).T @ weight
    den = np.array(arrive).T @ weight
    resid = np.where(den > 0, num / np.maximum(den, 1e-300), 0.0)
    mean_full = full.mean_ms
    # the pre-run wait U of each request, by the run time of its batch: pieces of (weight,
    # shift, uniform width), summed into a CDF on a grid
    p_r: list[np.ndarray] = []
    p_w: list[np.ndarray] = []
    p_at: list[np.ndarray] = []
    p_u: list[np.ndarray] = []
    batches = np.zeros(b + 1)
    for qi in np.flatnonzero(pi >= 1e-14):
        q = int(qi)
        q1 = max(q, 1)
        ks = np.arange(q1 if q < b else b, b + 1)
        pk = pi[q] * size_of[q, ks]
        keep = pk >= 1e-14
        ks, pk = ks[keep], pk[keep]
        if ks.size == 0:
            continue
        batches[ks] += pk
        r = index[ks]
        if q >= b:
            window = np.zeros(ks.size)
        else:
            window = np.where(ks == b, _fill_time_ms(b - q1, lam, w), w)
        if q == 0:  # the request that opened the batch waits its whole window
            p_r.append(r)
            p_w.append(pk)
            p_at.append(window)
            p_u.append(np.zeros(ks.size))
        else:  # the waiting ones, the last run's residual before it (more when left over)
            extra = (q - b) / b * mean_full if q > b else 0.0
            p_r.append(r)
            p_w.append(pk * min(q, b))
            p_at.append(window + extra)
            p_u.append(np.full(ks.size, float(resid[q])))
        if q < b:  # the window's arrivals
            p_r.append(r)
            p_w.append(pk * (ks - q1))
            p_at.append(np.zeros(ks.size))
            p_u.append(window)
    if not p_w:
        return None
    r_all, wt_all, at_all, u_all = (np.concatenate(x) for x in (p_r, p_w, p_at, p_u))
    live = wt_all > 0
    r_all, wt_all, at_all, u_all = r_all[live], wt_all[live], at_all[live], u_all[live]
    total = float(wt_all.sum())
    if total <= 0:
        return None
    top_u = float((at_all + u_all).max()) * 1.001 + 1e-9
    du = top_u / (_U_GRID - 1)
    grid = np.arange(_U_GRID) * du
    step_flat = np.zeros(len(runs) * (_U_GRID + 3))
    ramp_flat = np.zeros(len(runs) * (_U_GRID + 3))
    row = r_all * (_U_GRID + 3)
    point = u_all <= 0
    at = np.minimum(np.ceil(at_all[point] / du - 1e-9).astype(int), _U_GRID - 1)
    np.add.at(step_flat, row[point] + at, wt_all[point])
    spread = ~point  # wt * clip((v - at) / u, 0, 1), as ramps: second differences
    for edge, sign in ((at_all[spread], 1.0), (at_all[spread] + u_all[spread], -1.0)):
        pos = np.minimum(edge / du, _U_GRID - 1.0)
        cell = np.floor(pos).astype(int)
        f = pos - cell
        coef = sign * wt_all[spread] / u_all[spread] * du
        np.add.at(ramp_flat, row[spread] + cell + 1, coef * (1.0 - f))
        np.add.at(ramp_flat, row[spread] + cell + 2, coef * f)
    steps = step_flat.reshape(len(runs), _U_GRID + 3)[:, :_U_GRID]
    ramps = ramp_flat.reshape(len(runs), _U_GRID + 3)
    cdfs = list(
        (np.cumsum(steps, axis=1) + np.cumsum(np.cumsum(ramps, axis=1), axis=1)[:, :_U_GRID])
        / total
    )
    weights = [float(f[-1]) for f in cdfs]
    nodes = [s.nodes for s in runs]

    def tail(t: np.ndarray) -> np.ndarray:
        out = np.zeros_like(t)
        for f, wt, x in zip(cdfs, weights, nodes, strict=True):
            if wt <= 0:
                continue
            v = t[:, None] - x[None, :]
            got = np.interp(v, grid, f, left=0.0, right=wt)
            out += wt - got.mean(axis=1)
        return out

    def bracket(q: float) -> tuple[float, float]:
        lo_t = 0.5 * min(s.quantile(q) for s in runs)
        return lo_t, max(max(s.quantile(q) for s in runs) + top_u, lo_t + 1e-6)

    nb = batches / max(batches.sum(), 1e-300)
    mean_n = float((np.arange(b + 1) * nb).sum())
    run_share = np.bincount(index[1:], weights=nb[1:], minlength=len(runs))
    busy = lam / mean_n * float(sum(run_share[r] * s.mean_ms for r, s in enumerate(runs)))
    sizes = tuple((k, float(nb[k])) for k in range(1, b + 1) if nb[k] > 1e-12)
    return BatchPrediction(LatencyModel(tail, bracket), sizes, min(busy, 1.0))


def batch_model(
    rate_rps: float,
    service: BatchService | ServiceTime,
    batch: int | None = None,
    *,
    max_wait_ms: float | None = None,
) -> LatencyModel | None:
    """Latency model of one dynamically batching instance (:func:`dynamic_batch`); None
    if overloaded. A plain ``service`` is every batch's time (:func:`as_batch_service`)."""
    got = dynamic_batch(float(rate_rps), as_batch_service(service, batch, max_wait_ms=max_wait_ms))
    return None if got is None else got.latency


@lru_cache(maxsize=65536)
def batch_latency_quantile_ms(
    rate_rps: float,
    service: BatchService | ServiceTime,
    batch: int | None = None,
    q: float = 0.95,
    *,
    max_wait_ms: float | None = None,
) -> float:
    """End-to-end latency quantile of one dynamically batching instance, ms.

    Args:
        rate_rps: the rate this instance receives.
        service: its batch service model, or one service time for every batch.
        batch: the largest batch (with a plain service time).
        q: the quantile.
        max_wait_ms: the longest a batch waits to fill (default: the model's own, else
            :data:`~greenctl.data.batching.DEFAULT_MAX_WAIT_MS`).

    Returns:
        ``math.inf`` when the rate reaches :func:`batch_capacity_rps`.
    """
    _check_q(q)
    model = batch_model(rate_rps, service, batch, max_wait_ms=max_wait_ms)
    return math.inf if model is None else model.quantile(q)


@lru_cache(maxsize=16384)
def batch_capacity_at_slo(
    service: BatchService | ServiceTime,
    batch: int | None = None,
    *,
    slo_ms: float,
    percentile: float = 0.95,
    max_wait_ms: float | None = None,
    front_ms: float = 0.0,
) -> float:
    """The largest rate (req/s) up to which one batching instance meets ``slo_ms`` at
    ``percentile``; 0 if none. Latency need not rise with load (batches fill sooner), so
    the answer is the first crossing on a grid of rates, refined by bisection.

    ``front_ms``: the executor front's CPU per request of an accelerator instance, a stage in
    series (:func:`with_front`): the capacity is then at most :func:`front_capacity_rps` and
    the latency holds the front's wait."""
    _check_q(percentile)
    svc = as_batch_service(service, batch, max_wait_ms=max_wait_ms)

    def ok(rate: float) -> bool:
        got = dynamic_batch(rate, svc)
        if front_ms <= 0:
            return got is not None and got.latency.quantile(percentile) <= slo_ms
        lm = with_front(got.latency if got is not None else None, rate, front_ms)
        return lm is not None and float(lm.sf(float(slo_ms))[0]) <= 1.0 - percentile

    if not ok(0.0):
        return 0.0
    cap = min(batch_capacity_rps(svc), front_capacity_rps(front_ms))
    steps = 16
    lo = 0.0
    for i in range(1, steps + 1):
        rate = cap * i / steps * (1.0 - 1e-9)
        if not ok(rate):
            hi = rate
            break
        lo = rate
    else:
        return lo
    while hi - lo > 1e-4 * cap:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
