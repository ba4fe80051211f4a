"""The ``glet`` kind's request: models with rates and SLOs to pack onto GPUs, and the options
of ``plan glet``, validated once.

:meth:`GletRequest.from_dict` checks a request document (a glet plan's ``request``, what
``plan glet`` parsed) and :meth:`GletRequest.to_dict` writes it back; the planner adds what
it resolved (each model's variant and family, the interference model it used) to the plan's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.glet_spec import parse_partitions
from greenctl.data.limits import bounded, whole

HINT = "a glet request holds models (name, rate_rps, slo_ms[, variant]), as `plan glet` writes"
_INTERFERENCE_HINT = 'an id from `greenctl interference fit`, "newest" or null'


def _finite(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


#: request key -> the option of `plan glet` that sets it (what a message names)
FLAGS = {
    "max_gpus": "--max-gpus",
    "rate_percentile": "--rate-percentile",
    "simulate_s": "--simulate-seconds",
    "seed": "--seed",
}


def option(request: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """``request[key]`` as a ``kind`` (int: a whole number), ``default`` when absent.

    Raises:
        InputError: a value of another type.
    """
    value = request.get(key)
    if value is None:
        return default
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not (whole if kind is int else _finite(value) is not None):
        what = "a whole number" if kind is int else "a finite number"
        name = f"request.{key} ({FLAGS[key]})" if key in FLAGS else f"request.{key}"
        raise InputError(f"{name} is {value!r}, not {what}", hint=HINT)
    return kind(value)


@dataclass(frozen=True)
class GletModelRequest:
    """One model to serve: its rate, its SLO, the variant that serves it (None: its name)
    and that variant's family (None: resolved from the store)."""

    name: str
    rate_rps: float
    slo_ms: float
    variant: str | None = None
    family: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "rate_rps": self.rate_rps,
            "slo_ms": self.slo_ms,
            "variant": self.variant,
        }
        return out | ({"family": self.family} if self.family else {})


@dataclass(frozen=True)
class GletRequest:
    """A ``plan glet`` request (defaults filled in; ``partitions`` None: the planner's)."""

    models: tuple[GletModelRequest, ...]
    partitions: tuple[str, ...] | None = None
    hardware: str | None = None
    algorithm: str = "glet"
    max_gpus: int = 8
    rate_percentile: float = 99.0
    #: the headroom the rates are packed with (a replan's: ``replan_headroom``)
    rate_headroom: float = 0.0
    #: the headroom the next replan packs with; None: the kind's default
    replan_headroom: float | None = None
    #: seconds of the schedule's simulated check (0: none), and its seed
    simulate_s: float = 0.0
    seed: int = 0
    #: ``"newest"`` (the store's newest model), a stored model's id, a plan's record of one
    #: (``id`` and ``coefficients``), or None / False (planned without interference)
    interference: Any = "newest"
    #: the spec file the request was read from (recorded)
    spec: str | None = None
    #: the GPU's memory (MiB) the glets on one GPU must fit; None: from the profiles
    gpu_memory_mb: float | None = None

    @classmethod
    def from_dict(cls, request: Any) -> GletRequest:
        """Validate a request document.

        Raises:
            InputError: naming the field, the bad value and what it takes.
        """
        if not isinstance(request, dict):
            raise InputError("the glet request must be an object", hint=HINT)
        models = _models(request.get("models"))
        parts = request.get("partitions")
        if parts is not None and not isinstance(parts, list | tuple):
            raise InputError("request.partitions must be a list", hint=HINT)
        hardware, algorithm = request.get("hardware"), request.get("algorithm") or "glet"
        if not isinstance(hardware, str | None) or not isinstance(algorithm, str):
            raise InputError("request.hardware and request.algorithm must be names", hint=HINT)
        replan_headroom = option(request, "replan_headroom", None, float)
        if replan_headroom is not None and not (
            math.isfinite(replan_headroom) and 0 <= replan_headroom <= 10
        ):
            raise InputError(
                f"request.replan_headroom is {replan_headroom}, not in [0, 10]", hint=HINT
            )
        spec = request.get("spec")
        return cls(
            models=models,
            partitions=None
            if parts is None
            else tuple(parse_partitions(list(parts), where="request.partitions")),
            hardware=hardware,
            algorithm=algorithm,
            max_gpus=whole(
                option(request, "max_gpus", 8, int), "request.max_gpus (--max-gpus)", "gpus"
            ),
            rate_percentile=option(request, "rate_percentile", 99.0, float),
            rate_headroom=bounded(
                option(request, "rate_headroom", 0.0, float), "request.rate_headroom", "headroom"
            ),
            replan_headroom=replan_headroom,
            simulate_s=bounded(
                option(request, "simulate_s", 0.0, float),
                "request.simulate_s (--simulate-seconds)",
                "duration_s",
            ),
            seed=whole(option(request, "seed", 0, int), "request.seed (--seed)", "seed"),
            interference=_interference(request.get("interference", "newest")),
            spec=None if spec is None else str(spec),
            gpu_memory_mb=_memory(request),
        )

    def to_dict(self) -> dict[str, Any]:
        """The request as a document (what ``plan glet`` hands the kind)."""
        out: dict[str, Any] = {
            "spec": self.spec,
            "hardware": self.hardware,
            "models": [m.to_dict() for m in self.models],
            "partitions": None if self.partitions is None else list(self.partitions),
            "max_gpus": self.max_gpus,
            "rate_percentile": self.rate_percentile,
            "algorithm": self.algorithm,
            "interference": self.interference,
            "rate_headroom": self.rate_headroom,
            "simulate_s": self.simulate_s,
            "seed": self.seed,
        }
        if self.replan_headroom is not None:
            out["replan_headroom"] = self.replan_headroom
        if self.gpu_memory_mb is not None:
            out["gpu_memory_mb"] = self.gpu_memory_mb
        return out


