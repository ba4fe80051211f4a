"""Arrival processes for the simulator: Poisson at a rate, or a requests-per-second trace.

Arrival times are in seconds from 0, sorted, as a float64 numpy array. Everything is
deterministic for a seed.
"""

from __future__ import annotations

import math

import numpy as np
from greenctl.data.errors import InputError

DEFAULT_REQUESTS = 100_000


#: The most arrivals one run (a simulation, a load generator's run) may hold: each costs memory
#: (their times are held in an array) and about a microsecond to simulate.
MAX_ARRIVALS = 10_000_000


def check_arrivals(expected: float, what: str, *, hint: str) -> None:
    """Refuse a run of about ``expected`` arrivals above :data:`MAX_ARRIVALS`.

    Raises:
        InputError: naming ``what`` and the limit, with ``hint`` for the fix.
    """
    if not expected <= MAX_ARRIVALS:  # (NaN too)
        raise InputError(
            f"{what} asks for about {expected:.3g} requests; one run holds at most "
            f"{MAX_ARRIVALS:,}",
            hint=hint,
        )


def poisson_arrivals(
    rate: float, *, duration_s: float | None = None, n: int | None = None, seed: int = 0
) -> np.ndarray:
    """Arrival times (s) of a Poisson process of ``rate`` requests per second.

    Give either ``duration_s`` (all arrivals in ``[0, duration_s)``; their number is
    Poisson) or ``n`` (exactly ``n`` arrivals); neither means ``n = 100000``.

    Raises:
        InputError: a rate <= 0, or both/invalid duration and count.
    """
    if not math.isfinite(rate) or rate <= 0:
        raise InputError(f"arrival rate must be a number > 0 req/s, got {rate}")
    if duration_s is not None and n is not None:
        raise InputError("give a duration or a number of requests, not both")
    rng = np.random.default_rng(seed)
    if duration_s is not None:
        if not math.isfinite(duration_s) or duration_s <= 0:
            raise InputError(f"duration must be > 0 s, got {duration_s}")
        check_arrivals(rate * duration_s, "the run", hint="shorten the duration")
        count = int(rng.poisson(rate * duration_s))
        return np.sort(rng.uniform(0.0, duration_s, count))
    count = DEFAULT_REQUESTS if n is None else int(n)
    if count < 1:
        raise InputError(f"number of requests must be >= 1, got {count}")
    check_arrivals(count, "the run", hint="ask for fewer requests")
    return np.cumsum(rng.exponential(1.0 / rate, count))


def trace_arrivals(
    rps_series: np.ndarray | list[float],
    *,
    seed: int = 0,
    scale: float = 1.0,
) -> np.ndarray:
    """Arrival times (s) replaying a requests-per-second series.

    Second ``i`` gets ``Poisson(scale * rps_series[i])`` arrivals placed uniformly (a
    Poisson process of that second's rate).

    Raises:
        InputError: a negative or non-finite rate, or a scale <= 0.
    """
    series = np.asarray(rps_series, dtype=float)
    if series.ndim != 1 or series.size == 0:
        raise InputError("a trace needs at least one requests-per-second value")
    if not np.isfinite(series).all() or (series < 0).any():
        bad = int(np.flatnonzero(~np.isfinite(series) | (series < 0))[0])
        raise InputError(f"trace value {bad + 1} is {series[bad]}: rates must be >= 0")
    if not math.isfinite(scale) or scale <= 0:
        raise InputError(f"trace scale must be > 0, got {scale}")
    rng = np.random.default_rng(seed)
    counts = rng.poisson(series * scale)
    seconds = np.repeat(np.arange(series.size, dtype=float), counts)
    return np.sort(seconds + rng.uniform(0.0, 1.0, seconds.size))
