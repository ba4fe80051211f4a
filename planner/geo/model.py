"""The geo problem's options, solutions, metrics and feasibility checks, shared by every
algorithm of :mod:`greenctl.planner.geo.solve`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan
from greenctl.data.geo_io import GeoProblem, GeoVariants
from greenctl.planner.geo.lp import (
    Network,
    StepLP,
    recover_flows,
)

ALGORITHMS = (
    "eglb-off",
    "eglb",
    "eglb-mpc",
    "glb-energy",
    "glb-carbon",
    "glb-water",
    "glb-c2",
    "glb-all",
    "nearest",
)
FORECASTS = ("oracle", "persistence", "seasonal")
# The eGLB authors' demo weights (1500 USD/t, 60 USD/kL) in greenctl's units.
DEFAULT_MU_CARBON = 1.5  # USD per kg of the largest site's carbon
DEFAULT_MU_WATER = 0.06  # USD per litre of the largest site's water
TOL = 1e-7


@dataclass
class GeoOptions:
    """Options of one planning run (units in the names)."""

    mu_carbon_usd_per_kg: float = DEFAULT_MU_CARBON
    mu_water_usd_per_l: float = DEFAULT_MU_WATER
    eta: float | None = None
    z_max_usd: float | None = None
    horizon: int = 24
    forecast: str = "oracle"
    weight_carbon_usd_per_kg: float | None = None
    weight_water_usd_per_l: float | None = None
    variants: GeoVariants | None = None
    min_accuracy: float | None = None

    def variant_kw(self) -> dict[str, Any]:
        """Keyword arguments of ``solve_site_lp`` for heterogeneous models."""
        v = self.variants
        if v is None:
            return {}
        return dict(
            relative_energy=v.relative_energy,
            accuracy=v.accuracy,
            allowed=v.allowed,
            min_accuracy=self.min_accuracy,
        )

    def weights(self, n_sites: int) -> tuple[float, float]:
        """glb-c2/glb-all weights; default: mu priced on the per-site average (mu / S)."""
        wc = self.weight_carbon_usd_per_kg
        ww = self.weight_water_usd_per_l
        return (
            self.mu_carbon_usd_per_kg / n_sites if wc is None else wc,
            self.mu_water_usd_per_l / n_sites if ww is None else ww,
        )


@dataclass
class GeoSolution:
    """One algorithm's allocation: ``[T, S]`` site loads and, on demand, the edge flows
    ``flow[t, e]`` on the network's (class, site) edges that carry them."""

    algorithm: str
    network: Network
    site_load_mw: np.ndarray
    solve_s: float
    info: dict[str, Any] = field(default_factory=dict)
    _flow: np.ndarray | None = None
    capacity_mw: np.ndarray | None = None
    # heterogeneous models: [T, S, M] load per variant (reference MW) and its [T, S] sum
    variant_load: np.ndarray | None = None
    request_load_mw: np.ndarray | None = None

    @classmethod
    def from_flow(
        cls, algorithm: str, net: Network, flow: np.ndarray, solve_s: float, **kw: Any
    ) -> GeoSolution:
        return cls(algorithm, net, net.site_load(flow), solve_s, _flow=flow, **kw)

    @property
    def flow(self) -> np.ndarray:
        """``[T, E]`` edge flows (recovered from the site loads when first asked for)."""
        if self._flow is None:
            if self.request_load_mw is not None:  # variants: loads are not powers
                self._flow = recover_flows(self.network, self.request_load_mw)
            else:
                self._flow = recover_flows(self.network, self.site_load_mw, self.capacity_mw)
        return self._flow

    def variant_flows(
        self, problem: GeoProblem, variants: GeoVariants
    ) -> Iterator[tuple[str, str, str, float, str]]:
        """``(time, gateway, site, load_mw, variant)``: each gateway flow split over the
        site's variant mix of that step (load in reference MW)."""
        assert self.variant_load is not None
        t_index = {t: i for i, t in enumerate(problem.times)}
        s_index = {s: j for j, s in enumerate(problem.sites)}
        total = self.variant_load.sum(axis=2)
        for when, gw, site, load in self.gateway_flows(problem):
            i, j = t_index[when], s_index[site]
            if total[i, j] <= 0:
                continue
            for m, name in enumerate(variants.names):
                v = load * self.variant_load[i, j, m] / total[i, j]
                if v > 1e-12:
                    yield when, gw, site, v, name

    def gateway_flows(self, problem: GeoProblem) -> Iterator[tuple[str, str, str, float]]:
        """``(time, gateway, site, load_mw)`` for every non-zero flow.

        A class's flow is split over its gateways in proportion to their load, which keeps
        demand, capacity and routes exact.
        """
        net = self.network
        members = [np.flatnonzero(net.gateway_class == k) for k in range(net.n_classes)]
        edges = [np.flatnonzero(net.edge_class == k) for k in range(net.n_classes)]
        for t, when in enumerate(problem.times):
            for k in range(net.n_classes):
                dk = net.demand[t, k]
                if dk <= 0:
                    continue
                f = self.flow[t, edges[k]]
                for g in members[k]:
                    share = problem.load_mw[t, g] / dk
                    if share <= 0:
                        continue
                    for e_local, e in enumerate(edges[k]):
                        v = share * f[e_local]
                        if v > 1e-12:
                            yield when, problem.gateways[g], problem.sites[net.edge_site[e]], v

    def gateway_fractions(
        self, problem: GeoProblem
    ) -> tuple[list[dict[str, dict[str, float]]], dict[str, dict[str, float]]]:
        """:func:`gateway_fractions` of this solution's flows (what the geo router routes)."""
        return gateway_fractions(problem, self.network, self.flow)


