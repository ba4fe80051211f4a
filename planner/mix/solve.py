"""``plan mix``: choose variants, their resources, counts and request quotas (InfAdapter/INFaaS).

Pure planning: a :class:`MixProblem` in, a :class:`greenctl.data.plan.Plan` out. No store, no
network. The CLI loads variants and profiles, calls :func:`build_mix_problem` on the plan
document's ``request`` dict (so ``replan`` can redo a plan from ``plan.request``) and then
:func:`plan_mix`.

Formulation (one model for every family, budgets shared), per family ``f`` with load
``L_f = rate_f x (1 + headroom)`` and candidate options ``o = (variant, resource, batch)``:

- ``n_o`` integer instances, ``q_o >= 0`` continuous quota, ``q_o <= capacity_o x n_o``;
- ``sum_o q_o = L_f``; ``sum_o usage_{o,k} n_o <= budget_k`` for every budget ``k``;
- ``sum_o q_o (accuracy_o - floor) >= 0`` when a ``min_accuracy`` floor is set;
- objectives: ``accuracy`` max ``sum q a / sum L`` (linear because the loads are fixed);
  ``cost`` min ``sum n cost``; ``carbon`` min ``(sum n P_idle + sum q e / (1 + headroom))
  x PUE x CI / 3.6e6 / sum rate``, the evaluation core's energy accounting (every instance
  draws its idle power ``P_idle``, each request served adds ``e``, its busy energy above
  idle: ``evaluate.energy_terms``), so the carbon minimised is the carbon the plan reports;
  ``balanced`` max ``AA - alpha RC - beta LC - gamma CC`` where ``LC`` uses binary
  "variant newly started" indicators ``s_v`` with the tight bound ``n_o <= U_o s_v`` and
  ``CC`` is that energy per family over its reference plan's.

Tightness: exact dominance pruning (an option of the same variant with no less capacity
and no more cost, energy or use of any budget replaces it instance for instance), and
per-option count bounds ``U_o = min(ceil(L_f / capacity_o), floor(budget_k / usage_{o,k}))``
which are also the big-M of the indicator constraints. The model is assembled as flat
column/row arrays and handed to HiGHS in one ``passModel`` call (see ``solve_highs``), or
to CBC through pulp. Several families are first solved by the exact Lagrangian
decomposition of :mod:`greenctl.planner.mix.decomp` (prices by column generation, per-family
enumeration and a master MILP over the shared budgets; every objective, accuracy floors under
``accuracy`` and ``cost``); ``extra["solver"]["method"]`` says which ran.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from greenctl.data.errors import InfeasiblePlan, InputError, NotFoundError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import KNOWN_KINDS, Resource, hourly_cost, kind_of, parse_resource
from greenctl.planner.core import solvers
from greenctl.planner.mix import decomp as mix_decomp
from greenctl.planner.mix.model import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    MIP_REL_GAP,
    PERCENTILES,
    REFERENCE_CARBON_INTENSITY,
    TIE_BREAK_REL_TOL,
    Allocation,
    Layout,
    MixFamily,
    MixOption,
    MixProblem,
    MixVariant,
    Model,
    SolveResult,
    Terms,
    build_model,
    components,
    count_bounds,
    evaluate_allocation,
    extract,
    greedy,
    is_maximise,
    objective_terms,
    objective_unit,
    solve,
    solve_highs,
    warm_start,
)
from greenctl.planner.mix.request import OBJECTIVES, SOLVERS, STRATEGIES, MixRequest

__all__ = [
    "DECOMPOSITION",
    "DEFAULT_ALPHA",
    "DEFAULT_BETA",
    "DEFAULT_GAMMA",
    "MIP_REL_GAP",
    "OBJECTIVES",
    "PERCENTILES",
    "REFERENCE_CARBON_INTENSITY",
    "SOLVERS",
    "STRATEGIES",
    "TIE_BREAK_REL_TOL",
    "Allocation",
    "Layout",
    "MixFamily",
    "MixOption",
    "MixProblem",
    "MixRequest",
    "MixVariant",
    "Model",
    "SolveResult",
    "Terms",
    "build_mix_problem",
    "build_model",
    "components",
    "count_bounds",
    "evaluate_allocation",
    "extract",
    "greedy",
    "is_maximise",
    "lowest_reachable_slo",
    "normalize_request",
    "objective_terms",
    "objective_unit",
    "plan_mix",
    "prune_dominated",
    "scaling_actions",
    "served_service_of",
    "solve",
    "solve_highs",
    "warm_start",
]

_EPS = 1e-9


# --------------------------------------------------------------------------------------------
# Request validation and problem building
# --------------------------------------------------------------------------------------------
def normalize_request(request: dict[str, Any]) -> dict[str, Any]:
    """A ``plan mix`` request validated (:meth:`MixRequest.from_dict`) in canonical form.

    Raises:
        InputError: naming the field and the fix.
    """
    return MixRequest.from_dict(request).to_dict()


def _budget_usage(resource: Resource, budgets: dict[str, float]) -> dict[str, float]:
    """How much of each budget one instance on ``resource`` uses.

    A kind budget (``cpu``) counts the kind's amount: cores for cpu, percent for mps,
    compute slices for mig, the numeric size or one unit otherwise. A label budget
    (``mig:1g.10gb``) counts instances of exactly that label.
    """
    usage = {}
    for key in budgets:
        if ":" in key:
            if key == resource.label:
                usage[key] = 1.0
        elif key == resource.kind:
            usage[key] = resource.amount  # the kind's budget unit (cores, slices, percent)
    return usage


def _percentile_latency(p: Profile, pct: str) -> float | None:
    """The profile's latency at ``pct``, else the nearest higher percentile recorded."""
    order = ["p50", "p95", "p99"]
    lat = p.latency_ms
    for key in order[order.index(pct) :]:
        if key in lat:
            return lat[key]
    return None


