"""Import the gpulet reference measurements into the store, and read them back.

The reference folder (``bundled:gpulet``, from 0909wlgur/Gpulet) holds three header-less
CSVs: ``inference.csv`` (solo profiles under an MPS partition, imported as variants and
``mps:<partition>`` profiles, latency in ms), ``mem_util.csv`` (DRAM and L2 utilisation of
each solo run, table ``utilisations``) and ``interference.csv`` (a model beside a co-runner
on the rest of the GPU, table ``colocations``); columns in docs/models.md ("gpulet's
reference data"). Every file is validated completely before anything is written; the import
is one transaction.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data import bundled
from greenctl.data.errors import FileFormatError, InputError, NotFoundError
from greenctl.data.provenance import check_import_merge
from greenctl.data.records import Profile, Variant, utcnow_iso
from greenctl.data.resources import kind_of
from greenctl.data.store import Store, row_id

INFERENCE = "inference.csv"
MEM_UTIL = "mem_util.csv"
INTERFERENCE = "interference.csv"
DEFAULT_HARDWARE = "gpulet-reference"
_SOURCE = "gpulet-reference"
#: A model name in the reference files (and a --prefix).
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]*")


@dataclass
class SoloRow:
    """One solo profile point of ``inference.csv``."""

    model: str
    batch: int
    partition: int
    throughput_rps: float
    latency_ms: float
    valid: bool


@dataclass
class UtilRow:
    """One ``mem_util.csv`` row: utilisations in percent."""

    model: str
    batch: int
    partition: int
    dram_util_pct: float
    l2_util_pct: float
    flag: int


@dataclass
class ColocationRow:
    """One ``interference.csv`` row: the model's figures while the co-runner runs beside it."""

    model: str
    batch: int
    partition: int
    corunner_model: str
    corunner_batch: int
    throughput_rps: float
    latency_ms: float
    valid: bool

    @property
    def corunner_partition(self) -> int:
        return 100 - self.partition


@dataclass
class GpuletData:
    """The parsed reference files."""

    solo: list[SoloRow] = field(default_factory=list)
    utilisation: list[UtilRow] = field(default_factory=list)
    colocations: list[ColocationRow] = field(default_factory=list)


@dataclass
class ImportSummary:
    """What an import wrote."""

    directory: str
    variants: int
    profiles: int
    skipped_invalid: int
    utilisations: int
    colocations: int
    models: list[str]
    prefix: str | None = None
    merged: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# -- parsing ------------------------------------------------------------------------------


def _family(model: str) -> str:
    """``resnet50`` -> ``resnet``; names without trailing digits are their own family."""
    stripped = re.sub(r"[-_]?\d+$", "", model)
    return stripped or model


