"""Profile import and export (CSV or JSON), one row per (variant, resource, batch).

Column contract (names are shared with other tools; keep them stable):

- required: ``variant``, ``resource``, ``batch``, ``throughput_rps`` and at least one of
  ``latency_ms`` (taken as p50), ``latency_p50_ms``, ``latency_p95_ms``, ``latency_p99_ms``;
- optional: ``model`` (family; required for a variant the store does not know yet),
  ``accuracy`` (a fraction, 0..1), ``hardware``, ``power_w``, ``energy_j`` (per request),
  ``memory_mb``, ``load_time_s``, ``cost_per_hour``, and the pair ``capacity_rps`` +
  ``capacity_slo_ms`` (a load-tested capacity at that SLO; several rows may differ only in
  these two);
- also read, and written by export so that export -> import round-trips: ``idle_power_w``,
  ``energy_method``, ``accuracy_metric``, ``samples``, ``duration_s``, ``created_at``,
  ``torch_version``, ``source``.

A bad row fails the whole import (file, line, column and reason) and nothing is written.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.records import ENERGY_METHODS, Profile, Variant, utcnow_iso
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


@dataclass
class ImportResult:
    """What an import wrote."""

    path: str
    rows: int
    profiles: int
    variants_created: list[str]
    variants_updated: list[str]


@dataclass
class _Row:
    line: int
    profile: Profile
    model: str | None
    accuracy: float | None
    accuracy_metric: str | None
    load_time_s: float | None


def _is_blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip() == "")


def _number(path: str, line: int, column: str, value: Any) -> float:
    if isinstance(value, bool):
        raise FileFormatError(path, f"'{value}' is not a number", line=line, column=column)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise FileFormatError(
            path, f"'{value}' is not a number", line=line, column=column
        ) from None
    if not math.isfinite(number):
        raise FileFormatError(path, f"'{value}' is not a finite number", line=line, column=column)
    if number < 0:
        raise FileFormatError(path, f"{number:g} is negative", line=line, column=column)
    return number


def _parse_row(path: str, line: int, raw: dict[str, Any]) -> _Row:
    def text(col: str) -> str | None:
        v = raw.get(col)
        return None if _is_blank(v) else str(v).strip()

    def num(col: str) -> float | None:
        v = raw.get(col)
        return None if _is_blank(v) else _number(path, line, col, v)

    for col in REQUIRED:
        if _is_blank(raw.get(col)):
            raise FileFormatError(path, "required value is empty", line=line, column=col)
    variant = str(raw["variant"]).strip()
    try:
        resource = parse_resource(str(raw["resource"])).label
    except InputError as exc:
        raise FileFormatError(
            path, exc.message, line=line, column="resource", hint=exc.hint
        ) from None
    batch_raw = raw["batch"]
    batch_num = _number(path, line, "batch", batch_raw)
    if batch_num < 1 or batch_num != int(batch_num):
        raise FileFormatError(
            path, f"batch must be a whole number >= 1, got '{batch_raw}'", line=line, column="batch"
        )
    throughput = _number(path, line, "throughput_rps", raw["throughput_rps"])
    if throughput <= 0:
        raise FileFormatError(path, "throughput must be > 0", line=line, column="throughput_rps")
    p50 = num("latency_p50_ms")
    plain = num("latency_ms")
    if p50 is None:
        p50 = plain
    elif plain is not None and plain != p50:
        raise FileFormatError(
            path,
            f"latency_ms ({plain:g}) and latency_p50_ms ({p50:g}) disagree",
            line=line,
            column="latency_ms",
        )
    p95, p99 = num("latency_p95_ms"), num("latency_p99_ms")
    if p50 is None and p95 is None and p99 is None:
        raise FileFormatError(
            path,
            "no latency given",
            line=line,
            hint="fill at least one of latency_ms, latency_p50_ms, latency_p95_ms, latency_p99_ms",
        )
    for name, value in (("latency_p50_ms", p50), ("latency_p95_ms", p95), ("latency_p99_ms", p99)):
        if value is not None and value <= 0:
            raise FileFormatError(path, "latency must be > 0", line=line, column=name)
    for name in ("isolated_p50_ms", "isolated_p95_ms", "isolated_p99_ms"):
        value = num(name)
        if value is not None and value <= 0:
            raise FileFormatError(path, "latency must be > 0", line=line, column=name)
    known = [v for v in (p50, p95, p99) if v is not None]
    if known != sorted(known):
        raise FileFormatError(
            path, "latency percentiles must not fall from p50 to p95 to p99", line=line
        )
    capacity, capacity_slo = num("capacity_rps"), num("capacity_slo_ms")
    if (capacity is None) != (capacity_slo is None):
        missing = "capacity_slo_ms" if capacity_slo is None else "capacity_rps"
        raise FileFormatError(
            path, "capacity_rps and capacity_slo_ms come as a pair", line=line, column=missing
        )
    accuracy = num("accuracy")
    if accuracy is not None and accuracy > 1:
        raise FileFormatError(
            path,
            f"accuracy {accuracy:g} is above 1",
            line=line,
            column="accuracy",
            hint="give accuracy as a fraction (0.7613), not a percentage",
        )
    method = text("energy_method")
    energy = num("energy_j")
    if method is None:
        method = "imported"
    elif method not in ENERGY_METHODS:
        raise FileFormatError(
            path,
            f"unknown energy method '{method}'",
            line=line,
            column="energy_method",
            hint=f"use one of {', '.join(ENERGY_METHODS)}",
        )
    samples_raw = raw.get("samples")
    samples = None
    if not _is_blank(samples_raw):
        s = _number(path, line, "samples", samples_raw)
        if s != int(s):
            raise FileFormatError(
                path, "samples must be a whole number", line=line, column="samples"
            )
        samples = int(s)
    profile = Profile(
        variant=variant,
        resource=resource,
        batch=int(batch_num),
        throughput_rps=throughput,
        latency_p50_ms=p50,
        latency_p95_ms=p95,
        latency_p99_ms=p99,
        hardware=text("hardware"),
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
        torch_version=text("torch_version"),
        source=text("source") or "imported",
        created_at=text("created_at") or utcnow_iso(),
    )
    return _Row(line, profile, text("model"), accuracy, text("accuracy_metric"), num("load_time_s"))


def _read_rows(path: Path, fmt: str) -> list[tuple[int, dict[str, Any]]]:
    """Rows with their line numbers (CSV: file line; JSON: 1-based record index)."""
    p = str(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p} does not exist") from None
    except UnicodeDecodeError:
        raise FileFormatError(p, "not a UTF-8 text file") from None
    if fmt == "auto":
        fmt = (
            "json"
            if path.suffix.lower() == ".json" or text.lstrip().startswith(("[", "{"))
            else "csv"
        )
    if fmt == "json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FileFormatError(p, f"invalid JSON: {exc.msg}", line=exc.lineno) from None
        if isinstance(doc, dict) and isinstance(doc.get("profiles"), list):
            doc = doc["profiles"]
        if not isinstance(doc, list) or not all(isinstance(r, dict) for r in doc):
            raise FileFormatError(p, 'expected a list of profile objects (or {"profiles": [...]})')
        columns = set().union(*(r.keys() for r in doc)) if doc else set()
        _check_columns(p, columns, line=None)
        return [(i + 1, r) for i, r in enumerate(doc)]
    if fmt != "csv":
        raise InputError(f"unknown format '{fmt}'", hint="use csv, json or auto")
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise FileFormatError(p, "the file is empty", hint="the first line must name the columns")
    header = [h.strip() for h in reader.fieldnames]
    reader.fieldnames = header
    _check_columns(p, set(header), line=1)
    rows = []
    for raw in reader:
        if None in raw:
            raise FileFormatError(p, "more values than columns", line=reader.line_num)
        if all(_is_blank(v) for v in raw.values()):
            continue
        rows.append((reader.line_num, raw))
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
            f"unknown column '{unknown[0]}'",
            line=line,
            hint="known columns: " + ", ".join(EXPORT_COLUMNS),
        )


def import_profiles(store: Store, path: str | Path, *, fmt: str = "auto") -> ImportResult:
    """Import a profile CSV/JSON file into the store in one transaction.

    Raises:
        FileFormatError: a bad row or column (file, line, column, reason); nothing is written.
        InputError: the file is missing or unreadable.
    """
    path = Path(path)
    raw_rows = _read_rows(path, fmt)
    if not raw_rows:
        raise FileFormatError(str(path), "no profile rows found")
    rows = [_parse_row(str(path), line, raw) for line, raw in raw_rows]

    # Variant-level facts must agree across the file's rows; they override the store's.
    variants: dict[str, Variant] = {}
    created: list[str] = []
    updated: list[str] = []
    seen: dict[tuple[str, str], tuple[Any, int]] = {}
    for row in rows:
        name = row.profile.variant
        if name not in variants:
            if store.db.table("variants").count_where("name = ?", [name]):
                variants[name] = store.get_variant(name)
            elif row.model is None:
                raise FileFormatError(
                    str(path),
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
                str(path),
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
                    str(path),
                    f"{attr} of '{name}' is {earlier[0]!r} on line {earlier[1]}, {value!r} here",
                    line=row.line,
                    column=attr,
                )
            if getattr(v, attr) != value:
                if name not in created and name not in updated:
                    updated.append(name)
                setattr(v, attr, value)
    with store.transaction():
        for v in variants.values():
            store.upsert_variant(v)
        store.add_profiles(r.profile for r in rows)
    return ImportResult(str(path), len(rows), len(rows), created, updated)


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
        from greenctl.data.records import row_to_record

        profiles = [row_to_record(Profile, r) for r in store.db.query(sql, params)]
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
