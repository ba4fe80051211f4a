"""Equity-aware geographical load balancing (eGLB) and its baselines.

Every step each gateway's load (MW) is split over its allowed sites within capacities.
eGLB minimises energy cost plus the *largest* regional carbon and water footprint over
the horizon (Li et al., "Towards Environmentally Equitable AI via Geographical Load
Balancing", e-Energy 2024). ``ALGORITHMS``: ``eglb-off`` (the offline LP,
``geo_lp.solve_flow_lp``), ``eglb`` (online dual mirror descent), ``eglb-mpc`` (receding
horizon over forecasts), ``glb-energy``/``-carbon``/``-water``/``-c2``/``-all`` (min of a
total) and ``nearest``. All figures are modeled from the input traces, not measured.
See docs/plan.md ("plan geo").
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.geo_io import GeoProblem, GeoVariants
from greenctl.data.plan import Deployment, Plan
from greenctl.planner.geo.lp import (
    StepLP,
    build_network,
    recover_flows,
)
from greenctl.planner.geo.model import (
    ALGORITHMS,
    DEFAULT_MU_CARBON,
    DEFAULT_MU_WATER,
    FORECASTS,
    TOL,
    GeoOptions,
    GeoSolution,
    allocation_violations,
    check_routes_feasible,
    evaluate,
    gateway_fractions,
    infeasible_error,
    step_infeasible,
)
from greenctl.planner.geo.mpc import mpc_cuts, mpc_step, solve_mpc
from greenctl.planner.geo.offline import min_total, nearest_order, solve_nearest, solve_offline
from greenctl.planner.geo.online import (
    ONLINE_ALGORITHMS,
    OnlineState,
    OnlineStep,
    online_init,
    online_step,
    online_step_variants,
    solve_online,
    solve_online_variants,
    variant_cuts,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_MU_CARBON",
    "DEFAULT_MU_WATER",
    "FORECASTS",
    "ONLINE_ALGORITHMS",
    "TOL",
    "GeoOptions",
    "GeoRun",
    "GeoRunOptions",
    "GeoSolution",
    "OnlineState",
    "OnlineStep",
    "allocation_violations",
    "check_options",
    "check_routes_feasible",
    "evaluate",
    "gateway_fractions",
    "mpc_cuts",
    "mpc_step",
    "nearest_order",
    "online_init",
    "online_replan",
    "online_step",
    "online_step_variants",
    "plan_geo",
    "run_geo",
    "site_resource",
    "solve",
    "solve_mpc",
    "solve_nearest",
    "solve_offline",
    "solve_online",
    "solve_online_variants",
    "variant_cuts",
]


def online_replan(
    problem: GeoProblem,
    algorithm: str,
    opts: GeoOptions,
    *,
    slot: int,
    state: OnlineState | None = None,
) -> OnlineStep:
    """eGLB's online decision for step ``slot``, continuing from ``state`` (a previous call's).

    Steps on from ``state.slot`` to ``slot`` on ``problem``'s newest traces. Without a usable
    state (None, another algorithm, or one at or past ``slot``) it is rebuilt over steps
    ``0 .. slot - 1``, so on unchanged traces the allocation is the whole-horizon solve's.
    With ``variants`` it steps by :func:`online_step_variants`.

    Raises:
        InputError: not an online algorithm, or a slot the traces do not cover.
        InfeasiblePlan: the slot cannot be served.
    """
    if algorithm not in ONLINE_ALGORITHMS:
        raise InputError(
            f"algorithm {algorithm} has no online step",
            hint=f"online algorithms: {', '.join(ONLINE_ALGORITHMS)}",
        )
    T, S = problem.capacity_mw.shape
    if not 0 <= slot < T:
        raise InputError(
            f"slot {slot} is outside the traces' {T} steps ({problem.times[0]} .. "
            f"{problem.times[-1]})",
            hint="append the newest rows to the sites and demand files, or pass --at within them",
        )
    v = opts.variants
    net = build_network(problem.load_mw, S, problem.routes)
    warm = state is not None and state.algorithm == algorithm and state.slot < slot
    if not warm:
        if algorithm == "eglb" and v is None:
            state = solve_online(problem, net, opts, upto=slot)[1]["state"]
        elif algorithm == "eglb":
            state = solve_online_variants(problem, net, opts, upto=slot)[2]["state"]
        else:
            state = solve_mpc(problem, net, opts, upto=slot)[2]["state"]
    assert state is not None
    a, b, q = problem.cost_usd_per_mw, problem.carbon_kg_per_mw, problem.water_l_per_mw
    cap = problem.capacity_mw
    plain = algorithm == "eglb" and v is None
    lp = None if net.full or not plain else StepLP(net, basis=state.basis)
    cuts = mpc_cuts(net, opts) if algorithm == "eglb-mpc" else None
    cuts_v = variant_cuts(net) if algorithm == "eglb" and v is not None else []
    steps = 0
    flow: np.ndarray | None = None
    load: np.ndarray | None = None  # [S] request load (not power) of the slot
    z: np.ndarray | None = None
    while state.slot < slot:
        t = state.slot + 1
        if plain:
            flow, state = online_step(
                state, net, opts, cost=a[t], carbon=b[t], water=q[t], cap=cap[t],
                demand=net.demand[t], step_lp=lp,
            )  # fmt: skip
            if flow is None:
                raise step_infeasible(problem, t, opts)
        elif algorithm == "eglb":  # variants: the state carries the site LP's basis
            z, state = online_step_variants(
                state, net, opts, cuts=cuts_v, cost=a[t], carbon=b[t], water=q[t],
                cap=cap[t], demand=net.demand[t],
            )  # fmt: skip
            if z is None:
                raise step_infeasible(problem, t, opts)
            load = z.sum(axis=1)
        else:
            load, z, _, state = mpc_step(state, problem, net, opts, cuts=cuts)
        steps += 1
    if plain:
        assert flow is not None
        if lp is not None:
            state.basis = lp.basis()
        y = flow if net.full else np.bincount(net.edge_site, weights=flow, minlength=S)
    else:
        assert load is not None
        one = replace(net, demand=net.demand[slot : slot + 1])
        # variants: request loads are not powers, the capacity (in power) does not bound them
        flow = recover_flows(one, load[None, :], None if v is not None else cap[slot : slot + 1])[0]
        y = load if z is None or v is None else (z * v.relative_energy).sum(axis=1)
    fractions = gateway_fractions(problem, net, flow[None, :], first_step=slot)[0][0]
    return OnlineStep(slot, fractions, y, state, warm, steps, variant_load=z)


def solve(problem: GeoProblem, algorithm: str, opts: GeoOptions | None = None) -> GeoSolution:
    """Run one algorithm on a problem.

    Raises:
        InputError: unknown algorithm or option.
        InfeasiblePlan: the first step that cannot be served.
    """
    opts = opts or GeoOptions()
    _check_options(opts)
    if algorithm not in ALGORITHMS:
        raise InputError(
            f"unknown algorithm '{algorithm}'", hint=f"one of {', '.join(ALGORITHMS)}, all"
        )
    t0 = time.perf_counter()
    net = build_network(problem.load_mw, len(problem.sites), problem.routes)
    check_routes_feasible(problem, net)
    v = opts.variants
    if v is not None and v.accuracy.max() < (opts.min_accuracy or 0.0) - 1e-12:
        raise infeasible_error(problem, net, opts)
    if algorithm == "nearest":
        net, flow = solve_nearest(problem, opts)
        sol = GeoSolution.from_flow(algorithm, net, flow, time.perf_counter() - t0)
        if v is not None:  # nearest serves everything with the reference variant
            zn = np.zeros((*sol.site_load_mw.shape, len(v.names)))
            zn[:, :, v.reference] = sol.site_load_mw
            sol.variant_load, sol.request_load_mw = zn, sol.site_load_mw
        return sol
    info: dict[str, Any] = {}
    wc, ww = opts.weights(len(problem.sites))
    a, b, q = problem.cost_usd_per_mw, problem.carbon_kg_per_mw, problem.water_l_per_mw
    z: np.ndarray | None = None
    if algorithm == "eglb" and v is None:
        flow, info = solve_online(problem, net, opts)
        return GeoSolution.from_flow(algorithm, net, flow, time.perf_counter() - t0, info=info)
    if algorithm == "eglb":
        y, z, info = solve_online_variants(problem, net, opts)
    elif algorithm == "eglb-off":
        y, z = solve_offline(problem, net, opts)
    elif algorithm == "eglb-mpc":
        y, z, info = solve_mpc(problem, net, opts)
    elif algorithm == "glb-energy":
        y, z = min_total(problem, net, a, opts)
    elif algorithm == "glb-carbon":
        y, z = min_total(problem, net, b, opts)
    elif algorithm == "glb-water":
        y, z = min_total(problem, net, q, opts)
    elif algorithm == "glb-c2":
        y, z = min_total(problem, net, a + wc * b, opts)
        info = {"weight_carbon_usd_per_kg": wc}
    else:  # glb-all
        y, z = min_total(problem, net, a + wc * b + ww * q, opts)
        info = {"weight_carbon_usd_per_kg": wc, "weight_water_usd_per_l": ww}
    dt = time.perf_counter() - t0
    if z is None:
        return GeoSolution(algorithm, net, y, dt, info=info, capacity_mw=problem.capacity_mw)
    assert v is not None
    power = (z * v.relative_energy).sum(axis=2)
    return GeoSolution(
        algorithm,
        net,
        power,
        dt,
        info=info,
        capacity_mw=problem.capacity_mw,
        variant_load=z,
        request_load_mw=y,
    )


def _check_options(opts: GeoOptions) -> None:
    for name, value in (
        ("--mu-carbon", opts.mu_carbon_usd_per_kg),
        ("--mu-water", opts.mu_water_usd_per_l),
        ("--eta", opts.eta),
        ("--z-max", opts.z_max_usd),
        ("--weight-carbon", opts.weight_carbon_usd_per_kg),
        ("--weight-water", opts.weight_water_usd_per_l),
    ):
        if value is not None and (not math.isfinite(value) or value < 0):
            raise InputError(f"{name} must be a finite number >= 0, got {value}")
    if opts.horizon < 1:
        raise InputError(f"--horizon must be >= 1 step, got {opts.horizon}")
    if opts.min_accuracy is not None:
        if not 0.0 <= opts.min_accuracy <= 1.0:
            raise InputError(
                f"--min-accuracy must be a fraction between 0 and 1, got {opts.min_accuracy}"
            )
        if opts.variants is None:
            raise InputError(
                "--min-accuracy needs variants to choose from",
                hint="pass --variants FILE.csv or --family NAME",
            )
    if opts.forecast not in FORECASTS:
        raise InputError(
            f"unknown forecast '{opts.forecast}'", hint=f"one of {', '.join(FORECASTS)}"
        )


# -- the plan ------------------------------------------------------------------------------
_LABEL_SIZE = re.compile(r"[^A-Za-z0-9._+-]")


def site_resource(name: str) -> str:
    """A valid ``site:NAME`` resource label (odd characters become '-')."""
    size = _LABEL_SIZE.sub("-", name)
    if not size or not size[0].isalnum():
        size = "s" + size
    return f"site:{size}"


@dataclass
class GeoRun:
    """The plan document and the solutions behind it (keyed by algorithm)."""

    plan: Plan
    problem: GeoProblem
    solutions: dict[str, GeoSolution]
    notes: list[str] = field(default_factory=list)

    variants: GeoVariants | None = None

    def allocation_rows(self) -> Iterator[tuple[Any, ...]]:
        """The plan's algorithm's ``(time, gateway, site, load_mw)`` flows (plus the
        ``variant`` with heterogeneous models; load in reference MW), for
        :func:`greenctl.data.geo_io.write_allocations`."""
        sol = self.solutions[self.plan.extra["algorithm"]]
        if self.variants is not None and sol.variant_load is not None:
            return sol.variant_flows(self.problem, self.variants)
        return sol.gateway_flows(self.problem)


@dataclass(frozen=True)
class GeoRunOptions:
    """How :func:`run_geo` plans (its keywords, one type).

    Attributes:
        algorithm: one of :data:`ALGORITHMS`, or ``all`` of them.
        mu_carbon / mu_water: USD per kg of the largest site's carbon, per litre of its water.
        eta, z_max, horizon, forecast, weight_carbon, weight_water: the algorithms' own
            options (:class:`GeoOptions`).
        model / variant: the names the plan's deployments carry.
        variants: heterogeneous models: each site may serve its load with any allowed one.
        min_accuracy: a floor on the load-weighted mean accuracy over the horizon.
    """

    algorithm: str = "eglb-off"
    mu_carbon: float = DEFAULT_MU_CARBON
    mu_water: float = DEFAULT_MU_WATER
    eta: float | None = None
    z_max: float | None = None
    horizon: int = 24
    forecast: str = "oracle"
    weight_carbon: float | None = None
    weight_water: float | None = None
    model: str = "default"
    variant: str = "default"
    variants: GeoVariants | None = None
    min_accuracy: float | None = None


def run_geo(problem: GeoProblem, options: GeoRunOptions | None = None, **kwargs: Any) -> GeoRun:
    """Plan geographical load balancing with one algorithm, or ``all`` of them.

    ``options`` (:class:`GeoRunOptions`; its fields as keywords win). With ``variants`` sites
    list ``variant_load_mwh``, the summary ``accuracy_mean``, one deployment per site and variant.

    Returns:
        The ``geo`` plan (``sites``, ``summary`` and, with ``all``, ``algorithms`` in
        ``plan.extra``; one deployment per site) and each algorithm's solution.
    Raises:
        InputError: bad options. InfeasiblePlan: a step that cannot be served.
    """
    run = replace(options, **kwargs) if options is not None else GeoRunOptions(**kwargs)
    opts = check_options(
        algorithm=run.algorithm,
        mu_carbon=run.mu_carbon,
        mu_water=run.mu_water,
        eta=run.eta,
        z_max=run.z_max,
        horizon=run.horizon,
        forecast=run.forecast,
        weight_carbon=run.weight_carbon,
        weight_water=run.weight_water,
        variants=run.variants,
        min_accuracy=run.min_accuracy,
    )
    names = list(ALGORITHMS) if run.algorithm == "all" else [run.algorithm]
    solutions: dict[str, GeoSolution] = {}
    notes: list[str] = []
    for name in names:
        try:
            solutions[name] = solve(problem, name, opts)
        except InputError as exc:
            if run.algorithm != "all" or name != "nearest":
                raise
            notes.append(f"nearest skipped: {exc.message}")
    main = solutions["eglb-off" if run.algorithm == "all" else run.algorithm]
    blocks = _blocks(problem, solutions, run)
    sites, summary = blocks[main.algorithm]["sites"], blocks[main.algorithm]["summary"]
    extra: dict[str, Any] = {
        "algorithm": main.algorithm,
        "basis": "modeled from the input price, carbon and water traces",
        "sites": sites,
        "summary": summary,
        "solve_s": main.solve_s,
    }
    if run.algorithm == "all":
        extra["algorithms"] = blocks
    if notes:
        extra["notes"] = notes
    predicted = {
        "objective": summary["objective"],
        "energy_cost_usd": summary["energy_cost_usd_total"],
        "carbon_kg_max": summary["carbon_kg_max"],
        "water_l_max": summary["water_l_max"],
        "basis": "modeled",
    }
    plan = Plan(
        kind="geo",
        request=_request(problem, run, opts),
        deployments=_deployments(main, sites, run),
        predicted=predicted,
        extra=extra,
    )
    return GeoRun(
        plan=plan, problem=problem, solutions=solutions, notes=notes, variants=run.variants
    )


def _blocks(
    problem: GeoProblem, solutions: dict[str, GeoSolution], run: GeoRunOptions
) -> dict[str, dict[str, Any]]:
    """Each algorithm's sites, summary, solve time and solver notes."""
    blocks: dict[str, dict[str, Any]] = {}
    for name, sol in solutions.items():
        sites, summary = evaluate(
            problem, sol.site_load_mw, mu_carbon=run.mu_carbon, mu_water=run.mu_water
        )
        if run.variants is not None and sol.variant_load is not None:
            _add_variants(problem, sol, run.variants, sites, summary)
        blocks[name] = {"sites": sites, "summary": summary, "solve_s": sol.solve_s}
        if sol.info:
            blocks[name]["info"] = sol.info
    return blocks