def _rows(path: Path) -> list[tuple[int, list[str]]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(
            f"{path} does not exist", hint="pass the folder holding the gpulet *.csv files"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise FileFormatError(str(path), f"cannot read: {exc}") from None
    out = []
    for lineno, row in enumerate(csv.reader(text.splitlines()), start=1):
        if not row or all(not c.strip() for c in row):
            continue
        out.append((lineno, [c.strip() for c in row]))
    if not out:
        raise FileFormatError(str(path), "the file is empty")
    return out


class _Fields:
    """Typed access to the cells of one CSV row, failing with file/line/column."""

    def __init__(self, path: Path, line: int, cells: list[str], names: list[str]) -> None:
        self.path, self.line, self.cells, self.names = path, line, cells, names
        if len(cells) != len(names):
            raise FileFormatError(
                str(path),
                f"expected {len(names)} comma-separated fields, found {len(cells)}",
                line=line,
                hint="columns: " + ",".join(names),
            )

    def _cell(self, name: str) -> str:
        return self.cells[self.names.index(name)]

    def name(self, col: str) -> str:
        value = self._cell(col)
        if not _NAME_RE.fullmatch(value):
            raise FileFormatError(
                str(self.path), f"'{value}' is not a model name", line=self.line, column=col
            )
        return value

    def literal(self, col: str, expected: str) -> None:
        if self._cell(col) != expected:
            raise FileFormatError(
                str(self.path),
                f"expected the word '{expected}', found '{self._cell(col)}'",
                line=self.line,
                column=col,
            )

    def integer(self, col: str, lo: int, hi: int) -> int:
        value = self._cell(col)
        if not re.fullmatch(r"\d+", value) or not lo <= int(value) <= hi:
            raise FileFormatError(
                str(self.path),
                f"'{value}' is not a whole number between {lo} and {hi}",
                line=self.line,
                column=col,
            )
        return int(value)

    def number(self, col: str, *, positive: bool = False) -> float:
        value = self._cell(col)
        try:
            x = float(value)
        except ValueError:
            x = float("nan")
        if x != x or x in (float("inf"), float("-inf")) or x < 0 or (positive and x == 0):
            raise FileFormatError(
                str(self.path),
                f"'{value}' is not a {'positive' if positive else 'non-negative'} number",
                line=self.line,
                column=col,
            )
        return x


_SOLO_COLS = ["model", "batch", "partition", "label1", "throughput", "label2", "latency", "valid"]
_UTIL_COLS = ["model", "batch", "partition", "label1", "mem_util", "label2", "l2_util", "flag"]
_COLO_COLS = [
    "model",
    "batch",
    "partition",
    "corunner_model",
    "corunner_batch",
    "label1",
    "throughput",
    "label2",
    "latency",
    "valid",
]


def parse_inference(path: Path) -> list[SoloRow]:
    """Parse ``inference.csv`` (latency seconds -> ms)."""
    out = []
    for line, cells in _rows(path):
        f = _Fields(path, line, cells, _SOLO_COLS)
        f.literal("label1", "throughput")
        f.literal("label2", "latency")
        out.append(
            SoloRow(
                model=f.name("model"),
                batch=f.integer("batch", 1, 1_000_000),
                partition=f.integer("partition", 1, 100),
                throughput_rps=f.number("throughput"),
                latency_ms=f.number("latency", positive=True) * 1000.0,
                valid=bool(f.integer("valid", 0, 1)),
            )
        )
    return out


def parse_mem_util(path: Path) -> list[UtilRow]:
    """Parse ``mem_util.csv`` (utilisations in percent, 0..100)."""
    out = []
    for line, cells in _rows(path):
        f = _Fields(path, line, cells, _UTIL_COLS)
        f.literal("label1", "mem_util")
        f.literal("label2", "l2_util")
        dram, l2 = f.number("mem_util"), f.number("l2_util")
        for col, v in (("mem_util", dram), ("l2_util", l2)):
            if v > 100:
                raise FileFormatError(
                    str(path), f"utilisation {v} is above 100 %", line=line, column=col
                )
        out.append(
            UtilRow(
                model=f.name("model"),
                batch=f.integer("batch", 1, 1_000_000),
                partition=f.integer("partition", 1, 100),
                dram_util_pct=dram,
                l2_util_pct=l2,
                flag=f.integer("flag", 0, 1_000_000),
            )
        )
    return out


def parse_interference(path: Path) -> list[ColocationRow]:
    """Parse ``interference.csv`` (latency seconds -> ms)."""
    out = []
    for line, cells in _rows(path):
        f = _Fields(path, line, cells, _COLO_COLS)
        f.literal("label1", "throughput")
        f.literal("label2", "latency")
        out.append(
            ColocationRow(
                model=f.name("model"),
                batch=f.integer("batch", 1, 1_000_000),
                partition=f.integer("partition", 1, 99),
                corunner_model=f.name("corunner_model"),
                corunner_batch=f.integer("corunner_batch", 1, 1_000_000),
                throughput_rps=f.number("throughput"),
                latency_ms=f.number("latency", positive=True) * 1000.0,
                valid=bool(f.integer("valid", 0, 1)),
            )
        )
    return out


def read_gpulet_dir(directory: str | Path) -> GpuletData:
    """Parse a gpulet folder (or ``bundled:gpulet``); ``inference.csv`` is required, the rest optional.

    Raises:
        InputError: the folder or ``inference.csv`` is missing.
        FileFormatError: a malformed row, naming file, line and column.
    """
    d = bundled.resolve(directory)
    if not d.is_dir():
        raise InputError(
            f"{d} is not a folder",
            hint="pass the folder holding inference.csv, mem_util.csv and interference.csv",
        )
    data = GpuletData(solo=parse_inference(d / INFERENCE))
    if (d / MEM_UTIL).exists():
        data.utilisation = parse_mem_util(d / MEM_UTIL)
    if (d / INTERFERENCE).exists():
        data.colocations = parse_interference(d / INTERFERENCE)
    return data


# -- writing ------------------------------------------------------------------------------


def with_prefix(data: GpuletData, prefix: str) -> GpuletData:
    """The same measurements with every model named ``PREFIX-MODEL`` (co-runners too), so
    ``resnet50`` becomes ``gpulet-resnet50`` of family ``gpulet-resnet``.

    Raises:
        InputError: ``prefix`` is not a name (a letter, then letters, digits, ``._-``).
    """
    stem = prefix.rstrip("-")
    if not _NAME_RE.fullmatch(stem):
        raise InputError(
            f"--prefix '{prefix}' is not a name",
            hint="start with a letter; letters, digits, '.', '_' and '-' only (e.g. gpulet)",
        )

    def n(model: str) -> str:
        return f"{stem}-{model}"

    return GpuletData(
        solo=[SoloRow(**{**r.__dict__, "model": n(r.model)}) for r in data.solo],
        utilisation=[UtilRow(**{**u.__dict__, "model": n(u.model)}) for u in data.utilisation],
        colocations=[
            ColocationRow(
                **{**c.__dict__, "model": n(c.model), "corunner_model": n(c.corunner_model)}
            )
            for c in data.colocations
        ],
    )


def import_gpulet(
    store: Store,
    directory: str | Path,
    *,
    hardware: str = DEFAULT_HARDWARE,
    prefix: str | None = None,
    merge: bool = False,
) -> ImportSummary:
    """Import the gpulet reference folder into ``store`` in one transaction.

    Variants that already exist keep their fields; profiles are appended (the newest of a
    point wins in ``latest_profiles``); utilisations and co-locations are replaced point by point.
    An import that would add its profiles to a variant or family holding another data set's
    (another hardware label, e.g. the InfAdapter CPU ``resnet`` family) is refused unless
    ``merge``; ``prefix`` imports every model as ``PREFIX-MODEL`` instead.

    Raises:
        InputError / FileFormatError: nothing is written then.
    """
    data = read_gpulet_dir(directory)
    if prefix:
        data = with_prefix(data, prefix)
    elif prefix is not None:
        raise InputError("--prefix is empty", hint="for example --prefix gpulet")
    if not hardware.strip():
        raise InputError("--hardware is empty", hint=f"the default is {DEFAULT_HARDWARE}")
    now = utcnow_iso()
    models = sorted({r.model for r in data.solo if r.valid})
    profiles = _solo_profiles(data, hardware=hardware, created_at=now)
    new_variants = 0
    example = "resnet50" if "resnet50" in models else next(iter(models), "resnet50")
    rename = (
        f"choose another --prefix than '{prefix}'"
        if prefix
        else f"import under other names with --prefix gpulet ({example} becomes "
        f"gpulet-{example} of family gpulet-{_family(example)})"
    )
    with store.transaction():
        merged = check_import_merge(
            store,
            [(m, _family(m), hardware) for m in models],
            what=f"gpulet import of {directory}",
            hint=f"{rename}, or pass --merge to add these profiles to the existing "
            "variants and families on purpose",
            merge=merge,
        )
        known = {v.name for v in store.variants()}
        for m in models:
            if m not in known:
                store.upsert_variant(
                    Variant(name=m, family=_family(m), source="imported", input_shape="3,224,224")
                )
                new_variants += 1
        store.add_profiles(profiles)
        _write_utilisation(store, data.utilisation)
        valid_colo = [c for c in data.colocations if c.valid]
        _write_colocations(store, valid_colo)
    skipped = sum(1 for r in data.solo if not r.valid) + sum(
        1 for c in data.colocations if not c.valid
    )
    return ImportSummary(
        directory=str(directory),
        variants=new_variants,
        profiles=len(profiles),
        skipped_invalid=skipped,
        utilisations=len(data.utilisation),
        colocations=len(valid_colo),
        models=models,
        prefix=prefix,
        merged=merged,
    )


def _solo_profiles(data: GpuletData, *, hardware: str, created_at: str) -> list[Profile]:
    """A profile per valid solo measurement: model on ``mps:PARTITION`` at its batch."""
    return [
        Profile(
            variant=r.model,
            resource=f"mps:{r.partition}",
            batch=r.batch,
            throughput_rps=r.throughput_rps,
            latency_p50_ms=r.latency_ms,
            hardware=hardware,
            energy_method="imported",
            source="imported",
            created_at=created_at,
        )
        for r in data.solo
        if r.valid
    ]


def _write_utilisation(store: Store, rows: list[UtilRow]) -> None:
    """Replace the memory utilisations of the points ``rows`` measure."""
    if not rows:
        return
    store.db.table("utilisations").insert_all(
        [
            {
                "model": u.model,
                "batch": u.batch,
                "partition": u.partition,
                "resource": f"mps:{u.partition}",
                "dram_util_pct": u.dram_util_pct,
                "l2_util_pct": u.l2_util_pct,
                "flag": u.flag,
                "source": _SOURCE,
            }
            for u in rows
        ],
        pk=("model", "batch", "partition"),
        replace=True,
        batch_size=1000,
    )


def _write_colocations(store: Store, rows: list[ColocationRow]) -> None:
    """Replace the co-location measurements of the pairs ``rows`` measure."""
    if not rows:
        return
    store.db.table("colocations").insert_all(
        [
            {
                "model": c.model,
                "batch": c.batch,
                "partition": c.partition,
                "corunner_model": c.corunner_model,
                "corunner_batch": c.corunner_batch,
                "corunner_partition": c.corunner_partition,
                "throughput_rps": c.throughput_rps,
                "latency_ms": c.latency_ms,
                "source": _SOURCE,
            }
            for c in rows
        ],
        pk=("model", "batch", "partition", "corunner_model", "corunner_batch"),
        replace=True,
        batch_size=1000,
    )


# -- reading back -------------------------------------------------------------------------


def load_utilisation(store: Store) -> dict[tuple[str, int, int], tuple[float, float]]:
    """``{(model, batch, partition): (l2_util_pct, dram_util_pct)}`` from the store."""
    return {
        (r["model"], int(r["batch"]), int(r["partition"])): (
            float(r["l2_util_pct"]),
            float(r["dram_util_pct"]),
        )
        for r in store.rows("select * from utilisations")
    }


def load_colocations(store: Store) -> list[ColocationRow]:
    """Every stored co-location measurement."""
    return [
        ColocationRow(
            model=r["model"],
            batch=int(r["batch"]),
            partition=int(r["partition"]),
            corunner_model=r["corunner_model"],
            corunner_batch=int(r["corunner_batch"]),
            throughput_rps=float(r["throughput_rps"] or 0.0),
            latency_ms=float(r["latency_ms"]),
            valid=True,
        )
        for r in store.rows(
            "select * from colocations "
            "order by model, partition, batch, corunner_model, corunner_batch"
        )
    ]


def load_solo_latency(store: Store) -> dict[tuple[str, int, int], float]:
    """``{(variant, batch, mps_percent): latency_ms}`` of the latest ``mps:*`` profiles."""
    out: dict[tuple[str, int, int], float] = {}
    for p in store.latest_profiles():
        if not kind_of(p.resource).thread_percentage:
            continue
        lat = p.latency_p50_ms or p.latency_p95_ms or p.latency_p99_ms
        if lat:
            out[(p.variant, p.batch, int(p.resource.split(":", 1)[1]))] = float(lat)
    return out


def save_interference_model(
    store: Store,
    *,
    coefficients: list[float],
    features: list[str],
    n_train: int,
    n_test: int,
    errors: dict[str, Any],
    source: str,
    kind: str = "linear-l2-dram",
) -> int:
    """Store a fitted interference model; returns its id."""
    with store.transaction():
        pk = (
            store.db.table("interference_models")
            .insert(
                {
                    "created_at": utcnow_iso(),
                    "kind": kind,
                    "coefficients": json.dumps([float(c) for c in coefficients]),
                    "features": json.dumps(features),
                    "n_train": n_train,
                    "n_test": n_test,
                    "errors": json.dumps(errors),
                    "source": source,
                }
            )
            .last_pk
        )
    return row_id(pk)


def get_interference_model(store: Store, model_id: int | None = None) -> dict[str, Any]:
    """A stored interference model (the newest when ``model_id`` is None) as a dict.

    Raises:
        NotFoundError: none stored, or no model with that id.
    """
    if model_id is None:
        rows = store.rows("select * from interference_models order by id desc limit 1")
    else:
        rows = store.rows("select * from interference_models where id = ? limit 1", [model_id])
    if not rows:
        raise NotFoundError(
            "no interference model in the store"
            if model_id is None
            else f"no interference model with id {model_id}",
            hint="run `greenctl gpulet import DIR` then `greenctl interference fit`",
        )
    r = rows[0]
    return {
        "id": r["id"],
        "created_at": r["created_at"],
        "kind": r["kind"],
        "coefficients": json.loads(r["coefficients"]),
        "features": json.loads(r["features"] or "[]"),
        "n_train": r["n_train"],
        "n_test": r["n_test"],
        "errors": json.loads(r["errors"] or "{}"),
        "source": r["source"],
    }


def interference_models(store: Store) -> list[dict[str, Any]]:
    """All stored interference models, newest first (without errors detail)."""
    return [
        get_interference_model(store, int(r["id"]))
        for r in store.rows("select id from interference_models order by id desc")
    ]


# -- inputs of plan glet -------------------------------------------------------------------


def resolve_variant(store: Store, name: str) -> str:
    """A model name as given by the user -> a profiled variant name.

    ``name`` is a variant, or a family with exactly one variant.

    Raises:
        NotFoundError: neither, or an ambiguous family (the message lists the choices).
    """
    if store.rows("select 1 from variants where name = ? limit 1", [name]):
        return name
    members = [v.name for v in store.variants(name)]
    if len(members) == 1:
        return members[0]
    if members:
        raise NotFoundError(
            f"model '{name}' is a family with several variants: {', '.join(members)}",
            hint="name the variant, or give 'variant' in the --spec file",
        )
    known = [v.name for v in store.variants()]
    raise NotFoundError(
        f"unknown model '{name}'",
        hint=(f"known variants: {', '.join(known)}" if known else "")
        + ("; " if known else "")
        + "import the gpulet reference data with `greenctl gpulet import DIR`",
    )


def load_latency_table(
    store: Store, variants: list[str], *, hardware: str | None = None
) -> dict[str, dict[str, dict[int, float]]]:
    """``{variant: {resource: {batch: latency_ms}}}`` from the latest profiles.

    Uses each profile's p99 latency, else p95, else p50 (imported gpulet figures are
    mean batch latencies, stored as p50). When several hardware models profiled the same
    point and ``hardware`` is None, the newest profile wins.
    """
    out: dict[str, dict[str, dict[int, float]]] = {}
    for v in variants:
        rows = sorted(
            store.latest_profiles(variant=v, hardware=hardware),
            key=lambda p: (p.created_at, p.id or 0),
        )
        table: dict[str, dict[int, float]] = {}
        for p in rows:
            lat = p.latency_p99_ms or p.latency_p95_ms or p.latency_p50_ms
            if lat and p.capacity_slo_ms is None:
                table.setdefault(p.resource, {})[int(p.batch)] = float(lat)
        out[v] = table
    return out
