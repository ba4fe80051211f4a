"""The ``mix`` kind's request: what ``plan mix`` (or a spec file) asks for, validated once.

:meth:`MixRequest.from_dict` checks a request document (a plan's ``request``, a spec, what
``plan mix`` parsed) and :meth:`MixRequest.to_dict` writes it in canonical form: the dict the
planner's problem and the plan document record. One model (``model`` + ``rate_rps``) is one
family; ``families`` holds several, with budgets shared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from greenctl.data.carbon_io import carbon_option
from greenctl.data.errors import InputError
from greenctl.data.limits import bounded, number, whole
from greenctl.data.plan import Deployment
from greenctl.data.resources import parse_resource
from greenctl.data.spec_io import MIX_FAMILY_FIELDS, MIX_REQUEST_FIELDS
from greenctl.planner.mix.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    REFERENCE_CARBON_INTENSITY,
)

OBJECTIVES = ("accuracy", "cost", "carbon", "balanced")
STRATEGIES = ("ilp", "greedy", "single")
SOLVERS = ("highs", "cbc")

_KIND_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
_BUDGET_HINT = (
    "use KIND=AMOUNT (cpu=14 cores, mig=7 compute slices, gpu=2) or "
    "LABEL=COUNT (mig:1g.10gb=7 instances)"
)


def _accuracy(value: Any, name: str) -> float:
    """An accuracy floor: a fraction in 0..1 (profiles store accuracy as a fraction)."""
    try:
        return bounded(value, name, "fraction")
    except InputError as exc:
        raise InputError(exc.message, hint="accuracy is a fraction, e.g. 0.76 for 76 %") from None


@dataclass(frozen=True)
class MixFamilyRequest:
    """One family's load: its rate, its latency SLO and an optional accuracy floor."""

    model: str
    rate_rps: float
    slo_ms: float
    min_accuracy: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "rate_rps": self.rate_rps}
        out["slo_ms"] = self.slo_ms
        if self.min_accuracy is not None:
            out["min_accuracy"] = self.min_accuracy
        return out


