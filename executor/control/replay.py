"""What-if replay: the control loop over a load trace and a carbon trace, beside baselines.

``greenctl replay`` answers "what would greenctl have done over this traffic and grid, and
against what I run now?" without applying anything. One loop (:func:`replay`) serves every
kind; the kind's step (:class:`~greenctl.executor.kinds.replaying.ReplayStep`) plans, runs its
baselines and accounts figures. Each interval forecasts the load, replans through the very
decision ``replan`` takes (:func:`greenctl.executor.control.replan.replan_choice`, with dwell),
pays reconfiguration load time and evaluates actual arrivals on what serves. The result has
one shape for every kind, its ``meta.layout`` saying which figures it holds
(:func:`greenctl.data.replay_report.write_replay`); identical HiGHS
problems are solved once (:func:`greenctl.planner.core.solvers.solve_memo`). See docs/replay.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.data.replay_report import write_replay
from greenctl.executor.control import forecasters, replan
from greenctl.executor.control.replay_inputs import (
    forecast_peaks,
    parse_every,
    parse_from,
    trace_window,
)
from greenctl.executor.kinds.replaying import (
    PolicyStep,
    ReplayInputs,
    ReplayOptions,
    ReplayStep,
    Round,
    TraceWindow,
    iso_at,
    replay_layout,
    replay_step,
    replayed_kinds,
)
from greenctl.planner.core import solvers
from greenctl.planner.core.forecast import DEFAULT_FORECASTER

if TYPE_CHECKING:
    from greenctl.data.store import Store

__all__ = [
    "ReplayOptions",
    "ReplayRun",
    "replay",
]

_OPTION_FIELDS = {f.name for f in fields(ReplayOptions)}


def __getattr__(name: str) -> Any:
    if name == "REPLAYED":  # the kinds replay takes: the registered kinds with a step
        return replayed_kinds()
    raise AttributeError(name)


@solvers.solve_memo()  # a replay solves the same few problems again and again
def replay(
    store: Store,
    *,
    kind: str = "mix",
    request: dict[str, Any] | None = None,
    plan: int | str | None = None,
    **options: Any,
) -> dict[str, Any]:
    """Replay the control loop of a ``kind`` plan over its traces (module docstring).

    Args:
        kind / request: the plan kind and its planning inputs (as ``plan <kind>`` parses
            them; a mix request without ``rate_rps`` plans for the first interval's
            forecast); or ``plan``: a stored plan's id (its kind is replayed).
        options: :class:`~greenctl.executor.kinds.replaying.ReplayOptions`'s fields
            (``load_trace``, ``region``, ``carbon_trace``, ``start``, ``hours``, ``every``,
            ``threshold``, ``margin``, ``min_dwell_s``, ``forecaster``, ``baselines`` (None:
            the kind's defaults), ``wue_l_per_kwh``, ``ewif_l_per_kwh``, ``out_dir``,
            ``progress``); any other is the kind's own (a mix replay's ``vpa_variant`` and
            ``vpa``, a glet replay's ``model_traces``, ``gpu_power_w``, ``carbon_intensity``),
            as are those of ``kind_options``.

    Returns:
        ``{"meta", "summary": [per policy], "intervals": {policy: [rows]}}``.

    Raises:
        InputError: a bad option (named), a missing trace, a window beyond a trace.
    """
    opts = replay_options(options)
    run = ReplayRun(store, opts)
    inputs, step = run.inputs(kind, request, plan)
    return step.run(store, inputs, run)


def replay_options(options: dict[str, Any]) -> ReplayOptions:
    """:class:`ReplayOptions` of ``replay``'s keywords (the kind's own in ``kind_options``;
    those given as None are not given)."""
    own = dict(options.pop("kind_options", None) or {})
    own.update({k: v for k, v in options.items() if k not in _OPTION_FIELDS})
    shared = {k: v for k, v in options.items() if k in _OPTION_FIELDS}
    if shared.get("baselines") is not None:
        shared["baselines"] = tuple(shared["baselines"])
    given = {k: v for k, v in own.items() if v is not None}
    return ReplayOptions(**shared, kind_options=given)


@dataclass
class ReplayRun:
    """One replay: the options every kind shares, checked, and what the loop does for the
    kind's step (:class:`~greenctl.executor.kinds.replaying.ReplayLoop`)."""

    store: Store
    options: ReplayOptions
    every_s: int = 0
    notes: list[str] = field(default_factory=list)
    unmodeled: set[str] = field(default_factory=set)
    stats: dict[str, int] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    greenctl_s: float | None = None
    layout: str = "serving"  # the result's shape (replay_layout), which its chart follows
    _forecaster: Any = None

    def __post_init__(self) -> None:
        o = self.options
        if o.out_dir is not None:
            where = Path(o.out_dir)
            if where.exists() and not where.is_dir():
                raise InputError(
                    f"-o {o.out_dir} is a file", hint="name a folder (created if absent)"
                )
        replan.check_replan_limits(o.threshold, o.margin)  # as replan reads them

    @property
    def forecaster_name(self) -> str:
        return self.options.forecaster or DEFAULT_FORECASTER

    def inputs(
        self, kind: str, request: dict[str, Any] | None, plan: int | str | None
    ) -> tuple[ReplayInputs, ReplayStep]:
        """The kind's step and what it replays: the stored ``plan`` (its kind) or ``request``."""
        if (request is None) == (plan is None):
            raise InputError("replay needs the kind's planning inputs or --plan ID, not both")
        first = None if plan is None else stored_plan(self.store, plan)
        if first is not None:
            kind, request = first.kind, dict(first.request)
        step = replay_step(kind)
        if step is None:
            kinds = replayed_kinds()
            raise InputError(
                f"replay supports {', '.join(kinds)} plans; this is a {kind} plan",
                hint=f"replay a {', '.join(kinds[:-1])} or {kinds[-1]} plan",
            )
        unknown = sorted(set(self.options.kind_options) - set(step.options))
        if unknown:
            raise InputError(f"a {kind} replay takes no option {unknown[0]!r}")
        chosen = chosen_baselines(kind, step, self.options.baselines, self.notes)
        self.every_s = parse_every(self.options.every)
        self.layout = replay_layout(kind, step)
        return ReplayInputs(kind, dict(request or {}), first, chosen, self.options), step

    # -- what the loop does for every kind (ReplayLoop) -------------------------------------
    def forecaster(self, name: str) -> Any:
        return forecasters.get_forecaster(self.store, name)

    def start(self) -> tuple[int, str | None]:
        return parse_from(self.options.start)

    def window(self, load_trace: str, carbon_intensity: float) -> TraceWindow:
        o = self.options
        return trace_window(
            self.store, load_trace=load_trace, region=o.region, carbon_trace=o.carbon_trace,
            carbon_intensity=carbon_intensity, start=o.start, hours=o.hours, every_s=self.every_s,
        )  # fmt: skip

    def forecast(
        self, series: np.ndarray, window: TraceWindow
    ) -> tuple[np.ndarray, np.ndarray, str]:
        if self._forecaster is None:
            self._forecaster = self.forecaster(self.forecaster_name)
        return forecast_peaks(
            series, window.first_s, window.seconds, window.every_s, self._forecaster,
            self.forecaster_name,
        )  # fmt: skip

    def greenctl(
        self,
        store: Store,
        first: Plan,
        window: TraceWindow,
        round_of: Callable[[Plan, int, float], Round],
        load_time_s: Callable[[Plan, Plan], float],
    ) -> list[PolicyStep]:
        """greenctl's policy over the window's intervals (module docstring, steps 1-3)."""
        o = self.options
        rounds = replan.ReplanRounds(o.min_dwell_s)
        self.stats = rounds.stats
        running = first
        ref = float(running.request.get("carbon_intensity") or window.carbon[0])
        last_change: str | None = None
        n = window.intervals
        out = [PolicyStep(running, "start", round_of(running, 0, ref).forecast_rps)]
        for k in range(1, n):
            if o.progress:
                o.progress(k, n)
            when = iso_at(window.start_time, k * window.every_s)
            now = round_of(running, k, ref)
            action, new = rounds.decide(
                now.key,
                partial(
                    replan.replan_choice, store, running, threshold=o.threshold,
                    margin=o.margin, **now.replan,
                ),
                last_change=last_change, when=when,
            )  # fmt: skip
            if new is None:
                out.append(PolicyStep(running, action, now.forecast_rps))
            else:
                lt = load_time_s(running, new)
                out.append(PolicyStep(new, "change", now.forecast_rps, running, lt))
                running, ref, last_change = new, float(window.carbon[k]), when
        self.greenctl_s = time.perf_counter() - self.started
        return out

    def window_meta(self, window: TraceWindow, forecast_note: str) -> dict[str, Any]:
        o = self.options
        return {
            "from_offset_s": window.first_s,
            "start": window.start_time,
            "hours": window.seconds / 3600,
            "every_s": window.every_s,
            "intervals": window.intervals,
            "carbon": window.carbon_source,
            "forecaster": self.forecaster_name,
            "forecast": forecast_note,
            "threshold": o.threshold,
            "margin": o.margin,
            "min_dwell_s": o.min_dwell_s,
        }

    def finish(
        self,
        meta: dict[str, Any],
        summary: list[dict[str, Any]],
        rows: dict[str, list[dict[str, Any]]],
        columns: Sequence[str],
        summary_columns: Sequence[str],
        *,
        water: bool = True,
    ) -> dict[str, Any]:
        """The result: the notes on what was not modeled, the replanning counts and the wall
        time in ``meta``; its files written to ``out_dir``. ``water``: the result's water
        rests on ``--wue``/``--ewif`` (not on the kind's own inputs)."""
        o = self.options
        if self.unmodeled:
            self.notes.append(
                "reconfiguration time not modeled for "
                + ", ".join(sorted(self.unmodeled))
                + " (no load_time_s in the profiles): 0 s"
            )
        if water:
            given = o.wue_l_per_kwh is not None or o.ewif_l_per_kwh is not None
            meta["water"] = (
                {"wue_l_per_kwh": o.wue_l_per_kwh, "ewif_l_per_kwh": o.ewif_l_per_kwh}
                if given
                else None
            )
            if not given:
                self.notes.append("water not modeled: pass --wue/--ewif (L/kWh)")
        wall = time.perf_counter() - self.started
        meta.setdefault("layout", self.layout)
        meta.setdefault("replan", dict(self.stats))
        meta["wall_s"] = round(wall, 3)
        meta.setdefault("wall_greenctl_loop_s", round(self.greenctl_s or wall, 3))
        meta["notes"] = self.notes
        result: dict[str, Any] = {"meta": meta, "summary": summary, "intervals": rows}
        if o.out_dir is not None:
            meta["files"] = write_replay(
                result,
                o.out_dir,
                interval_columns=list(columns),
                summary_columns=list(summary_columns),
            )
        return result


def stored_plan(store: Store, plan: int | str) -> Plan:
    """The stored plan of id ``plan``."""
    text = str(plan).strip()
    if not text.isdigit():
        raise InputError(f"--plan '{plan}' is not a plan id", hint="see `greenctl plan list`")
    got = store.get_plan(int(text))
    if got is None:
        raise InputError(f"no plan {text}", hint="see `greenctl plan list`")
    return got


def chosen_baselines(
    kind: str, step: ReplayStep, asked: Sequence[str] | None, notes: list[str]
) -> tuple[str, ...]:
    """The baselines to run of those ``asked`` (None: the step's defaults): another kind's
    baseline is left out with a note, an unknown name refused."""
    known = {b for k in replayed_kinds() for b in (replay_step(k) or step).baselines}
    out: list[str] = []
    for name in step.default_baselines if asked is None else asked:
        if name in step.baselines:
            if name not in out:
                out.append(name)
        elif name in known:
            notes.append(
                f"{name}: not a baseline of a {kind} plan ({kind} baselines: "
                f"{', '.join(step.baselines)})"
            )
        else:
            raise InputError(
                f"--baseline {name!r} is unknown for a {kind} replay",
                hint=f"use one of {', '.join(step.baselines)}",
            )
    return tuple(out)