def _capacity_from_latency(
    p: Profile,
    *,
    slo_ms: float,
    q: float,
    path: Any = None,
    res: Resource | None = None,
    sizes: Mapping[int, Profile] | None = None,
) -> tuple[float, float, str]:
    """Capacity (rps) of one instance at the SLO derived from its latency profile.

    The evaluation core's queueing model: ``capacity_at_slo`` (one G/G/1 server, batch 1)
    or ``batch_capacity_at_slo`` (an executor batching dynamically, its service model built
    from the rows of every measured batch size up to ``p.batch``, ``sizes``:
    :func:`greenctl.planner.core.service.batch_service`). A served CPU instance's service is
    longer (:func:`served_service_of`); a GPU, MIG or MPS instance with executor CPU measured
    on its resource has its executor front in series (``evaluate.front_cpu_ms``): at most
    ``1000 / executor_cpu_ms`` req/s, and its wait counts in the latency.

    Returns:
        (capacity_rps, latency at quantile ``q`` in ms: the service's, or for a batching
        instance a lone request's (its wait for the batch to fill included), source)
    """
    from greenctl.planner.core.evaluate import front_cpu_ms
    from greenctl.planner.core.queueing import batch_capacity_at_slo, capacity_at_slo, dynamic_batch
    from greenctl.planner.core.service import batch_service

    service, stretch = served_service_of(path, res, p)
    source = f"queueing, served x{stretch:.2f}" if stretch > 1.0 else "queueing"
    front = front_cpu_ms(path, res.label) if res is not None else 0.0
    if p.batch > 1:
        rows = {n: r for n, r in (sizes or {}).items() if n <= p.batch}
        rows[p.batch] = p
        model = batch_service(rows, p.resource, p.batch).map(
            lambda n, _svc: served_service_of(path, res, rows[n])[0]
        )
        alone = dynamic_batch(0.0, model)
        lat = float(alone.latency.quantile(q)) if alone is not None else math.inf
        if lat > slo_ms:
            return 0.0, lat, source
        cap = batch_capacity_at_slo(model, slo_ms=slo_ms, percentile=q, front_ms=front)
        return max(float(cap), 0.0), lat, source
    lat = float(service.quantile(q))
    if lat > slo_ms:
        return 0.0, lat, source
    cap = capacity_at_slo(service, servers=1, slo_ms=slo_ms, percentile=q, front_ms=front)
    return max(float(cap), 0.0), lat, source


def served_service_of(path: Any, res: Resource | None, p: Profile) -> tuple[Any, float]:
    """The service time of a profile as served, and its mean over the profile's.

    On CPU with a serving path measured on a CPU core: the served run
    (``ServingPath.service_scale`` and ``tail_scale``, see ``evaluate.stretched_service``),
    then stretched by the executor's own CPU per request (``executor_cpu_ms``, which also
    lands on the request's own latency here: on the safe side by that much). On a GPU, MIG
    or MPS resource with a path measured on that same resource: the served run alone.
    Otherwise the profile's back-to-back service and 1.
    """
    from greenctl.planner.core.evaluate import ServingPath, path_serves, stretched_service
    from greenctl.planner.core.service import service_time

    hot = service_time(p)
    if not isinstance(path, ServingPath) or res is None or not path_serves(path, res.label):
        return hot, 1.0
    served = stretched_service(hot, path)
    demand = max(path.executor_cpu_ms, 0.0) if path.resource is None else 0.0
    if demand > 0 and served.mean_ms > 0:
        served = served.scaled((served.mean_ms + demand) / served.mean_ms)
    stretch = served.mean_ms / hot.mean_ms if hot.mean_ms > 0 else 1.0
    return served, max(stretch, 1.0)


def _energy(p: Profile) -> float | None:
    """A profile's own energy per request: the fallback when the evaluation core cannot
    price an option (:func:`price_energy`)."""
    if p.energy_j is not None:
        return float(p.energy_j)
    if p.power_w is not None and p.throughput_rps > 0:
        return float(p.power_w) / float(p.throughput_rps)
    return None


#: Relative change of a batching option's planned per-instance rate below which its energy
#: terms are not re-priced (:func:`plan_mix`).
ENERGY_RATE_TOL = 1e-6
#: Rounds of re-pricing batching options at the rates a plan gives them and solving again.
ENERGY_ROUNDS = 3


def operating_point(o: MixOption, rate_rps: float, headroom: float) -> float:
    """The per-instance rate (req/s) an option's energy is first priced at: its family's
    rate spread over the instances that would serve the family alone
    (``ceil(load / capacity)``), so a family served by one option is priced exactly."""
    if rate_rps <= 0:
        return max(o.capacity_rps / (1.0 + headroom), 1e-9)
    load = rate_rps * (1.0 + headroom)
    return rate_rps / max(1, math.ceil(load / o.capacity_rps - 1e-9))


def price_energy(
    o: MixOption, model: str, rate_rps: float, serving: Mapping[str, Any] | None
) -> str | None:
    """Set ``o``'s energy terms (``idle_power_w``, ``energy_j_per_request``) from the
    evaluation core (:func:`greenctl.planner.core.evaluate.energy_terms`) at ``rate_rps``
    per instance, with the serving path ``predict`` will use.

    Returns:
        None, or why the core could not price it (``o`` keeps its profile's own energy per
        request, with no idle power).
    """
    from greenctl.planner.core.evaluate import energy_terms

    if o.profile is None:
        return None
    rows = {(o.variant, o.resource, n): p for n, p in o.sizes.items() if n <= o.batch}
    rows[(o.variant, o.resource, o.batch)] = o.profile
    dep = Deployment(model=model, variant=o.variant, resource=o.resource, batch=o.batch)
    try:
        t = energy_terms(dep, rows, rate_rps=rate_rps, serving=serving or None)
    except InputError as exc:
        return f"{o.variant} on {o.resource} batch {o.batch}: {exc.message}"
    if t is None:
        o.energy_j_per_request, o.idle_power_w = None, 0.0
    else:
        o.energy_j_per_request, o.idle_power_w = t.dynamic_j_per_request, t.idle_w
    o.energy_rate_rps = rate_rps
    o.energy_linear = t is None or t.linear
    return None


