"""The control loop: load history and forecasters, replanning, cron, and the demo.

It observes (the carbon signal, the dispatcher's counters), decides (replans through the
planners) and reconciles (applies through the executor), recording why. No typer or rich:
the commands in ``cli/forecast.py``, ``cli/replan.py`` and ``cli/demo.py`` are thin wrappers
over the functions here, which take keyword-only options and return plain data.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data import deployments, loop_state
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL_S, REPLAN_THRESHOLD
from greenctl.data.records import utcnow_iso


# -- load history and forecasters -------------------------------------------------------------
@dataclass
class LoadSample:
    """A measured request rate over an interval starting at ``time``."""

    time: str
    rate_rps: float
    interval_s: float = 60.0
    model: str = ""
    source: str = "measured"


def record_load(store: Any, samples: Iterable[LoadSample]) -> int:
    """Append measured load samples to ``load_history`` (one transaction)."""
    rows = [
        {
            "time": s.time,
            "model": s.model,
            "rate_rps": float(s.rate_rps),
            "interval_s": float(s.interval_s),
            "source": s.source,
        }
        for s in samples
    ]
    with store.transaction():
        loop_state.add_load_rows(store, rows)
    return len(rows)


def load_history_minutes(store: Any, *, model: str | None = None) -> Any:
    """The store's measured load as per-minute maxima (numpy array, oldest first)."""
    import numpy as np

    return np.asarray(loop_state.load_minute_peaks(store, model=model), dtype=float)


def _history(store: Any, *, trace: str | None, model: str | None) -> tuple[Any, str]:
    from greenctl.data.traces import read_rps_trace
    from greenctl.planner.core import forecast as fc

    if trace:
        return fc.minute_maxima(read_rps_trace(trace)), f"trace:{Path(trace).name}"
    minutes = load_history_minutes(store, model=model)
    if minutes.size == 0:
        raise InputError(
            "the store holds no measured load" + (f" for model '{model}'" if model else ""),
            hint="pass --trace FILE (requests per second), or run load through `greenctl apply`",
        )
    return minutes, "store" + (f":{model}" if model else "")


def fit_forecaster(
    store: Any,
    *,
    kind: str = "lstm",
    name: str | None = None,
    trace: str | None = None,
    model: str | None = None,
    train_days: float | None = None,
    params: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fit a forecaster on a trace or the store's load, score it on the rest, save it.

    With ``train_days`` the first days train and the remainder is scored; otherwise the
    first 80 % trains and the last 20 % is scored.

    Returns:
        ``{"name", "kind", "trained_on", "train_minutes", "test_minutes", "metrics"}``.
    """
    from greenctl.planner.core import forecast as fc

    minutes, source = _history(store, trace=trace, model=model)
    f = fc.make_forecaster(kind, **(params or {}))
    n = minutes.size
    train = int(train_days * 1440) if train_days else max(int(n * 0.8), 1)
    if train_days and not 1 <= train < n:
        raise InputError(
            f"--train-days {train_days:g} leaves no test minutes ({n} minutes of history)"
        )
    train = min(train, n)
    f.fit(minutes[:train])
    metrics = fc.evaluate(f, minutes, train=train).to_dict() if train < n else {}
    name = name or kind
    p, state = f.to_state()
    with store.transaction():
        loop_state.save_forecaster(
            store,
            {
                "name": name,
                "kind": kind,
                "params": json.dumps(p),
                "state": state,
                "trained_on": source,
                "metrics": json.dumps(metrics),
                "created_at": utcnow_iso(),
            },
        )
    return {
        "name": name,
        "kind": kind,
        "trained_on": source,
        "train_minutes": train,
        "test_minutes": n - train,
        "metrics": metrics,
    }


def get_forecaster(store: Any, name: str) -> Any:
    """A saved forecaster by name; the rule-based kinds work unsaved under their own name.

    Raises:
        NotFoundError: neither a saved forecaster nor a rule-based kind.
    """
    from greenctl.planner.core import forecast as fc

    r = loop_state.forecaster_row(store, name)
    if r is not None:
        return fc.restore_forecaster(r["kind"], json.loads(r["params"]), r["state"])
    if name in ("last", "moving-max", "seasonal-naive"):
        return fc.make_forecaster(name)
    known = [r["name"] for r in loop_state.forecaster_rows(store)]
    raise NotFoundError(
        f"no forecaster named '{name}'",
        hint=(f"saved: {', '.join(known)}; " if known else "")
        + "fit one with `greenctl forecast fit`, or use last, moving-max, seasonal-naive",
    )


def list_forecasters(store: Any) -> list[dict[str, Any]]:
    """Saved forecasters (without their binary state)."""
    out = []
    for r in loop_state.forecaster_rows(store):
        out.append(
            {
                "name": r["name"],
                "kind": r["kind"],
                "trained_on": r["trained_on"],
                "created_at": r["created_at"],
                "params": json.loads(r["params"]),
                "metrics": json.loads(r["metrics"] or "{}"),
            }
        )
    return out


def predict_load(
    store: Any,
    *,
    forecaster: str = "last",
    trace: str | None = None,
    model: str | None = None,
    upto_minute: int | None = None,
) -> dict[str, Any]:
    """Predict the next minute's peak request rate after the history (or its first
    ``upto_minute`` minutes).

    Returns:
        ``{"forecaster", "source", "history_minutes", "last_peak_rps", "predicted_peak_rps"}``.
    """
    minutes, source = _history(store, trace=trace, model=model)
    if upto_minute is not None:
        if not 1 <= upto_minute <= minutes.size:
            raise InputError(f"--upto-minute must be between 1 and {minutes.size}")
        minutes = minutes[:upto_minute]
    f = get_forecaster(store, forecaster)
    return {
        "forecaster": forecaster,
        "kind": f.name,
        "source": source,
        "history_minutes": int(minutes.size),
        "last_peak_rps": float(minutes[-1]),
        "predicted_peak_rps": float(f.predict_next(minutes)),
    }


# -- replanning -------------------------------------------------------------------------------
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


def _resolve_plan(store: Any, plan: str | int) -> tuple[str, Any]:
    """(lineage key, base plan) for a plan id or a plan file (saved once, source 'file')."""
    from greenctl.data.plan import load_plan_file

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
        if stored is not None and stored.kind == base.kind and _same_config(stored, base):
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
    store.save_plan(base, source="file")
    return lineage, base


def _lineage_plan_ids(store: Any, lineage: str, base: Any) -> set[int]:
    """The base plan of ``lineage`` and every plan its rounds made (applied or proposed)."""
    ids = {int(base.id)} if base.id is not None else set()
    return ids | loop_state.lineage_new_plan_ids(store, lineage)


def _last_change(store: Any, lineage: str) -> dict[str, Any] | None:
    return loop_state.last_applied_decision(store, lineage)


def _same_config(a: Any, b: Any) -> bool:
    def key(plan: Any) -> list[tuple[str, str, str, int, int]]:
        return sorted((d.model, d.variant, d.resource, d.batch, d.count) for d in plan.deployments)

    return key(a) == key(b)


def _replan_kind(
    store: Any,
    running: Any,
    *,
    intensity: float | None,
    rate: float | None = None,
    forecast: Callable[[str], float | None] | None = None,
    rates: Mapping[str, float] | None = None,
) -> tuple[Any, float | None, str | None, Any]:
    """Plan ``running``'s kind again at ``intensity`` through the registry, its request
    rewritten by the kind (:attr:`~greenctl.executor.kinds.PlanKind.replan_request`) for the
    plan's forecast load ``rate``, the per-model ``forecast`` or the given per-model
    ``rates``.

    Returns:
        (new plan, the running plan's objective in the same problem or None, a note, the
        :class:`~greenctl.executor.kinds.ReplanRequest`). The running plan is the new solve's
        current configuration (no loading cost for a mix, the warm start and kept layouts
        for MIG), and is scored in the same problem.
    """
    from greenctl.executor.kinds import ReplanSignal, get_kind

    kind = get_kind(running.kind)
    assert kind.plan is not None and kind.score is not None  # checked by replan_once
    rewritten = kind.replan_request(
        running, ReplanSignal(intensity, rate_rps=rate, forecast=forecast, rates=rates)
    )
    new, problem = kind.plan(store, rewritten.request, current=running)
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
    from greenctl.data.carbon_io import parse_time

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
    """greenctl's replanning rounds in a what-if replay (:mod:`greenctl.executor.replay`, its
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
        from greenctl.data.errors import InfeasiblePlan

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
    store: Any,
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
) -> ReplanChoice:
    """Plan ``running`` again at carbon intensity ``signal`` and the forecast load, score the
    running plan in the same problem and say whether a change is worth it: the signal moved
    by more than ``threshold`` from ``reference`` (or there is none), the running plan cannot
    be scored (it cannot carry the load), or the objective improves by more than ``margin``.
    A kind with its own :attr:`~greenctl.executor.kinds.PlanKind.triggers` decides instead of
    the signal and the margin (a glet plan: its GPU count changes, or more than ``threshold``
    of its glets move); ``signal`` None: no region (a kind that plans no carbon). ``rates``:
    models' rates given by name (``--rate NAME=RPS``), over the forecast.

    The decision of :func:`replan_once` (which adds the store, the dwell and applying) and of
    the what-if replay (:mod:`greenctl.executor.replay`); it writes nothing.
    """
    from greenctl.executor.kinds import get_kind

    kind = get_kind(running.kind)
    new, old_obj, note, rewritten = _replan_kind(
        store, running, intensity=signal, rate=rate, forecast=forecast, rates=rates
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
    triggers = []
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
    if old_obj is None:
        triggers.append(notes[-1] if notes else "running plan not comparable")
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
        same=_same_config(new, running),
        triggers=triggers,
        notes=notes,
        signal_text=sig_txt,
        not_worth=not_worth,
        overloaded=(note or "the running plan cannot serve the forecast load")
        if old_obj is None and kind.score_checks_load
        else None,
    )


