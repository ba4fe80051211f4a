"""Emissions of running plans in CodeCarbon's ``emissions.csv`` layout, and the carbon figures
a plan hands its executors.

``report emissions --format codecarbon`` writes one row per verified run and per interval
between replanning decisions, in CodeCarbon 3.3's columns (:data:`CODECARBON_COLUMNS`) and
units (kg CO2eq, kWh, W, s, L; energy and power include the PUE, water is WUE times it).
Energy the executors measured during a verified run is ``tracking_mode`` ``machine``;
energy predicted from the plan or read from a ``modeled`` counter is ``modeled``, a value
CodeCarbon never writes, so a dashboard can tell estimates from measurements.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import os
import platform
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.carbon_io import parse_time
from greenctl.data.errors import InputError
from greenctl.data.limits import number
from greenctl.data.plan import Plan
from greenctl.data.reports import decisions
from greenctl.data.resources import kind_of

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: CodeCarbon 3.3's ``emissions.csv`` columns, in its order
#: (``codecarbon.output_methods.emissions_data.EmissionsData``).
CODECARBON_COLUMNS = [
    "timestamp", "project_name", "run_id", "experiment_id", "duration", "emissions",
    "emissions_rate", "cpu_power", "gpu_power", "ram_power", "cpu_energy", "gpu_energy",
    "ram_energy", "energy_consumed", "water_consumed", "country_name", "country_iso_code",
    "region", "cloud_provider", "cloud_region", "os", "python_version", "codecarbon_version",
    "cpu_count", "cpu_model", "gpu_count", "gpu_model", "longitude", "latitude",
    "ram_total_size", "tracking_mode", "cpu_utilization_percent", "gpu_utilization_percent",
    "ram_utilization_percent", "ram_used_gb", "on_cloud", "pue", "wue",
]  # fmt: skip

#: Report formats of ``greenctl report emissions``.
EMISSIONS_FORMATS = ("codecarbon",)
#: ``tracking_mode`` of rows whose energy was modeled (estimated), not measured.
MODELED = "modeled"
#: ``tracking_mode`` of rows whose energy was measured (NVML, RAPL), as CodeCarbon's own.
MEASURED = "machine"
_J_PER_KWH = 3.6e6
_NAMESPACE = uuid.UUID("6f1c0a52-6b7e-4d55-9d0e-3c1f6f0c9e19")


# -- the carbon figures of a plan ------------------------------------------------------------
def plan_carbon(plan: Plan) -> tuple[float | None, float]:
    """The grid intensity (g/kWh, None when the plan has none) and PUE a plan was made with:
    its predicted ``carbon_intensity_g_per_kwh``, else its request's ``carbon_intensity``;
    PUE from its request (1 without)."""
    field, value = (
        "predicted.carbon_intensity_g_per_kwh",
        plan.predicted.get("carbon_intensity_g_per_kwh"),
    )
    if value is None:
        field, value = "request.carbon_intensity", plan.request.get("carbon_intensity")
    if value is not None:  # a plan file's field: a finite number >= 0
        where = f"plan {plan.id if plan.id is not None else '(file)'}: {field}"
        value = number(value, where, minimum=0.0)
    pue = plan.request.get("pue")
    return (
        None if value is None else float(value),
        float(pue) if isinstance(pue, int | float) and pue >= 1 else 1.0,
    )


def routes_carbon(plan: Plan) -> dict[str, float] | None:
    """What the dispatcher's routing table says of carbon (its ``carbon``): the grid
    intensity and PUE the plan was made with, ``{"carbon_g_per_kwh": G, "pue": P}``, which it
    exports and hands the executors; None when the plan has no intensity."""
    intensity, pue = plan_carbon(plan)
    return None if intensity is None else {"carbon_g_per_kwh": intensity, "pue": pue}


def executor_energy_args(
    store: Store, plan: Plan, *, variant: str, resource: str, batch: int
) -> list[str]:
    """Command-line options of an executor's energy and carbon counters
    (``greenctl.executor.runtime.daemon``): the intensity and PUE the plan was made with
    (``--carbon-intensity G --pue P``, none without an intensity) and, for when nothing
    measures its energy, the stored profile's figures at the batch closest to ``batch``
    (``--power-w``, ``--idle-power-w``, ``--energy-j-per-request``)."""
    out: list[str] = []
    intensity, pue = plan_carbon(plan)
    if intensity is not None:
        out += ["--carbon-intensity", f"{intensity:g}", "--pue", f"{pue:g}"]
    rows = store.latest_profiles(variant=variant, resource=resource)
    if rows:
        p = min(rows, key=lambda r: (abs(r.batch - batch), r.batch))
        for flag, value in (
            ("--power-w", p.power_w),
            ("--idle-power-w", p.idle_power_w),
            ("--energy-j-per-request", p.energy_j),
        ):
            if value is not None:
                out += [flag, repr(float(value))]
    return out


# -- rows -------------------------------------------------------------------------------------
def _machine() -> dict[str, Any]:
    return {
        "os": platform.platform(),
        "python_version": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


def _split(plan: Plan) -> tuple[float, list[str]]:
    """The share of a plan's instances on CPUs (the rest on accelerators) and the
    accelerator resource labels, by instance count."""
    cpu = acc = 0
    gpus: list[str] = []
    for d in plan.deployments:
        if kind_of(d.resource).accelerator:
            acc += d.count
            gpus.append(d.resource)
        else:
            cpu += d.count
    total = cpu + acc
    return (cpu / total if total else 1.0), sorted(set(gpus))


def _row(
    *,
    timestamp: str,
    run_key: str,
    plan: Plan,
    duration_s: float,
    cpu_j: float,
    gpu_j: float,
    intensity: float | None,
    pue: float,
    wue: float | None,
    region: str | None,
    mode: str,
    store_key: str,
) -> dict[str, Any]:
    cpu_kwh, gpu_kwh = cpu_j * pue / _J_PER_KWH, gpu_j * pue / _J_PER_KWH
    kwh = cpu_kwh + gpu_kwh
    kg = None if intensity is None else kwh * intensity / 1000.0
    dur = max(duration_s, 0.0)
    _, gpus = _split(plan)
    gpu_count = sum(d.count for d in plan.deployments if d.resource in gpus)
    return {
        "timestamp": timestamp[:19],
        "project_name": "greenctl",
        "run_id": str(uuid.uuid5(_NAMESPACE, f"{store_key}:{run_key}")),
        "experiment_id": f"greenctl-plan-{plan.id}" if plan.id is not None else "greenctl",
        "duration": dur,
        "emissions": kg,
        "emissions_rate": None if kg is None or dur <= 0 else kg / dur,
        "cpu_power": cpu_j * pue / dur if dur > 0 else 0.0,
        "gpu_power": gpu_j * pue / dur if dur > 0 else 0.0,
        "ram_power": 0.0,
        "cpu_energy": cpu_kwh,
        "gpu_energy": gpu_kwh,
        "ram_energy": 0.0,
        "energy_consumed": kwh,
        "water_consumed": kwh * (wue or 0.0),
        "country_name": None,
        "country_iso_code": None,
        "region": region,
        "cloud_provider": None,
        "cloud_region": None,
        **_machine(),
        "codecarbon_version": None,
        "cpu_model": None,
        "gpu_count": gpu_count,
        "gpu_model": " + ".join(gpus) or None,
        "longitude": None,
        "latitude": None,
        "ram_total_size": None,
        "tracking_mode": mode,
        "cpu_utilization_percent": None,
        "gpu_utilization_percent": None,
        "ram_utilization_percent": None,
        "ram_used_gb": None,
        "on_cloud": "N",
        "pue": pue,
        "wue": wue or 0.0,
    }


def _modeled_joules(plan: Plan, requests: float) -> tuple[float, float] | None:
    """(CPU J, accelerator J) the plan predicts for ``requests``, split by instance count."""
    e = plan.predicted.get("energy_j_per_request")
    if not isinstance(e, int | float) or not math.isfinite(e):
        return None
    cpu_share, _ = _split(plan)
    total = float(e) * requests
    return total * cpu_share, total * (1.0 - cpu_share)


def _wue(plan: Plan) -> float | None:
    """Water per kWh of facility energy the plan predicts (its water per request over its
    energy per request times PUE), as CodeCarbon's ``wue``; None when it predicts no water."""
    w, e = plan.predicted.get("water_l_per_request"), plan.predicted.get("energy_j_per_request")
    _, pue = plan_carbon(plan)
    if not isinstance(w, int | float) or not isinstance(e, int | float) or e <= 0:
        return None
    return float(w) / (float(e) * pue / _J_PER_KWH)


