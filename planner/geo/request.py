"""The ``geo`` kind's request: the sites, demand (and routes) files, where the variants come
from, and the options of ``plan geo`` under the names the plan records them, validated once.

:meth:`GeoRequest.from_dict` checks a request document (a geo plan's ``request``, what
``plan geo`` parsed); :meth:`GeoRequest.options` are ``run_geo``'s keyword options.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.limits import bounded, whole

#: request key -> run_geo option
OPTIONS = {
    "algorithm": "algorithm",
    "mu_carbon_usd_per_kg": "mu_carbon",
    "mu_water_usd_per_l": "mu_water",
    "eta": "eta",
    "z_max_usd": "z_max",
    "horizon": "horizon",
    "forecast": "forecast",
    "weight_carbon_usd_per_kg": "weight_carbon",
    "weight_water_usd_per_l": "weight_water",
    "model": "model",
    "variant": "variant",
    "min_accuracy": "min_accuracy",
}
#: the number options: request key -> (option, quantity in data.limits.BOUNDS)
_NUMBERS = {
    "mu_carbon_usd_per_kg": ("--mu-carbon", "weight"),
    "mu_water_usd_per_l": ("--mu-water", "weight"),
    "eta": ("--eta", "step"),
    "z_max_usd": ("--z-max", "step"),
    "horizon": ("--horizon", "count"),
    "weight_carbon_usd_per_kg": ("--weight-carbon", "weight"),
    "weight_water_usd_per_l": ("--weight-water", "weight"),
    "min_accuracy": ("--min-accuracy", "fraction"),
}
_OPTION_HINT = "a geo request holds the options of `greenctl plan geo`, as it writes them"
_PATH_HINT = "a geo request names its sites, demand (and routes) CSV files"


def _path(request: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = request.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str | Path) or not str(value):
        raise InputError(f"the geo request needs {key} (a CSV path)", hint=_PATH_HINT)
    return str(value)


def _options(request: dict[str, Any]) -> dict[str, Any]:
    """The options the request sets, by their request key, each checked for its type."""
    options: dict[str, Any] = {}
    for key in OPTIONS:
        value = request.get(key)
        if value is None:
            continue
        if key in _NUMBERS:
            flag, quantity = _NUMBERS[key]
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InputError(
                    f"request.{key} ({flag}) is {value!r}, not a number", hint=_OPTION_HINT
                )
            check = whole if quantity == "count" else bounded
            value = check(value, f"request.{key} ({flag})", quantity)
        elif not isinstance(value, str):
            raise InputError(f"request.{key} is {value!r}, not a name", hint=_OPTION_HINT)
        options[key] = value
    return options


@dataclass(frozen=True)
class GeoRequest:
    """A ``plan geo`` request: its files (paths as given) and options (request keys)."""

    sites: str
    demand: str
    routes: str | None = None
    #: heterogeneous variants: a family in the store, or else a variants CSV
    family: str | None = None
    variants: str | None = None
    #: the options set, by request key (:data:`OPTIONS`)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, request: Any) -> GeoRequest:
        """Validate a request document (bad options are refused before any file is read).

        Raises:
            InputError: a bad family, option or path, naming the field.
        """
        if not isinstance(request, dict):
            raise InputError("the geo request must be an object", hint=_PATH_HINT)
        family = request.get("family")
        if family is not None and not isinstance(family, str):
            raise InputError(f"request.family is {family!r}, not a family name")
        variants = None if family else _path(request, "variants", required=False)
        settings = _options(request)
        return cls(
            sites=_path(request, "sites") or "",
            demand=_path(request, "demand") or "",
            routes=_path(request, "routes", required=False),
            family=family or None,
            variants=variants,
            settings=settings,
        )

    def options(self) -> dict[str, Any]:
        """``run_geo``'s keyword options."""
        return {OPTIONS[k]: v for k, v in self.settings.items()}

    def to_dict(self) -> dict[str, Any]:
        """The request as ``plan geo`` writes it (the plan records what ``run_geo`` read)."""
        return {
            "sites": self.sites,
            "demand": self.demand,
            "routes": self.routes,
            "variants": self.variants,
            "family": self.family,
            **{k: self.settings.get(k) for k in OPTIONS},
        }