@contextmanager
def replan_lock(store: Any) -> Iterator[None]:
    """Keep two replans of one store from overlapping (``fcntl.flock``, non-blocking).

    Raises:
        LockedError: another replan holds the lock.
    """
    import fcntl
    import os

    from greenctl.data.errors import LockedError

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


def replan_once(
    store: Any,
    *,
    plan: str | int,
    apply: bool = False,
    threshold: float = REPLAN_THRESHOLD,
    margin: float = REPLAN_MARGIN,
    min_dwell_s: float = REPLAN_MIN_DWELL_S,
    region: str | None = None,
    forecaster: str | None = None,
    load_model: str | None = None,
    rates: Mapping[str, float] | None = None,
    at: str | None = None,
    apply_fn: ApplyFn | None = None,
    apply_options: dict[str, Any] | None = None,
    sample_load: bool = True,
) -> dict[str, Any]:
    """One replanning round (the cron entry point's library twin).

    Redo the running plan of ``plan``'s lineage with the carbon signal in force at ``at``
    (default now) and, with ``forecaster``, the forecast peak load (of each model the kind's
    request rewrite asks for, :attr:`~greenctl.executor.kinds.PlanKind.replan_request`; with
    ``load_model``, that model's load spread over the plan as planned); compare the new
    plan's objective with the running plan's in the same problem; act when the signal moved
    by more than ``threshold`` since the running plan was chosen, or the objective improves
    by more than ``margin`` (:func:`replan_choice`: a glet plan acts when its GPU count
    changes or more than ``threshold`` of its glets move; a running plan that cannot carry
    the load is replaced), and not sooner than ``min_dwell_s`` after the last change unless
    the running plan cannot serve the forecast load (:func:`dwell_yields`; the round plans
    and scores either way). ``rates`` (``--rate NAME=RPS``) set models' rates by name, over
    the forecast; the carbon region is ``region``, else the plan's, else the store's only
    one (:func:`greenctl.data.carbon.signal_region`, as `plan mix` takes it); a kind that
    plans no carbon (a glet plan) needs no region. With
    ``apply`` the new plan is applied (``apply_fn``, default: on the backend that runs the
    plan, :func:`greenctl.executor.deploy.backends.apply_where_running`, with ``apply_options``);
    otherwise it is saved and proposed. Every round appends a decision record. With a
    forecaster and ``sample_load``, the running dispatcher's request counters are first
    turned into a ``load_history`` sample (so cron runs collect the load they forecast).

    What serves is asked of the backend that runs the plan (live processes or replicas,
    :func:`serving_state`), and
    ``running_plan_id`` records it (None: nothing serves). When nothing serves (after
    ``greenctl down`` or a reboot), ``apply`` applies the best plan at once, whatever the
    dwell, threshold and margin. A plan of another lineage serving is left alone (``hold``,
    naming it); a plan this lineage proposed and someone applied by hand is the running one.
    A round that keeps the running configuration while the signal moved (with ``apply``)
    re-applies it at the new intensity, routes only, so the deployment's carbon counters go
    on at the live intensity (:func:`_count_at_signal`; the decision's reason says so).

    Returns:
        The decision record (``action`` one of apply | propose | keep | hold).

    Raises:
        LockedError: another replan runs. Any error of planning or applying, after a
        ``failed`` decision is recorded; the running plan is left as it was.
    """
    from greenctl.data import carbon
    from greenctl.data.carbon_io import normalise_time
    from greenctl.data.errors import GreenctlError

    if threshold < 0 or margin < 0:
        raise InputError("--threshold and --margin must be >= 0")
    with replan_lock(store):
        lineage, base = _resolve_plan(store, plan)
        last = _last_change(store, lineage)
        running = store.get_plan(int(last["new_plan_id"])) if last else base
        serving = serving_state(store)
        serving_id = serving["plan_id"]
        foreign = None  # a plan of another lineage serves
        if serving["live"] and serving_id != running.id:
            if serving_id is not None and serving_id in _lineage_plan_ids(store, lineage, base):
                running = store.get_plan(serving_id)  # this lineage's proposal, applied by hand
            elif not _serves_config_of(store, serving_id, running):
                foreign = serving_id
        from greenctl.executor.kinds import KINDS, get_kind

        kind = get_kind(running.kind)
        if not kind.replannable:
            able = ", ".join(k for k, v in KINDS.items() if v.replannable)
            raise InputError(
                f"replan supports {able} plans; plan {running.id} is a {running.kind} plan",
                hint="re-run its planner with the new signal (`greenctl plan ...`)",
            )
        if apply and not kind.serves:
            raise InputError(
                f"replan --apply cannot apply plan {running.id}, a {kind.name} plan: "
                f"{kind.not_served}",
                hint="replan without --apply: a better plan is saved and proposed",
            )
        reg = region or running.extra.get("carbon_region") or running.request.get("carbon_region")
        if kind.carbon_signal:  # the region its planner takes: named, else the store's only one
            reg = carbon.signal_region(store, reg)
        if not reg and kind.carbon_signal:  # (a glet plan plans no carbon: none needed)
            raise InputError(
                "no carbon region to replan for", hint="pass --region R (see `carbon regions`)"
            )
        if at is not None:
            try:
                at = normalise_time(at)
            except ValueError as exc:
                raise InputError(f"--at: {exc}") from None
        when = at or utcnow_iso()
        try:  # the one rule every plan's intensity follows (plan mix/mig --region --at)
            ci = carbon.plan_intensity(store, region=reg, at=at) if reg else None
        except GreenctlError as exc:
            _record(
                store,
                {
                    "time": utcnow_iso(),
                    "at": when,
                    "lineage": lineage,
                    "region": reg,
                    "running_plan_id": serving_id,
                    "action": "failed",
                    "applied": 0,
                    "reason": f"no carbon signal: {exc.message}; the running plan is unchanged",
                },
            )
            raise
        signal = None if ci is None else float(ci["carbon_g_per_kwh"])
        ref = None
        if last is not None and last.get("signal_g_per_kwh") is not None:
            ref = float(last["signal_g_per_kwh"])
        elif running.request.get("carbon_intensity") is not None:
            ref = float(running.request["carbon_intensity"])
        change = None if ref is None or signal is None else abs(signal - ref) / max(ref, 1e-9)
        record: dict[str, Any] = {
            "time": utcnow_iso(),
            "at": when,
            "lineage": lineage,
            "region": reg,
            "signal_g_per_kwh": signal,
            "reference_g_per_kwh": ref,
            "signal_change": change,
            "forecaster": forecaster,
            "forecast_rps": None,
            "running_plan_id": serving_id,  # what really serves (None: nothing)
            "new_plan_id": None,
            "old_objective": kind.objective(running)[1],
            "new_objective": None,
            "improvement": None,
            "action": "hold",
            "applied": 0,
            "reason": "",
        }
        try:
            if foreign is not None or (serving["live"] and serving_id is None):
                which = "a plan greenctl has no id for" if foreign is None else f"plan {foreign}"
                record["reason"] = (
                    f"{which} serves, not plan {running.id} of {lineage}: it was applied "
                    "outside this lineage and is left as it is"
                    + (
                        ""
                        if foreign is None
                        else f" (keep it current with `greenctl replan --plan {foreign}`, "
                        f"or `greenctl apply` plan {running.id} to return to this lineage)"
                    )
                )
                return _record(store, record)
            recover = apply and not serving["live"]  # nothing serves: apply the best plan now
            dwell = ""  # within --min-dwell: the round holds unless the dwell yields
            if last is not None and not recover:
                since = dwell_since(last["at"] or last["time"], when, min_dwell_s)
                if since is not None:
                    dwell = (
                        f"min dwell: last change at {last['at']} was {since / 60:.0f} min ago "
                        f"(< {min_dwell_s / 60:.0f} min)"
                    )
            rate = None
            forecast = None
            notes = []
            if forecaster:
                # cron runs double as the load sampler: the dispatcher's counters since the
                # last run become a load_history row (nothing when no dispatcher runs)
                if sample_load:
                    sample_dispatcher_load(store)
                forecast = _forecast_peak(store, forecaster)
                if load_model is not None:  # the plan follows this model's load
                    rate = forecast(load_model)
                    if rate is None:
                        notes.append("no measured load yet: planned rate kept")
                    forecast = None
            try:
                choice = replan_choice(
                    store, running, signal=signal, reference=ref, threshold=threshold,
                    margin=margin, rate=rate, forecast=forecast, rates=rates, notes=notes,
                )  # fmt: skip
            except GreenctlError:
                if not dwell:
                    raise
                # within the dwell the running plan stays whatever a new plan would be
                record["reason"] = dwell
                return _record(store, record)
            if dwell and not dwell_yields(choice):
                record["forecast_rps"] = rate if rate is not None else choice.forecast_rps
                record["reason"] = dwell
                return _record(store, record)
            if dwell:  # the running plan cannot serve the forecast: a change comes now
                notes = [*choice.notes, f"{dwell}, yields: {choice.overloaded}"]
            else:
                notes = choice.notes
            new, sig_txt = choice.new, choice.signal_text
            record["forecast_rps"] = rate if rate is not None else choice.forecast_rps
            if ci is not None:
                carbon.record_intensity(new, ci)  # the value, its source and carbon_region
            record["old_objective"] = choice.old_objective
            record["new_objective"] = choice.new_objective
            record["improvement"] = choice.improvement
            if recover:
                target = running if _same_config(new, running) else new
                if target is new:
                    store.save_plan(new, source="replan")
                record["new_plan_id"] = target.id
                record["new_objective"] = kind.objective(target)[1]
                record["reason"] = (
                    f"nothing is serving ({serving['why']}); {sig_txt}; applied the best plan, "
                    f"plan {target.id}"
                )
                (apply_fn or _default_apply)(target, store=store, **(apply_options or {}))
                record["action"] = "apply"
                record["applied"] = 1
            elif choice.same:
                record["action"] = "keep"
                record["reason"] = (
                    f"{sig_txt}; the best plan is the running configuration"
                    if serving["live"]
                    else f"{sig_txt}; the best plan is plan {running.id}'s configuration"
                )
                if apply and serving["live"] and ci is not None:
                    # the configuration stays, the grid moved: its counters follow the grid
                    counted = _count_at_signal(
                        store, serving_id, new, apply_fn or _default_apply, apply_options
                    )
                    if counted:
                        record["reason"] += f"; {counted}"
            else:
                if not choice.triggers:
                    record["reason"] = choice.not_worth
                else:
                    store.save_plan(new, source="replan")
                    record["new_plan_id"] = new.id
                    record["reason"] = "; ".join(choice.triggers)
                    if apply:
                        fn = apply_fn or _default_apply
                        fn(new, store=store, **(apply_options or {}))
                        record["action"] = "apply"
                        record["applied"] = 1
                    else:
                        record["action"] = "propose"
                        record["reason"] += f"; apply with `greenctl apply` plan {new.id}"
            if not serving["live"] and not record["applied"]:
                notes.append(
                    f"nothing is serving: {serving['why']}; `greenctl apply` the plan, or "
                    "replan with --apply"
                )
            if notes:
                record["reason"] += " (" + "; ".join(notes) + ")"
            return _record(store, record)
        except BaseException as exc:
            record["action"] = "failed"
            record["applied"] = 0
            msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            record["reason"] = f"{type(exc).__name__}: {msg}; the running plan is unchanged"
            _record(store, record)
            raise


