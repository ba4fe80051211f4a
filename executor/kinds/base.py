"""What every plan kind shares: the :class:`PlanKind` record, the registry it is kept in
(:data:`KINDS`, :func:`get_kind`, :func:`register`, :func:`load_kinds`), the serving defaults
(:func:`predict_serving`) and the replanning helpers (:class:`ReplanSignal`,
:func:`forecast_rates`).

The kinds themselves live one per module (the built-in ones beside this one: ``mix``,
``mig``, ``glet``, ``geo``) and are installed under the ``greenctl.kinds`` entry-point group,
as a third party's are; :func:`load_kinds` puts them in the registry.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from greenctl.data.carbon_io import read_utf8
from greenctl.data.emissions import plan_carbon
from greenctl.data.errors import FileFormatError, GreenctlError, InputError, shown
from greenctl.data.plan import (
    KIND_GROUP,
    Plan,
    add_plan_kind,
    discard_plan_kind,
    installed_kinds,
)
from greenctl.data.store import Store
from greenctl.planner.core.policy import plan_policy, use_kind_defaults
from greenctl.profiler.models import builtin_variants

#: (new plan, the problem it solved; for geo the run, which holds the problem)
Planned = tuple[Plan, Any]
#: (the objective's name, its value in a plan or None, whether larger is better)
Objective = tuple[str, float | None, bool]


# -- the defaults every serving kind shares ---------------------------------------------------
def predict_serving(
    store: Store, plan: Plan, *, policy: str | None = None, **options: Any
) -> dict[str, Any]:
    """What a plan of executor instances does under a load: the evaluation core's
    :func:`~greenctl.planner.core.simulator.evaluate_plan` (options as there) with the newest
    profiles of its variants in the store (variants the store lacks but greenctl has built
    in are known by their catalog record), under ``policy`` (default: the kind's,
    :meth:`PlanKind.dispatch_policy`), and the serving paths ``greenctl profile serving``
    measured for its models (:func:`~greenctl.executor.runtime.serving.serving_overheads`, at the
    plan's rates scaled to the load evaluated), as ``plan mix`` predicted with them. Without
    ``carbon_g_per_kwh`` or ``pue``, those the plan was made with
    (:func:`~greenctl.data.emissions.plan_carbon`), so carbon comes out as the plan predicted it."""
    from greenctl.planner.core.evaluate import LATENCY_MODEL_ONLY, LATENCY_WITH_PATH
    from greenctl.planner.core.simulator import evaluate_plan

    profiles, variants = plan_inputs(store, plan)
    pol = get_kind(plan.kind).dispatch_policy(plan, policy)
    rates = plan_rates(plan)
    total = _load_evaluated(options)
    planned = sum(rates.values())
    if total is not None and planned > 0:
        rates = {m: r * total / planned for m, r in rates.items()}
    serving = serving_paths(store, rates) or None
    intensity, pue = plan_carbon(plan)
    if options.get("carbon_g_per_kwh") is None:
        options["carbon_g_per_kwh"] = intensity
    if options.get("pue") is None:
        options["pue"] = pue
    out = evaluate_plan(plan, profiles, variants, policy=pol, serving=serving, **options)
    out["latency_includes"] = LATENCY_WITH_PATH if serving else LATENCY_MODEL_ONLY
    return out


def _load_evaluated(options: Mapping[str, Any]) -> float | None:
    """The whole load (req/s) an evaluation runs: its rate, or its trace's mean (times its
    scale); None: the plan's own."""
    rate = options.get("rate_rps")
    if isinstance(rate, int | float) and rate > 0:
        return float(rate)
    trace = options.get("trace")
    if trace is not None and len(trace):
        mean = sum(float(x) for x in trace) / len(trace)
        return mean * float(options.get("trace_scale") or 1.0) or None
    return None


def serving_paths(store: Store, rates: Mapping[str, float]) -> dict[str, Any]:
    """The serving paths ``greenctl profile serving`` measured for the models at ``rates``
    (req/s per model): :func:`~greenctl.executor.runtime.serving.serving_overheads`, the one
    place the registry reads what serves."""
    from greenctl.executor.runtime.serving import serving_overheads

    return serving_overheads(store, rates)


