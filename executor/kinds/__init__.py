"""The registry of plan kinds: everything a command or a loop needs to know about one kind.

Each kind (:class:`PlanKind`) says in one place

- ``plan``: how its problem is built from the store and a request, and solved;
- ``score``: how a running plan of the kind is scored in a new problem (``replan``);
- ``replan_request``: how a running plan's request is rewritten for a new carbon signal and
  load forecast (``replan``): which of its rates a forecast sets, and what it leaves alone;
- ``objective``: which figure of its plans the solver optimised, and in which direction;
- ``default_policy``: its default dispatch policy, handed to the one rule in
  :mod:`greenctl.planner.core.policy` (:meth:`PlanKind.dispatch_policy`);
- ``predict``: how ``simulate`` predicts its plans under a load;
- ``instances``: how its plan becomes executor instances (``apply``), ``time_shared``
  when several models of its plans share one partition, and ``serves`` whether its plans
  describe instances at all.

A kind's request is the plain dict its plan document records in ``request``: everything
needed to plan it again. ``greenctl plan mix|mig|glet|geo`` parse their options into such a
request and call the kind's ``plan``, and ``replan`` and the demo call the same entry with
the running plan's request, so a plan is built one way whoever builds it. ``simulate``,
``apply`` (local, Ray), the Kubernetes export and ``replan`` ask the registry for the rest,
so adding a kind is a planner module and one :func:`register` call (with no command of its
own, its plans are made through ``get_kind(name).plan``).

A geo plan allocates load across sites, not instances (``serves=False``): ``simulate``,
the backends' ``apply``, Ray, the Kubernetes export and ``replan --apply`` refuse it with
:meth:`PlanKind.refuse`. It is routed instead: ``apply --site`` starts the geo router
(:mod:`greenctl.executor.deploy.georouter`), whose fractions come from this registry's ``plan``
entry, as do ``replan``'s of a routed plan and ``export envoy``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan, add_plan_kind, discard_plan_kind
from greenctl.planner.core.policy import plan_policy

#: (new plan, the problem it solved; for geo the run, which holds the problem)
Planned = tuple[Plan, Any]
#: (the objective's name, its value in a plan or None, whether larger is better)
Objective = tuple[str, float | None, bool]


# -- the defaults every serving kind shares ---------------------------------------------------
def predict_serving(
    store: Any, plan: Plan, *, policy: str | None = None, **options: Any
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
    from greenctl.data.emissions import plan_carbon
    from greenctl.executor.runtime.serving import serving_overheads
    from greenctl.planner.core.evaluate import LATENCY_MODEL_ONLY, LATENCY_WITH_PATH
    from greenctl.planner.core.simulator import evaluate_plan

    profiles, variants = plan_inputs(store, plan)
    pol = get_kind(plan.kind).dispatch_policy(plan, policy)
    rates = plan_rates(plan)
    total = _load_evaluated(options)
    planned = sum(rates.values())
    if total is not None and planned > 0:
        rates = {m: r * total / planned for m, r in rates.items()}
    serving = serving_overheads(store, rates) or None
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


def plan_rates(plan: Plan) -> dict[str, float]:
    """The load (req/s) a plan was made for, per model: its request's families' rates (a mix
    plan), else the sum of each model's quotas, else the plan's whole rate shared evenly."""
    from greenctl.data.errors import GreenctlError
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


def plan_inputs(store: Any, plan: Plan) -> tuple[list[Any], list[Any]]:
    """The newest profiles and the variant records of a plan's variants in the store
    (variants the store lacks but greenctl has built in are known by their catalog record)."""
    from greenctl.profiler.models import builtin_variants

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
    return str(plan.predicted.get("objective_name") or ""), _number(value), False


def _number(value: Any) -> float | None:
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


def _base_request(running: Plan) -> dict[str, Any]:
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
    request = _base_request(running)
    request["carbon_intensity"] = signal.carbon_intensity
    model = request.get("model")
    if model is None:
        notes = []
        if signal.rate_rps is not None or signal.forecast is not None or signal.rates:
            notes.append(
                f"a {running.kind} request names no model: the forecast load is not applied"
            )
        return ReplanRequest(request, None, notes)
    planned = _number(request.get("rate_rps")) or 0.0
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
    #: :mod:`greenctl.planner.core.policy`); None: that module's table, else ``wrr``
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
    #: expansion (:func:`greenctl.executor.deploy.apply.desired_instances`: ``count`` instances of
    #: each deployment, MIG layouts slot by slot)
    instances: Callable[[Plan], list[Any]] | None = None
    #: several models of one plan share a partition in turn (glet duty cycles): their MPS
    #: shares on one GPU may add up past 100 %
    time_shared: bool = False
    #: carbon_aware(plan) -> whether its objective weighs carbon: the dispatcher then serves
    #: a model-less request by the variant with the least carbon per request, else the
    #: cheapest (:mod:`greenctl.planner.core.choice`)
    carbon_aware: Callable[[Plan], bool] = lambda plan: False

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

    def refuse(self, action: str) -> InputError:
        """The error for ``action`` (``simulate``, ``apply``, ...) on a plan of this kind."""
        return InputError(
            f"cannot {action} a {self.name} plan: {self.not_served}", hint=self.not_served_hint
        )


# -- mix (InfAdapter / INFaaS) -----------------------------------------------------------------
def _mix_plan(store: Any, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    from greenctl.executor.runtime.serving import serving_overheads
    from greenctl.planner.mix import solve as mix

    request = dict(request)
    if current is not None:
        request["current"] = [d.to_dict() for d in current.deployments]
    families = mix.normalize_request(request)["families"]
    names = [f["model"] for f in families]
    for name in names:
        store.require_family(name)  # the store knows every family: name them and a close one
    variants = [v for f in names for v in store.variants(f)]
    profiles = [p for f in names for p in store.latest_profiles(family=f)]
    serving = serving_overheads(store, {f["model"]: float(f["rate_rps"]) for f in families})
    problem = mix.build_mix_problem(request, variants, profiles, serving=serving)
    plan = mix.plan_mix(
        problem,
        strategy=problem.request.get("strategy") or "ilp",
        solver=problem.request.get("solver") or "highs",
        time_limit_s=problem.request.get("time_limit_s"),
    )
    return plan, problem


def _mix_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running plan's objective in ``problem`` (its quotas scaled to the new load)."""
    from greenctl.planner.mix import solve as mix

    alloc: dict[int, dict[int, tuple[int, float]]] = {}
    for fi, fam in enumerate(problem.families):
        deps = [d for d in running.deployments if d.model == fam.name]
        old_quota = sum(float(d.quota_rps or 0.0) for d in deps) or 1.0
        load = fam.load_rps(problem.headroom)
        for d in deps:
            idx = next(
                (
                    i
                    for i, o in enumerate(fam.options)
                    if (o.variant, o.resource, o.batch) == (d.variant, d.resource, d.batch)
                ),
                None,
            )
            if idx is None:
                return None, f"running option {d.variant}@{d.resource} is no longer eligible"
            q = float(d.quota_rps or 0.0) / old_quota * load
            if q > fam.options[idx].capacity_rps * d.count * (1 + 1e-6):
                return None, (
                    f"running {d.variant}@{d.resource} x{d.count} cannot carry "
                    f"{q:.1f} req/s of the forecast load"
                )
            prev_n, prev_q = alloc.setdefault(fi, {}).get(idx, (0, 0.0))
            alloc[fi][idx] = (prev_n + d.count, prev_q + q)
    return float(mix.evaluate_allocation(problem, alloc)["objective"]), None