def build_mix_problem(
    request: MixRequest | dict[str, Any],
    variants: Sequence[Variant],
    profiles: Sequence[Profile],
    *,
    serving: Mapping[str, Any] | None = None,
) -> MixProblem:
    """Build a :class:`MixProblem` from a request document, variants and profiles.

    Args:
        request: the typed request, or the plan's ``request`` dict (validated here).
        variants: the variants of (at least) the requested families.
        profiles: their latest profiles; several rows of one (variant, resource, batch)
            may differ in ``capacity_rps``/``capacity_slo_ms`` (load tests at several SLOs).
        serving: the measured serving path per variant or family (``"*"``: all), an
            ``evaluate.ServingPath`` or overhead samples in ms: options from latency profiles
            must meet the SLO less its percentile, and it is added to the predicted
            latencies of the finished plan.

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
    families = [
        _family(fam, req, by_family, profiles, serving, stage, all_sizes, notes)
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


def _dispatcher_stage(
    serving: Mapping[str, Any] | None,
    req: dict[str, Any],
    by_family: Mapping[str, Sequence[Variant]],
    notes: list[str],
) -> Any:
    """The dispatcher: one serial stage every family's requests cross
    (``evaluate.DispatcherStage``), None when not measured; a note says what it adds.

    Raises:
        InfeasiblePlan: the dispatcher cannot carry the requested load.
    """
    stage = _dispatcher(serving, {f["model"]: f["rate_rps"] for f in req["families"]}, by_family)
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
    serving: Mapping[str, Any] | None,
    stage: Any,
    all_sizes: dict[tuple[str, str], dict[int, Profile]],
    notes: list[str],
) -> MixFamily:
    """One requested family with its eligible options (dominated ones pruned); the sizes
    behind its batching options into ``all_sizes``, what the plan should say into ``notes``."""
    q = PERCENTILES[req["percentile"]]
    path_ms = _path_quantile((serving or {}).get(fam["model"]), q, stage)
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
        sizes.setdefault((vname, label, hw), {})[batch] = _size_row(rows, fam["slo_ms"])
        all_sizes.setdefault((vname, label), {})[batch] = sizes[(vname, label, hw)][batch]
    options, ineligible = [], []
    for (vname, label, batch, hw), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3] or "")
    ):
        own = (serving or {}).get(f"{vname}@{label}") or (serving or {}).get(vname)
        opt = _make_option(
            vname,
            parse_resource(label),
            batch,
            hw,
            rows,
            fam["slo_ms"],
            req["percentile"],
            q,
            path_ms=_path_quantile(own, q, stage) if own is not None else path_ms,
            path=own if own is not None else (serving or {}).get(fam["model"]),
            sizes=sizes[(vname, label, hw)],
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
    serving: Mapping[str, Any] | None,
    notes: list[str],
) -> None:
    """An option's budget usage, the smaller sizes behind it, and the energy the evaluation
    core will account for it (before pruning: dominance compares these terms)."""
    opt.usage = _budget_usage(parse_resource(opt.resource), req["budgets"])
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
    for key, rows_at in all_sizes.items():
        for o in (o for f in families for o in f.options if (o.variant, o.resource) == key):
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


def _resource_units(res: Resource) -> float:
    return res.amount


def _size_row(rows: list[Profile], slo_ms: float) -> Profile:
    """The row one (variant, resource, batch) stands with, as :func:`_make_option` picks it:
    its load test at the SLO, else its newest plain measurement."""
    from greenctl.planner.core.service import load_test_row

    row = load_test_row(rows, slo_ms)
    if row is not None and (row.capacity_rps or 0) > 0:
        return row
    plain = [p for p in rows if p.capacity_slo_ms is None] or rows
    return max(plain, key=lambda p: (p.created_at or "", p.id or 0))


def _make_option(
    vname: str,
    res: Resource,
    batch: int,
    hw: str | None,
    rows: list[Profile],
    slo_ms: float,
    pct: str,
    q: float,
    *,
    path_ms: float = 0.0,
    path: Any = None,
    sizes: Mapping[int, Profile] | None = None,
) -> MixOption | str:
    """The option for one (variant, resource, batch), or why it is not eligible.

    ``sizes``: the row chosen at every measured batch size of the (variant, resource), the
    service model of a batching option (:func:`_capacity_from_latency`).

    ``path_ms``: the serving path's latency at the percentile; an option derived from a
    latency profile must meet the SLO less that (load-tested capacities were measured
    through a real server and keep the whole SLO). ``path``: the serving path itself; on
    CPU its served run time and executor CPU lengthen the service (:func:`served_service_of`).
    """
    from greenctl.planner.core.service import load_test_row

    row = load_test_row(rows, slo_ms)  # the rule the simulator picks with, too
    plain = [p for p in rows if p.capacity_slo_ms is None] or rows
    base = max(plain, key=lambda p: (p.created_at or "", p.id or 0))
    cost, priced = hourly_cost(
        res.label, next((p.cost_per_hour for p in rows if p.cost_per_hour is not None), None)
    )
    energy = next((e for e in (_energy(p) for p in rows) if e is not None), None)
    if row is not None:
        cap = float(row.capacity_rps or 0.0)
        lat = _percentile_latency(row, pct)
        if cap <= 0:
            return f"load-tested capacity is 0 at {row.capacity_slo_ms:g} ms"
        return MixOption(
            variant=vname,
            resource=res.label,
            batch=batch,
            capacity_rps=cap,
            cost_per_hour=cost,
            energy_j_per_request=energy,
            latency_ms=lat,
            capacity_source=f"load-tested@{float(row.capacity_slo_ms or 0):g}ms",
            hardware=hw,
            profile=row,
            priced=priced,
        )
    if any(p.capacity_slo_ms is not None for p in rows) and all(
        p.capacity_slo_ms is not None for p in rows
    ):
        lowest = min(float(p.capacity_slo_ms or 0) for p in rows)
        base_lat = _percentile_latency(base, pct)
        if base_lat is None or base_lat > slo_ms:
            return f"load-tested only at SLOs >= {lowest:g} ms"
    budget = slo_ms - path_ms
    if budget <= 0:
        return f"the serving path alone takes {path_ms:.4g} ms at {pct}"
    cap, lat, source = _capacity_from_latency(
        base, slo_ms=budget, q=q, path=path, res=res, sizes=sizes
    )
    if lat > budget:
        if path_ms > 0:
            return f"{pct} latency {lat:.4g} ms plus the serving path's {path_ms:.3g} ms exceeds the SLO"
        return f"{pct} latency {lat:.4g} ms exceeds the SLO"
    if cap <= 0:
        return "no capacity within the SLO"
    return MixOption(
        variant=vname,
        resource=res.label,
        batch=batch,
        capacity_rps=cap,
        cost_per_hour=cost,
        energy_j_per_request=energy,
        latency_ms=lat,
        capacity_source=source,
        hardware=hw,
        profile=base,
        priced=priced,
    )


def _path_quantile(path: Any, q: float, stage: Any = None) -> float:
    """The ``q`` quantile (ms) of a serving path (evaluate.ServingPath or samples); 0 if none.
    With the plan's dispatcher stage, its wait at the plan's rate beyond what the path's
    samples hold (``evaluate.DispatcherStage.overhead_ms``)."""
    from greenctl.planner.core.evaluate import ServingPath

    samples = getattr(path, "overhead_ms", path)
    if stage is not None and isinstance(path, ServingPath):
        samples = stage.overhead_ms(path)
    if not samples:
        return 0.0
    import numpy as np

    return float(np.quantile(np.asarray(samples, dtype=float), q))


def lowest_reachable_slo(
    variants: Sequence[Variant],
    profiles: Sequence[Profile],
    family: str,
    pct: str,
    *,
    path_ms: float = 0.0,
) -> tuple[float, str] | None:
    """The lowest SLO any single instance of ``family`` meets, with the option that does
    (a latency-profile option plus the serving path's ``path_ms``)."""
    names = {v.name for v in variants if v.family == family}
    best: tuple[float, str] | None = None
    for p in profiles:
        if p.variant not in names:
            continue
        cands = []
        if p.capacity_slo_ms is not None and (p.capacity_rps or 0) > 0:
            cands.append(float(p.capacity_slo_ms))
        lat = _percentile_latency(p, pct)
        if lat is not None:
            cands.append(lat + path_ms)
        for c in cands:
            if best is None or c < best[0]:
                best = (c, f"{p.variant} on {p.resource} batch {p.batch}")
    return best


def prune_dominated(options: list[MixOption]) -> tuple[list[MixOption], int]:
    """Drop options that ``k`` instances of another option of the same variant dominate.

    With ``k = ceil(capacity_b / capacity_a)``, ``a`` dominates ``b`` when ``k`` instances of
    ``a`` cost no more than one of ``b``, use no more of any budget, and ``a`` spends no
    more energy per request (unknown only matches unknown). Replacing every instance of
    ``b`` by ``k`` of ``a`` keeps a plan feasible (same quota, no less capacity) and no worse
    under every objective (same variant: same accuracy and loading cost; ``k`` instances of
    ``a`` draw no more idle power than one of ``b``), so pruning keeps
    the optimum exact. ``k = 1`` is plain dominance; ``k > 1`` removes sizes that scale
    sublinearly (two ``cpu:1`` instances that beat one ``cpu:2``), which also leaves the
    solver the finest-grained options and so a tighter relaxation.
    """
    keep: list[MixOption] = []
    by_variant: dict[str, list[MixOption]] = {}
    for o in options:
        by_variant.setdefault(o.variant, []).append(o)
    pruned = 0
    for opts in by_variant.values():
        for i, b in enumerate(opts):
            dominated = False
            for j, a in enumerate(opts):
                if i == j:
                    continue
                if _dominates(a, b) and (not _dominates(b, a) or j < i):
                    dominated = True
                    break
            if dominated:
                pruned += 1
            else:
                keep.append(b)
    return keep, pruned


def _dominates(a: MixOption, b: MixOption) -> bool:
    if a.capacity_rps <= 0:
        return False
    k = max(1, math.ceil(b.capacity_rps / a.capacity_rps - 1e-9))
    if k * a.cost_per_hour > b.cost_per_hour + _EPS:
        return False
    ea, eb = a.energy_j_per_request, b.energy_j_per_request
    if (ea is None) != (eb is None):
        return False
    if ea is not None and eb is not None and ea > eb + _EPS:
        return False
    if ea is not None and k * a.idle_power_w > b.idle_power_w + _EPS:
        return False
    keys = set(a.usage) | set(b.usage)
    return all(k * a.usage.get(key, 0.0) <= b.usage.get(key, 0.0) + _EPS for key in keys)


#: Try the exact decomposition for multi-family problems first (see ``_solve_exact``).
DECOMPOSITION = True

_STATUS_RANK = {"optimal": 0, "time_limit": 1, "time_limit_no_solution": 2, "infeasible": 3}


def _solve_exact(
    problem: MixProblem,
    terms: Terms,
    *,
    single: bool,
    solver: str,
    time_limit_s: float | None,
) -> tuple[Allocation, dict[str, Any]]:
    """Solve every independent group of families exactly; merge the allocations.

    Several families go to the exact Lagrangian decomposition of
    :mod:`greenctl.planner.mix.decomp` first; the joint ILP runs when it does not apply or
    gives up (``DECOMPOSITION = False`` forces the joint ILP), warm-started with its best
    plan, reports the tighter of its own bound and the decomposition's, and says why the
    decomposition gave up (``decomposition_fallback``).
    """
    fallback: mix_decomp.Fallback | None = None
    if DECOMPOSITION and mix_decomp.applicable(problem, single=single, solver=solver):
        t0 = time.perf_counter()
        out = mix_decomp.solve_decomposed(problem, terms, time_limit_s=time_limit_s)
        if not isinstance(out, mix_decomp.Fallback):
            return out
        fallback = out
        if time_limit_s is not None:
            time_limit_s = max(time_limit_s - (time.perf_counter() - t0), 0.1)
    # the decomposition's best plan (if any) starts the joint ILP instead of the greedy one
    start_alloc = fallback.incumbent if fallback is not None else None
    lagrangian = fallback.bound if fallback is not None else None
    # One joint model: HiGHS handles independent families inside one tree faster than
    # one tree per family (measured: 100 families without budgets, 0.14 s joint vs 5 s
    # separately for the accuracy objective), so groups are only reported.
    groups = [list(range(len(problem.families)))]
    alloc: Allocation = {}
    infos = []
    for group in groups:
        part, info = _solve_group(
            problem,
            terms,
            group,
            single=single,
            solver=solver,
            time_limit_s=time_limit_s,
            start_alloc=start_alloc,
        )
        infos.append(info)
        if not part:
            info["groups"] = len(groups)
            return {}, info
        alloc.update(part)
    worst = max(infos, key=lambda i: _STATUS_RANK.get(i["status"], 9))
    gaps = [i["gap"] for i in infos if i.get("gap") is not None]
    merged: dict[str, Any] = {
        "name": solver,
        "status": worst["status"],
        "gap": max(gaps) if gaps else (0.0 if worst["status"] == "optimal" else None),
        "solve_s": round(sum(i["solve_s"] for i in infos), 4),
        "build_s": round(sum(i["build_s"] for i in infos), 4),
        "columns": sum(i["columns"] for i in infos),
        "rows": sum(i["rows"] for i in infos),
        "integer_columns": sum(i["integer_columns"] for i in infos),
        "independent_groups": len(components(problem)),
        "mip_rel_gap_tolerance": MIP_REL_GAP,
        "method": "joint ILP",
    }
    if fallback is not None:
        merged["decomposition_fallback"] = fallback.reason
    if len(infos) == 1 and "objective_bound" in infos[0]:
        merged["objective_bound"] = infos[0]["objective_bound"]
    merged["warm_start"] = infos[0].get("warm_start")
    if lagrangian is not None and alloc and merged["status"] != "optimal":
        # the decomposition's Lagrangian bound holds for the whole problem: report the
        # tighter of the two proven bounds and the gap to it
        maximise = is_maximise(problem.objective)
        value = evaluate_allocation(problem, alloc, terms)["objective"]
        lbound = -lagrangian if maximise else lagrangian
        own = merged.get("objective_bound")
        tighter = own is None or (lbound < own if maximise else lbound > own)
        if tighter:
            merged["objective_bound"] = lbound
            merged["bound_source"] = "decomposition's Lagrangian bound"
            diff = (lbound - value) if maximise else (value - lbound)
            merged["gap"] = max(diff, 0.0) / max(abs(value), 1e-12)
    if any("tie_break" in i for i in infos):
        merged["tie_break"] = infos[0].get("tie_break")
    return alloc, merged


def _solve_group(
    problem: MixProblem,
    terms: Terms,
    group: list[int],
    *,
    single: bool,
    solver: str,
    time_limit_s: float | None,
    start_alloc: Allocation | None = None,
) -> tuple[Allocation, dict[str, Any]]:
    model, lay = build_model(problem, terms, single=single, subset=group)
    # In units of the objective's size: carbon per request (~1e-5 g) met HiGHS's absolute
    # MIP gap (1e-9) at 1e-4 relative and stopped "optimal" with a gap of up to 1%.
    unit = objective_unit(problem, model, lay, group)
    if 1e-2 <= unit <= 1e2:  # O(1) already; rescaling it changes HiGHS's search for nothing
        unit = 1.0
    model.cost = [c / unit for c in model.cost]
    start = None if single else warm_start(problem, terms, lay, len(model.cost), start_alloc)
    res = solve(model, solver=solver, time_limit_s=time_limit_s, start=start)
    info: dict[str, Any] = {
        "name": solver,
        "status": res.status,
        "gap": res.gap,
        "solve_s": round(res.seconds, 4),
        "build_s": round(res.build_seconds, 4),
        "columns": len(model.cost),
        "rows": len(model.rows),
        "integer_columns": sum(model.integer),
        "warm_start": (
            None if start is None else "greedy" if start_alloc is None else "decomposition"
        ),
    }
    if res.bound is not None and math.isfinite(res.bound):
        # the proven bound on the objective, in the objective's own sense
        bound = res.bound * unit
        info["objective_bound"] = -bound if is_maximise(problem.objective) else bound
    if res.x is None:
        return {}, info
    alloc = extract(problem, lay, res.x)
    # Tie-break without giving up the primary optimum: accuracy/carbon plans minimise cost
    # among optimal plans, cost plans maximise accuracy among cheapest plans.
    if res.status == "optimal" and problem.objective in ("accuracy", "carbon", "cost"):
        primary = res.objective or 0.0
        # relative to the optimum, and the row scaled to it: carbon per request is ~1e-5
        # g, where an absolute 1e-7 (or HiGHS's absolute row tolerance) let the tie-break
        # give up 20% of the optimum
        unit = abs(primary) if abs(primary) > 1e-300 else 1.0
        tol = TIE_BREAK_REL_TOL * unit
        secondary = "accuracy" if problem.objective == "cost" else "cost"
        m2, lay2 = build_model(problem, terms, single=single, objective=secondary, subset=group)
        idx = [i for i, c in enumerate(model.cost) if c != 0]
        m2.row(idx, [model.cost[i] / unit for i in idx], -math.inf, (primary + tol) / unit)
        # The tie-break never costs more than the primary solve took (at least 1 s).
        left = max(1.0, 2.0 * res.seconds)
        if time_limit_s is not None:
            left = min(left, max(time_limit_s - res.seconds, 0.1))
        # the primary plan starts it (without one HiGHS may find none in the time left)
        start2 = warm_start(problem, terms, lay2, len(m2.cost), alloc)
        res2 = solve(m2, solver=solver, time_limit_s=left, start=start2)
        info["tie_break"] = {"objective": secondary, "status": res2.status}
        info["solve_s"] = round(res.seconds + res2.seconds, 4)
        if res2.x is not None and res2.status in ("optimal", "time_limit"):
            alloc = extract(problem, lay2, res2.x)
    return alloc, info


# --------------------------------------------------------------------------------------------
# Infeasibility diagnosis
# --------------------------------------------------------------------------------------------
def _max_servable_scale(problem: MixProblem, solver: str) -> float:
    """Largest t such that every family's load x t fits the budgets (no accuracy floor)."""
    m = Model()
    inf = math.inf
    tcol = m.col(-1.0, 0.0, inf)
    budget_rows: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in problem.budgets}
    for fam in problem.families:
        load = fam.load_rps(problem.headroom)
        qcols = []
        for o in fam.options:
            ub = math.inf
            for k, a in o.usage.items():
                if a > 0:
                    ub = min(ub, math.floor(problem.budgets[k] / a + 1e-9))
            nc = m.col(0.0, 0.0, ub, True)
            qc = m.col(0.0, 0.0, inf)
            m.row([qc, nc], [1.0, -o.capacity_rps], -inf, 0.0)
            qcols.append(qc)
            for k, a in o.usage.items():
                budget_rows[k][0].append(nc)
                budget_rows[k][1].append(a)
        m.row([*qcols, tcol], [*([1.0] * len(qcols)), -load], 0.0, 0.0)
    for k, (idx, coef) in budget_rows.items():
        if idx:
            m.row(idx, coef, -inf, problem.budgets[k])
    m.ub[tcol] = 1e6
    res = solve(m, solver="highs" if solver == "highs" else solver, time_limit_s=10.0)
    if res.x is None:
        return 0.0
    return float(res.x[tcol])