def plan_rates(plan: Plan) -> dict[str, float]:
    """The load (req/s) a plan was made for, per model: its request's families' rates (a mix
    plan), else the sum of each model's quotas, else the plan's whole rate shared evenly."""
    from greenctl.planner.core.simulator import default_rate

    def number(value: Any) -> float | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
        return float(value) if ok else None

    models = list(dict.fromkeys(d.model for d in plan.deployments))
    rates: dict[str, float] = {}
    for fam in plan.request.get("families") or []:
        if isinstance(fam, dict) and fam.get("model") in models:
            rate = number(fam.get("rate_rps"))
            if rate is not None:
                rates[str(fam["model"])] = rate
    for model in models:
        quotas = [number(d.quota_rps) for d in plan.deployments if d.model == model]
        if model not in rates and quotas and all(q is not None for q in quotas):
            rates[model] = sum(q or 0.0 for q in quotas)
    missing = [m for m in models if m not in rates]
    if missing:
        try:
            whole = default_rate(plan)
        except GreenctlError:
            whole = 1.0  # no rate stated: any measured rate is as near as another
        rates.update(dict.fromkeys(missing, whole / len(models)))
    return rates


def plan_inputs(store: Store, plan: Plan) -> tuple[list[Any], list[Any]]:
    """The newest profiles and the variant records of a plan's variants in the store
    (variants the store lacks but greenctl has built in are known by their catalog record)."""
    names = {d.variant for d in plan.deployments}
    profiles = [p for name in sorted(names) for p in store.latest_profiles(variant=name)]
    variants = [v for v in store.variants() if v.name in names]
    missing = names - {v.name for v in variants}
    if missing:
        variants += [v for v in builtin_variants() if v.name in missing]
    return profiles, variants


def predicted_objective(plan: Plan) -> Objective:
    """``predicted.objective`` under ``predicted.objective_name``, smaller is better."""
    value = plan.predicted.get("objective")
    return str(plan.predicted.get("objective_name") or ""), finite_number(value), False


def finite_number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else None


# -- replanning: a running plan's request at a new signal -------------------------------------
@dataclass(frozen=True)
class ReplanSignal:
    """What a replanning round knows when it plans a running plan again."""

    #: the region's carbon intensity now (g/kWh); None for a kind that plans no carbon
    #: (:attr:`PlanKind.carbon_signal` False) replanned without a region
    carbon_intensity: float | None
    #: the forecast peak of the plan's whole load, when the caller names the load to follow
    #: (``replan_once(load_model=...)``); spread over the plan's models as planned
    rate_rps: float | None = None
    #: forecast(name) -> the forecast peak load (req/s) of one model as the measured load
    #: names it (the dispatcher records each family it routes), None when none is measured;
    #: None: no forecaster (the planned rates stay)
    forecast: Callable[[str], float | None] | None = None
    #: rates given by name (``replan --rate NAME=RPS``): a name's own rate, or its group's
    #: (a glet model's family) shared as planned; they win over ``forecast``
    rates: Mapping[str, float] | None = None


@dataclass
class ReplanRequest:
    """A running plan's request rewritten for a :class:`ReplanSignal`."""

    request: dict[str, Any]
    #: the forecast load the request now plans for (None: the planned rates stay)
    forecast_rps: float | None = None
    #: what the rewrite left alone, and why (a decision's reason shows them)
    notes: list[str] = field(default_factory=list)


def base_request(running: Plan) -> dict[str, Any]:
    """The running plan's request as inputs to plan it again: without the region it was
    recorded for, and without a baseline (a replan plans greenctl's configuration)."""
    request = {k: v for k, v in running.request.items() if k != "carbon_region"}
    request.pop("baseline", None)
    return request


