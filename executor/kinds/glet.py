"""The ``glet`` kind (gpulet): models with rates and SLOs packed into GPU partitions that
share a GPU in turn, planned by :mod:`greenctl.planner.glet`; it minimises GPUs, so its
replans follow the load, not the carbon signal."""

from __future__ import annotations

import math
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import (
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    base_request,
    finite_number,
    forecast_rates,
)

_GLET_HINT = (
    "a glet request holds models (name, rate_rps, slo_ms[, variant]), as `plan glet` writes"
)


def _option(request: dict[str, Any], key: str, default: Any, kind: type) -> Any:
    """``request[key]`` as a ``kind`` (int: a whole number), ``default`` when absent.

    Raises:
        InputError: a value of another type.
    """
    value = request.get(key)
    if value is None:
        return default
    whole = isinstance(value, int) and not isinstance(value, bool)
    if not (whole if kind is int else finite_number(value) is not None):
        what = "a whole number" if kind is int else "a number"
        raise InputError(f"request.{key} is {value!r}, not {what}", hint=_GLET_HINT)
    return kind(value)


def _glet_models(request: dict[str, Any]) -> list[Any]:
    """The request's models as the planner's :class:`GletModel` (variants not resolved)."""
    from greenctl.planner.glet.solve import GletModel

    models = request.get("models")
    if not isinstance(models, list) or not models:
        raise InputError("the glet request has no models", hint=_GLET_HINT)
    out = []
    for n, m in enumerate(models):
        where = f"request.models[{n}]"
        if not isinstance(m, dict) or not isinstance(m.get("name"), str) or not m["name"]:
            raise InputError(f"{where} needs a name", hint=_GLET_HINT)
        rate, slo = finite_number(m.get("rate_rps")), finite_number(m.get("slo_ms"))
        if rate is None or slo is None:
            raise InputError(f"{where} needs numbers rate_rps and slo_ms", hint=_GLET_HINT)
        variant = m.get("variant")
        if variant is not None and not isinstance(variant, str):
            raise InputError(f"{where}.variant must be a variant name", hint=_GLET_HINT)
        out.append(GletModel(m["name"], rate, slo, variant or None))
    return out


def _glet_interference(store: Any, want: Any) -> tuple[Any, dict[Any, Any], list[str]]:
    """(interference model or None, utilisation, notes) for the request's ``interference``:
    absent or ``"newest"`` the store's newest (none: planned without, with a note), an id
    that stored model, a plan's record of one (``id`` and ``coefficients``) that model, None
    or False none."""
    from greenctl.data.gpulet_import import get_interference_model, load_utilisation
    from greenctl.planner.core.interference import InterferenceModel

    if want is None or want is False:
        return None, {}, []
    if isinstance(want, dict) and want.get("coefficients") is not None:
        return InterferenceModel.from_dict(want), load_utilisation(store), []
    if isinstance(want, dict):
        want = want.get("id")
    model_id = None if want in ("newest", True, None) else want
    if model_id is not None and (isinstance(model_id, bool) or not isinstance(model_id, int)):
        raise InputError(
            f"request.interference is {model_id!r}, not an interference model id",
            hint='an id from `greenctl interference fit`, "newest" or null',
        )
    try:
        imodel = InterferenceModel.from_dict(get_interference_model(store, model_id))
        return imodel, load_utilisation(store), []
    except InputError:
        if model_id is not None:
            raise
    note = (
        "no interference model in the store (run `greenctl interference fit`); "
        "planned without interference"
    )
    return None, {}, [note]


