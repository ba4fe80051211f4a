"""Convert the eGLB authors' data layout into greenctl's geo CSVs.

The source (Ren-Research/Environmentally-Equitable-AI's ``data/``, bundled as
``greenctl/data/datasets/eglb``) holds per-site hourly carbon (kg/kWh), price (USD/MWh) and
water (WUE, L/kWh, direct + indirect) files and ``AI_workload.csv`` (watts of a BLOOM
cluster). The workload is normalised as the authors do and one unit read as 1 MW of IT
load, so greenctl's objective equals theirs number for number with ``--mu-carbon 1.5`` and
``--mu-water 0.06``; the unit conversion is in docs/models.md ("eGLB's data in greenctl's
units").
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from greenctl.data import bundled
from greenctl.data.carbon_io import read_utf8
from greenctl.data.errors import FileFormatError, InputError, shown
from greenctl.data.geo_io import LIMITS

# The authors' site order (their `country_list`; "Belguim" is their spelling).
EGLB_SITES = bundled.EGLB_SITES
PEAK_W = 2708.0  # the authors' normaliser: the trace's peak power
N_GATEWAYS = 10
ROUTE_CHOICES = ("all", "partial")


def bundled_eglb_dir() -> Path:
    """The copy of the authors' ``data/`` folder shipped with greenctl (``bundled:eglb``)."""
    return bundled.path_of("eglb")


LAYOUT_HINT = "SRC_DIR needs carbon/, price/, water/ and AI_workload.csv (the eGLB layout)"


@dataclass
class _Column:
    """One numeric column of an eGLB file: times, values and the line of each row."""

    times: list[str]
    values: list[float]
    lines: list[int]


def _read_column(path: Path, column: str, *, limit: str, scale: float = 1.0) -> _Column:
    """Read ``Time (UTC)`` and ``column``; ``value x scale`` must lie in ``LIMITS[limit]``."""
    fh = io.StringIO(read_utf8(path, hint=LAYOUT_HINT), newline="")
    out = _Column([], [], [])
    low, high = LIMITS[limit]
    with fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise FileFormatError(str(path), "the file is empty", line=1)
            # the water files name their column ' WUE (L/kWh)' with a leading space
            names = [h.strip() for h in header]
            if column not in names or "Time (UTC)" not in names:
                raise FileFormatError(
                    str(path), f"missing column '{column}' or 'Time (UTC)'", line=1
                )
            it, iv = names.index("Time (UTC)"), names.index(column)
            for row in reader:
                if not row or all(not c.strip() for c in row):
                    continue
                line = reader.line_num
                if max(it, iv) >= len(row):
                    raise FileFormatError(
                        str(path), f"{len(row)} fields, the header has {len(names)}", line=line
                    )
                try:
                    value = float(row[iv])
                except ValueError:
                    raise FileFormatError(
                        str(path), f"'{shown(row[iv])}' is not a number", line=line, column=column
                    ) from None
                if not low <= value * scale <= high:  # NaN fails both
                    raise FileFormatError(
                        str(path),
                        f"{value:g} is not a finite number from {low / scale:g} to {high / scale:g}",
                        line=line,
                        column=column,
                    )
                out.times.append(row[it].strip())
                out.values.append(value)
                out.lines.append(line)
        except csv.Error as exc:
            raise FileFormatError(
                str(path), f"not a CSV row: {exc}", line=reader.line_num
            ) from None
    return out


def _iso(text: str, path: Path, line: int) -> str:
    try:
        return datetime.strptime(text, "%Y-%m-%d %H").strftime("%Y-%m-%dT%H:00:00Z")
    except ValueError:
        raise FileFormatError(
            str(path),
            f"time '{shown(text)}' is not like 2022-09-22 00",
            line=line,
            column="Time (UTC)",
        ) from None


