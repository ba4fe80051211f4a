"""Importers for grid carbon-intensity signals, and the optional live adapters.

Every reader turns a file into :class:`CarbonPoint` rows in gCO2/kWh with ISO UTC times;
:func:`import_carbon` stores them in one transaction (a malformed file stores nothing).
Formats (``--format``): ``csv`` (``time,region,carbon_g_per_kwh``, kg columns converted),
``carbon-aware-sdk``, ``watttime``, ``electricitymaps``, ``electricitymaps-csv``
(life-cycle preferred), ``clover`` (hourly values from ``start``, default
:data:`CLOVER_DEFAULT_START`) and ``eglb``. Values must be finite, within 0 and
:data:`MAX_CARBON_G_PER_KWH`, with parseable times and short printable regions; the first
bad one raises :class:`FileFormatError` naming file, line and column. See docs/carbon.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data import bundled
from greenctl.data.errors import FileFormatError, GreenctlError, InputError, shown
from greenctl.data.records import iso_utc, utcnow_iso
from greenctl.data.records import parse_time as parse_any_time

if TYPE_CHECKING:
    from greenctl.data.store import Store

FORMATS = (
    "auto",
    "csv",
    "carbon-aware-sdk",
    "watttime",
    "electricitymaps",
    "electricitymaps-csv",
    "clover",
    "eglb",
)
KINDS = ("average", "marginal")
# Clover's traces carry no timestamps; they are placed hourly from this instant unless the
# user passes --start. (Clover's traces are March/September days; the date is nominal.)
CLOVER_DEFAULT_START = "2021-03-01T00:00:00Z"
LBS_PER_MWH_TO_G_PER_KWH = 453.59237 / 1000.0
# The highest grid carbon intensity greenctl accepts, in gCO2/kWh. The dirtiest grids
# average about 1,000-1,200 g/kWh and lignite plants emit about 1,100-1,300, so nothing real
# is above 2,000; a larger value is a unit mistake (kg vs g, lbs/MWh) or garbage. Every
# reader of carbon intensities (signal files, geo sites CSVs, eGLB traces) checks this one
# bound through :func:`check_carbon_g_per_kwh`.
MAX_CARBON_G_PER_KWH = 2000.0
# Region / zone names are short identifiers (CISO, DE, US-CAL-CISO, CAISO_NORTH).
MAX_REGION_CHARS = 100

# The bundled carbon traces, name -> (file under datasets/, format, default region): a view of
# the one registry of bundled data sets (greenctl.data.bundled), kept for this module's callers.
BUNDLED_TRACES: dict[str, tuple[str, str, str]] = {
    d.name: (d.path, d.carbon_format, d.region or "")
    for d in bundled.DATASETS.values()
    if d.carbon_format
}


@dataclass(frozen=True)
class CarbonPoint:
    """One carbon-intensity value of one region at one time (gCO2/kWh)."""

    region: str
    time: str  # ISO 8601 UTC with Z
    carbon_g_per_kwh: float
    kind: str = "average"
    source: str = ""

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


# -- time helpers -----------------------------------------------------------------------------
def read_utf8(path: str | Path, *, what: str = "", hint: str | None = None) -> str:
    """The text of a UTF-8 file (a BOM dropped), newlines untouched.

    Raises:
        InputError: missing, a directory, unreadable. FileFormatError: not UTF-8, naming
            the line of the first bad byte.
    """
    p = Path(path)
    name = f"{what} {p}" if what else str(p)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{name} does not exist", hint=hint) from None
    except OSError as exc:  # a directory, no permission
        raise InputError(f"cannot read {name}: {exc.strerror or exc}", hint=hint) from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            str(p),
            f"not UTF-8 text (byte {exc.start + 1} is {data[exc.start]:#04x})",
            line=data.count(b"\n", 0, exc.start) + 1,
            hint="save the file as UTF-8 text; a binary file is no input",
        ) from None


#: ``YYYY-MM-DDTHH:MM:SSZ`` of an aware datetime: the store's one text form of times.
iso = iso_utc


def parse_time(text: Any) -> datetime:
    """A signal's time (:func:`greenctl.data.records.parse_time`; no clock-skew limit, a
    forecast lies ahead).

    Raises:
        ValueError: naming the value: ``'x' is not an ISO 8601 time``.
    """
    if not isinstance(text, datetime) and not str(text).strip():
        raise ValueError("empty time")
    try:
        return parse_any_time(text)
    except ValueError as exc:
        raise ValueError(f"'{shown(text)}' is {exc}") from None


def normalise_time(text: Any) -> str:
    """Parse and re-format a time as ISO UTC; raises ValueError when unparseable."""
    return iso(parse_time(text))


CARBON_RANGE_HINT = (
    f"carbon intensity is gCO2/kWh between 0 and {MAX_CARBON_G_PER_KWH:g} (the dirtiest grids "
    "are about 1,000-1,200); check the value's unit (kg/kWh and lbs/MWh need their own "
    "column or units field)"
)


class _BadValue(ValueError):
    """A value a reader refuses, with the hint its FileFormatError carries."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def check_carbon_g_per_kwh(value: float) -> float:
    """``value`` if it is a finite carbon intensity in 0..:data:`MAX_CARBON_G_PER_KWH` g/kWh.

    Raises:
        ValueError: NaN, infinite, negative or above the ceiling (``hint`` names the fix).
    """
    if math.isnan(value):
        raise _BadValue("NaN is not a number", CARBON_RANGE_HINT)
    if value < 0:
        raise _BadValue(f"{value:g} g/kWh is negative", CARBON_RANGE_HINT)
    if value > MAX_CARBON_G_PER_KWH:
        raise _BadValue(
            f"{value:g} g/kWh is above {MAX_CARBON_G_PER_KWH:g} g/kWh, more than any grid emits",
            CARBON_RANGE_HINT,
        )
    return value


