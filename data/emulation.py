"""How far MPS-emulated MIG slices sit from other measurements of the same GPU.

``greenctl profile --gpus --emulate-mig`` stores MIG slices measured as MPS shares
(``source`` ``mps-emulated``). This module sets each such row beside, for the same variant,
batch and GPU model: the whole GPU (what MPS itself costs, for the full slice), a real MPS
share within :data:`MPS_MATCH_POINTS` points, and a real MIG instance of the profile.
The summary gives median, min and max of each ratio (emulated / reference: p50 above 1 is
slower, throughput below 1 serves less). Load-tested rows are left out; the newest
measurement per point and source counts.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.mig_geometry import find_gpu, mps_percentage
from greenctl.data.records import MPS_EMULATED, Profile, row_to_record
from greenctl.data.resources import Resource, parse_resource
from greenctl.data.store import Store

#: How far (percentage points) a measured MPS share may lie from an emulated slice's
#: percentage to be compared with it.
MPS_MATCH_POINTS = 15


@dataclass
class Reference:
    """One measured row an emulated slice is compared with, and the ratios."""

    resource: str
    latency_p50_ms: float | None
    throughput_rps: float
    energy_j: float | None
    p50_ratio: float | None  # emulated p50 / this p50
    throughput_ratio: float | None  # emulated throughput / this throughput
    energy_ratio: float | None  # emulated J/request / this J/request


@dataclass
class EmulatedRow:
    """One emulated slice (variant, batch, GPU model, MIG profile) and its references."""

    variant: str
    batch: int
    hardware: str
    resource: str
    compute_slices: int
    mps_percentage: int
    latency_p50_ms: float | None
    throughput_rps: float
    energy_j: float | None
    created_at: str
    whole_gpu: Reference | None = None
    mps: Reference | None = None
    mig: Reference | None = None


@dataclass
class EmulationReport:
    """Every emulated row with its references, and a summary per comparison."""

    rows: list[EmulatedRow]
    summary: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": [asdict(r) for r in self.rows],
            "summary": self.summary,
            "notes": self.notes,
        }


def _resource(label: str) -> Resource:
    try:
        return parse_resource(label)
    except InputError:  # not a label greenctl writes: compare it with nothing
        return Resource("unknown", label)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _reference(emu: Profile, ref: Profile) -> Reference:
    return Reference(
        resource=ref.resource,
        latency_p50_ms=ref.latency_p50_ms,
        throughput_rps=ref.throughput_rps,
        energy_j=ref.energy_j,
        p50_ratio=_ratio(emu.latency_p50_ms, ref.latency_p50_ms),
        throughput_ratio=_ratio(emu.throughput_rps, ref.throughput_rps),
        energy_ratio=_ratio(emu.energy_j, ref.energy_j),
    )


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def _summary(rows: list[EmulatedRow], kind: str, *, full_only: bool = False) -> dict[str, Any]:
    refs = [
        (r, getattr(r, kind.replace("-", "_")))
        for r in rows
        if getattr(r, kind.replace("-", "_")) is not None
        and (not full_only or r.mps_percentage == 100)
    ]
    return {
        "pairs": len(refs),
        "p50_ratio": _stats([x.p50_ratio for _r, x in refs if x.p50_ratio is not None]),
        "throughput_ratio": _stats(
            [x.throughput_ratio for _r, x in refs if x.throughput_ratio is not None]
        ),
        "energy_ratio": _stats([x.energy_ratio for _r, x in refs if x.energy_ratio is not None]),
    }


def _newest_per_source(
    store: Store, *, family: str | None, variant: str | None
) -> dict[tuple[str, str, int, str, str], Profile]:
    """The newest plain (not load-tested) row of each (variant, resource, batch, hardware,
    source), for rows with a hardware name."""
    sql = (
        "select p.* from profiles p join variants v on v.name = p.variant "
        "where p.hardware is not null and p.capacity_slo_ms is null"
    )
    params: list[Any] = []
    if family is not None:
        sql += " and v.family = ?"
        params.append(family)
    if variant is not None:
        sql += " and p.variant = ?"
        params.append(variant)
    sql += " order by p.created_at, p.id"
    out: dict[tuple[str, str, int, str, str], Profile] = {}
    for row in store.rows(sql, params):
        p: Profile = row_to_record(Profile, row)
        out[(p.variant, p.resource, p.batch, str(p.hardware), p.source)] = p  # newest wins
    return out


def compare_emulated(
    store: Store, *, family: str | None = None, variant: str | None = None
) -> EmulationReport:
    """Set every MPS-emulated MIG slice beside the whole GPU, the nearest real MPS share and
    a real MIG instance of the same GPU model (see the module docstring).

    Raises:
        NotFoundError: the store holds no MPS-emulated profiles (of ``family``/``variant``).
    """
    latest = _newest_per_source(store, family=family, variant=variant)
    notes: list[str] = []
    measured: dict[tuple[str, int, str], list[Profile]] = {}
    for (v, _res, b, hw, source), p in latest.items():
        if source == "measured":
            measured.setdefault((v, b, hw), []).append(p)
    rows: list[EmulatedRow] = []
    for (v, res, b, hw, source), emu in sorted(latest.items()):
        if source != MPS_EMULATED or _resource(res).mig_compute_slices is None:
            continue
        geo = find_gpu(hw)
        if geo is None or not geo.has_profile(res):
            notes.append(f"{v} on {res} ({hw}): no MIG geometry for it; left out")
            continue
        slices = geo.profile(res).compute_slices
        pct = mps_percentage(geo, slices)
        row = EmulatedRow(
            variant=v,
            batch=b,
            hardware=hw,
            resource=res,
            compute_slices=slices,
            mps_percentage=pct,
            latency_p50_ms=emu.latency_p50_ms,
            throughput_rps=emu.throughput_rps,
            energy_j=emu.energy_j,
            created_at=emu.created_at,
        )
        others = measured.get((v, b, hw), [])
        whole = [p for p in others if _resource(p.resource).spec.size_is_gpu_model]
        if whole:
            row.whole_gpu = _reference(emu, max(whole, key=lambda p: p.created_at))
        shares = []
        for p in others:
            share = _resource(p.resource).mps_percent
            if share is not None and abs(share - pct) <= MPS_MATCH_POINTS:
                shares.append((abs(share - pct), share, p))
        if shares:
            row.mps = _reference(emu, min(shares, key=lambda t: (t[0], t[1]))[2])
        real = [p for p in others if p.resource == res]
        if real:
            row.mig = _reference(emu, real[0])
        rows.append(row)
    if not rows:
        scope = ""
        if variant is not None:
            scope = f" of variant {variant}"
        elif family is not None:
            scope = f" of family {family}"
        raise NotFoundError(
            f"no MPS-emulated profiles{scope} in the store",
            hint="measure them on a GPU with MIG mode off: "
            "`greenctl profile --variant resnet50 --gpus --emulate-mig`",
        )
    rows.sort(key=lambda r: (r.variant, r.hardware, r.batch, r.compute_slices, r.resource))
    summary = {
        "whole-gpu (full slice)": _summary(rows, "whole-gpu", full_only=True),
        "whole-gpu": _summary(rows, "whole-gpu"),
        "mps": _summary(rows, "mps"),
        "mig": _summary(rows, "mig"),
    }
    if not any(r.mig for r in rows):
        notes.append(
            "no measured MIG instance of these GPU models in the store: emulated slices are "
            "compared with the whole GPU and MPS shares only"
        )
    return EmulationReport(rows, summary, notes)