def _mix_objective(plan: Plan) -> Objective:
    from greenctl.planner.mix.solve import is_maximise

    name = str(plan.predicted.get("objective_name") or "")
    value = _number(plan.predicted.get("objective"))
    return name, value, is_maximise(name or "balanced")


def _mix_carbon_aware(plan: Plan) -> bool:
    """``carbon``, and ``balanced`` with its carbon term (``gamma`` > 0, the default)."""
    name = str(plan.predicted.get("objective_name") or plan.request.get("objective") or "")
    if name == "carbon":
        return True
    gamma = plan.request.get("gamma")
    return name in ("balanced", "") and (_number(gamma) is None or (_number(gamma) or 0.0) > 0)


def _mix_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """A mix request at the new signal: one family's (``model`` or one of ``families``) rate
    is the forecast of its load; several families each take their own."""
    fams = running.request.get("families")
    if not isinstance(fams, list) or not fams:
        return replan_model_rate(running, signal)
    request = _base_request(running)
    request["carbon_intensity"] = signal.carbon_intensity
    planned = {
        str(f.get("model")): _number(f.get("rate_rps")) or 0.0 for f in fams if isinstance(f, dict)
    }
    new, forecast, notes = forecast_rates(planned, signal)
    request["families"] = [
        {**f, "rate_rps": new[str(f.get("model"))]}
        if isinstance(f, dict) and str(f.get("model")) in new
        else f
        for f in fams
    ]
    return ReplanRequest(request, forecast, notes)


