"""What a plan kind's replay step is, and what the replay loop offers it.

``greenctl replay`` runs one loop (:func:`greenctl.executor.control.replay.replay`) over a
kind's plan: it checks the options every kind shares, finds the stored plan or the request,
and calls the kind's step (:class:`ReplayStep`). The step plans its first configuration, runs
its baselines and accounts each interval of each policy in its own figures; for what every
kind does alike it calls the loop back (:class:`ReplayLoop`): the window of the traces, the
forecasts, greenctl's replanning rounds (the decision ``replan`` takes, the dwell and the
reconfiguration time) and the result in one shape, written as files.

A kind's record names its step (``replay``; the built-in kinds' steps sit beside them in
``executor/kinds/<kind>_replay.py``); the kinds a replay takes are the registered kinds that
have one (:func:`replayed_kinds`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from greenctl.data.carbon_io import iso, parse_time
from greenctl.data.errors import InputError
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL_S, REPLAN_THRESHOLD
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import KINDS

if TYPE_CHECKING:
    from greenctl.data.store import Store


#: the first columns of one interval of one policy in a replay of a request trace (mix, mig,
#: glet); each kind's interval columns go on from these
TRACE_INTERVAL_COLUMNS = (
    "policy",
    "interval",
    "time",
    "offset_s",
    "requests",
    "peak_rps",
    "forecast_rps",
    "carbon_g_per_kwh",
    "action",
    "config",
    "units",
)


@dataclass(frozen=True)
class ReplayOptions:
    """The options of a replay that every kind reads (``greenctl replay``'s shared ones)."""

    load_trace: str | None = None  # requests per second (a geo plan reads its files)
    region: str | None = None  # a stored carbon signal
    carbon_trace: str | None = None  # or a carbon signal file
    start: str | None = None  # --from: an offset into the traces or a time
    hours: float | None = None  # the window's length (None: the rest)
    every: str | float | int = 60  # the replanning interval
    threshold: float = REPLAN_THRESHOLD
    margin: float = REPLAN_MARGIN
    min_dwell_s: float = REPLAN_MIN_DWELL_S
    forecaster: str | None = None  # None: the default forecaster
    baselines: Sequence[str] | None = None  # None: the kind's defaults
    wue_l_per_kwh: float | None = None
    ewif_l_per_kwh: float | None = None
    out_dir: str | None = None  # also write the result's files there
    progress: Callable[[int, int], None] | None = None
    #: the kind's own options (a mix replay's ``vpa_variant``, a glet replay's
    #: ``model_traces``, ...): :attr:`ReplayStep.options` names those it takes
    kind_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class TraceWindow:
    """The part of the traces a replay covers."""

    rps: np.ndarray  # per second, the whole trace (history before the window included)
    first_s: int  # the window's first second in ``rps``
    seconds: int  # the window's length
    every_s: int
    start_time: str  # the window's first instant (ISO)
    carbon: np.ndarray  # g/kWh per interval
    carbon_source: str

    @property
    def intervals(self) -> int:
        return -(-self.seconds // self.every_s)

    @property
    def end_s(self) -> int:
        """The second after the window's last, in ``rps``."""
        return self.first_s + self.seconds

    def interval_rates(self, k: int) -> np.ndarray:
        a = self.first_s + k * self.every_s
        return self.rps[a : min(a + self.every_s, self.end_s)]


@dataclass
class PolicyStep:
    """What one policy does in one interval."""

    plan: Plan | None  # what serves after the change (None: nothing)
    action: str
    forecast_rps: float | None = None
    previous: Plan | None = None  # what serves while the new instances load
    reconfig_s: float = 0.0
    down: bool = False  # nothing serves during reconfig_s (an eviction)


@dataclass(frozen=True)
class Round:
    """One replanning round of greenctl, as a kind's step describes it to the loop."""

    key: Any  # what the round's decision reads (a repeated key is answered from a memo)
    #: ``replan_choice``'s keywords of the round: ``signal``, ``reference`` and the load
    #: (``rate`` or ``forecast``)
    replan: Mapping[str, Any]
    forecast_rps: float  # the load the round plans for, as the result shows it


@dataclass(frozen=True)
class ReplayInputs:
    """What the loop hands a kind's step: the kind, its request, its options."""

    kind: str
    request: dict[str, Any]
    first_plan: Plan | None  # a stored plan to start from (None: plan the request)
    baselines: tuple[str, ...]  # the step's own baselines asked for
    options: ReplayOptions


class ReplayLoop(Protocol):
    """What the replay loop does for every kind's step."""

    every_s: int
    notes: list[str]  # the result's notes, in order
    unmodeled: set[str]  # variants whose reconfiguration time is not modeled
    stats: dict[str, int]  # the replanning rounds' counts (the result's ``replan``)

    def forecaster(self, name: str) -> Any:
        """The forecaster of this name (a saved one, or a rule-based kind).

        Raises:
            NotFoundError: there is none.
        """
        ...

    def start(self) -> tuple[int, str | None]:
        """``--from``: (an offset into the traces in seconds, or 0 and a time (ISO))."""
        ...

    def window(self, load_trace: str, carbon_intensity: float) -> TraceWindow:
        """The window of ``load_trace`` and the carbon signal (else ``carbon_intensity``)."""
        ...

    def forecast(
        self, series: np.ndarray, window: TraceWindow
    ) -> tuple[np.ndarray, np.ndarray, str]:
        """(forecasts, actual peaks, a note) of a per-second series' interval peaks."""
        ...

    def greenctl(
        self,
        store: Store,
        first: Plan,
        window: TraceWindow,
        round_of: Callable[[Plan, int, float], Round],
        load_time_s: Callable[[Plan, Plan], float],
    ) -> list[PolicyStep]:
        """greenctl's policy: ``round_of(running, interval, reference signal)`` each interval,
        decided as ``replan`` decides (with the dwell); a change pays ``load_time_s``."""
        ...

    def window_meta(self, window: TraceWindow, forecast_note: str) -> dict[str, Any]:
        """The result's meta on the window, the forecasts and the replanning options."""
        ...

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
        """The result (``{"meta", "summary", "intervals"}``), its files written; ``water``:
        its water rests on ``--wue``/``--ewif`` (meta and a note say so)."""
        ...


@dataclass(frozen=True)
class ReplayStep:
    """A plan kind's replay step."""

    #: run(store, inputs, loop) -> the result (``loop.finish``'s)
    run: Callable[[Store, ReplayInputs, ReplayLoop], dict[str, Any]]
    #: the baselines it runs, and those it runs unless told (a default that is not its own
    #: is left out with a note, as any other kind's baseline asked of it)
    baselines: tuple[str, ...]
    default_baselines: tuple[str, ...]
    #: the names of its own options (:attr:`ReplayOptions.kind_options`)
    options: tuple[str, ...] = ()
    #: the shape of its result, which the chart and the tables follow (:data:`LAYOUTS`);
    #: None: :func:`replay_layout`'s rule
    layout: str | None = None


#: the shapes of a replay's result: per interval of a serving configuration (load, units,
#: SLO violations), per model of models sharing GPUs in turn, per slot of load routed
#: across sites
LAYOUTS = ("serving", "models", "sites")


def replay_layout(kind: str, step: ReplayStep) -> str:
    """The shape of a ``kind`` replay's result (its ``meta.layout``): the step's own, else
    ``sites`` for a kind that routes load across sites, ``models`` for one whose models
    share partitions in turn, else ``serving``.

    Raises:
        InputError: the step names a layout not in :data:`LAYOUTS`.
    """
    if step.layout is not None:
        if step.layout not in LAYOUTS:
            raise InputError(
                f"the {kind} kind's replay step has layout {step.layout!r}",
                hint=f"a step's layout is one of {', '.join(LAYOUTS)}",
            )
        return step.layout
    record = KINDS[kind]
    if record.routes is not None:
        return "sites"
    return "models" if record.time_shared else "serving"


def replay_step(kind: str) -> ReplayStep | None:
    """The registered ``kind``'s replay step (its record's ``replay``, a step or where one is
    as ``"module:attribute"``); None: the kind does not replay.

    Raises:
        InputError: the record names a step that cannot be imported or is not a step.
    """
    record = KINDS.get(kind)
    if record is None or record.replay is None:
        return None
    step = record.replay
    if isinstance(step, str):
        module, _, attribute = step.partition(":")
        try:
            step = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise InputError(
                f"the {kind} kind's replay step {record.replay!r} cannot be loaded: {exc}",
                hint="reinstall the package that provides the kind",
            ) from None
    if not isinstance(step, ReplayStep):
        raise InputError(
            f"the {kind} kind's replay step {record.replay!r} is not a ReplayStep",
            hint="reinstall the package that provides the kind",
        )
    return step


def replayed_kinds() -> tuple[str, ...]:
    """The registered kinds that replay, in the registry's order."""
    return tuple(k for k in KINDS if replay_step(k) is not None)


@dataclass(frozen=True)
class Footprint:
    """What a kilowatt-hour at the servers costs in carbon and water."""

    pue: float = 1.0
    wue_l_per_kwh: float | None = None  # direct water (None: not modeled)
    ewif_l_per_kwh: float | None = None  # the electricity's water

    def carbon_g(self, kwh: float, carbon_g_per_kwh: float) -> float:
        return kwh * self.pue * carbon_g_per_kwh

    def water_l(self, kwh: float | None) -> float | None:
        """Litres of water of ``kwh``; None when no water intensity is given or the energy
        is unknown."""
        if kwh is None or (self.wue_l_per_kwh is None and self.ewif_l_per_kwh is None):
            return None
        return kwh * (self.pue * (self.ewif_l_per_kwh or 0.0) + (self.wue_l_per_kwh or 0.0))


@dataclass(frozen=True)
class Interval:
    """One interval of a trace window, as a policy's accounting reads it."""

    k: int
    time: str  # its first instant (ISO)
    offset_s: float  # from the window's start
    carbon_g_per_kwh: float
    peak_rps: float  # the actual peak of its arrivals (of every model)


def iso_at(start: str, seconds: float) -> str:
    """The ISO time ``seconds`` after ``start``."""
    return iso(parse_time(start) + timedelta(seconds=seconds))


def intervals(window: TraceWindow, peaks: np.ndarray) -> list[Interval]:
    """The window's intervals; ``peaks``: each one's actual peak."""
    return [
        Interval(
            k,
            iso_at(window.start_time, k * window.every_s),
            k * window.every_s,
            float(window.carbon[k]),
            float(peaks[k]),
        )
        for k in range(window.intervals)
    ]
