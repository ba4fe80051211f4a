"""Profile import and export (CSV or JSON), one row per (variant, resource, batch).

Column names are shared with other tools; keep them stable. Required: ``variant``,
``resource``, ``batch``, ``throughput_rps`` and at least one latency column (``latency_ms``
is p50). Optional columns (``model``, ``accuracy`` as a fraction, energy per request in J,
``capacity_rps`` + ``capacity_slo_ms``, ...) and provenance columns round-trip through export.
Every rule about an imported value lives here (names, ``batch`` range, finite numbers below
:data:`LIMITS`, ISO 8601 ``created_at`` stored as UTC); a bad row fails the whole import,
naming file, line and column. Importing is idempotent: rows the store already holds are not
stored again; two disagreeing rows for one point and time are refused. A point is what
``Store.latest_profiles`` keeps one row of. See docs/formats.md.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from greenctl.data.errors import FileFormatError, InputError, shown
from greenctl.data.provenance import check_import_merge
from greenctl.data.records import (
    ENERGY_METHODS,
    MAX_BATCH,
    PROFILE_SOURCES,
    Profile,
    Variant,
    name_problem,
    normalise_time,
    record_to_row,
    row_to_record,
    utcnow_iso,
)
from greenctl.data.resources import parse_resource
from greenctl.data.store import Store

REQUIRED = ("variant", "resource", "batch", "throughput_rps")
LATENCY = ("latency_ms", "latency_p50_ms", "latency_p95_ms", "latency_p99_ms")
OPTIONAL_FLOAT = (
    "accuracy",
    "power_w",
    "idle_power_w",
    "energy_j",
    "memory_mb",
    "load_time_s",
    "cost_per_hour",
    "capacity_rps",
    "capacity_slo_ms",
    "duration_s",
    "isolated_p50_ms",
    "isolated_p95_ms",
    "isolated_p99_ms",
)
OPTIONAL_TEXT = (
    "model",
    "hardware",
    "energy_method",
    "accuracy_metric",
    "created_at",
    "torch_version",
    "source",
)
OPTIONAL_INT = ("samples",)

# Column order of exports: the contract columns first.
EXPORT_COLUMNS = (
    "model",
    "variant",
    "resource",
    "batch",
    "hardware",
    "throughput_rps",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "power_w",
    "idle_power_w",
    "energy_j",
    "energy_method",
    "memory_mb",
    "accuracy",
    "accuracy_metric",
    "load_time_s",
    "cost_per_hour",
    "capacity_rps",
    "capacity_slo_ms",
    "samples",
    "duration_s",
    "isolated_p50_ms",
    "isolated_p95_ms",
    "isolated_p99_ms",
    "torch_version",
    "source",
    "created_at",
)
KNOWN = set(REQUIRED) | set(LATENCY) | set(OPTIONAL_FLOAT) | set(OPTIONAL_TEXT) | set(OPTIONAL_INT)
# Largest accepted value per number column: beyond these a value is a unit mistake (s vs ms,
# W vs mW) or garbage, and products of such values overflow in the planners.
LIMITS: dict[str, float] = {
    "throughput_rps": 1e9,
    "latency_ms": 1e8,  # ~28 hours
    "latency_p50_ms": 1e8,
    "latency_p95_ms": 1e8,
    "latency_p99_ms": 1e8,
    "isolated_p50_ms": 1e8,
    "isolated_p95_ms": 1e8,
    "isolated_p99_ms": 1e8,
    "power_w": 1e6,
    "idle_power_w": 1e6,
    "energy_j": 1e9,
    "memory_mb": 1e9,  # a petabyte
    "load_time_s": 1e6,
    "cost_per_hour": 1e6,
    "capacity_rps": 1e9,
    "capacity_slo_ms": 1e8,
    "duration_s": 1e8,
    "samples": 1e12,
    "batch": float(MAX_BATCH),
}
# Number columns where zero means nothing (a row that served no request, an SLO of 0 ms).
POSITIVE = (
    "throughput_rps",
    "latency_p50_ms",
    "latency_p95_ms",
    "latency_p99_ms",
    "isolated_p50_ms",
    "isolated_p95_ms",
    "isolated_p99_ms",
    "capacity_slo_ms",
    "batch",
)


@dataclass
class ImportResult:
    """What an import wrote.

    ``rows`` were read; ``profiles`` of them were stored; ``already_present`` were not,
    because the store held them already or an earlier row of the file repeats them.
    """

    path: str
    rows: int
    profiles: int
    variants_created: list[str]
    variants_updated: list[str]
    already_present: int = 0


@dataclass
class _Row:
    line: int
    profile: Profile
    model: str | None
    accuracy: float | None
    accuracy_metric: str | None
    load_time_s: float | None
    timed: bool  # the file gave created_at (else it is the time of the import)
    repeated: bool = False  # an earlier row of the file holds the same profile


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _number(path: str, line: int, column: str, value: Any) -> float:
    """A finite number >= 0 (> 0 in POSITIVE columns) and at most LIMITS[column]."""
    bad = f"'{shown(value)}' is not a number"
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise FileFormatError(path, bad, line=line, column=column)
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: a JSON integer of 400 digits
        raise FileFormatError(path, bad, line=line, column=column) from None
    if not math.isfinite(number):
        raise FileFormatError(
            path, f"'{shown(value)}' is not a finite number", line=line, column=column
        )
    if number < 0:
        raise FileFormatError(path, f"{number:g} is negative", line=line, column=column)
    if number == 0 and column in POSITIVE:
        raise FileFormatError(path, f"{column} must be > 0", line=line, column=column)
    limit = LIMITS.get(column)
    if limit is not None and number > limit:
        raise FileFormatError(
            path,
            f"{shown(value)} is above {limit:g}",
            line=line,
            column=column,
            hint=f"{column} is at most {limit:g}; check the unit (the column name says it)",
        )
    return number


def _text(path: str, line: int, column: str, value: Any) -> str | None:
    """A printable text value of at most MAX_NAME_CHARS characters, stripped; None if blank."""
    if _is_blank(value):
        return None
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        kinds: dict[type, str] = {dict: "a JSON object", list: "a JSON list"}
        kind = kinds.get(type(value), shown(value))
        raise FileFormatError(
            path, f"must be text, not {kind}", line=line, column=column, hint=_TEXT_HINT
        )
    text = str(value).strip()
    problem = name_problem(text)
    if problem:
        raise FileFormatError(
            path, f"'{shown(text)}' {problem}", line=line, column=column, hint=_TEXT_HINT
        )
    return text


_TEXT_HINT = "names are short printable text, for example resnet50, cpu:4 or NVIDIA A100"


@dataclass(frozen=True)
class _Cells:
    """One raw row of a profile file and where it is, to read checked values from."""

    path: str
    line: int
    raw: dict[str, Any]

    def text(self, col: str) -> str | None:
        return _text(self.path, self.line, col, self.raw.get(col))

    def num(self, col: str) -> float | None:
        v = self.raw.get(col)
        return None if _is_blank(v) else _number(self.path, self.line, col, v)

    def whole(self, col: str, problem: str) -> int | None:
        """A whole number (None if blank), refused with ``problem`` when it has a fraction."""
        value = self.num(col)
        if value is not None and value != int(value):
            raise FileFormatError(self.path, problem, line=self.line, column=col)
        return None if value is None else int(value)

    def fail(self, message: str, column: str | None = None, hint: str | None = None) -> NoReturn:
        raise FileFormatError(self.path, message, line=self.line, column=column, hint=hint)


def _parse_row(path: str, line: int, raw: dict[str, Any], now: str) -> _Row:
    """One checked row; ``now`` is the import's time, for rows without created_at."""
    cells = _Cells(path, line, raw)
    num = cells.num
    for col in REQUIRED:
        if _is_blank(raw.get(col)):
            cells.fail("required value is empty", col)
    texts = {col: cells.text(col) for col in (*OPTIONAL_TEXT, "variant", "resource")}
    variant = texts["variant"]
    assert variant is not None  # REQUIRED
    try:
        resource = parse_resource(str(texts["resource"])).label
    except InputError as exc:
        cells.fail(exc.message, "resource", exc.hint)
    batch = cells.whole(
        "batch", f"batch must be a whole number from 1 to {MAX_BATCH}, got '{shown(raw['batch'])}'"
    )
    throughput = _number(path, line, "throughput_rps", raw["throughput_rps"])
    p50, p95, p99 = _latencies(cells)
    capacity, capacity_slo = num("capacity_rps"), num("capacity_slo_ms")
    if (capacity is None) != (capacity_slo is None):
        missing = "capacity_slo_ms" if capacity_slo is None else "capacity_rps"
        cells.fail("capacity_rps and capacity_slo_ms come as a pair", missing)
    accuracy = num("accuracy")
    if accuracy is not None and accuracy > 1:
        cells.fail(
            f"accuracy {accuracy:g} is above 1", "accuracy",
            "give accuracy as a fraction (0.7613), not a percentage",
        )  # fmt: skip
    energy = num("energy_j")
    method, source = _provenance(cells, texts["energy_method"], texts["source"])
    samples = cells.whole("samples", "samples must be a whole number")
    created_at = _created_at(cells, texts["created_at"])
    profile = Profile(
        variant=variant,
        resource=resource,
        batch=int(batch or 0),
        throughput_rps=throughput,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        hardware=texts["hardware"],
        power_w=num("power_w"),
        idle_power_w=num("idle_power_w"),
        energy_j=energy,
        energy_method=method,
        memory_mb=num("memory_mb"),
        samples=samples,
        duration_s=num("duration_s"),
        cost_per_hour=num("cost_per_hour"),
        capacity_rps=capacity,
        capacity_slo_ms=capacity_slo,
        isolated_p50_ms=num("isolated_p50_ms"),
        isolated_p95_ms=num("isolated_p95_ms"),
        isolated_p99_ms=num("isolated_p99_ms"),
        torch_version=texts["torch_version"],
        source=source,
        created_at=created_at or now,
    )
    return _Row(
        line,
        profile,
        texts["model"],
        accuracy,
        texts["accuracy_metric"],
        num("load_time_s"),
        timed=created_at is not None,
    )


