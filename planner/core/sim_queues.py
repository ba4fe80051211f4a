"""The simulator's queues: one function per kind of queue a plan's requests cross.

``fifo`` (one central queue per model, fastest idle instance first: heaps, plain Python),
``wrr`` (stride scheduling over instances by share, each a FIFO queue solved by Lindley's
recursion in numpy), ``batch`` (an executor batching as its batcher does,
:func:`batch_queue`), and the serial CPU stages: an accelerator's executor front
(:func:`front_queue`) and the dispatcher every request crosses first
(:func:`dispatcher_queue`), less the waits a serving path's samples already hold
(:func:`held_samples`). Each is vectorised where it can be; details in docs/models.md
("Simulator queues").
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from greenctl.data.errors import InputError
from greenctl.planner.core.evaluate import (
    DispatcherStage,
    Instance,
    ServingPath,
    front_held_wait,
)
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.policy import SmoothWRR
from greenctl.planner.core.queueing import (
    WaitTime,
    front_wait,
    wait_growth,
    wait_moments,
)


@dataclass
class QueueRun:
    """What happened to each request offered to one queue (times in ms)."""

    arrival_ms: np.ndarray
    wait_ms: np.ndarray  # before service starts (NaN when dropped)
    service_ms: np.ndarray  # execution time (NaN when dropped)
    server: np.ndarray  # index of the server that served it (-1 when dropped)

    @property
    def latency_ms(self) -> np.ndarray:
        return self.wait_ms + self.service_ms

    @property
    def dropped(self) -> np.ndarray:
        return self.server < 0


# -- fifo -----------------------------------------------------------------------------------
def fifo_queue(
    arrival_ms: np.ndarray,
    services: Sequence[ServiceTime],
    rng: np.random.Generator,
    *,
    queue_limit: int | None = None,
    demand_ms: float = 0.0,
) -> QueueRun:
    """One FIFO queue over ``len(services)`` servers (server ``i`` draws from ``services[i]``).

    Args:
        arrival_ms: sorted arrival times in ms.
        services: one service-time distribution per server.
        rng: the random generator (service draws).
        queue_limit: the most requests that may wait; arrivals beyond it are dropped.
        demand_ms: work each request adds to its server after its own service (an
            executor's CPU on a CPU instance's cores): it delays the requests behind, not
            its own latency (:func:`~greenctl.planner.core.queueing.mgc_model`'s).
    """
    d = max(float(demand_ms), 0.0)
    n = int(arrival_ms.size)
    c = len(services)
    if c < 1:
        raise InputError("a queue needs at least one server")
    arr = arrival_ms.tolist()
    if len(set(services)) == 1 and queue_limit is None:
        # Identical servers: service times can be drawn up front, in arrival order.
        svc = services[0].sample(rng, n).tolist()
        heap = [(0.0, i) for i in range(c)]
        starts = [0.0] * n
        who = [0] * n
        replace = heapq.heapreplace
        for k in range(n):
            free, i = heap[0]
            a = arr[k]
            st = a if a > free else free
            starts[k] = st
            who[k] = i
            replace(heap, (st + svc[k] + d, i))
        start = np.array(starts)
        return QueueRun(arrival_ms, start - arrival_ms, np.array(svc), np.array(who))
    # Heterogeneous servers: the fastest idle server takes the request, else the first to
    # free up. Each request's draw becomes a time of the server it lands on.
    z = rng.standard_normal(n).tolist()
    by_speed = sorted(range(c), key=lambda i: (services[i].mean_ms, i))
    any_exp = any(s.kind == "exponential" for s in services)
    e = rng.standard_exponential(n).tolist() if any_exp else z
    # lognormal: shift + scale exp(sigma z); deterministic: scale 0; exponential: scale e
    kind = [2 if services[i].kind == "exponential" else 1 for i in by_speed]
    shift = [services[i].shift_ms for i in by_speed]
    scale = [0.0 if services[i].kind == "deterministic" else services[i].scale_ms for i in by_speed]
    sigma = [services[i].sigma for i in by_speed]
    # Servers are numbered by speed rank below (0 = fastest); mapped back at the end.
    # ``free_at[r]`` is when rank r frees up; min() and index() run at C speed, which beats
    # heaps for the few instances of one model.
    free_at = [0.0] * c
    starts = [math.nan] * n
    svc_out = [math.nan] * n
    who = [-1] * n
    exp = math.exp
    waiting: deque[float] = deque()
    limit = -1 if queue_limit is None else int(queue_limit)
    ranks = range(c)
    for k in range(n):
        a = arr[k]
        m = min(free_at)
        if m > a:  # everyone busy: wait for the first to free up
            if limit >= 0:
                while waiting and waiting[0] <= a:
                    waiting.popleft()
                if len(waiting) >= limit:
                    continue
                waiting.append(m)
            i = free_at.index(m)
            st = m
        else:  # the fastest idle server
            for i in ranks:
                if free_at[i] <= a:
                    break
            st = a
        if any_exp and kind[i] == 2:
            s = shift[i] + scale[i] * e[k]
        else:
            s = shift[i] + scale[i] * exp(sigma[i] * z[k])
        starts[k] = st
        svc_out[k] = s
        who[k] = i
        free_at[i] = st + s + d
    rank_to_server = np.array([*by_speed, -1])
    start = np.array(starts)
    return QueueRun(
        arrival_ms, start - arrival_ms, np.array(svc_out), rank_to_server[np.array(who)]
    )


def fronted_fifo(
    arrival_ms: np.ndarray,
    services: Sequence[ServiceTime],
    pooled: np.ndarray,
    fronts_ms: Sequence[float],
    rng: np.random.Generator,
    queue_limit: int | None,
    demand: np.ndarray,
    members: Sequence[Instance],
) -> QueueRun:
    """One pooled FIFO queue behind its instances' executor fronts: each request crosses
    the front of an instance drawn by the pooled queue's shares (``pooled``), then the queue
    (requests in the order they leave the fronts); waits include the front's."""
    n = arrival_ms.size
    k = len(services)
    which = rng.choice(k, size=n, p=pooled / pooled.sum()) if k > 1 else np.zeros(n, dtype=int)
    before = np.zeros(n)
    at = arrival_ms.copy()
    for j, f in enumerate(fronts_ms):
        sub = np.flatnonzero(which == j)
        if sub.size and f > 0:
            before[sub] = front_queue(arrival_ms[sub], f)
            at[sub] = arrival_ms[sub] + before[sub] + f
    order = np.argsort(at, kind="stable")
    run = fifo_queue(
        at[order], services, rng, queue_limit=queue_limit, demand_ms=float(demand[members[0].index])
    )
    back = np.empty_like(order)
    back[order] = np.arange(n)
    return QueueRun(arrival_ms, before + run.wait_ms[back], run.service_ms[back], run.server[back])


# -- wrr: stride dispatch + Lindley ---------------------------------------------------------
def stride_assign(shares: Sequence[float], n: int) -> np.ndarray:
    """Server index of each of ``n`` requests under smooth weighted round robin (stride
    scheduling): :class:`~greenctl.planner.core.policy.SmoothWRR`, the dispatcher's own."""
    return np.asarray(SmoothWRR(shares).take(n), dtype=int)


def lindley_queue(arrival_ms: np.ndarray, service_ms: np.ndarray) -> np.ndarray:
    """Waiting times of a single FIFO server, vectorised Lindley recursion.

    ``W_0 = 0``, ``W_k = max(0, W_{k-1} + S_{k-1} - (A_k - A_{k-1}))`` equals
    ``X_k - min_{j<=k} X_j`` for ``X`` the running sum of ``S_{k-1} - (A_k - A_{k-1})``.
    """
    if arrival_ms.size == 0:
        return np.zeros(0)
    u = service_ms[:-1] - np.diff(arrival_ms)
    x = np.concatenate(([0.0], np.cumsum(u)))
    return x - np.minimum.accumulate(x)


def _single_bounded(arr: np.ndarray, svc: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray]:
    """One server with at most ``limit`` waiting: (wait, accepted mask)."""
    n = arr.size
    wait = np.full(n, np.nan)
    ok = np.zeros(n, dtype=bool)
    free = 0.0
    waiting: deque[float] = deque()
    a_list, s_list = arr.tolist(), svc.tolist()
    for k in range(n):
        a = a_list[k]
        while waiting and waiting[0] <= a:
            waiting.popleft()
        if free > a and len(waiting) >= limit:
            continue
        st = a if a > free else free
        wait[k] = st - a
        ok[k] = True
        free = st + s_list[k]
        if st > a:
            waiting.append(st)
    return wait, ok


def front_queue(arrival_ms: np.ndarray, front_ms: float) -> np.ndarray:
    """Each request's wait at an executor front: one FIFO server on one core that spends
    ``front_ms`` on every request before the device sees it (Lindley's recursion). The
    device's arrivals are then ``arrival + wait + front_ms`` (in order); the request's
    latency counts the wait, not ``front_ms`` (part of the measured serving path, as
    :func:`~greenctl.planner.core.queueing.with_front` models it). Zeros without a front."""
    if front_ms <= 0 or arrival_ms.size == 0:
        return np.zeros(arrival_ms.size)
    return lindley_queue(arrival_ms, np.full(arrival_ms.size, float(front_ms)))


# -- the dispatcher ---------------------------------------------------------------------------
def dispatcher_cpu_by_model(
    stage: DispatcherStage, model_rates: Mapping[str, float]
) -> dict[str, float]:
    """Each model's dispatcher CPU (ms per request) in ``stage``, which
    :func:`~greenctl.planner.core.evaluate.dispatcher_stage` built from ``model_rates``: its
    ``cpu_ms`` pairs are the models with a share, in ``model_rates``' order (every model when
    none has a rate), a model without a measured figure already charged the measured mean.
    A model with no share (it gets no requests) takes the stage's mean.

    Raises:
        ValueError: ``stage`` was not built from these rates.
    """
    rates = {m: max(float(r), 0.0) for m, r in model_rates.items()}
    live = [m for m, r in rates.items() if r > 0] if sum(rates.values()) > 0 else list(rates)
    out = dict.fromkeys(rates, stage.mean_cpu_ms)
    out.update({m: f for m, (_, f) in zip(live, stage.cpu_ms, strict=True)})
    return out


def dispatcher_queue(arrival_ms: np.ndarray, cpu_ms: np.ndarray) -> np.ndarray:
    """Each request's wait at the dispatcher: one FIFO server (one event loop on one core)
    that every request of the plan crosses, spending ``cpu_ms[k]`` on request ``k``
    (Lindley's recursion). Executors see ``arrival + wait + cpu`` (in arrival order: one FIFO
    server keeps it); the request's latency counts the wait, not the CPU (part of the
    measured serving path, as :func:`front_queue`'s)."""
    if arrival_ms.size == 0:
        return np.zeros(0)
    return lindley_queue(arrival_ms, np.asarray(cpu_ms, dtype=float))


def held_wait(stage: DispatcherStage, path: ServingPath | None) -> tuple[float, float]:
    """The mean and variance (ms, ms^2) of the dispatcher wait that ``path``'s overhead
    samples hold, as ``predict`` takes it: the wait at the plan's rate less the growth
    :meth:`~greenctl.planner.core.evaluate.DispatcherStage.overhead_ms` adds
    (:func:`~greenctl.planner.core.queueing.wait_growth` beyond
    :meth:`~greenctl.planner.core.evaluate.DispatcherStage.held_wait`): the wait at the
    measured rate when it has grown since, the whole wait at the plan's rate when it has
    not, nothing when nothing is held. ``(0, 0)`` when the stage is overloaded."""
    return _held_moments(stage.wait(), stage.held_wait(path))


def _held_moments(now: WaitTime | None, then: WaitTime | None) -> tuple[float, float]:
    """The mean and variance of the part of a stage's wait ``now`` that samples measured
    when it was ``then`` hold, as ``predict`` takes it: ``now`` less the growth it adds
    (:func:`~greenctl.planner.core.queueing.wait_growth`); ``(0, 0)`` without either."""
    if now is None or then is None:
        return 0.0, 0.0
    mean_now, var_now = wait_moments(now)
    grown = wait_growth(now, then) if then.c_prob > 0 else now
    mean_add, var_add = wait_moments(grown) if grown is not None else (0.0, 0.0)
    return max(mean_now - mean_add, 0.0), max(var_now - var_add, 0.0)


def front_held(path: ServingPath | None, front_ms: float, rate_rps: float) -> tuple[float, float]:
    """The mean and variance (ms, ms^2) of the executor-front wait that ``path``'s overhead
    samples hold at an instance serving ``rate_rps``, as ``predict`` takes it
    (:func:`~greenctl.planner.core.evaluate.front_held_wait`); ``(0, 0)`` without a front,
    a measured rate, or when the front is overloaded."""
    if front_ms <= 0 or rate_rps <= 0:
        return 0.0, 0.0
    return _held_moments(front_wait(rate_rps, front_ms), front_held_wait(path, front_ms, rate_rps))


def held_samples(
    stage: DispatcherStage | None,
    path: ServingPath | None,
    front: tuple[float, float] = (0.0, 0.0),
) -> np.ndarray:
    """``path``'s overhead samples (``[0]`` without) with the waits they hold taken off, for
    simulated waits to be added instead: the dispatcher's (:func:`held_wait`, with a
    ``stage``) and the executor front's (``front``: :func:`front_held`'s mean and variance),
    independent of each other. Shifted down by the held mean and drawn in about their mean
    so that their variance drops by the held variance (``mean + k (O - mean)``,
    ``k = sqrt(1 - held variance / Var O)``, 0 at the least). The waits in them are
    independent of the rest of the path's time, so this is the rest's mean and variance;
    their shape is kept."""
    o = np.asarray(path.overhead_ms if path is not None else (), dtype=float)
    if o.size == 0:
        o = np.zeros(1)
    mean_held, var_held = held_wait(stage, path) if stage is not None else (0.0, 0.0)
    mean_held, var_held = mean_held + front[0], var_held + front[1]
    if mean_held == 0 and var_held == 0:
        return o
    mid = float(o.mean())
    spread = float(o.var())
    k = math.sqrt(max(spread - var_held, 0.0) / spread) if spread > 0 else 1.0
    return mid - mean_held + k * (o - mid)


def wrr_queues(
    arrival_ms: np.ndarray,
    services: Sequence[ServiceTime],
    shares: Sequence[float],
    rng: np.random.Generator,
    *,
    queue_limit: int | None = None,
    demands_ms: Sequence[float] | None = None,
    fronts_ms: Sequence[float] | None = None,
) -> QueueRun:
    """Stride-dispatched per-server FIFO queues (``shares`` sum to the fraction each gets).

    ``demands_ms``: per server, work each request adds after its service (see
    :func:`fifo_queue`); ``fronts_ms``: per server, its executor front before it
    (:func:`front_queue`, unbounded; ``queue_limit`` bounds the server's own queue)."""
    n = arrival_ms.size
    assign = stride_assign(shares, n)
    wait = np.full(n, np.nan)
    svc = np.full(n, np.nan)
    server = np.full(n, -1)
    for i, service in enumerate(services):
        idx = np.flatnonzero(assign == i)
        if idx.size == 0:
            continue
        a = arrival_ms[idx]
        s = service.sample(rng, idx.size)
        front = float(fronts_ms[i]) if fronts_ms is not None else 0.0
        before = front_queue(a, front)
        if front > 0:
            a = a + before + front
        held = s
        if demands_ms is not None and demands_ms[i] > 0:
            held = s + float(demands_ms[i])
        if queue_limit is None:
            wait[idx] = before + lindley_queue(a, held)
            svc[idx] = s
            server[idx] = i
        else:
            w, ok = _single_bounded(a, held, int(queue_limit))
            wait[idx[ok]] = before[ok] + w[ok]
            svc[idx[ok]] = s[ok]
            server[idx[ok]] = i
    return QueueRun(arrival_ms, wait, svc, server)


# -- batch ----------------------------------------------------------------------------------
def batch_queue(
    arrival_ms: np.ndarray,
    service: BatchService | ServiceTime,
    batch: int,
    rng: np.random.Generator,
    *,
    max_wait_ms: float | None = None,
    depth: int = 1,
    slots: int | None = None,
) -> QueueRun:
    """One executor batching dynamically, as ``greenctl.executor.runtime.daemon.Batcher`` does.

    A batch closes at ``batch`` rows or ``max_wait_ms`` (default
    :data:`greenctl.data.batching.DEFAULT_MAX_WAIT_MS`) after its first request, at most
    ``depth`` batches are in flight, and a batch of ``r`` rows runs for a draw of
    ``service.at(r)`` (a plain service time: every batch's). ``slots`` (>= ``batch``; None: no
    cap) is the dispatcher's cap on requests inside the executor; the rest wait in arrival
    order and that wait counts. Batches share one normal draw across sizes, so a batch's time
    rises with its rows. ``arrival_ms`` are sorted arrival times.
    """
    n = int(arrival_ms.size)
    b = max(1, int(batch))
    w = DEFAULT_MAX_WAIT_MS if max_wait_ms is None else max(float(max_wait_ms), 0.0)
    if w != w or w == math.inf:
        raise InputError(f"the max wait must be a finite number of ms, got {max_wait_ms}")
    cap = None if slots is None else max(int(slots), b)
    d = max(1, int(depth))
    arr = arrival_ms.tolist()
    z = rng.standard_normal(max(n, 1)).tolist()
    draw = _batch_sampler(service)
    finish = [0.0] * n
    start_of = np.empty(n)
    svc_of = np.empty(n)
    entry = arr if cap is None else [0.0] * n
    known = 0 if cap is not None else n  # entry times worked out so far
    ends: list[float] = []
    i = 0
    ready = 0.0  # when the batcher takes its next first request
    free = 0.0  # when the device has finished every submitted batch
    k = 0
    while i < n:
        last = min(i + b, n)
        # the dispatcher lets a request in when the one `cap` ahead of it has left (its batch,
        # at least one batch earlier, has finished)
        for j in range(known, last):
            entry[j] = arr[j] if j < cap else max(arr[j], finish[j - cap])  # type: ignore[operator]
        known = max(known, last)
        opened = max(ready, entry[i])
        deadline = opened + w
        j = i + 1
        while j < last and entry[j] <= deadline:
            j += 1
        rows = j - i
        close = max(opened, entry[j - 1]) if rows == b else deadline
        submit = close if k < d else max(close, ends[k - d])
        st = max(submit, free)
        s = draw(rows, z[k])
        free = st + s
        ends.append(free)
        for m in range(i, j):
            finish[m] = free
        start_of[i:j] = st
        svc_of[i:j] = s
        ready = free if d == 1 else submit
        i = j
        k += 1
    return QueueRun(arrival_ms, start_of - arrival_ms, svc_of, np.zeros(n, dtype=int))


def _batch_sampler(service: BatchService | ServiceTime) -> Callable[[int, float], float]:
    """A batch's time from its rows and a standard normal draw (monotone in the draw)."""
    params: dict[int, tuple[str, float, float, float]] = {}

    def draw(rows: int, z: float) -> float:
        p = params.get(rows)
        if p is None:
            svc = service.at(rows) if isinstance(service, BatchService) else service
            p = params[rows] = (svc.kind, svc.shift_ms, svc.scale_ms, svc.sigma)
        kind, shift, scale, sigma = p
        if kind == "deterministic":
            return shift
        if kind == "exponential":
            return shift - scale * math.log(max(0.5 * math.erfc(z / math.sqrt(2.0)), 1e-300))
        return shift + scale * math.exp(sigma * z)

    return draw
