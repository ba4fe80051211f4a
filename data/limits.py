"""The bounds of every number a plan request or a command option takes, in one table.

A value outside its bound is a user's mistake refused before anything is read or written
(exit 2): NaN and infinities everywhere, a rate of zero or below, a negative count, and the
absurd (a rate of 1e300 req/s exhausts a solver, 10^8 GPUs exhaust memory). The typed
requests (``planner/<kind>/request.py``) and the commands that take numbers outside a request
check them here, so one quantity has one bound everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError, shown

#: the latency percentiles an SLO is stated at, and their quantiles: the one table of them
#: (profiles record latencies at each; planners, simulations and reports read them by name)
SLO_QUANTILES = {"p50": 0.50, "p95": 0.95, "p99": 0.99}


@dataclass(frozen=True)
class Bound:
    """The values a quantity may take: ``low`` (excluded when ``above``) to ``high``."""

    low: float
    high: float
    above: bool = False
    unit: str = ""
    whole: bool = False

    def describe(self) -> str:
        low = f"> {self.low:g}" if self.above else f">= {self.low:g}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{low} and <= {self.high:g}{unit}"


#: one bound per quantity; the numbers a sane deployment stays far inside
BOUNDS: dict[str, Bound] = {
    # a request rate: above 0 (a plan for no load serves nothing) up to a million req/s
    "rate_rps": Bound(0.0, 1e6, above=True, unit="req/s"),
    # a latency SLO / SLA: above 0 up to an hour
    "latency_ms": Bound(0.0, 3.6e6, above=True, unit="ms"),
    # GPUs of a plan: whole, 1 to 4096
    "gpus": Bound(1, 4096, unit="GPUs", whole=True),
    # a resource budget (cores, slices, instances, GPUs)
    "budget": Bound(0.0, 1e6),
    # a weight or a price of the objective (per kg, per litre, per unit of cost)
    "weight": Bound(0.0, 1e6),
    # a step size or a cap the step is scaled by (eGLB's eta, z_max): above 0, as 0 stops
    # the duals moving (fairness off is --mu-carbon 0 --mu-water 0)
    "step": Bound(0.0, 1e6, above=True),
    # a share: an accuracy floor, a held-out fraction, a quantile, a lambda
    "fraction": Bound(0.0, 1.0),
    # spare capacity as a multiple of the rate
    "headroom": Bound(0.0, 10.0),
    # a power usage effectiveness
    "pue": Bound(1.0, 10.0),
    # a solver's time limit: above 0 up to a day
    "time_limit_s": Bound(0.0, 86_400.0, above=True, unit="s"),
    # seconds of simulated or replayed time: up to a year
    "duration_s": Bound(0.0, 365 * 86_400.0, unit="s"),
    # a multiplier of a trace or a load
    "scale": Bound(0.0, 1e6),
    # water use per kWh, litres
    "water_l_per_kwh": Bound(0.0, 1e3, unit="L/kWh"),
    # watts of one device
    "power_w": Bound(0.0, 1e5, unit="W"),
    # a count of requests, epochs, minutes, steps or queue places: whole, 1 to 10^9
    "count": Bound(1, 1e9, whole=True),
    # a random seed: whole, 0 to 2^32 - 1
    "seed": Bound(0, 2**32 - 1, whole=True),
    # a percentage below 100
    "percent": Bound(0.0, 100.0),
    # days of a history
    "days": Bound(0.0, 36_500.0, above=True, unit="days"),
}


#: the rate a replan plans a model at whose forecast load is (near) zero: a request rate must
#: be above 0, and a model kept served at a trickle costs its smallest configuration
MIN_PLANNED_RATE_RPS = 1e-3


def number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    strict: bool = False,
    maximum: float | None = None,
) -> float:
    """``value`` as a finite float within the bounds (``strict``: above ``minimum``).

    Raises:
        InputError: naming ``name``, the value and the bound it misses.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        try:
            value = float(value)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"{name} must be a number, got {shown(value)}") from None
    try:
        value = float(value)
    except OverflowError:  # an integer beyond 1e308
        raise InputError(f"{name} must be a finite number, got {shown(value)}") from None
    if math.isnan(value) or math.isinf(value):
        raise InputError(f"{name} must be a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        op = ">" if strict else ">="
        raise InputError(f"{name} must be {op} {minimum:g}, got {value:g}")
    if maximum is not None and value > maximum:
        raise InputError(f"{name} must be <= {maximum:g}, got {value:g}")
    return value


def bounded(value: Any, name: str, quantity: str, *, hint: str | None = None) -> float:
    """``value`` checked against :data:`BOUNDS` ``[quantity]``; ``name`` is what the
    message calls it (the option and the request field).

    Raises:
        InputError: not a number, NaN, infinite or outside the bound, naming ``name``.
    """
    bound = BOUNDS[quantity]
    try:
        return number(value, name, minimum=bound.low, strict=bound.above, maximum=bound.high)
    except InputError as exc:
        raise InputError(exc.message, hint=hint or f"{name} takes {bound.describe()}") from None


def whole(value: Any, name: str, quantity: str, *, hint: str | None = None) -> int:
    """:func:`bounded` for a whole number (``3.0`` is 3, ``3.5`` and ``True`` are refused).

    Raises:
        InputError: not a whole number, or outside the bound, naming ``name``.
    """
    bound = BOUNDS[quantity]
    x = bounded(value, name, quantity, hint=hint)
    if isinstance(value, bool) or x != int(x) or (isinstance(value, str) and "." in value):
        raise InputError(
            f"{name} must be a whole number, got {shown(value)}",
            hint=hint or f"{name} takes a whole number {bound.describe()}",
        )
    return int(x)


def optional(value: Any, name: str, quantity: str, *, hint: str | None = None) -> float | None:
    """:func:`bounded`, None for None."""
    return None if value is None else bounded(value, name, quantity, hint=hint)


def floor_rates(rates: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """Forecast rates with those below :data:`MIN_PLANNED_RATE_RPS` raised to it, and a note
    naming them (a forecast of no load still plans the model, at a trickle)."""
    low = sorted(name for name, rate in rates.items() if not rate >= MIN_PLANNED_RATE_RPS)
    out = {name: MIN_PLANNED_RATE_RPS if name in low else rate for name, rate in rates.items()}
    notes = (
        [f"{', '.join(low)}: forecast below {MIN_PLANNED_RATE_RPS:g} req/s, planned at it"]
        if low
        else []
    )
    return out, notes


def floor_request_rate(request: dict[str, Any]) -> list[str]:
    """:func:`floor_rates` on a one-model request (``model``, ``rate_rps``), in place; the
    notes it adds."""
    rate, model = request.get("rate_rps"), request.get("model")
    if model is None or isinstance(rate, bool) or not isinstance(rate, int | float):
        return []
    new, notes = floor_rates({str(model): float(rate)})
    request["rate_rps"] = new[str(model)]
    return notes


def split_items(text: str, name: str, *, example: str = "20,40,100") -> list[str]:
    """A comma-separated option value as its items, an empty item refused (``1,,2`` is a
    typo, not two items).

    Raises:
        InputError: an empty item or an empty list, naming ``name``.
    """
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise InputError(f"{name} is empty", hint=f"give {name} comma-separated, e.g. {example}")
    if not all(items):
        raise InputError(
            f"{name} {shown(text)} holds an empty item",
            hint=f"separate the items of {name} with single commas, e.g. {example}",
        )
    return items
