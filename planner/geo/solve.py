"""Equity-aware geographical load balancing (eGLB) and its baselines.

Every step ``t`` each gateway's load (MW) is split over the sites it may use, within site
capacities. One MW at site ``s`` for one step costs ``a = h pue price`` USD and emits
``b = h pue carbon`` kg CO2 and ``q = 1000 h (wue + pue ewif)`` litres of water. eGLB
minimises ``sum a x + mu_c max_s sum_t b x + mu_w max_s sum_t q x``: energy cost plus the
*largest* regional footprint over the horizon (Li et al., "Towards Environmentally
Equitable AI via Geographical Load Balancing", e-Energy 2024).

Algorithms (``ALGORITHMS``):

- ``eglb-off``: the offline optimum, one LP (``geo_lp.solve_flow_lp``).
- ``eglb``: online dual mirror descent; per step a min-cost allocation with prices
  adjusted by the duals (closed form when every route is allowed, a warm-started HiGHS LP
  with routes), auxiliary targets in closed form, projected dual update.
- ``eglb-mpc``: receding horizon over forecasts, with the footprint spent so far.
- ``glb-energy``, ``glb-carbon``, ``glb-water``, ``glb-c2``, ``glb-all``: min of a total.
- ``nearest``: every gateway to its nearest allowed site (spilling to the next nearest
  only when the nearest is full).

All figures are modeled from the input traces, not measured.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.geo_io import GeoProblem, GeoVariants
from greenctl.data.plan import Deployment, Plan
from greenctl.planner.geo.lp import (
    SMALL_LP_OPTIONS,
    Network,
    StepLP,
    build_network,
    greedy_full,
    hall_cuts,
    recover_flows,
    site_lp_warm_from_state,
    site_lp_warm_state,
    solve_flow_lp,
    solve_site_lp,
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


# -- metrics ------------------------------------------------------------------------------------
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


# -- feasibility ----------------------------------------------------------------------------
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
    for k, sites in enumerate(net.class_sites):
        masks[k, sites] = True
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
        inside = ~(masks & ~u).any(axis=1)
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


def _first_infeasible_step(problem: GeoProblem, net: Network) -> InfeasiblePlan:
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


# -- algorithms -------------------------------------------------------------------------------
def _lp(
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
            raise _infeasible(problem, net, opts)
        return res.flow, res.variant_load
    res = solve_flow_lp(net, cost, problem.capacity_mw, net.demand, **kw)
    if res.status != "Optimal":
        raise _first_infeasible_step(problem, net)
    return net.site_load(res.flow), None


def _infeasible(problem: GeoProblem, net: Network, opts: GeoOptions) -> InfeasiblePlan:
    v = opts.variants
    if v is not None and opts.min_accuracy is not None:
        return InfeasiblePlan(
            f"no allocation reaches --min-accuracy {opts.min_accuracy:g} within the site "
            f"capacities (variants' accuracy {v.accuracy.min():g} .. {v.accuracy.max():g}, "
            f"the most accurate needs {v.relative_energy.max():g}x the reference power)",
            hint="lower --min-accuracy or raise capacity_mw",
        )
    return _first_infeasible_step(problem, net)


def _min_total(
    problem: GeoProblem, net: Network, cost: np.ndarray, opts: GeoOptions
) -> tuple[np.ndarray, np.ndarray | None]:
    """Site loads minimising ``sum cost x`` (separable per step without variants)."""
    if net.full and opts.variants is None:
        return greedy_full(cost, problem.capacity_mw, net.demand[:, 0]), None
    return _lp(problem, net, cost, opts, minimax=False)


def solve_offline(
    problem: GeoProblem, net: Network, opts: GeoOptions
) -> tuple[np.ndarray, np.ndarray | None]:
    """eglb-off: the offline LP optimum (``[T, S]`` site loads, variant loads)."""
    return _lp(problem, net, problem.cost_usd_per_mw, opts, minimax=True)


def _aux_target(gamma: np.ndarray, z_max: np.ndarray) -> np.ndarray:
    """argmin over 0 <= z <= z_max of max_i z_i - gamma . z, in closed form.

    With level ``m = max z`` the best z is ``min(m, z_max)``; the objective
    ``m - sum gamma_i min(m, z_max_i)`` is convex piecewise linear in m with slope
    ``1 - sum of gamma over sites with z_max_i > m``, so m is the first z_max (largest
    first) at which the running sum of gamma reaches 1, or 0 if it never does.
    """
    order = np.argsort(-z_max, kind="stable")
    cs = np.cumsum(gamma[order])
    k = int(np.searchsorted(cs, 1.0))
    m = 0.0 if k >= cs.size else float(z_max[order[k]])
    return np.minimum(m, z_max)


@dataclass
class OnlineState:
    """eGLB's online state between two steps: all an online step needs from the past, so
    ``replan`` can store it and take the next step alone (``slot`` is the last step taken,
    -1 before the first). Arrays are ``[S]``; plain values go in and out
    (:meth:`to_dict`, :meth:`from_dict`): the planner stores nothing itself.
    """

    algorithm: str  # eglb | eglb-mpc
    slot: int
    eta: float
    gamma_carbon: np.ndarray  # duals of the carbon and water maxima (eglb)
    gamma_water: np.ndarray
    zc_max: np.ndarray  # running max of the weighted per-step footprints (USD, eglb)
    zw_max: np.ndarray
    past_carbon_kg: np.ndarray  # footprints spent so far (eglb-mpc plans with them)
    past_water_l: np.ndarray
    #: with variants: the load-weighted accuracy banked so far, sum (accuracy - floor) x load
    accuracy_surplus: float = 0.0
    #: the step LP's last optimal basis (eglb with routes: ``StepLP.basis``; with variants and
    #: eglb-mpc's site-load windows: the site LP's, with its shape under ``key``): the next
    #: step starts warm, as the whole solve's did
    basis: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values."""
        return {
            "algorithm": self.algorithm,
            "slot": self.slot,
            "eta": self.eta,
            **{k: getattr(self, k).tolist() for k in _STATE_ARRAYS},
            "accuracy_surplus": self.accuracy_surplus,
            "basis": self.basis,
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any], *, n_sites: int) -> OnlineState:
        """The state :meth:`to_dict` wrote, checked against the problem's ``n_sites``.

        Raises:
            InputError: a field is missing or of the wrong size (naming it).
        """
        try:
            arrays = {k: np.asarray(doc[k], dtype=float) for k in _STATE_ARRAYS}
            state = cls(
                algorithm=str(doc["algorithm"]),
                slot=int(doc["slot"]),
                eta=float(doc["eta"]),
                accuracy_surplus=float(doc.get("accuracy_surplus") or 0.0),
                basis=doc.get("basis"),
                **arrays,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"the stored eGLB online state lacks or mangles {exc}",
                hint="replan from the plan's files: the state is rebuilt from slot 0",
            ) from None
        for k, v in arrays.items():
            if v.shape != (n_sites,):
                raise InputError(
                    f"the stored eGLB online state's {k} has {v.size} sites, the plan {n_sites}",
                    hint="the sites file changed its sites: plan it again (`greenctl plan geo`)",
                )
        return state


