"""The ``glet`` kind (gpulet): models with rates and SLOs packed into GPU partitions that
share a GPU in turn, planned by :mod:`greenctl.planner.glet`; it minimises GPUs, so its
replans follow the load, not the carbon signal."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.gpulet_import import (
    get_interference_model,
    load_latency_table,
    load_utilisation,
    resolve_variant,
)
from greenctl.data.plan import Plan
from greenctl.data.resources import PIN_MIG_INSTANCE, RESOURCE_KINDS
from greenctl.data.store import Store
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
from greenctl.planner.glet.moves import layout_moves
from greenctl.planner.glet.request import GletRequest, option

if TYPE_CHECKING:  # the glet planner imports numpy: loaded where a plan is made
    from greenctl.planner.glet.model import GletProblem


def _glet_interference(store: Store, want: Any) -> tuple[Any, dict[Any, Any], list[str]]:
    """(interference model or None, utilisation, notes) for the request's ``interference``:
    absent or ``"newest"`` the store's newest (none: planned without, with a note), an id
    that stored model, a plan's record of one (``id`` and ``coefficients``) that model, None
    or False none."""
    from greenctl.planner.core.interference import InterferenceModel

    if want is None or want is False:
        return None, {}, []
    if isinstance(want, dict) and want.get("coefficients") is not None:
        return InterferenceModel.from_dict(want), load_utilisation(store), []
    if isinstance(want, dict):
        want = want.get("id")
    model_id = None if want in ("newest", True, None) else want  # checked by GletRequest
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


def _glet_plan(store: Store, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    """Plan ``request`` (a :class:`GletRequest` document: a glet plan's ``request``, or what
    ``plan glet`` parsed). With ``current`` (a running glet plan) the new GPUs are numbered
    after the running ones, so the glets that stay keep running where they are; a replan
    whose headroom (``rate_headroom``) finds no room within ``max_gpus`` is planned at the
    rates. What the next replan packs with (``replan_headroom``, default
    :data:`GLET_REPLAN_HEADROOM`) is kept from plan to plan."""
    from greenctl.planner.glet.solve import plan_glet

    typed = GletRequest.from_dict(request)
    problem, notes = _glet_problem(store, typed)
    running = current.extra.get("gpus") if current is not None else None

    def solve(p: GletProblem) -> Plan:
        return plan_glet(
            p,
            algorithm=typed.algorithm,
            request={"spec": typed.spec, "hardware": typed.hardware},
            simulate_s=typed.simulate_s,
            seed=typed.seed,
            current_gpus=running if current is not None and current.kind == "glet" else None,
        )

    try:
        plan = solve(problem)
    except InfeasiblePlan:
        if typed.rate_headroom <= 0 or current is None:
            raise
        # no room for the headroom within max_gpus: a replan still serves the load itself
        plan = solve(replace(problem, rate_headroom=0.0))
        notes.append(
            f"the rates + {typed.rate_headroom * 100:g} % headroom need more than "
            f"{typed.max_gpus} GPUs: planned at the rates themselves"
        )
    plan.request["simulate_s"], plan.request["seed"] = typed.simulate_s, typed.seed
    if typed.replan_headroom is not None:  # what the next replan packs with
        plan.request["replan_headroom"] = typed.replan_headroom
    if notes:
        plan.extra.setdefault("notes", []).extend(notes)
    return plan, problem


def _glet_problem(store: Store, typed: GletRequest) -> tuple[GletProblem, list[str]]:
    """The planner's problem of a request: its models' variants, families, latencies,
    interference and memory from the store, and the notes of what the store lacks."""
    from greenctl.planner.glet.model import DEFAULT_PARTITIONS, GletModel, GletProblem

    resolved = []
    for m in typed.models:
        variant = resolve_variant(store, m.variant or m.name)
        # the family its deployments serve (a plan document's `model`, as apply checks)
        family = store.get_variant(variant).family
        resolved.append(GletModel(m.name, m.rate_rps, m.slo_ms, variant, family))
    names = sorted({m.variant_name for m in resolved})
    latency = load_latency_table(store, names, hardware=typed.hardware)
    imodel, utilisation, notes = _glet_interference(store, typed.interference)
    memory, weights, gpu_memory, memory_note = _glet_memory(
        store, names, typed.gpu_memory_mb, hardware=typed.hardware
    )
    if memory_note:
        notes.append(memory_note)
    problem = GletProblem(
        models=resolved,
        latency_ms=latency,
        partitions=list(DEFAULT_PARTITIONS if typed.partitions is None else typed.partitions),
        max_gpus=typed.max_gpus,
        rate_percentile=typed.rate_percentile,
        interference=imodel,
        utilisation=utilisation,
        rate_headroom=typed.rate_headroom,
        memory_mb=memory,
        weights_mb=weights,
        gpu_memory_mb=gpu_memory,
    )
    return problem, notes


def _glet_memory(
    store: Store, variants: list[str], given: float | None, *, hardware: str | None
) -> tuple[dict[str, dict[str, dict[int, float]]], dict[str, float], float | None, str | None]:
    """What a glet schedule's memory check needs: each variant's profiled peak GPU memory
    ``{variant: {resource: {batch: MiB}}}`` and weights (``Variant.memory_mb``), and the
    GPU's memory: ``given`` (``request.gpu_memory_mb``), else the smallest GPU the profiles were
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
    if given is not None:
        return table, weights, given, None

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
    request["rate_headroom"] = option(request, "replan_headroom", GLET_REPLAN_HEADROOM, float)
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
    replay="greenctl.executor.kinds.glet_replay:STEP",
    order=30,
    default_policy="batch",  # gpulet's glets run duty cycles
    plan=_glet_plan,
    score=_glet_score,
    replan_request=_glet_replan_request,
    objective=_glet_objective,
    time_shared=True,
    carbon_signal=False,
    triggers=_glet_triggers,
    request_type=GletRequest,
)