def carbon_option(value: Any, name: str = "--carbon-intensity", *, positive: bool = False) -> float:
    """A carbon intensity given as an option or request field, checked like a file's values.

    Raises:
        InputError: not a number, NaN, infinite, negative (or zero with ``positive``), or above
            :data:`MAX_CARBON_G_PER_KWH`; the message names ``name``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(
            f"{name} must be a number of gCO2/kWh, got {value!r}", hint=CARBON_RANGE_HINT
        )
    try:
        out = check_carbon_g_per_kwh(float(value))
    except _BadValue as exc:
        raise InputError(f"{name}: {exc}", hint=exc.hint) from None
    if positive and out == 0:
        raise InputError(f"{name} must be > 0 gCO2/kWh, got 0", hint=CARBON_RANGE_HINT)
    return out


def _value(raw: Any, *, factor: float = 1.0) -> float:
    if isinstance(raw, bool) or raw is None:
        raise _BadValue(f"{raw!r} is not a number", CARBON_RANGE_HINT)
    try:
        value = float(str(raw).strip()) if isinstance(raw, str) else float(raw)
    except OverflowError:  # a JSON integer beyond 1e308
        raise _BadValue(f"{shown(raw)} is too large", CARBON_RANGE_HINT) from None
    except (TypeError, ValueError):
        raise _BadValue(f"'{shown(raw)}' is not a number", CARBON_RANGE_HINT) from None
    if not math.isfinite(value):
        raise _BadValue(f"'{shown(raw)}' is not a finite number", CARBON_RANGE_HINT)
    return check_carbon_g_per_kwh(value * factor)


def _refuse(
    path: str, exc: ValueError, *, line: int | None = None, column: str | None = None
) -> FileFormatError:
    """The FileFormatError of a value a check refused (keeps the check's hint)."""
    hint = exc.hint if isinstance(exc, _BadValue) else None
    return FileFormatError(path, str(exc), line=line, column=column, hint=hint)


TIME_HINT = "write times as ISO 8601, e.g. 2022-09-22T13:00:00Z"


def _time(path: str, raw: Any, *, line: int | None = None, column: str | None = None) -> str:
    """A time read from a file as ISO UTC (``YYYY-MM-DDTHH:MM:SSZ``)."""
    try:
        return normalise_time(raw)
    except ValueError as exc:
        raise FileFormatError(path, str(exc), line=line, column=column, hint=TIME_HINT) from None


REGION_HINT = f"use a short name like CISO or DE (printable, at most {MAX_REGION_CHARS} characters)"


def check_region_name(raw: Any, what: str = "region") -> str:
    """``raw`` stripped if it is a region / site name: non-empty, printable, short.

    Raises:
        ValueError: anything else (``hint`` names the fix).
    """
    if not isinstance(raw, str):
        raise _BadValue(f"{what} {shown(raw)} is not a string", REGION_HINT)
    name = raw.strip()
    if not name:
        raise _BadValue(f"empty {what}", REGION_HINT)
    if len(name) > MAX_REGION_CHARS or not name.isprintable():
        raise _BadValue(f"{what} '{shown(name)}' is not a name", REGION_HINT)
    return name


def _region(
    path: str, raw: Any, *, line: int | None = None, column: str | None = None, what: str = "region"
) -> str:
    """A region name read from a file (see :func:`check_region_name`)."""
    try:
        return check_region_name(raw, what)
    except ValueError as exc:
        raise _refuse(path, exc, line=line, column=column) from None


# -- format detection ---------------------------------------------------------------------------
def detect_format(path: str | Path, text: str) -> str:
    """Guess the format of a carbon file from its content.

    Raises:
        FileFormatError: nothing matches; the hint lists the formats.
    """
    stripped = text.lstrip("\ufeff \t\r\n")
    hint = f"pass --format, one of {', '.join(FORMATS[1:])}"
    if stripped.startswith(("{", "[")):
        doc = _load_json(str(path), text)
        if isinstance(doc, dict):
            if "data" in doc and isinstance(doc.get("meta"), dict):
                return "watttime"
            if "history" in doc or "forecast" in doc or "carbonIntensity" in doc:
                return "electricitymaps"
            if "forecastData" in doc:
                return "carbon-aware-sdk"
        if isinstance(doc, list) and doc and isinstance(doc[0], dict):
            first = doc[0]
            if "forecastData" in first or {"location", "rating"} <= set(first):
                return "carbon-aware-sdk"
            if "point_time" in first:
                return "watttime"
            if "carbonIntensity" in first:
                return "electricitymaps"
        raise FileFormatError(str(path), "unrecognised JSON carbon document", hint=hint)
    first_line = stripped.splitlines()[0] if stripped else ""
    header = [h.strip().lower() for h in first_line.split(",")]
    if "time (utc)" in header and any(h.startswith("carbon (kg/kwh)") for h in header):
        return "eglb"
    if "datetime (utc)" in header:
        return "electricitymaps-csv"
    if "time" in header:
        return "csv"
    lines = [ln.strip() for ln in stripped.splitlines() if ln.strip()]
    if len(lines) >= 2 and "," not in first_line:
        try:
            float(lines[1])
            return "clover"
        except ValueError:
            pass
    raise FileFormatError(str(path), "cannot tell the carbon file's format", line=1, hint=hint)


# -- readers -----------------------------------------------------------------------------------
def _csv_rows(path: str, text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    rows: list[tuple[int, list[str]]] = []
    try:
        for r in reader:
            if any(c.strip() for c in r):
                rows.append((reader.line_num, r))
    except csv.Error as exc:  # e.g. a field over csv's 128 KiB limit
        raise FileFormatError(path, f"not a CSV row: {exc}", line=reader.line_num) from None
    if not rows:
        raise FileFormatError(path, "the file is empty", line=1)
    header = [h.strip() for h in rows[0][1]]
    seen: set[str] = set()
    for h in header:
        if h and h.lower() in seen:
            raise FileFormatError(
                path,
                f"column '{shown(h)}' appears twice in the header",
                line=rows[0][0],
                column=shown(h),
                hint="keep one column of each name",
            )
        seen.add(h.lower())
    return header, rows[1:]


def _cell(path: str, header: list[str], row: list[str], line: int, col: int) -> str:
    if col >= len(row):
        raise FileFormatError(
            path,
            f"missing value ({len(row)} fields, header has {len(header)})",
            line=line,
            column=header[col],
        )
    return row[col]


def read_plain_csv(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """``time,region,carbon_g_per_kwh`` (or ``carbon_kg_per_kwh``/``kg_per_kwh``)."""
    header, rows = _csv_rows(path, text)
    lower = [h.lower() for h in header]
    if "time" not in lower:
        raise FileFormatError(
            path, "no 'time' column", line=1, hint="header: time,region,carbon_g_per_kwh"
        )
    t_col = lower.index("time")
    r_col = lower.index("region") if "region" in lower else None
    k_col = lower.index("kind") if "kind" in lower else None
    factor = 1.0
    for name, f in (
        ("carbon_g_per_kwh", 1.0),
        ("g_per_kwh", 1.0),
        ("carbon_kg_per_kwh", 1000.0),
        ("kg_per_kwh", 1000.0),
    ):
        if name in lower:
            v_col, factor = lower.index(name), f
            break
    else:
        raise FileFormatError(
            path,
            "no carbon value column",
            line=1,
            hint="name it carbon_g_per_kwh (gCO2/kWh) or carbon_kg_per_kwh (converted x 1000)",
        )
    if r_col is None and not region:
        raise InputError(f"{path} has no 'region' column", hint="pass --region REGION")
    out = []
    for line, row in rows:
        t = _time(path, _cell(path, header, row, line, t_col), line=line, column=header[t_col])
        row_region = (
            _region(path, _cell(path, header, row, line, r_col), line=line, column=header[r_col])
            if r_col is not None
            else ""
        )
        if region and r_col is not None and row_region != region:
            continue  # --region selects one region of a multi-region file
        try:
            value = _value(_cell(path, header, row, line, v_col), factor=factor)
        except ValueError as exc:
            raise _refuse(path, exc, line=line, column=header[v_col]) from None
        row_kind = kind
        if k_col is not None and k_col < len(row) and row[k_col].strip():
            row_kind = _check_kind(row[k_col].strip(), path=path, line=line, column=header[k_col])
        out.append(CarbonPoint(row_region or str(region), t, value, row_kind, source))
    if region and r_col is not None and not out and rows:
        raise InputError(f"{path} has no rows for region '{region}'")
    return out


def _check_kind(
    value: str, *, path: str, line: int | None = None, column: str | None = None
) -> str:
    v = value.lower()
    if v not in KINDS:
        raise FileFormatError(
            path, f"kind '{shown(value)}' is not average or marginal", line=line, column=column
        )
    return v


def _forecast_source(source: str) -> str:
    fmt, _, name = source.partition(":")
    return f"{fmt}-forecast:{name}"


def _load_json(path: str, text: str) -> Any:
    try:
        return json.loads(text.lstrip("\ufeff"))
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
        ) from None
    except RecursionError:
        raise FileFormatError(path, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise FileFormatError(path, f"invalid JSON: {shown(str(exc), 80)}") from None


def _field(path: str, obj: Any, key: str, where: str) -> Any:
    if not isinstance(obj, dict):
        raise FileFormatError(path, f"{where} must be an object", column=where)
    if key not in obj or obj[key] is None:
        raise FileFormatError(path, f"{where}.{key} is missing", column=f"{where}.{key}")
    return obj[key]


def _json_point(
    path: str,
    obj: Any,
    where: str,
    *,
    time_key: str,
    value_key: str,
    region: str,
    kind: str,
    source: str,
    factor: float = 1.0,
) -> CarbonPoint:
    t = _time(path, _field(path, obj, time_key, where), column=f"{where}.{time_key}")
    try:
        value = _value(_field(path, obj, value_key, where), factor=factor)
    except ValueError as exc:
        raise _refuse(path, exc, column=f"{where}.{value_key}") from None
    return CarbonPoint(region, t, value, kind, source)


def read_carbon_aware_sdk(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """Carbon Aware SDK emissions (``rating``) or forecasts (``forecastData[].value``)."""
    doc = _load_json(path, text)
    items = doc if isinstance(doc, list) else [doc]
    out: list[CarbonPoint] = []
    for i, item in enumerate(items):
        where = f"[{i}]"
        if isinstance(item, dict) and "forecastData" in item:
            points = item["forecastData"]
            if not isinstance(points, list):
                raise FileFormatError(
                    path, f"{where}.forecastData must be a list", column=f"{where}.forecastData"
                )
            for j, p in enumerate(points):
                w = f"{where}.forecastData[{j}]"
                loc = region or _region(
                    path, _field(path, p, "location", w), column=f"{w}.location"
                )
                out.append(
                    _json_point(
                        path,
                        p,
                        w,
                        time_key="timestamp",
                        value_key="value",
                        region=loc,
                        kind=kind,
                        source=_forecast_source(source),
                    )
                )
        else:
            loc = region or _region(
                path, _field(path, item, "location", where), column=f"{where}.location"
            )
            out.append(
                _json_point(
                    path,
                    item,
                    where,
                    time_key="time",
                    value_key="rating",
                    region=loc,
                    kind=kind,
                    source=source,
                )
            )
    return out


_WATTTIME_UNITS = {
    "lbs_co2_per_mwh": LBS_PER_MWH_TO_G_PER_KWH,
    "lbs_co2e_per_mwh": LBS_PER_MWH_TO_G_PER_KWH,
    "g_co2_per_kwh": 1.0,
    "g_co2e_per_kwh": 1.0,
    "kg_co2_per_mwh": 1.0,
    "kg_co2e_per_mwh": 1.0,
}


def read_watttime(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """WattTime v3 (``/v3/historical``, ``/v3/forecast``): ``data[].point_time/value``."""
    doc = _load_json(path, text)
    if isinstance(doc, list):
        doc = {"data": doc, "meta": {}}
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), list):
        raise FileFormatError(path, "expected an object with a 'data' list", column="data")
    meta: dict[str, Any] = doc["meta"] if isinstance(doc.get("meta"), dict) else {}
    units = str(meta.get("units") or "lbs_co2_per_mwh").lower()
    if units not in _WATTTIME_UNITS:
        raise FileFormatError(
            path,
            f"meta.units '{shown(units)}' is not a carbon intensity",
            column="meta.units",
            hint="greenctl imports co2_moer in lbs_co2_per_mwh (WattTime's default)",
        )
    factor = _WATTTIME_UNITS[units]
    loc = region or meta.get("region")
    if loc is None or loc == "":
        raise InputError(f"{path} names no region (meta.region)", hint="pass --region REGION")
    loc = _region(path, loc, column="meta.region")
    data = doc["data"]
    # v3 forecasts nest: data: [{generated_at, forecast: [...]}]
    if data and isinstance(data[0], dict) and "forecast" in data[0]:
        flat: list[tuple[str, Any]] = []
        for i, d in enumerate(data):
            fc = d.get("forecast") if isinstance(d, dict) else None
            if not isinstance(fc, list):
                raise FileFormatError(
                    path, f"data[{i}].forecast must be a list", column=f"data[{i}].forecast"
                )
            flat.extend((f"data[{i}].forecast[{j}]", p) for j, p in enumerate(fc))
    else:
        flat = [(f"data[{i}]", p) for i, p in enumerate(data)]
    return [
        _json_point(
            path,
            p,
            w,
            time_key="point_time",
            value_key="value",
            region=loc,
            kind=kind,
            source=source,
            factor=factor,
        )
        for w, p in flat
    ]


def read_electricitymaps(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """Electricity Maps JSON: ``history[]``, ``forecast[]``, a list, or one latest object."""
    doc = _load_json(path, text)
    entries: list[tuple[str, Any, str]] = []
    zone = region
    if isinstance(doc, dict):
        zone = region or doc.get("zone")
        found = False
        for key in ("history", "forecast", "data"):
            if key in doc:
                found = True
                if not isinstance(doc[key], list):
                    raise FileFormatError(path, f"'{key}' must be a list", column=key)
                suffix = "-forecast" if key == "forecast" else ""
                entries.extend((f"{key}[{i}]", e, suffix) for i, e in enumerate(doc[key]))
        if not found:
            entries.append(("$", doc, ""))
    elif isinstance(doc, list):
        entries = [(f"[{i}]", e, "") for i, e in enumerate(doc)]
    else:
        raise FileFormatError(path, "expected a JSON object or list")
    out = []
    for where, e, suffix in entries:
        loc = zone or (e.get("zone") if isinstance(e, dict) else None)
        if loc is None or loc == "":
            raise InputError(f"{path} names no zone", hint="pass --region REGION")
        zone_column = "zone" if zone else f"{where}.zone"
        out.append(
            _json_point(
                path,
                e,
                where,
                time_key="datetime",
                value_key="carbonIntensity",
                region=_region(path, loc, column=zone_column, what="zone"),
                kind=kind,
                source=_forecast_source(source) if suffix else source,
            )
        )
    return out


def read_electricitymaps_csv(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """Electricity Maps CSV export; life-cycle intensity preferred over direct."""
    header, rows = _csv_rows(path, text)
    lower = [h.lower() for h in header]
    if "datetime (utc)" not in lower:
        raise FileFormatError(path, "no 'Datetime (UTC)' column", line=1)
    t_col = lower.index("datetime (utc)")
    v_col = None
    basis = ""
    for wanted, label in (("(lca)", "lca"), ("(life cycle)", "lca"), ("(direct)", "direct")):
        for i, h in enumerate(lower):
            if h.startswith("carbon intensity") and h.endswith(wanted):
                v_col, basis = i, label
                break
        if v_col is not None:
            break
    if v_col is None:
        raise FileFormatError(
            path,
            "no carbon intensity column",
            line=1,
            hint="expected 'Carbon Intensity gCO₂eq/kWh (LCA)', '(Life cycle)' or '(direct)'",
        )
    z_col = lower.index("zone id") if "zone id" in lower else None
    out = []
    if not region and z_col is None:
        raise InputError(f"{path} has no 'Zone Id' column", hint="pass --region REGION")
    for line, row in rows:
        t = _time(path, _cell(path, header, row, line, t_col), line=line, column=header[t_col])
        if region or z_col is None:  # z_col is None only with --region (checked above)
            loc = str(region)
        else:
            cell = _cell(path, header, row, line, z_col)
            loc = _region(path, cell, line=line, column=header[z_col], what="zone")
        try:
            value = _value(_cell(path, header, row, line, v_col))
        except ValueError as exc:
            raise _refuse(path, exc, line=line, column=header[v_col]) from None
        out.append(CarbonPoint(loc, t, value, kind, f"{source}:{basis}"))
    return out


def read_clover(
    path: str, text: str, *, region: str | None, kind: str, source: str, start: str | None = None
) -> list[CarbonPoint]:
    """Clover's hourly trace: a header line, then one gCO2/kWh value per line."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines:
        raise FileFormatError(path, "the file is empty", line=1)
    name = lines[0].strip()
    try:
        float(name)
        raise FileFormatError(
            path,
            "the first line must name the trace (e.g. CISO_March)",
            line=1,
            hint="Clover's CSVs start with a one-line header",
        )
    except ValueError:
        pass
    try:
        t0 = parse_time(start or CLOVER_DEFAULT_START)
    except ValueError as exc:
        raise InputError(f"--start: {exc}") from None
    name = _region(path, name, line=1, what="trace name")
    loc = region or _region(path, name.split("_")[0], line=1)
    out = []
    step = 0
    for i, raw in enumerate(lines[1:], start=2):
        if not raw.strip():
            continue
        try:
            value = _value(raw)
        except ValueError as exc:
            raise _refuse(path, exc, line=i, column=name) from None
        try:
            t = iso(t0 + timedelta(hours=step))
        except OverflowError:
            raise FileFormatError(
                path,
                f"value {step + 1} falls after year 9999 (hourly from {iso(t0)})",
                line=i,
                column=name,
                hint="pass an earlier --start",
            ) from None
        out.append(CarbonPoint(loc, t, value, kind, f"{source}:{name}"))
        step += 1
    return out


def read_eglb(
    path: str, text: str, *, region: str | None, kind: str, source: str
) -> list[CarbonPoint]:
    """eGLB site trace: ``Time (UTC)``, ``Carbon (kg/kWh)`` (converted x 1000)."""
    header, rows = _csv_rows(path, text)
    lower = [h.lower() for h in header]
    if "time (utc)" not in lower:
        raise FileFormatError(path, "no 'Time (UTC)' column", line=1)
    v_col = next((i for i, h in enumerate(lower) if h.startswith("carbon (kg/kwh)")), None)
    if v_col is None:
        raise FileFormatError(path, "no 'Carbon (kg/kWh)' column", line=1)
    t_col = lower.index("time (utc)")
    loc = region or _region(
        path,
        Path(path).name.split("_carbon")[0].removeprefix("eglb_"),
        what="region (from the file name; pass --region)",
    )
    out = []
    for line, row in rows:
        t = _time(path, _cell(path, header, row, line, t_col), line=line, column=header[t_col])
        try:
            value = _value(_cell(path, header, row, line, v_col), factor=1000.0)
        except ValueError as exc:
            raise _refuse(path, exc, line=line, column=header[v_col]) from None
        out.append(CarbonPoint(loc, t, value, kind, source))
    return out


_READERS: dict[str, Callable[..., list[CarbonPoint]]] = {
    "csv": read_plain_csv,
    "carbon-aware-sdk": read_carbon_aware_sdk,
    "watttime": read_watttime,
    "electricitymaps": read_electricitymaps,
    "electricitymaps-csv": read_electricitymaps_csv,
    "clover": read_clover,
    "eglb": read_eglb,
}
_DEFAULT_KIND = {"watttime": "marginal"}


def parse_carbon_text(
    text: str,
    *,
    path: str = "<carbon>",
    region: str | None = None,
    fmt: str = "auto",
    kind: str | None = None,
    start: str | None = None,
) -> tuple[str, list[CarbonPoint]]:
    """Parse carbon-signal text; returns ``(format, points)`` sorted by region and time.

    Raises:
        FileFormatError: malformed content, naming line/field.
        InputError: bad options (unknown format or kind, no region).
    """
    if fmt not in FORMATS:
        raise InputError(f"--format '{fmt}' is unknown", hint=f"use one of {', '.join(FORMATS)}")
    if kind is not None and kind not in KINDS:
        raise InputError(f"--kind '{kind}' is unknown", hint="use average or marginal")
    if region is not None:
        try:
            region = _region("--region", region)
        except FileFormatError as exc:
            raise InputError(f"--region: {exc.reason}", hint=exc.hint) from None
    if fmt == "auto":
        fmt = detect_format(path, text)
    use_kind = kind or _DEFAULT_KIND.get(fmt, "average")
    source = f"{fmt}:{Path(path).name}"
    reader = _READERS[fmt]
    if fmt == "clover":
        points = read_clover(path, text, region=region, kind=use_kind, source=source, start=start)
    else:
        points = reader(path, text, region=region, kind=use_kind, source=source)
    if not points:
        raise FileFormatError(path, "no carbon values found")
    seen: dict[tuple[str, str, str], int] = {}
    for i, p in enumerate(points):
        key = (p.region, p.time, p.kind)
        if key in seen and points[seen[key]].carbon_g_per_kwh != p.carbon_g_per_kwh:
            raise FileFormatError(
                path,
                f"two different values for region {p.region} at {p.time}",
                hint="remove the duplicate row",
            )
        seen[key] = i
    return fmt, sorted(set(points), key=lambda p: (p.region, p.time, p.kind))


def read_carbon_file(
    path: str | Path,
    *,
    region: str | None = None,
    fmt: str = "auto",
    kind: str | None = None,
    start: str | None = None,
) -> tuple[str, list[CarbonPoint]]:
    """Read a carbon file (or ``bundled:NAME``); see :func:`parse_carbon_text`.

    A bundled carbon trace read with ``fmt="auto"`` uses its own format and, unless
    ``region`` is given, its own region (Clover's traces name neither).
    """
    p = bundled.resolve(path)
    trace = bundled.carbon_trace_at(p) if fmt == "auto" else None
    if trace is not None and trace.carbon_format:
        fmt = trace.carbon_format
        region = region or trace.region
    text = read_utf8(p, what="carbon file")
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines
    return parse_carbon_text(text, path=str(p), region=region, fmt=fmt, kind=kind, start=start)


def store_points(store: Store, points: Iterable[CarbonPoint]) -> int:
    """Upsert points into ``carbon_signals`` in one transaction; returns the row count."""
    now = utcnow_iso()
    rows = [{**p.to_row(), "imported_at": now} for p in points]
    with store.transaction():
        store.db.table("carbon_signals").insert_all(rows, replace=True)
    return len(rows)


def import_carbon(
    store: Store,
    path: str | Path,
    *,
    region: str | None = None,
    fmt: str = "auto",
    kind: str | None = None,
    start: str | None = None,
) -> dict[str, Any]:
    """Import a carbon file into the store (all or nothing).

    Returns:
        ``{"format", "rows", "regions", "first", "last", "kind"}``.
    """
    used, points = read_carbon_file(path, region=region, fmt=fmt, kind=kind, start=start)
    n = store_points(store, points)
    return _summary(used, n, points)


def bundled_trace_path(name: str) -> Path:
    """Path of a bundled carbon trace (``name`` without ``bundled:``; see :mod:`.bundled`)."""
    if name not in BUNDLED_TRACES:
        bundled.path_of(name)  # refuses an unknown name, listing every bundled name
        raise InputError(
            f"bundled data set '{shown(name)}' is not a carbon trace",
            hint=f"use one of {', '.join(bundled.PREFIX + n for n in BUNDLED_TRACES)}",
        )
    return bundled.path_of(name)


def import_bundled(
    store: Store, name: str, *, region: str | None = None, start: str | None = None
) -> dict[str, Any]:
    """Import one of the bundled carbon traces (works offline)."""
    return import_carbon(store, bundled_trace_path(name), region=region, start=start)


def _summary(fmt: str, n: int, points: list[CarbonPoint]) -> dict[str, Any]:
    times = sorted(p.time for p in points)
    return {
        "format": fmt,
        "rows": n,
        "regions": sorted({p.region for p in points}),
        "kind": sorted({p.kind for p in points}),
        "first": times[0] if times else None,
        "last": times[-1] if times else None,
    }


# -- live adapters (off unless configured; never used by tests against the network) -------------
ELECTRICITYMAPS_URL = "https://api.electricitymap.org/v3"
WATTTIME_URL = "https://api.watttime.org"
Opener = Callable[..., Any]


def live_request(
    provider: str, region: str, *, env: Mapping[str, str] | None = None, what: str = "history"
) -> urllib.request.Request:
    """Build the HTTP request of a live adapter from environment configuration.

    Electricity Maps: ``ELECTRICITYMAPS_TOKEN`` (``auth-token`` header), ``what`` = latest |
    history | forecast. WattTime v3: ``WATTTIME_TOKEN`` (a bearer token from ``/login``),
    ``what`` = history (``/v3/historical`` of the last day) | forecast | latest.

    Raises:
        InputError: the provider is unknown or not configured.
    """
    env = os.environ if env is None else env
    if provider == "electricitymaps":
        token = env.get("ELECTRICITYMAPS_TOKEN")
        if not token:
            raise InputError(
                "the Electricity Maps adapter is not configured",
                hint="set ELECTRICITYMAPS_TOKEN to your API token",
            )
        endpoint = {"latest": "latest", "history": "history", "forecast": "forecast"}.get(what)
        if endpoint is None:
            raise InputError(f"unknown request '{what}'", hint="latest, history or forecast")
        base = env.get("ELECTRICITYMAPS_URL", ELECTRICITYMAPS_URL).rstrip("/")
        url = f"{base}/carbon-intensity/{endpoint}?" + urllib.parse.urlencode({"zone": region})
        return urllib.request.Request(url, headers={"auth-token": token})
    if provider == "watttime":
        token = env.get("WATTTIME_TOKEN")
        if not token:
            raise InputError(
                "the WattTime adapter is not configured",
                hint="set WATTTIME_TOKEN to a token from https://api.watttime.org/login",
            )
        base = env.get("WATTTIME_URL", WATTTIME_URL).rstrip("/")
        params: dict[str, str] = {"region": region, "signal_type": "co2_moer"}
        if what == "history":
            now = datetime.now(UTC).replace(microsecond=0)
            params["start"] = iso(now - timedelta(days=1))
            params["end"] = iso(now)
            path = "/v3/historical"
        elif what == "forecast":
            path = "/v3/forecast"
        elif what == "latest":
            path = "/v3/signal-index"
        else:
            raise InputError(f"unknown request '{what}'", hint="latest, history or forecast")
        url = f"{base}{path}?" + urllib.parse.urlencode(params)
        return urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    raise InputError(f"unknown live provider '{provider}'", hint="electricitymaps or watttime")


def fetch_live(
    store: Store,
    provider: str,
    region: str,
    *,
    what: str = "history",
    env: Mapping[str, str] | None = None,
    opener: Opener | None = None,
    timeout_s: float = 20.0,
) -> dict[str, Any]:
    """Fetch a signal from a live provider and store it like an imported file.

    ``opener`` defaults to ``urllib.request.urlopen``; tests pass a fake.

    Raises:
        InputError: not configured; GreenctlError: the provider failed or answered garbage.
    """
    req = live_request(provider, region, env=env, what=what)
    open_fn = opener or urllib.request.urlopen
    try:
        with open_fn(req, timeout=timeout_s) as resp:
            body = resp.read().decode("utf-8")
    except OSError as exc:  # URLError and HTTPError are OSErrors
        raise GreenctlError(f"{provider}: request to {req.full_url} failed: {exc}") from None
    fmt = "watttime" if provider == "watttime" else "electricitymaps"
    used, points = parse_carbon_text(body, path=f"{provider}:{region}", region=region, fmt=fmt)
    n = store_points(store, points)
    return _summary(used, n, points)
