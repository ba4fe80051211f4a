"""Service-time distributions fitted to profiled latency percentiles.

A :class:`ServiceTime` is the time (ms) one instance needs for one unit of work (a request,
or a batch of ``b`` for a batch-``b`` profile): ``deterministic`` (always ``shift_ms``),
``lognormal`` (``shift_ms`` plus a lognormal of median ``scale_ms``) or ``exponential``
(``shift_ms + Exp(mean=scale_ms)``, for M/M/c checks). :meth:`ServiceTime.from_percentiles`
fits the stored ``p50``/``p95``/``p99``, falling back to a conservative unshifted lognormal
when no shifted one fits; the rules are in docs/models.md ("Service-time fits").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from statistics import NormalDist
from typing import TYPE_CHECKING, Literal

import numpy as np
from greenctl.data.batching import Batching
from greenctl.data.errors import InputError

if TYPE_CHECKING:
    from greenctl.data.records import Profile

Kind = Literal["deterministic", "lognormal", "exponential"]

_STD = NormalDist()
Z50 = 0.0
Z95 = _STD.inv_cdf(0.95)
Z99 = _STD.inv_cdf(0.99)
_Z_OF = {"p50": Z50, "p95": Z95, "p99": Z99}

# Equiprobable nodes used by the queueing module's numerical convolutions.
N_NODES = 64
# Gauss-Legendre points and weights mapped to (0, 1).
_gl_x, _gl_w = np.polynomial.legendre.leggauss(32)
_GL_X = (_gl_x + 1.0) / 2.0
_GL_W = _gl_w / 2.0
_Z_LO = -7.0  # Phi(-7) ~ 1e-12: the lognormal's mass below it is negligible
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_SQRT_HALF = math.sqrt(0.5)
#: arrays up to this size take :func:`ndtr`'s per-element path, which needs no scipy
_SMALL_NDTR = 64


def ndtr(x: np.ndarray | float, *, erfc: bool = False) -> np.ndarray:
    """The standard normal CDF, elementwise.

    Small arrays (planning evaluates a handful of times) go through ``math.erfc`` (within
    1e-13 relative of scipy's, deep tail included), so that planning does not import scipy,
    about half a second of a cold command; larger ones through ``scipy.special.ndtr``,
    unless ``erfc`` (the values a small array would get, at any size).
    """
    a = np.asarray(x, dtype=float)
    if a.size > _SMALL_NDTR and not erfc:
        from scipy.special import ndtr as vectorised  # lazy: scipy is a heavy import

        return np.asarray(vectorised(a), dtype=float)
    values = [0.5 * math.erfc(-v * _SQRT_HALF) for v in a.ravel().tolist()]
    return np.array(values, dtype=float).reshape(a.shape)


@dataclass(frozen=True)
class ServiceTime:
    """A service-time distribution in milliseconds (see the module docstring).

    Build one with :meth:`from_percentiles`, :meth:`deterministic`, :meth:`exponential`,
    :meth:`lognormal` or :meth:`from_profile`. Instances are immutable and hashable, so
    the queueing functions can cache on them.
    """

    kind: Kind
    shift_ms: float
    scale_ms: float = 0.0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in ("deterministic", "lognormal", "exponential"):
            raise InputError(f"unknown service-time kind {self.kind!r}")
        for name in ("shift_ms", "scale_ms", "sigma"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise InputError(f"service time {name} must be a finite number >= 0, got {value}")
        if self.kind == "deterministic" and self.shift_ms <= 0:
            raise InputError(f"a deterministic service time must be > 0 ms, got {self.shift_ms}")
        if self.kind != "deterministic" and self.scale_ms <= 0:
            raise InputError(f"service time scale_ms must be > 0, got {self.scale_ms}")

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def deterministic(cls, ms: float) -> ServiceTime:
        """Always exactly ``ms`` milliseconds."""
        return cls("deterministic", float(ms))

    @classmethod
    def exponential(cls, mean_ms: float, *, shift_ms: float = 0.0) -> ServiceTime:
        """``shift_ms`` plus an exponential part of mean ``mean_ms - shift_ms``."""
        return cls("exponential", float(shift_ms), float(mean_ms) - float(shift_ms))

    @classmethod
    def lognormal(cls, *, median_ms: float, sigma: float, shift_ms: float = 0.0) -> ServiceTime:
        """``shift_ms + exp(N(log(median_ms), sigma^2))``; ``sigma == 0`` is deterministic."""
        if sigma <= 0:
            return cls.deterministic(shift_ms + median_ms)
        return cls("lognormal", float(shift_ms), float(median_ms), float(sigma))

    @classmethod
    def from_percentiles(
        cls, p50: float, p95: float | None = None, p99: float | None = None
    ) -> ServiceTime:
        """Fit a (shifted) lognormal to the known latency percentiles (ms).

        Raises:
            InputError: a percentile is not positive, or they decrease.
        """
        known = {k: v for k, v in (("p50", p50), ("p95", p95), ("p99", p99)) if v is not None}
        for key, value in known.items():
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise InputError(f"latency {key} must be a positive number of ms, got {value!r}")
        values = list(known.values())
        if any(b < a for a, b in itertools.pairwise(values)):
            raise InputError(
                "latency percentiles must not decrease (p50 <= p95 <= p99), got "
                + ", ".join(f"{k}={v}" for k, v in known.items())
            )
        if len(known) == 1 or values[0] == values[-1]:
            return cls.deterministic(values[0])
        if len(known) == 3:
            fitted = _fit_three(float(p50), float(p95), float(p99))  # type: ignore[arg-type]
            if fitted is not None:
                return fitted
            return _fit_two(("p50", float(p50)), ("p95", float(p95)))  # type: ignore[arg-type]
        (k1, v1), (k2, v2) = list(known.items())
        return _fit_two((k1, float(v1)), (k2, float(v2)))

    @classmethod
    def from_profile(cls, profile: Profile) -> ServiceTime:
        """The service time of one execution (a batch of ``profile.batch``) of a profile.

        Uses the profile's latency percentiles; without any, a deterministic time of
        ``batch / throughput_rps``.

        Raises:
            InputError: naming the profile when it has neither latencies nor throughput.
        """
        lat = profile.latency_ms
        try:
            if "p50" in lat:
                return cls.from_percentiles(lat["p50"], lat.get("p95"), lat.get("p99"))
            if lat:
                # Without a median, the lowest known percentile stands for the whole.
                return cls.deterministic(min(lat.values()))
            if profile.throughput_rps and profile.throughput_rps > 0:
                return cls.deterministic(1000.0 * profile.batch / profile.throughput_rps)
        except InputError as exc:
            raise InputError(
                f"profile {profile.variant} on {profile.resource} batch {profile.batch}: "
                f"{exc.message}"
            ) from None
        raise InputError(
            f"profile {profile.variant} on {profile.resource} batch {profile.batch} has no "
            "latency percentiles and no throughput",
            hint="re-run `greenctl profile` or fix the imported profile",
        )

    # -- moments and quantiles ------------------------------------------------------------
    @property
    def mean_ms(self) -> float:
        """Mean service time in ms."""
        if self.kind == "deterministic":
            return self.shift_ms
        if self.kind == "exponential":
            return self.shift_ms + self.scale_ms
        return self.shift_ms + self.scale_ms * math.exp(self.sigma**2 / 2)

    @property
    def var_ms2(self) -> float:
        """Variance in ms^2."""
        if self.kind == "deterministic":
            return 0.0
        if self.kind == "exponential":
            return self.scale_ms**2
        s2 = self.sigma**2
        return self.scale_ms**2 * math.exp(s2) * math.expm1(s2)

    @property
    def scv(self) -> float:
        """Squared coefficient of variation, variance / mean^2 (0 deterministic, 1 exp.)."""
        return self.var_ms2 / self.mean_ms**2

    def quantile(self, q: float) -> float:
        """The ``q`` quantile in ms (``0 < q < 1``)."""
        if not 0.0 < q < 1.0:
            raise InputError(f"quantile must be strictly between 0 and 1, got {q}")
        if self.kind == "deterministic":
            return self.shift_ms
        if self.kind == "exponential":
            return self.shift_ms - self.scale_ms * math.log1p(-q)
        return self.shift_ms + self.scale_ms * math.exp(self.sigma * _STD.inv_cdf(q))

    def sf(self, t_ms: np.ndarray) -> np.ndarray:
        """Survival function P(S > t) for an array of times in ms."""
        t = np.asarray(t_ms, dtype=float)
        if self.kind == "deterministic":
            return (t < self.shift_ms).astype(float)
        x = t - self.shift_ms
        pos = x > 0
        out = np.ones_like(t)
        if self.kind == "exponential":
            out[pos] = np.exp(-x[pos] / self.scale_ms)
            return out
        out[pos] = ndtr(-(np.log(x[pos] / self.scale_ms)) / self.sigma)
        return out

    def moment(self, k: int) -> float:
        """The raw moment ``E[S^k]`` in ms^k (k = 1, 2, 3, ...)."""
        if self.kind == "deterministic":
            return self.shift_ms**k
        total = 0.0
        for j in range(k + 1):
            if self.kind == "exponential":
                xj = math.factorial(j) * self.scale_ms**j
            else:
                xj = self.scale_ms**j * math.exp(j * j * self.sigma**2 / 2)
            total += math.comb(k, j) * self.shift_ms ** (k - j) * xj
        return total

    def exp_smoothed_sf(self, t_ms: np.ndarray, theta: float | np.ndarray) -> np.ndarray:
        """``E[exp(-theta (t - S)^+)]`` for an array of ``t``: P(Exp(theta) + S > t).

        ``theta`` is a number or an array shaped like ``t``. Closed form for deterministic
        and exponential service; for the lognormal, ``P(S > t)`` exactly plus a 32-point
        Gauss-Legendre integral over the normal variable below ``t``'s (error ~1e-9).
        """
        t = np.asarray(t_ms, dtype=float)
        th = np.broadcast_to(np.asarray(theta, dtype=float), t.shape)
        x = np.maximum(t - self.shift_ms, 0.0)
        if self.kind == "deterministic":
            return np.exp(-th * x)
        if self.kind == "exponential":
            m = self.scale_ms
            d = m * th - 1.0
            near = np.abs(d) < 1e-9
            safe = np.where(near, 1.0, d)
            general = (m * th * np.exp(-x / m) - np.exp(-th * x)) / safe
            return np.where(near, (1.0 + x / m) * np.exp(-x / m), general)
        return lognormal_smoothed_sf(x, th, self.scale_ms, self.sigma)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` independent service times in ms drawn with ``rng``."""
        if self.kind == "deterministic":
            return np.full(n, self.shift_ms)
        if self.kind == "exponential":
            return self.shift_ms + rng.exponential(self.scale_ms, n)
        return self.shift_ms + self.scale_ms * np.exp(self.sigma * rng.standard_normal(n))

    def from_normal(self, z: np.ndarray) -> np.ndarray:
        """Service times as a monotone function of standard normal draws ``z``."""
        if self.kind == "deterministic":
            return np.full(np.shape(z), self.shift_ms)
        if self.kind == "exponential":
            return self.shift_ms - self.scale_ms * np.log(ndtr(-np.asarray(z)))
        return self.shift_ms + self.scale_ms * np.exp(self.sigma * np.asarray(z))

    def shifted(self, extra_ms: float) -> ServiceTime:
        """The same distribution plus a constant ``extra_ms`` (>= 0)."""
        if extra_ms <= 0:
            return self
        return ServiceTime(self.kind, self.shift_ms + extra_ms, self.scale_ms, self.sigma)

    def scaled(self, factor: float) -> ServiceTime:
        """The same shape with every time multiplied by ``factor`` (> 0)."""
        if factor <= 0:
            raise InputError(f"scale factor must be > 0, got {factor}")
        return ServiceTime(self.kind, self.shift_ms * factor, self.scale_ms * factor, self.sigma)

    @cached_property
    def nodes(self) -> np.ndarray:
        """``N_NODES`` equiprobable points (midpoint quantiles) for numerical convolution."""
        if self.kind == "deterministic":
            return np.full(1, self.shift_ms)
        u = (np.arange(N_NODES) + 0.5) / N_NODES
        if self.kind == "exponential":
            return self.shift_ms - self.scale_ms * np.log1p(-u)
        z = np.array([_STD.inv_cdf(float(x)) for x in u])
        return self.shift_ms + self.scale_ms * np.exp(self.sigma * z)

    def describe(self) -> str:
        """A short human-readable description."""
        if self.kind == "deterministic":
            return f"deterministic {self.shift_ms:.4g} ms"
        if self.kind == "exponential":
            return f"{self.shift_ms:.4g} ms + exponential(mean {self.scale_ms:.4g} ms)"
        return (
            f"{self.shift_ms:.4g} ms + lognormal(median {self.scale_ms:.4g} ms, "
            f"sigma {self.sigma:.3g})"
        )


@dataclass(frozen=True)
class BatchService:
    """The service model of one batching instance: how long a batch of each size it runs takes
    (built by :func:`greenctl.planner.core.service.batch_service`, whose module docstring gives the
    rule: the padded size, linear in rows between measured sizes).

    Attributes:
        points: ``(size, service time of one batch of that size)`` at every measured size, in
            increasing size, the instance's own batch included.
        batching: how the executor batches (max batch, max wait, depth, padding).
    """

    points: tuple[tuple[int, ServiceTime], ...]
    batching: Batching

    def __post_init__(self) -> None:
        if not self.points:
            raise InputError("a batch service model needs at least one measured batch size")
        sizes = [n for n, _ in self.points]
        if sizes != sorted(set(sizes)) or sizes[0] < 1:
            raise InputError(f"batch sizes must increase and be >= 1, got {sizes}")

    @property
    def batch(self) -> int:
        """The most rows in one batch."""
        return self.batching.batch

    @property
    def full(self) -> ServiceTime:
        """The service time of a full batch."""
        return self.at(self.batch)

    def at(self, rows: int) -> ServiceTime:
        """The service time of a batch of ``rows`` rows (padded, then interpolated)."""
        return interpolate_service(self.points, self.batching.run_size(rows))

    def mean_ms(self, rows: int) -> float:
        """The mean service time of a batch of ``rows`` rows."""
        return self.at(rows).mean_ms

    def map(self, fn: Callable[[int, ServiceTime], ServiceTime]) -> BatchService:
        """The same model with every measured point's service time replaced by
        ``fn(size, service)`` (served runs, cold runs)."""
        return BatchService(tuple((n, fn(n, s)) for n, s in self.points), self.batching)


@lru_cache(maxsize=65536)
def interpolate_service(points: tuple[tuple[int, ServiceTime], ...], size: int) -> ServiceTime:
    """The service time of a batch of ``size`` rows from the measured ``points``: linear in
    rows between the two nearest measured sizes (each of p50/p95/p99, fitted again), the
    smallest measured size's time below it, the largest's scaled by the rows above it."""
    size = max(1, int(size))
    lo = None
    for n, svc in points:
        if n == size:
            return svc
        if n > size:
            if lo is None:  # below the smallest measured size: its time (conservative)
                return svc
            n0, s0 = lo
            t = (size - n0) / (n - n0)
            qs = [(1.0 - t) * s0.quantile(q) + t * svc.quantile(q) for q in (0.5, 0.95, 0.99)]
            for i in range(1, 3):  # non-decreasing after rounding
                qs[i] = max(qs[i], qs[i - 1])
            return ServiceTime.from_percentiles(*qs)
        lo = (n, svc)
    n_top, s_top = points[-1]
    return s_top.scaled(size / n_top)  # above the largest measured size: per-row time


def _fit_two(a: tuple[str, float], b: tuple[str, float]) -> ServiceTime:
    """Unshifted lognormal through two percentiles."""
    (ka, va), (kb, vb) = a, b
    za, zb = _Z_OF[ka], _Z_OF[kb]
    sigma = math.log(vb / va) / (zb - za)
    median = va / math.exp(sigma * za)
    return ServiceTime.lognormal(median_ms=median, sigma=sigma)


#: The widest lognormal a three-percentile fit may take. A p99 of a few hundred runs rests on
#: a handful of them: one straggler made tiny-l's back-to-back profile 3.62/4.31/7.71 ms
#: (p50/p95/p99), whose exact fit (sigma 2.6) put p99.99 at 159 ms and the squared
#: coefficient of variation at 4.9, so a plan at 0.75 utilisation was predicted at 145 ms
#: p95 (measured 27 ms). Capped, the fit keeps p50 and p95 and gives up some of p99.
SIGMA_MAX = 1.5


def _fit_capped(p50: float, p95: float) -> ServiceTime | None:
    """Shifted lognormal of sigma ``SIGMA_MAX`` through p50 and p95 (its p99 falls short of
    the one measured), or None when that needs a negative shift."""
    m = (p95 - p50) / math.expm1(SIGMA_MAX * Z95)
    if m > p50:
        return None
    return ServiceTime.lognormal(median_ms=m, sigma=SIGMA_MAX, shift_ms=p50 - m)


@lru_cache(maxsize=65536)
def _fit_three(p50: float, p95: float, p99: float) -> ServiceTime | None:
    """Shifted lognormal through p50, p95 and p99, or None when none exists with shift >= 0;
    when the exact one is wider than ``SIGMA_MAX``, the one of that width through p50 and p95.
    Cached: a plan fits each profile row several times (sizing, energy, prediction).

    With ``m = exp(mu)``: ``p95 - p50 = m (e^{s z95} - 1)``, ``p99 - p50 = m (e^{s z99} - 1)``;
    the ratio of the two gaps is increasing in ``s`` from ``z99 / z95`` (s -> 0), so ``s``
    follows by bisection, then ``m`` and the shift.
    """
    a, b = p95 - p50, p99 - p50
    if a <= 0 or b <= 0:
        return None
    ratio = b / a

    def gap_ratio(s: float) -> float:
        return math.expm1(s * Z99) / math.expm1(s * Z95)

    if ratio <= Z99 / Z95 * (1 + 1e-9):
        return None
    lo, hi = 1e-9, 1.0
    while gap_ratio(hi) < ratio:
        hi *= 2
        if hi > 50:
            return _fit_capped(p50, p95)
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if gap_ratio(mid) < ratio:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * hi:
            break
    sigma = 0.5 * (lo + hi)
    if sigma > SIGMA_MAX:
        return _fit_capped(p50, p95)
    median = a / math.expm1(sigma * Z95)
    shift = p50 - median
    if shift < 0:
        return None
    return ServiceTime.lognormal(median_ms=median, sigma=sigma, shift_ms=shift)


def lognormal_smoothed_sf(
    x: np.ndarray,
    theta: np.ndarray,
    scale: float | np.ndarray,
    sigma: float | np.ndarray,
    *,
    erfc: bool = False,
) -> np.ndarray:
    """:meth:`ServiceTime.exp_smoothed_sf` of lognormal service at ``x = max(t - shift, 0)``:
    ``scale`` and ``sigma`` a lognormal's, or arrays shaped like ``x`` (one lognormal per
    point, for searches over many services at once); ``erfc``: see :func:`ndtr`.

    ``P(S > t)`` exactly plus a 32-point Gauss-Legendre integral over the normal variable
    below ``t``'s (error ~1e-9).
    """
    pos = x > 0
    out = np.ones_like(x)
    if not pos.any():
        return out
    xp = x[pos]
    sc = scale[pos] if isinstance(scale, np.ndarray) else scale
    sg = sigma[pos] if isinstance(sigma, np.ndarray) else sigma
    # S - shift = scale * exp(sigma Z): integrate over z in (Z_LO, z(t)) where the
    # integrand exp(-theta (x - y(z))) phi(z) is smooth.
    zx = np.log(xp / sc) / sg
    # beyond |z| = 7 the normal density is < 1e-11: clip the range to keep the
    # quadrature on the bump (a tiny sigma would otherwise stretch it)
    span = np.clip(zx, _Z_LO, -_Z_LO) - _Z_LO
    z = _Z_LO + span[:, None] * _GL_X[None, :]
    if isinstance(sc, np.ndarray):
        y = sc[:, None] * np.exp(np.asarray(sg)[:, None] * z)
    else:
        y = sc * np.exp(sg * z)
    # nodes above x sit only where span is 0 (x below the clipped range): keep their
    # exponent <= 0 so that 0 x inf does not make a NaN
    f = np.exp(np.minimum(-theta[pos][:, None] * (xp[:, None] - y), 0.0) - 0.5 * z * z)
    out[pos] = ndtr(-zx, erfc=erfc) + span * (f @ _GL_W) * _INV_SQRT_2PI
    return out


def lognormal_terms(
    services: tuple[ServiceTime, ...], t_ms: np.ndarray, delay_ms: float, theta: float
) -> tuple[np.ndarray, np.ndarray]:
    """``P(S_i > t)`` and ``P(Exp(theta) + S_i > t - delay)`` for several lognormal service
    times at once, each shaped ``(len(services), len(t))``: the vectorised form of
    :meth:`ServiceTime.sf` and :meth:`ServiceTime.exp_smoothed_sf` for mixtures."""
    shift = np.array([s.shift_ms for s in services])[:, None]
    scale = np.array([s.scale_ms for s in services])[:, None]
    sigma = np.array([s.sigma for s in services])[:, None]
    t = np.asarray(t_ms, dtype=float)[None, :]
    zt = np.log(np.maximum(t - shift, 1e-300) / scale) / sigma
    sf = ndtr(-zt)
    x = np.maximum(t - delay_ms - shift, 1e-300)
    zx = np.log(x / scale) / sigma
    span = np.clip(zx, _Z_LO, -_Z_LO) - _Z_LO
    z = _Z_LO + span[..., None] * _GL_X
    y = scale[..., None] * np.exp(sigma[..., None] * z)
    # only nodes y <= x count (span is 0 otherwise): an exponent above 0 would overflow and
    # turn 0 x inf into NaN
    f = np.exp(np.minimum(-theta * (x[..., None] - y), 0.0) - 0.5 * z * z)
    es = ndtr(-zx) + span * (f @ _GL_W) * _INV_SQRT_2PI
    return sf, es