# -- mig (Clover) -------------------------------------------------------------------------------
def _mig_plan(
    store: Any,
    request: dict[str, Any],
    *,
    current: Plan | None = None,
    baseline: str | None = None,
) -> Planned:
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.mig import solve as mig

    try:
        geo = resolve_gpu(str(request["gpu"]))
        family = str(request["model"])
        gpus = int(request["gpus"])
        rate = float(request["rate_rps"])
        intensity = float(request["carbon_intensity"])
    except (KeyError, TypeError, ValueError):
        raise InputError(
            "a MIG plan's request needs gpu, gpus, model, rate_rps and carbon_intensity",
            hint="replan MIG plans made by `greenctl plan mig`",
        ) from None
    problem = mig.build_problem(
        geo,
        store.latest_profiles(family=family),
        store.variants(family),
        family=family,
        gpus=gpus,
        rate_rps=rate,
        carbon_intensity=intensity,
        sla_ms=request.get("sla_ms"),
        lam=float(request.get("lambda", 0.5)),
        base_carbon_intensity=request.get("base_carbon_intensity"),
        max_accuracy_loss_pct=request.get("max_accuracy_loss_pct"),
        percentile=float(request.get("percentile") or 0.95),
    )
    plan = mig.plan_mig(
        problem,
        solver=str(request.get("solver") or "exact"),
        baseline=baseline,
        current=current,
        time_limit_s=request.get("time_limit_s"),
        seed=request.get("seed"),
    )
    return plan, problem


def _mig_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """As :func:`replan_model_rate`, holding the intensity BASE is priced at: Clover's
    objective weighs a plan's carbon against BASE's, and BASE priced at the new signal
    itself cancels the signal out of the objective (the plan would follow the load alone).
    A plan made without ``base_carbon_intensity`` keeps the intensity it was planned at."""
    out = replan_model_rate(running, signal)
    if out.request.get("base_carbon_intensity") is None:
        out.request["base_carbon_intensity"] = running.request.get("carbon_intensity")
    return out


def _mig_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running layouts' objective in ``problem`` (None when they miss the SLA)."""
    from greenctl.planner.mig import solve as mig

    model = mig.MigModel(problem)
    try:
        cfg = mig.config_from_gpus(model, running.extra.get("gpus") or [], source="running plan")
        ev = model.evaluate(cfg)
    except InputError as exc:
        return None, f"running layout not comparable: {exc.message}"
    if not ev.feasible:
        return None, "the running layout misses the SLA at the forecast load"
    return float(ev.objective), None


def _mig_objective(plan: Plan) -> Objective:
    # Clover's f = lambda*dCarbon + (1-lambda)*dAccuracy
    return "clover", _number(plan.predicted.get("objective")), True


# -- glet (gpulet) -------------------------------------------------------------------------------
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
    if not (whole if kind is int else _number(value) is not None):
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
        rate, slo = _number(m.get("rate_rps")), _number(m.get("slo_ms"))
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
    return "GPUs", _number(plan.predicted.get("gpus")), False


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
    old_gpus, new_gpus = _number(running.predicted.get("gpus")), _number(new.predicted.get("gpus"))
    headroom = _number(new.request.get("rate_headroom")) or 0.0
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
    request = _base_request(running)
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
        planned[name] = _number(m.get("rate_rps")) or 0.0
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


# -- geo (eGLB) ----------------------------------------------------------------------------------
#: request key -> run_geo option
_GEO_OPTIONS = {
    "algorithm": "algorithm",
    "mu_carbon_usd_per_kg": "mu_carbon",
    "mu_water_usd_per_l": "mu_water",
    "eta": "eta",
    "z_max_usd": "z_max",
    "horizon": "horizon",
    "forecast": "forecast",
    "weight_carbon_usd_per_kg": "weight_carbon",
    "weight_water_usd_per_l": "weight_water",
    "model": "model",
    "variant": "variant",
    "min_accuracy": "min_accuracy",
}
_GEO_TEXT = ("algorithm", "forecast", "model", "variant")


def _geo_options(request: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for key, option in _GEO_OPTIONS.items():
        value = request.get(key)
        if value is None:
            continue
        if key in _GEO_TEXT:
            ok = isinstance(value, str)
        elif key == "horizon":
            ok = isinstance(value, int) and not isinstance(value, bool)
        else:
            ok = _number(value) is not None
        if not ok:
            raise InputError(
                f"request.{key} is {value!r}",
                hint="a geo request holds the options of `greenctl plan geo`, as it writes them",
            )
        options[option] = value
    return options


def _geo_path(request: dict[str, Any], key: str, *, required: bool = True) -> str | None:
    value = request.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str | Path) or not str(value):
        raise InputError(
            f"the geo request needs {key} (a CSV path)",
            hint="a geo request names its sites, demand (and routes) CSV files",
        )
    return str(value)