_STATE_ARRAYS = (
    "gamma_carbon",
    "gamma_water",
    "zc_max",
    "zw_max",
    "past_carbon_kg",
    "past_water_l",
)
ONLINE_ALGORITHMS = ("eglb", "eglb-mpc")


def online_init(problem: GeoProblem, algorithm: str, opts: GeoOptions) -> OnlineState:
    """The state before step 0. ``eta`` defaults to the textbook online gradient step
    ``D / (G sqrt(T))`` with dual diameter ``D = 1`` (the duals of a max lie on the simplex)
    and gradient bound ``G = mean z_max x sqrt(2 S)`` (z_max of step 0, T the plan's steps).
    """
    T, S = problem.capacity_mw.shape
    bc0 = opts.mu_carbon_usd_per_kg * problem.carbon_kg_per_mw[0] * problem.capacity_mw[0]
    bw0 = opts.mu_water_usd_per_l * problem.water_l_per_mw[0] * problem.capacity_mw[0]
    if opts.z_max_usd is not None:
        bc0 = bw0 = np.full(S, float(opts.z_max_usd))
    if opts.eta is not None:
        eta = float(opts.eta)
    else:
        scale = float(np.mean(np.concatenate([bc0, bw0])))
        eta = 1.0 / (scale * math.sqrt(2 * S * T)) if scale > 0 else 0.0
    z = np.zeros(S)
    return OnlineState(algorithm, -1, eta, z, z, z, z, z, z)


