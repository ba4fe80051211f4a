"""One service model per (variant, resource): one instance's service time from its profile rows.

The mix planner sizes instances from it and ``predict`` and ``simulate`` evaluate plans with
it, so a plan and its simulation rest on the same model. A plain measurement holds service
times (:meth:`ServiceTime.from_profile`). A load test (``capacity_rps`` within
``capacity_slo_ms``) holds latencies under load, which over-state the service time, so its
service time is the least optimistic deterministic one that reproduces the measured latency
at that load in the queueing model (:func:`~greenctl.planner.core.queueing.capacity_at_slo`).
Figures it gives are modeled, not measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import cache

import numpy as np
from greenctl.data.batching import executor_batching
from greenctl.data.errors import InputError
from greenctl.data.records import Profile
from greenctl.planner.core.latency import BatchService, ServiceTime
from greenctl.planner.core.mgc import wait_arrays
from greenctl.planner.core.queueing import capacity_at_slo

_Q_OF = {"p50": 0.5, "p95": 0.95, "p99": 0.99}


def is_load_tested(profile: Profile) -> bool:
    """Whether ``profile`` is a load test: a capacity (> 0) sustained within an SLO."""
    return (
        profile.capacity_rps is not None
        and profile.capacity_slo_ms is not None
        and float(profile.capacity_rps) > 0
    )


def load_test_row(rows: Sequence[Profile], slo_ms: float) -> Profile | None:
    """The load test a plan at ``slo_ms`` is sized from: of the rows tested within that SLO
    (``capacity_slo_ms <= slo_ms``), the one at the largest SLO, then the newest; None when
    there is none. The mix planner and the simulator both pick with this rule."""
    tested = [
        p
        for p in rows
        if p.capacity_rps is not None
        and p.capacity_slo_ms is not None
        and float(p.capacity_slo_ms) <= slo_ms
    ]
    if not tested:
        return None
    return max(tested, key=lambda p: (float(p.capacity_slo_ms or 0), p.created_at or ""))


def service_time(profile: Profile) -> ServiceTime:
    """The service time of one execution (a batch of ``profile.batch``) of ``profile``.

    A load test (:func:`is_load_tested`) gives the deterministic service time that
    reproduces it (module docstring); any other row its latency fit
    (:meth:`ServiceTime.from_profile`).

    Raises:
        InputError: naming the profile when it holds nothing to build a service time from.
    """
    if not is_load_tested(profile):
        return ServiceTime.from_profile(profile)
    cap = float(profile.capacity_rps or 0.0)
    slo = float(profile.capacity_slo_ms or 0.0)
    lat = profile.latency_ms
    key = next((k for k in ("p99", "p95", "p50") if k in lat), None)
    if key is None or slo <= 0:
        return ServiceTime.from_profile(profile)  # names what is missing
    batch_ms = load_test_service_ms(cap / profile.batch, min(lat[key], slo), _Q_OF[key])
    return ServiceTime.deterministic(batch_ms)


#: the rate grid :func:`~greenctl.planner.core.queueing.capacity_at_slo` searches: four
#: levels of 16 steps, so a capacity is a whole number of 1/65536ths of ``1000 / mean_ms``
_GRID_STEPS = 16**4


@cache
def _md1_levels(q: float) -> tuple[np.ndarray, np.ndarray]:
    """Per grid utilisation ``rho_i = i / 65536`` of one deterministic server: ``X_i``, the
    least SLO (in service times) whose ``q`` latency quantile holds at ``rho_i`` in the
    queueing model (the M/G/1 wait of :func:`~greenctl.planner.core.mgc.wait_arrays`, a
    shifted exponential, so ``X_i`` is closed form), and ``rho_i X_i`` (increasing in i).

    The model is scale free for deterministic service: at service time ``s`` and SLO ``L``
    grid level i holds exactly when ``L / s >= X_i``.
    """
    rho = np.arange(_GRID_STEPS, dtype=float) / _GRID_STEPS
    c_prob, delay, exp_mean = wait_arrays(rho * 1000.0, (1.0, 1.0, 1.0), 1, 1.0)
    ratio = c_prob / (1.0 - q)
    # P(T > X) = c_prob exp(-(X - 1 - delay) / exp_mean) for X >= 1 + delay; a level whose
    # wait probability is 1 - q to rounding (rho 1/2 at the median) holds only past the delay
    over = 1.0 + delay + exp_mean * np.log(np.maximum(ratio, 1.0))
    x = np.where(ratio > 1.0 - 1e-9, over, 1.0)
    return x, rho * x


@cache
def load_test_service_ms(rate_rps: float, latency_ms: float, q: float) -> float:
    """The deterministic service time (ms) whose single-server queue fed Poisson arrivals at
    ``rate_rps`` has its ``q`` latency quantile at ``latency_ms``: the largest ``s`` whose
    :func:`capacity_at_slo` reaches ``rate_rps`` (:func:`searched_service_ms`, found here
    in closed form on that search's grid, then 1e-9 to the feasible side).

    That capacity is ``1000 k / (65536 s)`` with k the highest grid level holding at
    ``L / s`` (:func:`_md1_levels`), so ``s* = max_i min(L / X_i, 1000 i / (65536 rate))``,
    found where ``rho_i X_i`` passes ``L rate / 1000``. Cached per load-test row.

    Raises:
        InputError: a rate or latency that is not a positive number.
    """
    _check_load_test(rate_rps, latency_ms)
    hi = min(latency_ms, 1000.0 / rate_rps)
    x, px = _md1_levels(q)
    i = int(np.searchsorted(px, latency_ms * rate_rps / 1000.0, side="right")) - 1
    best = i * 1000.0 / (_GRID_STEPS * rate_rps)
    if i + 1 < _GRID_STEPS:
        best = max(best, latency_ms / float(x[i + 1]))
    if best >= hi:
        return hi
    best *= 1.0 - 1e-9
    return best if best >= hi * 1e-6 else hi


def searched_service_ms(rate_rps: float, latency_ms: float, q: float) -> float:
    """:func:`load_test_service_ms` by search: Brent's method on ``capacity_at_slo(s) -
    rate_rps`` (non-increasing in ``s``), then the largest ``s`` on its feasible side.

    The definition the closed form reproduces (tests compare the two); about 20 capacity
    searches per row, where the closed form takes one look-up.
    """
    _check_load_test(rate_rps, latency_ms)

    def spare(service_ms: float) -> float:
        cap = capacity_at_slo(
            ServiceTime.deterministic(service_ms), slo_ms=latency_ms, percentile=q
        )
        return cap - rate_rps

    hi = min(latency_ms, 1000.0 / rate_rps)
    if spare(hi) >= 0:
        return hi
    lo = hi * 1e-6
    if spare(lo) < 0:  # not even a near-zero service time meets the load test
        return hi
    root = brent_root(spare, lo, hi, xtol=1e-12, rtol=1e-10)
    while root > lo and spare(root) < 0:
        root *= 1.0 - 1e-9
    return root


def _check_load_test(rate_rps: float, latency_ms: float) -> None:
    """Refuse a load test whose rate or latency is not a positive number."""
    for name, value in (("capacity_rps", rate_rps), ("latency", latency_ms)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"a load test's {name} must be a positive number, got {value}")


def batch_service(
    rows: Mapping[int, Profile],
    resource: str,
    batch: int,
    *,
    max_wait_ms: float | None = None,
) -> BatchService:
    """The service model of an instance batching up to ``batch`` rows on ``resource``, from
    the profile rows of its (variant, resource) by batch size (``rows``; sizes above
    ``batch`` are not used): each row's :func:`service_time`, and the executor's batching
    (:func:`greenctl.data.batching.executor_batching`, ``max_wait_ms`` None: its default).

    Raises:
        InputError: no row at any size up to ``batch``, or a row without a service time.
    """
    points = tuple(
        (int(n), service_time(p)) for n, p in sorted(rows.items()) if 1 <= int(n) <= batch
    )
    return BatchService(points, executor_batching(resource, batch, max_wait_ms=max_wait_ms))


def brent_root(
    f: Callable[[float], float], a: float, b: float, *, xtol: float, rtol: float, steps: int = 100
) -> float:
    """A root of ``f`` between ``a`` and ``b``, where ``f`` changes sign, by Brent's method.

    The iteration of ``scipy.optimize.brentq`` (its C code, step for step, so the same
    root), in plain Python: planning would otherwise import scipy.optimize, most of a
    second of a cold command, for a dozen evaluations of ``f``.
    """
    xpre, xcur = a, b
    fpre, fcur = f(xpre), f(xcur)
    if fpre == 0:
        return xpre
    if fcur == 0:
        return xcur
    if math.copysign(1.0, fpre) == math.copysign(1.0, fcur):
        raise ValueError("f(a) and f(b) must have different signs")
    xblk = fblk = spre = scur = 0.0
    for _ in range(steps):
        if fpre != 0 and fcur != 0 and math.copysign(1.0, fpre) != math.copysign(1.0, fcur):
            xblk, fblk = xpre, fpre
            spre = scur = xcur - xpre
        if abs(fblk) < abs(fcur):  # keep the best guess in xcur
            xpre, xcur, xblk = xcur, xblk, xcur
            fpre, fcur, fblk = fcur, fblk, fcur
        delta = (xtol + rtol * abs(xcur)) / 2
        sbis = (xblk - xcur) / 2
        if fcur == 0 or abs(sbis) < delta:
            return xcur
        step = sbis  # bisect unless interpolation takes a good short step
        if abs(spre) > delta and abs(fcur) < abs(fpre):
            if xpre == xblk:  # secant
                stry = -fcur * (xcur - xpre) / (fcur - fpre)
            else:  # inverse quadratic
                dpre = (fpre - fcur) / (xpre - xcur)
                dblk = (fblk - fcur) / (xblk - xcur)
                stry = -fcur * (fblk * dblk - fpre * dpre) / (dblk * dpre * (fblk - fpre))
            if 2 * abs(stry) < min(abs(spre), 3 * abs(sbis) - delta):
                spre, step = scur, stry
            else:
                spre = sbis
        else:
            spre = sbis
        scur = step
        xpre, fpre = xcur, fcur
        xcur += scur if abs(scur) > delta else math.copysign(delta, sbis)
        fcur = f(xcur)
    return xcur