def gateway_fractions(
    problem: GeoProblem, net: Network, flow: np.ndarray, *, first_step: int = 0
) -> tuple[list[dict[str, dict[str, float]]], dict[str, dict[str, float]]]:
    """Per step, each gateway's share of its load per site (sites in name order; a gateway
    without load in a step is absent from it), and its shares over all the steps given:
    :meth:`GeoSolution.gateway_flows` normalised, computed array-wise per class.

    Args:
        flow: ``[n, E]`` edge flows of steps ``first_step .. first_step + n - 1``.
    """
    n = flow.shape[0]
    steps = slice(first_step, first_step + n)
    slots: list[dict[str, dict[str, float]]] = [{} for _ in range(n)]
    overall: dict[str, dict[str, float]] = {}
    for k in range(net.n_classes):
        edges = np.flatnonzero(net.edge_class == k)
        names = [problem.sites[j] for j in net.edge_site[edges]]
        order = sorted(range(len(names)), key=names.__getitem__)
        edges = edges[order]
        names = [names[i] for i in order]
        F = flow[:, edges]
        dk = net.demand[steps, k]
        for g in np.flatnonzero(net.gateway_class == k):
            share = np.divide(problem.load_mw[steps, g], dk, out=np.zeros(n), where=dk > 0)
            V = share[:, None] * F
            V[V <= 1e-12] = 0.0  # as gateway_flows: no flow below 1e-12 MW
            total = V.sum(axis=1)
            rows = np.flatnonzero(total > 0)
            frac = V[rows] / total[rows, None]
            gw = problem.gateways[g]
            # only the non-zero shares go through Python (row-major: sites in name order)
            nz_r, nz_c = np.nonzero(frac)
            steps_nz = rows[nz_r].tolist()
            for t, c, f in zip(steps_nz, nz_c.tolist(), frac[nz_r, nz_c].tolist(), strict=True):
                d = slots[t].get(gw)
                if d is None:
                    d = slots[t][gw] = {}
                d[names[c]] = f
            whole = V.sum(axis=0)
            if whole.sum() > 0:
                shares = (whole / whole.sum()).tolist()
                overall[gw] = {name: f for name, f in zip(names, shares, strict=True) if f > 0}
    return slots, overall