def _glet_plan(store: Any, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    """Plan ``request`` (a glet plan's ``request``, or what ``plan glet`` parsed): models
    with rate and SLO, ``partitions``, ``max_gpus`` (8), ``rate_percentile`` (99),
    ``algorithm`` (glet), ``interference`` (see :func:`_glet_interference`), ``hardware``,
    ``simulate_s`` (0) and ``seed`` (0) of the schedule's check, ``spec`` (recorded),
    ``rate_headroom`` (0; what a replan packs with: ``replan_headroom``, default
    :data:`GLET_REPLAN_HEADROOM`) and ``gpu_memory_mb`` (see :func:`_glet_memory`: the
    executors on one GPU must fit its memory). With ``current`` (a running glet plan) the new
    GPUs are numbered after the running ones, so the glets that stay keep running where they
    are; a replan whose headroom finds no room within ``max_gpus`` is planned at the rates."""
    from dataclasses import replace

    from greenctl.data.errors import InfeasiblePlan
    from greenctl.data.glet_spec import parse_partitions
    from greenctl.data.gpulet_import import load_latency_table, resolve_variant
    from greenctl.planner.glet.solve import DEFAULT_PARTITIONS, GletModel, GletProblem, plan_glet

    models = _glet_models(request)
    parts = request.get("partitions")
    if parts is not None and not isinstance(parts, list):
        raise InputError("request.partitions must be a list", hint=_GLET_HINT)
    partitions = (
        list(DEFAULT_PARTITIONS)
        if parts is None
        else parse_partitions(parts, where="request.partitions")
    )
    hardware, algorithm = request.get("hardware"), request.get("algorithm") or "glet"
    if not isinstance(hardware, str | None) or not isinstance(algorithm, str):
        raise InputError("request.hardware and request.algorithm must be names", hint=_GLET_HINT)
    max_gpus = _option(request, "max_gpus", 8, int)
    percentile = _option(request, "rate_percentile", 99.0, float)
    headroom = _option(request, "rate_headroom", 0.0, float)
    replan_headroom = _option(request, "replan_headroom", None, float)
    if replan_headroom is not None and not (
        math.isfinite(replan_headroom) and 0 <= replan_headroom <= 10
    ):
        raise InputError(
            f"request.replan_headroom is {replan_headroom}, not in [0, 10]", hint=_GLET_HINT
        )
    simulate_s, seed = _option(request, "simulate_s", 0.0, float), _option(request, "seed", 0, int)
    resolved = []
    for m in models:
        variant = resolve_variant(store, m.variant_name)
        # the family its deployments serve (a plan document's `model`, as apply checks)
        family = store.get_variant(variant).family
        resolved.append(GletModel(m.name, m.rate_rps, m.slo_ms, variant, family))
    latency = load_latency_table(
        store, sorted({m.variant_name for m in resolved}), hardware=hardware
    )
    imodel, utilisation, notes = _glet_interference(store, request.get("interference", "newest"))
    memory, weights, gpu_memory, memory_note = _glet_memory(
        store, sorted({m.variant_name for m in resolved}), request, hardware=hardware
    )
    if memory_note:
        notes.append(memory_note)
    problem = GletProblem(
        models=resolved,
        latency_ms=latency,
        partitions=partitions,
        max_gpus=max_gpus,
        rate_percentile=percentile,
        interference=imodel,
        utilisation=utilisation,
        rate_headroom=headroom,
        memory_mb=memory,
        weights_mb=weights,
        gpu_memory_mb=gpu_memory,
    )
    running = current.extra.get("gpus") if current is not None else None

    def solve(p: GletProblem) -> Plan:
        return plan_glet(
            p,
            algorithm=algorithm,
            request={"spec": request.get("spec"), "hardware": hardware},
            simulate_s=simulate_s,
            seed=seed,
            current_gpus=running if current is not None and current.kind == "glet" else None,
        )

    try:
        plan = solve(problem)
    except InfeasiblePlan:
        if headroom <= 0 or current is None:
            raise
        # no room for the headroom within max_gpus: a replan still serves the load itself
        plan = solve(replace(problem, rate_headroom=0.0))
        notes.append(
            f"the rates + {headroom * 100:g} % headroom need more than {max_gpus} GPUs: "
            "planned at the rates themselves"
        )
    plan.request["simulate_s"], plan.request["seed"] = simulate_s, seed  # the check, again
    if replan_headroom is not None:  # what the next replan packs with (kept from plan to plan)
        plan.request["replan_headroom"] = replan_headroom
    if notes:
        plan.extra.setdefault("notes", []).extend(notes)
    return plan, problem


def _glet_memory(
    store: Any, variants: list[str], request: dict[str, Any], *, hardware: str | None
) -> tuple[dict[str, dict[str, dict[int, float]]], dict[str, float], float | None, str | None]:
    """What a glet schedule's memory check needs: each variant's profiled peak GPU memory
    ``{variant: {resource: {batch: MiB}}}`` and weights (``Variant.memory_mb``), and the
    GPU's memory: ``request.gpu_memory_mb``, else the smallest GPU the profiles were
    measured on that the store knows (``hardware`` rows of a whole GPU or an MPS share),
    else None (not checked, with a note when any memory figure is known)."""
    table: dict[str, dict[str, dict[int, float]]] = {}
    weights: dict[str, float] = {}
    measured_on: set[str] = set()
    for v in variants:
        for p in store.latest_profiles(variant=v, hardware=hardware):
            if p.hardware:
                measured_on.add(p.hardware)
            if p.memory_mb and p.capacity_slo_ms is None:
                per = table.setdefault(v, {}).setdefault(p.resource, {})
                per[int(p.batch)] = max(per.get(int(p.batch), 0.0), float(p.memory_mb))
        mb = store.get_variant(v).memory_mb
        if mb:
            weights[v] = float(mb)
    given = _option(request, "gpu_memory_mb", None, float)
    if given is not None:
        if not (math.isfinite(given) and given > 0):
            raise InputError(f"request.gpu_memory_mb is {given}, not a positive number of MiB")
        return table, weights, given, None
    from greenctl.data.resources import PIN_MIG_INSTANCE, RESOURCE_KINDS

    def whole_gpu(kind: str) -> bool:  # a GPU or an MPS share of it, not a MIG slice
        spec = RESOURCE_KINDS.get(kind)
        return spec is not None and spec.accelerator and spec.pinning != PIN_MIG_INSTANCE

    sizes = [
        float(h.memory_mb)
        for h in store.hardware()
        if whole_gpu(h.kind) and h.memory_mb and h.model_name in measured_on
    ]
    if sizes:
        return table, weights, min(sizes), None
    note = None
    if table or weights:
        note = (
            "the GPU's memory is not known (the profiles name no GPU in the store): the glets "
            "on a GPU are not checked against it; set request.gpu_memory_mb"
        )
    return table, weights, None, note


def _glet_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The GPUs the running layout takes to serve ``problem``'s rates themselves (not the
    headroom a replan packs new layouts with); None when it cannot serve them."""
    from dataclasses import replace

    from greenctl.planner.glet.solve import layout_gpus

    load = replace(problem, rate_headroom=0.0)
    gpus, note = layout_gpus(load, running.extra.get("gpus") or [])
    return (None, note) if gpus is None else (float(gpus), None)


def _glet_objective(plan: Plan) -> Objective:
    return "GPUs", finite_number(plan.predicted.get("gpus")), False


def _glet_triggers(running: Plan, new: Plan, threshold: float) -> tuple[list[str], str]:
    """When a new glet schedule is worth a change, beyond the rule every kind has (a running
    layout that cannot carry the new rates at its SLOs is replaced, ``replan_choice``):

    - it saves GPUs, the glet objective's unit: at least one GPU and more than
      ``threshold`` of the running GPUs (``--threshold``), while it carries the new rates
      plus the replan headroom (``request.rate_headroom``, :data:`GLET_REPLAN_HEADROOM`):
      hysteresis, so a dip of the load does not give back a GPU the next round needs again;
    - nothing else: a layout that moves glets (or takes more GPUs) while the running one
      carries the load gains nothing the objective counts and costs executor restarts.

    The glets that would move (:func:`~greenctl.planner.glet.moves.layout_moves`) are
    reported either way.

    Returns:
        (the triggers that fire, what was compared, for a reason when none does).
    """
    from greenctl.planner.glet.moves import layout_moves

    out = []
    old_gpus, new_gpus = (
        finite_number(running.predicted.get("gpus")),
        finite_number(new.predicted.get("gpus")),
    )
    headroom = finite_number(new.request.get("rate_headroom")) or 0.0
    moved, total = layout_moves(running.extra.get("gpus") or [], new.extra.get("gpus") or [])
    glets = f"{moved} of {total} glets would move"
    gpus = f"GPUs {_gpus_text(old_gpus)} -> {_gpus_text(new_gpus)}"
    saved = 0.0 if old_gpus is None or new_gpus is None else old_gpus - new_gpus
    share = saved / old_gpus if old_gpus else 0.0
    room = f"the rates + {headroom * 100:g} % headroom"
    if saved >= 1 and share > threshold:
        out.append(
            f"{gpus} with {room}: saves {saved:g} GPU{'s' if saved != 1 else ''} "
            f"({share * 100:.0f} % > {threshold * 100:g} %); {moved} of {total} glets move"
        )
    why = (
        "a change must save a GPU"
        if saved < 1
        else f"saving {saved:g} GPU{'s' if saved != 1 else ''} is {share * 100:.0f} % "
        f"(<= {threshold * 100:g} %)"
    )
    return out, f"{gpus} with {room}, {glets}; the running layout carries the new rates: {why}"


def _gpus_text(value: float | None) -> str:
    return "?" if value is None else f"{value:g}"


#: the least rate a measured glet model is planned for: a model measured idle keeps a glet
#: (and its route), so the requests that come before the next round are served
GLET_MIN_RATE_RPS = 1.0


#: the headroom a glet replan packs its new layout with (``rate x (1 + headroom)``), unless
#: the plan's request sets ``replan_headroom``: a layout changed for a rise of the load has
#: room before the next forced change, and one that gives back GPUs still carries the load
#: plus this much (the scale-down hysteresis of :func:`_glet_triggers`). 0.3, against the
#: +-30 % round-to-round rate noise bench_glet_churn.py replays on 10 models: 7.5 changes in 40
#: rounds instead of 40, for 3 % more GPU-rounds (0.5: 2.5 changes, 7 % more)
GLET_REPLAN_HEADROOM = 0.3


def _glet_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """A glet request at a new load: each model's rate becomes its given rate
    (``replan --rate``, by its name or its family's), else the forecast of its own measured
    load, else its share (as planned) of its family's (the dispatcher measures each family it
    routes), else stays, with a note; a measured rate below :data:`GLET_MIN_RATE_RPS` is
    raised to it. The new layout is packed with the replan headroom
    (``request.replan_headroom``, default :data:`GLET_REPLAN_HEADROOM`). A glet plan
    minimises GPUs: the carbon signal is recorded on the new plan, not planned with."""
    request = base_request(running)
    request["rate_headroom"] = _option(request, "replan_headroom", GLET_REPLAN_HEADROOM, float)
    models = request.get("models")
    if not isinstance(models, list):
        return ReplanRequest(request)  # the planner names what is wrong
    family = {d.variant: d.model for d in running.deployments}
    planned: dict[str, float] = {}
    groups: dict[str, str] = {}
    for m in models:
        if not isinstance(m, dict) or not isinstance(m.get("name"), str):
            continue
        name = m["name"]
        planned[name] = finite_number(m.get("rate_rps")) or 0.0
        fam = m.get("family") or family.get(str(m.get("variant") or name))
        if isinstance(fam, str):
            groups[name] = fam
    new, forecast, notes = forecast_rates(planned, signal, groups=groups)
    given = signal.rates or {}
    idle = [
        n
        for n, r in new.items()
        if r < GLET_MIN_RATE_RPS and n not in given and groups.get(n) not in given
    ]
    for n in idle:
        new[n] = GLET_MIN_RATE_RPS
    if idle:
        notes.append(
            f"{', '.join(idle)} measured below {GLET_MIN_RATE_RPS:g} req/s: planned at "
            f"{GLET_MIN_RATE_RPS:g} req/s to stay served"
        )
        forecast = sum(new.values())
    request["models"] = [
        {**m, "rate_rps": new[m["name"]]} if isinstance(m, dict) and m.get("name") in new else m
        for m in models
    ]
    return ReplanRequest(request, forecast, notes)


#: the kind, as the registry holds it
KIND = PlanKind(
    "glet",
    order=30,
    default_policy="batch",  # gpulet's glets run duty cycles
    plan=_glet_plan,
    score=_glet_score,
    replan_request=_glet_replan_request,
    objective=_glet_objective,
    time_shared=True,
    carbon_signal=False,
    triggers=_glet_triggers,
)