def _models(models: Any) -> tuple[GletModelRequest, ...]:
    if not isinstance(models, list) or not models:
        raise InputError("the glet request has no models", hint=HINT)
    out = []
    for n, m in enumerate(models):
        where = f"request.models[{n}]"
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise InputError(f"{where} needs a name", hint=HINT)
        rate, slo = _finite(m.get("rate_rps")), _finite(m.get("slo_ms"))
        if rate is None or slo is None:
            raise InputError(f"{where} needs numbers rate_rps and slo_ms", hint=HINT)
        rate = bounded(rate, f"{where}.rate_rps (the RATE of --model NAME:RATE:SLO_MS)", "rate_rps")
        slo = bounded(slo, f"{where}.slo_ms (the SLO_MS of --model NAME:RATE:SLO_MS)", "latency_ms")
        variant, family = m.get("variant"), m.get("family")
        if variant is not None and not isinstance(variant, str):
            raise InputError(f"{where}.variant must be a variant name", hint=HINT)
        if family is not None and not isinstance(family, str):
            raise InputError(f"{where}.family must be a model family name", hint=HINT)
        out.append(GletModelRequest(m["name"], rate, slo, variant or None, family or None))
    return tuple(out)


def _interference(want: Any) -> Any:
    """The interference choice, its id checked when it names one."""
    if want is None or want is False or want in ("newest", True):
        return want
    if isinstance(want, dict):
        if want.get("coefficients") is not None:
            return want
        model_id = want.get("id")
    else:
        model_id = want
    if model_id not in ("newest", True, None) and (
        isinstance(model_id, bool) or not isinstance(model_id, int)
    ):
        raise InputError(
            f"request.interference is {model_id!r}, not an interference model id",
            hint=_INTERFERENCE_HINT,
        )
    return want


def _memory(request: dict[str, Any]) -> float | None:
    given = option(request, "gpu_memory_mb", None, float)
    if given is not None and not (math.isfinite(given) and given > 0):
        raise InputError(f"request.gpu_memory_mb is {given}, not a positive number of MiB")
    return given