def _geo_plan(store: Any, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    """Plan ``request`` (a geo plan's ``request``, or what ``plan geo`` parsed): the
    ``sites``, ``demand`` and ``routes`` CSVs, heterogeneous variants from a ``family`` in
    the store or else a ``variants`` CSV, and ``plan geo``'s options under the names the
    plan records them (``mu_carbon_usd_per_kg``, ...). The plan's request records absolute
    paths (and the family), so the plan can be made again from anywhere.

    Returns:
        (the plan, the :class:`~greenctl.planner.geo.solve.GeoRun`: the problem and every
        algorithm's solution).
    """
    from greenctl.planner.geo import solve as geo

    problem, options, variants = geo_inputs(store, request)
    run = geo.run_geo(problem, variants=variants, **options)
    if request.get("family"):
        run.plan.request["family"] = request["family"]
    return run.plan, run


def geo_inputs(store: Any, request: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """What a geo ``request`` plans with, read afresh (the files' newest rows): the
    :class:`~greenctl.data.geo_io.GeoProblem`, ``run_geo``'s options and the variants (or
    None); bad options fail before the files are read.

    Raises:
        InputError: a bad option or path. FileFormatError: a bad file.
    """
    import numpy as np
    from greenctl.data.geo_io import (
        GeoVariants,
        load_geo_problem,
        read_variants,
        variants_from_store,
    )
    from greenctl.planner.geo import solve as geo

    family = request.get("family")
    if family is not None and not isinstance(family, str):
        raise InputError(f"request.family is {family!r}, not a family name")
    variants = variants_from_store(store, family) if family else None
    variants_file = None if family else _geo_path(request, "variants", required=False)
    options = _geo_options(request)
    checked = dict(options)
    if variants_file is not None:  # stands in for the file's variants in the option checks
        checked["variants"] = GeoVariants(["?"], np.ones(1), np.ones(1))
    elif variants is not None:
        checked["variants"] = variants
    geo.check_options(**checked)  # a bad option fails before the files are read
    paths = {
        k: _geo_path(request, k, required=k != "routes") for k in ("sites", "demand", "routes")
    }
    problem = load_geo_problem(paths["sites"] or "", paths["demand"] or "", paths["routes"])
    problem.sources = {k: str(Path(v).resolve()) for k, v in problem.sources.items()}
    if variants_file is not None:
        variants = read_variants(variants_file, problem.sites)
        variants.source = str(Path(variants_file).resolve())
    return problem, options, variants


def _geo_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """None: a geo plan is planned from its files (each site's carbon and water intensity,
    the demand per step); the region's signal and a load forecast are not its inputs."""
    note = (
        "a geo plan takes each site's carbon, water and demand from its sites and demand "
        "files: the region's signal"
        + (" and the load forecast are" if signal.forecast or signal.rate_rps else " is")
        + " not planned with"
    )
    return ReplanRequest(_base_request(running), None, [note])


def _geo_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    # a geo plan keeps each site's totals, not the per-step flows its objective is made of
    return None, "a geo plan records per-site totals, not its per-step allocation"


def _geo_objective(plan: Plan) -> Objective:
    # energy cost + mu_c x max-site carbon + mu_w x max-site water (USD)
    return "eGLB", _number(plan.predicted.get("objective")), False


KINDS: dict[str, PlanKind] = {
    "mix": PlanKind(
        "mix",
        plan=_mix_plan,
        score=_mix_score,
        replan_request=_mix_replan_request,
        objective=_mix_objective,
        carbon_aware=_mix_carbon_aware,
    ),
    "mig": PlanKind(
        "mig",
        plan=_mig_plan,
        score=_mig_score,
        replan_request=_mig_replan_request,
        objective=_mig_objective,
        carbon_aware=lambda plan: True,  # Clover: lambda * dCarbon + (1 - lambda) * dAccuracy
    ),
    "glet": PlanKind(
        "glet",
        plan=_glet_plan,
        score=_glet_score,
        replan_request=_glet_replan_request,
        objective=_glet_objective,
        time_shared=True,
        carbon_signal=False,
        triggers=_glet_triggers,
    ),
    "geo": PlanKind(
        "geo",
        plan=_geo_plan,
        score=_geo_score,
        score_checks_load=False,
        replan_request=_geo_replan_request,
        objective=_geo_objective,
        serves=False,
        not_served="it allocates load across sites, not instances on one cluster",
        not_served_hint="its figures are modeled by `greenctl plan geo`; plan, simulate and "
        "apply (or export) a mix/mig/glet plan for each site, and route with the geo plan's "
        "allocations: `greenctl apply GEO_PLAN --site NAME=URL ...` or `greenctl export envoy`",
    ),
}


def register(kind: PlanKind) -> None:
    """Add (or replace) a plan kind; plan documents of the kind can be read from then on."""
    KINDS[kind.name] = kind
    add_plan_kind(kind.name)


def unregister(name: str) -> None:
    """Remove a kind added with :func:`register` (a built-in kind is put back as it was)."""
    if name in BUILTIN:
        KINDS[name] = BUILTIN[name]
        return
    KINDS.pop(name, None)
    discard_plan_kind(name)


#: The built-in kinds, as :func:`unregister` restores them.
BUILTIN: dict[str, PlanKind] = dict(KINDS)


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
