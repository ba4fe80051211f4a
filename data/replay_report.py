"""The files of a what-if replay (``greenctl replay -o DIR``): CSV, JSON and a chart.

- ``replay.json``: the whole result (``meta``, ``summary``, ``intervals`` per policy);
- ``summary.csv``: one row per policy (greenctl and each baseline);
- ``intervals.csv``: one row per interval and policy;
- ``replay.png``: load (actual peak and forecast), carbon intensity, each policy's
  configuration size (its budget units: cores, MIG compute slices, GPUs) with greenctl's
  changes marked, and SLO violations per interval, over time; for load routed across sites
  (``meta.layout`` ``sites``) the gateways' load, each site's carbon intensity, each policy's
  carbon per slot and the largest site's carbon so far over the per-site average (the equity
  the geo planner minimises). Every figure is modeled (the chart says so).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

COLOURS = {
    "greenctl": "tab:green",
    "base": "tab:red",
    "co2opt": "tab:orange",
    "vpa": "tab:blue",
    "infaas": "tab:purple",
    "infadapter": "tab:cyan",
    "msplus": "tab:brown",
    "offline": "tab:gray",
    "nearest": "tab:red",
    "glb-energy": "tab:orange",
}


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r.get(k) is None else r.get(k) for k in columns})


def write_replay(
    result: dict[str, Any],
    out_dir: str | Path,
    *,
    interval_columns: list[str],
    summary_columns: list[str],
    chart: bool = True,
) -> list[str]:
    """Write ``result`` (:func:`greenctl.executor.control.replay.replay`) into ``out_dir`` (created).

    Returns:
        The paths written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    (out / "replay.json").write_text(json.dumps(result, indent=1, default=_jsonable) + "\n")
    files.append(str(out / "replay.json"))
    _write_csv(out / "summary.csv", result["summary"], summary_columns)
    files.append(str(out / "summary.csv"))
    rows = [r for rs in result["intervals"].values() for r in rs]
    _write_csv(out / "intervals.csv", rows, interval_columns)
    files.append(str(out / "intervals.csv"))
    if chart:
        chart_replay(result, out / "replay.png")
        files.append(str(out / "replay.png"))
    return files


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def chart_replay(result: dict[str, Any], path: str | Path) -> str:
    """Load, carbon, configuration and violations over time, greenctl beside the baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    meta = result["meta"]
    if meta.get("layout") == "sites":
        return _chart_sites(result, path, plt)
    every_h = float(meta["every_s"]) / 3600.0
    runs = result["intervals"]
    g = runs["greenctl"]
    hours = [r["interval"] * every_h for r in g]
    hours.append(len(g) * every_h)  # the last interval drawn to its end

    def ys(rows: list[dict[str, Any]], f: Any) -> list[float]:
        out = [f(r) for r in rows]
        return out + out[-1:]

    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    ax0, ax1, ax2, ax3 = axes
    ax0.step(hours, ys(g, lambda r: r["peak_rps"]), where="post", color="black", lw=1.0,
             label="actual peak per interval")  # fmt: skip
    ax0.step(hours, ys(g, lambda r: r["forecast_rps"] or 0.0), where="post", color="tab:green",
             lw=1.0, alpha=0.8, label=f"forecast ({meta['forecaster']})")  # fmt: skip
    ax0.set_ylabel("req/s")
    ax0.set_title(
        f"What-if replay of {meta['family']} ({meta['kind']}): {meta['hours']:.1f} h at "
        f"{meta['every_s']} s intervals; all figures modeled"
        + (f" on {meta['label']}" if meta.get("label") else "")
    )
    ax0.legend(loc="upper left", fontsize=8)
    ax1.step(hours, ys(g, lambda r: r["carbon_g_per_kwh"]), where="post", color="black", lw=1.2)
    ax1.set_ylabel("gCO2/kWh")
    ax1.set_title(meta["carbon"], fontsize=9)
    for name, rows in runs.items():
        c = COLOURS.get(name)
        ax2.step(hours, ys(rows, lambda r: r["units"]), where="post", color=c, lw=1.2,
                 label=name)  # fmt: skip
        ax3.step(hours, ys(rows, lambda r: 100.0 * r["violation_frac"]), where="post", color=c,
                 lw=1.0, label=name)  # fmt: skip
    changes = [r["interval"] * every_h for r in g if r["action"] == "change"]
    for x in changes:
        ax2.axvline(x, color="tab:green", alpha=0.25, lw=0.8)
    ax2.set_ylabel(f"{meta.get('units', 'units')}\n(configuration)")
    ax2.legend(loc="upper left", fontsize=8, ncol=4)
    ax3.set_ylabel("SLO violations\n(% of requests)")
    ax3.set_xlabel(f"hours since {meta['start']}")
    ax3.legend(loc="upper left", fontsize=8, ncol=4)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)


def _chart_sites(result: dict[str, Any], path: str | Path, plt: Any) -> str:
    """A replay of load routed across sites (``meta.layout`` ``sites``, as a geo plan's):
    load, the sites' carbon, carbon per slot and the equity so far."""
    meta = result["meta"]
    step_h = float(meta["step_h"])
    runs = result["intervals"]
    g = runs["greenctl"]
    hours = [r["interval"] * step_h for r in g] + [len(g) * step_h]

    def ys(rows: list[dict[str, Any]], key: str, scale: float = 1.0) -> list[float]:
        out = [float("nan") if r[key] is None else float(r[key]) * scale for r in rows]
        return out + out[-1:]

    fig, axes = plt.subplots(4, 1, figsize=(11, 10), sharex=True)
    ax0, ax1, ax2, ax3 = axes
    ax0.step(hours, ys(g, "load_mw"), where="post", color="black", lw=1.0,
             label="the gateways' load")  # fmt: skip
    ax0.set_ylabel("MW")
    ax0.set_title(
        f"What-if replay of {meta['family']} ({meta['algorithm']} online step per "
        f"{meta['every_s'] / 3600:g} h): {meta['hours']:.0f} h; all figures modeled"
    )
    ax0.legend(loc="upper left", fontsize=8)
    for name, rows in runs.items():
        c = COLOURS.get(name)
        ax1.step(hours, ys(rows, "carbon_g_per_kwh"), where="post", color=c, lw=1.0, label=name)
        ax2.step(hours, ys(rows, "carbon_g", 1e-3), where="post", color=c, lw=1.0, label=name)
        ax3.step(hours, ys(rows, "carbon_max_over_avg"), where="post", color=c, lw=1.0,
                 label=name)  # fmt: skip
    ax1.set_ylabel("gCO2/kWh\n(load-weighted)")
    ax1.set_title("each policy's load-weighted carbon intensity of the sites it uses", fontsize=9)
    ax1.legend(loc="upper left", fontsize=8, ncol=4)
    ax2.set_ylabel("kg CO2 per slot")
    ax2.legend(loc="upper left", fontsize=8, ncol=4)
    ax3.set_ylabel("largest site's CO2\nover the average, so far")
    ax3.set_xlabel(f"hours since {meta['start']}")
    ax3.legend(loc="upper left", fontsize=8, ncol=4)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
