"""The exact search of one family's plans at given budget prices, for the decomposition.

A family's plan is canonical without loss: quotas fill options in ascending order of their
(priced) quota cost, every option full but the last one used. :func:`family_plans` walks the
options in that order by depth-first branch and bound (the capacity-capped fractional cover
of the rest as its bound) and lists every plan within a window of the priced optimum;
:func:`grouped_optimum` finds the optimum alone per variant, over each variant's frontier of
capacity and priced cost, where an accuracy floor makes the per-option search slow. Both
stop past ``max_nodes`` nodes (:class:`TooBig`) or their deadline (:class:`OutOfTime`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import time
from dataclasses import dataclass
from typing import Any

#: plans a family's search keeps; past it the family is too big to enumerate
MAX_PLANS = 4_000


@dataclass
class Opt:
    """One option of a family as the search sees it (costs in the model's minimisation sense)."""

    index: int  # option index in the family
    cap: float
    a: float  # primary cost per req/s of quota (min sense)
    b0: float  # primary cost per instance (min sense, without prices)
    ub: int
    variant: str
    usage: tuple[float, ...]
    acc: float = 0.0  # the variant's accuracy (floor, fill order among equal ``a``)
    sa: float = 0.0  # tie-break cost per req/s of quota (min sense)
    sb: float = 0.0  # tie-break cost per instance (min sense)
    pa: float = 0.0  # added to ``a`` in the priced search only (<= 0: the bound stays valid)


@dataclass
class FamilyPlan:
    """One plan of a family: its counts and quotas per option, cost, budget use and tie-break."""

    cost: float  # the family's primary cost (min sense, no prices)
    usage: tuple[float, ...]
    counts: dict[int, tuple[int, float]]  # option index -> (count, quota)
    second: float = 0.0  # its tie-break cost (min sense)

    def key(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted((oi, n) for oi, (n, _) in self.counts.items()))


class TooBig(Exception):
    """A search passed its node or plan limit."""

    pass


class OutOfTime(Exception):
    """A search passed its deadline."""

    pass


#: one plan the search found: (priced cost, cost, tie-break cost, budget use, counts)
_Found = tuple[float, float, float, tuple[float, ...], dict[int, tuple[int, float]]]


def family_plans(
    opts: list[Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: tuple[float, ...],
    window: float,
    deadline: float = math.inf,
    *,
    upper: float = math.inf,
    floor: float | None = None,
    mu: float = 0.0,
    max_nodes: int,
) -> tuple[float, list[FamilyPlan], int]:
    """All plans of one family with priced cost within ``window`` of the priced optimum.

    The priced cost is ``cost + lambda . use + mu x second`` (``mu`` prices the tie-break
    stage's row); ``upper`` is the priced cost of a known plan (prunes from the first node),
    ``floor`` the family's accuracy floor.

    Returns:
        (z, plans, nodes): the priced optimum ``z`` (cost + lambda . use) and, per distinct
        budget use, the cheapest plan (then the best tie-break) whose priced cost is at most
        ``z + window``; ``z`` is infinite when the family has no feasible plan.
    """
    search = _PlanSearch(opts, d, load, budgets, lam, floor, mu)
    if load <= 1e-9:
        return 0.0, [FamilyPlan(0.0, tuple([0.0] * len(budgets)), {})], 1
    found = search.run(load, window, upper, deadline, max_nodes)
    if not found:
        if math.isfinite(upper):  # rounding hid the known plan: search again without it
            return family_plans(
                opts, d, load, budgets, lam, window, deadline, floor=floor, mu=mu,
                max_nodes=max_nodes,
            )  # fmt: skip
        return math.inf, [], search.nodes
    z, plans = _best_per_use(found, window, mu)
    return z, plans, search.nodes


class _CoverBound:
    """A lower bound on serving ``rest`` req/s with options ``i..`` (in a given order): the
    cheapest capacity-capped fractional cover, and with a floor a second cover with the
    floor row priced at ``fmu`` (the best price for the whole family's cover): for any
    completion that meets the floor, cost >= cover(rate - fmu x gap) - fmu x slack."""

    def __init__(
        self, rate: list[float], caps: list[float], gap: list[float], load: float, floored: bool
    ) -> None:
        self.cum_cap, self.cum_cost, self.rates = suffix_covers(rate, caps)
        self.ftol = 1e-9 * max(load, 1.0)
        self.fmu = floor_row_price(rate, gap, caps, load) if floored else 0.0
        if self.fmu > 0:
            self.fcovers = suffix_covers(
                [r - self.fmu * g for r, g in zip(rate, gap, strict=True)], caps
            )

    def floored(self, i: int, rest: float, slack: float) -> float:
        """Both covers' bound (only when ``fmu > 0``) with floor slack ``slack`` so far."""
        b0 = cover_cost(self.cum_cap[i], self.cum_cost[i], self.rates[i], rest)
        fcc, fco, frs = self.fcovers
        b1 = cover_cost(fcc[i], fco[i], frs[i], rest) - self.fmu * (slack + self.ftol)
        return max(b0, b1)


class _PlanSearch:
    """The branch and bound of :func:`family_plans`: the options in fill order with their
    priced costs and bounds, the plans found, and the current branch's counts and use.

    State lives on the instance so the recursion shares one incumbent; the hot methods copy
    the fields they read into locals first (this loop is the hot path of every mix plan).
    """

    def __init__(
        self,
        opts: list[Opt],
        d: dict[str, float],
        load: float,
        budgets: tuple[float, ...],
        lam: tuple[float, ...],
        floor: float | None,
        mu: float,
    ) -> None:
        order = sorted(opts, key=lambda o: (o.a + o.pa + mu * o.sa, -o.acc, o.index))
        self.order, self.m, self.d = order, len(order), d
        self.budgets, self.nk = budgets, len(budgets)
        self.bp = [
            o.b0 + mu * o.sb + sum(lk * u for lk, u in zip(lam, o.usage, strict=True))
            for o in order
        ]
        self.ap = [o.a + o.pa + mu * o.sa for o in order]
        rate = [self.ap[j] + self.bp[j] / o.cap for j, o in enumerate(order)]
        caps = [o.cap * o.ub for o in order]
        # the floor: slack = sum q (acc - floor) >= -ftol (the joint ILP's row); the best slack
        # the rest can still add comes from the most accurate option left (order is by accuracy)
        self.gap = [o.acc - floor for o in order] if floor is not None else [0.0] * self.m
        self.top_gap = [max(self.gap[i:], default=-math.inf) for i in range(self.m + 1)]
        self.cover = _CoverBound(rate, caps, self.gap, load, floor is not None)
        # suffix start costs: at least one more variant starts unless one in use remains
        self.suffix_vars = [{o.variant for o in order[i:]} for i in range(self.m + 1)]
        self.suffix_start = [
            min((d.get(v, 0.0) for v in sv), default=math.inf) for sv in self.suffix_vars
        ]
        self.found: list[_Found] = []
        self.nodes = 0
        self.counts: dict[int, tuple[int, float]] = {}
        self.use = [0.0] * self.nk
        self.best = self.thresh = self.window = 0.0
        self.deadline, self.max_nodes = math.inf, 0

    def run(
        self, load: float, window: float, upper: float, deadline: float, max_nodes: int
    ) -> list[_Found]:
        """Search from the root with ``upper`` as the first incumbent; the plans found."""
        tol = 1e-12 * max(1.0, abs(upper)) if math.isfinite(upper) else 0.0
        self.window, self.deadline, self.max_nodes = window, deadline, max_nodes
        self.best = upper + tol
        self.thresh = self.best + window + 1e-12
        self.visit(0, load, 0.0, 0.0, 0.0, 0.0, frozenset())
        return self.found

    def visit(
        self, i: int, rest: float, priced: float, plain: float, sec: float, slack: float,
        used: frozenset[str],
    ) -> None:  # fmt: skip
        """Place the next nonzero count on some option j >= i (later ones stay 0 until then)."""
        self.nodes += 1
        if self.nodes > self.max_nodes:
            raise TooBig
        if not self.nodes & 1023 and time.perf_counter() > self.deadline:
            raise OutOfTime
        cover, top_gap = self.cover, self.top_gap
        cum_cap, cum_cost, rates = cover.cum_cap, cover.cum_cost, cover.rates
        fmu, ftol = cover.fmu, cover.ftol
        suffix_vars, suffix_start = self.suffix_vars, self.suffix_start
        for j in range(i, self.m):
            # the bound only grows with j (fewer options left): stop at the first failure
            if slack + rest * top_gap[j] < -ftol:
                return  # the floor is out of reach with options j.. (less accurate later)
            if fmu > 0:
                lb = cover.floored(j, rest, slack)
            else:  # cover_cost inlined (the hot loop)
                cc0 = cum_cap[j]
                at0 = bisect.bisect_left(cc0, rest - 1e-9)
                if at0 == len(cc0):
                    lb = math.inf
                elif at0:
                    lb = cum_cost[j][at0 - 1] + rates[j][at0] * (rest - cc0[at0 - 1])
                else:
                    lb = rates[j][0] * rest
            if suffix_vars[j].isdisjoint(used):
                lb += suffix_start[j]
            if priced + lb > self.thresh:
                return
            self.branch(j, rest, priced, plain, sec, slack, used)

    def branch(
        self, j: int, rest: float, priced: float, plain: float, sec: float, slack: float,
        used: frozenset[str],
    ) -> None:  # fmt: skip
        """Each count of option ``j`` the bound lets through, larger counts first (good plans
        early, tight pruning after): a full count recurses on options j+1.., the count that
        serves the rest closes the plan."""
        o, b, aj, gj = self.order[j], self.bp[j], self.ap[j], self.gap[j]
        cover, use, budgets = self.cover, self.use, self.budgets
        start = 0.0 if o.variant in used else self.d.get(o.variant, 0.0)
        need = math.ceil(rest / o.cap - 1e-9)
        top = min(o.ub, need)
        for k in range(self.nk):
            if o.usage[k] > 0:
                top = min(top, math.floor((budgets[k] - use[k]) / o.usage[k] + 1e-9))
        cu = used | {o.variant}
        extra = self.suffix_start[j + 1] if self.suffix_vars[j + 1].isdisjoint(cu) else 0.0
        # the children's bound, inlined (the hot loop): covers of options j+1..
        cc1, co1, rs1 = cover.cum_cap[j + 1], cover.cum_cost[j + 1], cover.rates[j + 1]
        ncc1, fmu = len(cc1), cover.fmu
        # for full counts (1 <= n < need) the child's bound is convex in n: once it passed
        # and then fails, every smaller count fails too
        passed = False
        for n in range(top, 0, -1):
            if n >= need:  # the marginal option: the family's load is served
                self.close(j, n, rest, priced, plain, sec, slack, start)
                continue
            served = o.cap * n
            child_rest = rest - served
            child = priced + aj * served + b * n + start
            at = bisect.bisect_left(cc1, child_rest - 1e-9)
            if at == ncc1:
                clb = math.inf
            elif at:
                clb = co1[at - 1] + rs1[at] * (child_rest - cc1[at - 1])
            else:
                clb = rs1[0] * child_rest
            if fmu > 0:
                clb = max(clb, cover.floored(j + 1, child_rest, slack + served * gj))
            clb += extra
            if child + clb > self.thresh:
                if passed:
                    break
                continue
            passed = True
            self.place(o, n, served)
            self.visit(
                j + 1,
                child_rest,
                child,
                plain + o.a * served + o.b0 * n + start,
                sec + o.sa * served + o.sb * n,
                slack + served * gj,
                cu,
            )
            self.unplace(o, n)

    def close(
        self, j: int, n: int, rest: float, priced: float, plain: float, sec: float,
        slack: float, start: float,
    ) -> None:  # fmt: skip
        """Option ``j`` serves the rest with ``n`` instances: keep the plan if it meets the
        floor and lies within the window."""
        if slack + rest * self.gap[j] < -self.cover.ftol:
            return
        o = self.order[j]
        child = priced + self.ap[j] * rest + self.bp[j] * n + start
        if child <= self.thresh:
            self.place(o, n, rest)
            self.record(child, plain + o.a * rest + o.b0 * n + start, sec + o.sa * rest + o.sb * n)
            self.thresh = self.best + self.window + 1e-12
            self.unplace(o, n)

    def place(self, o: Opt, n: int, quota: float) -> None:
        """Add ``n`` instances of ``o`` serving ``quota`` to the current branch."""
        use = self.use
        for k in range(self.nk):
            use[k] += o.usage[k] * n
        self.counts[o.index] = (n, quota)

    def unplace(self, o: Opt, n: int) -> None:
        """Take back what :meth:`place` added."""
        del self.counts[o.index]
        use = self.use
        for k in range(self.nk):
            use[k] -= o.usage[k] * n

    def record(self, priced: float, plain: float, sec: float) -> None:
        """Keep the current branch's plan if within the window of the best so far; drop the
        plans the window has left behind when the list grows (too many: :class:`TooBig`)."""
        if priced <= self.best + self.window + 1e-12:
            self.found.append((priced, plain, sec, tuple(self.use), dict(self.counts)))
            if priced < self.best:
                self.best = priced
            if len(self.found) > 4 * MAX_PLANS:
                keep = [f for f in self.found if f[0] <= self.best + self.window + 1e-12]
                if len(keep) > MAX_PLANS * 4:
                    raise TooBig
                self.found[:] = keep


def _best_per_use(found: list[_Found], window: float, mu: float) -> tuple[float, list[FamilyPlan]]:
    """The priced optimum of the plans found and, per distinct budget use (and tie-break
    cost when ``mu`` prices it), the cheapest plan within ``window`` of it."""
    z = min(f[0] for f in found)
    by_use: dict[tuple[float, ...], FamilyPlan] = {}
    for priced, plain, sec, u, c in found:
        if priced > z + window + 1e-12:
            continue
        key = tuple(round(x, 9) for x in u)
        if mu > 0:
            key = (*key, round(sec, 12))
        cur = by_use.get(key)
        if (
            cur is None
            or plain < cur.cost - 1e-12 * max(1.0, abs(plain))
            or (plain <= cur.cost + 1e-12 * max(1.0, abs(plain)) and sec < cur.second)
        ):
            by_use[key] = FamilyPlan(plain, u, c, sec)
    if len(by_use) > MAX_PLANS:
        raise TooBig
    return z, list(by_use.values())


#: a point of a variant's frontier: (capacity capped at the load, priced cost, use, counts)
_FrontPoint = tuple[float, float, tuple[float, ...], tuple[tuple[int, int], ...]]
#: a state of the per-variant search: (capacity served, floor slack, priced cost, choices)
_State = tuple[float, float, float, Any]


def grouped_optimum(
    opts: list[Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: tuple[float, ...],
    deadline: float = math.inf,
    *,
    upper: float = math.inf,
    floor: float | None = None,
    max_nodes: int,
) -> tuple[float, list[FamilyPlan], int] | None:
    """A family's priced optimum searched per variant (None: it does not apply here).

    Applies when every option of a variant has the same quota cost and instance costs are
    >= 0: then each variant reduces to the Pareto frontier of (more capacity, less cost) and a
    branch and bound over frontier points gives :func:`family_plans`'s optimum with far fewer
    nodes (the argument is in docs/models.md, "Decomposing plan mix").

    Returns:
        (z, [one optimal plan], nodes) as :func:`family_plans` with ``window=0``.
    """
    nk = len(budgets)
    grouped = _variant_groups(opts)
    if grouped is None:
        return None
    groups, alpha = grouped
    if load <= 1e-9:
        return 0.0, [FamilyPlan(0.0, tuple([0.0] * nk), {})], 1
    names = sorted(groups, key=lambda v: (alpha[v], -groups[v][0].acc, groups[v][0].index))
    if floor is not None and any(
        groups[u][0].acc < groups[v][0].acc for u, v in itertools.pairwise(names)
    ):
        return None  # more capacity early must never cost floor slack
    bp_of = {o.index: o.b0 + sum(lk * u for lk, u in zip(lam, o.usage, strict=True)) for o in opts}
    if any(b < -1e-15 for b in bp_of.values()):
        return None
    fronts = _variant_fronts([groups[v] for v in names], bp_of, load, budgets)
    if fronts is None:
        return None
    search = _GroupedSearch(groups, names, alpha, fronts, bp_of, d, load, floor)
    best_val, best_chain, nodes = search.run(upper, deadline, max_nodes)
    if best_chain is None:
        if math.isfinite(upper):
            return grouped_optimum(opts, d, load, budgets, lam, deadline, floor=floor,
                                    max_nodes=max_nodes)  # fmt: skip
        return math.inf, [], nodes
    return best_val, [plan_of(opts, d, _chain_counts(best_chain, opts), nk)], nodes


def _variant_groups(opts: list[Opt]) -> tuple[dict[str, list[Opt]], dict[str, float]] | None:
    """The options per variant and each variant's quota cost; None when a variant's options
    differ in quota cost or accuracy (the per-variant search does not apply)."""
    groups: dict[str, list[Opt]] = {}
    for o in opts:
        groups.setdefault(o.variant, []).append(o)
    alpha: dict[str, float] = {}
    for v, g in groups.items():
        a0 = g[0].a + g[0].pa
        if any(abs(o.a + o.pa - a0) > 1e-12 * max(1.0, abs(a0)) for o in g):
            return None
        if any(abs(o.acc - g[0].acc) > 0 for o in g):
            return None
        alpha[v] = a0
    return groups, alpha


def _variant_fronts(
    groups: list[list[Opt]], bp_of: dict[int, float], load: float, budgets: tuple[float, ...]
) -> list[list[_FrontPoint]] | None:
    """Each variant's frontier, in the given order; None when one has too many points or
    the frontiers' largest uses together might not fit the budgets (the per-option search
    keeps use exact)."""
    nk = len(budgets)
    fronts: list[list[_FrontPoint]] = []
    top_use = [0.0] * nk
    for group in groups:
        pts: list[tuple[float, float, tuple[tuple[int, int], ...]]] = [(0.0, 0.0, ())]
        for o in group:
            kmax = min(o.ub, math.ceil(load / o.cap - 1e-9))
            for k in range(nk):
                if o.usage[k] > 0:
                    kmax = min(kmax, math.floor(budgets[k] / o.usage[k] + 1e-9))
            pts = _grown_front(pts, o, bp_of[o.index], kmax, load)
            if len(pts) > MAX_PLANS:
                return None
            pts.reverse()  # capacity ascending, cost ascending
            if pts[0][0] > 0:  # free capacity dominated the empty point: keep it first
                pts.insert(0, (0.0, 0.0, ()))
        usage_of = {o.index: o.usage for o in group}
        front = []
        for c, cost, cnt in pts:
            use = [0.0] * nk
            for oi, n in cnt:
                for k in range(nk):
                    use[k] += usage_of[oi][k] * n
            front.append((c, cost, tuple(use), cnt))
        for k in range(nk):
            top_use[k] += max(p[2][k] for p in front)
        fronts.append(front)
    if any(u > b + 1e-9 for u, b in zip(top_use, budgets, strict=True)):
        return None
    return fronts


def _grown_front(
    pts: list[tuple[float, float, tuple[tuple[int, int], ...]]],
    o: Opt,
    b: float,
    kmax: int,
    load: float,
) -> list[tuple[float, float, tuple[tuple[int, int], ...]]]:
    """The frontier ``pts`` (capacity, priced cost, counts) with 0..``kmax`` instances of
    ``o`` (priced cost ``b`` each) added to each point, capacity capped at the load: the
    Pareto points of (more capacity, less cost), capacity descending."""
    cap, oi = o.cap, o.index
    # candidates as (-capacity, cost, parent, count): tuples sort by capacity
    # descending, then cost; counts are only spelled out for the points kept
    grown: list[tuple[float, float, int, int]] = []
    for k, (c, cost, _) in enumerate(pts):
        grown.append((-c, cost, k, 0))
        for n in range(1, kmax + 1):
            cc = c + cap * n
            if cc >= load - 1e-9:
                grown.append((-load, cost + b * n, k, n))
                break
            grown.append((-cc, cost + b * n, k, n))
    # Pareto: by capacity descending, keep strictly cheaper points
    grown.sort()
    kept, thr = [], math.inf
    for pt in grown:
        if pt[1] < thr:
            kept.append(pt)
            thr = pt[1] - 1e-15 * max(1.0, abs(pt[1]))
    return [(-nc, cost, (*pts[k][2], (oi, n)) if n else pts[k][2]) for nc, cost, k, n in kept]


def _front_capacity(p: _FrontPoint) -> float:
    return p[0]


class _GroupedSearch:
    """The dynamic programme of :func:`grouped_optimum` over the variants in fill order,
    with :func:`family_plans`'s bounds over the options in that order.

    A state: capacity served so far S, floor slack, priced cost c, and its choices. _State A
    dominates B when S_A >= S_B, c_A - S_A x alpha' <= c_B - S_B x alpha' and slack_A - S_A x
    gap' >= slack_B - S_B x gap' (alpha', gap': the next variant's, the least quota cost and
    the largest slack per req/s any later variant has): B's completion, trimmed by S_A - S_B
    of its last quotas, completes A at most as dearly and with at least B's slack.
    """

    def __init__(
        self,
        groups: dict[str, list[Opt]],
        names: list[str],
        alpha: dict[str, float],
        fronts: list[list[_FrontPoint]],
        bp_of: dict[int, float],
        d: dict[str, float],
        load: float,
        floor: float | None,
    ) -> None:
        order = [o for v in names for o in groups[v]]
        self.first = [0]
        for v in names:
            self.first.append(self.first[-1] + len(groups[v]))
        rate = [o.a + o.pa + bp_of[o.index] / o.cap for o in order]
        caps = [o.cap * o.ub for o in order]
        gap_o = [o.acc - floor for o in order] if floor is not None else [0.0] * len(order)
        self.cover = _CoverBound(rate, caps, gap_o, load, floor is not None)
        self.ftol, self.load, self.floor = self.cover.ftol, load, floor
        self.ng = ng = len(names)
        self.fronts, self.alpha = fronts, [alpha[v] for v in names]
        acc_g = [groups[v][0].acc for v in names]
        self.gap_g = [a - floor for a in acc_g] if floor is not None else [0.0] * ng
        self.top_gap = [max(self.gap_g[i:], default=-math.inf) for i in range(ng + 1)]
        self.dv = [d.get(v, 0.0) for v in names]
        self.min_start = [min(self.dv[i:], default=math.inf) for i in range(ng + 1)]
        self.reach = [0.0] * (ng + 1)  # capacity the variants i.. can still add
        for i in range(ng - 1, -1, -1):
            self.reach[i] = self.reach[i + 1] + fronts[i][-1][0]
        self.rmin = [min(self.cover.rates[self.first[i]], default=0.0) for i in range(ng + 1)]
        self.best_val = math.inf
        self.best_chain: Any = None  # (parent chain, variant, front point, served)

    def run(self, upper: float, deadline: float, max_nodes: int) -> tuple[float, Any, int]:
        """The best priced cost, its chain of choices (None: no plan beat ``upper``) and the
        states generated."""
        tol = 1e-12 * max(1.0, abs(upper)) if math.isfinite(upper) else 0.0
        self.best_val, self.best_chain = upper + tol, None
        nodes = 0
        states: list[_State] = [(0.0, 0.0, 0.0, None)]
        for i in range(self.ng):
            if time.perf_counter() > deadline:
                raise OutOfTime
            cand = self.extend(i, states)
            nodes += len(cand)
            if nodes > max_nodes:
                raise TooBig
            states = self.undominated(i, cand)
            if not states:
                break
        return self.best_val, self.best_chain, nodes

    def lower(self, i: int, rest: float, slack: float) -> float:
        """A lower bound on completing ``rest`` req/s with variants i.. at floor slack ``slack``."""
        if rest <= 1e-9:
            return 0.0
        if self.reach[i] < rest - 1e-9:
            return math.inf
        s, cover = self.first[i], self.cover
        lb = cover_cost(cover.cum_cap[s], cover.cum_cost[s], cover.rates[s], rest)
        if cover.fmu > 0:
            fcc, fco, frs = cover.fcovers
            lb = max(lb, cover_cost(fcc[s], fco[s], frs[s], rest) - cover.fmu * (slack + self.ftol))
        return lb + self.min_start[i]

    def extend(self, i: int, states: list[_State]) -> list[_State]:
        """Every state with variant ``i`` unused or at a frontier point short of the rest; a
        point that serves the rest closes a plan (the best one is kept)."""
        fr, load, ftol = self.fronts[i], self.load, self.ftol
        a_i, g_i, start = self.alpha[i], self.gap_g[i], self.dv[i]
        rmin_n, start_n = self.rmin[i + 1], self.min_start[i + 1]
        best_val, best_chain = self.best_val, self.best_chain
        cand: list[_State] = []
        for st in states:
            s_, sl, c, chain = st
            rest = load - s_
            cand.append(st)  # variant i unused
            at = bisect.bisect_left(fr, rest - 1e-9, key=_front_capacity)
            if at < len(fr) and sl + rest * g_i >= -ftol:
                p = fr[at]
                val = c + a_i * rest + p[1] + start
                if val <= best_val:
                    best_val, best_chain = val, (chain, i, p, rest)
            # cheap test first: the rest costs at least the cheapest rate left per req/s
            cut = best_val - rmin_n * rest - start_n
            for p in fr[1:at]:
                served = p[0]
                child = c + a_i * served + p[1] + start
                if child - rmin_n * served > cut:
                    continue
                cand.append((s_ + served, sl + served * g_i, child, (chain, i, p, served)))
        self.best_val, self.best_chain = best_val, best_chain
        return cand

    def undominated(self, i: int, cand: list[_State]) -> list[_State]:
        """The candidates no other dominates (see the class) that can still beat the best."""
        load, ftol, floor, top_gap = self.load, self.ftol, self.floor, self.top_gap[i + 1]
        a_n = self.alpha[i + 1] if i + 1 < self.ng else 0.0
        g_n = self.gap_g[i + 1] if i + 1 < self.ng else 0.0
        keep: list[_State] = []
        cand.sort(key=lambda t: (-t[0], t[2] - t[0] * a_n, -(t[1] - t[0] * g_n)))
        stair1: list[float] = []
        stair2: list[float] = []
        low1 = math.inf  # without a floor: the least k1 kept so far (2-D dominance)
        for st in cand:
            s_, sl, c, _ = st
            rest = load - s_
            if sl + rest * top_gap < -ftol:
                continue
            k1, k2 = c - s_ * a_n, sl - s_ * g_n
            eps = 1e-15 * max(1.0, abs(k1))
            if floor is None:
                if k1 >= low1 - eps:
                    continue
            else:
                # the staircase of kept (k1, k2): k1 and k2 both ascending; the kept state
                # with the largest k2 among those with k1 <= this one's is the one before
                at = bisect.bisect_right(stair1, k1 + eps)
                if at and stair2[at - 1] >= k2 - ftol:
                    continue
            if c + self.lower(i + 1, rest, sl) > self.best_val:
                continue
            keep.append(st)
            low1 = min(low1, k1)
            if floor is not None:
                at = bisect.bisect_left(stair1, k1)
                end = at
                while end < len(stair1) and stair2[end] <= k2:
                    end += 1
                stair1[at:end] = [k1]
                stair2[at:end] = [k2]
        return keep


def _chain_counts(chain: Any, opts: list[Opt]) -> dict[int, tuple[int, float]]:
    """The counts and quotas of a chain of frontier choices (each option of a point full
    but the last one its quota needs)."""
    picks = []
    while chain is not None:
        chain, _, p, served = chain
        picks.append((p, served))
    by_index = {o.index: o for o in opts}
    counts: dict[int, tuple[int, float]] = {}
    for p, served in picks:
        left = served
        for oi, n in p[3]:
            qq = min(by_index[oi].cap * n, left)
            counts[oi] = (n, qq)
            left -= qq
    return counts


def suffix_covers(
    rate: list[float], caps: list[float]
) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """Per suffix ``i..``: rates ascending with cumulative capacity and cost (for cover_cost)."""
    m = len(rate)
    cum_cap: list[list[float]] = []
    cum_cost: list[list[float]] = []
    rates: list[list[float]] = []
    for i in range(m + 1):
        pieces = sorted((rate[j], caps[j]) for j in range(i, m))
        cc, co, acc_cap, acc_cost = [], [], 0.0, 0.0
        for r, capacity in pieces:
            acc_cap += capacity
            acc_cost += r * capacity
            cc.append(acc_cap)
            co.append(acc_cost)
        cum_cap.append(cc)
        cum_cost.append(co)
        rates.append([r for r, _ in pieces])
    return cum_cap, cum_cost, rates


def cover_cost(cc: list[float], co: list[float], rs: list[float], rest: float) -> float:
    """The cheapest fractional cover of ``rest`` (capacity-capped pieces, cheapest first)."""
    j = bisect.bisect_left(cc, rest - 1e-9)
    if j == len(cc):
        return math.inf
    before_cap = cc[j - 1] if j else 0.0
    before_cost = co[j - 1] if j else 0.0
    return before_cost + rs[j] * (rest - before_cap)


def floor_row_price(rate: list[float], gap: list[float], caps: list[float], load: float) -> float:
    """The price of a family's floor row that maximises its cover bound (golden section on
    the concave ``cover(rate - mu x gap)``; 0 when the floor does not bind)."""

    def value(mu: float) -> float:
        adj = sorted(
            (r - mu * g, c) for r, g, c in zip(rate, gap, caps, strict=True) if c > 0
        )  # fmt: skip
        rest, total = load, 0.0
        for r, c in adj:
            take = min(c, rest)
            total += r * take
            rest -= take
            if rest <= 1e-12:
                return total
        return -math.inf

    spread = max(rate) - min(rate) if rate else 0.0
    gmin = min((abs(g) for g in gap if abs(g) > 1e-9), default=0.0)
    if spread <= 0 or gmin <= 0 or not math.isfinite(value(0.0)):
        return 0.0
    lo, hi = 0.0, 2.0 * spread / gmin
    if value(1e-3 * hi) <= value(0.0):
        return 0.0
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = value(a), value(b)
    for _ in range(40):
        if fa < fb:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = value(b)
        else:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = value(a)
    return max(0.0, (lo + hi) / 2.0)


def plan_of(
    opts: list[Opt], d: dict[str, float], counts: dict[int, tuple[int, float]], nk: int
) -> FamilyPlan:
    """The plan with these counts and quotas (its cost, use and tie-break cost)."""
    by_index = {o.index: o for o in opts}
    cost = second = 0.0
    use = [0.0] * nk
    started = set()
    for oi, (n, qq) in counts.items():
        o = by_index[oi]
        cost += o.a * qq + o.b0 * n
        second += o.sa * qq + o.sb * n
        for k in range(nk):
            use[k] += o.usage[k] * n
        if n > 0:
            started.add(o.variant)
    cost += sum(d.get(v, 0.0) for v in started)
    return FamilyPlan(cost, tuple(use), dict(counts), second)


def refill(
    opts: list[Opt], counts: dict[int, tuple[int, float]], load: float, floor: float | None
) -> dict[int, tuple[int, float]] | None:
    """The counts of a seed plan with the search's quotas (its fill order, exactly the load),
    trimmed to what they need; None when they do not serve the load or meet the floor."""
    by_index = {o.index: o for o in opts}
    order = sorted(
        (by_index[oi] for oi, (n, _) in counts.items() if n > 0),
        key=lambda o: (o.a + o.pa, -o.acc, o.index),
    )
    rest, slack, out = load, 0.0, {}
    for o in order:
        if rest <= 1e-9:
            break
        qq = min(o.cap * counts[o.index][0], rest)
        out[o.index] = (math.ceil(qq / o.cap - 1e-9), qq)
        rest -= qq
        if floor is not None:
            slack += qq * (o.acc - floor)
    if rest > 1e-9 * max(load, 1.0) or slack < -1e-9 * max(load, 1.0):
        return None
    return out


def rounded_plan(
    opts: list[Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: list[float],
) -> FamilyPlan | None:
    """A good plan at prices ``lam`` fast: full instances of the options cheapest per req/s,
    then the rest on the option that serves it cheapest (a first bound for the search)."""
    nk = len(budgets)
    bp = [o.b0 + sum(map(operator.mul, lam, o.usage)) for o in opts]  # (called ~10^3 x)
    order = sorted(range(len(opts)), key=lambda i: opts[i].a + bp[i] / opts[i].cap)
    rest, use = load, [0.0] * nk
    counts: dict[int, tuple[int, float]] = {}

    def fits(i: int, n: int) -> int:
        for k in range(nk):
            if opts[i].usage[k] > 0:
                n = min(n, math.floor((budgets[k] - use[k]) / opts[i].usage[k] + 1e-9))
        return max(min(n, opts[i].ub), 0)

    for i in order:
        if rest <= 1e-9:
            break
        n = math.floor(rest / opts[i].cap + 1e-9)
        if n > 0:  # (no full instance fits the rest: skip the budget check)
            n = fits(i, n)
        if n > 0:
            counts[opts[i].index] = (n, min(n * opts[i].cap, rest))
            rest -= counts[opts[i].index][1]
            for k in range(nk):
                use[k] += opts[i].usage[k] * n
    if rest > 1e-9:
        best: tuple[float, int, int] | None = None
        for i, o in enumerate(opts):
            if o.index in counts:
                continue
            n = math.ceil(rest / o.cap - 1e-9)
            cost = o.a * rest + bp[i] * n
            if best is not None and cost >= best[0]:
                continue  # not cheaper: whether it fits does not matter
            if fits(i, n) < n:
                continue
            best = (cost, i, n)
        if best is None:
            return None
        counts[opts[best[1]].index] = (best[2], rest)
    return plan_of(opts, d, counts, nk)


def add_plan(plans: dict[tuple[tuple[int, int], ...], FamilyPlan], plan: FamilyPlan) -> None:
    """Keep the cheapest plan per count vector (seeds' quotas need not be the best fill)."""
    key = plan.key()
    old = plans.get(key)
    if old is None or (plan.cost, plan.second) < (old.cost, old.second):
        plans[key] = plan


def priced_cost(plan: FamilyPlan, lam: list[float]) -> float:
    return plan.cost + sum(lk * u for lk, u in zip(lam, plan.usage, strict=True))