def _diagnose(problem: MixProblem, solver: str, terms: Terms) -> InfeasiblePlan:
    """Name the binding constraint and the closest feasible alternative."""
    pct = problem.percentile
    for fam in problem.families:
        if not fam.options:
            why = "; ".join(fam.ineligible[:4]) if fam.ineligible else "no profiles"
            hint = "profile a faster resource or relax --slo-ms"
            if fam.lowest_slo is not None:
                hint = (
                    f"lowest reachable SLO: {fam.lowest_slo[0]:.4g} ms ({fam.lowest_slo[1]}); "
                    "relax --slo-ms or profile a faster resource"
                )
            return InfeasiblePlan(
                f"no variant of '{fam.name}' meets the SLO of {fam.slo_ms:g} ms at {pct} on any "
                f"profiled resource ({why})",
                hint=hint,
            )
    for fam in problem.families:
        if fam.min_accuracy is not None:
            top = max(fam.variants[o.variant].accuracy for o in fam.options)
            if top < fam.min_accuracy - 1e-12:
                return InfeasiblePlan(
                    f"accuracy floor unreachable for '{fam.name}': --min-accuracy "
                    f"{fam.min_accuracy:g} is above every variant that meets the SLO",
                    hint=f"highest reachable accuracy: {top:.5g}",
                )
    scale = _max_servable_scale(problem, solver)
    if scale < 1.0 - 1e-9:
        rates = ", ".join(f"{f.name} {f.rate_rps * scale:.4g} req/s" for f in problem.families)
        budgets = ", ".join(f"{k}={v:g}" for k, v in problem.budgets.items())
        err = InfeasiblePlan(
            f"budget too small for the rate: {budgets} serves at most {scale:.4g} x the "
            f"requested load at {pct} within the SLO",
            hint=f"largest servable rate: {rates} (headroom {problem.headroom:g} included); "
            "raise --budget or lower --rate",
        )
        err.servable_scale = scale
        return err
    if all(f.min_accuracy is None for f in problem.families):
        return InfeasiblePlan(
            "no feasible plan within the budgets at this rate",
            hint="raise --budget or lower --rate",
        )
    # the load fits; the floor does not: the best accuracy under the budgets
    relaxed = _copy_problem(problem, objective="accuracy", min_accuracy=None)
    rterms = objective_terms(relaxed)
    alloc, info = _solve_exact(relaxed, rterms, single=False, solver=solver, time_limit_s=10.0)
    if alloc:
        accs = []
        for fi, fam in enumerate(relaxed.families):
            load = fam.load_rps(relaxed.headroom) or 1.0
            acc = sum(
                fam.variants[fam.options[oi].variant].accuracy * qq
                for oi, (_, qq) in alloc[fi].items()
            )
            accs.append(f"{fam.name} {acc / load:.5g}")
        return InfeasiblePlan(
            "accuracy floor unreachable within the budgets at this rate",
            hint=f"highest reachable accuracy: {', '.join(accs)}",
        )
    return InfeasiblePlan(f"no feasible plan (solver status {info.get('status')})")


