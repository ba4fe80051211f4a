"""Geo algorithms that solve the whole horizon at once: the offline eGLB optimum, the
minimum of a total (``glb-*``) and the nearest-site baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.geo_io import GeoProblem
from greenctl.planner.geo.lp import (
    Network,
    build_network,
    greedy_full,
    hall_cuts,
    solve_flow_lp,
    solve_site_lp,
)
from greenctl.planner.geo.model import (
    GeoOptions,
    first_infeasible_step,
    infeasible_error,
)


def solve_lp(
    problem: GeoProblem, net: Network, cost: np.ndarray, opts: GeoOptions, *, minimax: bool
) -> tuple[np.ndarray, np.ndarray | None]:
    """Site loads minimising ``sum cost x`` (+ the minimax terms with ``minimax``).

    Site-load LP with Hall cuts when the routes give few unions, else the flow LP.
    Returns ``[T, S]`` loads and, with variants, the ``[T, S, M]`` variant loads.
    """
    kw: dict[str, Any] = {}
    if minimax:
        kw = dict(
            carbon=problem.carbon_kg_per_mw,
            water=problem.water_l_per_mw,
            mu_carbon=opts.mu_carbon_usd_per_kg,
            mu_water=opts.mu_water_usd_per_l,
        )
    cuts = [] if net.full else hall_cuts(net)
    if cuts is not None or opts.variants is not None:
        if cuts is None:  # too many unions for cuts: variants need the site LP anyway
            raise InputError(
                "--variants with these routes: too many distinct route sets",
                hint="use fewer distinct allowed-site sets per gateway",
            )
        res = solve_site_lp(
            net, cuts, cost, problem.capacity_mw, net.demand, **kw, **opts.variant_kw()
        )
        if res.status != "Optimal":
            raise infeasible_error(problem, net, opts)
        return res.flow, res.variant_load
    res = solve_flow_lp(net, cost, problem.capacity_mw, net.demand, **kw)
    if res.status != "Optimal":
        raise first_infeasible_step(problem, net)
    return net.site_load(res.flow), None


def min_total(
    problem: GeoProblem, net: Network, cost: np.ndarray, opts: GeoOptions
) -> tuple[np.ndarray, np.ndarray | None]:
    """Site loads minimising ``sum cost x`` (separable per step without variants)."""
    if net.full and opts.variants is None:
        return greedy_full(cost, problem.capacity_mw, net.demand[:, 0]), None
    return solve_lp(problem, net, cost, opts, minimax=False)


def solve_offline(
    problem: GeoProblem, net: Network, opts: GeoOptions
) -> tuple[np.ndarray, np.ndarray | None]:
    """eglb-off: the offline LP optimum (``[T, S]`` site loads, variant loads)."""
    return solve_lp(problem, net, problem.cost_usd_per_mw, opts, minimax=True)


def nearest_order(problem: GeoProblem) -> list[np.ndarray]:
    """Each gateway's allowed sites, nearest first.

    Nearest: the smallest ``latency_ms`` among allowed sites, else the site named like the
    gateway. Spill order after it: latency, then the sites file order.

    Raises:
        InputError: a gateway with neither a latency nor a site of its own name.
    """
    S = len(problem.sites)
    s_index = {s: j for j, s in enumerate(problem.sites)}
    orders = []
    for g, gw in enumerate(problem.gateways):
        allowed = np.flatnonzero(problem.routes[g]) if problem.routes is not None else np.arange(S)
        lat = problem.latency_ms[g, allowed] if problem.latency_ms is not None else None
        if lat is not None and np.isfinite(lat).any():
            key = np.where(np.isfinite(lat), lat, np.inf)
            orders.append(allowed[np.argsort(key, kind="stable")])
            continue
        own = s_index.get(gw)
        if own is None or own not in allowed:
            raise InputError(
                f"nearest: gateway '{gw}' has no latency_ms and no allowed site named '{gw}'",
                hint="add a latency_ms column to the routes file or name gateways like their sites",
            )
        orders.append(np.concatenate([[own], allowed[allowed != own]]))
    return orders


def solve_nearest(
    problem: GeoProblem, opts: GeoOptions | None = None
) -> tuple[Network, np.ndarray]:
    """nearest: each gateway's load goes to its nearest site; when that is full, to the
    next nearest (gateways in file order). At a step where that greedy pass strands load,
    the step is re-solved as min sum of preference rank x flow (as near as capacities
    allow). Returns a per-gateway network and its flows."""
    orders = nearest_order(problem)
    net = build_network(problem.load_mw, len(problem.sites), problem.routes, aggregate=False)
    T = problem.n_steps
    S = len(problem.sites)
    remaining = problem.capacity_mw.copy()
    flow = np.zeros((T, net.n_edges))
    stuck = np.zeros(T, dtype=bool)
    edge_of = {
        (int(k), int(s)): e
        for e, (k, s) in enumerate(zip(net.edge_class, net.edge_site, strict=True))
    }
    for g, order in enumerate(orders):
        k = int(net.gateway_class[g])
        left = problem.load_mw[:, g].copy()
        for s in order:
            take = np.minimum(left, remaining[:, s])
            flow[:, edge_of[(k, int(s))]] = take
            remaining[:, s] -= take
            left -= take
        stuck |= left > 1e-9
    if stuck.any():
        # the nearest sites are full at these steps: send every gateway as near as the
        # capacities allow (min sum of preference rank x flow), an LP per stuck step
        rank = np.zeros(net.n_edges)
        for g, order in enumerate(orders):
            k = int(net.gateway_class[g])
            for r, s in enumerate(order):
                rank[edge_of[(k, int(s))]] = r
        steps = np.flatnonzero(stuck)
        res = solve_flow_lp(
            net,
            np.zeros((steps.size, S)),
            problem.capacity_mw[steps],
            net.demand[steps],
            edge_cost=np.tile(rank, (steps.size, 1)),
        )
        if res.status != "Optimal":
            raise first_infeasible_step(problem, net)
        flow[steps] = res.flow
    return net, flow
