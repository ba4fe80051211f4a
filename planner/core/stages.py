"""Serial CPU stages in front of a device queue: the executor front and the dispatcher.

The executor front (:func:`with_front`) is an M/D/1 stage of ``f`` ms per request in series
with an accelerator's device (capacity :func:`front_capacity_rps`, ``1000 / f``), its wait
taken independent of the device's latency: conservative where both are busy. The
dispatcher (:func:`stage_wait`, :func:`with_stage_wait`) is the same single-server stage at
the plan's total rate. Samples measured through a stage already hold its wait, so only its
growth is added (:func:`wait_growth`). See docs/simulate.md ("The dispatcher stage") and
docs/models.md ("The executor front").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from greenctl.data.errors import InputError
from greenctl.planner.core.mgc import LatencyModel, WaitTime, wait_time, with_overhead

#: cells per mean of the exponential part of the front's wait (:func:`with_front`): a step in
#: the queue's latency (a deterministic run) is resolved to 1/32 of that mean at the worst
_FRONT_CELLS_PER_MEAN = 16
#: the front's wait beyond the share of requests below this is taken at its edge
_FRONT_TAIL = 1e-5
#: points standing for a serving path's overhead plus an executor front's wait, and the grid
#: their distribution is found on
_FRONT_POINTS = 200
_FRONT_GRID = 4096


def plus_wait(overhead_ms: Sequence[float] | np.ndarray, wait: WaitTime) -> np.ndarray:
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
    return wait_time(float(rate_rps), (m1, m2, m3), 1, float(ca2))


def wait_moments(wait: WaitTime) -> tuple[float, float]:
    """The mean and variance of a :class:`WaitTime` (0 with probability ``1 - c_prob``, else
    ``delay + Exp(exp_mean)``)."""
    c, d, m = wait.c_prob, wait.delay_ms, wait.exp_mean_ms
    mean = c * (d + m)
    return mean, max(c * (d * d + 2.0 * d * m + 2.0 * m * m) - mean * mean, 0.0)


def wait_growth(wait: WaitTime, measured: WaitTime) -> WaitTime | None:
    """How much longer a request waits at a stage now (``wait``) than when measured (``measured``).

    Returns the growth as a wait ``X`` independent of the measured one, so that
    ``measured + X`` has the mean and variance of ``wait``: 0 with some probability else an
    exponential, or a delay plus an exponential; None when the wait has not grown. Checked by
    simulation against adding the growth quantile by quantile or the whole wait
    (docs/models.md, "Wait growth at a stage").
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
    """Overhead samples plus a shared serial stage's wait at the plan's rate (``wait``).

    The samples were measured through that stage with wait ``measured`` (None: an idle stage),
    so only the growth (:func:`wait_growth`) is added, independent of the samples: the whole
    wait when nothing was measured, nothing at or below the measured rate.

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
    return tuple(float(x) for x in plus_wait(o, grown))


def with_front(
    model: LatencyModel | None,
    rate_rps: float,
    front_ms: float,
    *,
    ca2: float = 1.0,
    overhead_ms: Sequence[float] | np.ndarray = (),
    held: WaitTime | None = None,
) -> LatencyModel | None:
    """``T + W``: a queue's latency ``T`` after an executor front, ``W`` the front's wait.

    The front (one event loop, one core, FIFO, ``front_ms`` per request) waits per
    :func:`front_wait`, independent of ``T`` (over-states the tail where both are busy).
    ``held`` is the front wait ``overhead_ms`` already hold (only its growth is added, by
    :func:`wait_growth`); ``overhead_ms`` are added in the same convolution.

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
        return with_overhead(model, plus_wait(overhead_ms, wait))
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