def _copy_problem(problem: MixProblem, **changes: Any) -> MixProblem:
    import copy

    p = copy.copy(problem)
    p.families = [copy.copy(f) for f in problem.families]
    if "objective" in changes:
        p.objective = changes["objective"]
    if "min_accuracy" in changes:
        for f in p.families:
            f.min_accuracy = changes["min_accuracy"]
    return p


# --------------------------------------------------------------------------------------------
# Actions against the current deployment
# --------------------------------------------------------------------------------------------
def scaling_actions(problem: MixProblem, deployments: Sequence[Deployment]) -> list[dict[str, Any]]:
    """Per variant, what changes from ``problem.current`` to ``deployments`` (INFaaS terms).

    ``keep`` (same instances), ``replicate`` (same variant, more instances, same sizes),
    ``upgrade`` (same variant on larger per-instance resources, or a new variant more
    accurate than the ones it replaces), ``downgrade`` (fewer or smaller instances, or a new
    variant less accurate than the ones it replaces), ``start`` (new variant replacing
    nothing), ``stop`` (variant no longer deployed).
    """
    acc = {name: v.accuracy for f in problem.families for name, v in f.variants.items()}
    fam_of = {name: f.name for f in problem.families for name in f.variants}

    def summary(ds: Iterable[Deployment]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for d in ds:
            key = f"{d.resource}/b{d.batch}"
            out.setdefault(d.variant, {})
            out[d.variant][key] = out[d.variant].get(key, 0) + d.count
        return out

    before = summary(problem.current)
    after = summary(deployments)
    actions: list[dict[str, Any]] = []
    stopped_by_family: dict[str, list[str]] = {}
    for v in before:
        if v not in after:
            stopped_by_family.setdefault(fam_of.get(v, ""), []).append(v)

    def units(sizes: dict[str, int]) -> float:
        total = 0.0
        for key, count in sizes.items():
            total += _resource_units(parse_resource(key.split("/b")[0])) * count
        return total

    for v in sorted(set(before) | set(after)):
        b, a = before.get(v, {}), after.get(v, {})
        fam = fam_of.get(v, "")
        entry: dict[str, Any] = {
            "model": fam,
            "variant": v,
            "before": b,
            "after": a,
            "count_before": sum(b.values()),
            "count_after": sum(a.values()),
        }
        if not a:
            entry["action"] = "stop"
        elif not b:
            stopped = stopped_by_family.get(fam, [])
            if not stopped:
                entry["action"] = "start"
            else:
                ref = max(acc.get(s, 0.0) for s in stopped)
                entry["action"] = "upgrade" if acc.get(v, 0.0) >= ref else "downgrade"
                entry["replaces"] = stopped
        elif a == b:
            entry["action"] = "keep"
        elif set(a) == set(b):
            entry["action"] = "replicate" if sum(a.values()) > sum(b.values()) else "downgrade"
        else:
            entry["action"] = (
                "upgrade"
                if units(a) / max(sum(a.values()), 1) > units(b) / max(sum(b.values()), 1)
                else ("replicate" if sum(a.values()) > sum(b.values()) else "downgrade")
            )
        actions.append(entry)
    return actions


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------
def plan_mix(
    problem: MixProblem,
    *,
    strategy: str = "ilp",
    solver: str = "highs",
    time_limit_s: float | None = None,
) -> Plan:
    """Plan deployments and quotas for ``problem``.

    Args:
        problem: from :func:`build_mix_problem`.
        strategy: ``ilp`` (exact), ``greedy`` (INFaaS replicate-or-upgrade) or ``single``
            (the best plan that serves each family with one variant; exact).
        solver: ``highs`` (default) or ``cbc``.
        time_limit_s: stop the solver after this long and return the best plan found with
            its proven gap (``plan.extra["solver"]["status"] == "time_limit"``).

    Returns:
        A ``kind="mix"`` plan; ``extra["solver"]`` has status, gap and solve time,
        ``extra["actions"]`` the scaling actions when ``problem.current`` is set.

    Raises:
        InputError: unknown strategy or solver, or ``cbc`` without CBC installed.
        InfeasiblePlan: naming the binding constraint and the closest feasible alternative.
        GreenctlError: the solver failed (exit 1; see :mod:`greenctl.planner.core.solvers`).
    """
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r}", hint="use ilp, greedy or single")
    if solver not in SOLVERS:
        raise InputError(f"unknown solver {solver!r}", hint="use highs or cbc")
    if solver == "cbc" and strategy != "greedy":
        solvers.require_cbc()  # before any work: exit 2 with the install hint
    t0 = time.perf_counter()
    terms = objective_terms(problem)
    if any(not f.options for f in problem.families):
        raise _diagnose(problem, solver, terms)
    alloc, info = _solve_once(problem, terms, strategy, solver, time_limit_s)
    # Batching options are priced at one rate per instance (their energy per request falls
    # as their batches fill): re-price those the plan uses at the rates it gives them and
    # solve again, until the plan prices every instance at its own rate (then the energy
    # and carbon the solver minimised are the ones the evaluation core reports).
    rounds = 0
    seen = {_alloc_key(alloc)}
    while rounds < ENERGY_ROUNDS and _reprice(problem, alloc):
        rounds += 1
        terms = objective_terms(problem)
        left = None
        if time_limit_s is not None:
            left = max(time_limit_s - (time.perf_counter() - t0), 0.1)
        try:
            alloc, info = _solve_once(problem, terms, strategy, solver, left)
        except InfeasiblePlan:  # e.g. out of time: keep the plan, now priced at its rates
            break
        if _alloc_key(alloc) in seen:
            break
        seen.add(_alloc_key(alloc))
    if rounds:
        info["energy_rounds"] = rounds
    info["total_s"] = round(time.perf_counter() - t0, 4)
    if strategy == "single":
        # "optimal" is within the baseline's restriction, not over all plans
        info["scope"] = "one variant per family (the Model-Switching / VPA baseline)"
    if problem.objective == "balanced" and problem.gamma > 0 and not terms.use_cc:
        problem.notes.append(
            "CC (carbon) term dropped from the balanced objective: some profiles have no "
            "energy_j or power_w"
        )
    return _to_plan(problem, alloc, terms, strategy=strategy, solver_info=info)


