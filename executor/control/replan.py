"""Replanning: parse a dwell, choose whether a new plan beats the running one (rules,
threshold, margin, dwell), hold the replan lock, replan once and record the decision,
simulate replans over a carbon trace, and the serving state a replan starts from."""

from __future__ import annotations

import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from greenctl.data import carbon as carbon_signal
from greenctl.data import limits, loop_state
from greenctl.data.carbon import signal_region
from greenctl.data.carbon_io import iso, normalise_time, parse_time
from greenctl.data.emissions import routes_carbon
from greenctl.data.errors import (
    GreenctlError,
    InfeasiblePlan,
    InputError,
    LockedError,
    NotFoundError,
)
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL_S, REPLAN_THRESHOLD
from greenctl.data.plan import load_plan_file
from greenctl.data.records import utcnow_iso
from greenctl.data.store import Store
from greenctl.executor.control.forecasters import get_forecaster, predict_load
from greenctl.executor.control.history import sample_dispatcher_load
from greenctl.executor.deploy import backends
from greenctl.executor.kinds import (
    KINDS,
    PlanKind,
    ReplanSignal,
    get_kind,
    plan_carbon,
    plan_problem,
)
from greenctl.executor.kinds.planning import Carbon

DECISION_ACTIONS = ("apply", "propose", "keep", "hold", "failed")


def parse_duration(text: str | float | int, *, option: str = "--min-dwell") -> float:
    """``90s``, ``15m``, ``1h``, ``2d`` or plain seconds -> seconds.

    Raises:
        InputError: not a duration.
    """
    if isinstance(text, int | float):
        value = float(text)
    else:
        s = str(text).strip().lower()
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        mult = 1.0
        if s and s[-1] in units:
            mult, s = units[s[-1]], s[:-1]
        try:
            value = float(s) * mult
        except ValueError:
            raise InputError(
                f"{option}: '{text}' is not a duration", hint="use e.g. 90s, 15m, 1h or 2d"
            ) from None
    if value < 0 or value != value:
        raise InputError(f"{option}: a duration must be >= 0, got {text}")
    return value


def check_replan_limits(threshold: float, margin: float) -> None:
    """Refuse a ``--threshold`` or ``--margin`` that is not a finite fraction >= 0 (NaN
    compares false with everything: it would pass every ``<`` check and never trigger).

    Raises:
        InputError: names the option and its value.
    """
    for option, value in (("--threshold", threshold), ("--margin", margin)):
        limits.bounded(value, option, "weight", hint=f"for example {option} 0.05 (5 %)")


def _resolve_plan(store: Store, plan: str | int) -> tuple[str, Any]:
    """(lineage key, base plan) for a plan id or a plan file; writes nothing: a file's plan
    not stored yet comes back without an id (:func:`_save_base` stores it once)."""
    text = str(plan).strip()
    if text.isdigit():
        return f"plan:{int(text)}", store.get_plan(int(text))
    path = Path(text).resolve()
    lineage = f"file:{path}"
    base = load_plan_file(path)
    if base.id is not None:  # a plan written by greenctl: reuse the stored copy if it matches
        try:
            stored = store.get_plan(int(base.id))
        except NotFoundError:
            stored = None
        if stored is not None and stored.kind == base.kind and same_config(stored, base):
            return lineage, stored
        base.id = None
    # the copy an earlier round saved of this file (decisions record the plan that serves,
    # which need not be the file's)
    doc = json.loads(base.to_json())
    for plan_id, document in loop_state.plan_documents(store, source="file", kind=base.kind):
        stored_doc = json.loads(document)
        stored_doc.pop("id", None)
        if stored_doc == doc:
            return lineage, store.get_plan(plan_id)
    return lineage, base


def _save_base(store: Store, base: Any) -> None:
    """Store a plan file's plan the first time its lineage is replanned (source 'file')."""
    if base.id is None:
        store.save_plan(base, source="file")


def _lineage_plan_ids(store: Store, lineage: str, base: Any) -> set[int]:
    """The base plan of ``lineage`` and every plan its rounds made (applied or proposed)."""
    ids = {int(base.id)} if base.id is not None else set()
    return ids | loop_state.lineage_new_plan_ids(store, lineage)


def _last_change(store: Store, lineage: str) -> dict[str, Any] | None:
    return loop_state.last_applied_decision(store, lineage)