@dataclass(frozen=True)
class MixRequest:
    """A ``plan mix`` request in canonical form (defaults filled in)."""

    families: tuple[MixFamilyRequest, ...]
    slo_ms: float | None = None
    percentile: str = "p95"
    budgets: dict[str, float] = field(default_factory=dict)
    objective: str = "balanced"
    min_accuracy: float | None = None
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    carbon_intensity: float | None = None
    reference_carbon_intensity: float = REFERENCE_CARBON_INTENSITY
    pue: float = 1.0
    headroom: float = 0.0
    #: the deployments running now (no loading cost for them), as deployment dicts
    current: tuple[dict[str, Any], ...] = ()
    strategy: str = "ilp"
    solver: str = "highs"
    time_limit_s: float | None = None

    @classmethod
    def from_dict(cls, request: Any) -> MixRequest:
        """Validate a request document: ``model`` + ``rate_rps`` (one family) or
        ``families`` (objects with ``model``, ``rate_rps`` and optional ``slo_ms`` /
        ``min_accuracy``), and the options of ``plan mix``.

        Raises:
            InputError: naming the field, the bad value and the fix.
        """
        if not isinstance(request, dict):
            raise InputError("a plan mix request must be an object")
        known = set(MIX_REQUEST_FIELDS)
        unknown = sorted(set(request) - known)
        if unknown:
            raise InputError(
                f"unknown request field(s): {', '.join(unknown)}",
                hint=f"known fields: {', '.join(sorted(known))}",
            )
        slo_default = request.get("slo_ms")
        return cls(
            families=_families(request),
            slo_ms=None if slo_default is None else bounded(slo_default, "slo_ms", "latency_ms"),
            percentile=_percentile(request.get("percentile")),
            budgets=_budgets(request.get("budgets")),
            objective=_choice(request.get("objective") or "balanced", OBJECTIVES, "objective"),
            min_accuracy=None
            if request.get("min_accuracy") is None
            else _accuracy(request["min_accuracy"], "min_accuracy"),
            **_weights(request),
            carbon_intensity=None
            if request.get("carbon_intensity") is None
            else carbon_option(
                number(request["carbon_intensity"], "carbon_intensity (g/kWh)"),
                "carbon_intensity",
            ),
            reference_carbon_intensity=carbon_option(
                number(
                    request.get("reference_carbon_intensity") or REFERENCE_CARBON_INTENSITY,
                    "reference_carbon_intensity",
                ),
                "reference_carbon_intensity",
                positive=True,
            ),
            pue=bounded(request.get("pue") or 1.0, "pue", "pue"),
            headroom=bounded(request.get("headroom") or 0.0, "headroom", "headroom"),
            current=_current(request.get("current")),
            strategy=_choice(request.get("strategy") or "ilp", STRATEGIES, "strategy"),
            solver=_choice(request.get("solver") or "highs", SOLVERS, "solver"),
            time_limit_s=None
            if request.get("time_limit_s") is None
            else bounded(request["time_limit_s"], "time_limit_s (--time-limit)", "time_limit_s"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The request as the plan document records it (and the planner reads it)."""
        out: dict[str, Any] = {"families": [f.to_dict() for f in self.families]}
        if self.slo_ms is not None:
            out["slo_ms"] = self.slo_ms
        out["percentile"] = self.percentile
        out["budgets"] = dict(self.budgets)
        out["objective"] = self.objective
        if self.min_accuracy is not None:
            out["min_accuracy"] = self.min_accuracy
        out.update(alpha=self.alpha, beta=self.beta, gamma=self.gamma)
        if self.carbon_intensity is not None:
            out["carbon_intensity"] = self.carbon_intensity
        out["reference_carbon_intensity"] = self.reference_carbon_intensity
        out["pue"] = self.pue
        out["headroom"] = self.headroom
        if self.current:
            out["current"] = [dict(d) for d in self.current]
        out["strategy"] = self.strategy
        out["solver"] = self.solver
        if self.time_limit_s is not None:
            out["time_limit_s"] = self.time_limit_s
        return out


def _families(request: dict[str, Any]) -> tuple[MixFamilyRequest, ...]:
    fams_in = request.get("families")
    if fams_in is None:
        if request.get("model") is None:
            raise InputError("no model family given", hint="pass --model FAMILY or a --spec file")
        fams_in = [{"model": request.get("model"), "rate_rps": request.get("rate_rps")}]
    elif request.get("model") is not None:
        raise InputError("give either 'model' or 'families', not both")
    if not isinstance(fams_in, list) or not fams_in:
        raise InputError("'families' must be a non-empty list of {model, rate_rps} objects")
    families: list[MixFamilyRequest] = []
    for i, fam in enumerate(fams_in):
        family = _family(fam, f"families[{i}]", request.get("slo_ms"))
        if any(f.model == family.model for f in families):
            raise InputError(f"model family '{family.model}' is listed twice")
        families.append(family)
    return tuple(families)


def _family(fam: Any, where: str, slo_default: Any) -> MixFamilyRequest:
    if not isinstance(fam, dict):
        raise InputError(f"{where} must be an object with model and rate_rps")
    extra = sorted(set(fam) - set(MIX_FAMILY_FIELDS))
    if extra:
        raise InputError(
            f"{where}: unknown field(s) {', '.join(extra)}",
            hint=f"a family takes {', '.join(MIX_FAMILY_FIELDS)}",
        )
    model = fam.get("model")
    if not isinstance(model, str) or not model:
        raise InputError(f"{where}.model must be a model family name")
    if fam.get("rate_rps") is None:
        raise InputError(f"no request rate for '{model}'", hint="pass --rate RPS")
    rate = bounded(fam.get("rate_rps"), f"rate of '{model}' (rate_rps)", "rate_rps")
    slo = fam.get("slo_ms", slo_default)
    if slo is None:
        raise InputError(f"no latency SLO for '{model}'", hint="pass --slo-ms MS")
    slo = bounded(slo, f"SLO of '{model}' (slo_ms)", "latency_ms")
    floor = fam.get("min_accuracy")
    return MixFamilyRequest(
        model, rate, slo, None if floor is None else _accuracy(floor, f"{where}.min_accuracy")
    )


def _percentile(pct: Any) -> str:
    pct = "p95" if pct is None else pct
    if isinstance(pct, int | float) and not isinstance(pct, bool):
        pct = number(pct, "percentile", minimum=0.0, maximum=100.0)
        pct = f"p{round(float(pct) * 100) if pct < 1 else round(float(pct))}"
    if pct not in ("p95", "p99"):
        raise InputError(f"percentile must be p95 or p99, got {pct!r}")
    return str(pct)


def _budgets(budgets_in: Any) -> dict[str, float]:
    budgets_in = budgets_in or {}
    if not isinstance(budgets_in, dict):
        raise InputError("'budgets' must be an object of KIND=AMOUNT")
    budgets = {}
    for key, amount in budgets_in.items():
        key = str(key).strip()
        if not _KIND_RE.match(key):
            try:
                key = parse_resource(key).label
            except InputError:
                raise InputError(
                    f"budget '{key}': not a resource kind or label", hint=_BUDGET_HINT
                ) from None
        budgets[key] = bounded(amount, f"budget '{key}' (--budget)", "budget")
    return budgets


def _choice(value: Any, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        hint = {"strategy": "use ilp, greedy or single", "solver": "use highs or cbc"}.get(
            name, f"use one of {', '.join(choices)}"
        )
        raise InputError(f"unknown {name} {value!r}", hint=hint)
    return str(value)


def _weights(request: dict[str, Any]) -> dict[str, float]:
    """alpha, beta and gamma of the balanced objective (their defaults when absent)."""
    defaults = {"alpha": DEFAULT_ALPHA, "beta": DEFAULT_BETA, "gamma": DEFAULT_GAMMA}
    return {
        key: bounded(request.get(key, default), key, "weight") for key, default in defaults.items()
    }


def _current(current: Any) -> tuple[dict[str, Any], ...]:
    current = current or []
    if not isinstance(current, list):
        raise InputError("'current' must be a list of deployments")
    cur = []
    for i, d in enumerate(current):
        if isinstance(d, Deployment):
            d = d.to_dict()
        if not isinstance(d, dict) or not d.get("variant") or not d.get("resource"):
            raise InputError(f"current[{i}] must be a deployment with variant and resource")
        cur.append(
            {
                "model": d.get("model"),
                "variant": d["variant"],
                "resource": d["resource"],
                "count": whole(d.get("count") or 1, f"current[{i}].count", "count"),
                "batch": whole(d.get("batch") or 1, f"current[{i}].batch", "count"),
                "quota_rps": d.get("quota_rps"),
            }
        )
    return tuple(cur)