def forecast_rates(
    planned: Mapping[str, float],
    signal: ReplanSignal,
    *,
    groups: Mapping[str, str] | None = None,
) -> tuple[dict[str, float], float | None, list[str]]:
    """New rates for the planned ``{name: rate_rps}`` under ``signal``.

    With ``signal.rate_rps`` the whole load is spread over the names as planned. Otherwise
    each name takes its given rate (``signal.rates``), else its own forecast when its load is
    measured, else its share (as planned) of its group's given rate or forecast (``groups``:
    name -> the name its load is measured under, e.g. a glet model's family); names with
    neither keep their planned rate, which a note says when there is a forecast.

    Returns:
        (the rates that changed, the forecast load they add up to or None, notes).

    Raises:
        InputError: a given rate names neither a name nor a group (``--rate``).
    """
    names = list(planned)
    groups = groups or {}
    given = dict(signal.rates or {})
    known = list(dict.fromkeys([*names, *(groups[n] for n in names if n in groups)]))
    unknown = [k for k in given if k not in known]
    if unknown:
        raise InputError(
            f"--rate {unknown[0]}={given[unknown[0]]:g}: the plan serves no model {unknown[0]!r}",
            hint="name one of its models: " + ", ".join(known),
        )

    def split(load: float, among: list[str], over: list[str]) -> dict[str, float]:
        """``load`` shared as planned over ``over``: the parts of those ``among``."""
        part = sum(max(float(planned[n]), 0.0) for n in over)
        return {
            n: load * max(float(planned[n]), 0.0) / part if part > 0 else load / len(over)
            for n in among
        }

    if signal.rate_rps is not None:
        rate = float(signal.rate_rps)
        return (split(rate, names, names), rate, []) if names else ({}, None, [])
    if (signal.forecast is None and not given) or not names:
        return {}, None, []

    def rate_of(name: str) -> float | None:
        if name in given:
            return float(given[name])
        return None if signal.forecast is None else signal.forecast(name)

    new: dict[str, float] = {}
    for n in names:
        own = rate_of(n)
        if own is not None:
            new[n] = float(own)
    for group in dict.fromkeys(groups[n] for n in names if n in groups):
        among = [n for n in names if groups.get(n) == group and n not in new and n != group]
        if not among:
            continue
        load = rate_of(group)
        if load is not None:  # the members without a forecast of their own take their share
            new.update(split(float(load), among, [n for n in names if groups.get(n) == group]))
    missing = [n for n in names if n not in new] if signal.forecast is not None else []
    notes = []
    if missing and len(names) == 1:
        notes.append("no measured load yet: planned rate kept")
    elif len(missing) == 1:
        notes.append(f"no measured load yet for {missing[0]}: its planned rate kept")
    elif missing:
        notes.append(f"no measured load yet for {', '.join(missing)}: their planned rates kept")
    return new, (sum(new.values()) if new else None), notes