def serving_state(store: Any) -> dict[str, Any]:
    """What really serves, asked of the backend that runs the plan (live processes or
    replicas, not the rows of the last apply; :func:`greenctl.executor.deploy.backends.serving`):
    ``backend``, ``live``, ``plan_id`` (the plan that serves) and ``why`` nothing serves when
    not ``live``."""
    from greenctl.executor.deploy import backends

    return backends.serving(store).to_dict()


def _serves_config_of(store: Any, plan_id: int | None, plan: Any) -> bool:
    """Whether stored plan ``plan_id`` is ``plan``'s configuration (e.g. the same plan file
    applied with `greenctl apply`, which stores a copy)."""
    if plan_id is None:
        return False
    try:
        other = store.get_plan(plan_id)
    except NotFoundError:
        return False
    return bool(other.kind == plan.kind and _same_config(other, plan))


def _forecast_peak(store: Any, forecaster: str) -> Callable[[str], float | None]:
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
    store: Any,
    serving_id: int | None,
    new: Any,
    apply_fn: Callable[..., Any],
    apply_options: dict[str, Any] | None,
) -> str | None:
    """Make the running deployment count carbon at the intensity ``new`` (the running
    configuration, replanned at the round's signal) records, when the plan that serves
    (``serving_id``) counts at another: ``new`` is saved and applied through the apply path
    (on the backend that runs the plan), which for the same configuration only re-applies
    the routes, carrying the new ``carbon`` (the local dispatcher hands it to its executors;
    nothing restarts). The lineage's running plan and reference signal stay as they were:
    ``new`` is no change of plan (it is named in the decision's reason, not as
    ``new_plan_id``), so neither the dwell nor the threshold move.

    Returns:
        What was done, for the decision's reason (also when the apply failed: the
        deployment then counts as before); None when nothing needed doing.
    """
    import math

    from greenctl.data.emissions import routes_carbon
    from greenctl.data.errors import GreenctlError

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
    return (
        f"the running deployment counts carbon at {want['carbon_g_per_kwh']:g} g/kWh from now "
        f"on (was {was}): plan {new.id}, its configuration at this signal, applied"
    )