def _alloc_key(alloc: Allocation) -> tuple[tuple[int, int, int], ...]:
    return tuple(sorted((fi, oi, n) for fi, opts in alloc.items() for oi, (n, _) in opts.items()))


def _reprice(problem: MixProblem, alloc: Allocation) -> bool:
    """Re-price the energy of every option ``alloc`` uses whose terms hold at one rate only
    (batching) at the per-instance rate ``alloc`` gives it; True when any moved."""
    moved = False
    for fi, opts in alloc.items():
        fam = problem.families[fi]
        load = fam.load_rps(problem.headroom)
        for oi, (n, qq) in opts.items():
            o = fam.options[oi]
            if n <= 0 or qq <= 0 or o.energy_linear or o.energy_rate_rps is None or load <= 0:
                continue
            rate = fam.rate_rps * qq / load / n  # what predict's quota split gives each
            if abs(rate - o.energy_rate_rps) <= ENERGY_RATE_TOL * rate:
                continue
            if price_energy(o, fam.name, rate, problem.serving) is None:
                moved = True
    return moved


def _solve_once(
    problem: MixProblem,
    terms: Terms,
    strategy: str,
    solver: str,
    time_limit_s: float | None,
) -> tuple[Allocation, dict[str, Any]]:
    """One solve of ``problem`` with ``terms`` by ``strategy``; raises InfeasiblePlan."""
    if strategy == "greedy":
        alloc = greedy(problem, terms)
        info: dict[str, Any] = {"name": "greedy", "status": "heuristic", "gap": None}
    else:
        alloc, info = _solve_exact(
            problem, terms, single=strategy == "single", solver=solver, time_limit_s=time_limit_s
        )
        if not alloc:
            if info["status"] == "time_limit_no_solution":
                raise InfeasiblePlan(
                    f"no plan found within the time limit of {time_limit_s:g} s",
                    hint="raise --time-limit",
                )
            if strategy == "single":
                mixed, _ = _solve_exact(
                    problem, terms, single=False, solver=solver, time_limit_s=10.0
                )
                if mixed:
                    raise InfeasiblePlan(
                        "no single variant can serve the load alone within the budgets"
                        + (
                            " and the accuracy floor"
                            if any(f.min_accuracy is not None for f in problem.families)
                            else ""
                        ),
                        hint="try --strategy ilp, which mixes variants",
                    )
            raise _diagnose(problem, solver, terms)
    return alloc, info


