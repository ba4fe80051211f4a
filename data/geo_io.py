"""CSV inputs and outputs of geographical load balancing (``greenctl plan geo``).

Three inputs with units in the column names and ISO 8601 times in equal steps: sites
(price, carbon, WUE, capacity, optional EWIF and PUE per site and time), demand
(``time,gateway,load_mw``) and optional routes (``gateway,site``); columns in
docs/formats.md. Every number must be finite and inside :data:`LIMITS` (a value outside is
a unit mistake and would break the solvers' numerics); prices alone may be negative. Every
reader names the file, line and column of the first bad value and raises
:class:`~greenctl.data.errors.FileFormatError` (exit 2). The result is one
:class:`GeoProblem` of dense ``[time, site]`` / ``[time, gateway]`` arrays.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.carbon_io import (
    CARBON_RANGE_HINT,
    MAX_CARBON_G_PER_KWH,
    check_region_name,
    read_utf8,
)
from greenctl.data.errors import FileFormatError, InputError, NotFoundError, shown

if TYPE_CHECKING:
    from greenctl.data.store import Store

SITES_REQUIRED = (
    "time",
    "site",
    "price_usd_per_mwh",
    "carbon_g_per_kwh",
    "wue_l_per_kwh",
    "capacity_mw",
)
SITES_OPTIONAL = ("ewif_l_per_kwh", "pue")
DEMAND_REQUIRED = ("time", "gateway", "load_mw")
ROUTES_REQUIRED = ("gateway", "site")
ROUTES_OPTIONAL = ("latency_ms",)
ALLOCATION_COLUMNS = ("time", "gateway", "site", "load_mw")

# The accepted range (lowest, highest) of every number the geo CSVs hold.
LIMITS: dict[str, tuple[float, float]] = {
    # market price caps: ERCOT 5,000 USD/MWh, Australia's NEM ~17,500 AUD/MWh; floors ~ -1,000
    "price_usd_per_mwh": (-1e5, 1e5),
    "carbon_g_per_kwh": (0.0, MAX_CARBON_G_PER_KWH),  # one bound for every carbon reader
    # WUE of evaporative cooling is a few L/kWh; hydro's EWIF reaches tens to a few hundred
    "wue_l_per_kwh": (0.0, 1000.0),
    "ewif_l_per_kwh": (0.0, 1000.0),
    "pue": (1.0, 10.0),  # facility energy over IT energy; real sites are 1.05-2.5
    "capacity_mw": (0.0, 1e6),  # a terawatt: a third of the world's electricity
    "load_mw": (0.0, 1e6),
    "latency_ms": (0.0, 1e6),
    "energy_j_per_request": (0.0, 1e9),
    "accuracy": (0.0, 1.0),
}


@dataclass
class GeoProblem:
    """A geographical load-balancing problem: T equal time steps, S sites, G gateways.

    Arrays are ``float64``: ``[T, S]`` for site traces, ``[T, G]`` for loads.
    ``routes`` is a ``[G, S]`` boolean mask of allowed pairs (None: every pair allowed),
    ``latency_ms`` a ``[G, S]`` array with NaN where unknown (None: no latency column).
    """

    times: list[str]
    step_h: float
    sites: list[str]
    gateways: list[str]
    price_usd_per_mwh: np.ndarray
    carbon_g_per_kwh: np.ndarray
    wue_l_per_kwh: np.ndarray
    ewif_l_per_kwh: np.ndarray
    pue: np.ndarray
    capacity_mw: np.ndarray
    load_mw: np.ndarray
    routes: np.ndarray | None = None
    latency_ms: np.ndarray | None = None
    sources: dict[str, str] = field(default_factory=dict)
    # first line of each time step in the demand file, for error messages
    demand_lines: list[int | None] = field(default_factory=list)

    @property
    def n_steps(self) -> int:
        return len(self.times)

    # Per-MW coefficients of one step: multiply by a load in MW to get the step's total.
    @property
    def cost_usd_per_mw(self) -> np.ndarray:
        """Energy cost of 1 MW of IT load for one step: h x pue x price."""
        return self.step_h * self.pue * self.price_usd_per_mwh

    @property
    def carbon_kg_per_mw(self) -> np.ndarray:
        """Carbon of 1 MW for one step: h x pue x intensity (g/kWh x MWh = kg)."""
        return self.step_h * self.pue * self.carbon_g_per_kwh

    @property
    def water_l_per_mw(self) -> np.ndarray:
        """Water of 1 MW for one step: 1000 x h x (wue + pue x ewif) litres."""
        return 1000.0 * self.step_h * (self.wue_l_per_kwh + self.pue * self.ewif_l_per_kwh)


# -- low-level CSV helpers ------------------------------------------------------------------
def _open_rows(path: Path, required: Iterable[str]) -> tuple[list[str], Iterator[list[str]], Any]:
    fh = io.StringIO(read_utf8(path), newline="")
    reader = csv.reader(fh)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        fh.close()
        raise FileFormatError(
            str(path), "the file is empty", line=1, hint=f"the header is {','.join(required)}"
        ) from None
    except csv.Error as exc:
        fh.close()
        raise FileFormatError(str(path), f"not a CSV file: {exc}", line=1) from None
    for col in required:
        if col not in header:
            fh.close()
            raise FileFormatError(
                str(path),
                f"missing column '{col}'",
                line=1,
                hint=f"the header needs {','.join(required)}",
            )
    for k, col in enumerate(header):
        if col and col in header[:k]:
            fh.close()
            raise FileFormatError(
                str(path),
                f"column '{shown(col)}' appears twice in the header",
                line=1,
                column=shown(col),
                hint="keep one column of each name",
            )
    return header, reader, fh


def _rows(path: Path, reader: Any, ncols: int) -> Iterator[tuple[int, list[str]]]:
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != ncols:
                raise FileFormatError(
                    str(path),
                    f"{len(row)} fields, the header has {ncols}",
                    line=reader.line_num,
                )
            yield reader.line_num, row
    except csv.Error as exc:
        raise FileFormatError(str(path), f"not a CSV row: {exc}", line=reader.line_num) from None


def _number(path: Path, line: int, column: str, text: str, *, default: float | None) -> float:
    """The number in ``column``, checked against :data:`LIMITS`."""
    text = text.strip()
    if not text:
        if default is not None:
            return default
        raise FileFormatError(str(path), "empty value", line=line, column=column)
    try:
        value = float(text)
    except ValueError:
        raise FileFormatError(
            str(path), f"'{shown(text)}' is not a number", line=line, column=column
        ) from None
    if math.isnan(value):
        raise FileFormatError(
            str(path), f"'{shown(text)}' is not a finite number", line=line, column=column
        )
    low, high = LIMITS[column]
    if not low <= value <= high:
        what = f"above {high:g}" if value > high else "negative" if low == 0 else f"below {low:g}"
        raise FileFormatError(
            str(path), f"{value:g} is {what}", line=line, column=column, hint=limit_hint(column)
        )
    return value


_MEANING = {
    "price_usd_per_mwh": "prices are USD per MWh",
    "wue_l_per_kwh": "water is litres per kWh",
    "ewif_l_per_kwh": "water is litres per kWh",
    "pue": "PUE is facility energy over IT energy",
    "capacity_mw": "capacity is the IT load a site can serve, in MW",
    "load_mw": "load is the power the requests need, in MW",
    "latency_ms": "latency is milliseconds",
    "energy_j_per_request": "energy is joules per request",
    "accuracy": "write accuracy as a fraction (0.761, not 76.1)",
}


def limit_hint(column: str) -> str:
    """The hint of a value outside ``LIMITS[column]``: what it means and its range."""
    if column == "carbon_g_per_kwh":
        return CARBON_RANGE_HINT
    low, high = LIMITS[column]
    return f"{_MEANING[column]}, from {low:g} to {high:g}"


_TIME_CACHE: dict[str, datetime] = {}


def _time(path: Path, line: int, text: str) -> datetime:
    text = text.strip()
    cached = _TIME_CACHE.get(text)
    if cached is not None:
        return cached
    try:
        value = datetime.fromisoformat(text)
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (ValueError, OverflowError):  # OverflowError: before year 1 or after 9999 in UTC
        raise FileFormatError(
            str(path),
            f"'{shown(text)}' is not an ISO 8601 time in years 1-9999",
            line=line,
            column="time",
            hint="write times like 2022-09-22T00:00:00Z",
        ) from None
    if len(_TIME_CACHE) < 1_000_000:
        _TIME_CACHE[text] = value
    return value


def _name(path: Path, line: int, column: str, text: str) -> str:
    try:
        return check_region_name(text, column)
    except ValueError as exc:
        raise FileFormatError(
            str(path), str(exc), line=line, column=column, hint=getattr(exc, "hint", None)
        ) from None


# -- readers ----------------------------------------------------------------------------------
@dataclass
class _Sites:
    times: list[datetime]
    time_text: list[str]
    step_h: float
    sites: list[str]
    arrays: dict[str, np.ndarray]


def read_sites(path: str | Path) -> _Sites:
    """Read and validate a sites CSV into ``[T, S]`` arrays (see the module docstring).

    Raises:
        FileFormatError: missing column, bad or negative number, bad time, duplicate or
            missing (time, site) row, uneven time steps; names file, line and column.
    """
    p = Path(path)
    header, reader, fh = _open_rows(p, SITES_REQUIRED)
    idx = {c: header.index(c) for c in (*SITES_REQUIRED, *SITES_OPTIONAL) if c in header}
    values: dict[tuple[datetime, str], tuple[int, list[float]]] = {}
    site_order: dict[str, None] = {}
    time_first: dict[datetime, tuple[int, str]] = {}
    cols = ("price_usd_per_mwh", "carbon_g_per_kwh", "wue_l_per_kwh", "capacity_mw")
    with fh:
        for line, row in _rows(p, reader, len(header)):
            t = _time(p, line, row[idx["time"]])
            site = _name(p, line, "site", row[idx["site"]])
            # market prices may be negative (LIMITS); every other quantity is >= 0
            nums = [_number(p, line, c, row[idx[c]], default=None) for c in cols]
            ewif = (
                _number(p, line, "ewif_l_per_kwh", row[idx["ewif_l_per_kwh"]], default=0.0)
                if "ewif_l_per_kwh" in idx
                else 0.0
            )
            pue = _number(p, line, "pue", row[idx["pue"]], default=1.0) if "pue" in idx else 1.0
            key = (t, site)
            if key in values:
                raise FileFormatError(
                    str(p),
                    f"site '{site}' has a second row for time {row[idx['time']].strip()} "
                    f"(first at line {values[key][0]})",
                    line=line,
                )
            values[key] = (line, [*nums, ewif, pue])
            site_order.setdefault(site, None)
            time_first.setdefault(t, (line, row[idx["time"]].strip()))
    if not values:
        raise FileFormatError(str(p), "no data rows", line=2)
    times = sorted(time_first)
    step_h = _check_steps(p, times, time_first)
    sites = list(site_order)
    T, S = len(times), len(sites)
    arr = np.empty((T, S, 6))
    t_index = {t: i for i, t in enumerate(times)}
    s_index = {s: j for j, s in enumerate(sites)}
    seen = np.zeros((T, S), dtype=bool)
    for (t, site), (_, nums) in values.items():
        i, j = t_index[t], s_index[site]
        arr[i, j] = nums
        seen[i, j] = True
    if not seen.all():
        i, j = map(int, np.argwhere(~seen)[0])
        raise FileFormatError(
            str(p),
            f"site '{sites[j]}' has no row for time {time_first[times[i]][1]} "
            f"({int((~seen).sum())} (time, site) rows missing in all)",
            hint="give every site one row at every time step",
        )
    names = (*cols, "ewif_l_per_kwh", "pue")
    return _Sites(
        times=times,
        time_text=[time_first[t][1] for t in times],
        step_h=step_h,
        sites=sites,
        arrays={n: np.ascontiguousarray(arr[:, :, k]) for k, n in enumerate(names)},
    )


def _check_steps(
    path: Path, times: list[datetime], first: dict[datetime, tuple[int, str]]
) -> float:
    if len(times) == 1:
        return 1.0
    deltas = [(b - a).total_seconds() for a, b in itertools.pairwise(times)]
    step = deltas[0]
    for k, d in enumerate(deltas):
        if abs(d - step) > 1e-6:
            line, text = first[times[k + 1]]
            raise FileFormatError(
                str(path),
                f"uneven time steps: {text} comes {d / 3600:g} h after "
                f"{first[times[k]][1]}, the first step is {step / 3600:g} h",
                line=line,
                column="time",
                hint="give every site a row at equal time steps (e.g. every hour)",
            )
    return step / 3600.0


def read_demand(
    path: str | Path, times: list[datetime], time_text: list[str] | None = None
) -> tuple[list[str], np.ndarray, list[int | None]]:
    """Read a demand CSV against the site times.

    Returns:
        (gateways in order of first appearance, ``[T, G]`` load in MW, first line of each
        time step in the file or None).

    Raises:
        FileFormatError: missing column, bad number, a time not in the sites file, a
            duplicate (time, gateway) row.
    """
    p = Path(path)
    header, reader, fh = _open_rows(p, DEMAND_REQUIRED)
    it, ig, il = (header.index(c) for c in DEMAND_REQUIRED)
    t_index = {t: i for i, t in enumerate(times)}
    g_index: dict[str, int] = {}
    rows: list[tuple[int, int, float]] = []
    seen: dict[tuple[int, int], int] = {}
    first_line: list[int | None] = [None] * len(times)
    with fh:
        for line, row in _rows(p, reader, len(header)):
            t = _time(p, line, row[it])
            if t not in t_index:
                raise FileFormatError(
                    str(p),
                    f"time {row[it].strip()} is not a time step of the sites file",
                    line=line,
                    column="time",
                    hint="demand and sites need the same time steps",
                )
            gw = _name(p, line, "gateway", row[ig])
            load = _number(p, line, "load_mw", row[il], default=None)
            i = t_index[t]
            g = g_index.setdefault(gw, len(g_index))
            if (i, g) in seen:
                raise FileFormatError(
                    str(p),
                    f"gateway '{gw}' has a second row for time {row[it].strip()} "
                    f"(first at line {seen[(i, g)]})",
                    line=line,
                )
            seen[(i, g)] = line
            if first_line[i] is None:
                first_line[i] = line
            rows.append((i, g, load))
    if not rows:
        raise FileFormatError(str(p), "no data rows", line=2)
    load_mw = np.zeros((len(times), len(g_index)))
    ii, gg, vv = zip(*rows, strict=True)
    load_mw[np.array(ii), np.array(gg)] = np.array(vv)
    return list(g_index), load_mw, first_line


def read_routes(
    path: str | Path, sites: list[str], gateways: list[str], *, demand_path: str = "demand"
) -> tuple[np.ndarray, np.ndarray | None]:
    """Read allowed (gateway, site) pairs.

    Returns:
        (``[G, S]`` boolean mask, ``[G, S]`` latency in ms with NaN where unknown, or None
        without a ``latency_ms`` column).

    Raises:
        FileFormatError: unknown site or gateway, duplicate pair, bad latency, or a gateway
            of the demand file with no allowed site.
    """
    p = Path(path)
    header, reader, fh = _open_rows(p, ROUTES_REQUIRED)
    ig, isite = header.index("gateway"), header.index("site")
    ilat = header.index("latency_ms") if "latency_ms" in header else None
    s_index = {s: j for j, s in enumerate(sites)}
    g_index = {g: i for i, g in enumerate(gateways)}
    mask = np.zeros((len(gateways), len(sites)), dtype=bool)
    latency = np.full(mask.shape, np.nan) if ilat is not None else None
    lines: dict[tuple[int, int], int] = {}
    with fh:
        for line, row in _rows(p, reader, len(header)):
            gw = _name(p, line, "gateway", row[ig])
            site = _name(p, line, "site", row[isite])
            if site not in s_index:
                raise FileFormatError(
                    str(p),
                    f"unknown site '{site}'",
                    line=line,
                    column="site",
                    hint=f"sites in the sites file: {', '.join(sites[:12])}"
                    + (" ..." if len(sites) > 12 else ""),
                )
            if gw not in g_index:
                raise FileFormatError(
                    str(p),
                    f"unknown gateway '{gw}' (not in the demand file)",
                    line=line,
                    column="gateway",
                    hint=f"gateways in the demand file: {', '.join(gateways[:12])}"
                    + (" ..." if len(gateways) > 12 else ""),
                )
            g, s = g_index[gw], s_index[site]
            if (g, s) in lines:
                raise FileFormatError(
                    str(p),
                    f"route {gw} -> {site} listed twice (first at line {lines[(g, s)]})",
                    line=line,
                )
            lines[(g, s)] = line
            mask[g, s] = True
            if ilat is not None and latency is not None:
                text = row[ilat].strip()
                if text:
                    latency[g, s] = _number(p, line, "latency_ms", text, default=None)
    missing = np.flatnonzero(~mask.any(axis=1))
    if missing.size:
        gw = gateways[int(missing[0])]
        raise FileFormatError(
            str(p),
            f"gateway '{gw}' of {demand_path} has no allowed site",
            hint=f"add a row '{gw},<site>' to {p.name}",
        )
    return mask, latency


def load_geo_problem(
    sites: str | Path, demand: str | Path, routes: str | Path | None = None
) -> GeoProblem:
    """Read and validate the three CSVs into a :class:`GeoProblem`.

    Raises:
        FileFormatError / InputError: the first bad value (file, line, reason), or a step
            whose total load exceeds the total site capacity (exit code 2).
    """
    s = read_sites(sites)
    gateways, load_mw, lines = read_demand(demand, s.times, s.time_text)
    mask, latency = (None, None)
    if routes is not None:
        mask, latency = read_routes(routes, s.sites, gateways, demand_path=str(demand))
    problem = GeoProblem(
        times=s.time_text,
        step_h=s.step_h,
        sites=s.sites,
        gateways=gateways,
        price_usd_per_mwh=s.arrays["price_usd_per_mwh"],
        carbon_g_per_kwh=s.arrays["carbon_g_per_kwh"],
        wue_l_per_kwh=s.arrays["wue_l_per_kwh"],
        ewif_l_per_kwh=s.arrays["ewif_l_per_kwh"],
        pue=s.arrays["pue"],
        capacity_mw=s.arrays["capacity_mw"],
        load_mw=load_mw,
        routes=mask,
        latency_ms=latency,
        sources={
            "sites": str(sites),
            "demand": str(demand),
            **({"routes": str(routes)} if routes is not None else {}),
        },
        demand_lines=lines,
    )
    check_capacity(problem)
    return problem


def check_capacity(problem: GeoProblem) -> None:
    """Reject a step whose total load exceeds the total capacity of all sites (exit 2)."""
    total = problem.load_mw.sum(axis=1)
    cap = problem.capacity_mw.sum(axis=1)
    over = np.flatnonzero(total > cap * (1 + 1e-9) + 1e-12)
    if over.size:
        i = int(over[0])
        line = problem.demand_lines[i] if i < len(problem.demand_lines) else None
        raise FileFormatError(
            problem.sources.get("demand", "demand"),
            f"at time {problem.times[i]} the total load {total[i]:.6g} MW exceeds the total "
            f"site capacity {cap[i]:.6g} MW ({over.size} step(s) in all)",
            line=line,
            hint="lower the load or raise capacity_mw in the sites file",
        )


def problem_to_csv(problem: GeoProblem, out_dir: str | Path) -> dict[str, Path]:
    """Write a problem as ``sites.csv``, ``demand.csv`` and (with routes) ``routes.csv``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"sites": out / "sites.csv", "demand": out / "demand.csv"}
    with paths["sites"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*SITES_REQUIRED, *SITES_OPTIONAL])
        for i, t in enumerate(problem.times):
            for j, s in enumerate(problem.sites):
                w.writerow(
                    [
                        t,
                        s,
                        repr(float(problem.price_usd_per_mwh[i, j])),
                        repr(float(problem.carbon_g_per_kwh[i, j])),
                        repr(float(problem.wue_l_per_kwh[i, j])),
                        repr(float(problem.capacity_mw[i, j])),
                        repr(float(problem.ewif_l_per_kwh[i, j])),
                        repr(float(problem.pue[i, j])),
                    ]
                )
    with paths["demand"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(DEMAND_REQUIRED)
        for i, t in enumerate(problem.times):
            for g, gw in enumerate(problem.gateways):
                w.writerow([t, gw, repr(float(problem.load_mw[i, g]))])
    if problem.routes is not None:
        paths["routes"] = out / "routes.csv"
        with paths["routes"].open("w", newline="") as fh:
            w = csv.writer(fh)
            lat = problem.latency_ms
            w.writerow(["gateway", "site", *(["latency_ms"] if lat is not None else [])])
            for g, gw in enumerate(problem.gateways):
                for j, s in enumerate(problem.sites):
                    if problem.routes[g, j]:
                        extra = []
                        if lat is not None:
                            extra = ["" if np.isnan(lat[g, j]) else repr(float(lat[g, j]))]
                        w.writerow([gw, s, *extra])
    return paths


def write_allocations(path: str | Path, rows: Iterable[tuple[Any, ...]]) -> int:
    """Write ``time,gateway,site,load_mw`` rows (a fifth element becomes a ``variant``
    column); returns the number of rows written.

    Raises:
        InputError: the file cannot be written (naming it).
    """
    n = 0
    try:
        with Path(path).open("w", newline="") as fh:
            w = csv.writer(fh)
            for row in rows:
                if n == 0:
                    w.writerow([*ALLOCATION_COLUMNS, *(["variant"] if len(row) > 4 else [])])
                t, gw, site, load, *rest = row
                w.writerow([t, gw, site, f"{load:.10g}", *rest])
                n += 1
            if n == 0:
                w.writerow(ALLOCATION_COLUMNS)
    except OSError as exc:
        raise InputError(f"cannot write allocations {path}: {exc.strerror}") from None
    return n


# -- heterogeneous models (variants) ------------------------------------------------------
VARIANTS_REQUIRED = ("variant", "energy_j_per_request", "accuracy")


@dataclass
class GeoVariants:
    """Model variants the sites may serve the load with.

    ``energy_j_per_request`` and ``accuracy`` are ``[M]``; ``allowed`` is ``[M, S]`` (which
    site may run which variant) or None for every site. The demand's ``load_mw`` is the
    power the requests need with the *reference* variant (the most accurate one; the
    highest energy among equally accurate ones); variant ``m`` needs ``relative_energy[m]``
    times that power for the same requests.
    """

    names: list[str]
    energy_j_per_request: np.ndarray
    accuracy: np.ndarray
    allowed: np.ndarray | None = None
    source: str = ""

    @property
    def reference(self) -> int:
        order = np.lexsort((-self.energy_j_per_request, -self.accuracy))
        return int(order[0])

    @property
    def relative_energy(self) -> np.ndarray:
        return self.energy_j_per_request / self.energy_j_per_request[self.reference]


def read_variants(path: str | Path, sites: list[str] | None = None) -> GeoVariants:
    """Read ``variant,energy_j_per_request,accuracy[,site]`` (one row per variant, or per
    variant and site to restrict where it runs).

    Raises:
        FileFormatError: missing column, bad number, energy <= 0, accuracy outside 0..1
            (percentages are rejected with a hint), unknown site, duplicate row.
    """
    p = Path(path)
    header, reader, fh = _open_rows(p, VARIANTS_REQUIRED)
    iv, ie, ia = (header.index(c) for c in VARIANTS_REQUIRED)
    isite = header.index("site") if "site" in header else None
    s_index = {s: j for j, s in enumerate(sites or [])}
    names: dict[str, tuple[float, float, int]] = {}
    where: dict[str, set[int] | None] = {}
    with fh:
        for line, row in _rows(p, reader, len(header)):
            name = _name(p, line, "variant", row[iv])
            energy = _number(p, line, "energy_j_per_request", row[ie], default=None)
            if energy <= 0:
                raise FileFormatError(
                    str(p),
                    "energy per request must be > 0",
                    line=line,
                    column="energy_j_per_request",
                )
            acc = _number(p, line, "accuracy", row[ia], default=None)  # 0..1 (LIMITS)
            site = row[isite].strip() if isite is not None else ""
            if name in names:
                first = names[name]
                if (first[0], first[1]) != (energy, acc):
                    raise FileFormatError(
                        str(p),
                        f"variant '{name}' has different figures than at line {first[2]}",
                        line=line,
                    )
            else:
                names[name] = (energy, acc, line)
            if site:
                if sites is not None and site not in s_index:
                    raise FileFormatError(
                        str(p), f"unknown site '{shown(site)}'", line=line, column="site"
                    )
                prev = where.setdefault(name, set())
                if prev is None:
                    raise FileFormatError(
                        str(p),
                        f"variant '{name}' is already allowed at every site",
                        line=line,
                        column="site",
                    )
                prev.add(s_index.get(site, -1))
            else:
                if name in where and where[name] is not None:
                    raise FileFormatError(
                        str(p), f"variant '{name}' listed twice", line=line, column="site"
                    )
                where[name] = None
    if not names:
        raise FileFormatError(str(p), "no data rows", line=2)
    variant_names = list(names)
    allowed = None
    if sites is not None and any(where.get(n) is not None for n in variant_names):
        allowed = np.zeros((len(variant_names), len(sites)), dtype=bool)
        for m, n in enumerate(variant_names):
            w = where.get(n)
            if w is None:
                allowed[m] = True
            else:
                allowed[m, sorted(w)] = True
    return GeoVariants(
        names=variant_names,
        energy_j_per_request=np.array([names[n][0] for n in variant_names]),
        accuracy=np.array([names[n][1] for n in variant_names]),
        allowed=allowed,
        source=str(p),
    )


def variants_from_store(store: Store, family: str) -> GeoVariants:
    """Variants of ``family`` with their accuracy and the lowest measured energy per request
    (over resources and batch sizes) from the store's latest profiles.

    Raises:
        NotFoundError / InputError: no such family, or no variant with both an accuracy and
            a profile with ``energy_j``.
    """
    variants = {v.name: v for v in store.variants(family)}
    if not variants:
        raise NotFoundError(
            f"no variants of family '{family}' in the store",
            hint="`greenctl profile ...` measures them; or pass --variants FILE.csv",
        )
    best: dict[str, float] = {}
    for prof in store.latest_profiles(family=family):
        if prof.energy_j is not None and prof.energy_j > 0:
            best[prof.variant] = min(best.get(prof.variant, math.inf), float(prof.energy_j))
    usable = [n for n in variants if n in best and variants[n].accuracy is not None]
    if not usable:
        raise InputError(
            f"no variant of '{family}' has both an accuracy and a profile with energy_j",
            hint="profile the variants (greenctl profile) or pass --variants FILE.csv",
        )
    acc = np.array([float(variants[n].accuracy or 0.0) for n in usable])
    acc = np.where(acc > 1, acc / 100.0, acc)  # some catalogs store percentages
    return GeoVariants(
        names=usable,
        energy_j_per_request=np.array([best[n] for n in usable]),
        accuracy=acc,
        source=f"store family {family}",
    )