def _default_apply(plan: Any, *, store: Any, **options: Any) -> Any:
    """Apply on the backend that runs the plan (or ran it last), as it was applied there."""
    from greenctl.executor.deploy import backends

    return backends.apply_where_running(plan, store=store, **options)


def _record(store: Any, record: dict[str, Any]) -> dict[str, Any]:
    return record_decision(store, record)


def record_decision(store: Any, record: dict[str, Any]) -> dict[str, Any]:
    """Append a replanning decision record (one transaction); returns it with its ``id``
    and ``applied`` as a bool. Every replan writes one, whichever kind it replans."""
    with store.transaction():
        record["id"] = loop_state.add_decision(store, record)
    out = dict(record)
    out["applied"] = bool(out["applied"])
    return out


def simulate_replans(
    store: Any,
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
    from datetime import timedelta

    from greenctl.data.carbon_io import iso, parse_time

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


# -- cron -------------------------------------------------------------------------------------
CRON_TAG = "# greenctl:"
# cron's */N restarts at every hour (minutes) or day (hours): only divisors run evenly
EVEN_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
EVEN_HOURS = (1, 2, 3, 4, 6, 8, 12)
PERCENT_ESCAPED = "\\%"


def _interval_text(minutes: int) -> str:
    if minutes % 1440 == 0:
        return f"{minutes // 1440}d"
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def cron_schedule(every: str) -> str:
    """The crontab schedule of ``--every``: an interval that divides the hour (1, 2, 3, 4, 5,
    6, 10, 12, 15, 20 or 30 minutes) or the day (1, 2, 3, 4, 6, 8 or 12 hours), or ``1d``.

    Raises:
        InputError: an interval cron cannot run evenly (``*/7`` leaves a 4-minute gap after
            :56, ``*/5`` hours a 4-hour gap at midnight), naming the nearest even ones.
    """
    import math

    even = [*EVEN_MINUTES, *(60 * h for h in EVEN_HOURS), 1440]
    seconds = parse_duration(every, option="--every")
    if not math.isfinite(seconds) or seconds < 60 or seconds % 60:
        raise InputError(
            f"--every '{every}' is not a whole number of minutes (cron's step is one minute)",
            hint="write the unit: e.g. 5m, 15m, 1h, 6h or 1d",
        )
    minutes = int(seconds // 60)
    if minutes in EVEN_MINUTES:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60 == 0 and minutes // 60 in EVEN_HOURS:
        hours = minutes // 60
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    if minutes == 1440:
        return "0 0 * * *"
    if minutes < 60:
        why = f"*/{minutes} leaves a {60 - 59 // minutes * minutes}-minute gap every hour"
    elif minutes < 1440 and minutes % 60 == 0:
        hours = minutes // 60
        why = f"*/{hours} hours leaves a {24 - 23 // hours * hours}-hour gap every day"
    else:
        why = "cron's */N repeats only within an hour or a day"
    near = [max((e for e in even if e < minutes), default=None)]
    near.append(min((e for e in even if e > minutes), default=None))
    nearest = " or ".join(_interval_text(e) for e in near if e is not None)
    raise InputError(
        f"--every '{every}' does not divide the hour or the day evenly ({why})",
        hint=f"use {nearest} (even intervals: " + ", ".join(_interval_text(e) for e in even) + ")",
    )


def greenctl_executable() -> list[str]:
    """Absolute command line that starts this greenctl (the console script next to this
    Python, else ``python -c``)."""
    import shutil
    import sys

    beside = Path(sys.executable).parent / "greenctl"
    if beside.exists():
        return [str(beside.absolute())]
    found = shutil.which("greenctl")
    if found:
        return [str(Path(found).absolute())]
    return [sys.executable, "-c", "from greenctl.cli.main import main; main()"]


def cron_line(
    args: list[str], *, every: str, db_path: Path, log: str | None = None, name: str = "replan"
) -> str:
    """A crontab line running ``greenctl ARGS`` with absolute paths and the store location.

    The arguments are shell-quoted and ``%`` (a newline to cron) escaped; a ``--db`` among
    them, and any argument naming a file here, is made absolute (cron starts in $HOME).

    Raises:
        InputError: no command given, a bad interval or name, or an argument cron cannot carry.
    """
    import shlex

    if not args:
        raise InputError(
            "no greenctl command to schedule",
            hint="write it after --, e.g. `greenctl cron install --every 15m -- replan "
            "--plan 3 --apply`",
        )
    if args[0] == "greenctl":
        args = args[1:]
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"--name '{name}' must be letters, digits, - or _")
    bad = [a for a in args if "\n" in a or "\r" in a]
    if bad:
        raise InputError(
            f"argument {bad[0]!r} holds a line break, which a crontab line cannot carry"
        )
    schedule = cron_schedule(every)
    log_path = Path(log).absolute() if log else db_path.parent / f"greenctl-{name}.log"
    cmd = " ".join(shlex.quote(a) for a in [*greenctl_executable(), *absolute_db_args(args)])
    line = f"GREENCTL_DB={shlex.quote(str(db_path))} {cmd} >> {shlex.quote(str(log_path))} 2>&1"
    # cron turns an unescaped % into a newline, even inside quotes
    return f"{schedule} {line.replace('%', PERCENT_ESCAPED)} {CRON_TAG}{name}"


def absolute_db_args(args: list[str]) -> list[str]:
    """``args`` with paths made absolute (relative to this directory; cron starts in $HOME).

    The value of every ``--db`` (the store need not exist yet), and every other argument or
    ``--option=value`` that names a file or folder existing here (a ``--plan plan.json``, a
    ``--trace``).
    """
    out = list(args)
    for i, a in enumerate(out):
        if a.startswith("--db=") and len(a) > 5:
            out[i] = "--db=" + str(Path(a[5:]).absolute())
        elif a == "--db" and i + 1 < len(out):
            out[i + 1] = str(Path(out[i + 1]).absolute())
        elif i > 0 and out[i - 1] == "--db":
            continue
        elif a.startswith("--") and "=" in a:
            opt, value = a.split("=", 1)
            if _names_a_path_here(value):
                out[i] = f"{opt}={Path(value).absolute()}"
        elif not a.startswith("-") and _names_a_path_here(a):
            out[i] = str(Path(a).absolute())
    return out


def _names_a_path_here(value: str) -> bool:
    if not value or Path(value).is_absolute():
        return False
    try:
        return Path(value).exists()
    except (OSError, ValueError):  # a name too long, or holding NUL
        return False


def _read_crontab(crontab_file: str | None) -> str:
    import subprocess

    if crontab_file:
        p = Path(crontab_file)
        return p.read_text() if p.exists() else ""
    try:
        res = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise InputError(
            "the crontab command is not installed",
            hint="install cron, or use --print and add the line yourself",
        ) from None
    if res.returncode != 0:
        if "no crontab" in res.stderr.lower():
            return ""
        raise InputError(f"crontab -l failed: {res.stderr.strip()}")
    return res.stdout


def _write_crontab(text: str, crontab_file: str | None) -> str:
    import subprocess

    if crontab_file:
        Path(crontab_file).write_text(text)
        return str(Path(crontab_file).absolute())
    res = subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise InputError(f"crontab - failed: {res.stderr.strip()}")
    return "the user's crontab"


def cron_install(line: str, *, name: str = "replan", crontab_file: str | None = None) -> str:
    """Install ``line``, replacing any line with the same tag; returns where."""
    kept = [
        ln for ln in _read_crontab(crontab_file).splitlines() if not ln.endswith(CRON_TAG + name)
    ]
    return _write_crontab("\n".join([*kept, line]) + "\n", crontab_file)


def cron_remove(*, name: str = "replan", crontab_file: str | None = None) -> int:
    """Remove the lines tagged ``name``; returns how many."""
    lines = _read_crontab(crontab_file).splitlines()
    kept = [ln for ln in lines if not ln.endswith(CRON_TAG + name)]
    if len(kept) != len(lines):
        _write_crontab("\n".join(kept) + ("\n" if kept else ""), crontab_file)
    return len(lines) - len(kept)


# -- the demo ---------------------------------------------------------------------------------
DEMO_REGION = "CISO"
DEMO_TRACE = "clover-ciso-march"
#: The demo's scenarios (``greenctl demo --model``): the variants profiled on one CPU core,
#: the load and SLO planned for, and per mode (quick, full) how much each measurement takes,
#: whose serving path is measured and how long each applied plan is loaded.
DEMO_SCENARIOS: dict[str, dict[str, Any]] = {
    # An image classification API on CPU cores: ResNet-18/34/50 (random weights carrying the
    # published ImageNet top-1 accuracy, as the catalog says), 3 req/s at p95 <= 1 s. A served
    # image keeps a core busy for 50-250 ms, so busy power is a large share of the energy and
    # a smaller variant saves 20-40 % of it per request: the balanced objective (gamma 0.5)
    # takes ResNet-18 (0.064 less accurate) in the dirty hours (from 240-300 g/kWh on the
    # 2-core development VM) and the most accurate variant in the clean ones, so the plan
    # follows the grid. 3 req/s keeps ResNet-50 on one core on a quiet machine and leaves a
    # 2-core machine room to drive and measure the load beside the executors; where the
    # machine is busy the profiles are slower, the most accurate plan may need a second core,
    # and the saving is larger. Images are 3x224x224 tensors: the served path is the same for
    # every variant, so ResNet-18's stands in for all (each applied plan is measured anyway).
    "resnet": {
        "variants": ("resnet18", "resnet34", "resnet50"),
        "rate_rps": 3.0,
        "slo_ms": 1000.0,
        "profile": ({"requests": 16, "duration_s": None}, {"requests": 24, "duration_s": None}),
        "serving": (
            {"duration_s": 3.0, "min_requests": 9},
            {"duration_s": 5.0, "min_requests": 15},
        ),
        "served": (("resnet18",), ("resnet18",)),
        # seconds of verification load per applied plan: at 3 req/s, about 36 requests
        "load_s": (3.0, 12.0),
    },
    # The tiny family (illustrative accuracies), 40 req/s at p95 <= 100 ms: one core of
    # tiny-l carries the load mostly idle, so its idle power (modeled 3 W a core) is about
    # 80 % of the energy per request, the smallest variant saves about 16 % of it for 0.27 of
    # accuracy, and no plan uses fewer than one core: the balanced objective keeps the most
    # accurate plan at every intensity (0 % saved, printed with the trade it declined).
    "tiny": {
        "variants": ("tiny-s", "tiny-m", "tiny-l"),
        "rate_rps": 40.0,
        "slo_ms": 100.0,
        "profile": ({"duration_s": 0.3}, {"duration_s": 1.0}),
        "serving": (
            {"duration_s": 2.0, "min_requests": 80},
            {"duration_s": 4.0, "min_requests": 200},
        ),
        # how much slower a served run is than the profile's differs by variant (tiny-l about
        # 1.8x, tiny-s 3x on the development VM); quick: tiny-l stands for all
        "served": (("tiny-l",), ("tiny-s", "tiny-m", "tiny-l")),
        "load_s": (3.0, 8.0),
    },
}
#: ``greenctl demo``'s scenario: ``resnet``, where carbon awareness pays (the plan follows
#: the grid); ``tiny`` is faster but idle-bound, and shows why a plan can save nothing
DEMO_MODEL = "resnet"
#: The cores a demo plan may use (a 2-core machine's)
DEMO_CPUS = 2
#: Where the scenario's rate does not fit the machine (too slow or busy), the share of the
#: largest rate its profiles serve within the SLO that the demo plans for: headroom for the
#: verification load, measured on the same busy cores
DEMO_RATE_MARGIN = 0.8
#: The demo's simulated period and its replanning step, hours (quick, full)
DEMO_HOURS = (12.0, 24.0)
DEMO_STEP_H = (3.0, 2.0)
DemoProgress = Callable[[str, float], None]


def _quiet(_msg: str, _frac: float) -> None:
    return None


def run_demo(
    *,
    out_dir: str | Path = "greenctl-report",
    db: str | Path | None = None,
    quick: bool = False,
    model: str | None = None,
    rate_rps: float | None = None,
    slo_ms: float | None = None,
    progress: DemoProgress = _quiet,
) -> dict[str, Any]:
    """The whole loop on embedded defaults (``greenctl demo``).

    Profile the scenario's built-in variants (:data:`DEMO_SCENARIOS`) on one CPU core, import
    the bundled CAISO carbon trace (Clover's), plan a mix for ``rate_rps`` at ``slo_ms`` (the
    scenario's by default; balanced objective with a strong carbon weight, a carbon-unaware
    most-accurate baseline and the lowest-carbon plan beside it), apply it and drive a short
    verification load through the dispatcher, replan (and apply) every ``step_h`` as the
    trace's carbon intensity moves over :data:`DEMO_HOURS` simulated hours (the last round's
    plan serves to the period's end, which the savings cover), load each configuration the
    loop applied once (not with ``quick``), write the report files and charts to ``out_dir``,
    and stop everything (also on failure).

    Args:
        out_dir: folder for the report (created).
        db: the store; default a fresh ``greenctl-demo.db`` inside ``out_dir``.
        quick: shorter measurements, load and replay (CI).
        model: the scenario, a key of :data:`DEMO_SCENARIOS` (default :data:`DEMO_MODEL`).
        progress: ``callback(message, fraction_done)``.

    Returns:
        A summary: paths written, the scenario, plan ids and deployments, decisions and the
        changes they applied, what was measured, savings (``savings.json``).

    Raises:
        InputError: an unknown scenario.
    """
    import os

    from greenctl.data import carbon, carbon_io
    from greenctl.data.reports import deployments_label
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.executor.kinds import get_kind
    from greenctl.planner.core.forecast import DEFAULT_FORECASTER
    from greenctl.profiler.harness import profile

    model = model or DEMO_MODEL
    if model not in DEMO_SCENARIOS:
        raise InputError(
            f"unknown demo scenario '{model}'", hint=f"use one of {', '.join(DEMO_SCENARIOS)}"
        )
    scenario = DEMO_SCENARIOS[model]
    asked_rate = rate_rps
    rate_rps = float(scenario["rate_rps"] if rate_rps is None else rate_rps)
    slo_ms = float(scenario["slo_ms"] if slo_ms is None else slo_ms)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    db_path = Path(db) if db else out / "greenctl-demo.db"
    if not db:
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(db_path) + suffix)
            if p.exists():
                os.unlink(p)
    hours = DEMO_HOURS[0 if quick else 1]
    step_h = DEMO_STEP_H[0 if quick else 1]
    load_s = float(scenario["load_s"][0 if quick else 1])
    summary: dict[str, Any] = {
        "out_dir": str(out.resolve()),
        "db": str(db_path.resolve()),
        "scenario": model,
        "rate_rps": rate_rps,
        "slo_ms": slo_ms,
        "hours": hours,
        "step_h": step_h,
        "region": DEMO_REGION,
    }
    store = open_store(db_path)
    try:
        names = ", ".join(scenario["variants"])
        progress(f"profiling {names} on 1 CPU core (modeled energy)", 0.02)
        profile(
            store,
            variants=scenario["variants"],
            cpus=(1,),
            batches=(1,),
            progress=lambda m, f: progress(f"profiling: {m}", 0.02 + 0.23 * f),
            **scenario["profile"][0 if quick else 1],
        )
        summary["profiles"] = store.profile_count()
        # how the profiles' energy was had: rapl (measured) or modeled (no readable counter)
        summary["energy_methods"] = sorted(
            {p.energy_method for p in store.latest_profiles(family=model)}
        )
        from greenctl.executor.deploy.serving_measure import measure_serving
        from greenctl.executor.runtime.serving import save_serving

        # the variants whose own path is measured (the others borrow their family's)
        served = scenario["served"][0 if quick else 1]
        for k, name in enumerate(served):
            progress(
                f"measuring the serving path of {name} (client, dispatcher, executor hops)",
                0.24 + 0.02 * k / len(served),
            )
            save_serving(
                store,
                measure_serving(
                    store,
                    variant=name,
                    rates=(rate_rps,),
                    paths=("dispatcher",),
                    **scenario["serving"][0 if quick else 1],
                ),
            )
        progress("importing the bundled carbon trace (Clover, CAISO March)", 0.26)
        imp = carbon_io.import_bundled(store, DEMO_TRACE, region=DEMO_REGION)
        start = imp["first"]
        ci0 = float(carbon.value_at(store, DEMO_REGION, start)["carbon_g_per_kwh"])
        progress(f"planning a mix for {rate_rps:g} req/s at p95 <= {slo_ms:g} ms", 0.28)
        request: dict[str, Any] = {
            "model": model,
            "rate_rps": rate_rps,
            "slo_ms": slo_ms,
            "budgets": {"cpu": DEMO_CPUS},
            "objective": "balanced",
            "gamma": 0.5,
            "carbon_intensity": ci0,
        }
        plan, note = _plan_demo(store, request, fixed_rate=asked_rate is not None)
        if note:
            rate_rps = summary["rate_rps"] = request["rate_rps"]
            summary["rate_note"] = f"{note}, not {scenario['rate_rps']:g}"
            progress(summary["rate_note"], 0.29)
        plan.extra["carbon_region"] = DEMO_REGION
        plan_id = store.save_plan(plan, source="demo")
        base, _ = get_kind("mix").plan(store, {**request, "objective": "accuracy"})
        base.extra["carbon_region"] = DEMO_REGION
        base_id = store.save_plan(base, source="demo-baseline")
        summary.update(plan_id=plan_id, baseline_id=base_id)
        summary["plan_deployments"] = deployments_label(plan)
        summary["baseline_deployments"] = deployments_label(base)
        summary["baseline_predicted_p95_ms"] = base.predicted.get("p95_ms")
        # What carbon awareness could trade here: the lowest-carbon plan for the same rate,
        # SLO and budgets (planned, neither saved nor applied), beside greenctl's, so a run
        # where the balanced objective keeps the most accurate plan says what it declined.
        low, _ = get_kind("mix").plan(store, {**request, "objective": "carbon"})
        summary["lowest_carbon"] = _demo_alternative(low, plan)
        progress(f"applying plan {plan_id} and loading it through the dispatcher", 0.32)
        applied = apply_plan(plan, store=store, verify=True, verify_duration_s=load_s)
        summary["dispatcher_url"] = applied.dispatcher_url
        if applied.verify:
            measured = applied.verify.get("measured") or {}
            summary["verify"] = {
                "plan_id": plan_id,
                "deployments": deployments_label(plan),
                "predicted_p95_ms": plan.predicted.get("p95_ms"),
                "measured_p95_ms": measured.get("p95_ms"),
                "measured_rate_rps": measured.get("rate_rps"),
                "failed": _failed(measured),
            }
            # The load history holds demand (arrivals), not what the plan managed to serve.
            offered = measured.get("offered_rps") or measured.get("rate_rps")
            if offered:
                record_load(
                    store,
                    [
                        LoadSample(
                            utcnow_iso(),
                            float(offered),
                            interval_s=load_s,
                            model=model,
                            source="demo-verify",
                        )
                    ],
                )
        progress(f"replanning every {step_h:g} h over {hours:g} h of the carbon trace", 0.5)
        # rounds at start, start + step_h, ..., the last one's plan serving to start + hours
        decisions_out = simulate_replans(
            store,
            plan=str(plan_id),
            region=DEMO_REGION,
            start=start,
            hours=hours - step_h,
            step_h=step_h,
            apply=True,
            min_dwell_s=REPLAN_MIN_DWELL_S,
            forecaster=DEFAULT_FORECASTER,  # replan's and replay's default
            sample_load=False,  # the replay is simulated time: the idle dispatcher is no load
            progress=lambda k, n, d: progress(
                f"replan {k}/{n} at {d['at']}: {d['signal_g_per_kwh']:.0f} g/kWh -> {d['action']}",
                0.5 + 0.3 * k / n,
            ),
        )
        summary["decisions"] = [
            {k: d[k] for k in ("at", "signal_g_per_kwh", "action", "new_plan_id", "reason")}
            for d in decisions_out
        ]
        # what served when: the plan, then each configuration a round applied
        summary["changes"] = [
            {
                "at": d["at"],
                "signal_g_per_kwh": d["signal_g_per_kwh"],
                "plan_id": int(d["new_plan_id"]),
                "deployments": deployments_label(store.get_plan(int(d["new_plan_id"]))),
            }
            for d in decisions_out
            if d["action"] == "apply" and d.get("applied") and d.get("new_plan_id")
        ]
        if not quick:
            # Measure each configuration the loop applied once, not only the first: the
            # carbon-aware plans of the dirty hours serve real load too (each is applied for
            # its measurement; the replay's timeline, from its decisions, stays as it was).
            seen = [plan]
            for d in decisions_out:
                if d["action"] != "apply" or not d.get("applied") or not d.get("new_plan_id"):
                    continue
                other = store.get_plan(int(d["new_plan_id"]))
                if any(_same_config(other, p) for p in seen):
                    continue
                seen.append(other)
                progress(f"measuring plan {d['new_plan_id']}, which the replay applied", 0.82)
                again = apply_plan(other, store=store, verify=True, verify_duration_s=load_s)
                m = (again.verify or {}).get("measured") or {}
                summary.setdefault("verified_later", []).append(
                    {
                        "plan_id": int(d["new_plan_id"]),
                        "deployments": deployments_label(other),
                        "predicted_p95_ms": other.predicted.get("p95_ms"),
                        "measured_p95_ms": m.get("p95_ms"),
                        "measured_rate_rps": m.get("rate_rps"),
                        "failed": _failed(m),
                    }
                )
        progress("writing the report and charts", 0.85)
        # the savings' last signal time, which `report savings --to` takes to say the same
        summary["to"] = _iso_after(start, hours)
        summary["files"] = write_demo_report(
            store,
            out,
            plan_id=plan_id,
            baseline_id=base_id,
            region=DEMO_REGION,
            end=summary["to"],
        )
        from greenctl.data import reports

        summary["savings"] = json.loads((out / "savings.json").read_text())
        summary["savings_table"] = reports.savings_table(summary["savings"])
        summary["deployments_used"] = sorted(
            {deployments_label(store.get_plan(int(i))) for i in summary["savings"]["plans_used"]}
        )
    finally:
        progress("stopping everything", 0.97)
        try:
            summary["stopped"] = len(down(store)["stopped"])
        finally:
            store.close()
    progress("done", 1.0)
    return summary