def online_step(
    state: OnlineState,
    net: Network,
    opts: GeoOptions,
    *,
    cost: np.ndarray,
    carbon: np.ndarray,
    water: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    step_lp: StepLP | None = None,
) -> tuple[np.ndarray | None, OnlineState]:
    """One step of eglb (online dual mirror descent, Euclidean mirror map, gamma >= 0):

      1. allocate with prices ``a_t + gamma_c mu_c b_t + gamma_w mu_w q_t``;
      2. auxiliary targets ``z = argmin max z_c + max z_w - gamma . z`` on ``[0, z_max]``;
      3. ``gamma <- max(0, gamma + eta (B_t x_t - z))`` with ``B_t x_t`` the step's
         mu-weighted per-site footprints (USD).

    ``z_max`` is each site's largest possible per-step weighted footprint seen so far
    (``mu x capacity x intensity``, a running maximum) unless ``--z-max`` fixes it.

    Args:
        state: the state after the previous step (:func:`online_init` before the first).
        cost, carbon, water, cap: ``[S]`` per-MW cost (USD), carbon (kg), water (L) and
            capacity (MW) of this step; demand: ``[K]`` class loads (MW).
        step_lp: the routed step LP kept warm across steps (None: one built from the
            state's basis).

    Returns:
        The edge flows ``[E]`` (None: the step is infeasible) and the state after the step
        (``state`` itself is left as it was).
    """
    mu_c, mu_w = opts.mu_carbon_usd_per_kg, opts.mu_water_usd_per_l
    bc, bw = mu_c * carbon, mu_w * water
    if opts.z_max_usd is not None:
        zc_max = zw_max = np.full(cap.size, float(opts.z_max_usd))
    else:
        zc_max = np.maximum(state.zc_max, bc * cap)
        zw_max = np.maximum(state.zw_max, bw * cap)
    gc, gw = state.gamma_carbon, state.gamma_water
    price = cost + gc * bc + gw * bw
    basis = state.basis
    if net.full:
        order = np.argsort(price, kind="stable")
        cap_o = cap[order]
        y_o = np.clip(demand[0] - (np.cumsum(cap_o) - cap_o), 0.0, cap_o)
        f = np.empty(cap.size)
        f[order] = y_o
        y = f
    else:
        lp = step_lp if step_lp is not None else StepLP(net, basis=basis)
        got = lp.solve(price, cap, demand)
        if got is None:
            return None, state
        f = got
        y = np.asarray(np.bincount(net.edge_site, weights=f, minlength=cap.size), dtype=float)
        basis = None if step_lp is not None else lp.basis()  # kept warm by the caller
    zc = _aux_target(gc, zc_max)
    zw = _aux_target(gw, zw_max)
    return f, OnlineState(
        state.algorithm,
        state.slot + 1,
        state.eta,
        np.maximum(0.0, gc + state.eta * (bc * y - zc)),
        np.maximum(0.0, gw + state.eta * (bw * y - zw)),
        zc_max,
        zw_max,
        state.past_carbon_kg + carbon * y,
        state.past_water_l + water * y,
        state.accuracy_surplus,
        basis,
    )