def verify_rows(store: Store, *, plan_id: int | None = None) -> list[dict[str, Any]]:
    """One row per verified run (``apply --verify``): the executors' measured energy when
    the run recorded it, else the plan's predicted energy per request times the requests
    served (``modeled``)."""
    where = "kind = ?"
    params: list[Any] = ["verify"]
    if plan_id is not None:
        where += " and plan_id = ?"
        params.append(plan_id)
    out = []
    plans: dict[int, Plan] = {}
    for r in store.rows(f"select * from runs where {where} order by id", params):
        if r["plan_id"] is None:
            continue
        plan = plans.get(r["plan_id"]) or store.get_plan(r["plan_id"])
        plans[r["plan_id"]] = plan
        measured = json.loads(r.get("measured") or "{}")
        duration = float(measured.get("duration_s") or 0.0)
        requests = float(measured.get("rate_rps") or 0.0) * duration
        energy = measured.get("energy") or {}
        intensity, pue = plan_carbon(plan)
        if energy.get("cpu_j") is not None or energy.get("gpu_j") is not None:
            cpu_j, gpu_j = float(energy.get("cpu_j") or 0.0), float(energy.get("gpu_j") or 0.0)
            mode = MODELED if MODELED in (energy.get("sources") or []) else MEASURED
            duration = float(energy.get("window_s") or duration)  # the counters' window
        else:
            joules = _modeled_joules(plan, requests)
            if joules is None:
                continue  # nothing to say: the plan predicts no energy
            cpu_j, gpu_j = joules
            mode = MODELED
        out.append(
            _row(
                timestamp=r["finished_at"] or r["started_at"],
                run_key=f"run:{r['id']}",
                plan=plan,
                duration_s=duration,
                cpu_j=cpu_j,
                gpu_j=gpu_j,
                intensity=intensity,
                pue=pue,
                wue=_wue(plan),
                region=plan.extra.get("carbon_region"),
                mode=mode,
                store_key=str(store.path),
            )
        )
    return out


