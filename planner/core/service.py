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

from greenctl.data.batching import executor_batching
from greenctl.data.errors import InputError
from greenctl.data.records import Profile
from greenctl.planner.core.latency import BatchService, ServiceTime
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


@cache
def load_test_service_ms(rate_rps: float, latency_ms: float, q: float) -> float:
    """The deterministic service time (ms) whose single-server queue fed Poisson arrivals at
    ``rate_rps`` has its ``q`` latency quantile at ``latency_ms`` (the largest such: the
    capacity at a latency falls as the service time grows, so the crossing is found by
    Brent's method).

    Cached without a bound: each key is one stored load-test row's figures, so the cache
    grows only with the rows read, and a second plan over a fleet reuses every answer.

    Raises:
        InputError: a rate or latency that is not a positive number.
    """
    for name, value in (("capacity_rps", rate_rps), ("latency", latency_ms)):
        if not (math.isfinite(value) and value > 0):
            raise InputError(f"a load test's {name} must be a positive number, got {value}")

    def spare(service_ms: float) -> float:  # non-increasing in the service time
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
    # Brent's method on the crossing (about 12 capacity searches where bisection took 30),
    # then the largest service time on the feasible side of it
    root = brent_root(spare, lo, hi, xtol=1e-12, rtol=1e-10)
    while root > lo and spare(root) < 0:
        root *= 1.0 - 1e-9
    return root


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