def replan_model_rate(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """A request of one model (``model``, ``rate_rps``, planned at ``carbon_intensity``): the
    new signal, and the forecast of the model's load as its rate. The default of a kind that
    says nothing else (mig's request has this shape)."""
    request = base_request(running)
    request["carbon_intensity"] = signal.carbon_intensity
    model = request.get("model")
    if model is None:
        notes = []
        if signal.rate_rps is not None or signal.forecast is not None or signal.rates:
            notes.append(
                f"a {running.kind} request names no model: the forecast load is not applied"
            )
        return ReplanRequest(request, None, notes)
    planned = finite_number(request.get("rate_rps")) or 0.0
    new, forecast, notes = forecast_rates({str(model): planned}, signal)
    if str(model) in new:
        request["rate_rps"] = new[str(model)]
    return ReplanRequest(request, forecast, notes)


@dataclass(frozen=True)
class PlanKind:
    """One kind of plan, as every command and loop that handles it sees it."""

    name: str
    #: plan(store, request, current=None, **options) -> (plan, problem); None: not yet here
    plan: Callable[..., Planned] | None = None
    #: score(problem, running plan) -> (its objective in the problem or None, note or None)
    score: Callable[[Any, Plan], tuple[float | None, str | None]] | None = None
    #: replan_request(running plan, signal) -> its request at the new signal and forecast
    #: (``replan``); default :func:`replan_model_rate` (one model's ``rate_rps``)
    replan_request: Callable[[Plan, ReplanSignal], ReplanRequest] = replan_model_rate
    #: objective(plan) -> (name, value, larger is better): what ``replan`` compares
    objective: Callable[[Plan], Objective] = predicted_objective
    #: its request is planned at a grid carbon intensity (``request.carbon_intensity``): the
    #: planning twin (:func:`~greenctl.executor.kinds.planning.plan`) resolves it and records
    #: where it came from; False: the kind plans no grid intensity (glet; geo reads each
    #: site's from its files)
    plans_at_intensity: bool = False
    #: reference_intensity(request) -> the intensity (g/kWh) planned at when neither the
    #: request nor a region's signal gives one; None: one of those is needed
    reference_intensity: Callable[[dict[str, Any]], float] | None = None
    #: its plans are planned with the region's carbon intensity: ``replan`` needs a region
    #: and acts when the intensity moved beyond ``--threshold``; False: the intensity is
    #: read (and recorded on the new plan) only when a region is known
    carbon_signal: bool = True
    #: triggers(running plan, new plan, threshold) -> (why the new plan is worth a change,
    #: empty: it is not; what was compared, for the reason when it is not); None:
    #: ``replan``'s own (the signal moved beyond ``threshold``, or the objective improves
    #: beyond ``--margin``). Either way a running plan that cannot serve the new load
    #: (``score`` None) is replaced.
    triggers: Callable[[Plan, Plan, float], tuple[list[str], str]] | None = None
    #: ``score`` None says the running plan cannot serve the forecast load (it misses the
    #: SLO, or an option it runs is gone): ``--min-dwell`` then yields to a change
    #: (:func:`greenctl.executor.control.replan.dwell_yields`); False: None says only that the
    #: running plan cannot be compared (a geo plan), and the dwell holds
    score_checks_load: bool = True
    #: the policy when neither the plan nor batching decides (rule 4 of
    #: :mod:`greenctl.planner.core.policy`); None: ``wrr``
    default_policy: str | None = None
    #: its plans describe executor instances: ``simulate`` predicts them, ``apply`` runs
    #: them, the backends and the export take them; False: those steps refuse them, saying
    #: ``not_served`` (and ``not_served_hint``)
    serves: bool = True
    not_served: str = "it does not describe executor instances"
    not_served_hint: str | None = None
    #: predict(store, plan, policy=..., **evaluate_plan options) -> metrics (``simulate``)
    predict: Callable[..., dict[str, Any]] = predict_serving
    #: instances(plan) -> the executor instance specs ``apply`` runs; None: apply's own
    #: expansion (:func:`greenctl.executor.deploy.instances.desired_instances`: ``count`` instances of
    #: each deployment, MIG layouts slot by slot)
    instances: Callable[[Plan], list[Any]] | None = None
    #: its instances are model servers of their own (LLM engines) that only the local
    #: backend starts: the Ray backend and the Kubernetes export, which run greenctl's
    #: executor daemons, refuse its plans (:meth:`refuse_elsewhere`). Which tiers ``apply``
    #: starts as engines is the plan's own rule
    #: (:func:`~greenctl.executor.deploy.llm_plan.engine_tiers`): set this on a kind whose
    #: planner names engines for every tier
    local_engines: bool = False
    #: several models of one plan share a partition in turn (glet duty cycles): their MPS
    #: shares on one GPU may add up past 100 %
    time_shared: bool = False
    #: carbon_aware(plan) -> whether its objective weighs carbon: the dispatcher then serves
    #: a model-less request by the variant with the least carbon per request, else the
    #: cheapest (:mod:`greenctl.planner.core.choice`)
    carbon_aware: Callable[[Plan], bool] = lambda plan: False
    #: its typed request: ``from_dict(request dict)`` validates a plan's ``request`` once and
    #: ``to_dict()`` writes it back; None: the kind takes the plain dict
    request_type: Any = None
    #: routes(store, plan) -> the run whose per-slot site fractions a router follows: the
    #: kind allocates load across sites (``apply --site`` starts the geo router for it,
    #: ``export envoy`` writes its weights); None: its plans are not routed
    routes: Callable[[Store, Plan], Any] | None = None
    #: its replay step (``greenctl replay``): a
    #: :class:`~greenctl.executor.kinds.replaying.ReplayStep`, or where one is as
    #: ``"module:attribute"`` (imported when a replay asks, so planning does not load it);
    #: None: the kind does not replay
    replay: Any = None
    #: where commands list it among the installed kinds (then by name)
    order: int = 100

    def solve(self, store: Store, request: dict[str, Any], **options: Any) -> Planned:
        """Plan ``request`` with the kind's planner (``options`` as its ``plan`` takes them:
        ``current``, a baseline, ...), once :meth:`check_request` accepted it.

        Raises:
            InputError: the kind has no planner, or the request is refused (field named).
        """
        if self.plan is None:
            raise InputError(f"the {self.name} kind has no planner", hint="plan another kind")
        self.check_request(request)
        return self.plan(store, request, **options)

    def check_request(self, request: Any) -> None:
        """Refuse a request the kind cannot plan: not an object, or one its typed request
        (:attr:`request_type`'s ``from_dict``) refuses, naming the field. Every planning
        caller passes here (:meth:`solve`), an installed kind's included.

        Raises:
            InputError: as above.
        """
        if not isinstance(request, dict):
            raise InputError(
                f"a {self.name} request is an object of its fields, not {shown(request)}",
                hint='for example {"model": "resnet", "rate_rps": 40}',
            )
        if self.request_type is not None:
            self.request_type.from_dict(request)

    @property
    def replannable(self) -> bool:
        return self.plan is not None and self.score is not None

    def dispatch_policy(self, plan: Plan, override: str | None = None) -> str:
        """The policy ``plan`` is predicted, simulated and served with: the one rule
        (:func:`~greenctl.planner.core.policy.plan_policy`) with this kind's default.

        Raises:
            InputError: ``override`` or the plan's own choice is not a policy.
        """
        return plan_policy(plan, override, kind_default=self.default_policy)

    def refuse_elsewhere(self, where: str) -> InputError:
        """The error of ``where`` (the Kubernetes export, the Ray backend) for a plan whose
        instances only the local backend starts (:attr:`local_engines`)."""
        return InputError(
            f"the {where} cannot take {self.name} plans: their instances are engines that "
            "only the local backend starts",
            hint="apply it on this machine: greenctl apply PLAN",
        )

    def refuse(self, action: str) -> InputError:
        """The error for ``action`` (``simulate``, ``apply``, ...) on a plan of this kind."""
        return InputError(
            f"cannot {action} a {self.name} plan: {self.not_served}", hint=self.not_served_hint
        )


#: the largest request file :func:`read_request` reads (a request is a few fields)
MAX_REQUEST_BYTES = 1 << 20


def read_request(path: str | Path) -> dict[str, Any]:
    """The request document in the JSON file at ``path`` (``plan run --request``): an object
    of the kind's request fields, which :meth:`PlanKind.check_request` checks when planned.

    Raises:
        InputError: missing or unreadable. FileFormatError: too large, not UTF-8, invalid
            JSON (line and column named) or not an object.
    """
    p = Path(path)
    if p.is_file() and p.stat().st_size > MAX_REQUEST_BYTES:
        raise FileFormatError(
            str(p), f"too large for a request (at most {MAX_REQUEST_BYTES} bytes)"
        )
    text = read_utf8(p, what="request file", hint="name a JSON file of the kind's request")
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            str(p), f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
        ) from None
    except (ValueError, RecursionError) as exc:  # NaN, Infinity, too deep, too many digits
        raise FileFormatError(str(p), f"invalid JSON: {shown(str(exc), 80)}") from None
    if not isinstance(doc, dict):
        raise FileFormatError(
            str(p),
            f"a request is a JSON object of its fields, not {shown(doc)}",
            hint='for example {"model": "resnet", "rate_rps": 40}',
        )
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a request may hold")