def solve_online(
    problem: GeoProblem, net: Network, opts: GeoOptions, *, upto: int | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """eglb: :func:`online_step` over every step (seeing only steps <= t at step t).

    With ``upto`` only steps ``0 .. upto - 1`` are taken; ``info["state"]`` then holds the
    :class:`OnlineState` after them (what ``replan`` steps on from).
    """
    T = problem.capacity_mw.shape[0]
    n = T if upto is None else max(0, min(int(upto), T))
    a = problem.cost_usd_per_mw
    b, q = problem.carbon_kg_per_mw, problem.water_l_per_mw
    cap = problem.capacity_mw
    state = online_init(problem, "eglb", opts)
    out = np.zeros((n, net.n_edges))
    step_lp = None if net.full else StepLP(net)
    for t in range(n):
        f, state = online_step(
            state, net, opts, cost=a[t], carbon=b[t], water=q[t], cap=cap[t],
            demand=net.demand[t], step_lp=step_lp,
        )  # fmt: skip
        if f is None:
            raise _first_infeasible_step(problem, net)
        out[t] = f
    info: dict[str, Any] = {
        "eta": state.eta,
        "gamma_carbon_final": state.gamma_carbon.tolist(),
        "gamma_water_final": state.gamma_water.tolist(),
    }
    if upto is not None:
        if step_lp is not None:
            state.basis = step_lp.basis()
        info["state"] = state
    return out, info


def online_step_variants(
    state: OnlineState,
    net: Network,
    opts: GeoOptions,
    *,
    cuts: list[tuple[np.ndarray, np.ndarray]],
    cost: np.ndarray,
    carbon: np.ndarray,
    water: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    warm: dict[str, Any] | None = None,
) -> tuple[np.ndarray | None, OnlineState]:
    """One step of eglb with heterogeneous models: :func:`online_step`'s dual mirror
    descent, the allocation a small LP over sites x variants (:func:`solve_site_lp`) with the
    dual-adjusted prices, its capacity in power and the accuracy constraint carried over from
    the past (the step may fall below ``--min-accuracy`` only by the surplus banked so far,
    ``state.accuracy_surplus``), so the horizon's load-weighted mean accuracy meets it. The
    duals move with the step's power (``sum_m rho_m z``), not its request load.

    Args:
        cuts: the network's Hall cuts (:func:`hall_cuts`; ``[]`` with every route).
        warm: the site LP kept warm across steps by the caller (None: one started from the
            state's stored basis, and the new basis stored in the returned state).

    Returns:
        The ``[S, M]`` variant loads (reference MW; None: the step is infeasible) and the
        state after the step (``state`` itself is left as it was).
    """
    v = opts.variants
    assert v is not None
    mu_c, mu_w = opts.mu_carbon_usd_per_kg, opts.mu_water_usd_per_l
    bc, bw = mu_c * carbon, mu_w * water
    if opts.z_max_usd is not None:
        zc_max = zw_max = np.full(cap.size, float(opts.z_max_usd))
    else:
        zc_max = np.maximum(state.zc_max, bc * cap)
        zw_max = np.maximum(state.zw_max, bw * cap)
    gc, gw = state.gamma_carbon, state.gamma_water
    price = cost + gc * bc + gw * bw
    own = warm is None
    lp_warm = site_lp_warm_from_state(state.basis) if warm is None else warm
    res = solve_site_lp(
        net, cuts, price[None, :], cap[None, :], demand[None, :], options=SMALL_LP_OPTIONS,
        **opts.variant_kw(), past_accuracy_surplus=state.accuracy_surplus, warm=lp_warm,
    )  # fmt: skip
    if res.status != "Optimal" or res.variant_load is None:
        return None, state
    z = res.variant_load[0]
    surplus = state.accuracy_surplus
    if opts.min_accuracy is not None:
        surplus += float(((v.accuracy - opts.min_accuracy) * z).sum())
    power = (z * v.relative_energy).sum(axis=1)
    zc = _aux_target(gc, zc_max)
    zw = _aux_target(gw, zw_max)
    return z, OnlineState(
        state.algorithm,
        state.slot + 1,
        state.eta,
        np.maximum(0.0, gc + state.eta * (bc * power - zc)),
        np.maximum(0.0, gw + state.eta * (bw * power - zw)),
        zc_max,
        zw_max,
        state.past_carbon_kg + carbon * power,
        state.past_water_l + water * power,
        surplus,
        site_lp_warm_state(lp_warm) if own else None,  # else kept warm by the caller
    )


def variant_cuts(net: Network) -> list[tuple[np.ndarray, np.ndarray]]:
    """The Hall cuts the variants' site LP needs.

    Raises:
        InputError: more distinct route sets than cuts allow.
    """
    cuts = [] if net.full else hall_cuts(net)
    if cuts is None:
        raise InputError(
            "--variants with these routes: too many distinct route sets",
            hint="use fewer distinct allowed-site sets per gateway",
        )
    return cuts


def solve_online_variants(
    problem: GeoProblem, net: Network, opts: GeoOptions, *, upto: int | None = None
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """eglb with heterogeneous models: :func:`online_step_variants` over every step (one
    HiGHS instance, each step starting from the last step's basis).

    With ``upto`` only steps ``0 .. upto - 1`` are taken; ``info["state"]`` then holds the
    :class:`OnlineState` after them, with the site LP's basis (what ``replan`` steps on
    from, in another process, as this loop would have).

    Returns:
        ``[n, S]`` request loads, ``[n, S, M]`` variant loads and ``info``.
    """
    assert opts.variants is not None
    T, S = problem.capacity_mw.shape
    n = T if upto is None else max(0, min(int(upto), T))
    M = len(opts.variants.names)
    a, b, q = problem.cost_usd_per_mw, problem.carbon_kg_per_mw, problem.water_l_per_mw
    cap = problem.capacity_mw
    cuts = variant_cuts(net)
    state = online_init(problem, "eglb", opts)
    y_out = np.zeros((n, S))
    z_out = np.zeros((n, S, M))
    warm: dict[str, Any] = {}  # one HiGHS instance, each step starts from the last basis
    for t in range(n):
        z, state = online_step_variants(
            state, net, opts, cuts=cuts, cost=a[t], carbon=b[t], water=q[t], cap=cap[t],
            demand=net.demand[t], warm=warm,
        )  # fmt: skip
        if z is None:
            raise _infeasible(problem, net, opts)
        z_out[t], y_out[t] = z, z.sum(axis=1)
    info: dict[str, Any] = {"eta": state.eta}
    if upto is not None:
        state.basis = site_lp_warm_state(warm)
        info["state"] = state
    return y_out, z_out, info


@dataclass
class OnlineStep:
    """What :func:`online_replan` decided for one slot."""

    slot: int
    #: each gateway's share per site in the slot (gateways without load absent)
    fractions: dict[str, dict[str, float]]
    site_load_mw: np.ndarray  # [S] power (as GeoSolution.site_load_mw)
    state: OnlineState  # after the slot (store it for the next one)
    warm: bool  # stepped on from the given state (False: rebuilt from step 0)
    steps: int  # online steps taken (1 when the state was the previous slot's)
    #: with variants: ``[S, M]`` load per site and variant (reference MW)
    variant_load: np.ndarray | None = None


def online_replan(
    problem: GeoProblem,
    algorithm: str,
    opts: GeoOptions,
    *,
    slot: int,
    state: OnlineState | None = None,
) -> OnlineStep:
    """eGLB's online decision for step ``slot`` from ``state`` (the state after an earlier
    step, as a previous call returned it): the steps after ``state.slot`` up to ``slot``
    (one when it is the previous slot's), on ``problem``'s newest traces. Without a usable
    state (None, another algorithm, or one at or past ``slot``) the state is rebuilt by
    the same algorithm over steps ``0 .. slot - 1``, so on unchanged traces the slot's
    allocation is the whole-horizon solve's. Plans with heterogeneous models (``variants``)
    step the same way (:func:`online_step_variants`; the state carries the accuracy surplus
    and the site LP's basis).

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
                raise _step_infeasible(problem, t, opts)
        elif algorithm == "eglb":  # variants: the state carries the site LP's basis
            z, state = online_step_variants(
                state, net, opts, cuts=cuts_v, cost=a[t], carbon=b[t], water=q[t],
                cap=cap[t], demand=net.demand[t],
            )  # fmt: skip
            if z is None:
                raise _step_infeasible(problem, t, opts)
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


def _step_infeasible(problem: GeoProblem, t: int, opts: GeoOptions) -> InfeasiblePlan:
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


def _forecast_index(t: int, length: int, mode: str, period: int) -> np.ndarray:
    """Which observed step stands in for each of steps ``t .. t+length-1``."""
    tau = np.arange(t, t + length)
    if mode == "oracle":
        return tau
    if mode == "persistence":
        return np.full(length, t)
    # seasonal: the same phase in the most recent period already seen (<= t)
    back = period * np.ceil((tau - t) / period).astype(np.int64)
    src = tau - back
    return np.where(src >= 0, src, t)


def mpc_step(
    state: OnlineState,
    problem: GeoProblem,
    net: Network,
    opts: GeoOptions,
    *,
    cuts: list[tuple[np.ndarray, np.ndarray]] | None,
    warm: dict[str, Any] | None = None,
) -> tuple[np.ndarray, np.ndarray | None, float, OnlineState]:
    """One step of eglb-mpc at step ``state.slot + 1``: the eGLB LP over the next
    ``horizon`` steps (forecast from ``problem``'s traces, see :func:`solve_mpc`), counting
    the footprint already spent, and its first step applied.

    Args:
        warm: the window LP kept warm across steps by the caller (None: one started from the
            state's stored basis, and the new basis stored in the returned state).

    Returns:
        (``[S]`` site loads, ``[S, M]`` variant loads or None, LP seconds, the new state).

    Raises:
        InputError: variants with too many route sets. InfeasiblePlan: the window cannot
        be served.
    """
    t = state.slot + 1
    T, S = problem.capacity_mw.shape
    H = max(1, int(opts.horizon))
    period = max(1, round(24.0 / problem.step_h))
    src = _forecast_index(t, min(H, T - t), opts.forecast, period)
    a, b, q = problem.cost_usd_per_mw, problem.carbon_kg_per_mw, problem.water_l_per_mw
    cap = problem.capacity_mw
    v = opts.variants
    kw: dict[str, Any] = dict(
        carbon=b[src],
        water=q[src],
        mu_carbon=opts.mu_carbon_usd_per_kg,
        mu_water=opts.mu_water_usd_per_l,
        past_carbon=state.past_carbon_kg,
        past_water=state.past_water_l,
        options=SMALL_LP_OPTIONS,
    )
    surplus = state.accuracy_surplus
    own = warm is None and cuts is not None
    basis = None
    if cuts is not None:
        lp_warm = site_lp_warm_from_state(state.basis) if warm is None else warm
        res = solve_site_lp(
            net, cuts, a[src], cap[src], net.demand[src], **kw, **opts.variant_kw(),
            past_accuracy_surplus=surplus, warm=lp_warm,
        )  # fmt: skip
        if own:
            basis = site_lp_warm_state(lp_warm)
        if res.status != "Optimal":
            raise _infeasible(problem, net, opts)
        y = res.flow[0]
    else:
        res = solve_flow_lp(net, a[src], cap[src], net.demand[src], **kw)
        if res.status != "Optimal":
            raise _first_infeasible_step(problem, net)
        y = np.bincount(net.edge_site, weights=res.flow[0], minlength=S)
    power, z = y, None
    if v is not None and res.variant_load is not None:
        z = res.variant_load[0]
        power = (z * v.relative_energy).sum(axis=1)
        if opts.min_accuracy is not None:
            surplus += float(((v.accuracy - opts.min_accuracy) * z).sum())
    new = OnlineState(
        state.algorithm, t, state.eta, state.gamma_carbon, state.gamma_water, state.zc_max,
        state.zw_max, state.past_carbon_kg + b[t] * power, state.past_water_l + q[t] * power,
        surplus, basis,
    )  # fmt: skip
    return y, z, res.solve_s, new


def mpc_cuts(net: Network, opts: GeoOptions) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The Hall cuts eglb-mpc's site-load LP needs (None: the flow LP instead).

    Raises:
        InputError: variants with more route sets than cuts allow.
    """
    cuts = [] if net.full else hall_cuts(net)
    if cuts is None and opts.variants is not None:
        raise InputError("--variants with these routes: too many distinct route sets")
    return cuts


def solve_mpc(
    problem: GeoProblem, net: Network, opts: GeoOptions, *, upto: int | None = None
) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """eglb-mpc: per step, solve the eGLB LP over the next ``horizon`` steps (forecast),
    counting the footprint already spent, and apply the first step (:func:`mpc_step`).

    Forecasts move price, carbon, water, capacity and load together (``oracle``: the true
    future; ``persistence``: the present repeated; ``seasonal``: the same hour one period
    (24 h) earlier, or the present when there is no such hour yet). The present step is
    always known exactly. With ``upto`` only steps ``0 .. upto - 1`` are taken and
    ``info["state"]`` holds the :class:`OnlineState` after them.
    """
    T, S = problem.capacity_mw.shape
    n = T if upto is None else max(0, min(int(upto), T))
    v = opts.variants
    out = np.zeros((n, S))
    zs = np.zeros((n, S, len(v.names))) if v is not None else None
    lp_s = 0.0
    cuts = mpc_cuts(net, opts)
    warm: dict[str, Any] = {}  # one HiGHS instance, each window starts from the last basis
    state = online_init(problem, "eglb-mpc", opts)
    for t in range(n):
        out[t], z, dt, state = mpc_step(state, problem, net, opts, cuts=cuts, warm=warm)
        lp_s += dt
        if zs is not None and z is not None:
            zs[t] = z
    info: dict[str, Any] = {"horizon": max(1, int(opts.horizon)), "forecast": opts.forecast,
                            "lp_s": lp_s}  # fmt: skip
    if upto is not None:
        state.basis = site_lp_warm_state(warm)
        info["state"] = state
    return out, zs, info


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
            raise _first_infeasible_step(problem, net)
        flow[steps] = res.flow
    return net, flow


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
        raise _infeasible(problem, net, opts)
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
        y, z = _min_total(problem, net, a, opts)
    elif algorithm == "glb-carbon":
        y, z = _min_total(problem, net, b, opts)
    elif algorithm == "glb-water":
        y, z = _min_total(problem, net, q, opts)
    elif algorithm == "glb-c2":
        y, z = _min_total(problem, net, a + wc * b, opts)
        info = {"weight_carbon_usd_per_kg": wc}
    else:  # glb-all
        y, z = _min_total(problem, net, a + wc * b + ww * q, opts)
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


def run_geo(
    problem: GeoProblem,
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
    model: str = "default",
    variant: str = "default",
    variants: GeoVariants | None = None,
    min_accuracy: float | None = None,
) -> GeoRun:
    """Plan geographical load balancing with one algorithm, or ``all`` of them.

    With ``variants`` (heterogeneous models) each site may serve its load with any
    allowed variant; ``min_accuracy`` bounds the load-weighted mean accuracy over the
    horizon. Sites then list ``variant_load_mwh`` and the summary ``accuracy_mean``;
    deployments are one per site and variant that serves load.

    Returns:
        The ``geo`` plan (``sites``, ``summary`` and, with ``all``, ``algorithms`` in
        ``plan.extra``; one deployment per site) and each algorithm's solution.

    Raises:
        InputError: bad options. InfeasiblePlan: a step that cannot be served.
    """
    opts = check_options(
        algorithm=algorithm,
        mu_carbon=mu_carbon,
        mu_water=mu_water,
        eta=eta,
        z_max=z_max,
        horizon=horizon,
        forecast=forecast,
        weight_carbon=weight_carbon,
        weight_water=weight_water,
        variants=variants,
        min_accuracy=min_accuracy,
    )
    names = list(ALGORITHMS) if algorithm == "all" else [algorithm]
    solutions: dict[str, GeoSolution] = {}
    notes: list[str] = []
    for name in names:
        try:
            solutions[name] = solve(problem, name, opts)
        except InputError as exc:
            if algorithm != "all" or name != "nearest":
                raise
            notes.append(f"nearest skipped: {exc.message}")
    main = solutions["eglb-off" if algorithm == "all" else algorithm]
    blocks: dict[str, dict[str, Any]] = {}
    for name, sol in solutions.items():
        sites, summary = evaluate(problem, sol.site_load_mw, mu_carbon=mu_carbon, mu_water=mu_water)
        if variants is not None and sol.variant_load is not None:
            _add_variants(problem, sol, variants, sites, summary)
        blocks[name] = {"sites": sites, "summary": summary, "solve_s": sol.solve_s}
        if sol.info:
            blocks[name]["info"] = sol.info
    sites, summary = blocks[main.algorithm]["sites"], blocks[main.algorithm]["summary"]
    wc, ww = opts.weights(len(problem.sites))
    request = {
        "algorithm": algorithm,
        **problem.sources,
        "mu_carbon_usd_per_kg": mu_carbon,
        "mu_water_usd_per_l": mu_water,
        "eta": eta,
        "z_max_usd": z_max,
        "horizon": horizon,
        "forecast": forecast,
        "weight_carbon_usd_per_kg": wc,
        "weight_water_usd_per_l": ww,
        "model": model,
        "variant": variant,
        "n_steps": problem.n_steps,
        "step_h": problem.step_h,
        "n_sites": len(problem.sites),
        "n_gateways": len(problem.gateways),
        "start": problem.times[0],
    }
    if variants is not None:
        request["variants"] = variants.source
        request["variant_names"] = variants.names
        request["min_accuracy"] = min_accuracy
    peak = main.site_load_mw.max(axis=0)
    deployments = [
        Deployment(
            model=model,
            variant=variant,
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
    if variants is not None and main.variant_load is not None:
        deployments = [
            Deployment(
                model=model,
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
    extra: dict[str, Any] = {
        "algorithm": main.algorithm,
        "basis": "modeled from the input price, carbon and water traces",
        "sites": sites,
        "summary": summary,
        "solve_s": main.solve_s,
    }
    if algorithm == "all":
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
        kind="geo", request=request, deployments=deployments, predicted=predicted, extra=extra
    )
    return GeoRun(plan=plan, problem=problem, solutions=solutions, notes=notes, variants=variants)


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