def _plan_demo(store: Any, request: dict[str, Any], *, fixed_rate: bool) -> tuple[Any, str | None]:
    """The demo's plan, as ``plan mix`` and ``replan`` plan it. On a machine too slow or busy
    for the scenario's rate, a plan for :data:`DEMO_RATE_MARGIN` of the largest rate its
    profiles say the budget serves within the SLO (``request`` takes that rate), and a note
    saying so; a rate the user asked (``fixed_rate``) fails as ``plan mix`` would.

    Raises:
        InfeasiblePlan: no plan, or none at the rate asked.
    """
    from greenctl.data.errors import InfeasiblePlan
    from greenctl.executor.kinds import get_kind

    try:
        return get_kind("mix").plan(store, request)[0], None
    except InfeasiblePlan as exc:
        scale = exc.servable_scale
        if fixed_rate or not scale or scale <= 0:
            raise
        most = float(request["rate_rps"]) * scale
        request["rate_rps"] = round(most * DEMO_RATE_MARGIN, 2)
    note = (
        f"this machine's profiles carry at most {most:.2f} req/s at p95 <= "
        f"{request['slo_ms']:g} ms on {request['budgets']['cpu']} cores: planned for "
        f"{request['rate_rps']:g} req/s"
    )
    return get_kind("mix").plan(store, request)[0], note


