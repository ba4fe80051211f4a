"""Discrete-event simulation of a serving configuration: the check on the analytic path.

Requests arrive (Poisson or a trace, :mod:`greenctl.planner.core.loads`), are split over models
in proportion to their rates (independent thinning, so each model sees a Poisson stream),
and are dispatched by a policy:

- ``fifo``: one central FIFO queue per model; a request goes to the fastest idle instance,
  else waits for whichever instance frees up first. Heaps over the idle instances (by
  speed) and the busy ones (by free time); the loop is plain Python, ~1-2 us per request
  (identical instances: one heap, service times drawn up front).
- ``wrr``: stride scheduling over instances by their shares (quota, else capacity, split
  evenly over a deployment's instances): instance ``i``'s ``k``-th request is the one with
  the ``k``-th smallest virtual time ``(k + 1/2) / p_i``. Each instance is then a FIFO
  queue solved by Lindley's recursion in closed form,
  ``W = X - cummin(X)`` with ``X`` the running sum of (service - interarrival): numpy only.
- ``batch``: the same shares, each an independent thinning of the arrivals (a Poisson
  stream per instance, as the analytic model takes it); each instance batches as its executor does
  (:func:`batch_queue`): a batch closes when it holds ``batch`` requests or ``max_wait_ms``
  after the batcher took its first (the executors' default, or a glet's planned duty cycle),
  at most ``depth`` batches are in flight (2 on GPUs, whose runner pads a batch to a prepared
  size; 1 on CPUs), the dispatcher lets at most ``batch + 1`` requests into an executor, and
  a batch of ``r`` rows runs for a draw of the service model at its padded size
  (:class:`~greenctl.planner.core.latency.BatchService`).

With the dispatcher's CPU per request measured (a serving path's ``dispatcher_cpu_ms``), every
request first crosses the dispatcher, one FIFO server for the whole plan, before the split
to models and instances (:func:`dispatcher_queue`, the stage ``predict`` models,
:class:`~greenctl.planner.core.evaluate.DispatcherStage`).

Service times are drawn from each instance's :class:`~greenctl.planner.core.latency.ServiceTime`.
The first ``warmup_frac`` of requests are left out of the latency statistics. A bounded
queue (``queue_limit`` waiting requests per queue) drops arrivals that find it full
(``fifo`` and ``wrr``).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan, check_families
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.evaluate import (
    PREDICTED_KEYS,
    DispatcherStage,
    Instance,
    ServingInput,
    ServingPath,
    SloInput,
    account,
    build_instances,
    check_policy,
    front_held_wait,
    instances_dispatcher,
    path_serves,
    predict,
    served_batches,
    served_service,
    serving_path,
    slo_for,
    spare_idle_w,
    split_load,
)
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.loads import check_arrivals, poisson_arrivals
from greenctl.planner.core.policy import SmoothWRR, plan_policy
from greenctl.planner.core.queueing import (
    WaitTime,
    front_capacity_rps,
    front_wait,
    pooled_shares,
    wait_growth,
    wait_moments,
)
from greenctl.planner.core.service import load_test_row


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


def _fronted_fifo(
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

    The batcher takes the first waiting request when it is ready for the next batch (at
    once with ``depth`` >= 2, when the running batch has finished with ``depth`` 1), adds
    requests until the batch holds ``batch`` or ``max_wait_ms`` has passed since it took the
    first, and submits it once fewer than ``depth`` batches are in flight; the device runs
    batches in order, a batch of ``r`` rows for a draw of ``service.at(r)`` (the padded size's
    time; a plain :class:`ServiceTime` is every batch's time). With ``slots``, at most that
    many requests are inside the executor at once (the dispatcher's cap,
    :func:`greenctl.data.batching.dispatcher_slots`); the others wait in arrival order for a
    batch to finish, and that wait counts in their latency. Batches share one standard
    normal draw across sizes (common random numbers), so a batch's time rises with its rows.

    Args:
        arrival_ms: sorted arrival times in ms.
        service: the batch service model (or one service time for every batch).
        batch: the most rows in a batch.
        rng: the random generator (service draws).
        max_wait_ms: default :data:`greenctl.data.batching.DEFAULT_MAX_WAIT_MS`.
        depth: batches in flight at once.
        slots: requests inside the executor at once (>= ``batch``); None: no cap.
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


# -- whole configuration --------------------------------------------------------------------
def simulate(
    deployments: Sequence[Deployment],
    profiles: Mapping[tuple[str, str, int], Profile],
    variants: Mapping[str, Variant],
    *,
    rate_rps: float | None = None,
    arrivals_s: np.ndarray | None = None,
    duration_s: float | None = None,
    n_requests: int | None = None,
    policy: str = "fifo",
    seed: int = 0,
    queue_limit: int | None = None,
    percentile_slo_ms: SloInput = None,
    carbon_g_per_kwh: float | None = None,
    pue: float = 1.0,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    device_idle_power_w: float | None = None,
    max_wait_ms: float | None = None,
    warmup_frac: float = 0.01,
    serving: ServingInput | None = None,
    spare_idle_w: float = 0.0,
) -> dict[str, Any]:
    """Simulate a configuration; returns the same keys as :func:`~greenctl.planner.core.evaluate.predict`.

    Args:
        rate_rps: Poisson rate, used when ``arrivals_s`` is not given.
        arrivals_s: sorted arrival times in seconds (e.g. from a trace).
        duration_s / n_requests: the length of a Poisson run (default 100,000 requests).
        seed: makes the run reproducible.
        queue_limit: waiting requests per queue beyond which arrivals are dropped.
        warmup_frac: leading fraction of requests left out of latency statistics.
        spare_idle_w: idle power no instance carries, as
            :func:`~greenctl.planner.core.evaluate.predict`.
        serving: the measured serving path, as :func:`~greenctl.planner.core.evaluate.predict`
            takes it and models it: each request adds a draw of its overhead samples; an
            instance on the resource the path was measured on runs its served runs
            (:func:`~greenctl.planner.core.evaluate.served_service`), a CPU instance's
            executor CPU delaying the requests behind, and a GPU, MIG or MPS instance's
            executor front runs before its device (:func:`front_queue`; under ``fifo`` each
            instance's front takes its share of the pooled queue, as ``predict`` models it),
            its samples less the front's wait they hold at the rate the instance served
            (:func:`front_held`, taken off as the dispatcher's below). Where the modeled
            front holds more spread than the samples have (the H200's resnet50 at batch 32,
            a 0.59 ms front modeled 88 % busy at 1,500 req/s, its samples' p95 1.6 ms above
            their p50), the simulated wait comes out above what ``predict`` adds: p95 12.4
            against 10.8 ms (measured 9.2-10.9; the whole wait on the raw samples, as before
            this rule: 15.7).
            Where a path has the dispatcher's CPU measured, the dispatcher runs as the serial
            stage ``predict`` models (:func:`~greenctl.planner.core.evaluate.dispatcher_stage`,
            at the run's rate): every request crosses it first, in arrival order before the
            split to models and instances, taking its model's CPU figure
            (:func:`dispatcher_queue`), and reaches its executor at ``arrival + wait + CPU``.
            Its overhead is then ``max(O' + W, 0)``: ``W`` its simulated wait, ``O'`` a draw
            of its path's samples (0 without) less the dispatcher wait they hold
            (:func:`held_samples`). The samples were measured through the dispatcher and hold
            its CPU and its wait at the rate they were measured at, independent of the rest
            of the path's time; :func:`held_wait` says that wait's mean and variance as
            ``predict`` takes them (:func:`~greenctl.planner.core.queueing.wait_growth`):
            the modeled wait at the measured rate when the wait has grown since, the whole
            wait at the plan's rate when it has not (``predict`` adds nothing then: the
            measurement stands), nothing when the path was not measured through it (no
            measured rate or no dispatcher figure of its own: the whole wait is added). The
            samples are shifted down by that mean and drawn in about their own mean until
            their variance has dropped by that variance, so ``O' + W`` has ``predict``'s mean
            and variance with the modeled wait replaced by the simulated one (the simulated
            wait in full: a trace's bursts, its tie to the executors' arrivals). Taking the
            mean alone off, samples measured at a 60-75 % busy dispatcher held its spread
            twice: the simulated p95 up to 13 % above a run of the path's own time plus the
            whole simulated wait, against within 0.3 % this way (5 ms of dispatcher CPU,
            eight lightly loaded CPU instances, 60-90 % busy). A dispatcher at or past its
            capacity saturates the run (overloaded, as ``predict``); its own queue is
            unbounded (``queue_limit`` bounds the executors'). No dispatcher CPU measured:
            no stage, and the run is the same as before, bit for bit.
        Others: as in :func:`~greenctl.planner.core.evaluate.predict`.

    The run is ``overloaded`` when the offered rate reaches a queue's capacity (the
    dispatcher's included), or when
    more than 2 % of the requests (and at least 100) are still queued when arrivals stop;
    then ``p50/p95/p99_ms`` are ``math.inf``. ``dropped_rps`` counts drops by a bounded
    queue plus, when overloaded, the backlog left at the end.
    """
    instances = build_instances(deployments, profiles, max_wait_ms=max_wait_ms, serving=serving)
    check_policy(policy, instances)
    if queue_limit is not None and queue_limit < 0:
        raise InputError(f"queue limit must be >= 0, got {queue_limit}")
    if queue_limit is not None and policy == "batch":
        raise InputError("a bounded queue is simulated for the fifo and wrr policies only")
    if not 0 <= warmup_frac < 1:
        raise InputError(f"warm-up fraction must be in [0, 1), got {warmup_frac}")
    given_arrivals = arrivals_s is not None
    if arrivals_s is None:
        if rate_rps is None:
            raise InputError("give a rate or arrival times")
        arrivals_s = poisson_arrivals(rate_rps, duration_s=duration_s, n=n_requests, seed=seed)
    arrivals = np.asarray(arrivals_s, dtype=float)
    n = int(arrivals.size)
    if n == 0:
        raise InputError("the load has no requests", hint="raise the rate, duration or scale")
    if duration_s is not None:
        horizon_s = float(duration_s)
    elif given_arrivals:  # a trace: whole seconds
        horizon_s = float(max(math.ceil(arrivals[-1]), 1.0))
    else:
        horizon_s = float(max(arrivals[-1], 1e-9))
    offered = n / horizon_s
    model_rate, shares = split_load(instances, deployments, offered)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 7919]))
    models = list(model_rate)
    total = sum(model_rate.values())
    if len(models) > 1 and total > 0:
        probs = np.array([model_rate[m] / total for m in models])
        which = rng.choice(len(models), size=n, p=probs)
    else:
        which = np.zeros(n, dtype=int)
    arrival_ms = arrivals * 1000.0
    horizon_ms = horizon_s * 1000.0
    # the dispatcher, as predict builds it: one FIFO server all the requests cross first
    stage = instances_dispatcher(instances, model_rate, shares, serving)
    at_ms = arrival_ms  # when each request reaches its executor
    dispatch_wait = np.zeros(0)
    if stage is not None:
        by_model = dispatcher_cpu_by_model(stage, model_rate)
        cpu = np.array([by_model[m] for m in models])[which]
        dispatch_wait = dispatcher_queue(arrival_ms, cpu)
        at_ms = arrival_ms + dispatch_wait + cpu

    latency = np.full(n, np.nan)
    slo_ms = np.full(n, np.inf)  # the SLO each request is held to (its instance's variant's)
    served_count = np.zeros(len(instances))
    busy_ms = np.zeros(len(instances))
    # per instance: the executor CPU (ms per request) on its cores, from the serving path
    demand = np.zeros(len(instances))
    backlog = 0
    saturated = stage is not None and stage.overloaded  # its queue grows: as predict

    # by path and the front's held wait: held_samples
    held: dict[tuple[ServingPath | None, tuple[float, float]], np.ndarray] = {}

    def served(inst: Instance, rate: float, busy_frac: float) -> ServiceTime:
        """The service an instance runs at its rate: as ``predict`` serves it where its
        serving path was measured on its resource, else its profiled service."""
        path = serving_path(serving, inst.model, inst.variant, inst.resource)
        if path is None or not path_serves(path, inst.resource):
            return inst.service
        svc, demand[inst.index] = served_service(inst, rate, busy_frac, path)
        return svc

    for mi, m in enumerate(models):
        members = [i for i in instances if i.model == m]
        idx = np.flatnonzero(which == mi)
        if idx.size == 0:
            continue
        a = at_ms[idx]
        rate = model_rate[m]
        if policy == "fifo":
            saturated |= rate >= sum(i.capacity_rps for i in members)
            services = [i.service for i in members]
            pooled = pooled_shares(rate, services) if serving is not None else None
            if pooled is not None:
                services = [
                    served(i, rate * float(g), rate * float(g) / i.capacity_rps)
                    for i, g in zip(members, pooled, strict=True)
                ]
            fronts = [i.front_ms for i in members]
            if pooled is not None and any(f > 0 for f in fronts):
                # each instance's front takes its share of the pooled queue (as predict)
                saturated |= any(
                    rate * float(g) >= front_capacity_rps(f)
                    for g, f in zip(pooled, fronts, strict=True)
                )
                run = _fronted_fifo(a, services, pooled, fronts, rng, queue_limit, demand, members)
            else:
                run = fifo_queue(
                    a,
                    services,
                    rng,
                    queue_limit=queue_limit,
                    demand_ms=float(demand[members[0].index]),
                )
            runs = [(run, members)]
        else:
            sh = [shares[i.index] for i in members]
            saturated |= any(
                rate * s >= i.served_capacity_rps for s, i in zip(sh, members, strict=True)
            )
            if policy == "wrr":
                services = [i.service for i in members]
                if serving is not None:
                    services = [
                        served(i, rate * s, min(rate * s / i.capacity_rps, 1.0))
                        for s, i in zip(sh, members, strict=True)
                    ]
                run = wrr_queues(
                    a,
                    services,
                    sh,
                    rng,
                    queue_limit=queue_limit,
                    demands_ms=[float(demand[i.index]) for i in members],
                    fronts_ms=[i.front_ms for i in members],
                )
                runs = [(run, members)]
            else:
                # each instance's share as an independent thinning, a Poisson stream as
                # predict() models it (the dispatcher's batch policy fills the busiest
                # instance first, which neither models)
                assign = (
                    rng.choice(len(members), size=idx.size, p=np.asarray(sh) / sum(sh))
                    if len(members) > 1
                    else np.zeros(idx.size, dtype=int)
                )
                runs = []
                for k, inst in enumerate(members):
                    sub = np.flatnonzero(assign == k)
                    if sub.size == 0:
                        continue
                    # an accelerator's executor front, then the device (none: as they come)
                    before = front_queue(a[sub], inst.front_ms)
                    at = a[sub] + before + inst.front_ms if inst.front_ms > 0 else a[sub]
                    r_k = rate * sh[k]
                    if inst.batches is None:  # batch 1: a FIFO server
                        svc = inst.service
                        if serving is not None:
                            svc = served(inst, r_k, min(r_k / inst.capacity_rps, 1.0))
                        b = batch_queue(at, svc, 1, rng)
                    else:
                        # the runs predict() models at this rate (cold runs at light load)
                        path = serving_path(serving, inst.model, inst.variant, inst.resource)
                        got = served_batches(inst, r_k, path)
                        if got is not None:
                            demand[inst.index] = got[1]
                        how = inst.batches.batching
                        b = batch_queue(
                            at,
                            inst.batches if got is None else got[0],
                            inst.batch,
                            rng,
                            max_wait_ms=how.max_wait_ms,
                            depth=how.depth,
                            slots=how.slots,
                        )
                    run_full = QueueRun(
                        a, np.full(a.size, np.nan), np.full(a.size, np.nan), np.full(a.size, -1)
                    )
                    run_full.wait_ms[sub] = before + b.wait_ms
                    run_full.service_ms[sub] = b.service_ms
                    run_full.server[sub] = k
                    runs.append((run_full, members))
        for run, mem in runs:
            ok = ~run.dropped
            lat = run.latency_ms
            finish = run.arrival_ms + lat
            for k, inst in enumerate(mem):
                sel = ok & (run.server == k)
                if not sel.any():
                    continue
                count = int(sel.sum())
                served_count[inst.index] += count
                slo = slo_for(percentile_slo_ms, [inst.variant])
                if slo is not None:
                    slo_ms[idx[sel]] = slo
                backlog += int((finish[sel] > horizon_ms).sum())
                busy_ms[inst.index] += _busy_time(run, sel, inst, policy)
                busy_ms[inst.index] += count * float(demand[inst.index])
                path = serving_path(serving, inst.model, inst.variant, inst.resource)
                # the front's wait the samples hold, at the rate this instance served
                front = front_held(path, inst.front_ms, count / horizon_s)
                if stage is not None or front != (0.0, 0.0):
                    # the samples less the waits they hold, plus the simulated ones
                    key = (path, front)
                    if key not in held:
                        held[key] = held_samples(stage, path, front)
                    rest = held[key]
                    if path is not None and path.overhead_ms:  # else one point: 0 less H
                        rest = rest[rng.integers(0, rest.size, count)]
                    if stage is not None:
                        rest = rest + dispatch_wait[idx[sel]]
                    lat[sel] += np.maximum(rest, 0.0)
                elif path is not None and path.overhead_ms:  # the serving path's own time
                    samples = np.asarray(path.overhead_ms, dtype=float)
                    lat[sel] += samples[rng.integers(0, samples.size, count)]
            latency[idx[ok]] = lat[ok]
    overloaded = saturated or backlog > max(100, 0.02 * n)
    served_rps = served_count / horizon_s
    if overloaded:
        # the backlog never clears: count it as not served
        scale = max(served_count.sum() - backlog, 0.0) / max(served_count.sum(), 1.0)
        served_rps = served_rps * scale
    busy = np.minimum(busy_ms / horizon_ms, 1.0)
    result = account(
        instances,
        variants,
        rate_rps=offered,
        served_rps=served_rps.tolist(),
        busy_frac=busy.tolist(),
        carbon_g_per_kwh=carbon_g_per_kwh,
        pue=pue,
        wue_l_per_kwh=wue_l_per_kwh,
        ewif_l_per_kwh=ewif_l_per_kwh,
        device_idle_power_w=device_idle_power_w,
        spare_idle_w=spare_idle_w,
    )
    start = int(n * warmup_frac)
    steady = latency[start:]
    measured = steady[~np.isnan(steady)]
    if overloaded:
        result.update(p50_ms=math.inf, p95_ms=math.inf, p99_ms=math.inf)
    elif measured.size:
        p50, p95, p99 = np.percentile(measured, [50, 95, 99])
        result.update(p50_ms=float(p50), p95_ms=float(p95), p99_ms=float(p99))
    else:
        result.update(p50_ms=None, p95_ms=None, p99_ms=None)
    if percentile_slo_ms is not None:
        held = slo_ms[start:][~np.isnan(steady)]
        late = int((measured > held).sum())
        lost = int(np.isnan(steady).sum())
        frac = (late + lost) / max(steady.size, 1)
        result["slo_violation_frac"] = 1.0 if saturated else frac
    result["overloaded"] = bool(overloaded)
    with_slo = percentile_slo_ms is not None
    return {k: result.get(k) for k in PREDICTED_KEYS if with_slo or k != "slo_violation_frac"}


def _busy_time(run: QueueRun, sel: np.ndarray, inst: Instance, policy: str) -> float:
    """Execution time (ms) an instance spent on the selected requests."""
    if policy != "batch":
        return float(run.service_ms[sel].sum())
    # a batch's members share one start; count each batch's execution once (to a ns: the
    # waits of requests that crossed an executor front are sums of two parts)
    starts = np.round(run.arrival_ms[sel] + run.wait_ms[sel], 6)
    svc = run.service_ms[sel]
    _, first = np.unique(starts, return_index=True)
    return float(svc[first].sum())


# -- plans ----------------------------------------------------------------------------------
def default_rate(plan: Plan) -> float:
    """The load a plan was made for: ``predicted.rate_rps``, else ``request.rate_rps``,
    else the sum of its quotas.

    Raises:
        InputError: when the plan states none of them.
    """
    for source in (plan.predicted, plan.request):
        value = source.get("rate_rps") if isinstance(source, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    quotas = [d.quota_rps for d in plan.deployments]
    if quotas and all(q is not None for q in quotas) and sum(q or 0.0 for q in quotas) > 0:
        return float(sum(q or 0.0 for q in quotas))
    raise InputError(
        "the plan states no rate (predicted.rate_rps, request.rate_rps or quotas)",
        hint="pass --rate RPS or --trace FILE",
    )


def evaluate_plan(
    plan: Plan,
    profiles: Sequence[Profile],
    variants: Sequence[Variant],
    *,
    rate_rps: float | None = None,
    trace: np.ndarray | Sequence[float] | None = None,
    trace_scale: float = 1.0,
    duration_s: float | None = None,
    n_requests: int | None = None,
    policy: str | None = None,
    analytic: bool = False,
    seed: int = 0,
    queue_limit: int | None = None,
    percentile_slo_ms: float | None = None,
    carbon_g_per_kwh: float | None = None,
    pue: float = 1.0,
    wue_l_per_kwh: float | None = None,
    ewif_l_per_kwh: float | None = None,
    device_idle_power_w: float | None = None,
    serving: ServingInput | None = None,
) -> dict[str, Any]:
    """Predict (``analytic``) or simulate what a plan does under a load.

    Args:
        plan: the plan document.
        profiles: profiles to draw service times from (the newest of each
            variant/resource/batch is used; see :func:`pick_profiles`).
        variants: variants, for accuracy (and to refuse a deployment whose ``model`` is not
            its variant's family).
        rate_rps: Poisson load; default :func:`default_rate`.
        trace: requests per second to replay instead (Poisson within each second; read a
            file with :func:`greenctl.data.traces.read_rps_trace`); ``duration_s`` keeps
            its first seconds. The analytic path uses its mean.
        trace_scale: multiplies the trace.
        duration_s / n_requests: the length of a Poisson run.
        policy: ``fifo``, ``wrr`` or ``batch``, wins over the plan's own; default
            :func:`~greenctl.planner.core.policy.plan_policy`, the policy ``apply`` serves with.
        analytic: use the fast analytic path instead of the simulator.
        serving: the measured serving paths (as :func:`simulate` and
            :func:`~greenctl.planner.core.evaluate.predict` take them); None: the model's
            latency alone.
        Others: as in :func:`simulate`.

    Returns:
        The metrics dict (the plan's ``predicted`` keys).
    """
    from greenctl.planner.core.loads import trace_arrivals

    if percentile_slo_ms is not None and not (
        math.isfinite(percentile_slo_ms) and percentile_slo_ms > 0
    ):
        raise InputError(
            f"the latency SLO must be a number of ms > 0, got {percentile_slo_ms}",
            hint="for example --slo-ms 500",
        )
    if not (math.isfinite(trace_scale) and trace_scale > 0):
        raise InputError(f"the trace scale must be a number > 0, got {trace_scale}")
    pol = plan_policy(plan, policy)
    by_name = {v.name: v for v in variants}
    sized = sized_slo_ms(plan, by_name, percentile_slo_ms)
    table = pick_profiles(profiles, sized)
    check_families(plan.deployments, {v.name: v.family for v in variants})
    # without an SLO asked for, a plan of models with SLOs of their own (glet) is held to them
    slo: SloInput = percentile_slo_ms
    if slo is None and model_slos(plan):
        slo = sized
    common: dict[str, Any] = dict(
        policy=pol,
        percentile_slo_ms=slo,
        carbon_g_per_kwh=carbon_g_per_kwh,
        pue=pue,
        wue_l_per_kwh=wue_l_per_kwh,
        ewif_l_per_kwh=ewif_l_per_kwh,
        device_idle_power_w=device_idle_power_w,
        spare_idle_w=spare_idle_w(plan),  # a MIG GPU's slices no instance holds idle too
        serving=serving,
    )
    if trace is not None:
        if rate_rps is not None:
            raise InputError("give a rate or a trace, not both")
        if n_requests is not None:
            raise InputError("a trace sets the number of requests: use --duration to cut it")
        series = np.asarray(trace, float)
        if duration_s is not None:
            if duration_s < 1:
                raise InputError(f"duration must be at least 1 s for a trace, got {duration_s}")
            series = series[: int(duration_s)]
        if analytic:
            return predict(
                plan.deployments,
                table,
                by_name,
                rate_rps=float(series.mean()) * trace_scale,
                **common,
            )
        _check_requests(float(np.sum(series)) * trace_scale, "the trace (times --scale)")
        arrivals = trace_arrivals(series, seed=seed, scale=trace_scale)
        return simulate(
            plan.deployments,
            table,
            by_name,
            arrivals_s=arrivals,
            seed=seed,
            queue_limit=queue_limit,
            **common,
        )
    rate = default_rate(plan) if rate_rps is None else float(rate_rps)
    if analytic:
        return predict(plan.deployments, table, by_name, rate_rps=rate, **common)
    if n_requests is not None:
        _check_requests(float(n_requests), "--requests")
    elif duration_s is not None and math.isfinite(rate) and math.isfinite(duration_s):
        _check_requests(rate * duration_s, "--rate times --duration")
    return simulate(
        plan.deployments,
        table,
        by_name,
        rate_rps=rate,
        duration_s=duration_s,
        n_requests=n_requests,
        seed=seed,
        queue_limit=queue_limit,
        **common,
    )


def _check_requests(expected: float, what: str) -> None:
    """Refuse a run of more than :data:`~greenctl.planner.core.loads.MAX_ARRIVALS` requests."""
    check_arrivals(
        expected, what, hint="shorten the run (--duration / --requests), or use --analytic"
    )


def sized_slo_ms(
    plan: Plan, variants: Mapping[str, Variant], fallback_ms: float | None = None
) -> dict[str, float]:
    """The SLO (ms) each variant of ``plan`` was sized for: its own model's ``slo_ms`` in
    ``request.models`` (a glet plan, :func:`model_slos`), else its model's in
    ``request.families``, else ``request.slo_ms``, else ``fallback_ms``; variants without
    one are left out."""
    req = plan.request if isinstance(plan.request, dict) else {}
    own = model_slos(plan)
    by_model: dict[str, float] = {}
    fams = req.get("families")
    for fam in fams if isinstance(fams, list) else []:
        if isinstance(fam, dict) and isinstance(fam.get("model"), str):
            slo = _ms(fam.get("slo_ms"))
            if slo is not None:
                by_model[fam["model"]] = slo
    default = _ms(req.get("slo_ms"))
    if default is None:
        default = fallback_ms
    out: dict[str, float] = {}
    for dep in plan.deployments:
        family = variants[dep.variant].family if dep.variant in variants else dep.model
        slo = own.get(dep.variant, by_model.get(family, by_model.get(dep.model, default)))
        if slo is not None:
            out[dep.variant] = slo
    return out


def _ms(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value > 0 else None


def served_model_slos(plan: Plan) -> dict[str, float]:
    """The SLO (ms) each model a client asks for (a deployment's ``model``) is held to where
    the plan's models have their own (:func:`model_slos`): the strictest of its variants'."""
    own = model_slos(plan)
    out: dict[str, float] = {}
    for dep in plan.deployments:
        if dep.variant in own:
            out[dep.model] = min(own[dep.variant], out.get(dep.model, own[dep.variant]))
    return out


def model_slos(plan: Plan) -> dict[str, float]:
    """Each variant's own SLO (ms) where the plan's request gives its models one each
    (``request.models``: name, variant, slo_ms, as a glet plan records them; a variant two
    models share takes the stricter); empty for other plans."""
    req = plan.request if isinstance(plan.request, dict) else {}
    models = req.get("models")
    out: dict[str, float] = {}
    for m in models if isinstance(models, list) else []:
        if not isinstance(m, dict):
            continue
        variant, slo = m.get("variant") or m.get("name"), _ms(m.get("slo_ms"))
        if isinstance(variant, str) and slo is not None:
            out[variant] = min(slo, out.get(variant, slo))
    return out


def pick_profiles(
    profiles: Sequence[Profile], slo_ms: Mapping[str, float] | None = None
) -> dict[tuple[str, str, int], Profile]:
    """One profile per (variant, resource, batch).

    With the SLO a variant was sized for (``slo_ms``, by variant name), the load test the
    mix planner sized it from (:func:`greenctl.planner.core.service.load_test_row`) when there is
    one; otherwise prefer rows with latency percentiles, then without a capacity SLO (a
    plain measurement), then the newest.
    """

    def rank(p: Profile) -> tuple[int, int, str, int]:
        return (
            1 if p.latency_p50_ms is not None else 0,
            1 if p.capacity_slo_ms is None else 0,
            p.created_at or "",
            p.id or 0,
        )

    best: dict[tuple[str, str, int], Profile] = {}
    rows: dict[tuple[str, str, int], list[Profile]] = {}
    for p in profiles:
        key = (p.variant, p.resource, p.batch)
        rows.setdefault(key, []).append(p)
        if key not in best or rank(p) > rank(best[key]):
            best[key] = p
    for key, group in rows.items():
        slo = (slo_ms or {}).get(key[0])
        row = load_test_row(group, slo) if slo is not None else None
        if row is not None and (row.capacity_rps or 0) > 0:
            best[key] = row
    return best