def _to_plan(
    problem: MixProblem,
    alloc: Allocation,
    terms: Terms,
    *,
    strategy: str,
    solver_info: dict[str, Any],
) -> Plan:
    metrics = evaluate_allocation(problem, alloc, terms)
    deployments = []
    for fi, fam in enumerate(problem.families):
        for oi in sorted(alloc.get(fi, {}), key=lambda i: fam.options[i].key[:3]):
            n, qq = alloc[fi][oi]
            if n <= 0:
                continue
            o = fam.options[oi]
            deployments.append(
                Deployment(
                    model=fam.name,
                    variant=o.variant,
                    resource=o.resource,
                    count=int(n),
                    batch=o.batch,
                    quota_rps=round(qq, 6),
                )
            )
    total_rate = sum(f.rate_rps for f in problem.families)
    lat_key = f"{problem.percentile}_ms"
    predicted: dict[str, Any] = {
        "rate_rps": total_rate,
        "accuracy": round(metrics["accuracy"], 6),
        "cost_per_hour": round(metrics["cost_per_hour"], 6),
        lat_key: metrics["latency_ms"],
        "energy_j_per_request": metrics["energy_j_per_request"],
        "carbon_g_per_request": metrics["carbon_g_per_request"],
        "carbon_intensity_g_per_kwh": problem.intensity,
        "objective": metrics["objective"],
        "objective_name": problem.objective,
        "terms": metrics["terms"],
        "method": "modeled: per-instance capacity at the SLO; latency is the slowest "
        "deployment's profiled latency at its capacity point; energy as the evaluation core "
        "accounts it (idle power per instance, busy energy above idle per request)",
    }
    extra = _plan_extra(problem, alloc, terms, strategy=strategy, solver_info=solver_info)
    if problem.notes:
        extra["notes"] = list(dict.fromkeys(problem.notes))
    if problem.current:
        extra["actions"] = scaling_actions(problem, deployments)
    try:
        predicted = _predict_with_core(
            problem, deployments, predicted, problem.profiles, problem.variant_records
        )
    except (InputError, ValueError) as exc:  # keep the planner's own figures
        problem.notes.append(f"evaluation core could not predict this plan: {exc}")
        extra["notes"] = list(dict.fromkeys(problem.notes))
    request = dict(problem.request)
    request["strategy"] = strategy
    request["solver"] = solver_info.get("name") if strategy != "greedy" else request.get("solver")
    return Plan(
        kind="mix", request=request, deployments=deployments, predicted=predicted, extra=extra
    )


def _plan_extra(
    problem: MixProblem,
    alloc: Allocation,
    terms: Terms,
    *,
    strategy: str,
    solver_info: dict[str, Any],
) -> dict[str, Any]:
    """What a mix plan says beside its deployments: the strategy and solver, each budget's
    use, each family's accuracy and capacity, each chosen option's capacity per instance and
    the reference plans the balanced objective is measured against."""
    usage: dict[str, float] = {k: 0.0 for k in problem.budgets}
    for fi, fam in enumerate(problem.families):
        for oi, (n, _) in alloc.get(fi, {}).items():
            for k, a in fam.options[oi].usage.items():
                usage[k] += a * n
    families_out = []
    for fi, fam in enumerate(problem.families):
        load = fam.load_rps(problem.headroom) or 1.0
        fa = alloc.get(fi, {})
        families_out.append(
            {
                "model": fam.name,
                "rate_rps": fam.rate_rps,
                "slo_ms": fam.slo_ms,
                "accuracy": sum(
                    fam.variants[fam.options[oi].variant].accuracy * qq
                    for oi, (_, qq) in fa.items()
                )
                / load,
                "capacity_rps": sum(fam.options[oi].capacity_rps * n for oi, (n, _) in fa.items()),
                "options": len(fam.options),
                "pruned_dominated": fam.pruned,
                "ineligible": len(fam.ineligible),
            }
        )
    return {
        "strategy": strategy,
        "solver": solver_info,
        "budget_use": {
            k: {"used": usage[k], "budget": problem.budgets[k]} for k in problem.budgets
        },
        "families": families_out,
        "capacity": [
            {
                "model": fam.name,
                "variant": fam.options[oi].variant,
                "resource": fam.options[oi].resource,
                "batch": fam.options[oi].batch,
                "capacity_rps_per_instance": fam.options[oi].capacity_rps,
                "source": fam.options[oi].capacity_source,
            }
            for fi, fam in enumerate(problem.families)
            for oi in sorted(alloc.get(fi, {}))
            if alloc[fi][oi][0] > 0
        ],
        "reference_single_plans": terms.ref,
    }