def _latencies(cells: _Cells) -> tuple[float | None, float | None, float | None]:
    """p50 (``latency_ms`` is another name for it), p95 and p99: at least one, none falling."""
    p50 = cells.num("latency_p50_ms")
    plain = cells.num("latency_ms")
    if p50 is None:
        p50 = plain
    elif plain is not None and plain != p50:
        cells.fail(f"latency_ms ({plain:g}) and latency_p50_ms ({p50:g}) disagree", "latency_ms")
    p95, p99 = cells.num("latency_p95_ms"), cells.num("latency_p99_ms")
    if p50 is None and p95 is None and p99 is None:
        cells.fail(
            "no latency given",
            hint="fill at least one of latency_ms, latency_p50_ms, latency_p95_ms, latency_p99_ms",
        )
    known = [v for v in (p50, p95, p99) if v is not None]
    if known != sorted(known):
        cells.fail("latency percentiles must not fall from p50 to p95 to p99")
    return p50, p95, p99


def _provenance(cells: _Cells, method: str | None, source: str | None) -> tuple[str, str]:
    """The energy method and the source, each ``imported`` when blank, else a known one."""
    if method is None:
        method = "imported"
    elif method not in ENERGY_METHODS:
        cells.fail(
            f"unknown energy method '{method}'", "energy_method",
            f"use one of {', '.join(ENERGY_METHODS)}",
        )  # fmt: skip
    source = source or "imported"
    if source not in PROFILE_SOURCES:
        cells.fail(
            f"unknown source '{shown(source)}'", "source",
            f"use one of {', '.join(PROFILE_SOURCES)}, or leave it empty (imported)",
        )  # fmt: skip
    return method, source


