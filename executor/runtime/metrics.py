"""Prometheus exposition shared by the executors and the dispatcher: bucket bounds, the text
of a histogram, reading the text back (https://prometheus.io/docs/instrumenting/
exposition_formats/), the energy and carbon series and their sums over executors."""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from greenctl.data.errors import InputError

#: Request latency histogram bounds, seconds (Prometheus's base unit).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Rows-per-batch histogram bounds.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def bucket_index(bounds: tuple[float, ...], value: float) -> int:
    """The index of the first bound ``value`` fits under (``len(bounds)``: the +Inf bucket,
    NaN's too); ``bounds`` ascend."""
    if value != value:  # NaN fits under no bound
        return len(bounds)
    return bisect.bisect_left(bounds, value)


def histogram_lines(
    name: str,
    help_text: str,
    labels: str,
    bounds: tuple[float, ...],
    counts: list[int],
    total: float,
) -> list[str]:
    """A histogram's HELP, TYPE, cumulative buckets, sum and count lines.

    ``counts`` holds one count per bound and a last one for +Inf (see :func:`bucket_index`).
    """
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    acc = 0
    for b, c in zip(bounds, counts, strict=False):
        acc += c
        lines.append(f'{name}_bucket{{{labels},le="{b:g}"}} {acc}')
    acc += counts[-1]
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {acc}')
    lines.append(f"{name}_sum{{{labels}}} {total:.6f}")
    lines.append(f"{name}_count{{{labels}}} {acc}")
    return lines