def _predict_with_core(
    problem: MixProblem,
    deployments: list[Deployment],
    predicted: dict[str, Any],
    profiles: dict[tuple[str, str, int], Profile] | None,
    variants: dict[str, Variant] | None,
) -> dict[str, Any]:
    """Refine the predicted block with the evaluation core's analytic ``predict`` (wrr).

    Needs the profiles behind the options (kept by :func:`build_mix_problem`). The solver
    priced energy by the core's rule (:func:`price_energy`), so the core's energy and carbon
    are the ones it minimised: exactly for instances serving one request at a time, and for
    batching ones priced at the rate the plan gives them (what :func:`plan_mix` re-prices
    towards). Where they still differ by more than 1e-6 (relative), the solver's own figure
    stays as ``solver_energy_j_per_request``.
    """
    if not profiles or not variants or not deployments:
        return predicted
    # Load-tested options too: their service model reproduces the load test
    # (greenctl.planner.core.service), so the analytic figures agree with the capacity sized.
    from greenctl.planner.core.evaluate import predict
    from greenctl.planner.core.policy import default_policy

    rates = {f.name: f.rate_rps for f in problem.families}
    keys = {(d.variant, d.resource, d.batch) for d in deployments}
    if not keys <= set(profiles):
        return predicted
    pairs = {(v, r) for v, r, _ in keys}  # every batch size: batching instances' models
    policy = default_policy("mix", (d.batch for d in deployments))  # what apply serves
    out = predict(
        deployments,
        {k: p for k, p in profiles.items() if (k[0], k[1]) in pairs},
        variants,
        rate_rps=rates,
        policy=policy,
        # each family's requests against its own SLO (a variant belongs to one family)
        percentile_slo_ms={v: f.slo_ms for f in problem.families for v in f.variants},
        carbon_g_per_kwh=problem.intensity,
        pue=problem.pue,
        serving=problem.serving or None,
    )
    merged = dict(predicted)
    mine, core = predicted.get("energy_j_per_request"), out.get("energy_j_per_request")
    if mine is not None and core is not None and abs(mine - core) > 1e-6 * abs(core):
        merged["solver_energy_j_per_request"] = mine
    for key in (
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "slo_violation_frac",
        "served_rps",
        "energy_j_per_request",
        "carbon_g_per_request",
        "power_w",
        "overloaded",
    ):
        if key in out:
            merged[key] = out[key]
    merged["method"] = (
        "modeled: latency, energy and carbon from the evaluation core's analytic predict "
        f"({policy} over quotas); accuracy, cost and objective from the planner, whose "
        "energy and carbon terms are the core's (idle power per instance, busy energy above "
        "idle per request served)"
    )
    if "solver_energy_j_per_request" in merged:
        merged["method"] += (
            "; solver_energy_j_per_request: the energy per request in the objective, where "
            "it differs from the core's (a batching deployment priced at another rate per "
            "instance than it gets, after the re-pricing rounds)"
        )
    from greenctl.planner.core.evaluate import LATENCY_MODEL_ONLY, LATENCY_WITH_PATH

    merged["latency_includes"] = LATENCY_WITH_PATH if problem.serving else LATENCY_MODEL_ONLY
    unmeasured = [
        d
        for d in deployments
        if not kind_of(d.resource).pins_cores
        and f"{d.variant}@{d.resource}" not in (problem.serving or {})
    ]
    if unmeasured:
        # `profile serving` measures served runs on a CPU core only. On the H100 host resnet50
        # served at batch 8 ran 5.2-9.4 ms per batch against 3.6 ms profiled, and a plan
        # predicted at 15.6 ms p95 measured 67-98 ms: say so beside the figure.
        merged["latency_includes"] += (
            "; GPU, MIG and MPS instances at their profiled run time (served runs there are "
            "not measured and can be several times slower: measure them with `greenctl "
            "profile serving --resource RESOURCE --batch B`, or check with `apply --verify`)"
        )
    merged["latency_includes"] += _front_note(problem, deployments)
    if problem.serving:
        from greenctl.planner.core.evaluate import dispatcher_note

        rates = {f.name: f.rate_rps for f in problem.families}
        variants = {f.name: list(f.variants) for f in problem.families}
        merged["latency_includes"] += dispatcher_note(_dispatcher(problem.serving, rates, variants))
    return merged


def _dispatcher(serving: Any, rates: Mapping[str, float], variants: Mapping[str, Any]) -> Any:
    """The plan's dispatcher stage (``evaluate.planned_dispatcher``); ``variants``: each
    family's variants (records or names)."""
    from greenctl.planner.core.evaluate import planned_dispatcher

    names = {m: [getattr(v, "name", v) for v in vs] for m, vs in variants.items()}
    return planned_dispatcher(serving, rates, names)


def _front_note(problem: MixProblem, deployments: Sequence[Deployment]) -> str:
    """What ``latency_includes`` says of the executor fronts of the plan's GPU, MIG and MPS
    instances whose serving path was measured on their resource (``evaluate.front_cpu_ms``)."""
    from greenctl.planner.core.evaluate import front_cpu_ms, serving_path

    served = problem.serving or {}
    with_front, without = [], []
    for d in deployments:
        key = f"{d.variant}@{d.resource}"
        if not kind_of(d.resource).accelerator or key not in served:
            continue
        front = front_cpu_ms(serving_path(served, d.model, d.variant, d.resource), d.resource)
        if front > 0:
            with_front.append(
                f"{key}: {front:.2g} ms of CPU per request, at most {1000 / front:,.0f} req/s"
            )
        else:
            without.append(key)
    note = ""
    if with_front:
        note += (
            "; the executor front of GPU, MIG and MPS instances, a serial stage on one core "
            "before the device (" + ", ".join(dict.fromkeys(with_front)) + ")"
        )
    if without:
        note += (
            "; no executor CPU measured for "
            + ", ".join(dict.fromkeys(without))
            + ": its executor front is not modeled (the device alone); measure it with "
            "`greenctl profile serving --resource RESOURCE`"
        )
    return note
