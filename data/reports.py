"""Report library: CSV/JSON exports, savings against a baseline plan, PNG charts.

No typer or rich here (``cli/report.py`` renders). Column names of the exports are a
contract documented in the README (section "Report columns"); add columns at the end, never
rename. Charts use matplotlib's Agg backend, imported lazily.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data import carbon
from greenctl.data.carbon_io import parse_time
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.plan import Plan

if TYPE_CHECKING:
    from greenctl.data.store import Store

EXPORTS = ("profiles", "plans", "runs", "decisions", "carbon")

COLUMNS: dict[str, list[str]] = {
    "profiles": [
        "id", "variant", "family", "resource", "batch", "hardware", "throughput_rps",
        "latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "power_w", "idle_power_w",
        "energy_j", "energy_method", "memory_mb", "capacity_rps", "capacity_slo_ms",
        "cost_per_hour", "samples", "source", "created_at",
    ],
    "plans": [
        "id", "kind", "created_at", "source", "objective", "objective_name", "strategy",
        "rate_rps", "accuracy", "p95_ms", "p99_ms", "cost_per_hour", "energy_j_per_request",
        "carbon_g_per_request", "carbon_intensity_g_per_kwh", "water_l_per_request",
        "instances", "deployments",
    ],
    "runs": [
        "id", "plan_id", "kind", "started_at", "finished_at", "predicted_rate_rps",
        "measured_rate_rps", "predicted_p95_ms", "measured_p95_ms", "p95_error_pct",
        "measured_p50_ms", "measured_p99_ms", "errors", "rejected_503", "notes",
    ],
    "decisions": [
        "id", "time", "at", "lineage", "region", "signal_g_per_kwh", "reference_g_per_kwh",
        "signal_change", "forecaster", "forecast_rps", "running_plan_id", "new_plan_id",
        "old_objective", "new_objective", "improvement", "action", "applied", "reason",
    ],
    "carbon": ["time", "region", "carbon_g_per_kwh", "kind", "source"],
}  # fmt: skip


# -- exports ----------------------------------------------------------------------------------
def deployments_label(plan: Plan) -> str:
    """``resnet18@cpu:2x3 + resnet50@cpu:4x1`` (variant@resource x count)."""
    return " + ".join(f"{d.variant}@{d.resource}x{d.count}" for d in plan.deployments) or "-"


def _plan_row(store: Store, plan_id: int, source: str) -> dict[str, Any]:
    plan = store.get_plan(plan_id)
    p = plan.predicted
    return {
        "id": plan_id,
        "kind": plan.kind,
        "created_at": plan.created_at,
        "source": source,
        "objective": p.get("objective"),
        "objective_name": p.get("objective_name") or plan.request.get("objective"),
        "strategy": plan.request.get("strategy") or plan.extra.get("strategy"),
        "rate_rps": p.get("rate_rps"),
        "accuracy": p.get("accuracy"),
        "p95_ms": p.get("p95_ms"),
        "p99_ms": p.get("p99_ms"),
        "cost_per_hour": p.get("cost_per_hour"),
        "energy_j_per_request": p.get("energy_j_per_request"),
        "carbon_g_per_request": p.get("carbon_g_per_request"),
        "carbon_intensity_g_per_kwh": p.get("carbon_intensity_g_per_kwh")
        or plan.request.get("carbon_intensity"),
        "water_l_per_request": p.get("water_l_per_request"),
        "instances": sum(d.count for d in plan.deployments),
        "deployments": deployments_label(plan),
    }


def _run_row(r: dict[str, Any]) -> dict[str, Any]:
    pred = json.loads(r.get("predicted") or "{}")
    meas = json.loads(r.get("measured") or "{}")
    pp95, mp95 = pred.get("p95_ms"), meas.get("p95_ms")
    err = None
    if isinstance(pp95, int | float) and pp95 > 0 and isinstance(mp95, int | float):
        err = (mp95 - pp95) / pp95 * 100
    return {
        "id": r["id"],
        "plan_id": r["plan_id"],
        "kind": r["kind"],
        "started_at": r["started_at"],
        "finished_at": r["finished_at"],
        "predicted_rate_rps": pred.get("rate_rps"),
        "measured_rate_rps": meas.get("rate_rps"),
        "predicted_p95_ms": pp95,
        "measured_p95_ms": mp95,
        "p95_error_pct": err,
        "measured_p50_ms": meas.get("p50_ms"),
        "measured_p99_ms": meas.get("p99_ms"),
        "errors": meas.get("errors"),
        "rejected_503": meas.get("rejected_503"),
        "notes": r.get("notes"),
    }


def export_rows(
    store: Store,
    what: str,
    *,
    region: str | None = None,
    start: str | None = None,
    end: str | None = None,
    plan_id: int | None = None,
) -> list[dict[str, Any]]:
    """Rows of one export with exactly the columns of :data:`COLUMNS` ``[what]``.

    Raises:
        InputError: unknown export.
    """
    if what not in EXPORTS:
        raise InputError(f"unknown report '{what}'", hint=f"use one of {', '.join(EXPORTS)}")
    cols = COLUMNS[what]
    rows: list[dict[str, Any]]
    if what == "profiles":
        rows = store.rows(
            "select p.*, v.family from profiles p left join variants v on v.name = p.variant "
            "order by p.variant, p.resource, p.batch, p.id"
        )
    elif what == "plans":
        rows = [_plan_row(store, r["id"], r["source"]) for r in reversed(store.plans())]
        if plan_id is not None:
            rows = [r for r in rows if r["id"] == plan_id]
    elif what == "runs":
        where, params = ("where plan_id = ?", [plan_id]) if plan_id is not None else ("", [])
        rows = [_run_row(r) for r in store.rows(f"select * from runs {where} order by id", params)]
    elif what == "decisions":
        lineage = f"plan:{plan_id}" if plan_id is not None else None
        rows = decisions(store, lineage=lineage, region=region, start=start, end=end)
    else:
        regions = [region] if region else sorted({r["region"] for r in carbon.regions(store)})
        rows = []
        for reg in regions:
            rows.extend(carbon.series(store, reg, start=start, end=end))
    return [{c: r.get(c) for c in cols} for r in rows]


def decisions(
    store: Store,
    *,
    lineage: str | None = None,
    region: str | None = None,
    start: str | None = None,
    end: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Replanning decision records, oldest first."""
    clauses, params = [], []
    if lineage:
        clauses.append("lineage = ?")
        params.append(lineage)
    if region:
        clauses.append("region = ?")
        params.append(region)
    if start:
        clauses.append("coalesce(at, time) >= ?")
        params.append(start)
    if end:
        clauses.append("coalesce(at, time) <= ?")
        params.append(end)
    where = ("where " + " and ".join(clauses)) if clauses else ""
    rows = store.rows(f"select * from decisions {where} order by id", params)
    if limit is not None:
        rows = rows[-limit:]
    for r in rows:
        r["applied"] = bool(r.get("applied"))
    return rows


