"""Building a :class:`MixProblem` from a ``plan mix`` request, variants and profiles.

The request is validated once (:class:`MixRequest`), budgets no profile uses are refused
before any service model is built, and every requested family gets its eligible options
(:mod:`greenctl.planner.mix.options`), dominated ones pruned. The measured serving path and
the dispatcher stage every request crosses shorten the SLO an option derived from a latency
profile must meet; what the plan should say about them lands in ``problem.notes``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InfeasiblePlan, InputError, NotFoundError
from greenctl.data.limits import SLO_QUANTILES
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import KNOWN_KINDS, parse_resource
from greenctl.planner.mix.model import MixFamily, MixOption, MixProblem, MixVariant
from greenctl.planner.mix.options import (
    budget_usage,
    latency_capacities,
    lowest_reachable_slo,
    make_option,
    operating_point,
    path_quantile,
    price_energy,
    prune_dominated,
    size_row,
)
from greenctl.planner.mix.request import MixRequest

if TYPE_CHECKING:
    from greenctl.planner.core.serving_path import DispatcherStage, ServingPath

__all__ = ["build_mix_problem", "dispatcher_of", "normalize_request"]


def normalize_request(request: dict[str, Any]) -> dict[str, Any]:
    """A ``plan mix`` request validated (:meth:`MixRequest.from_dict`) in canonical form.

    Raises:
        InputError: naming the field and the fix.
    """
    return MixRequest.from_dict(request).to_dict()


def build_mix_problem(
    request: MixRequest | dict[str, Any],
    variants: Sequence[Variant],
    profiles: Sequence[Profile],
    *,
    serving: Mapping[str, ServingPath | Sequence[float]] | None = None,
) -> MixProblem:
    """Build a :class:`MixProblem` from a request (typed, or the plan's validated ``request`` dict).

    ``profiles`` are the latest of the variants; rows of one (variant, resource, batch) may
    differ in ``capacity_rps``/``capacity_slo_ms`` (load tests at several SLOs). ``serving`` is
    the measured serving path per variant or family (``"*"``: all): options from latency
    profiles must meet the SLO less its percentile, and it is added to the plan's predicted
    latencies.

    Raises:
        InputError / NotFoundError: unknown family, bad numbers, a budget for a resource
        kind no profile of the requested families uses.
    """
    typed = request if isinstance(request, MixRequest) else MixRequest.from_dict(request)
    req = typed.to_dict()
    by_family = _variants_by_family(variants, req)
    # refused before any service model is built: those take minutes on large profile sets
    _check_budgets(req, by_family, profiles)
    notes: list[str] = []
    all_sizes: dict[tuple[str, str], dict[int, Profile]] = {}
    stage = _dispatcher_stage(serving, req, by_family, notes)
    rows_of = _profiles_by_family(by_family, profiles)
    families = [
        _family(fam, req, by_family, rows_of[fam["model"]], serving, stage, all_sizes, notes)
        for fam in req["families"]
    ]
    costless = sum(1 for f in families for o in f.options if not o.priced)
    if costless:
        notes.append(
            f"{costless} option(s) have no cost_per_hour in their profile; their cost is "
            "their resource amount per hour (cores, slices or units)"
        )
    requested = {f["model"] for f in req["families"]}
    return MixProblem(
        profiles=_option_profiles(families, all_sizes),
        variant_records={v.name: v for v in variants if v.family in requested},
        families=families,
        percentile=req["percentile"],
        budgets=req["budgets"],
        objective=req["objective"],
        alpha=req["alpha"],
        beta=req["beta"],
        gamma=req["gamma"],
        carbon_intensity=req.get("carbon_intensity"),
        reference_carbon_intensity=req["reference_carbon_intensity"],
        pue=req["pue"],
        headroom=req["headroom"],
        current=[
            Deployment(
                model=d.get("model") or "",
                variant=d["variant"],
                resource=d["resource"],
                count=d["count"],
                batch=d["batch"],
                quota_rps=d.get("quota_rps"),
            )
            for d in req.get("current", [])
        ],
        request=req,
        notes=notes,
        serving={k: v for k, v in (serving or {}).items() if v},
    )


def _variants_by_family(
    variants: Sequence[Variant], req: dict[str, Any]
) -> dict[str, list[Variant]]:
    """The variants of each family; every requested family must have some.

    Raises:
        NotFoundError: a requested family no variant belongs to (names the known ones).
    """
    by_family: dict[str, list[Variant]] = {}
    for v in variants:
        by_family.setdefault(v.family, []).append(v)
    for fam in req["families"]:
        if fam["model"] not in by_family:
            known = ", ".join(sorted(by_family))
            raise NotFoundError(
                f"unknown model family '{fam['model']}'",
                hint=f"known families: {known}" if known else "profile or import it first",
            )
    return by_family


def _profiles_by_family(
    by_family: Mapping[str, Sequence[Variant]], profiles: Sequence[Profile]
) -> dict[str, list[Profile]]:
    """Each family's profiles (those of its variants), in their given order: one pass over
    the profiles instead of one per family."""
    at: dict[str, list[int]] = {}
    for i, p in enumerate(profiles):
        at.setdefault(p.variant, []).append(i)
    out = {}
    for fam, vs in by_family.items():
        picked = {i for v in vs for i in at.get(v.name, ())}
        out[fam] = [profiles[i] for i in sorted(picked)]
    return out


def _dispatcher_stage(
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    req: dict[str, Any],
    by_family: Mapping[str, Sequence[Variant]],
    notes: list[str],
) -> DispatcherStage | None:
    """The dispatcher: one serial stage every family's requests cross
    (``evaluate.DispatcherStage``), None when not measured; a note says what it adds.

    Raises:
        InfeasiblePlan: the dispatcher cannot carry the requested load.
    """
    stage = dispatcher_of(serving, {f["model"]: f["rate_rps"] for f in req["families"]}, by_family)
    if stage is not None and stage.overloaded:
        raise InfeasiblePlan(
            f"the dispatcher carries at most {stage.capacity_rps:,.0f} req/s "
            f"({stage.mean_cpu_ms:.3g} ms of CPU per request measured), the plan asks "
            f"{stage.rate_rps:,.0f} req/s",
            hint="lower the rate, or measure the dispatcher nearer this rate (`greenctl "
            "profile serving --rate RPS`: its CPU per request falls as the rate rises)",
        )
    if stage is not None:
        notes.append(
            f"the dispatcher: {stage.mean_cpu_ms:.3g} ms of CPU per request, modeled "
            f"{100 * stage.utilisation:.0f} % busy at {stage.rate_rps:,.0f} req/s; its wait "
            "there counts in every option's serving path"
        )
    return stage


def _family(
    fam: dict[str, Any],
    req: dict[str, Any],
    by_family: Mapping[str, Sequence[Variant]],
    profiles: Sequence[Profile],
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    stage: DispatcherStage | None,
    all_sizes: dict[tuple[str, str], dict[int, Profile]],
    notes: list[str],
) -> MixFamily:
    """One requested family with its eligible options (dominated ones pruned) from its
    ``profiles``; the sizes behind its batching options into ``all_sizes``, what the plan
    should say into ``notes``."""
    q = SLO_QUANTILES[req["percentile"]]
    path_ms = path_quantile((serving or {}).get(fam["model"]), q, stage)
    if path_ms > 0:
        notes.append(
            f"{fam['model']}: the measured serving path takes {path_ms:.3g} ms at "
            f"{req['percentile']}; options derived from latency profiles must meet the SLO "
            f"less that ({fam['slo_ms'] - path_ms:.4g} ms)"
        )
    fvars = {
        v.name: MixVariant(
            v.name,
            float(v.accuracy) if v.accuracy is not None else 0.0,
            float(v.load_time_s or 0.0),
        )
        for v in by_family[fam["model"]]
    }
    missing_acc = [v.name for v in by_family[fam["model"]] if v.accuracy is None]
    if missing_acc:
        notes.append(f"variants without an accuracy count as 0: {', '.join(missing_acc)}")
    groups: dict[tuple[str, str, int, str | None], list[Profile]] = {}
    for p in profiles:
        if p.variant in fvars:
            groups.setdefault((p.variant, p.resource, int(p.batch), p.hardware), []).append(p)
    # the row each measured batch size stands with: a batching option's service model
    # uses every size of its (variant, resource)
    sizes: dict[tuple[str, str, str | None], dict[int, Profile]] = {}
    for (vname, label, batch, hw), rows in groups.items():
        sizes.setdefault((vname, label, hw), {})[batch] = size_row(rows, fam["slo_ms"])
        all_sizes.setdefault((vname, label), {})[batch] = sizes[(vname, label, hw)][batch]
    options, ineligible = [], []
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3] or ""))
    # each option's serving path and its latency at the percentile
    paths = []
    for (vname, label, _, _), _ in ordered:
        own = (serving or {}).get(f"{vname}@{label}") or (serving or {}).get(vname)
        paths.append(
            (path_quantile(own, q, stage), own)
            if own is not None
            else (path_ms, (serving or {}).get(fam["model"]))
        )
    known = latency_capacities(
        [
            (parse_resource(k[1]), rows, pm, pp)
            for (k, rows), (pm, pp) in zip(ordered, paths, strict=True)
        ],
        fam["slo_ms"],
        q,
    )
    for ((vname, label, batch, hw), rows), (own_ms, own_path) in zip(ordered, paths, strict=True):
        opt = make_option(
            vname,
            parse_resource(label),
            batch,
            hw,
            rows,
            fam["slo_ms"],
            req["percentile"],
            q,
            path_ms=own_ms,
            path=own_path,
            sizes=sizes[(vname, label, hw)],
            known=known,
        )
        if isinstance(opt, str):
            ineligible.append(f"{vname} on {label} batch {batch}: {opt}")
            continue
        _price_option(opt, fam, req, sizes[(vname, label, hw)], serving, notes)
        options.append(opt)
    family = MixFamily(
        name=fam["model"],
        rate_rps=fam["rate_rps"],
        slo_ms=fam["slo_ms"],
        variants=fvars,
        options=options,
        min_accuracy=fam.get("min_accuracy", req.get("min_accuracy")),
        ineligible=ineligible,
        lowest_slo=lowest_reachable_slo(
            by_family[fam["model"]], profiles, fam["model"], req["percentile"], path_ms=path_ms
        ),
    )
    family.options, family.pruned = prune_dominated(family.options)
    return family


def _price_option(
    opt: MixOption,
    fam: dict[str, Any],
    req: dict[str, Any],
    sizes: dict[int, Profile],
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    notes: list[str],
) -> None:
    """An option's budget usage, the smaller sizes behind it, and the energy the evaluation
    core will account for it (before pruning: dominance compares these terms)."""
    opt.usage = budget_usage(parse_resource(opt.resource), req["budgets"])
    opt.sizes = {n: r for n, r in sizes.items() if n < opt.batch}
    if opt.profile is not None:
        opt.sizes[opt.batch] = opt.profile
    why = price_energy(
        opt,
        fam["model"],
        operating_point(opt, fam["rate_rps"], req["headroom"]),
        {k: v for k, v in (serving or {}).items() if v},
    )
    if why is not None:
        notes.append(
            f"energy priced from the profile alone (no idle power), the evaluation "
            f"core could not: {why}"
        )


def _option_profiles(
    families: Sequence[MixFamily], all_sizes: dict[tuple[str, str], dict[int, Profile]]
) -> dict[tuple[str, str, int], Profile]:
    """The profile of every option, and the smaller sizes behind batching options."""
    option_profiles = {
        (o.variant, o.resource, o.batch): o.profile
        for f in families
        for o in f.options
        if o.profile is not None
    }
    by_key: dict[tuple[str, str], list[MixOption]] = {}
    for o in (o for f in families for o in f.options):
        by_key.setdefault((o.variant, o.resource), []).append(o)
    for key, rows_at in all_sizes.items():
        for o in by_key.get(key, ()):
            for n, row in rows_at.items():
                if n < o.batch:
                    option_profiles.setdefault((o.variant, o.resource, n), row)
    return option_profiles


def _check_budgets(
    req: dict[str, Any], by_family: Mapping[str, Sequence[Variant]], profiles: Sequence[Profile]
) -> None:
    """Refuse a budget for a resource kind or label no profile of the requested families uses.

    Raises:
        InputError: naming the budget and the profiled kinds and labels.
    """
    names = {v.name for f in req["families"] for v in by_family[f["model"]]}
    seen = {parse_resource(p.resource) for p in profiles if p.variant in names}
    kinds = {r.kind for r in seen}
    labels = {r.label for r in seen}
    for key in req["budgets"]:
        if (":" in key and key not in labels) or (":" not in key and key not in kinds):
            known = ", ".join(sorted(kinds | labels)) or "none"
            kind_word = "resource" if ":" in key else "resource kind"
            extra = "" if key.split(":")[0] in KNOWN_KINDS else " (not a known resource kind)"
            raise InputError(
                f"budget for unknown {kind_word} '{key}'{extra}: no profile of "
                f"{', '.join(f['model'] for f in req['families'])} uses it",
                hint=f"budget one of the profiled kinds/labels: {known}",
            )


def dispatcher_of(
    serving: Mapping[str, ServingPath | Sequence[float]] | None,
    rates: Mapping[str, float],
    variants: Mapping[str, Sequence[Variant] | Sequence[str]],
) -> DispatcherStage | None:
    """The plan's dispatcher stage (``evaluate.planned_dispatcher``); ``variants``: each
    family's variants (records or names)."""
    from greenctl.planner.core.evaluate import planned_dispatcher

    names = {m: [v.name if isinstance(v, Variant) else v for v in vs] for m, vs in variants.items()}
    return planned_dispatcher(serving, rates, names)