def replan_rows(store: Store, *, plan_id: int | None = None) -> list[dict[str, Any]]:
    """One row per interval between consecutive replanning decisions of a lineage: the plan
    that served, at its predicted energy per request and the decision's forecast rate (else
    the plan's rate), at the decision's grid intensity (``modeled``)."""
    lineage = f"plan:{plan_id}" if plan_id is not None else None
    by_lineage: dict[str, list[dict[str, Any]]] = {}
    for d in decisions(store, lineage=lineage):
        by_lineage.setdefault(d["lineage"], []).append(d)
    out = []
    plans: dict[int, Plan] = {}
    for rows in by_lineage.values():
        for d, nxt in itertools.pairwise(rows):
            serving = d.get("new_plan_id") if d.get("applied") else d.get("running_plan_id")
            t0, t1 = d.get("at") or d["time"], nxt.get("at") or nxt["time"]
            if serving is None or d.get("signal_g_per_kwh") is None:
                continue
            seconds = (parse_time(t1) - parse_time(t0)).total_seconds()
            if seconds <= 0:
                continue
            plan = plans.get(int(serving)) or store.get_plan(int(serving))
            plans[int(serving)] = plan
            rate = d.get("forecast_rps") or plan.predicted.get("rate_rps") or 0.0
            requests = float(rate) * seconds
            joules = _modeled_joules(plan, requests)
            if joules is None:
                continue
            _, pue = plan_carbon(plan)
            out.append(
                _row(
                    timestamp=t1,
                    run_key=f"decision:{d['id']}",
                    plan=plan,
                    duration_s=seconds,
                    cpu_j=joules[0],
                    gpu_j=joules[1],
                    intensity=float(d["signal_g_per_kwh"]),
                    pue=pue,
                    wue=_wue(plan),
                    region=d.get("region"),
                    mode=MODELED,
                    store_key=str(store.path),
                )
            )
    return out


def emissions(
    store: Store,
    *,
    fmt: str = "codecarbon",
    path: str | None = None,
    plan_id: int | None = None,
) -> dict[str, Any]:
    """Write the emissions report (CodeCarbon's ``emissions.csv``) to ``path``, or return its
    text; with how many rows are measured and how many modeled.

    Raises:
        InputError: an unknown format.
    """
    if fmt not in EMISSIONS_FORMATS:
        raise InputError(
            f"--format '{fmt}' is unknown for report emissions",
            hint=f"use --format {' or '.join(EMISSIONS_FORMATS)}",
        )
    rows = verify_rows(store, plan_id=plan_id) + replan_rows(store, plan_id=plan_id)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CODECARBON_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r[k]) for k in CODECARBON_COLUMNS})
    modeled = sum(1 for r in rows if r["tracking_mode"] == MODELED)
    res: dict[str, Any] = {
        "report": "emissions",
        "format": fmt,
        "rows": len(rows),
        "modeled_rows": modeled,
        "measured_rows": len(rows) - modeled,
        "no_intensity_rows": sum(1 for r in rows if r["emissions"] is None),
    }
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(buf.getvalue())
        res["path"] = str(path)
    else:
        res["text"] = buf.getvalue()
    return res