def _request(problem: GeoProblem, run: GeoRunOptions, opts: GeoOptions) -> dict[str, Any]:
    """The plan's ``request``: what :func:`run_geo` read, enough to plan again."""
    wc, ww = opts.weights(len(problem.sites))
    request: dict[str, Any] = {
        "algorithm": run.algorithm,
        **problem.sources,
        "mu_carbon_usd_per_kg": run.mu_carbon,
        "mu_water_usd_per_l": run.mu_water,
        "eta": run.eta,
        "z_max_usd": run.z_max,
        "horizon": run.horizon,
        "forecast": run.forecast,
        "weight_carbon_usd_per_kg": wc,
        "weight_water_usd_per_l": ww,
        "model": run.model,
        "variant": run.variant,
        "n_steps": problem.n_steps,
        "step_h": problem.step_h,
        "n_sites": len(problem.sites),
        "n_gateways": len(problem.gateways),
        "start": problem.times[0],
    }
    if run.variants is not None:
        request["variants"] = run.variants.source
        request["variant_names"] = run.variants.names
        request["min_accuracy"] = run.min_accuracy
    return request


def _deployments(
    main: GeoSolution, sites: list[dict[str, Any]], run: GeoRunOptions
) -> list[Deployment]:
    """One deployment per site (per site and variant that serves load, with variants)."""
    variants = run.variants
    if variants is not None and main.variant_load is not None:
        return [
            Deployment(
                model=run.model,
                variant=vname,
                resource=site_resource(s["site"]),
                count=1,
                placement={
                    "site": s["site"],
                    "load_mwh": s["variant_load_mwh"][vname],
                    "peak_load_mw": float(main.variant_load[:, j, m].max()),
                },
            )
            for j, s in enumerate(sites)
            for m, vname in enumerate(variants.names)
            if s["variant_load_mwh"][vname] > 1e-9
        ]
    peak = main.site_load_mw.max(axis=0)
    return [
        Deployment(
            model=run.model,
            variant=run.variant,
            resource=site_resource(s["site"]),
            count=1,
            placement={
                "site": s["site"],
                "load_mwh": s["load_mwh"],
                "peak_load_mw": float(peak[j]),
            },
        )
        for j, s in enumerate(sites)
    ]