def write_rows(rows: list[dict[str, Any]], columns: list[str], fmt: str, out: Any) -> None:
    """Write rows as CSV (header = ``columns``) or a JSON list to a text stream."""
    if fmt == "csv":
        w = csv.DictWriter(out, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    elif fmt == "json":
        out.write(json.dumps(rows, indent=2, default=str) + "\n")
    else:
        raise InputError(f"--format '{fmt}' is unknown", hint="use csv or json")


def export(
    store: Store, what: str, *, fmt: str = "csv", path: str | None = None, **filters: Any
) -> dict[str, Any]:
    """Export one report to ``path`` (or return its text when ``path`` is None)."""
    rows = export_rows(store, what, **filters)
    buf = io.StringIO()
    write_rows(rows, COLUMNS[what], fmt, buf)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(buf.getvalue())
        return {"report": what, "format": fmt, "rows": len(rows), "path": str(path)}
    return {"report": what, "format": fmt, "rows": len(rows), "text": buf.getvalue()}


# -- savings ----------------------------------------------------------------------------------
@dataclass
class _Interval:
    start: str
    hours: float
    intensity: float
    plan_id: int


def plan_timeline(store: Store, plan_id: int) -> list[tuple[str | None, int]]:
    """``[(from_time, plan_id), ...]``: the plan and every plan replanning applied after it
    (decisions of lineage ``plan:ID`` with action ``apply``); first entry's time is None."""
    out: list[tuple[str | None, int]] = [(None, plan_id)]
    for d in decisions(store, lineage=f"plan:{plan_id}"):
        if d["action"] == "apply" and d.get("applied") and d.get("new_plan_id"):
            out.append((d.get("at") or d["time"], int(d["new_plan_id"])))
    return out


def _active(timeline: list[tuple[str | None, int]], t: str) -> int:
    pid = timeline[0][1]
    for when, p in timeline[1:]:
        if when is not None and when <= t:
            pid = p
    return pid


def _plan_metrics(plan: Plan, *, wue_l_per_kwh: float | None) -> dict[str, Any]:
    p = plan.predicted
    pct = plan.request.get("percentile") or "p95"
    lat = p.get(f"{pct}_ms", p.get("p95_ms"))
    slos = [f.get("slo_ms") for f in plan.request.get("families") or [] if f.get("slo_ms")]
    slo = min(slos) if slos else plan.request.get("slo_ms")
    pue = float(plan.request.get("pue") or 1.0)
    e = p.get("energy_j_per_request")
    water = p.get("water_l_per_request")
    if water is None and wue_l_per_kwh is not None and e is not None:
        water = float(e) * pue / 3.6e6 * wue_l_per_kwh
    return {
        "energy_j_per_request": None if e is None else float(e),
        "accuracy": p.get("accuracy"),
        "cost_per_hour": p.get("cost_per_hour"),
        "latency_ms": lat,
        "slo_ms": slo,
        "pue": pue,
        "water_l_per_request": water,
        "rate_rps": p.get("rate_rps"),
    }


def savings(
    store: Store,
    *,
    plan_id: int,
    baseline_id: int,
    region: str,
    start: str | None = None,
    end: str | None = None,
    rate_rps: float | None = None,
    wue_l_per_kwh: float | None = None,
) -> dict[str, Any]:
    """Energy, carbon, water, cost, accuracy and SLO compliance of greenctl's plans (the
    plan and the plans replanning applied after it) against a baseline plan held constant,
    over the carbon trace of ``region`` between ``start`` and ``end``.

    Both serve the same load: ``rate_rps``, else the active plan's predicted rate. All
    figures are modeled from the plans' predictions and the carbon signal.

    Raises:
        NotFoundError: unknown plan or no carbon signal in the period.
    """
    timeline = plan_timeline(store, plan_id)
    plans = {pid: store.get_plan(pid) for _, pid in timeline}
    base = store.get_plan(baseline_id)
    series = carbon.series(store, region, start=start, end=end)
    if len(series) < 1:
        raise NotFoundError(f"no carbon signal for {region} between {start} and {end}")
    # Intervals between consecutive signal points; the last lasts as long as the one before.
    times = [parse_time(r["time"]) for r in series]
    intervals = []
    for i, r in enumerate(series):
        if i + 1 < len(series):
            h = (times[i + 1] - times[i]).total_seconds() / 3600
        elif i > 0:
            h = (times[i] - times[i - 1]).total_seconds() / 3600
        else:
            h = 1.0
        if h <= 0:
            continue
        intervals.append(
            _Interval(r["time"], h, float(r["carbon_g_per_kwh"]), _active(timeline, r["time"]))
        )
    metrics = {pid: _plan_metrics(p, wue_l_per_kwh=wue_l_per_kwh) for pid, p in plans.items()}
    bm = _plan_metrics(base, wue_l_per_kwh=wue_l_per_kwh)
    totals = {"greenctl": _zero(), "baseline": _zero()}
    per_interval = []
    for iv in intervals:
        m = metrics[iv.plan_id]
        rate = rate_rps if rate_rps is not None else float(m["rate_rps"] or bm["rate_rps"] or 0.0)
        row = {
            "time": iv.start,
            "hours": iv.hours,
            "carbon_g_per_kwh": iv.intensity,
            "plan_id": iv.plan_id,
            "rate_rps": rate,
        }
        for side, mm in (("greenctl", m), ("baseline", bm)):
            acc = _accumulate(totals[side], mm, rate=rate, hours=iv.hours, ci=iv.intensity)
            row[f"{side}_carbon_g_per_request"] = acc
        per_interval.append(row)
    summary = {side: _finish(t) for side, t in totals.items()}
    saved: dict[str, Any] = {}
    saved_pct: dict[str, Any] = {}
    for key in ("energy_kwh", "carbon_kg", "water_l", "cost"):
        g, b = summary["greenctl"][key], summary["baseline"][key]
        saved[key] = None if g is None or b is None else b - g
        saved_pct[key] = None if g is None or b is None or b == 0 else (b - g) / b * 100
    ga, ba = summary["greenctl"]["accuracy"], summary["baseline"]["accuracy"]
    saved["accuracy_change"] = None if ga is None or ba is None else ga - ba
    gs, bs = summary["greenctl"]["slo_compliance"], summary["baseline"]["slo_compliance"]
    saved["slo_compliance_change"] = None if gs is None or bs is None else gs - bs
    hours = sum(iv.hours for iv in intervals)
    end_t = times[-1] + timedelta(hours=intervals[-1].hours if intervals else 0)
    return {
        "region": region,
        "period": {
            "from": series[0]["time"],
            "to": end_t.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "hours": hours,
        },
        "plan_id": plan_id,
        "baseline_id": baseline_id,
        "plans_used": sorted({iv.plan_id for iv in intervals}),
        "changes": len(timeline) - 1,
        "greenctl": summary["greenctl"],
        "baseline": summary["baseline"],
        "savings": saved,
        "savings_pct": saved_pct,
        "measured_slo": _measured_slo(store, [*plans, baseline_id]),
        "intervals": per_interval,
        "method": "modeled: energy = predicted energy per request x rate x time; carbon = "
        "energy x PUE x grid intensity of the interval; cost = cost_per_hour x time; SLO "
        "compliance = share of time the active plan's predicted latency meets its SLO",
    }


def _zero() -> dict[str, Any]:
    return {
        "energy_kwh": 0.0,
        "carbon_kg": 0.0,
        "water_l": 0.0,
        "cost": 0.0,
        "requests": 0.0,
        "acc_weighted": 0.0,
        "slo_hours": 0.0,
        "hours": 0.0,
        "missing": set(),
    }


def _accumulate(
    t: dict[str, Any], m: dict[str, Any], *, rate: float, hours: float, ci: float
) -> float | None:
    reqs = rate * hours * 3600
    t["requests"] += reqs
    t["hours"] += hours
    e = m["energy_j_per_request"]
    cpr = None
    if e is None:
        t["missing"].update({"energy_kwh", "carbon_kg"})
    else:
        kwh = e * reqs / 3.6e6
        t["energy_kwh"] += kwh
        t["carbon_kg"] += kwh * m["pue"] * ci / 1000
        cpr = e * m["pue"] * ci / 3.6e6
    if m["water_l_per_request"] is None:
        t["missing"].add("water_l")
    else:
        t["water_l"] += m["water_l_per_request"] * reqs
    if m["cost_per_hour"] is None:
        t["missing"].add("cost")
    else:
        t["cost"] += float(m["cost_per_hour"]) * hours
    if m["accuracy"] is None:
        t["missing"].add("accuracy")
    else:
        t["acc_weighted"] += float(m["accuracy"]) * reqs
    lat, slo = m["latency_ms"], m["slo_ms"]
    if lat is None or slo is None:
        t["missing"].add("slo_compliance")
    elif float(lat) <= float(slo):
        t["slo_hours"] += hours
    return cpr


def _finish(t: dict[str, Any]) -> dict[str, Any]:
    out = {
        "energy_kwh": t["energy_kwh"],
        "carbon_kg": t["carbon_kg"],
        "water_l": t["water_l"],
        "cost": t["cost"],
        "requests": t["requests"],
        "accuracy": t["acc_weighted"] / t["requests"] if t["requests"] else None,
        "slo_compliance": t["slo_hours"] / t["hours"] if t["hours"] else None,
    }
    for key in t["missing"]:
        out[key] = None
    return out


def meets_slo(measured: dict[str, Any], slo_ms: float | None) -> bool | None:
    """Whether a verified run met its SLO: its p95 within ``slo_ms`` and every request
    answered (errors and 503 refusals miss the SLO, which the answered ones' p95 does not
    show); None without an SLO or a measured p95."""
    p95 = measured.get("p95_ms")
    if slo_ms is None or not isinstance(p95, int | float):
        return None
    unanswered = int(measured.get("errors") or 0) + int(measured.get("rejected_503") or 0)
    return p95 <= slo_ms and unanswered == 0


def _measured_slo(store: Store, plan_ids: list[int]) -> list[dict[str, Any]]:
    out = []
    for pid in sorted(set(plan_ids)):
        plan = store.get_plan(pid)
        slo = _plan_metrics(plan, wue_l_per_kwh=None)["slo_ms"]
        for r in export_rows(store, "runs", plan_id=pid):
            if r["measured_p95_ms"] is None:
                continue
            out.append(
                {
                    "plan_id": pid,
                    "run_id": r["id"],
                    "slo_ms": slo,
                    "measured_p95_ms": r["measured_p95_ms"],
                    "meets_slo": meets_slo(
                        {
                            "p95_ms": r["measured_p95_ms"],
                            "errors": r["errors"],
                            "rejected_503": r["rejected_503"],
                        },
                        slo,
                    ),
                }
            )
    return out


SAVINGS_ROWS = [
    ("energy_kwh", "energy (kWh)"),
    ("carbon_kg", "carbon (kg CO2)"),
    ("water_l", "water (L)"),
    ("cost", "cost (per-hour units x h)"),
    ("accuracy", "accuracy (request-weighted)"),
    ("slo_compliance", "SLO compliance (share of time)"),
]


def savings_table(s: dict[str, Any]) -> list[list[Any]]:
    """Rows ``[metric, greenctl, baseline, saving, saving %]`` for rendering."""
    rows = []
    for key, label in SAVINGS_ROWS:
        g, b = s["greenctl"].get(key), s["baseline"].get(key)
        if key == "accuracy":
            rows.append([label, g, b, s["savings"]["accuracy_change"], None])
        elif key == "slo_compliance":
            rows.append([label, g, b, s["savings"]["slo_compliance_change"], None])
        else:
            rows.append([label, g, b, s["savings"][key], s["savings_pct"][key]])
    measured = s.get("measured_slo") or []
    if measured:
        ok = sum(1 for m in measured if m["meets_slo"])
        rows.append(
            ["verified runs within the SLO (measured)", f"{ok}/{len(measured)}", None, None, None]
        )
    return rows


# -- charts -----------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass(frozen=True)
class _CarbonRun:
    """What the carbon chart draws: the signal's steps and the plan active at each."""

    hours: list[float]  # each signal value's start, hours since the first
    step: float  # the signal's step, hours
    ci: list[float]  # gCO2/kWh
    active: list[int]  # the plan id serving at each step
    plans: dict[int, Plan]
    config_of: dict[int, str]  # plan id -> its deployments
    configs: list[str]  # the configurations in the order they first served

    @property
    def edges(self) -> list[float]:
        """Step edges: the last step extended to the end of its interval."""
        return [*self.hours, self.hours[-1] + self.step]


def _ext(values: list[float]) -> list[float]:
    return [*values, values[-1]]


def _carbon_mg_per_request(plan: Plan, intensity: float) -> float:
    """A plan's modeled carbon per request at ``intensity`` gCO2/kWh, in mg."""
    e = plan.predicted.get("energy_j_per_request")
    pue = float(plan.request.get("pue") or 1.0)
    return math.nan if e is None else float(e) * pue * intensity / 3.6e6 * 1000


def chart_carbon(
    store: Store,
    path: str | Path,
    *,
    plan_id: int,
    region: str,
    baseline_id: int | None = None,
    start: str | None = None,
    end: str | None = None,
) -> dict[str, Any]:
    """Clover-style chart: grid carbon intensity over time with the configuration greenctl
    ran (shaded bands) and its carbon per request (and the baseline's), plus accuracy."""
    plt = _pyplot()
    series = carbon.series(store, region, start=start, end=end)
    timeline = plan_timeline(store, plan_id)
    plans = {pid: store.get_plan(pid) for _, pid in timeline}
    base = store.get_plan(baseline_id) if baseline_id is not None else None
    t0 = parse_time(series[0]["time"])
    hours = [(parse_time(r["time"]) - t0).total_seconds() / 3600 for r in series]
    active = [_active(timeline, r["time"]) for r in series]
    # one colour per configuration (a replan back to an earlier configuration reuses it)
    config_of = {pid: deployments_label(plans[pid]) for pid in set(active)}
    run = _CarbonRun(
        hours=hours,
        step=hours[1] - hours[0] if len(hours) > 1 else 1.0,
        ci=[float(r["carbon_g_per_kwh"]) for r in series],
        active=active,
        plans=plans,
        config_of=config_of,
        configs=list(dict.fromkeys(config_of[pid] for pid in active)),
    )
    fig, axes = plt.subplots(
        3, 1, figsize=(10, 8.2), sharex=True, gridspec_kw={"height_ratios": [3, 2.2, 1.6]}
    )
    _draw_intensity(plt, axes, run, region=region)
    _draw_per_request(axes[1], axes[2], run, base=base, baseline_id=baseline_id)
    axes[2].set_xlabel(f"hours since {series[0]['time']}")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.set_xlim(hours[0], hours[-1] + run.step)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    order = list(dict.fromkeys(active))
    return {"chart": "carbon", "path": str(path), "points": len(series), "plans": order}


def _draw_intensity(plt: Any, axes: Any, run: _CarbonRun, *, region: str) -> None:
    """Shade every panel by the configuration serving, and draw the signal on the first
    with a legend naming each configuration and its plans."""
    colours = plt.get_cmap("tab10")
    for i, pid in enumerate(run.active):
        c = colours(run.configs.index(run.config_of[pid]) % 10)
        for ax in axes:
            ax.axvspan(run.hours[i], run.hours[i] + run.step, color=c, alpha=0.12, lw=0)
    ax0 = axes[0]
    ax0.step(
        run.edges, _ext(run.ci), where="post", color="black", lw=1.6,
        label="grid carbon intensity",
    )  # fmt: skip
    ax0.set_ylabel("gCO2/kWh")
    ax0.set_title(f"Carbon intensity ({region}) and the configuration greenctl ran")
    handles = [
        plt.Rectangle((0, 0), 1, 1, color=colours(k % 10), alpha=0.35)
        for k in range(len(run.configs))
    ]
    labels = []
    for cfg in run.configs:
        pids = sorted({pid for pid in run.active if run.config_of[pid] == cfg})
        word = "plan" if len(pids) == 1 else "plans"
        labels.append(f"{_short(cfg)} ({word} {', '.join(map(str, pids))})")
    ax0.legend(
        [ax0.lines[0], *handles],
        ["grid carbon intensity", *labels],
        loc="upper left",
        fontsize=7.5,
        framealpha=0.9,
    )


def _draw_per_request(
    ax1: Any, ax2: Any, run: _CarbonRun, *, base: Plan | None, baseline_id: int | None
) -> None:
    """Carbon per request (modeled) and accuracy of greenctl's plans, and the baseline's."""
    hx = run.edges
    g = [
        _carbon_mg_per_request(run.plans[pid], x) for pid, x in zip(run.active, run.ci, strict=True)
    ]
    ax1.step(hx, _ext(g), where="post", color="tab:green", lw=1.8, label="greenctl")
    if base is not None:
        b = [_carbon_mg_per_request(base, x) for x in run.ci]
        ax1.step(
            hx,
            _ext(b),
            where="post",
            color="tab:red",
            lw=1.4,
            ls="--",
            label=f"baseline (plan {baseline_id}: {_short(deployments_label(base))})",
        )
    ax1.set_ylabel("mgCO2 / request\n(modeled)")
    ax1.legend(loc="upper left", fontsize=7.5)
    acc = [run.plans[pid].predicted.get("accuracy") or math.nan for pid in run.active]
    ax2.step(hx, _ext(acc), where="post", color="tab:blue", lw=1.8, label="greenctl")
    if base is not None:
        ax2.axhline(
            base.predicted.get("accuracy") or math.nan,
            color="tab:red",
            ls="--",
            lw=1.4,
            label="baseline",
        )
    ax2.set_ylabel("accuracy")
    ax2.legend(loc="lower left", fontsize=7.5)


def _short(text: str, n: int = 70) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def chart_latency(
    store: Store, path: str | Path, *, plan_ids: list[int] | None = None
) -> dict[str, Any]:
    """Predicted versus measured p95 latency of every measured run (bars + ratio)."""
    plt = _pyplot()
    rows = [
        r
        for r in export_rows(store, "runs")
        if r["predicted_p95_ms"] is not None and r["measured_p95_ms"] is not None
    ]
    if plan_ids:
        rows = [r for r in rows if r["plan_id"] in plan_ids]
    if not rows:
        raise NotFoundError(
            "no run with predicted and measured p95 latency",
            hint="run `greenctl apply PLAN --verify` first",
        )
    fig, ax = plt.subplots(figsize=(max(7.5, 1.2 * len(rows) + 3), 4.8))
    xs = list(range(len(rows)))
    pred = [r["predicted_p95_ms"] for r in rows]
    meas = [r["measured_p95_ms"] for r in rows]
    ax.bar(
        [x - 0.2 for x in xs], pred, width=0.4, label="predicted p95 (modeled)", color="tab:gray"
    )
    ax.bar([x + 0.2 for x in xs], meas, width=0.4, label="measured p95", color="tab:orange")
    for x, p, m in zip(xs, pred, meas, strict=True):
        if p:
            ax.annotate(
                f"{(m - p) / p * 100:+.0f}%", (x + 0.2, m), ha="center", va="bottom", fontsize=8
            )
    slo_label = "SLO"
    for x, r in zip(xs, rows, strict=True):
        slo = _plan_metrics(store.get_plan(r["plan_id"]), wue_l_per_kwh=None)["slo_ms"]
        if slo:
            ax.hlines(
                slo, x - 0.45, x + 0.45, colors="black", linestyles="--", lw=1.2, label=slo_label
            )
            slo_label = "_nolegend_"
    ax.set_xticks(xs, [f"plan {r['plan_id']}\nrun {r['id']}" for r in rows], fontsize=8)
    ax.set_ylabel("p95 latency (ms)")
    ax.set_title(
        "Predicted vs measured p95 latency of verified runs\n"
        "(label: measured error against the prediction)",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"chart": "latency", "path": str(path), "runs": len(rows)}


def chart_sites(store: Store, path: str | Path, *, plan_id: int) -> dict[str, Any]:
    """Per-site carbon and water of a plan that routes load across sites (its ``extra.sites``,
    as a geo plan records them; and of the other algorithms it compared)."""
    plt = _pyplot()
    plan = store.get_plan(plan_id)
    sites = plan.extra.get("sites")
    if not isinstance(sites, list) or not sites or not all(isinstance(s, dict) for s in sites):
        raise InputError(
            f"plan {plan_id} is a {plan.kind} plan, not a geo plan with sites",
            hint="the sites chart draws a plan that routes load across sites (extra.sites)",
        )
    blocks = plan.extra.get("algorithms") or {plan.extra.get("algorithm", "plan"): {"sites": sites}}
    names = [s["site"] for s in sites]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(names) + 3), 7), sharex=True)
    width = 0.8 / max(len(blocks), 1)
    for k, (algo, block) in enumerate(blocks.items()):
        by_site = {s["site"]: s for s in block["sites"]}
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(names))]
        axes[0].bar(xs, [by_site[n]["carbon_kg"] for n in names], width=width, label=algo)
        axes[1].bar(xs, [by_site[n]["water_l"] for n in names], width=width, label=algo)
    axes[0].set_ylabel("carbon (kg CO2)")
    axes[1].set_ylabel("water (L)")
    axes[0].set_title(f"Per-site carbon and water of {plan.kind} plan {plan_id} (modeled)")
    axes[1].set_xticks(range(len(names)), names, rotation=30, ha="right")
    axes[0].legend(fontsize=8, ncol=min(len(blocks), 4))
    for ax in axes:
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"chart": "sites", "path": str(path), "sites": len(names)}