def same_config(a: Any, b: Any) -> bool:
    def key(plan: Any) -> list[tuple[str, str, str, int, int]]:
        return sorted((d.model, d.variant, d.resource, d.batch, d.count) for d in plan.deployments)

    return key(a) == key(b)


def _replan_kind(
    store: Store,
    running: Any,
    *,
    intensity: float | None,
    rate: float | None = None,
    forecast: Callable[[str], float | None] | None = None,
    rates: Mapping[str, float] | None = None,
    carbon: Carbon | None = None,
) -> tuple[Any, float | None, str | None, Any]:
    """Plan ``running``'s kind again at ``intensity`` through the planning twin
    (:func:`~greenctl.executor.kinds.plan_problem`, which records ``carbon``, the signal's
    source, on the new plan), its request rewritten by the kind
    (:attr:`~greenctl.executor.kinds.PlanKind.replan_request`) for the plan's forecast load
    ``rate``, the per-model ``forecast`` or the given per-model ``rates``.

    Returns:
        (new plan, the running plan's objective in the same problem or None, a note, the
        :class:`~greenctl.executor.kinds.ReplanRequest`). The running plan is the new solve's
        current configuration (no loading cost for a mix, the warm start and kept layouts
        for MIG), and is scored in the same problem.
    """
    kind = get_kind(running.kind)
    assert kind.plan is not None and kind.score is not None  # checked by replan_once
    rewritten = kind.replan_request(
        running, ReplanSignal(intensity, rate_rps=rate, forecast=forecast, rates=rates)
    )
    new, problem = plan_problem(
        store, running.kind, rewritten.request, current=running, carbon=carbon
    )
    old_obj, note = kind.score(problem, running)
    return new, old_obj, note, rewritten


#: objectives closer than this (relative) tie: an exact solver returns either of two tied
#: optima, and adopting the other each time the signal moves only reconfigures (a mig replay
#: at 12 % load switched between two tied layouts every hour, 26 changes in 48 h)
TIE_TOLERANCE = 1e-9


def _improvement(maximise: bool, old: float | None, new: float | None) -> float | None:
    if old is None or new is None:
        return None
    gain = (new - old) if maximise else (old - new)
    return gain / max(abs(old), 1e-12)


def dwell_since(last_change_at: str, when: str, min_dwell_s: float) -> float | None:
    """Seconds from the last change to ``when`` while that is under ``min_dwell_s`` (no
    change yet), else None (a change may happen)."""
    if min_dwell_s <= 0:
        return None
    since = (parse_time(when) - parse_time(last_change_at)).total_seconds()
    return since if since < min_dwell_s else None


@dataclass
class ReplanChoice:
    """What a replanning round found (:func:`replan_choice`), before it acts."""

    #: the new plan (not saved)
    new: Any
    old_objective: float | None
    new_objective: float | None
    improvement: float | None
    #: the forecast load the rewritten request plans for (None: the planned rates stay)
    forecast_rps: float | None
    #: the best plan is the running configuration
    same: bool
    #: why a change is worth it (empty: it is not)
    triggers: list[str]
    #: notes of the round (the rewrite's, the scoring's), after the caller's
    notes: list[str]
    #: the signal and how far it moved, for a reason
    signal_text: str
    #: the reason when nothing triggers a change
    not_worth: str
    #: why the running plan cannot serve the forecast load (None: it can, or its kind
    #: cannot tell): a change then comes even within ``--min-dwell`` (:func:`dwell_yields`)
    overloaded: str | None = None


def dwell_yields(choice: ReplanChoice | Exception) -> bool:
    """Whether ``--min-dwell`` gives way in a round that found ``choice``: the running plan
    cannot serve the forecast load and a plan that can was found. The dwell guards against
    churn, not against overload: a plan held while it cannot carry the load misses the SLO
    until the dwell ends (replay measured 82-98 % of the SLO violations of a day under the
    default 1 h dwell behind such holds)."""
    return isinstance(choice, ReplanChoice) and choice.overloaded is not None and not choice.same


