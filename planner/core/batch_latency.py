"""The latency of an instance that batches dynamically, as its executor's batcher does.

A batch closes at ``b`` rows or ``max_wait`` (rules in :mod:`greenctl.data.batching`), so
the batch a request sees depends on the load. :func:`dynamic_batch` models the eager CPU
runner, the pipelined GPU runner and the dispatcher's ``b + 1`` slots; ``b == 1`` is M/G/1.
It is checked against the simulator's :func:`greenctl.planner.core.sim_queues.batch_queue`;
the model is in docs/models.md ("Dynamic batching") and docs/simulate.md ("Batching").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS, Batching
from greenctl.data.errors import InputError
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.mgc import (
    LatencyModel,
    check_quantile,
    erlang_c,
    mgc_model_of,
    shifted_model,
)
from greenctl.planner.core.stages import front_capacity_rps, with_front


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
        model = mgc_model_of(lam * 1000.0, (one,), 1.0)
        if model is None:
            return None
        return BatchPrediction(model, ((1, 1.0),), min(lam * one.mean_ms, 1.0))
    if lam <= 0:  # a lone request waits the whole window, then runs alone
        alone = mgc_model_of(0.0, (one,), 1.0)
        assert alone is not None
        return BatchPrediction(shifted_model(alone, w), ((1, 1.0),), 0.0)
    if lam * 1000.0 >= batch_capacity_rps(service):
        return None
    if service.batching.depth <= 1:
        return _eager_batching(lam, service, w)
    return _pipelined_batching(lam, service, w)


def _poisson_pmf(k: np.ndarray, mu: float | np.ndarray) -> np.ndarray:
    """P(Poisson(mu) = k) for whole ``k >= 0``, broadcasting ``k`` against ``mu``."""
    k = np.asarray(k, dtype=float)
    mu = np.asarray(mu, dtype=float)
    with np.errstate(divide="ignore"):
        logp = k * np.log(np.maximum(mu, 1e-300)) - mu - _log_factorial(k)
    out = np.exp(logp)
    return np.where(mu > 0, out, (k == 0).astype(float))


def _log_factorial(k: np.ndarray) -> np.ndarray:
    """``log(k!)`` of whole ``k >= 0``, elementwise: ``math.lgamma`` once per value up to the
    largest (the counts here are ranges of a few hundred at most), so no scipy is needed."""
    whole = k.astype(int)
    if k.size and (whole.min() < 0 or not np.array_equal(whole, k)):
        raise ValueError("log-factorial of a value that is not a whole number >= 0")
    top = int(whole.max()) if k.size else 0
    return np.array([math.lgamma(n + 1.0) for n in range(top + 1)])[whole]


def _at_least(k: int, x: float) -> float:
    """P(Poisson(x) >= k) for a whole ``k >= 1`` (the regularised lower incomplete gamma
    P(k, x)), summed on the side with the smaller mass so that nothing cancels."""
    if x <= 0:
        return 0.0
    log_x = math.log(x)

    def term(j: int) -> float:
        return math.exp(j * log_x - x - math.lgamma(j + 1.0))

    if x >= k:  # P(N < k) <= about one half: its complement loses nothing
        return max(0.0, 1.0 - math.fsum(term(j) for j in range(k)))
    total, j = 0.0, k
    while True:  # terms fall by x / (j + 1) < 1 from j = k on
        t = term(j)
        total += t
        if t <= total * 1e-17 or t == 0.0:
            return total
        j += 1


def _fill_time_ms(k: int, lam: float, limit_ms: float) -> float:
    """The mean time until the ``k``-th of Poisson(``lam``/ms) arrivals, given it comes
    within ``limit_ms`` (how long a batch that fills in its window waited to fill)."""
    if k <= 0 or lam <= 0 or limit_ms <= 0:
        return 0.0
    x = lam * limit_ms
    pk = _at_least(k, x)
    if pk <= 1e-300:
        return limit_ms
    return min(limit_ms, k / lam * _at_least(k + 1, x) / pk)


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
    requests' pre-run wait built from both.

    Kept whole: one numeric solve whose grids and fixed-point iterates feed each step."""
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
            ticks = np.arange(math.ceil(12.0 * mean_d / dz) + 2)
            delay = -np.diff(np.exp(-ticks * dz / mean_d))  # Exp(mean_d) on the grid
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
    waiting when the executor takes its next batch.

    Kept whole: one numeric solve (the chain, its stationary law, the waits it implies)."""
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
    """End-to-end latency quantile (ms) of one dynamically batching instance at ``rate_rps``.

    ``service`` is its batch service model, or one service time for every batch (then ``batch``
    is the largest batch); ``max_wait_ms`` defaults to the model's own, else
    :data:`~greenctl.data.batching.DEFAULT_MAX_WAIT_MS`.

    Returns:
        ``math.inf`` when the rate reaches :func:`batch_capacity_rps`.
    """
    check_quantile(q)
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
    check_quantile(percentile)
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