def _add_variants(
    problem: GeoProblem,
    sol: GeoSolution,
    variants: GeoVariants,
    sites: list[dict[str, Any]],
    summary: dict[str, Any],
) -> None:
    """Per-site load per variant (reference MWh) and the load-weighted mean accuracy."""
    assert sol.variant_load is not None
    z = sol.variant_load
    per = (z * problem.step_h).sum(axis=0)  # [S, M]
    for j, site in enumerate(sites):
        site["variant_load_mwh"] = {n: float(per[j, m]) for m, n in enumerate(variants.names)}
    total = float(z.sum())
    summary["accuracy_mean"] = float((z * variants.accuracy).sum()) / total if total > 0 else None


def check_options(
    *,
    algorithm: str = "eglb-off",
    mu_carbon: float = DEFAULT_MU_CARBON,
    mu_water: float = DEFAULT_MU_WATER,
    eta: float | None = None,
    z_max: float | None = None,
    horizon: int = 24,
    forecast: str = "oracle",
    weight_carbon: float | None = None,
    weight_water: float | None = None,
    variants: GeoVariants | None = None,
    min_accuracy: float | None = None,
    **_: Any,
) -> GeoOptions:
    """The options of :func:`run_geo` (same keywords; others are ignored), checked.

    Raises:
        InputError: an unknown algorithm or forecast, or a weight, rate or horizon out of
            range.
    """
    if algorithm != "all" and algorithm not in ALGORITHMS:
        raise InputError(
            f"unknown algorithm '{algorithm}'", hint=f"one of {', '.join(ALGORITHMS)}, all"
        )
    opts = GeoOptions(
        mu_carbon_usd_per_kg=mu_carbon,
        mu_water_usd_per_l=mu_water,
        eta=eta,
        z_max_usd=z_max,
        horizon=horizon,
        forecast=forecast,
        weight_carbon_usd_per_kg=weight_carbon,
        weight_water_usd_per_l=weight_water,
        variants=variants,
        min_accuracy=min_accuracy,
    )
    _check_options(opts)
    return opts


def plan_geo(problem: GeoProblem, **options: Any) -> Plan:
    """The ``geo`` plan of :func:`run_geo` (same keyword-only options)."""
    return run_geo(problem, **options).plan