def _created_at(cells: _Cells, created_at: str | None) -> str | None:
    """The time of the measurement as ISO 8601 UTC (None: not given)."""
    if created_at is None:
        return None
    try:
        return normalise_time(created_at)
    except ValueError as exc:
        cells.fail(
            f"'{shown(created_at)}' is {exc}",
            "created_at",
            "write the time of the measurement as ISO 8601, e.g. 2026-11-22T10:00:00Z "
            "(no offset: UTC), or leave it empty for the time of the import",
        )


def _read_rows(path: Path, fmt: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows with their line numbers (CSV: file line; JSON: 1-based record index)."""
    p = str(path)
    if fmt not in ("auto", "csv", "json"):
        raise InputError(f"unknown format '{shown(fmt)}'", hint="use csv, json or auto")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputError(
            f"{p} does not exist", hint="give the path of a CSV or JSON file"
        ) from None
    except OSError as exc:  # a folder, no permission
        raise InputError(
            f"cannot read {p}: {exc.strerror or exc}", hint="give the path of a CSV or JSON file"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            p,
            f"not UTF-8 text (byte {exc.start + 1} is {data[exc.start]:#04x})",
            line=data.count(b"\n", 0, exc.start) + 1,
            hint="save the file as UTF-8 CSV or JSON",
        ) from None
    if fmt == "auto":
        fmt = "json" if text.lstrip().startswith(("[", "{")) else file_format(path)
    if fmt == "json":
        return _json_rows(p, text)
    return _csv_rows(p, text)


def _json_rows(p: str, text: str) -> list[tuple[int, dict[str, Any]]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(p, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
    except RecursionError:
        raise FileFormatError(p, "invalid JSON: nested too deeply") from None
    except ValueError as exc:  # an integer of more than 4300 digits
        raise FileFormatError(p, f"invalid JSON: {shown(str(exc), 80)}") from None
    if isinstance(doc, dict) and isinstance(doc.get("profiles"), list):
        doc = doc["profiles"]
    if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
        raise FileFormatError(p, 'expected a list of profile objects (or {"profiles": [...]})')
    columns = set().union(*(r.keys() for r in doc)) if doc else set()
    _check_columns(p, columns, line=None)
    return [(i + 1, r) for i, r in enumerate(doc)]


def _csv_rows(p: str, text: str) -> list[tuple[int, dict[str, Any]]]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        if not reader.fieldnames:
            raise FileFormatError(
                p, "the file is empty", hint="the first line must name the columns"
            )
        header = [h.strip() for h in reader.fieldnames]
        reader.fieldnames = header
        _check_columns(p, set(header), line=1)
        twice = sorted({h for h in header if header.count(h) > 1})
        if twice:
            raise FileFormatError(
                p, f"column '{shown(twice[0])}' appears twice", line=1, column=twice[0]
            )
        for raw in reader:
            if None in raw:
                raise FileFormatError(p, "more values than columns", line=reader.line_num)
            if all(_is_blank(v) for v in raw.values()):
                continue
            rows.append((reader.line_num, raw))
    except csv.Error as exc:  # a field over the csv module's limit, a stray quote
        raise FileFormatError(
            p, f"not readable as CSV: {exc}", line=reader.line_num + 1, hint=_TEXT_HINT
        ) from None
    return rows


def _check_columns(path: str, columns: set[str], *, line: int | None) -> None:
    for col in REQUIRED:
        if col not in columns:
            raise FileFormatError(
                path,
                "missing required column",
                line=line,
                column=col,
                hint=f"required columns: {', '.join(REQUIRED)} and one of {', '.join(LATENCY)}",
            )
    if not columns & set(LATENCY):
        raise FileFormatError(
            path, "no latency column", line=line, hint=f"add one of {', '.join(LATENCY)}"
        )
    unknown = sorted(columns - KNOWN)
    if unknown:
        raise FileFormatError(
            path,
            f"unknown column '{shown(unknown[0])}'",
            line=line,
            hint="known columns: " + ", ".join(EXPORT_COLUMNS),
        )


@dataclass
class ParsedProfiles:
    """A profile file read and checked row by row (nothing compared with a store yet)."""

    path: str
    rows: list[_Row]  # every row, in file order (repeats too: they may add variant facts)


def read_profiles(path: str | Path, *, fmt: str = "auto") -> ParsedProfiles:
    """Read and check a profile CSV/JSON file without touching a store.

    Raises:
        FileFormatError: a bad row or column (file, line, column, reason), or two rows for
            the same point and time that disagree (naming both lines).
        InputError: the file is missing, a folder or unreadable.
    """
    path = Path(path)
    p = str(path)
    raw_rows = _read_rows(path, fmt)
    if not raw_rows:
        raise FileFormatError(p, "no profile rows found")
    now = utcnow_iso()  # one time for the whole file: its untimed rows are one measurement
    rows = [_parse_row(p, line, raw, now) for line, raw in raw_rows]
    by_time: dict[tuple[Any, ...], _Row] = {}
    for row in rows:
        prof = row.profile
        key = (
            prof.variant,
            prof.resource,
            prof.batch,
            prof.hardware,
            prof.capacity_slo_ms,
            prof.created_at,
        )
        first = by_time.setdefault(key, row)
        if first is not row:
            _check_agree(p, first, row)
            row.repeated = True
    return ParsedProfiles(p, rows)


def _check_agree(path: str, first: _Row, row: _Row) -> None:
    """Two rows of one file for one point and time must hold the same profile.

    Raises:
        FileFormatError: they differ; names both lines and the first column that differs.
    """
    a, b = record_to_row(first.profile), record_to_row(row.profile)
    p = row.profile
    slo = "" if p.capacity_slo_ms is None else f", capacity_slo_ms {p.capacity_slo_ms:g}"
    col = next((c for c in a if a[c] != b[c]), None)
    if col is None:  # a repeat (the variant's facts on it are checked on import)
        return
    raise FileFormatError(
        path,
        f"conflicts with line {first.line} (same variant '{p.variant}', resource {p.resource}, "
        f"batch {p.batch}{slo}, hardware and created_at): {col} is {shown(a[col])} there, "
        f"{shown(b[col])} here",
        line=row.line,
        column=col,
        hint=f"keep one of lines {first.line} and {row.line}, or give each measurement its own "
        "created_at; load tests at several SLOs differ in capacity_slo_ms",
    )


def import_profiles(
    store: Store, path: str | Path, *, fmt: str = "auto", merge: bool = False
) -> ImportResult:
    """Import a profile CSV/JSON file into the store in one transaction.

    Rows the store holds already are not stored again (see the module docstring). A file
    that would add another data set (``hardware`` label) to a variant or family holding
    profiles is refused unless ``merge`` (:func:`greenctl.data.provenance.check_import_merge`).

    Raises:
        FileFormatError: a bad row or column (file, line, column, reason); nothing is written.
        InputError: the file is missing or unreadable, or it would merge data sets.
    """
    return import_parsed(store, read_profiles(path, fmt=fmt), merge=merge)


def import_parsed(store: Store, parsed: ParsedProfiles, *, merge: bool = False) -> ImportResult:
    """Store what :func:`read_profiles` read (one transaction); see :func:`import_profiles`."""
    path, rows = parsed.path, parsed.rows
    # Variant-level facts must agree across the file's rows; they override the store's.
    variants: dict[str, Variant] = {}
    created: list[str] = []
    updated: list[str] = []
    seen: dict[tuple[str, str], tuple[Any, int]] = {}
    for row in rows:
        name = row.profile.variant
        if name not in variants:
            if store.rows("select 1 from variants where name = ? limit 1", [name]):
                variants[name] = store.get_variant(name)
            elif row.model is None:
                raise FileFormatError(
                    path,
                    f"variant '{name}' is not in the store and the row names no model family",
                    line=row.line,
                    column="model",
                    hint="add a 'model' column (for example resnet)",
                )
            else:
                variants[name] = Variant(name=name, family=row.model, source="imported")
                created.append(name)
        v = variants[name]
        if row.model is not None and row.model != v.family:
            raise FileFormatError(
                path,
                f"variant '{name}' belongs to family '{v.family}', not '{row.model}'",
                line=row.line,
                column="model",
            )
        for attr, value in (
            ("accuracy", row.accuracy),
            ("load_time_s", row.load_time_s),
            ("accuracy_metric", row.accuracy_metric),
        ):
            if value is None:
                continue
            earlier = seen.setdefault((name, attr), (value, row.line))
            if earlier[0] != value:
                raise FileFormatError(
                    path,
                    f"{attr} of '{name}' is {earlier[0]!r} on line {earlier[1]}, {value!r} here",
                    line=row.line,
                    column=attr,
                )
            if getattr(v, attr) != value:
                if name not in created and name not in updated:
                    updated.append(name)
                setattr(v, attr, value)
    with store.transaction():
        check_import_merge(
            store,
            [
                (r.profile.variant, variants[r.profile.variant].family, r.profile.hardware)
                for r in rows
            ],
            what=f"profile import of {path}",
            hint="import under other variant and family names (columns 'variant', 'model'), or "
            "pass --merge to add these profiles to the existing ones on purpose",
            merge=merge,
        )
        new = [
            r.profile
            for r in rows
            if not r.repeated and not store.has_profile(r.profile, same_time=r.timed)
        ]
        for v in variants.values():
            store.upsert_variant(v)
        store.add_profiles(new)
    return ImportResult(path, len(rows), len(new), created, updated, len(rows) - len(new))


def profile_rows(
    store: Store, *, family: str | None = None, variant: str | None = None, history: bool = False
) -> list[dict[str, Any]]:
    """Profiles joined with their variants as export rows (latest per point unless history)."""
    if history:
        sql = "select p.* from profiles p join variants v on v.name = p.variant"
        clauses, params = [], []
        if family:
            clauses.append("v.family = ?")
            params.append(family)
        if variant:
            clauses.append("p.variant = ?")
            params.append(variant)
        if clauses:
            sql += " where " + " and ".join(clauses)
        sql += " order by p.variant, p.resource, p.batch, p.created_at, p.id"

        profiles = [row_to_record(Profile, r) for r in store.rows(sql, params)]
    else:
        profiles = store.latest_profiles(family=family, variant=variant)
    cache: dict[str, Variant] = {}
    out = []
    for p in profiles:
        v = cache.get(p.variant) or cache.setdefault(p.variant, store.get_variant(p.variant))
        row = {
            "model": v.family,
            "accuracy": v.accuracy,
            "accuracy_metric": v.accuracy_metric,
            "load_time_s": v.load_time_s,
        }
        for col in EXPORT_COLUMNS:
            if col not in row:
                row[col] = getattr(p, col)
        out.append({col: row[col] for col in EXPORT_COLUMNS})
    return out


def file_format(path: str | Path | None) -> str:
    """The profile format a file's name stands for: json for ``*.json``, else csv (what
    ``profile export -o FILE`` writes and ``profile import FILE`` reads by default)."""
    return "json" if path is not None and Path(path).suffix.lower() == ".json" else "csv"


def export_profiles(rows: Iterable[dict[str, Any]], *, fmt: str = "csv") -> str:
    """Render export rows as CSV (the contract columns, in order) or JSON."""
    rows = list(rows)
    if fmt == "json":
        return json.dumps(rows, indent=2) + "\n"
    if fmt != "csv":
        raise InputError(f"unknown format '{fmt}'", hint="use csv or json")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(EXPORT_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else _csv_value(v)) for k, v in row.items()})
    return buf.getvalue()


def _csv_value(value: Any) -> Any:
    # repr keeps every float digit, so export -> import round-trips exactly
    return repr(value) if isinstance(value, float) else value