def parse_prometheus(text: str) -> dict[str, float]:
    """Flatten Prometheus text into ``{"name{labels}": value}`` (used by ``greenctl status``,
    ``apply --verify`` and the dispatcher)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        with contextlib.suppress(ValueError):
            out[key] = float(value)
    return out


def label_value(key: str, name: str) -> str | None:
    """The value of label ``name`` in a flattened series key ``name{a="x",b="y"}``."""
    for marker in (f'{{{name}="', f',{name}="'):
        i = key.find(marker)
        if i >= 0:
            j = key.find('"', i + len(marker))
            return key[i + len(marker) : j]
    return None


# -- energy and carbon ------------------------------------------------------------------------
#: Prometheus names of the energy and carbon series (base units: joules, grams, watts; a
#: counter ends in ``_total``). Compare DCGM exporter's ``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
#: (counter, mJ) and ``DCGM_FI_DEV_POWER_USAGE`` (gauge, W), Kepler's
#: ``kepler_container_joules_total`` (counter, J).
ENERGY_TOTAL = "greenctl_energy_joules_total"
CARBON_TOTAL = "greenctl_carbon_grams_total"
POWER = "greenctl_power_watts"
GRID_INTENSITY = "greenctl_grid_intensity_grams_per_kwh"
#: tokens an LLM tier served, labelled ``variant`` and ``phase`` (``prefill``: prompt tokens,
#: ``decode``: output tokens)
LLM_TOKENS = "greenctl_llm_tokens_total"


def carbon_g(energy_j: float, carbon_g_per_kwh: float, pue: float = 1.0) -> float:
    """Grams of CO2eq of ``energy_j`` (IT energy) at a grid intensity, times PUE (the rule of
    :func:`greenctl.planner.core.evaluate.account`: kWh x PUE x g/kWh)."""
    return energy_j / 3.6e6 * pue * carbon_g_per_kwh


def check_carbon(
    carbon_g_per_kwh: float | None,
    pue: float,
    *,
    names: tuple[str, str] = ("--carbon-intensity", "--pue"),
) -> tuple[float | None, float]:
    """A grid intensity (g/kWh, None: none) and PUE to count carbon with, checked.

    Raises:
        InputError: an intensity that is not a number >= 0, or a PUE under 1 (``names`` say
            where they came from).
    """
    if carbon_g_per_kwh is not None and not (
        isinstance(carbon_g_per_kwh, int | float)
        and not isinstance(carbon_g_per_kwh, bool)
        and math.isfinite(carbon_g_per_kwh)
        and carbon_g_per_kwh >= 0
    ):
        raise InputError(f"{names[0]} must be >= 0 gCO2/kWh, got {carbon_g_per_kwh}")
    if (
        not (isinstance(pue, int | float) and not isinstance(pue, bool) and math.isfinite(pue))
        or pue < 1.0
    ):
        raise InputError(f"{names[1]} must be >= 1, got {pue}")
    return (None if carbon_g_per_kwh is None else float(carbon_g_per_kwh)), float(pue)


class EnergyExport:
    """An executor's energy counter rendered as Prometheus series; a sampler thread reads it
    every ``interval_s`` (the power gauge is the mean over the last interval, and a RAPL
    counter is read more often than it wraps).

    Args:
        counter: a :class:`greenctl.profiler.energy.EnergyCounter`, or None when nothing can
            say (then only a comment saying why is rendered: never a silent zero).
        carbon_g_per_kwh: the grid intensity the plan was made with (None: no carbon series).
        pue: facility energy over IT energy; the carbon counter includes it, energy does not.
    """

    def __init__(
        self,
        counter: Any,
        *,
        carbon_g_per_kwh: float | None = None,
        pue: float = 1.0,
        notes: list[str] | None = None,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counter = counter
        self.carbon_g_per_kwh = carbon_g_per_kwh
        self.pue = pue
        self.notes = list(notes or [])
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last = (clock(), 0.0)
        #: (joules, grams) counted at earlier intensities (see :meth:`set_carbon`)
        self._carbon_base = (0.0, 0.0)
        self.power_w = 0.0 if counter is None else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def source(self) -> str | None:
        return None if self.counter is None else str(self.counter.source)

    def sample(self) -> None:
        """Read the counter and update the power gauge (the mean since the last sample)."""
        if self.counter is None:
            return
        now, joules = self._clock(), float(self.counter.joules())
        with self._lock:
            t0, j0 = self._last
            if now > t0:
                self.power_w = max(joules - j0, 0.0) / (now - t0)
            self._last = (now, joules)

    def _grams(self, joules: float) -> float | None:
        """Carbon so far (lock held): earlier intensities' grams, then this one's."""
        if self.carbon_g_per_kwh is None:
            return None
        base_j, base_g = self._carbon_base
        return base_g + carbon_g(max(joules - base_j, 0.0), self.carbon_g_per_kwh, self.pue)

    def set_carbon(self, carbon_g_per_kwh: float | None, pue: float) -> None:
        """Count carbon from now on at a new grid intensity and PUE (a replan applied with a
        new signal keeps this executor): the carbon counted so far stays, so the counter
        never goes back."""
        joules = 0.0 if self.counter is None else float(self.counter.joules())
        with self._lock:
            grams = self._grams(joules)
            self._carbon_base = (joules, self._carbon_base[1] if grams is None else grams)
            self.carbon_g_per_kwh, self.pue = carbon_g_per_kwh, pue

    def start(self) -> None:
        if self.counter is None or self._thread is not None:
            return

        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                with contextlib.suppress(Exception):  # a failed read skips one sample
                    self.sample()

        self._thread = threading.Thread(target=loop, name="energy", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def render(self, labels: str) -> list[str]:
        if self.counter is None:
            why = "; ".join(self.notes) or "no energy source"
            return [f"# greenctl: no energy series: {why}"]
        joules = float(self.counter.joules())
        with self._lock:
            power = self.power_w
            grams = self._grams(joules)
            intensity = self.carbon_g_per_kwh
        src = f'{labels},source="{self.counter.source}"'
        lines = [
            f"# HELP {ENERGY_TOTAL} Energy used by this executor since it started (IT energy; "
            "source nvml|nvml-attributed|rapl measured, modeled estimated).",
            f"# TYPE {ENERGY_TOTAL} counter",
            f"{ENERGY_TOTAL}{{{src}}} {joules:.6f}",
            f"# HELP {POWER} Mean power of this executor over the last second.",
            f"# TYPE {POWER} gauge",
        ]
        if power is not None:
            lines.append(f"{POWER}{{{src}}} {power:.6f}")
        if grams is not None and intensity is not None:
            lines += [
                f"# HELP {CARBON_TOTAL} CO2eq of this executor's energy (x PUE) at the grid "
                "intensity of the plan that ran it (each interval at its plan's).",
                f"# TYPE {CARBON_TOTAL} counter",
                f"{CARBON_TOTAL}{{{src}}} {grams:.9f}",
                f"# HELP {GRID_INTENSITY} Grid carbon intensity the executor counts carbon with.",
                f"# TYPE {GRID_INTENSITY} gauge",
                f"{GRID_INTENSITY}{{{labels}}} {intensity:g}",
            ]
        else:
            lines.append(
                f"# greenctl: no {CARBON_TOTAL}: no grid intensity given (--carbon-intensity)"
            )
        return lines


class IncreaseSum:
    """Sums of counters' increases over series that come and go, as Prometheus's
    ``increase()`` counts them: a value below the last one is a reset (the process restarted,
    its counter from zero), and counts whole.

    A series is keyed by its source (an executor process and the series' name and labels);
    its increases add to a total keyed by what it is summed into (name, model, source).
    """

    def __init__(self) -> None:
        self.totals: dict[tuple[str, ...], float] = {}
        self._last: dict[Hashable, float] = {}

    def observe(
        self, series: Hashable, value: float, into: tuple[str, ...], *, baseline: bool = False
    ) -> None:
        """Add ``series``'s increase since it was last seen to ``into``'s total. A series
        seen for the first time counts from zero, or, with ``baseline``, from ``value`` (its
        past was counted elsewhere: by the dispatcher this one replaced)."""
        if not math.isfinite(value):
            return
        last = self._last.get(series)
        if last is None:
            inc = 0.0 if baseline else value
        elif value >= last:
            inc = value - last
        else:  # reset
            inc = value
        self._last[series] = value
        self.totals[into] = self.totals.get(into, 0.0) + max(inc, 0.0)

    def keep(self, alive: Callable[[Hashable], bool]) -> None:
        """Forget the series ``alive`` says are gone (their totals stay)."""
        for series in [s for s in self._last if not alive(s)]:
            del self._last[series]


def model_energy_lines(
    totals: dict[tuple[str, ...], float], carbon_g_per_kwh: float | None
) -> list[str]:
    """The dispatcher's energy and carbon series: per model and source, the totals of
    :class:`IncreaseSum` keyed ``(name, model, source)``, and the grid intensity the running
    plan was made with (a comment when it has none)."""
    lines: list[str] = []
    for name, help_text in (
        (ENERGY_TOTAL, "Energy used by each model's executors (sum of every executor "
         "process's counter increase; IT energy)."),
        (CARBON_TOTAL, "CO2eq of each model's executors (x PUE), at the intensity each was "
         "counted with."),
    ):  # fmt: skip
        rows = sorted((k, v) for k, v in totals.items() if k[0] == name)
        if not rows:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
        for (_, model, source), value in rows:
            lines.append(f'{name}{{model="{model}",source="{source}"}} {float(value)!r}')
    lines += [
        f"# HELP {GRID_INTENSITY} Grid carbon intensity the running plan was made with.",
        f"# TYPE {GRID_INTENSITY} gauge",
    ]
    if carbon_g_per_kwh is None:
        lines.append(f"# greenctl: no {GRID_INTENSITY}: the running plan has no grid intensity")
    else:
        lines.append(f"{GRID_INTENSITY} {carbon_g_per_kwh:g}")
    return lines


def llm_token_lines(counts: dict[tuple[str, str], int]) -> list[str]:
    """The dispatcher's token counter: per LLM tier (``variant``) and ``phase``."""
    if not counts:
        return []
    lines = [
        f"# HELP {LLM_TOKENS} Tokens served per LLM tier and phase (prefill: prompt tokens, "
        "decode: output tokens), as the engines reported them.",
        f"# TYPE {LLM_TOKENS} counter",
    ]
    for (variant, phase), n in sorted(counts.items()):
        lines.append(f'{LLM_TOKENS}{{variant="{variant}",phase="{phase}"}} {n}')
    return lines