def _failed(measured: dict[str, Any]) -> int:
    """Requests of a verification load that got no answer (errors or refusals): they miss
    the SLO, which the p95 of the answered ones does not show."""
    return int(measured.get("errors") or 0) + int(measured.get("rejected_503") or 0)


def _demo_alternative(low: Any, plan: Any) -> dict[str, Any]:
    """The lowest-carbon plan ``low`` beside greenctl's ``plan`` (both as planned, modeled):
    its deployments, accuracy, energy per request and how much less carbon per request it
    emits than ``plan`` (the same intensity and PUE: the energy ratio)."""
    from greenctl.data.reports import deployments_label

    e_low = low.predicted.get("energy_j_per_request")
    e_plan = plan.predicted.get("energy_j_per_request")
    less = None
    if e_low is not None and e_plan:
        less = (1.0 - float(e_low) / float(e_plan)) * 100.0
    return {
        "deployments": deployments_label(low),
        "plan_deployments": deployments_label(plan),
        "plan_objective": plan.request.get("objective"),
        "plan_gamma": plan.request.get("gamma"),
        "same_as_plan": deployments_label(low) == deployments_label(plan),
        "accuracy": low.predicted.get("accuracy"),
        "plan_accuracy": plan.predicted.get("accuracy"),
        "energy_j_per_request": e_low,
        "plan_energy_j_per_request": e_plan,
        "carbon_per_request_less_pct": less,
        "method": "modeled: the planners' predicted energy per request at the planned rate",
    }


