"""The ``llm`` kind's request: what ``plan llm`` (or a request file) asks for, validated once.

:meth:`LLMRequest.from_dict` checks a request document (a plan's ``request``, ``plan run
--request``'s file, what ``plan llm`` parsed), naming each bad field; :meth:`LLMRequest.to_dict`
writes it in canonical form, the dict the plan document records and the planner reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError, shown
from greenctl.data.limits import SLO_QUANTILES, bounded, optional
from greenctl.data.resources import KNOWN_KINDS
from greenctl.planner.core.balanced import (
    DEFAULT_ALPHA,
    DEFAULT_GAMMA,
    REFERENCE_CARBON_INTENSITY,
)

OBJECTIVES = ("carbon", "energy", "cost", "balanced")
PERCENTILES = tuple(SLO_QUANTILES)
#: the budgets an LLM plan takes: whole cores or whole GPUs
BUDGET_KINDS = ("cpu", "gpu")
#: every field a request may hold
FIELDS = (
    "model",
    "rate_rps",
    "ttft_ms",
    "tpot_ms",
    "percentile",
    "min_quality",
    "prompt_tokens",
    "output_tokens",
    "trace",
    "budget",
    "objective",
    "carbon_intensity",
    "reference_carbon_intensity",
    "pue",
    "alpha",
    "gamma",
)


@dataclass(frozen=True)
class LLMRequest:
    """A ``plan llm`` request in canonical form (defaults filled in).

    ``prompt_tokens`` / ``output_tokens`` None: the lengths each tier was profiled with.
    ``trace``: the summary of the trace the rate and lengths came from (or None).
    """

    model: str
    rate_rps: float
    ttft_ms: float
    tpot_ms: float
    budget: dict[str, float]
    percentile: str = "p95"
    min_quality: float | None = None
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    trace: dict[str, Any] | None = None
    objective: str = "carbon"
    carbon_intensity: float | None = None
    reference_carbon_intensity: float = REFERENCE_CARBON_INTENSITY
    pue: float = 1.0
    alpha: float = DEFAULT_ALPHA
    gamma: float = DEFAULT_GAMMA
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def intensity(self) -> float:
        """The carbon intensity planned at (the reference one when none was given)."""
        if self.carbon_intensity is None:
            return self.reference_carbon_intensity
        return self.carbon_intensity

    @classmethod
    def from_dict(cls, request: Any) -> LLMRequest:
        """Validate a request document.

        Raises:
            InputError: naming the field, the bad value and the fix.
        """
        if not isinstance(request, dict):
            raise InputError(f"an llm request is an object of its fields, not {shown(request)}")
        unknown = sorted(str(k) for k in set(request) - set(FIELDS))
        if unknown:
            raise InputError(
                f"unknown llm request field(s): {', '.join(unknown)}",
                hint=f"known fields: {', '.join(FIELDS)}",
            )
        model = request.get("model")
        if not isinstance(model, str) or not model.strip():
            raise InputError(
                f"model must be an LLM family name, got {shown(model)}", hint="pass --model FAMILY"
            )
        for name, flag in (
            ("rate_rps", "--rate"),
            ("ttft_ms", "--ttft-ms"),
            ("tpot_ms", "--tpot-ms"),
        ):
            if request.get(name) is None:
                raise InputError(f"no {name} given", hint=f"pass {flag}")
        ci = request.get("carbon_intensity")
        return cls(
            model=model.strip(),
            rate_rps=bounded(request["rate_rps"], "rate_rps (--rate)", "rate_rps"),
            ttft_ms=bounded(request["ttft_ms"], "ttft_ms (--ttft-ms)", "latency_ms"),
            tpot_ms=bounded(request["tpot_ms"], "tpot_ms (--tpot-ms)", "latency_ms"),
            budget=_budget(request.get("budget")),
            percentile=_choice(request.get("percentile") or "p95", PERCENTILES, "percentile"),
            min_quality=optional(
                request.get("min_quality"),
                "min_quality (--min-quality)",
                "fraction",
                hint="quality is a fraction in 0..1, as the tiers were profiled with",
            ),
            prompt_tokens=_tokens(request.get("prompt_tokens"), "prompt_tokens"),
            output_tokens=_tokens(request.get("output_tokens"), "output_tokens"),
            trace=_trace(request.get("trace")),
            objective=_choice(request.get("objective") or "carbon", OBJECTIVES, "objective"),
            carbon_intensity=None if ci is None else carbon_option(ci, "carbon_intensity"),
            reference_carbon_intensity=carbon_option(
                request.get("reference_carbon_intensity") or REFERENCE_CARBON_INTENSITY,
                "reference_carbon_intensity",
                positive=True,
            ),
            pue=bounded(request.get("pue") or 1.0, "pue", "pue"),
            alpha=bounded(request.get("alpha", DEFAULT_ALPHA), "alpha", "weight"),
            gamma=bounded(request.get("gamma", DEFAULT_GAMMA), "gamma", "weight"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The request as the plan document records it (and the planner reads it)."""
        return {
            "model": self.model,
            "rate_rps": self.rate_rps,
            "ttft_ms": self.ttft_ms,
            "tpot_ms": self.tpot_ms,
            "percentile": self.percentile,
            "min_quality": self.min_quality,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "trace": None if self.trace is None else dict(self.trace),
            "budget": dict(self.budget),
            "objective": self.objective,
            "carbon_intensity": self.carbon_intensity,
            "reference_carbon_intensity": self.reference_carbon_intensity,
            "pue": self.pue,
            "alpha": self.alpha,
            "gamma": self.gamma,
        }


def _budget(budget: Any) -> dict[str, float]:
    """``{"cpu": cores}`` or ``{"gpu": GPUs}`` (one kind or both), each amount > 0."""
    hint = "pass --budget cpu=N (cores) or --budget gpu=N (GPUs)"
    if budget is None or budget == {}:
        raise InputError("no budget given", hint=hint)
    if not isinstance(budget, dict):
        raise InputError(
            f'budget must be an object like {{"cpu": 2}}, got {shown(budget)}', hint=hint
        )
    out: dict[str, float] = {}
    for key, amount in budget.items():
        kind = str(key).strip()
        if kind not in BUDGET_KINDS:
            what = "" if kind in KNOWN_KINDS else " (not a resource kind)"
            raise InputError(
                f"budget {shown(key)}{what}: an llm plan budgets cpu cores or gpu GPUs",
                hint=hint,
            )
        value = bounded(amount, f"budget {kind} (--budget {kind}=N)", "budget", hint=hint)
        if value <= 0:
            raise InputError(
                f"budget {kind} (--budget {kind}=N) must be > 0, got {value:g}", hint=hint
            )
        out[kind] = value
    return out


def _tokens(value: Any, name: str) -> float | None:
    """A mean token count: None (as profiled), else a number >= 1."""
    if value is None:
        return None
    flag = "--" + name.replace("_", "-")
    out = bounded(value, f"{name} ({flag})", "count", hint=f"{flag} takes a token count >= 1")
    return out


def _trace(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(
            f"trace must be a trace's summary (an object), got {shown(value)}",
            hint="pass --trace FILE and let plan llm summarise it",
        )
    return dict(value)


def _choice(value: Any, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise InputError(f"unknown {name} {shown(value)}", hint=f"use one of {', '.join(choices)}")
    return str(value)