def evaluate(
    problem: GeoProblem, site_load_mw: np.ndarray, *, mu_carbon: float, mu_water: float
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-site totals and the summary (averages are per site, as in the paper)."""
    y = site_load_mw
    load = (y * problem.step_h).sum(axis=0)
    cost = (problem.cost_usd_per_mw * y).sum(axis=0)
    carbon = (problem.carbon_kg_per_mw * y).sum(axis=0)
    water = (problem.water_l_per_mw * y).sum(axis=0)
    sites = [
        {
            "site": name,
            "load_mwh": float(load[j]),
            "energy_cost_usd": float(cost[j]),
            "carbon_kg": float(carbon[j]),
            "water_l": float(water[j]),
        }
        for j, name in enumerate(problem.sites)
    ]
    S = len(problem.sites)

    def ratio(mx: float, avg: float) -> float | None:
        return mx / avg if avg > 0 else None

    c_avg, w_avg = float(carbon.sum()) / S, float(water.sum()) / S
    summary = {
        "energy_cost_usd_total": float(cost.sum()),
        "energy_cost_usd_avg": float(cost.sum()) / S,
        "carbon_kg_total": float(carbon.sum()),
        "carbon_kg_avg": c_avg,
        "carbon_kg_max": float(carbon.max()),
        "carbon_max_over_avg": ratio(float(carbon.max()), c_avg),
        "water_l_total": float(water.sum()),
        "water_l_avg": w_avg,
        "water_l_max": float(water.max()),
        "water_max_over_avg": ratio(float(water.max()), w_avg),
        "objective": float(cost.sum())
        + mu_carbon * float(carbon.max())
        + mu_water * float(water.max()),
    }
    return sites, summary


def allocation_violations(problem: GeoProblem, sol: GeoSolution, *, tol: float = 1e-6) -> list[str]:
    """Broken demand, capacity, route or sign constraints of a solution (empty: none)."""
    out = []
    net = sol.network
    if (sol.flow < -tol).any():
        out.append("negative flow")
    for k in range(net.n_classes):
        served = sol.flow[:, net.edge_class == k].sum(axis=1)
        bad = np.flatnonzero(np.abs(served - net.demand[:, k]) > tol * (1 + net.demand[:, k]))
        if bad.size:
            out.append(f"class {k}: demand not met at step {int(bad[0])}")
    over = np.argwhere(sol.site_load_mw > problem.capacity_mw * (1 + tol) + tol)
    if over.size:
        t, s = map(int, over[0])
        out.append(f"capacity exceeded at step {t}, site {problem.sites[s]}")
    if problem.routes is not None:
        for k, sites in enumerate(net.class_sites):
            for g in np.flatnonzero(net.gateway_class == k):
                if not problem.routes[g, sites].all():
                    out.append(f"gateway {problem.gateways[g]} uses a site it may not")
    return out


def check_routes_feasible(problem: GeoProblem, net: Network, *, max_sets: int = 512) -> None:
    """Raise InfeasiblePlan at the first step where routed load cannot be carried.

    Hall's condition for the transportation problem: for every union ``U`` of classes'
    site sets, the load of the classes that can only use sites in ``U`` must fit in the
    capacity of ``U``. Enumerates the distinct unions (up to ``max_sets``; beyond that the
    solvers' own infeasibility reports take over).
    """
    if net.full:
        return
    S = problem.capacity_mw.shape[1]
    masks = np.zeros((net.n_classes, S), dtype=bool)
    for k, class_sites in enumerate(net.class_sites):
        masks[k, class_sites] = True
    seen = {np.zeros(S, dtype=bool).tobytes()}
    sets: list[np.ndarray] = []
    frontier = [np.zeros(S, dtype=bool)]
    while frontier and len(sets) < max_sets:
        new = []
        for u in frontier:
            for v in u | masks:
                key = v.tobytes()
                if key not in seen:
                    seen.add(key)
                    new.append(v)
                    sets.append(v)
            if len(sets) >= max_sets:
                break
        frontier = new
    first: tuple[int, np.ndarray, np.ndarray] | None = None
    total = 1 + net.demand.sum(axis=1)
    for u in sets:
        inside = ~np.any(masks & ~u, axis=1)
        if not inside.any():
            continue
        deficit = net.demand[:, inside].sum(axis=1) - problem.capacity_mw[:, u].sum(axis=1)
        bad = np.flatnonzero(deficit > 1e-9 * total)
        if bad.size and (first is None or bad[0] < first[0]):
            first = (int(bad[0]), u, inside)
    if first is not None:
        t, u, inside = first
        gws = [g for g, k in zip(problem.gateways, net.gateway_class, strict=True) if inside[k]]
        sites = [problem.sites[j] for j in np.flatnonzero(u)]
        load = float(net.demand[t, inside].sum())
        cap = float(problem.capacity_mw[t, u].sum())
        raise InfeasiblePlan(
            f"step {t} ({problem.times[t]}) is infeasible: gateways {', '.join(gws[:8])}"
            f"{' ...' if len(gws) > 8 else ''} may only use {', '.join(sites[:8])}"
            f"{' ...' if len(sites) > 8 else ''}, whose capacity {cap:.6g} MW is below their "
            f"load {load:.6g} MW",
            hint="allow more routes for these gateways or raise those sites' capacity_mw",
        )


def first_infeasible_step(problem: GeoProblem, net: Network) -> InfeasiblePlan:
    lp = StepLP(net)
    zero = np.zeros(problem.capacity_mw.shape[1])
    for t in range(problem.n_steps):
        if lp.solve(zero, problem.capacity_mw[t], net.demand[t]) is None:
            return InfeasiblePlan(
                f"step {t} ({problem.times[t]}) is infeasible: the gateways' allowed sites "
                "cannot carry their load",
                hint="allow more routes or raise capacity_mw",
            )
    return InfeasiblePlan("the problem is infeasible (HiGHS reports no feasible allocation)")


def infeasible_error(problem: GeoProblem, net: Network, opts: GeoOptions) -> InfeasiblePlan:
    v = opts.variants
    if v is not None and opts.min_accuracy is not None:
        return InfeasiblePlan(
            f"no allocation reaches --min-accuracy {opts.min_accuracy:g} within the site "
            f"capacities (variants' accuracy {v.accuracy.min():g} .. {v.accuracy.max():g}, "
            f"the most accurate needs {v.relative_energy.max():g}x the reference power)",
            hint="lower --min-accuracy or raise capacity_mw",
        )
    return first_infeasible_step(problem, net)


def step_infeasible(problem: GeoProblem, t: int, opts: GeoOptions) -> InfeasiblePlan:
    if opts.variants is not None and opts.min_accuracy is not None:
        return InfeasiblePlan(
            f"step {t} ({problem.times[t]}) cannot be served at --min-accuracy "
            f"{opts.min_accuracy:g} (with the accuracy banked so far) within the site "
            "capacities",
            hint="lower --min-accuracy or raise capacity_mw",
        )
    return InfeasiblePlan(
        f"step {t} ({problem.times[t]}) is infeasible: the gateways' allowed "
        "sites cannot carry their load",
        hint="allow more routes or raise capacity_mw",
    )
