"""eGLB by model-predictive control: a receding horizon over forecasts of the traces,
counting the footprint spent so far, applying the first step of each plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from greenctl.data.errors import InputError
from greenctl.data.geo_io import GeoProblem
from greenctl.planner.geo.lp import (
    SMALL_LP_OPTIONS,
    Network,
    hall_cuts,
    site_lp_warm_from_state,
    site_lp_warm_state,
    solve_flow_lp,
    solve_site_lp,
)
from greenctl.planner.geo.model import (
    GeoOptions,
    first_infeasible_step,
    infeasible_error,
)
from greenctl.planner.geo.online import (
    OnlineState,
    online_init,
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
    """One step of eglb-mpc: the eGLB LP over the next ``horizon`` steps, its first step applied.

    The window is forecast from ``problem``'s traces (:func:`solve_mpc`) and counts the footprint
    already spent. ``warm`` is the window LP kept warm by the caller (None: one started from the
    state's stored basis, the new basis stored in the returned state).

    Returns:
        (``[S]`` site loads, ``[S, M]`` variant loads or None, LP seconds, the new state).
    Raises:
        InputError: variants with too many route sets.
        InfeasiblePlan: the window cannot be served.
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
            raise infeasible_error(problem, net, opts)
        y = res.flow[0]
    else:
        res = solve_flow_lp(net, a[src], cap[src], net.demand[src], **kw)
        if res.status != "Optimal":
            raise first_infeasible_step(problem, net)
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