# -- the registry -------------------------------------------------------------------------------
#: The registered kinds by name: the installed ones (:func:`load_kinds`), then those added
#: with :func:`register`.
KINDS: dict[str, PlanKind] = {}

#: The installed kinds (the ``greenctl.kinds`` entry-point group), as :func:`unregister`
#: restores them.
BUILTIN: dict[str, PlanKind] = {}


def load_kinds() -> None:
    """Put the kinds installed under the ``greenctl.kinds`` entry-point group in the registry
    (in their ``order``, then by name), before those added with :func:`register`; again after
    a package of kinds was added to or removed from the path.

    Raises:
        InputError: an entry point that cannot be loaded or is not a :class:`PlanKind` of
            its own name.
    """
    installed = []
    for ep in entry_points(group=KIND_GROUP):
        try:
            kind = ep.load()
        except (ImportError, AttributeError) as exc:
            raise InputError(
                f"the plan kind {ep.name!r} ({ep.value}) cannot be loaded: {exc}",
                hint="reinstall or remove the package that provides it",
            ) from None
        if not isinstance(kind, PlanKind) or kind.name != ep.name:
            raise InputError(
                f"the plan kind {ep.name!r} ({ep.value}) is not a PlanKind named {ep.name!r}",
                hint="a greenctl.kinds entry point names a module's PlanKind record",
            )
        installed.append(kind)
    added = [k for name, k in KINDS.items() if name not in BUILTIN]
    for name in [*BUILTIN, *(k.name for k in added)]:
        discard_plan_kind(name)
    BUILTIN.clear()
    KINDS.clear()
    installed_kinds(refresh=True)
    for kind in sorted(installed, key=lambda k: (k.order, k.name)):
        BUILTIN[kind.name] = kind
        register(kind)
    for kind in added:
        register(kind)


def register(kind: PlanKind) -> None:
    """Add (or replace) a plan kind; plan documents of the kind can be read from then on."""
    KINDS[kind.name] = kind
    add_plan_kind(kind.name)


def unregister(name: str) -> None:
    """Remove a kind added with :func:`register` (an installed kind is put back as it was)."""
    if name in BUILTIN:
        KINDS[name] = BUILTIN[name]
        return
    KINDS.pop(name, None)
    discard_plan_kind(name)


def get_kind(name: str) -> PlanKind:
    """The registered kind called ``name``.

    Raises:
        InputError: no such kind (names the known ones).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(
            f"unknown plan kind {name!r}", hint=f"known kinds: {', '.join(sorted(KINDS))}"
        ) from None


def _default_policy(kind: str) -> str | None:
    known = KINDS.get(kind)
    return None if known is None else known.default_policy


use_kind_defaults(_default_policy)  # rule 4 of the policy rule: the registry's defaults
