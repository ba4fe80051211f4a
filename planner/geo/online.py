"""Online eGLB: dual mirror descent, one step at a time, with or without model variants.

Per step a min-cost allocation at prices adjusted by the duals of the footprint rows,
the auxiliary targets in closed form, and a projected dual update; the state carries the
duals and the footprint so far, so a step can resume from a saved state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.geo_io import GeoProblem
from greenctl.planner.geo.lp import (
    SMALL_LP_OPTIONS,
    Network,
    StepLP,
    hall_cuts,
    site_lp_warm_from_state,
    site_lp_warm_state,
    solve_site_lp,
)
from greenctl.planner.geo.model import (
    GeoOptions,
    first_infeasible_step,
    infeasible_error,
)


def aux_target(gamma: np.ndarray, z_max: np.ndarray) -> np.ndarray:
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
    """One step of eglb: online dual mirror descent (Euclidean mirror map, duals gamma >= 0).

    Allocates with dual-adjusted prices, sets auxiliary footprint targets ``z`` on
    ``[0, z_max]`` and moves gamma by the step's mu-weighted per-site footprints; the update is
    in docs/models.md ("Online eGLB"). ``cost``, ``carbon``, ``water``, ``cap`` are this step's
    ``[S]`` per-MW figures, ``demand`` the ``[K]`` class loads (MW); ``step_lp`` is the routed
    step LP kept warm (None: built from the state's basis).

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
    zc = aux_target(gc, zc_max)
    zw = aux_target(gw, zw_max)
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
            raise first_infeasible_step(problem, net)
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
    """One step of eglb with heterogeneous models: :func:`online_step` over sites x variants.

    The allocation is a small LP (:func:`solve_site_lp`) with the dual-adjusted prices and
    capacity in power; a step may fall below ``--min-accuracy`` only by the surplus banked so
    far (``state.accuracy_surplus``), so the horizon's load-weighted mean accuracy meets it. The
    duals move with the step's power, not its request load. ``cuts``: the Hall cuts; ``warm``:
    the site LP kept warm (None: started from the state's stored basis).

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
    zc = aux_target(gc, zc_max)
    zw = aux_target(gw, zw_max)
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
            raise infeasible_error(problem, net, opts)
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