def convert_eglb(
    src_dir: str | Path | None,
    out_dir: str | Path,
    *,
    steps: int | None = None,
    routes: str = "all",
    sites: tuple[str, ...] | None = None,
) -> dict[str, Path]:
    """Write ``sites.csv``, ``demand.csv`` (and ``routes.csv``) into ``out_dir`` from eGLB's layout.

    ``src_dir`` is the authors' ``data/`` folder (None: the bundled copy); ``steps`` keeps the
    first hours (default all 457); ``routes`` is ``all`` (no routes file) or ``partial`` (the
    authors' mask); ``sites`` a subset of the ten (gateways follow).

    Returns:
        The written paths keyed ``sites``, ``demand`` (and ``routes``).
    Raises:
        InputError / FileFormatError: missing files, bad values, misaligned times.
    """
    src = bundled.resolve(src_dir) if src_dir is not None else bundled_eglb_dir()
    if routes not in ROUTE_CHOICES:
        raise InputError(f"routes must be one of {', '.join(ROUTE_CHOICES)}, got '{routes}'")
    chosen = tuple(sites) if sites else EGLB_SITES
    unknown = [s for s in chosen if s not in EGLB_SITES]
    if unknown:
        raise InputError(
            f"unknown eGLB site(s): {', '.join(unknown)}", hint=f"sites: {', '.join(EGLB_SITES)}"
        )
    wpath = src / "AI_workload.csv"
    # each gateway's load is power / PEAK_W MW: the power's bound follows load_mw's
    work = _read_column(wpath, "Power (Watt)", scale=1.0 / PEAK_W, limit="load_mw")
    wtimes, power_w = work.times, work.values
    if not wtimes:
        raise FileFormatError(str(wpath), "no data rows", line=2)
    n = len(wtimes) if steps is None else int(steps)
    if n < 1 or n > len(wtimes):
        raise InputError(f"steps must be between 1 and {len(wtimes)}, got {steps}")
    iso = [_iso(t, wpath, line) for t, line in zip(wtimes[:n], work.lines, strict=False)]
    traces: dict[str, dict[str, list[float]]] = {}
    for site in chosen:
        traces[site] = {}
        for key, rel, column, scale, limit in (
            # market prices go negative at times (Belgium, Germany): LIMITS keeps them
            ("price", f"price/{site}_Price.csv", "Price (USD/MWh)", 1.0, "price_usd_per_mwh"),
            ("carbon", f"carbon/{site}_carbon.csv", "Carbon (kg/kWh)", 1000.0, "carbon_g_per_kwh"),
            ("water", f"water/{site}_water.csv", "WUE (L/kWh)", 1.0, "wue_l_per_kwh"),
        ):
            path = src / rel
            col = _read_column(path, column, scale=scale, limit=limit)
            if len(col.values) < n:
                raise FileFormatError(
                    str(path), f"{len(col.values)} rows, {n} needed (the workload's length)"
                )
            if col.times[:n] != wtimes[:n]:
                k = next(i for i in range(n) if col.times[i] != wtimes[i])
                raise FileFormatError(
                    str(path),
                    f"time '{shown(col.times[k])}' does not match the workload's "
                    f"'{wtimes[k]}' (line {work.lines[k]})",
                    line=col.lines[k],
                    column="Time (UTC)",
                )
            traces[site][key] = col.values[:n]  # Japan & co. have 481 price rows: keep n
    try:
        return _write(Path(out_dir), iso, chosen, traces, power_w, routes)
    except OSError as exc:
        raise InputError(
            f"cannot write the CSVs to {out_dir}: {exc.strerror or exc}",
            hint="pass --output a folder you can write to",
        ) from None


def _write(
    out: Path,
    iso: list[str],
    chosen: tuple[str, ...],
    traces: dict[str, dict[str, list[float]]],
    power_w: list[float],
    routes: str,
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"sites": out / "sites.csv", "demand": out / "demand.csv"}
    with paths["sites"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [
                "time",
                "site",
                "price_usd_per_mwh",
                "carbon_g_per_kwh",
                "wue_l_per_kwh",
                "capacity_mw",
                "ewif_l_per_kwh",
                "pue",
            ]
        )
        for i, t in enumerate(iso):
            for site in chosen:
                tr = traces[site]
                w.writerow(
                    [
                        t,
                        site,
                        repr(tr["price"][i]),
                        repr(tr["carbon"][i] * 1000.0),
                        repr(tr["water"][i]),
                        "1.0",
                        "0.0",
                        "1.0",
                    ]
                )
    # The authors split the load over ten gateways; with a site subset we keep one gateway
    # per chosen site and scale the total by len(chosen)/10 so each site stays at capacity 1.
    with paths["demand"].open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["time", "gateway", "load_mw"])
        for i, t in enumerate(iso):
            per_gateway = power_w[i] / PEAK_W * N_GATEWAYS / N_GATEWAYS
            for site in chosen:
                w.writerow([t, site, repr(per_gateway)])
    if routes == "partial":
        mask_path = bundled_eglb_dir() / "routes_partial.csv"
        paths["routes"] = out / "routes.csv"
        with mask_path.open(newline="") as fin, paths["routes"].open("w", newline="") as fout:
            w = csv.writer(fout)
            w.writerow(["gateway", "site"])
            for row in csv.DictReader(fin):
                if row["gateway"] in chosen and row["site"] in chosen:
                    w.writerow([row["gateway"], row["site"]])
    return paths