def _iso_after(start: str, hours: float) -> str:
    from datetime import timedelta

    from greenctl.data.carbon_io import iso, parse_time

    return iso(parse_time(start) + timedelta(hours=hours) - timedelta(seconds=1))


def write_demo_report(
    store: Any,
    out: Path,
    *,
    plan_id: int,
    baseline_id: int,
    region: str,
    start: str | None = None,
    end: str | None = None,
) -> list[str]:
    """Exports (CSV), savings (JSON) and charts (PNG) of a replanning run into ``out``."""
    from greenctl.data import reports
    from greenctl.data.errors import NotFoundError as _NotFound

    files = []
    for what in reports.EXPORTS:
        filters: dict[str, Any] = {}
        if what == "carbon":
            filters = {"region": region, "start": start, "end": end}
        reports.export(store, what, fmt="csv", path=str(out / f"{what}.csv"), **filters)
        files.append(str(out / f"{what}.csv"))
    s = reports.savings(
        store, plan_id=plan_id, baseline_id=baseline_id, region=region, start=start, end=end
    )
    (out / "savings.json").write_text(json.dumps(s, indent=2) + "\n")
    files.append(str(out / "savings.json"))
    reports.chart_carbon(
        store,
        out / "carbon.png",
        plan_id=plan_id,
        region=region,
        baseline_id=baseline_id,
        start=start,
        end=end,
    )
    files.append(str(out / "carbon.png"))
    try:
        reports.chart_latency(store, out / "latency.png")
        files.append(str(out / "latency.png"))
    except _NotFound:
        pass
    return files