@dataclass
class ReplanRounds:
    """greenctl's replanning rounds in a what-if replay (:mod:`greenctl.executor.control.replay`, its
    glet twin), each decided as :func:`replan_once` decides it (:func:`replan_choice`, the
    dwell and :func:`dwell_yields`), and memoised by the caller's ``key``
    (what the round's decision reads: the running configuration, the signal, the rates).
    ``stats``: rounds that planned (``solves``), answered from the memo (``cached``), held by
    ``--min-dwell`` (``dwell_holds``) or changed within it (``dwell_yields``)."""

    min_dwell_s: float
    choices: dict[Any, Any] = field(default_factory=dict)
    stats: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("solves", "cached", "dwell_holds", "dwell_yields"), 0
        )
    )

    def decide(
        self, key: Any, plan: Callable[[], Any], *, last_change: str | None, when: str
    ) -> tuple[str, Any]:
        """One round at ``when``: ``plan()`` (``replan_choice`` for the round, memoised by
        ``key``; an :class:`InfeasiblePlan` counts as its answer) and the action, one of
        ``hold``, ``infeasible``, ``keep``, ``not-worth`` or ``change`` with the new plan."""
        held = (
            last_change is not None and dwell_since(last_change, when, self.min_dwell_s) is not None
        )
        choice = self.choices.get(key)
        if choice is None:
            self.stats["solves"] += 1
            try:
                choice = plan()
            except InfeasiblePlan as exc:
                choice = exc
            self.choices[key] = choice
        else:
            self.stats["cached"] += 1
        if held and not dwell_yields(choice):
            self.stats["dwell_holds"] += 1
            return "hold", None
        if held:
            self.stats["dwell_yields"] += 1
        if isinstance(choice, InfeasiblePlan):
            return "infeasible", None
        if choice.same:
            return "keep", None
        if not choice.triggers:
            return "not-worth", None
        return "change", choice.new


def replan_choice(
    store: Store,
    running: Any,
    *,
    signal: float | None,
    reference: float | None,
    threshold: float,
    margin: float,
    rate: float | None = None,
    forecast: Callable[[str], float | None] | None = None,
    rates: Mapping[str, float] | None = None,
    notes: list[str] | None = None,
    carbon: Carbon | None = None,
) -> ReplanChoice:
    """Plan ``running`` again at carbon intensity ``signal`` and the forecast load, score the
    running plan in the same problem and say whether a change is worth it: the signal moved
    by more than ``threshold`` from ``reference`` (or there is none), the running plan cannot
    be scored (it cannot carry the load), or the objective improves by more than ``margin``.
    A kind with its own :attr:`~greenctl.executor.kinds.PlanKind.triggers` decides instead of
    signal and margin (a glet plan: its GPU count changes, or more than ``threshold`` of its
    glets move). ``signal`` None: no region. ``rates``: models' rates by name (``--rate
    NAME=RPS``), over the forecast; ``carbon``: the signal's value and source
    (:func:`~greenctl.executor.kinds.plan_carbon`), recorded on the new plan. Shared by
    :func:`replan_once` and the what-if replay (:mod:`greenctl.executor.control.replay`);
    writes nothing.
    """
    kind = get_kind(running.kind)
    new, old_obj, note, rewritten = _replan_kind(
        store, running, intensity=signal, rate=rate, forecast=forecast, rates=rates, carbon=carbon
    )
    notes = [*(notes or []), *rewritten.notes]  # what the kind's rewrite left alone
    if note:
        notes.append(note)
    objective, new_obj, maximise = kind.objective(new)
    imp = _improvement(maximise, old_obj, new_obj)
    change = (
        None
        if reference is None or signal is None
        else abs(signal - reference) / max(reference, 1e-9)
    )
    if signal is None:
        load = rewritten.forecast_rps if rate is None else rate
        sig_txt = "no carbon region" + ("" if load is None else f"; load {load:.4g} req/s")
    else:
        sig_txt = f"carbon intensity {signal:.1f} g/kWh" + (
            "" if change is None else f" moved {change * 100:.1f} % from {reference:.1f}"
        )
    triggers: list[str] = []
    compared = ""
    if kind.triggers is not None:  # the kind's own rule (glet: GPUs, glets moved)
        triggers, compared = kind.triggers(running, new, threshold)
    elif (change is None or change > threshold) and not (imp is not None and imp <= TIE_TOLERANCE):
        # the signal moved, and the new plan is better than the running one in the new problem
        # (one that only ties it, or a heuristic's worse one, is no reason to reconfigure)
        triggers.append(
            "no reference signal"
            if change is None
            else f"signal moved {change * 100:.1f} % > {threshold * 100:g} %"
        )
    if old_obj is None:  # its reason is the trigger: the notes do not say it again
        triggers.append(notes.pop() if notes else "running plan not comparable")
    elif kind.triggers is None and imp is not None and imp > margin:
        triggers.append(f"{objective} objective improves {imp * 100:.1f} % > {margin * 100:g} %")
    if kind.triggers is not None:
        not_worth = f"{sig_txt}; {compared}: not worth a change"
    elif change is None or change > threshold:  # moved, but the new plan is no better
        not_worth = (
            f"{sig_txt}, but the new plan only ties the running one or is worse (the "
            f"{objective} objective improves {0.0 if imp is None else imp * 100:.2g} %): "
            "not worth a change"
        )
    else:
        not_worth = (
            f"{sig_txt} (<= {threshold * 100:g} %) and the {objective} objective "
            f"improves {0.0 if imp is None else imp * 100:.2f} % "
            f"(<= {margin * 100:g} %): not worth a change"
        )
    return ReplanChoice(
        new=new,
        old_objective=old_obj,
        new_objective=new_obj,
        improvement=imp,
        forecast_rps=rewritten.forecast_rps,
        same=same_config(new, running),
        triggers=triggers,
        notes=notes,
        signal_text=sig_txt,
        not_worth=not_worth,
        overloaded=(note or "the running plan cannot serve the forecast load")
        if old_obj is None and kind.score_checks_load
        else None,
    )


