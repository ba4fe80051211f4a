"""What a plan is evaluated with: the load it was made for, the SLO each of its variants was
sized for, and the one profile per (variant, resource, batch) its service times come from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.data.records import Profile, Variant
from greenctl.planner.core.service import load_test_row


def default_rate(plan: Plan) -> float:
    """The load a plan was made for: ``predicted.rate_rps``, else ``request.rate_rps``,
    else the sum of its quotas.

    Raises:
        InputError: when the plan states none of them.
    """
    for source in (plan.predicted, plan.request):
        value = source.get("rate_rps") if isinstance(source, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
    quotas = [d.quota_rps for d in plan.deployments]
    if quotas and all(q is not None for q in quotas) and sum(q or 0.0 for q in quotas) > 0:
        return float(sum(q or 0.0 for q in quotas))
    raise InputError(
        "the plan states no rate (predicted.rate_rps, request.rate_rps or quotas)",
        hint="pass --rate RPS or --trace FILE",
    )


def sized_slo_ms(
    plan: Plan, variants: Mapping[str, Variant], fallback_ms: float | None = None
) -> dict[str, float]:
    """The SLO (ms) each variant of ``plan`` was sized for: its own model's ``slo_ms`` in
    ``request.models`` (a glet plan, :func:`model_slos`), else its model's in
    ``request.families``, else ``request.slo_ms``, else ``fallback_ms``; variants without
    one are left out."""
    req = plan.request if isinstance(plan.request, dict) else {}
    own = model_slos(plan)
    by_model: dict[str, float] = {}
    fams = req.get("families")
    for fam in fams if isinstance(fams, list) else []:
        if isinstance(fam, dict) and isinstance(fam.get("model"), str):
            slo = positive_ms(fam.get("slo_ms"))
            if slo is not None:
                by_model[fam["model"]] = slo
    default = positive_ms(req.get("slo_ms"))
    if default is None:
        default = fallback_ms
    out: dict[str, float] = {}
    for dep in plan.deployments:
        family = variants[dep.variant].family if dep.variant in variants else dep.model
        slo = own.get(dep.variant, by_model.get(family, by_model.get(dep.model, default)))
        if slo is not None:
            out[dep.variant] = slo
    return out


def positive_ms(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) and value > 0 else None


def served_model_slos(plan: Plan) -> dict[str, float]:
    """The SLO (ms) each model a client asks for (a deployment's ``model``) is held to where
    the plan's models have their own (:func:`model_slos`): the strictest of its variants'."""
    own = model_slos(plan)
    out: dict[str, float] = {}
    for dep in plan.deployments:
        if dep.variant in own:
            out[dep.model] = min(own[dep.variant], out.get(dep.model, own[dep.variant]))
    return out


def model_slos(plan: Plan) -> dict[str, float]:
    """Each variant's own SLO (ms) where the plan's request gives its models one each
    (``request.models``: name, variant, slo_ms, as a glet plan records them; a variant two
    models share takes the stricter); empty for other plans."""
    req = plan.request if isinstance(plan.request, dict) else {}
    models = req.get("models")
    out: dict[str, float] = {}
    for m in models if isinstance(models, list) else []:
        if not isinstance(m, dict):
            continue
        variant, slo = m.get("variant") or m.get("name"), positive_ms(m.get("slo_ms"))
        if isinstance(variant, str) and slo is not None:
            out[variant] = min(slo, out.get(variant, slo))
    return out


def pick_profiles(
    profiles: Sequence[Profile], slo_ms: Mapping[str, float] | None = None
) -> dict[tuple[str, str, int], Profile]:
    """One profile per (variant, resource, batch).

    With the SLO a variant was sized for (``slo_ms``, by variant name), the load test the
    mix planner sized it from (:func:`greenctl.planner.core.service.load_test_row`) when there is
    one; otherwise prefer rows with latency percentiles, then without a capacity SLO (a
    plain measurement), then the newest.
    """

    def rank(p: Profile) -> tuple[int, int, str, int]:
        return (
            1 if p.latency_p50_ms is not None else 0,
            1 if p.capacity_slo_ms is None else 0,
            p.created_at or "",
            p.id or 0,
        )

    best: dict[tuple[str, str, int], Profile] = {}
    rows: dict[tuple[str, str, int], list[Profile]] = {}
    for p in profiles:
        key = (p.variant, p.resource, p.batch)
        rows.setdefault(key, []).append(p)
        if key not in best or rank(p) > rank(best[key]):
            best[key] = p
    for key, group in rows.items():
        slo = (slo_ms or {}).get(key[0])
        row = load_test_row(group, slo) if slo is not None else None
        if row is not None and (row.capacity_rps or 0) > 0:
            best[key] = row
    return best