# -- measured load from the running dispatcher ------------------------------------------------
def _dispatcher_url(store: Any) -> str | None:
    row = deployments.running_dispatcher(store)
    if row is None:
        return None
    host = row["host"] or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "") else host
    return f"http://{host}:{row['port']}"


def sample_dispatcher_load(
    store: Any, *, url: str | None = None, timeout_s: float = 2.0
) -> list[dict[str, Any]]:
    """Read the running dispatcher's request counters and append the arrival rate since the
    previous reading to ``load_history`` (per model). The first reading only primes the
    counters; a counter that went down (dispatcher restarted) restarts the sampling.

    Returns:
        The samples appended (``model, time, rate_rps, interval_s``); empty when no
        dispatcher runs or it does not answer.
    """
    import urllib.error
    import urllib.request

    from greenctl.data.carbon_io import parse_time

    base = url or _dispatcher_url(store)
    if base is None:
        return []
    try:
        with urllib.request.urlopen(base.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, OSError):
        return []
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("greenctl_dispatcher_requests_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        model = labels.split('model="', 1)[1].split('"', 1)[0] if 'model="' in labels else ""
        try:
            counts[model] = counts.get(model, 0.0) + float(value)
        except ValueError:
            continue
    now = utcnow_iso()
    source = f"dispatcher:{base}"
    samples = []
    with store.transaction():
        for model, count in sorted(counts.items()):
            prev = loop_state.load_counter(store, source=source, model=model)
            if prev is not None and count >= prev["count"]:
                dt = (parse_time(now) - parse_time(prev["time"])).total_seconds()
                if dt > 0:
                    rate = (count - prev["count"]) / dt
                    samples.append(
                        {
                            "model": model,
                            "time": prev["time"],
                            "rate_rps": rate,
                            "interval_s": dt,
                        }
                    )
            loop_state.set_load_counter(store, source=source, model=model, time=now, count=count)
        if samples:
            record_load(
                store,
                [
                    LoadSample(
                        s["time"],
                        s["rate_rps"],
                        interval_s=s["interval_s"],
                        model=s["model"],
                        source="dispatcher",
                    )
                    for s in samples
                ],
            )
    return samples