@contextmanager
def replan_lock(store: Store) -> Iterator[None]:
    """Keep two replans of one store from overlapping (``fcntl.flock``, non-blocking).

    Raises:
        LockedError: another replan holds the lock.
    """
    path = Path(str(store.path) + ".replan.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise LockedError(
                f"another greenctl replan is running (pid {holder}; lock {path})",
                hint="cron runs overlap: widen --every, or wait for the running one",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


ApplyFn = Callable[..., Any]


@dataclass(frozen=True)
class ReplanOptions:
    """What one replanning round (:func:`replan_once`) is asked to do."""

    #: the plan whose lineage is replanned: a stored plan's id or a plan file
    plan: str | int
    #: apply a better plan (else it is saved and proposed)
    apply: bool = False
    #: act when the signal moved by more than this (relative) since the running plan
    threshold: float = REPLAN_THRESHOLD
    #: ... or when the objective improves by more than this (relative)
    margin: float = REPLAN_MARGIN
    #: no change sooner than this after the last one, unless the running plan is overloaded
    min_dwell_s: float = REPLAN_MIN_DWELL_S
    #: the carbon region; None: the plan's, else the store's only one
    region: str | None = None
    #: the load forecaster (None: the planned rates stay)
    forecaster: str | None = None
    #: follow this model's forecast load, spread over the plan as planned
    load_model: str | None = None
    #: models' rates given by name (``--rate NAME=RPS``), over the forecast
    rates: Mapping[str, float] | None = None
    #: the time of the signal (ISO; None: now)
    at: str | None = None
    #: apply_fn(plan, store=..., **apply_options); None: on the backend that runs the plan
    apply_fn: ApplyFn | None = None
    apply_options: dict[str, Any] | None = None
    #: with a forecaster, first turn the dispatcher's counters into a load sample
    sample_load: bool = True


@dataclass
class _Round:
    """Where a round starts: the lineage, its running plan and what serves."""

    lineage: str
    base: Any
    last: dict[str, Any] | None
    running: Any
    serving: dict[str, Any]
    #: a plan of another lineage that serves (None: none)
    foreign: int | None


def replan_once(
    store: Store, options: ReplanOptions | None = None, /, **fields: Any
) -> dict[str, Any]:
    """One replanning round (the cron entry point's library twin), as ``options`` ask.

    Replan the running plan of ``plan``'s lineage at the carbon signal in force at ``at`` and,
    with ``forecaster``, the forecast peak load; act when :func:`replan_choice` finds a change
    worth it, respecting ``min_dwell_s`` unless the running plan cannot serve the forecast
    (:func:`dwell_yields`). ``apply``: apply the new plan (``apply_fn``), else save and propose
    it. Returns the decision record each round appends (``action``: apply|propose|keep|hold).

    Raises:
        LockedError: another replan runs. Other planning or applying errors are raised after a
        ``failed`` decision is recorded; the running plan is left as it was.
    """
    opts = options if options is not None else ReplanOptions(**fields)
    lineage, base = check_replan_options(store, opts)  # before anything is written
    at = _signal_time(opts.at)
    with replan_lock(store):
        _save_base(store, base)
        state = _start_round(store, lineage, base)
        kind = get_kind(state.running.kind)
        _check_replannable(kind, state.running, apply=opts.apply)
        reg = _carbon_region(store, kind, state.running, opts.region)
        record = _new_record(state, region=reg, when=at or utcnow_iso(), forecaster=opts.forecaster)
        try:  # the one rule every plan's intensity follows (plan mix/mig --region --at)
            ci = plan_carbon(store, kind, region=reg, at=at) if reg else None
        except GreenctlError as exc:
            _record(
                store,
                {key: record[key] for key in ("time", "at", "lineage", "region", "running_plan_id")}
                | {
                    "action": "failed",
                    "applied": 0,
                    "reason": f"no carbon signal: {exc.message}; the running plan is unchanged",
                },
            )
            raise
        _signal_change(record, state, ci)
        try:
            return _record(store, _decide(store, opts, state, kind, ci, record))
        except BaseException as exc:
            record["action"] = "failed"
            record["applied"] = 0
            msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            record["reason"] = f"{type(exc).__name__}: {msg}; the running plan is unchanged"
            _record(store, record)
            raise


def check_replan_options(store: Store, opts: ReplanOptions) -> tuple[str, Any]:
    """Check every option of a round before it writes anything (no decision row, no plan,
    no lock file for a refused one): the limits, the time, the plan and whether its kind can
    be replanned (and applied), the region, the forecaster and the ``--rate`` names (by the
    kind's own request rewrite, the rule the round itself follows).

    Returns:
        (the lineage key, its base plan), as :func:`_resolve_plan`.

    Raises:
        InputError / NotFoundError: names the option and the fix.
    """
    check_replan_limits(opts.threshold, opts.margin)
    _signal_time(opts.at)
    lineage, base = _resolve_plan(store, opts.plan)
    last = _last_change(store, lineage)
    running = store.get_plan(int(last["new_plan_id"])) if last else base
    kind = get_kind(running.kind)
    _check_replannable(kind, running, apply=opts.apply)
    reg = _carbon_region(store, kind, running, opts.region)
    if opts.region is not None and reg is not None:
        carbon_signal.latest(store, reg)  # a region with no signal at all is refused here
    if opts.forecaster:
        get_forecaster(store, opts.forecaster)
    if opts.rates:
        kind.replan_request(running, ReplanSignal(None, rates=opts.rates))
    return lineage, base


def _start_round(store: Store, lineage: str, base: Any) -> _Round:
    """``lineage``'s running plan (the last change's, else ``base``) and what serves: a
    proposal of this lineage applied by hand is the running plan; the running configuration
    re-applied at another intensity (a ``keep`` that applied) is not a change of plan."""
    last = _last_change(store, lineage)
    running = store.get_plan(int(last["new_plan_id"])) if last else base
    serving = serving_state(store)
    serving_id = serving["plan_id"]
    foreign = None
    if serving["live"] and serving_id != running.id:
        if _serves_config_of(store, serving_id, running):
            pass  # the running configuration serves
        elif serving_id is not None and serving_id in _lineage_plan_ids(store, lineage, base):
            running = store.get_plan(serving_id)  # this lineage's proposal, applied by hand
        else:
            foreign = serving_id
    return _Round(lineage, base, last, running, serving, foreign)


def _check_replannable(kind: PlanKind, running: Any, *, apply: bool) -> None:
    """Refuse a kind the registry cannot replan, or ``--apply`` of a plan that is not served."""
    if not kind.replannable:
        able = ", ".join(k for k, v in KINDS.items() if v.replannable)
        raise InputError(
            f"replan supports {able} plans; plan {running.id} is a {running.kind} plan",
            hint="re-run its planner with the new signal (`greenctl plan ...`)",
        )
    if apply and not kind.serves:
        raise InputError(
            f"replan --apply cannot apply plan {running.id}, a {kind.name} plan: {kind.not_served}",
            hint="replan without --apply: a better plan is saved and proposed",
        )


def _carbon_region(store: Store, kind: PlanKind, running: Any, region: str | None) -> str | None:
    """The region whose signal the round reads: named, else the plan's, else (a kind that
    plans with the signal) the store's only one (:func:`greenctl.data.carbon.signal_region`).

    Raises:
        InputError: a kind that plans with the signal and no region.
    """
    reg = region or running.extra.get("carbon_region") or running.request.get("carbon_region")
    if kind.carbon_signal:
        reg = signal_region(store, reg)
        if not reg:  # (a glet plan plans no carbon: none needed)
            raise InputError(
                "no carbon region to replan for", hint="pass --region R (see `carbon regions`)"
            )
    return reg


def _signal_time(at: str | None) -> str | None:
    if at is None:
        return None
    try:
        return normalise_time(at)
    except ValueError as exc:
        raise InputError(f"--at: {exc}") from None


def _new_record(
    state: _Round, *, region: str | None, when: str, forecaster: str | None
) -> dict[str, Any]:
    """The decision record a round fills in (``hold`` until it decides)."""
    return {
        "time": utcnow_iso(),
        "at": when,
        "lineage": state.lineage,
        "region": region,
        "signal_g_per_kwh": None,
        "reference_g_per_kwh": None,
        "signal_change": None,
        "forecaster": forecaster,
        "forecast_rps": None,
        "running_plan_id": state.serving["plan_id"],  # what really serves (None: nothing)
        "new_plan_id": None,
        "old_objective": get_kind(state.running.kind).objective(state.running)[1],
        "new_objective": None,
        "improvement": None,
        "action": "hold",
        "applied": 0,
        "reason": "",
    }


def _signal_change(record: dict[str, Any], state: _Round, ci: Carbon | None) -> None:
    """The signal, the reference it is compared with (the last change's, else the running
    plan's intensity) and how far it moved, into ``record``."""
    signal = None if ci is None else float(ci["carbon_g_per_kwh"])
    ref = None
    if state.last is not None and state.last.get("signal_g_per_kwh") is not None:
        ref = float(state.last["signal_g_per_kwh"])
    elif state.running.request.get("carbon_intensity") is not None:
        ref = float(state.running.request["carbon_intensity"])
    record["signal_g_per_kwh"] = signal
    record["reference_g_per_kwh"] = ref
    if ref is not None and signal is not None:
        record["signal_change"] = abs(signal - ref) / max(ref, 1e-9)


def _decide(
    store: Store,
    opts: ReplanOptions,
    state: _Round,
    kind: PlanKind,
    ci: Carbon | None,
    record: dict[str, Any],
) -> dict[str, Any]:
    """The round's decision: hold for a foreign plan or within the dwell, else plan, choose
    and act (:func:`_act`); ``record`` filled in and returned."""
    serving, running = state.serving, state.running
    if state.foreign is not None or (serving["live"] and serving["plan_id"] is None):
        record["reason"] = _foreign_reason(state)
        return record
    recover = opts.apply and not serving["live"]  # nothing serves: apply the best plan now
    dwell = ""  # within --min-dwell: the round holds unless the dwell yields
    if state.last is not None and not recover:
        since = dwell_since(state.last["at"] or state.last["time"], record["at"], opts.min_dwell_s)
        if since is not None:
            dwell = (
                f"min dwell: last change at {state.last['at']} was {since / 60:.0f} min ago "
                f"(< {opts.min_dwell_s / 60:.0f} min)"
            )
    rate, forecast, notes = _forecast(store, opts)
    try:
        choice = replan_choice(
            store, running, signal=record["signal_g_per_kwh"],
            reference=record["reference_g_per_kwh"], threshold=opts.threshold,
            margin=opts.margin, rate=rate, forecast=forecast, rates=opts.rates, notes=notes,
            carbon=ci,
        )  # fmt: skip
    except GreenctlError:
        if not dwell:
            raise
        record["reason"] = dwell  # within the dwell the running plan stays whatever it is
        return record
    record["forecast_rps"] = rate if rate is not None else choice.forecast_rps
    if dwell and not dwell_yields(choice):
        record["reason"] = dwell
        return record
    notes = choice.notes
    if dwell:  # the running plan cannot serve the forecast (the trigger): a change comes now
        notes = [*choice.notes, f"{dwell}, yields to the overload"]
    record["old_objective"] = choice.old_objective
    record["new_objective"] = choice.new_objective
    record["improvement"] = choice.improvement
    _act(store, opts, state, kind, choice, record, recover=recover, signal=ci is not None)
    if not serving["live"] and not record["applied"]:
        notes.append(
            f"nothing is serving: {serving['why']}; `greenctl apply` the plan, or "
            "replan with --apply"
        )
    if notes:
        record["reason"] += " (" + "; ".join(notes) + ")"
    return record


def _foreign_reason(state: _Round) -> str:
    """Why a round holds while a plan of another lineage (or one with no id) serves."""
    foreign, running = state.foreign, state.running
    which = "a plan greenctl has no id for" if foreign is None else f"plan {foreign}"
    return (
        f"{which} serves, not plan {running.id} of {state.lineage}: it was applied "
        "outside this lineage and is left as it is"
        + (
            ""
            if foreign is None
            else f" (keep it current with `greenctl replan --plan {foreign}`, "
            f"or `greenctl apply` plan {running.id} to return to this lineage)"
        )
    )


def _forecast(
    store: Store, opts: ReplanOptions
) -> tuple[float | None, Callable[[str], float | None] | None, list[str]]:
    """(the plan's forecast load with ``load_model``, the per-model forecast otherwise,
    notes); nothing without a forecaster. Cron runs double as the load sampler: the
    dispatcher's counters since the last run become a load_history row."""
    if not opts.forecaster:
        return None, None, []
    if opts.sample_load:
        sample_dispatcher_load(store)
    forecast = _forecast_peak(store, opts.forecaster)
    if opts.load_model is None:
        return None, forecast, []
    rate = forecast(opts.load_model)  # the plan follows this model's load
    return rate, None, [] if rate is not None else ["no measured load yet: planned rate kept"]


def _act(
    store: Store,
    opts: ReplanOptions,
    state: _Round,
    kind: PlanKind,
    choice: ReplanChoice,
    record: dict[str, Any],
    *,
    recover: bool,
    signal: bool,
) -> None:
    """Carry out the choice: apply the best plan when nothing serves (``recover``), keep
    the running configuration (re-applying it at the new signal's intensity), or save and
    propose or apply a change worth it; the action and reason into ``record``."""
    serving, running, new = state.serving, state.running, choice.new
    apply_fn = opts.apply_fn or _default_apply
    sig_txt = choice.signal_text
    if recover:
        target = running if same_config(new, running) else new
        if target is new:
            store.save_plan(new, source="replan")
        record["new_plan_id"] = target.id
        record["new_objective"] = kind.objective(target)[1]
        record["reason"] = (
            f"nothing is serving ({serving['why']}); {sig_txt}; applied the best plan, "
            f"plan {target.id}"
        )
        apply_fn(target, store=store, **(opts.apply_options or {}))
        record["action"], record["applied"] = "apply", 1
    elif choice.same:
        record["action"] = "keep"
        record["reason"] = (
            f"{sig_txt}; the best plan is the running configuration"
            if serving["live"]
            else f"{sig_txt}; the best plan is plan {running.id}'s configuration"
        )
        if opts.apply and serving["live"] and signal:
            # the configuration stays, the grid moved: its counters follow the grid
            counted = _count_at_signal(
                store, serving["plan_id"], new, apply_fn, opts.apply_options, record=record
            )
            if counted:
                record["reason"] += f"; {counted}"
    elif not choice.triggers:
        record["reason"] = choice.not_worth
    else:
        store.save_plan(new, source="replan")
        record["new_plan_id"] = new.id
        record["reason"] = "; ".join(choice.triggers)
        if opts.apply:
            apply_fn(new, store=store, **(opts.apply_options or {}))
            record["action"], record["applied"] = "apply", 1
        else:
            record["action"] = "propose"
            record["reason"] += f"; apply with `greenctl apply` plan {new.id}"


def serving_state(store: Store) -> dict[str, Any]:
    """What really serves, asked of the backend that runs the plan (live processes or
    replicas, not the rows of the last apply; :func:`greenctl.executor.deploy.backends.serving`):
    ``backend``, ``live``, ``plan_id`` (the plan that serves) and ``why`` nothing serves when
    not ``live``."""
    return backends.serving(store).to_dict()


def _serves_config_of(store: Store, plan_id: int | None, plan: Any) -> bool:
    """Whether stored plan ``plan_id`` is ``plan``'s configuration (e.g. the same plan file
    applied with `greenctl apply`, which stores a copy)."""
    if plan_id is None:
        return False
    try:
        other = store.get_plan(plan_id)
    except NotFoundError:
        return False
    return bool(other.kind == plan.kind and same_config(other, plan))


def _forecast_peak(store: Store, forecaster: str) -> Callable[[str], float | None]:
    """forecast(model) -> ``forecaster``'s next peak of ``model``'s measured load, None when
    none is measured (what a kind's replan rewrite asks, model by model)."""
    get_forecaster(store, forecaster)  # an unknown forecaster fails whichever kind replans
    cache: dict[str, float | None] = {}

    def forecast(model: str) -> float | None:
        if model not in cache:
            try:
                pred = predict_load(store, forecaster=forecaster, model=model)
                cache[model] = float(pred["predicted_peak_rps"])
            except InputError as exc:
                if "no measured load" not in exc.message:
                    raise
                cache[model] = None
        return cache[model]

    return forecast


def _count_at_signal(
    store: Store,
    serving_id: int | None,
    new: Any,
    apply_fn: Callable[..., Any],
    apply_options: dict[str, Any] | None,
    *,
    record: dict[str, Any] | None = None,
) -> str | None:
    """Make the running deployment count carbon at the intensity ``new`` records (the running
    configuration replanned at the round's signal) when the serving plan (``serving_id``)
    counts at another. ``new`` is saved and applied through ``apply_fn`` on the plan's
    backend; for the same configuration that only re-applies the routes with the new
    ``carbon`` (nothing restarts). ``record`` then says ``applied`` and ``new_plan_id`` while
    its action stays ``keep``: the lineage's running plan, reference signal and dwell stay.

    Returns:
        What was done, for the decision's reason (also when the apply failed: the
        deployment then counts as before); None when nothing needed doing.
    """
    if serving_id is None:
        return None
    try:
        counting = routes_carbon(store.get_plan(int(serving_id)))
    except NotFoundError:
        return None
    want = routes_carbon(new)
    if want is None or (
        counting is not None and all(math.isclose(counting[k], want[k], rel_tol=1e-9) for k in want)
    ):
        return None
    was = "no intensity" if counting is None else f"{counting['carbon_g_per_kwh']:g} g/kWh"
    store.save_plan(new, source="replan")
    try:
        apply_fn(new, store=store, **(apply_options or {}))
    except GreenctlError as exc:
        return (
            f"the running deployment still counts carbon at {was}: applying plan {new.id} "
            f"(its configuration at {want['carbon_g_per_kwh']:g} g/kWh) failed: {exc.message}"
        )
    if record is not None:
        record["new_plan_id"], record["applied"] = new.id, 1
    return (
        f"applied plan {new.id}, that configuration at this signal, in place: the running "
        f"deployment counts carbon at {want['carbon_g_per_kwh']:g} g/kWh from now on "
        f"(was {was})"
    )


def _default_apply(plan: Any, *, store: Store, **options: Any) -> Any:
    """Apply on the backend that runs the plan (or ran it last), as it was applied there."""
    return backends.apply_where_running(plan, store=store, **options)


def _record(store: Store, record: dict[str, Any]) -> dict[str, Any]:
    return record_decision(store, record)


def record_decision(store: Store, record: dict[str, Any]) -> dict[str, Any]:
    """Append a replanning decision record (one transaction); returns it with its ``id``
    and ``applied`` as a bool. Every replan writes one, whichever kind it replans."""
    with store.transaction():
        record["id"] = loop_state.add_decision(store, record)
    out = dict(record)
    out["applied"] = bool(out["applied"])
    return out


def simulate_replans(
    store: Store,
    *,
    plan: str | int,
    region: str,
    start: str,
    hours: float,
    step_h: float = 1.0,
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Run :func:`replan_once` at signal times ``start``, ``start + step_h``, ... (a replay
    of a carbon trace, as the demo does). Options are passed to ``replan_once``."""
    t0 = parse_time(start)
    n = int(hours / step_h) + 1
    out = []
    for k in range(n):
        at = iso(t0 + timedelta(hours=k * step_h))
        d = replan_once(store, plan=plan, region=region, at=at, **options)
        out.append(d)
        if progress:
            progress(k + 1, n, d)
    return out
