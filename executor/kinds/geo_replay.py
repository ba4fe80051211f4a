"""The replay step of a geo plan (``greenctl replay geo``).

The sites and demand files are the traces. Each slot takes eGLB's online step
(:func:`greenctl.planner.geo.solve.online_replan`, warm-started from the slot before, as
``replan`` of a routed geo plan does; offline plans replay as their online twin ``eglb``);
with ``every`` longer than a slot the slots between keep the last fractions (load over a
site's capacity is not served). Baselines (:data:`GEO_BASELINES`): ``offline`` (the
whole-window optimum, an oracle), ``nearest`` and ``glb-energy`` (carbon-unaware). Per slot:
load, energy, cost, carbon, water and the equity figures (the largest site's carbon and
water so far, and their ratio to the per-site average). Every figure is modeled, and
labelled so.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from greenctl.data.carbon_io import normalise_time
from greenctl.data.errors import InputError
from greenctl.executor.kinds.geo import geo_inputs
from greenctl.executor.kinds.replaying import ReplayInputs, ReplayLoop, ReplayStep
from greenctl.planner.geo import solve as geo

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: a geo replay's baselines, and those it runs unless told
BASELINES = ("offline", "nearest", "glb-energy")
DEFAULT_BASELINES = ("offline", "nearest")
#: a slot's routing "changes" when some site's share of the load moves more than this
GEO_SHARE_MOVE = 0.01

GEO_INTERVAL_COLUMNS = (
    "policy",
    "interval",
    "time",
    "offset_s",
    "load_mw",
    "carbon_g_per_kwh",
    "action",
    "config",
    "units",
    "unserved_mwh",
    "energy_kwh",
    "cost_usd",
    "carbon_g",
    "water_l",
    "carbon_kg_max_site",
    "carbon_max_over_avg",
    "water_l_max_site",
    "water_max_over_avg",
    "objective_usd",
)
GEO_SUMMARY_COLUMNS = (
    "policy",
    "load_mwh",
    "unserved_mwh",
    "energy_kwh",
    "cost_usd",
    "carbon_g",
    "water_l",
    "carbon_kg_max_site",
    "carbon_max_over_avg",
    "water_l_max_site",
    "water_max_over_avg",
    "objective_usd",
    "changes",
    "mean_units",
)
GEO_MODELED = (
    "modeled: the sites' price, carbon and water traces and the gateways' load (the geo "
    "planner's accounting: energy cost, carbon, water per site)"
)


def geo_slice(problem: Any, a: int, b: int) -> Any:
    """``problem`` cut to its steps ``a .. b - 1``."""
    return replace(
        problem,
        times=list(problem.times[a:b]),
        price_usd_per_mwh=problem.price_usd_per_mwh[a:b],
        carbon_g_per_kwh=problem.carbon_g_per_kwh[a:b],
        wue_l_per_kwh=problem.wue_l_per_kwh[a:b],
        ewif_l_per_kwh=problem.ewif_l_per_kwh[a:b],
        pue=problem.pue[a:b],
        capacity_mw=problem.capacity_mw[a:b],
        load_mw=problem.load_mw[a:b],
        demand_lines=list(problem.demand_lines[a:b]) if problem.demand_lines else [],
    )


def geo_window(
    problem: Any, loop: ReplayLoop, start: str | None, hours: float | None
) -> tuple[int, int, int]:
    """(first slot, slots, slots per replan) of ``--from`` (``start``), ``--hours`` and
    ``--every`` on the files' steps."""
    step_s = problem.step_h * 3600.0
    T = problem.n_steps
    every_s = loop.every_s
    offset_s, at = loop.start()
    notes = loop.notes
    if at is not None:
        times = [normalise_time(t) for t in problem.times]
        first = next((i for i, t in enumerate(times) if t >= at), None)
        if first is None or (first == 0 and at < times[0]):
            raise InputError(
                f"--from {start} is outside the sites and demand files ({problem.times[0]} .. "
                f"{problem.times[-1]})",
                hint="start within them",
            )
        if times[first] != at:
            raise InputError(
                f"--from {start} is not a step of the files (the next is {problem.times[first]})",
                hint=f"start on a step ({problem.step_h:g} h apart)",
            )
    else:
        first = round(offset_s / step_s)
        if abs(first * step_s - offset_s) > 1e-6:
            raise InputError(
                f"--from {start} does not fall on a step of the files ({problem.step_h:g} h)",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
    if first >= T:
        raise InputError(
            f"--from {start} is past the end of the files ({T} steps of {problem.step_h:g} h)",
            hint="start within them",
        )
    left = T - first
    if hours is None:
        slots = left
    else:
        if not (math.isfinite(hours) and hours > 0):
            raise InputError(f"--hours must be a number > 0, got {hours:g}")
        slots = round(hours * 3600.0 / step_s)
        if slots < 1 or abs(slots * step_s - hours * 3600.0) > 1e-6:
            raise InputError(
                f"--hours {hours:g} is not a whole number of the files' {problem.step_h:g} h steps",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
        if slots > left:
            raise InputError(
                f"--hours {hours:g} goes beyond the files: {left * problem.step_h:g} h are left "
                f"after --from {start or '0'}",
                hint=f"use --hours {left * problem.step_h:g} or less, or start earlier",
            )
    if every_s <= step_s:
        if every_s < step_s:
            notes.append(
                f"--every {every_s} s is finer than the files' {problem.step_h:g} h steps: "
                "one online step per slot"
            )
        per = 1
    else:
        per = round(every_s / step_s)
        if abs(per * step_s - every_s) > 1e-6:
            raise InputError(
                f"--every {every_s} s is not a whole number of the files' {problem.step_h:g} h "
                "steps",
                hint=f"use a multiple of {problem.step_h:g} h",
            )
    return first, slots, per


def count(n: int, what: str) -> str:
    return f"{n} {what}" + ("" if n == 1 else "s")


def site_shares(y: np.ndarray) -> np.ndarray:
    total = float(y.sum())
    return y / total if total > 0 else np.zeros_like(y)


def replay_geo(store: Store, inputs: ReplayInputs, loop: ReplayLoop) -> dict[str, Any]:
    """Replay eGLB's online step over a geo plan's files, beside the offline optimum and
    carbon-unaware routing (module docstring)."""
    opts = inputs.options
    ignored = [
        name
        for name, given in (
            ("--load-trace", opts.load_trace),
            ("--region", opts.region),
            ("--carbon-trace", opts.carbon_trace),
        )
        if given is not None
    ]
    if ignored:
        raise InputError(
            f"a geo replay reads its load and carbon from the sites and demand files; "
            f"{ignored[0]} does not apply",
            hint="drop it; pass --sites and --demand (or --plan ID of a geo plan)",
        )
    started = time.perf_counter()
    problem, options, variants = geo_inputs(store, dict(inputs.request))
    algorithm = str(options.get("algorithm") or "eglb-off")
    online = algorithm if algorithm in geo.ONLINE_ALGORITHMS else "eglb"
    if online != algorithm:
        loop.notes.append(
            f"the plan's algorithm {algorithm} has no online step: greenctl replays eglb (eGLB's "
            "online dual mirror descent); the offline optimum is the baseline 'offline'"
        )
    geo_opts = geo.check_options(**{**options, "algorithm": online, "variants": variants})
    first, slots, per = geo_window(problem, loop, opts.start, opts.hours)
    sub = geo_slice(problem, first, first + slots)
    y_g, unserved, actions, online_stats = online_policy(sub, online, geo_opts, per, opts.progress)
    policies: dict[str, tuple[np.ndarray, np.ndarray, list[str]]] = {
        "greenctl": (y_g, unserved, actions)
    }
    greenctl_s = time.perf_counter() - started
    solve_s: dict[str, float] = {"greenctl": online_stats["decide_s"]}
    for name in inputs.baselines:
        alg = "eglb-off" if name == "offline" else name
        try:
            sol = geo.solve(sub, alg, geo_opts)
        except InputError as exc:
            loop.notes.append(f"{name}: left out ({exc.message})")
            continue
        solve_s[name] = sol.solve_s
        policies[name] = (
            np.asarray(sol.site_load_mw, dtype=float),
            np.zeros(slots),
            ["start"] + ["plan"] * (slots - 1),
        )
    rows: dict[str, list[dict[str, Any]]] = {}
    summary = []
    for name, (y, unserved_t, acts) in policies.items():
        rows[name] = geo_rows(sub, name, y, unserved_t, acts, geo_opts)
        summary.append(geo_summary(sub, name, y, unserved_t, rows[name], geo_opts))
        summary[-1]["solve_s"] = solve_s.get(name)
    meta = {
        "kind": "geo",
        "family": f"geo: {count(len(sub.gateways), 'gateway')} over {count(len(sub.sites), 'site')}",
        "sites": list(sub.sites),
        "gateways": list(sub.gateways),
        "inputs": dict(sub.sources.items()),
        "algorithm": online,
        "plan_algorithm": algorithm,
        "from_offset_s": first * problem.step_h * 3600.0,
        "start": sub.times[0],
        "hours": slots * sub.step_h,
        "every_s": per * sub.step_h * 3600.0,
        "step_h": sub.step_h,
        "intervals": slots,
        "carbon": "each site's carbon_g_per_kwh in the sites file",
        "mu_carbon_usd_per_kg": geo_opts.mu_carbon_usd_per_kg,
        "mu_water_usd_per_l": geo_opts.mu_water_usd_per_l,
        "units": "MW",
        "baselines": list(inputs.baselines),
        "replan": {**online_stats, "replans": -(-slots // per)},
        "wall_greenctl_loop_s": round(greenctl_s, 3),
        "modeled": GEO_MODELED,
    }
    meta["replan"] = {k: meta["replan"][k] for k in ("online_steps", "replans", "decide_s")}
    return loop.finish(meta, summary, rows, GEO_INTERVAL_COLUMNS, GEO_SUMMARY_COLUMNS, water=False)


def online_policy(
    sub: Any, online: str, opts: Any, per: int, progress: Any
) -> tuple[np.ndarray, np.ndarray, list[str], dict[str, Any]]:
    """greenctl's policy: eGLB's online step every ``per`` slots, warm-started from the state
    of the slot before; between them the router keeps the last fractions (load over a
    site's capacity is not served).

    Returns:
        (site power per slot ``[T, S]``, unserved MWh per slot, actions,
        ``{"online_steps", "decide_s"}``).
    """
    slots, S = sub.n_steps, len(sub.sites)
    cap = sub.capacity_mw
    y_g = np.zeros((slots, S))
    unserved = np.zeros(slots)
    actions: list[str] = []
    state = None
    fractions: dict[str, dict[str, float]] = {}
    ratio = np.ones(S)  # power per unit of request load per site (variants), at the last step
    index = {s: i for i, s in enumerate(sub.sites)}
    decide_s = 0.0
    steps_taken = 0
    for j in range(slots):
        if progress:
            progress(j, slots)
        if j % per == 0:
            t0 = time.perf_counter()
            step = geo.online_replan(sub, online, opts, slot=j, state=state)
            decide_s += time.perf_counter() - t0
            steps_taken += step.steps
            state, fractions = step.state, step.fractions
            y_g[j] = step.site_load_mw
            z = getattr(step, "variant_load", None)
            if z is not None:
                load = np.asarray(z).sum(axis=1)
                ratio = np.where(load > 0, y_g[j] / np.where(load > 0, load, 1.0), 1.0)
            actions.append("start" if j == 0 else "step")
            continue
        load = np.zeros(S)
        lost = 0.0
        for g, gw in enumerate(sub.gateways):
            mw = float(sub.load_mw[j, g])
            split = fractions.get(gw)
            if not split:
                lost += mw
                continue
            for site, frac in split.items():
                load[index[site]] += mw * frac
        y = load * ratio
        over = np.maximum(y - cap[j], 0.0)
        y_g[j] = y - over
        unserved[j] = (lost + float((over / np.where(ratio > 0, ratio, 1.0)).sum())) * sub.step_h
        actions.append("hold")
    return y_g, unserved, actions, {"online_steps": steps_taken, "decide_s": decide_s}


def geo_summary(
    sub: Any,
    policy: str,
    y: np.ndarray,
    unserved: np.ndarray,
    rows: list[dict[str, Any]],
    opts: Any,
) -> dict[str, Any]:
    """One policy's totals over the window, as the geo planner evaluates an allocation."""
    mu_c, mu_w = opts.mu_carbon_usd_per_kg, opts.mu_water_usd_per_l
    sites, total = geo.evaluate(sub, y, mu_carbon=mu_c, mu_water=mu_w)
    return {
        "policy": policy,
        "load_mwh": float(sub.load_mw.sum() * sub.step_h),
        "unserved_mwh": float(unserved.sum()),
        "energy_kwh": float(sum(r["energy_kwh"] for r in rows)),
        "cost_usd": total["energy_cost_usd_total"],
        "carbon_g": total["carbon_kg_total"] * 1000.0,
        "water_l": total["water_l_total"],
        "carbon_kg_max_site": total["carbon_kg_max"],
        "carbon_max_over_avg": total["carbon_max_over_avg"],
        "water_l_max_site": total["water_l_max"],
        "water_max_over_avg": total["water_max_over_avg"],
        "objective_usd": total["objective"],
        "changes": sum(1 for r in rows if r["action"] == "change"),
        "mean_units": float(y.sum(axis=1).mean()) if y.shape[0] else 0.0,
        "sites": sites,
    }


def geo_rows(
    sub: Any,
    policy: str,
    y: np.ndarray,
    lost: np.ndarray,
    actions: list[str],
    opts: Any,
) -> list[dict[str, Any]]:
    """Per slot of one policy's ``[T, S]`` site power: the planner's accounting, and the
    equity figures of the slots so far."""
    mu_c, mu_w = opts.mu_carbon_usd_per_kg, opts.mu_water_usd_per_l
    S = len(sub.sites)
    cum_c = np.zeros(S)
    cum_w = np.zeros(S)
    cum_cost = 0.0
    prev: np.ndarray | None = None
    out = []
    for t in range(y.shape[0]):
        yt = y[t]
        carbon_kg = sub.carbon_kg_per_mw[t] * yt
        water = sub.water_l_per_mw[t] * yt
        cost = float((sub.cost_usd_per_mw[t] * yt).sum())
        energy_kwh = float((yt * sub.pue[t]).sum() * sub.step_h * 1000.0)
        cum_c += carbon_kg
        cum_w += water
        cum_cost += cost
        shares = site_shares(yt)
        moved = prev is not None and float(np.abs(shares - prev).sum()) / 2 > GEO_SHARE_MOVE
        action = actions[t]
        if action in ("step", "plan"):
            action = "change" if moved else "keep"
        prev = shares
        c_avg, w_avg = float(cum_c.sum()) / S, float(cum_w.sum()) / S
        load = float(sub.load_mw[t].sum())
        order = np.argsort(-shares, kind="stable")
        config = " + ".join(
            f"{sub.sites[i]} {shares[i] * 100:.0f}%" for i in order if shares[i] >= 0.005
        )
        out.append(
            {
                "policy": policy,
                "interval": t,
                "time": sub.times[t],
                "offset_s": t * sub.step_h * 3600.0,
                "load_mw": load,
                "carbon_g_per_kwh": float(carbon_kg.sum() * 1000.0 / (energy_kwh or 1.0))
                if energy_kwh > 0
                else None,
                "action": action,
                "config": config,
                "units": float(yt.sum()),
                "unserved_mwh": float(lost[t]),
                "energy_kwh": energy_kwh,
                "cost_usd": cost,
                "carbon_g": float(carbon_kg.sum()) * 1000.0,
                "water_l": float(water.sum()),
                "carbon_kg_max_site": float(cum_c.max()),
                "carbon_max_over_avg": float(cum_c.max()) / c_avg if c_avg > 0 else None,
                "water_l_max_site": float(cum_w.max()),
                "water_max_over_avg": float(cum_w.max()) / w_avg if w_avg > 0 else None,
                "objective_usd": cum_cost + mu_c * float(cum_c.max()) + mu_w * float(cum_w.max()),
            }
        )
    return out


#: geo's replay step
STEP = ReplayStep(run=replay_geo, baselines=BASELINES, default_baselines=DEFAULT_BASELINES)
