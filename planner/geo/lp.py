"""Linear programs of geographical load balancing, built straight into HiGHS (highspy).

The offline problem has tens of thousands of variables with at most four matrix entries
each: numpy arrays build the column-wise matrix in a few operations where pulp would spend
seconds on expression objects, and unlike scipy's ``linprog`` highspy can warm-start the
online per-step problem. The problems stay small because flows are per *gateway class*
(gateways with the same allowed sites are interchangeable) and the minimax terms use one
epigraph variable per resource; see docs/models.md ("Geographical load balancing LPs").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from greenctl.planner.core import solvers

INF = float("inf")


@dataclass
class Network:
    """Gateway classes and the (class, site) edges that carry flow.

    ``demand`` is ``[T, K]``: the summed load of each class. ``full`` is True when there is
    one class that may use every site (no routes, or routes allowing every pair).
    """

    gateway_class: np.ndarray  # [G] class index of each gateway
    class_sites: list[np.ndarray]  # allowed site indices of each class
    edge_class: np.ndarray  # [E]
    edge_site: np.ndarray  # [E]
    demand: np.ndarray  # [T, K]
    n_sites: int
    full: bool

    @property
    def n_classes(self) -> int:
        return len(self.class_sites)

    @property
    def n_edges(self) -> int:
        return int(self.edge_site.size)

    def site_load(self, flow: np.ndarray) -> np.ndarray:
        """``[T, S]`` site loads of ``[T, E]`` edge flows."""
        if self.full:
            return flow
        y = np.zeros((flow.shape[0], self.n_sites))
        for s in range(self.n_sites):
            cols = np.flatnonzero(self.edge_site == s)
            if cols.size:
                y[:, s] = flow[:, cols].sum(axis=1)
        return y


def build_network(
    load_mw: np.ndarray, n_sites: int, routes: np.ndarray | None, *, aggregate: bool = True
) -> Network:
    """Group gateways by their allowed site set (``aggregate``) and list the edges."""
    G = load_mw.shape[1]
    if routes is None:
        routes = np.ones((G, n_sites), dtype=bool)
    keys: dict[bytes, int] = {}
    gateway_class = np.empty(G, dtype=np.int64)
    class_sites: list[np.ndarray] = []
    for g in range(G):
        key = routes[g].tobytes() if aggregate else bytes(str(g), "ascii")
        k = keys.get(key)
        if k is None:
            k = keys[key] = len(class_sites)
            class_sites.append(np.flatnonzero(routes[g]))
        gateway_class[g] = k
    K = len(class_sites)
    demand = np.zeros((load_mw.shape[0], K))
    for k in range(K):
        demand[:, k] = load_mw[:, gateway_class == k].sum(axis=1)
    edge_class = np.concatenate([np.full(s.size, k) for k, s in enumerate(class_sites)])
    edge_site = np.concatenate(class_sites)
    full = K == 1 and class_sites[0].size == n_sites
    return Network(gateway_class, class_sites, edge_class, edge_site, demand, n_sites, full)


@dataclass
class LPResult:
    flow: np.ndarray  # [H, E] edge flows, or [H, S] site loads (solve_site_lp)
    objective: float
    status: str
    solve_s: float
    variant_load: np.ndarray | None = None  # [H, S, M] with variants


def _colwise_lp(
    col_cost: Any, col_lower: Any, col_upper: Any, row_lower: Any, row_upper: Any,
    start: Any, index: Any, value: Any,
) -> Any:  # fmt: skip
    """A highspy LP from column-wise (CSC) arrays; the one place that fills ``HighsLp``."""
    import highspy

    n_cols, n_rows = len(col_cost), len(row_lower)
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = n_rows
    lp.col_cost_ = np.asarray(col_cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(col_lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(col_upper, dtype=np.float64)
    lp.row_lower_ = np.asarray(row_lower, dtype=np.float64)
    lp.row_upper_ = np.asarray(row_upper, dtype=np.float64)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.num_col_ = n_cols
    lp.a_matrix_.num_row_ = n_rows
    lp.a_matrix_.start_ = np.asarray(start, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=np.float64)
    return lp


# Small LPs (one MPC window): presolve costs more than it saves. (Threads: one count for
# the whole process, see greenctl.planner.core.solvers.)
SMALL_LP_OPTIONS: dict[str, object] = {"presolve": "off"}


def _status(h: Any, what: str) -> str:
    """HiGHS's model status text when it is optimal or infeasible; raises a solver failure
    (exit 1) for anything else (see :func:`solvers.highs_outcome`)."""
    solvers.highs_outcome(h, what=what)
    return str(h.modelStatusToString(h.getModelStatus()))


def solve_flow_lp(
    net: Network,
    cost: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    *,
    carbon: np.ndarray | None = None,
    water: np.ndarray | None = None,
    mu_carbon: float = 0.0,
    mu_water: float = 0.0,
    past_carbon: np.ndarray | None = None,
    past_water: np.ndarray | None = None,
    options: dict[str, object] | None = None,
    edge_cost: np.ndarray | None = None,
) -> LPResult:
    """Minimise sum cost x + mu_c max_s(past_c + sum b x) + mu_w max_s(past_w + sum q x).

    ``cost``, ``cap``, ``carbon``, ``water`` are ``[H, S]`` per-MW cost (USD), capacity (MW),
    carbon (kg) and water (L) per step and site; ``demand`` is ``[H, K]`` class loads (MW);
    ``mu_*`` price the largest site's carbon (USD/kg) and water (USD/L), 0 dropping the term;
    ``past_*`` are ``[S]`` footprints already spent; ``edge_cost`` (``[H, E]``) replaces ``cost``.

    Returns:
        The edge flows, meaningful only when ``status`` (HiGHS's model status) is ``Optimal``.
    Raises:
        GreenctlError: HiGHS failed (any other status; exit 1, not an infeasible plan).
    """
    lp = _flow_lp_model(
        net, cost, cap, demand, carbon=carbon, water=water, mu_carbon=mu_carbon,
        mu_water=mu_water, past_carbon=past_carbon, past_water=past_water, edge_cost=edge_cost,
    )  # fmt: skip
    H, E, n = cost.shape[0], net.n_edges, cost.shape[0] * net.n_edges
    h = solvers.new_highs(options)
    h.passModel(lp)
    t0 = time.perf_counter()
    h.run()
    solve_s = time.perf_counter() - t0
    status = _status(h, "the geo flow LP")
    if status != "Optimal":
        return LPResult(np.zeros((H, E)), float("nan"), status, solve_s)
    x = np.asarray(h.getSolution().col_value)[:n]
    flow = np.clip(x, 0.0, None).reshape(H, E)
    return LPResult(flow, float(h.getInfo().objective_function_value), status, solve_s)


def _flow_lp_model(
    net: Network,
    cost: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    *,
    carbon: np.ndarray | None,
    water: np.ndarray | None,
    mu_carbon: float,
    mu_water: float,
    past_carbon: np.ndarray | None,
    past_water: np.ndarray | None,
    edge_cost: np.ndarray | None,
) -> Any:
    """The flow LP, column by column: a column per step and edge (its entries in the demand,
    capacity and footprint rows), then the two footprint maxima."""
    H, S = cost.shape
    E, K = net.n_edges, net.n_classes
    es, ec = net.edge_site, net.edge_class
    use_c = mu_carbon > 0 and carbon is not None
    use_w = mu_water > 0 and water is not None
    # capacity rows only for sites reached by two or more edges; else the bound suffices
    indeg = np.bincount(es, minlength=S)
    cap_sites = np.flatnonzero(indeg >= 2)
    Sc = cap_sites.size
    cidx = np.full(S, -1)
    cidx[cap_sites] = np.arange(Sc)
    n = H * E
    t = np.repeat(np.arange(H), E)
    e = np.tile(np.arange(E), H)
    s = es[e]
    r_dem = t * K + ec[e]
    r_cap0 = H * K
    r_c0 = r_cap0 + H * Sc
    r_w0 = r_c0 + (S if use_c else 0)
    n_rows = r_w0 + (S if use_w else 0)
    slots_r = [r_dem]
    slots_v = [np.ones(n)]
    masks = [np.ones(n, dtype=bool)]
    has_cap = cidx[s] >= 0
    slots_r.append(np.where(has_cap, r_cap0 + t * Sc + cidx[s], 0))
    slots_v.append(np.ones(n))
    masks.append(has_cap)
    if use_c:
        assert carbon is not None
        slots_r.append(r_c0 + s)
        slots_v.append(carbon[t, s])
        masks.append(np.ones(n, dtype=bool))
    if use_w:
        assert water is not None
        slots_r.append(r_w0 + s)
        slots_v.append(water[t, s])
        masks.append(np.ones(n, dtype=bool))
    R = np.stack(slots_r, axis=1)
    V = np.stack(slots_v, axis=1)
    M = np.stack(masks, axis=1)
    counts = M.sum(axis=1)
    index = [R[M]]
    value = [V[M]]
    start = [np.concatenate([[0], np.cumsum(counts)])]
    n_cols = n
    col_cost = [cost[t, s] if edge_cost is None else edge_cost.reshape(-1)]
    col_upper = [cap[t, s]]
    nnz = int(start[0][-1])
    for used, r0, mu in ((use_c, r_c0, mu_carbon), (use_w, r_w0, mu_water)):
        if used:
            index.append(r0 + np.arange(S))
            value.append(-np.ones(S))
            nnz += S
            start.append(np.array([nnz]))
            col_cost.append(np.array([mu]))
            col_upper.append(np.array([INF]))
            n_cols += 1
    row_lower = np.empty(n_rows)
    row_upper = np.empty(n_rows)
    row_lower[:r_cap0] = row_upper[:r_cap0] = demand.reshape(-1)
    row_lower[r_cap0:r_c0] = -INF
    row_upper[r_cap0:r_c0] = cap[:, cap_sites].reshape(-1)
    if use_c:
        row_lower[r_c0:r_w0] = -INF
        row_upper[r_c0:r_w0] = -(past_carbon if past_carbon is not None else np.zeros(S))
    if use_w:
        row_lower[r_w0:] = -INF
        row_upper[r_w0:] = -(past_water if past_water is not None else np.zeros(S))

    lp = _colwise_lp(
        np.concatenate(col_cost), np.zeros(n_cols), np.concatenate(col_upper), row_lower,
        row_upper, np.concatenate(start), np.concatenate(index), np.concatenate(value),
    )  # fmt: skip
    return lp


def hall_cuts(net: Network, *, max_cuts: int = 64) -> list[tuple[np.ndarray, np.ndarray]] | None:
    """The distinct unions ``U`` of class site sets, each with the classes inside it.

    Site loads ``y`` (with ``sum y = total load`` and ``y = 0`` at unreachable sites) can be
    carried by routed flows exactly when ``y(U) >= load of the classes whose sites all lie
    in U`` for every such union (Gale's supply-demand theorem: for a class set ``A`` it is
    enough to check ``U = N(A)``, and the classes inside ``N(A)`` include ``A``). Returns
    ``[(site mask, class mask), ...]`` without the union of all classes, or None when there
    are more than ``max_cuts`` unions (then the flow formulation is the smaller one).
    """
    S = net.n_sites
    masks = []
    for sites in net.class_sites:
        m = np.zeros(S, dtype=bool)
        m[sites] = True
        masks.append(m)
    everything = np.logical_or.reduce(masks)
    seen = {np.zeros(S, dtype=bool).tobytes(), everything.tobytes()}
    frontier = [np.zeros(S, dtype=bool)]
    unions: list[np.ndarray] = []
    while frontier:
        new = []
        for u in frontier:
            for m in masks:
                v = u | m
                key = v.tobytes()
                if key not in seen:
                    seen.add(key)
                    new.append(v)
                    unions.append(v)
                    if len(unions) > max_cuts:
                        return None
        frontier = new
    return [(u, np.array([not (m & ~u).any() for m in masks])) for u in unions]


@dataclass(frozen=True)
class SiteTerms:
    """What :func:`solve_site_lp` adds to the plain min-cost site loads (its keywords).

    Attributes:
        carbon / water: ``[H, S]`` footprint per MW and step; with ``mu_carbon`` /
            ``mu_water`` > 0 the largest site's total over the window (plus ``past_carbon``
            / ``past_water``, ``[S]``) is priced at that rate.
        options: HiGHS options for a fresh solver.
        relative_energy: ``[M]`` power per unit of load relative to the reference variant
            (heterogeneous models); ``accuracy`` ``[M]``, ``allowed`` ``[M, S]``.
        min_accuracy: a floor on the load-weighted mean accuracy over the window plus the
            past (``past_accuracy_surplus``: sum over past load of accuracy - min_accuracy).
    """

    carbon: np.ndarray | None = None
    water: np.ndarray | None = None
    mu_carbon: float = 0.0
    mu_water: float = 0.0
    past_carbon: np.ndarray | None = None
    past_water: np.ndarray | None = None
    options: dict[str, object] | None = None
    relative_energy: np.ndarray | None = None
    accuracy: np.ndarray | None = None
    allowed: np.ndarray | None = None
    min_accuracy: float | None = None
    past_accuracy_surplus: float = 0.0


@dataclass(frozen=True)
class _SiteShape:
    """The site LP's sizes and which rows it has (the warm start's key)."""

    H: int
    S: int
    M: int
    Mc: int
    use_c: bool
    use_w: bool
    use_a: bool
    n_cols: int
    n_rows: int

    @property
    def key(self) -> tuple[int, int, int, int, bool, bool, bool]:
        return (self.H, self.S, self.M, self.Mc, self.use_c, self.use_w, self.use_a)


def solve_site_lp(
    net: Network,
    cuts: list[tuple[np.ndarray, np.ndarray]],
    cost: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    terms: SiteTerms | None = None,
    *,
    warm: dict[str, Any] | None = None,
    **kwargs: Any,
) -> LPResult:
    """The same problem as :func:`solve_flow_lp` over ``[H, S]`` site loads (fewer variables).

    Flows become site loads with a ``sum y = load`` row and one Hall cut row per step and union
    (``cuts`` from :func:`hall_cuts`); :func:`recover_flows` turns ``LPResult.flow`` back into
    edge flows. ``terms`` (:class:`SiteTerms`; its fields as keywords win). With
    ``relative_energy`` the variables are ``z[t, s, m]`` (load served by variant m, reference
    MW), a site's power ``sum_m rho_m z`` fits its capacity and ``LPResult.variant_load`` holds
    ``z``. ``warm`` keeps the solver and basis between calls on windows of one shape.

    Raises:
        GreenctlError: HiGHS failed (neither optimal nor infeasible; exit 1).
    """
    tm = replace(terms, **kwargs) if terms is not None else SiteTerms(**kwargs)
    lp, shape = _site_lp_model(net, cuts, cost, cap, demand, tm)
    if warm is not None and warm.get("key") != shape.key:
        warm.clear()
    h = warm.get("highs") if warm else None
    if h is None:
        h = solvers.new_highs(tm.options)
    h.passModel(lp)
    if warm and "basis" in warm:
        _shifted_basis(
            h,
            warm["basis"],
            shape.H,
            shape.S,
            shape.M,
            shape.n_cols,
            shape.n_rows,
            shape.Mc,
            shape.M > 1,
        )
    t0 = time.perf_counter()
    h.run()
    solve_s = time.perf_counter() - t0
    status = _status(h, "the geo site-load LP")
    if warm is not None:
        warm["highs"] = h
        warm["key"] = shape.key
        if status == "Optimal":
            warm["basis"] = h.getBasis()
        else:
            warm.pop("basis", None)
    H, S, M = shape.H, shape.S, shape.M
    if status != "Optimal":
        return LPResult(np.zeros((H, S)), float("nan"), status, solve_s)
    z = np.clip(np.asarray(h.getSolution().col_value)[: H * S * M], 0.0, None).reshape(H, S, M)
    objective = float(h.getInfo().objective_function_value)
    if M == 1 and tm.relative_energy is None:
        return LPResult(z[:, :, 0], objective, status, solve_s)
    return LPResult(z.sum(axis=2), objective, status, solve_s, variant_load=z)


def _site_lp_model(
    net: Network,
    cuts: list[tuple[np.ndarray, np.ndarray]],
    cost: np.ndarray,
    cap: np.ndarray,
    demand: np.ndarray,
    tm: SiteTerms,
) -> tuple[Any, _SiteShape]:
    """The site LP, column by column: a column per step, site and variant (its entries in
    the demand, cut, capacity, footprint and accuracy rows), then the two footprint maxima."""
    H, S = cost.shape
    rho = np.ones(1) if tm.relative_energy is None else np.asarray(tm.relative_energy, float)
    M = rho.size
    acc = np.ones(M) if tm.accuracy is None else np.asarray(tm.accuracy, dtype=float)
    Mc = len(cuts)
    use_c = tm.mu_carbon > 0 and tm.carbon is not None
    use_w = tm.mu_water > 0 and tm.water is not None
    use_a = tm.min_accuracy is not None
    cap_rows = M > 1
    reach = np.zeros(S, dtype=bool)
    reach[net.edge_site] = True
    n = H * S * M
    t = np.repeat(np.arange(H), S * M)
    s = np.tile(np.repeat(np.arange(S), M), H)
    m = np.tile(np.arange(M), H * S)
    r_cap0 = H + H * Mc
    r_c0 = r_cap0 + (H * S if cap_rows else 0)
    r_w0 = r_c0 + (S if use_c else 0)
    r_a = r_w0 + (S if use_w else 0)
    n_rows = r_a + (1 if use_a else 0)
    ones = np.ones(n, dtype=bool)
    slots_r, slots_v, masks = [t], [np.ones(n)], [ones]
    for k, (u, _) in enumerate(cuts):
        slots_r.append(H + k * H + t)
        slots_v.append(np.ones(n))
        masks.append(u[s])
    if cap_rows:
        slots_r.append(r_cap0 + t * S + s)
        slots_v.append(rho[m])
        masks.append(ones)
    if use_c:
        assert tm.carbon is not None
        slots_r.append(r_c0 + s)
        slots_v.append(rho[m] * tm.carbon[t, s])
        masks.append(ones)
    if use_w:
        assert tm.water is not None
        slots_r.append(r_w0 + s)
        slots_v.append(rho[m] * tm.water[t, s])
        masks.append(ones)
    if use_a:
        assert tm.min_accuracy is not None
        slots_r.append(np.full(n, r_a))
        slots_v.append(acc[m] - tm.min_accuracy)
        masks.append(acc[m] != tm.min_accuracy)
    R = np.stack(slots_r, axis=1)
    V = np.stack(slots_v, axis=1)
    Mk = np.stack(masks, axis=1)
    index = [R[Mk]]
    value = [V[Mk]]
    start = [np.concatenate([[0], np.cumsum(Mk.sum(axis=1))])]
    nnz = int(start[0][-1])
    col_cost = [rho[m] * cost[t, s]]
    ok = reach[s] if tm.allowed is None else reach[s] & tm.allowed[m, s]
    col_upper = [np.where(ok, cap[t, s] / rho[m], 0.0)]
    n_cols = n
    for used, r0, mu in ((use_c, r_c0, tm.mu_carbon), (use_w, r_w0, tm.mu_water)):
        if used:
            index.append(r0 + np.arange(S))
            value.append(-np.ones(S))
            nnz += S
            start.append(np.array([nnz]))
            col_cost.append(np.array([mu]))
            col_upper.append(np.array([INF]))
            n_cols += 1
    row_lower = np.full(n_rows, -INF)
    row_upper = np.full(n_rows, INF)
    row_lower[:H] = row_upper[:H] = demand.sum(axis=1)
    for k, (_, inside) in enumerate(cuts):
        row_lower[H + k * H : H + (k + 1) * H] = demand[:, inside].sum(axis=1)
    if cap_rows:
        row_upper[r_cap0:r_c0] = cap.reshape(-1)
    if use_c:
        row_upper[r_c0:r_w0] = -(tm.past_carbon if tm.past_carbon is not None else np.zeros(S))
    if use_w:
        row_upper[r_w0:r_a] = -(tm.past_water if tm.past_water is not None else np.zeros(S))
    if use_a:
        row_lower[r_a] = -tm.past_accuracy_surplus
    lp = _colwise_lp(
        np.concatenate(col_cost), np.zeros(n_cols), np.concatenate(col_upper), row_lower,
        row_upper, np.concatenate(start), np.concatenate(index), np.concatenate(value),
    )  # fmt: skip
    shape = _SiteShape(H, S, M, Mc, use_c, use_w, use_a, n_cols, n_rows)
    return lp, shape


def _shifted_basis(
    h: Any, basis: Any, H: int, S: int, M: int, n_cols: int, n_rows: int, Mc: int, cap_rows: bool
) -> None:
    """Warm start a receding-horizon window from the previous window's optimal basis,
    moved one step earlier (the last step repeats the previous last step)."""
    import highspy

    cols = list(basis.col_status)
    rows = list(basis.row_status)
    if len(cols) != n_cols or len(rows) != n_rows:
        return

    def shift(block: list[Any], width: int) -> list[Any]:
        return block[width:] + block[len(block) - width :]

    new_cols = shift(cols[: H * S * M], S * M) + cols[H * S * M :]
    new_rows = shift(rows[:H], 1)
    for k in range(Mc):
        new_rows += shift(rows[H + k * H : H + (k + 1) * H], 1)
    r = H + Mc * H
    if cap_rows:
        new_rows += shift(rows[r : r + H * S], S)
        r += H * S
    new_rows += rows[r:]
    b = highspy.HighsBasis()
    b.col_status = new_cols
    b.row_status = new_rows
    h.setBasis(b)


def basis_to_ints(basis: Any) -> dict[str, list[int]] | None:
    """A HiGHS basis as plain ints (``{"col": [...], "row": [...]}``; None when it is not
    valid): what a stored online state keeps so that the next step, in another process,
    starts from it (:func:`basis_from_ints`)."""
    if basis is None or not basis.valid:
        return None
    return {"col": [int(x) for x in basis.col_status], "row": [int(x) for x in basis.row_status]}


def basis_from_ints(doc: dict[str, Any]) -> Any:
    """The HiGHS basis :func:`basis_to_ints` wrote."""
    import highspy

    b = highspy.HighsBasis()
    b.col_status = [highspy.HighsBasisStatus(int(x)) for x in doc.get("col") or []]
    b.row_status = [highspy.HighsBasisStatus(int(x)) for x in doc.get("row") or []]
    b.valid = True
    return b


def site_lp_warm_state(warm: dict[str, Any]) -> dict[str, Any] | None:
    """What :func:`solve_site_lp`'s ``warm`` holds, as plain values (the last optimal basis
    and the shape it fits; None before the first optimal solve): a stored online state keeps
    it so that a step in another process starts as the whole solve's step did
    (:func:`site_lp_warm_from_state`)."""
    ints = basis_to_ints(warm.get("basis"))
    if ints is None or "key" not in warm:
        return None
    return {**ints, "key": [int(k) for k in warm["key"]]}


def site_lp_warm_from_state(doc: dict[str, Any] | None) -> dict[str, Any]:
    """A ``warm`` dict for :func:`solve_site_lp` from :func:`site_lp_warm_state`'s values
    (empty, a cold start, from None or a basis of another LP)."""
    if not doc or not isinstance(doc.get("key"), list) or len(doc["key"]) != 7:
        return {}
    return {"basis": basis_from_ints(doc), "key": tuple(int(k) for k in doc["key"])}


def _tie_break_cost(n_edges: int) -> np.ndarray:
    """Generic positive edge costs for :func:`recover_flows` (fixed pseudo-random numbers in
    [1, 2): no cycle of edges sums to zero, as it would with a regular sequence): with them
    its LP has one optimum per step, so one step's flows are the same whether recovered
    alone (``replan``'s online step) or with every other step (the whole solve); a zero cost
    leaves HiGHS any vertex, which depends on the other steps' blocks."""
    return np.random.default_rng(20240601).uniform(1.0, 2.0, n_edges)


def recover_flows(net: Network, site_load: np.ndarray, cap: np.ndarray | None = None) -> np.ndarray:
    """``[T, E]`` edge flows that carry the classes' load onto the given site loads.

    A feasibility LP (site loads, never above ``cap``, as capacities; generic edge costs
    that pick one optimum per step, :func:`_tie_break_cost`), solved for all steps at once;
    the site loads must satisfy the Hall cuts (solutions of :func:`solve_site_lp` do, within
    LP tolerances).
    """
    if net.full:
        return site_load
    T, S = site_load.shape
    res = None
    tie = np.tile(_tie_break_cost(net.n_edges), (T, 1))
    for tol in (0.0, 1e-7, 1e-6, 1e-5):  # LP tolerances of the site-load solution
        bound = np.minimum(site_load + tol, cap) if cap is not None else site_load + tol
        res = solve_flow_lp(net, np.zeros((T, S)), bound, net.demand, edge_cost=tie)
        if res.status == "Optimal":
            # make every class's flows add up to its load exactly (not just within 1e-7)
            flow = res.flow
            for k in range(net.n_classes):
                cols = np.flatnonzero(net.edge_class == k)
                total = flow[:, cols].sum(axis=1, keepdims=True)
                scale = np.divide(
                    net.demand[:, [k]], total, out=np.ones_like(total), where=total > 0
                )
                flow[:, cols] *= scale
            return flow
    raise solvers.solver_failed(
        "routing the site loads to gateways", f"no routing found ({res.status if res else '?'})"
    )


class StepLP:
    """One step's min-cost allocation with routes, kept warm in HiGHS between steps.

    Only costs, bounds and right-hand sides change from step to step, so HiGHS restarts
    from the previous optimal basis and needs a handful of simplex iterations.
    """

    def __init__(self, net: Network, *, basis: dict[str, list[int]] | None = None) -> None:
        self.net = net
        S, E, K = net.n_sites, net.n_edges, net.n_classes
        es, ec = net.edge_site, net.edge_class
        indeg = np.bincount(es, minlength=S)
        self.cap_sites = np.flatnonzero(indeg >= 2)
        cidx = np.full(S, -1)
        cidx[self.cap_sites] = np.arange(self.cap_sites.size)
        starts, idx = [0], []
        for e in range(E):
            rows = [int(ec[e])]
            if cidx[es[e]] >= 0:
                rows.append(K + int(cidx[es[e]]))
            idx.extend(rows)
            starts.append(len(idx))
        n_rows = K + self.cap_sites.size
        lp = _colwise_lp(
            np.zeros(E), np.zeros(E), np.full(E, INF), np.zeros(n_rows), np.zeros(n_rows),
            starts, idx, np.ones(len(idx)),
        )  # fmt: skip
        # presolve off: warm starts skip it anyway. Primal simplex: from one step to the
        # next the previous optimum mostly stays a good primal start; on 100 route sets it
        # needs ~130 iterations a step where the dual simplex needs ~720 (bench_geo, scale
        # with routes).
        self.h = solvers.new_highs({"presolve": "off", "simplex_strategy": 4})
        self.h.passModel(lp)
        self.cols = np.arange(E, dtype=np.int32)
        self.rows = np.arange(n_rows, dtype=np.int32)
        self.E, self.K = E, K
        self._cap: np.ndarray | None = None  # the column bounds last set (skip when same)
        if basis is not None:
            self.set_basis(basis)

    def basis(self) -> dict[str, list[int]] | None:
        """The last optimal basis as plain ints (None before the first optimal solve): what a
        stored online state keeps so that the next step starts warm in another process."""
        return basis_to_ints(self.h.getBasis())

    def set_basis(self, basis: dict[str, list[int]]) -> bool:
        """Start the next solve from ``basis`` (from :meth:`basis`); False (and a cold start)
        when it does not fit this network."""
        import highspy

        cols, rows = basis.get("col") or [], basis.get("row") or []
        if len(cols) != self.E or len(rows) != self.rows.size:
            return False
        return bool(self.h.setBasis(basis_from_ints(basis)) == highspy.HighsStatus.kOk)

    def solve(
        self, cost_s: np.ndarray, cap_s: np.ndarray, demand_k: np.ndarray
    ) -> np.ndarray | None:
        """Edge flows of one step, or None when the step is infeasible.

        Raises:
            GreenctlError: HiGHS failed (neither optimal nor infeasible; exit 1).
        """
        es = self.net.edge_site
        h = self.h
        h.changeColsCost(self.E, self.cols, cost_s[es])
        if self._cap is None or not np.array_equal(self._cap, cap_s):  # capacities seldom move
            h.changeColsBounds(self.E, self.cols, np.zeros(self.E), cap_s[es])
            self._cap = np.array(cap_s, dtype=float)
        lower = np.concatenate([demand_k, np.full(self.cap_sites.size, -INF)])
        upper = np.concatenate([demand_k, cap_s[self.cap_sites]])
        h.changeRowsBounds(self.rows.size, self.rows, lower, upper)
        basis = h.getBasis()
        if basis.valid:
            # restart from the basis alone, as a new process does from a stored basis
            # (:meth:`set_basis`): a replan's step then allocates as the whole solve did
            h.clearSolver()
            h.setBasis(basis)
        h.run()
        if solvers.highs_outcome(h, what="the geo step LP") != solvers.OPTIMAL:
            return None
        return np.clip(np.asarray(h.getSolution().col_value), 0.0, None)


def greedy_full(cost: np.ndarray, cap: np.ndarray, demand: np.ndarray) -> np.ndarray:
    """Min-cost loads with every route allowed: fill the cheapest sites first.

    Vectorised over steps: ``cost`` and ``cap`` are ``[T, S]``, ``demand`` ``[T]``; returns
    ``[T, S]`` site loads. Exact: with one class the LP is a fractional knapsack per step.
    """
    order = np.argsort(cost, axis=1, kind="stable")
    cap_o = np.take_along_axis(cap, order, axis=1)
    before = np.cumsum(cap_o, axis=1) - cap_o
    y_o = np.clip(demand[:, None] - before, 0.0, cap_o)
    y = np.empty_like(y_o)
    np.put_along_axis(y, order, y_o, axis=1)
    return y
