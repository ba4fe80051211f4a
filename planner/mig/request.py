"""The ``mig`` kind's request: one family on ``gpus`` GPUs of one model at a rate and carbon
signal, and the Clover objective's options, validated once.

:meth:`MigRequest.from_dict` checks a request document (a plan's ``request``, what
``plan mig`` parsed) and :meth:`MigRequest.to_dict` writes the plan document's ``request``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import resolve_gpu

SOLVERS = ("exact", "anneal", "random")
BASELINES = ("base", "co2opt")

_NEEDS = "a MIG plan's request needs gpu, gpus, model, rate_rps and carbon_intensity"
_NEEDS_HINT = "replan MIG plans made by `greenctl plan mig`"


def check_solver_options(solver: str, baseline: str | None, time_limit_s: float | None) -> None:
    """The solver, the baseline and the time limit of a MIG plan.

    Raises:
        InputError: an unknown solver or baseline, a time limit not above 0.
    """
    if solver not in SOLVERS:
        raise InputError(f"unknown solver '{solver}'", hint=f"use one of {', '.join(SOLVERS)}")
    if baseline is not None and baseline not in BASELINES:
        raise InputError(
            f"unknown baseline '{baseline}'", hint=f"use one of {', '.join(BASELINES)}"
        )
    if time_limit_s is not None and not time_limit_s > 0:
        raise InputError(f"--time-limit must be > 0 seconds, got {time_limit_s}")


def _optional(request: dict[str, Any], key: str) -> float | None:
    value = request.get(key)
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InputError(f"request.{key} is {value!r}, not a number", hint=_NEEDS_HINT) from None


@dataclass(frozen=True)
class MigRequest:
    """A ``plan mig`` request (``lam`` is the document's ``lambda``)."""

    gpu: str
    gpus: int
    model: str
    rate_rps: float
    carbon_intensity: float
    sla_ms: float | None = None
    percentile: float = 0.95
    lam: float = 0.5
    base_carbon_intensity: float | None = None
    max_accuracy_loss_pct: float | None = None
    solver: str = "exact"
    #: emit this baseline's configuration instead of the solver's (``base``, ``co2opt``)
    baseline: str | None = None
    seed: int | None = None
    time_limit_s: float | None = None

    @classmethod
    def from_dict(cls, request: Any) -> MigRequest:
        """Validate a request document (the GPU named by its geometry's name).

        Raises:
            InputError: a required field missing or of the wrong type, an unknown GPU,
                solver or baseline.
        """
        if not isinstance(request, dict):
            raise InputError(_NEEDS, hint=_NEEDS_HINT)
        try:
            gpu = resolve_gpu(str(request["gpu"])).name
            model = str(request["model"])
            gpus = int(request["gpus"])
            rate = float(request["rate_rps"])
            intensity = float(request["carbon_intensity"])
        except (KeyError, TypeError, ValueError):
            raise InputError(_NEEDS, hint=_NEEDS_HINT) from None
        seed = request.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise InputError(f"request.seed is {seed!r}, not a whole number", hint=_NEEDS_HINT)
        out = cls(
            gpu=gpu,
            gpus=gpus,
            model=model,
            rate_rps=rate,
            carbon_intensity=intensity,
            sla_ms=_optional(request, "sla_ms"),
            percentile=_optional(request, "percentile") or 0.95,
            lam=float(_optional(request, "lambda") or 0.0)
            if request.get("lambda") is not None
            else 0.5,
            base_carbon_intensity=_optional(request, "base_carbon_intensity"),
            max_accuracy_loss_pct=_optional(request, "max_accuracy_loss_pct"),
            solver=str(request.get("solver") or "exact"),
            baseline=request.get("baseline"),
            seed=seed,
            time_limit_s=_optional(request, "time_limit_s"),
        )
        check_solver_options(out.solver, out.baseline, out.time_limit_s)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The request as the plan document records it."""
        return {
            "gpu": self.gpu,
            "gpus": self.gpus,
            "model": self.model,
            "rate_rps": self.rate_rps,
            "sla_ms": self.sla_ms,
            "percentile": self.percentile,
            "lambda": self.lam,
            "carbon_intensity": self.carbon_intensity,
            "base_carbon_intensity": self.base_carbon_intensity,
            "max_accuracy_loss_pct": self.max_accuracy_loss_pct,
            "solver": self.solver,
            "baseline": self.baseline,
            "seed": self.seed,
            "time_limit_s": self.time_limit_s,
        }
