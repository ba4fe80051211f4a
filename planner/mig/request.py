"""The ``mig`` kind's request: one family on ``gpus`` GPUs of one model at a rate and carbon
signal, and the Clover objective's options, validated once.

:meth:`MigRequest.from_dict` checks a request document (a plan's ``request``, what
``plan mig`` parsed) and :meth:`MigRequest.to_dict` writes the plan document's ``request``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError, shown
from greenctl.data.limits import bounded, number, optional, whole
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
    if time_limit_s is not None:
        bounded(time_limit_s, "request.time_limit_s (--time-limit)", "time_limit_s")


#: request field -> (the option that sets it, its quantity in data.limits.BOUNDS)
_FIELDS = {
    "gpus": ("--gpus", "gpus"),
    "rate_rps": ("--rate", "rate_rps"),
    "sla_ms": ("--sla-ms", "latency_ms"),
    "lambda": ("--lambda", "fraction"),
    "max_accuracy_loss_pct": ("--max-accuracy-loss", "percent"),
    "time_limit_s": ("--time-limit", "time_limit_s"),
    "seed": ("--seed", "seed"),
}


def _optional(request: dict[str, Any], key: str) -> float | None:
    option, quantity = _FIELDS[key]
    return optional(request.get(key), f"request.{key} ({option})", quantity)


def _intensity(request: dict[str, Any], key: str, option: str) -> float | None:
    value = request.get(key)
    if value is None:
        return None
    return carbon_option(
        number(value, f"request.{key} ({option})"), f"request.{key} ({option})", positive=True
    )


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
        missing = [k for k in ("gpu", "gpus", "model", "rate_rps") if request.get(k) is None]
        if request.get("carbon_intensity") is None:
            missing.append("carbon_intensity")
        if missing:
            raise InputError(f"{_NEEDS}; missing: {', '.join(missing)}", hint=_NEEDS_HINT)
        model = request["model"]
        if not isinstance(model, str) or not model.strip():
            raise InputError(f"request.model (--model) must be a model family, got {shown(model)}")
        gpus_option, gpus_quantity = _FIELDS["gpus"]
        seed = request.get("seed")
        percentile = request.get("percentile")
        out = cls(
            gpu=resolve_gpu(str(request["gpu"])).name,
            gpus=whole(request["gpus"], f"request.gpus ({gpus_option})", gpus_quantity),
            model=model,
            rate_rps=_optional(request, "rate_rps") or 0.0,
            carbon_intensity=_intensity(request, "carbon_intensity", "--carbon-intensity") or 0.0,
            sla_ms=_optional(request, "sla_ms"),
            percentile=0.95
            if percentile is None
            else number(percentile, "percentile", minimum=0.0, strict=True, maximum=0.9999),
            lam=0.5 if request.get("lambda") is None else (_optional(request, "lambda") or 0.0),
            base_carbon_intensity=_intensity(
                request, "base_carbon_intensity", "--base-carbon-intensity"
            ),
            max_accuracy_loss_pct=_optional(request, "max_accuracy_loss_pct"),
            solver=str(request.get("solver") or "exact"),
            baseline=request.get("baseline"),
            seed=None if seed is None else whole(seed, "request.seed (--seed)", "seed"),
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
