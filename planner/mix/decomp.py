"""Exact Lagrangian decomposition of ``plan mix`` for many families sharing budgets.

The joint ILP couples families only through the shared budget rows. With budget prices
``lambda >= 0`` (any prices >= 0 keep the argument exact; good ones keep ``Delta`` small)
every feasible plan ``x`` satisfies, in the model's minimisation sense,

    cost(x) >= LD + sum_f d_f(x),   LD = sum_f z_f - lambda . B,
    d_f(x) = cost_f(x) + lambda . use_f(x) - z_f >= 0,

where ``z_f`` is family ``f``'s own optimum of ``cost_f + lambda . use_f`` (no shared rows).
So once a plan of cost ``INC <= LD + Delta`` is known, every plan at least as good has
``d_f <= Delta`` in every family. Per family an exact depth-first branch and bound
enumerates all plans within ``Delta`` of ``z_f`` (the best plan per distinct budget use),
and a small master MILP (one plan per family, the shared budget rows) picks the best
combination: exact over everything that can beat ``INC``, hence globally exact. The proven
bound is ``min(master bound, LD + Delta)``. ``Delta`` starts at :data:`FIRST_WINDOW` and
grows (x4, x64 while the enumeration is cheap, or to ``INC - LD``; to ``INC - LD`` at once in
the last rounds) until ``INC <= LD + Delta`` holds.

Per family a plan is canonical without loss: quotas fill options in ascending order of their
quota cost, so every option is full (``q = capacity x n``) except the last one used, whose
count is ``ceil(rest / capacity)``; trimming unneeded instances never costs more (instance
and loading costs are >= 0) nor uses more budget. The search walks options in that order,
placing only nonzero counts, with the capacity-capped fractional cover of the rest (plus
the cheapest loading cost still unavoidable) as its bound. A family whose search passes
:data:`MAX_NODES` or :data:`MAX_PLANS` enters the master with its full ILP rows instead
("hard"; its ``z_f`` replaced by the dual bound of its own priced ILP).

Prices: the LP duals are only a start. Column generation refines them: the LP over the
per-family plans found so far (one convex combination per family, the shared budget rows)
gives new prices, the exact search at those prices (seeded with the best known plan, which
prunes from the first node) gives new plans and a valid ``LD``, until the LP meets ``LD``
(optimal Lagrangian prices). When the best plan over those plans meets ``LD`` within the
gap tolerance the proof is complete without the widening rounds.

Objectives in units of their size: costs are divided by an estimate of the optimum's
magnitude (carbon per request is ~1e-5 g, below HiGHS's absolute tolerances otherwise).

Applies to ``strategy="ilp"`` with HiGHS, every objective and several families; an accuracy
floor (a row of its own family) is exact here under ``accuracy`` and ``cost``, whose quotas
fill most accurate first (the search checks it, and prices it for a second bound; while
refining prices such a family is priced per variant by :func:`_grouped_optimum`, a dynamic
programme over each variant's Pareto frontier of capacity and priced cost), and keeps
the joint ILP under ``carbon`` and ``balanced`` (with carbon's per-size quota costs an
optimal plan under a floor may fill two options partly, which neither search lists). ``accuracy``/``carbon`` (cheapest among
optimal plans) and ``cost`` (most accurate) keep the joint ILP's tie-break after the proof:
the master again with the row ``primary <= optimum + tolerance``, then (as the joint ILP)
the full tie-break ILP warm-started with that plan, time-limited, its status in the plan.
Otherwise, or when it gives up (over :data:`BUDGET_S`, too many hard families, no proof
after the last round), the caller runs the joint ILP with the time left, warm-started with
the decomposition's best plan, and reports the tighter of its bound and ``LD``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix.model import Allocation, MixProblem, Terms

#: Enumeration limits per family (nodes of the search, plans kept); past them: fall back.
MAX_NODES = 30_000
#: While refining prices a search past this many nodes hands its family to the family's own
#: priced ILP (a bound and a plan) instead: a few ms where the search would take seconds.
PRICE_NODES = 3_000
MAX_PLANS = 4_000
#: First enumeration window, times max(1, |LP bound|) (objectives here are O(1)).
FIRST_WINDOW = 1.5e-5
#: Rounds of the proof; its window grows x4 a round (x64 while a round's enumeration visits
#: at most CHEAP_NODES nodes), and to the whole gap in the last three.
WIDENINGS = 8
CHEAP_NODES = 1_000
#: Time the decomposition may take before the joint ILP takes over (at most 0.6 of a time
#: limit: on the benchmark the joint ILP's gaps at 10 s are 0.1-25%, the decomposition's 0).
BUDGET_S = 6.0
#: Families whose enumeration overflows enter the master in full; more than this: give up.
MAX_HARD = 4
#: The master's relative gap tolerance (below the plan's, which it must meet).
MASTER_REL_GAP = 1e-7
#: Column generation rounds that refine the prices, and when their bound counts as converged
#: (times max(1, |LP bound|)).
MAX_CG = 12
CG_TOL = 1e-7
#: Objectives the decomposition takes (the others keep the joint ILP).
OBJECTIVES = ("balanced", "accuracy", "cost", "carbon")
#: Seed the pool with cheap plans at prices around the LP's before the first exact search.
SEED_PRICES = True
#: Price (window 0) a family with an accuracy floor by the per-variant search where it
#: applies (:func:`_grouped_optimum`), with this limit on its states before the per-option
#: search takes over. Without a floor the per-option search was as fast on the benchmark
#: (the frontiers cost ~2-3 ms a family to build), so it keeps those families.
GROUPED = True
GROUPED_NODES = 300_000


@dataclass
class Fallback:
    """The decomposition gave up: why, and what it hands the joint ILP that runs instead."""

    reason: str
    rounds: list[dict[str, Any]]
    #: its best plan (it warm-starts the joint ILP)
    incumbent: Allocation | None = None
    #: its best Lagrangian bound, in the model's sense (minimisation; it can tighten the
    #: joint ILP's)
    bound: float | None = None
    #: the column generation's price rounds before it gave up (None: before pricing)
    price_rounds: list[dict[str, Any]] | None = None


@dataclass
class _Opt:
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
class _Plan:
    cost: float  # the family's primary cost (min sense, no prices)
    usage: tuple[float, ...]
    counts: dict[int, tuple[int, float]]  # option index -> (count, quota)
    second: float = 0.0  # its tie-break cost (min sense)

    def key(self) -> tuple[tuple[int, int], ...]:
        return tuple(sorted((oi, n) for oi, (n, _) in self.counts.items()))


def tie_break(objective: str) -> str | None:
    """The joint ILP's tie-break objective among optimal plans (None: no tie-break)."""
    return {"accuracy": "cost", "carbon": "cost", "cost": "accuracy"}.get(objective)


def applicable(problem: MixProblem, *, single: bool, solver: str) -> bool:
    """Whether the decomposition applies (else the joint ILP runs).

    Every objective is separable per family once the loads are fixed, so ``accuracy``,
    ``cost``, ``carbon`` and ``balanced`` all decompose. An accuracy floor is exact here
    only under ``accuracy`` and ``cost`` (quotas fill most accurate first); under
    ``carbon`` and ``balanced`` it keeps the joint ILP (a floor may need two partly filled
    options there, which the canonical plans of the searches do not include).
    """
    floors = any(f.min_accuracy is not None for f in problem.families)
    return (
        not single
        and solver == "highs"
        and problem.objective in OBJECTIVES
        and not (floors and problem.objective in ("carbon", "balanced"))
        and len(problem.families) > 1
        and all(f.options for f in problem.families)
    )


class _TooBig(Exception):
    pass


class _OutOfTime(Exception):
    pass


def _family_plans(
    opts: list[_Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: tuple[float, ...],
    window: float,
    deadline: float = math.inf,
    upper: float = math.inf,
    floor: float | None = None,
    mu: float = 0.0,
    max_nodes: int | None = None,
) -> tuple[float, list[_Plan], int]:
    """All plans of one family with priced cost within ``window`` of the priced optimum.

    The priced cost is ``cost + lambda . use + mu x second`` (``mu`` prices the tie-break
    stage's row on the primary objective, which is then the plans' ``second``); with
    ``mu > 0`` plans of one budget use but different ``second`` are all kept.

    Args:
        upper: the priced cost of a plan known to exist (prunes from the first node).
        floor: the family's accuracy floor (quota-weighted mean accuracy >= floor).

    Returns:
        (z, plans, nodes): the priced optimum ``z`` (cost + lambda . use) and, per distinct
        budget use, the cheapest plan (then the best tie-break) whose priced cost is at most
        ``z + window``; ``z`` is infinite when the family has no feasible plan.
    """
    nk = len(budgets)
    node_limit = MAX_NODES if max_nodes is None else max_nodes
    order = sorted(opts, key=lambda o: (o.a + o.pa + mu * o.sa, -o.acc, o.index))
    m = len(order)
    bp = [o.b0 + mu * o.sb + sum(lk * u for lk, u in zip(lam, o.usage, strict=True)) for o in order]
    # suffix bounds: the cheapest per req/s cover of the rest by options i.. (capacity-capped)
    ap = [o.a + o.pa + mu * o.sa for o in order]
    rate = [ap[j] + bp[j] / o.cap for j, o in enumerate(order)]
    caps = [o.cap * o.ub for o in order]
    cum_cap, cum_cost, rates = _suffix_covers(rate, caps)

    def bound(i: int, rest: float) -> float:
        return _cover(cum_cap[i], cum_cost[i], rates[i], rest)

    # the floor: slack = sum q (acc - floor) >= -ftol (the joint ILP's row); the best slack
    # the rest can still add comes from the most accurate option left (order is by accuracy)
    gap = [o.acc - floor for o in order] if floor is not None else [0.0] * m
    top_gap = [max(gap[i:], default=-math.inf) for i in range(m + 1)]
    ftol = 1e-9 * max(load, 1.0)
    tol = 1e-12 * max(1.0, abs(upper)) if math.isfinite(upper) else 0.0
    # With a floor, the cover above ignores it; the floor priced at ``fmu`` (the best price
    # for the whole family's cover) gives a second bound: for any completion that meets the
    # floor, cost >= cover(rate - fmu x gap) - fmu x slack.
    fmu = _floor_price(rate, gap, caps, load) if floor is not None else 0.0
    if fmu > 0:
        fcum_cap, fcum_cost, frates = _suffix_covers(
            [r - fmu * g for r, g in zip(rate, gap, strict=True)], caps
        )

        def bound2(i: int, rest: float, slack: float) -> float:
            b0 = bound(i, rest)
            b1 = _cover(fcum_cap[i], fcum_cost[i], frates[i], rest) - fmu * (slack + ftol)
            return max(b0, b1)

    else:

        def bound2(i: int, rest: float, slack: float) -> float:
            return bound(i, rest)

    best = [upper + tol]
    found: list[tuple[float, float, float, tuple[float, ...], dict[int, tuple[int, float]]]] = []
    nodes = [0]
    counts: dict[int, tuple[int, float]] = {}
    use = [0.0] * nk

    def record(priced: float, plain: float, sec: float) -> None:
        if priced <= best[0] + window + 1e-12:
            found.append((priced, plain, sec, tuple(use), dict(counts)))
            if priced < best[0]:
                best[0] = priced
            if len(found) > 4 * MAX_PLANS:
                _compact()

    def _compact() -> None:
        keep = [f for f in found if f[0] <= best[0] + window + 1e-12]
        if len(keep) > MAX_PLANS * 4:
            raise _TooBig
        found[:] = keep

    # suffix start costs: at least one more variant starts unless one in use remains
    suffix_vars: list[set[str]] = [{o.variant for o in order[i:]} for i in range(m + 1)]
    suffix_start = [min((d.get(v, 0.0) for v in sv), default=math.inf) for sv in suffix_vars]
    thresh = [best[0] + window + 1e-12]

    def visit(
        i: int, rest: float, priced: float, plain: float, sec: float, slack: float,
        used: frozenset[str],
    ) -> None:  # fmt: skip
        """Place the next nonzero count on some option j >= i (later ones stay 0 until then)."""
        nodes[0] += 1
        if nodes[0] > node_limit:
            raise _TooBig
        if not nodes[0] & 1023 and time.perf_counter() > deadline:
            raise _OutOfTime
        for j in range(i, m):
            # the bound only grows with j (fewer options left): stop at the first failure
            if slack + rest * top_gap[j] < -ftol:
                return  # the floor is out of reach with options j.. (less accurate later)
            lb = bound2(j, rest, slack)
            if not (suffix_vars[j] & used):
                lb += suffix_start[j]
            if priced + lb > thresh[0]:
                return
            o = order[j]
            b = bp[j]
            start = 0.0 if o.variant in used else d.get(o.variant, 0.0)
            need = math.ceil(rest / o.cap - 1e-9)
            top = min(o.ub, need)
            for k in range(nk):
                if o.usage[k] > 0:
                    top = min(top, math.floor((budgets[k] - use[k]) / o.usage[k] + 1e-9))
            cu = used | {o.variant}
            sv = suffix_vars[j + 1]
            extra = 0.0 if sv & cu else suffix_start[j + 1]
            # the children's bound, inlined (the hot loop): covers of options j+1..
            cc1, co1, rs1 = cum_cap[j + 1], cum_cost[j + 1], rates[j + 1]
            ncc1 = len(cc1)
            gj = gap[j]
            # larger counts first: good plans early, tight pruning after. For full counts
            # (1 <= n < need) the child's bound is convex in n: once it passed and then
            # fails, every smaller count fails too.
            passed = False
            for n in range(top, 0, -1):
                if n >= need:  # the marginal option: the family's load is served
                    if slack + rest * gap[j] < -ftol:
                        continue
                    child = priced + ap[j] * rest + b * n + start
                    if child <= thresh[0]:
                        for k in range(nk):
                            use[k] += o.usage[k] * n
                        counts[o.index] = (n, rest)
                        record(
                            child,
                            plain + o.a * rest + o.b0 * n + start,
                            sec + o.sa * rest + o.sb * n,
                        )
                        thresh[0] = best[0] + window + 1e-12
                        del counts[o.index]
                        for k in range(nk):
                            use[k] -= o.usage[k] * n
                    continue
                served = o.cap * n
                child_rest = rest - served
                child = priced + ap[j] * served + b * n + start
                at = bisect.bisect_left(cc1, child_rest - 1e-9)
                if at == ncc1:
                    clb = math.inf
                elif at:
                    clb = co1[at - 1] + rs1[at] * (child_rest - cc1[at - 1])
                else:
                    clb = rs1[0] * child_rest
                if fmu > 0:
                    clb = max(clb, bound2(j + 1, child_rest, slack + served * gj))
                clb += extra
                if child + clb > thresh[0]:
                    if passed:
                        break
                    continue
                passed = True
                for k in range(nk):
                    use[k] += o.usage[k] * n
                counts[o.index] = (n, served)
                visit(
                    j + 1,
                    child_rest,
                    child,
                    plain + o.a * served + o.b0 * n + start,
                    sec + o.sa * served + o.sb * n,
                    slack + served * gap[j],
                    cu,
                )
                del counts[o.index]
                for k in range(nk):
                    use[k] -= o.usage[k] * n

    if load <= 1e-9:
        return 0.0, [_Plan(0.0, tuple([0.0] * nk), {})], 1
    visit(0, load, 0.0, 0.0, 0.0, 0.0, frozenset())
    if not found:
        if math.isfinite(upper):  # rounding hid the known plan: search again without it
            return _family_plans(
                opts, d, load, budgets, lam, window, deadline, floor=floor, mu=mu,
                max_nodes=max_nodes,
            )  # fmt: skip
        return math.inf, [], nodes[0]
    z = min(f[0] for f in found)
    by_use: dict[tuple[float, ...], _Plan] = {}
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
            by_use[key] = _Plan(plain, u, c, sec)
    if len(by_use) > MAX_PLANS:
        raise _TooBig
    return z, list(by_use.values()), nodes[0]


def _grouped_optimum(
    opts: list[_Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: tuple[float, ...],
    deadline: float = math.inf,
    upper: float = math.inf,
    floor: float | None = None,
    max_nodes: int | None = None,
) -> tuple[float, list[_Plan], int] | None:
    """A family's priced optimum searched per variant (None: it does not apply here).

    Applies when every option of a variant has the same quota cost (``accuracy`` and
    ``cost``: quotas cost by accuracy alone) and instance costs are >= 0. Quotas then fill
    variants in ascending quota cost (most accurate first among ties), and what a variant
    contributes is only its capacity ``C`` (capped at the load), its priced instance cost
    and its use. Per variant the count vectors over its sizes reduce to the Pareto frontier
    of (more capacity, less cost): a plan with a dominated vector is never better, since
    more capacity of an earlier variant serves more of the load at a quota cost and floor
    slack at least as good. Use is left out of the frontier only when every combination of
    frontier points fits the budgets (else None). A depth-first branch and bound over the
    variants (a frontier point each, the marginal one the cheapest covering the rest) with
    :func:`_family_plans`'s bounds gives the same optimum ``z`` with far fewer nodes.

    Returns:
        (z, [one optimal plan], nodes) as :func:`_family_plans` with ``window=0``.
    """
    nk = len(budgets)
    node_limit = MAX_NODES if max_nodes is None else max_nodes
    groups: dict[str, list[_Opt]] = {}
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
    if load <= 1e-9:
        return 0.0, [_Plan(0.0, tuple([0.0] * nk), {})], 1
    names = sorted(groups, key=lambda v: (alpha[v], -groups[v][0].acc, groups[v][0].index))
    if floor is not None and any(
        groups[u][0].acc < groups[v][0].acc for u, v in itertools.pairwise(names)
    ):
        return None  # more capacity early must never cost floor slack
    bp_of = {o.index: o.b0 + sum(lk * u for lk, u in zip(lam, o.usage, strict=True)) for o in opts}
    if any(b < -1e-15 for b in bp_of.values()):
        return None
    # per variant: the frontier of (capacity capped at the load, priced cost, use, counts)
    fronts: list[list[tuple[float, float, tuple[float, ...], tuple[tuple[int, int], ...]]]] = []
    top_use = [0.0] * nk
    for v in names:
        pts: list[tuple[float, float, tuple[tuple[int, int], ...]]] = [(0.0, 0.0, ())]
        for o in groups[v]:
            kmax = min(o.ub, math.ceil(load / o.cap - 1e-9))
            for k in range(nk):
                if o.usage[k] > 0:
                    kmax = min(kmax, math.floor(budgets[k] / o.usage[k] + 1e-9))
            b, cap, oi = bp_of[o.index], o.cap, o.index
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
            pts = [
                (-nc, cost, (*pts[k][2], (oi, n)) if n else pts[k][2]) for nc, cost, k, n in kept
            ]
            if len(pts) > MAX_PLANS:
                return None
            pts.reverse()  # capacity ascending, cost ascending
            if pts[0][0] > 0:  # free capacity dominated the empty point: keep it first
                pts.insert(0, (0.0, 0.0, ()))
        usage_of = {o.index: o.usage for o in groups[v]}
        front = []
        for c, cost, cnt in pts:
            use = [0.0] * nk
            for oi, n in cnt:
                for k in range(nk):
                    use[k] += usage_of[oi][k] * n
            front.append((c, cost, tuple(use), cnt))
        pts_u = front
        for k in range(nk):
            top_use[k] += max(p[2][k] for p in pts_u)
        fronts.append(pts_u)
    if any(u > b + 1e-9 for u, b in zip(top_use, budgets, strict=True)):
        return None  # a combination might not fit: the per-option search keeps use exact
    # the bounds of _family_plans over the options in variant order
    order = [o for v in names for o in groups[v]]
    first = [0]
    for v in names:
        first.append(first[-1] + len(groups[v]))
    rate = [o.a + o.pa + bp_of[o.index] / o.cap for o in order]
    caps = [o.cap * o.ub for o in order]
    cum_cap, cum_cost, rates = _suffix_covers(rate, caps)
    gap_o = [o.acc - floor for o in order] if floor is not None else [0.0] * len(order)
    fmu = _floor_price(rate, gap_o, caps, load) if floor is not None else 0.0
    if fmu > 0:
        fcc, fco, frs = _suffix_covers(
            [r - fmu * g for r, g in zip(rate, gap_o, strict=True)], caps
        )
    ftol = 1e-9 * max(load, 1.0)
    ng = len(names)
    acc_g = [groups[v][0].acc for v in names]
    gap_g = [a - floor for a in acc_g] if floor is not None else [0.0] * ng
    top_gap = [max(gap_g[i:], default=-math.inf) for i in range(ng + 1)]
    dv = [d.get(v, 0.0) for v in names]
    min_start = [min(dv[i:], default=math.inf) for i in range(ng + 1)]
    caps_g = [fr[-1][0] for fr in fronts]
    reach = [0.0] * (ng + 1)  # capacity the variants i.. can still add
    for i in range(ng - 1, -1, -1):
        reach[i] = reach[i + 1] + caps_g[i]

    def lower(i: int, rest: float, slack: float) -> float:
        if rest <= 1e-9:
            return 0.0
        if reach[i] < rest - 1e-9:
            return math.inf
        s = first[i]
        lb = _cover(cum_cap[s], cum_cost[s], rates[s], rest)
        if fmu > 0:
            lb = max(lb, _cover(fcc[s], fco[s], frs[s], rest) - fmu * (slack + ftol))
        return lb + min_start[i]

    rmin = [min(rates[first[i]], default=0.0) for i in range(ng + 1)]
    tol = 1e-12 * max(1.0, abs(upper)) if math.isfinite(upper) else 0.0
    best_val, best_chain = upper + tol, None
    nodes = 0
    # Dynamic programming over the variants in fill order. A state: capacity served so far
    # S, floor slack, priced cost c, and its choices. State A dominates B when S_A >= S_B,
    # c_A - S_A x alpha' <= c_B - S_B x alpha' and slack_A - S_A x gap' >= slack_B -
    # S_B x gap' (alpha', gap': the next variant's, the least quota cost and the largest
    # slack per req/s any later variant has): B's completion, trimmed by S_A - S_B of its
    # last quotas, completes A at most as dearly and with at least B's slack.
    states: list[tuple[float, float, float, Any]] = [(0.0, 0.0, 0.0, None)]
    for i in range(ng):
        if time.perf_counter() > deadline:
            raise _OutOfTime
        fr = fronts[i]
        a_i, g_i, start = alpha[names[i]], gap_g[i], dv[i]
        cand: list[tuple[float, float, float, Any]] = []
        for st in states:
            s_, sl, c, chain = st
            rest = load - s_
            cand.append(st)  # variant i unused
            at = bisect.bisect_left(fr, rest - 1e-9, key=lambda p: p[0])
            if at < len(fr) and sl + rest * g_i >= -ftol:
                p = fr[at]
                val = c + a_i * rest + p[1] + start
                if val <= best_val:
                    best_val, best_chain = val, (chain, i, p, rest)
            # cheap test first: the rest costs at least the cheapest rate left per req/s
            cut = best_val - rmin[i + 1] * rest - min_start[i + 1]
            for p in fr[1:at]:
                served = p[0]
                child = c + a_i * served + p[1] + start
                if child - rmin[i + 1] * served > cut:
                    continue
                cand.append((s_ + served, sl + served * g_i, child, (chain, i, p, served)))
        nodes += len(cand)
        if nodes > node_limit:
            raise _TooBig
        a_n = alpha[names[i + 1]] if i + 1 < ng else 0.0
        g_n = gap_g[i + 1] if i + 1 < ng else 0.0
        keep: list[tuple[float, float, float, Any]] = []
        cand.sort(key=lambda t: (-t[0], t[2] - t[0] * a_n, -(t[1] - t[0] * g_n)))
        stair1: list[float] = []
        stair2: list[float] = []
        low1 = math.inf  # without a floor: the least k1 kept so far (2-D dominance)
        for st in cand:
            s_, sl, c, _ = st
            rest = load - s_
            if sl + rest * top_gap[i + 1] < -ftol:
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
            if c + lower(i + 1, rest, sl) > best_val:
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
        states = keep
        if not states:
            break
    if best_chain is None:
        if math.isfinite(upper):
            return _grouped_optimum(opts, d, load, budgets, lam, deadline, floor=floor,
                                    max_nodes=max_nodes)  # fmt: skip
        return math.inf, [], nodes
    picks = []
    chain = best_chain
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
    plan = _plan_of(opts, d, counts, nk)
    return best_val, [plan], nodes


def _suffix_covers(
    rate: list[float], caps: list[float]
) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
    """Per suffix ``i..``: rates ascending with cumulative capacity and cost (for _cover)."""
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


def _cover(cc: list[float], co: list[float], rs: list[float], rest: float) -> float:
    """The cheapest fractional cover of ``rest`` (capacity-capped pieces, cheapest first)."""
    j = bisect.bisect_left(cc, rest - 1e-9)
    if j == len(cc):
        return math.inf
    before_cap = cc[j - 1] if j else 0.0
    before_cost = co[j - 1] if j else 0.0
    return before_cost + rs[j] * (rest - before_cap)


def _floor_price(rate: list[float], gap: list[float], caps: list[float], load: float) -> float:
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


def _options(
    problem: MixProblem, model: Any, lay: Any, fi: int, keys: list[str]
) -> list[_Opt] | None:
    """The family's options as the search sees them (None: a negative instance cost)."""
    fam = problem.families[fi]
    total = problem.total_load or 1.0
    second = tie_break(problem.objective)
    out = []
    for oi, o in enumerate(fam.options):
        b0 = model.cost[lay.n[fi][oi]]
        if b0 < -1e-15:
            return None
        acc = fam.variants[o.variant].accuracy
        out.append(
            _Opt(
                index=oi,
                cap=o.capacity_rps,
                a=model.cost[lay.q[fi][oi]],
                b0=b0,
                ub=round(model.ub[lay.n[fi][oi]]),
                variant=o.variant,
                usage=tuple(float(o.usage.get(k, 0.0)) for k in keys),
                acc=acc,
                sa=-acc / total if second == "accuracy" else 0.0,
                sb=o.cost_per_hour if second == "cost" else 0.0,
            )
        )
    return out


def _plan_of(
    opts: list[_Opt], d: dict[str, float], counts: dict[int, tuple[int, float]], nk: int
) -> _Plan:
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
    return _Plan(cost, tuple(use), dict(counts), second)


def _refill(
    opts: list[_Opt], counts: dict[int, tuple[int, float]], load: float, floor: float | None
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


def _seed_factors(nk: int) -> list[tuple[float, ...]]:
    """Multipliers of the LP's prices for the seed plans: all together, then each alone."""
    out = [tuple([f] * nk) for f in (0.0, 0.5, 0.8, 1.25, 2.0, 4.0)]
    for k in range(nk):
        for f in (0.5, 2.0):
            out.append(tuple(f if i == k else 1.0 for i in range(nk)))
    return out


def _rounded_plan(
    opts: list[_Opt],
    d: dict[str, float],
    load: float,
    budgets: tuple[float, ...],
    lam: list[float],
) -> _Plan | None:
    """A good plan at prices ``lam`` fast: full instances of the options cheapest per req/s,
    then the rest on the option that serves it cheapest (a first bound for the search)."""
    nk = len(budgets)
    bp = [o.b0 + sum(lk * u for lk, u in zip(lam, o.usage, strict=True)) for o in opts]
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
        n = fits(i, math.floor(rest / opts[i].cap + 1e-9))
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
            if fits(i, n) < n:
                continue
            cost = o.a * rest + bp[i] * n
            if best is None or cost < best[0]:
                best = (cost, i, n)
        if best is None:
            return None
        counts[opts[best[1]].index] = (best[2], rest)
    return _plan_of(opts, d, counts, nk)


def _add(plans: dict[tuple[tuple[int, int], ...], _Plan], plan: _Plan) -> None:
    """Keep the cheapest plan per count vector (seeds' quotas need not be the best fill)."""
    key = plan.key()
    old = plans.get(key)
    if old is None or (plan.cost, plan.second) < (old.cost, old.second):
        plans[key] = plan


def _priced(plan: _Plan, lam: list[float]) -> float:
    return plan.cost + sum(lk * u for lk, u in zip(lam, plan.usage, strict=True))


def solve_decomposed(
    problem: MixProblem, terms: Terms, *, time_limit_s: float | None
) -> tuple[Allocation, dict[str, Any]] | Fallback:
    """Solve ``problem`` exactly by Lagrangian decomposition, or say why it gives up.

    1. Prices: the LP relaxation's budget duals, refined by column generation (the LP over
       the per-family plans found so far gives new prices, the exact per-family search at
       those prices new plans and a valid bound ``LD``) until the prices are optimal for
       the Lagrangian dual or the bound meets the best plan over the pool.
    2. Proof: at the best prices, every plan within ``Delta = INC - LD`` of each family's
       priced optimum enters a master MILP over the shared budgets (``INC``: the best plan
       over the pool; the widening rounds of the module docstring when there is none).

    Families whose enumeration passes :data:`MAX_NODES` or :data:`MAX_PLANS` ("hard") enter
    the master with their full ILP formulation instead of a list of plans, and their
    ``z_f`` is replaced by the dual bound of their priced ILP (a valid lower bound), which
    keeps the argument exact. Objectives with a tie-break (accuracy and carbon: cheapest
    among optimal plans; cost: most accurate) solve the master twice, as the joint ILP does.

    Returns:
        (allocation, solver info) with ``status`` ``optimal`` (proven gap <= MIP_REL_GAP) or
        ``infeasible`` (empty allocation); or a :class:`Fallback` (the reason, the best
        plan and the best bound) to let the caller run the joint ILP.
    """
    t0 = time.perf_counter()
    rounds: list[dict[str, Any]] = []
    budget_s = BUDGET_S if time_limit_s is None else min(BUDGET_S, 0.6 * time_limit_s)
    deadline = t0 + budget_s
    second = tie_break(problem.objective)
    # without the MIR rows: the LP below only prices the budgets (3x faster, same prices
    # to within a percent on the benchmark)
    model, lay = mix_model.build_model(problem, terms, single=False, cuts=False)
    # Work in units of the objective's size: carbon per request is ~1e-5 g, far below
    # HiGHS's absolute tolerances (1e-7 on rows and reduced costs, 1e-9 on the MIP gap).
    unit = mix_model.objective_unit(problem, model, lay)
    model.cost = [c / unit for c in model.cost]
    keys = list(problem.budgets)
    budgets = tuple(float(problem.budgets[k]) for k in keys)
    nk = len(keys)
    # prices of the shared budget rows: the LP relaxation's duals
    lam = [0.0] * nk
    lp_bound = None
    lp_x: list[float] | None = None
    if nk:
        lp = mix_model.solve_highs(model, time_limit_s, relax=True)
        if lp.status == "infeasible":
            return {}, {"name": "highs", "status": "infeasible", "gap": None,
                        "method": "decomposition", "solve_s": round(lp.seconds, 4)}  # fmt: skip
        if lp.row_dual is None or lp.status != "optimal":
            return _give_up("the LP relaxation did not solve to optimality", rounds)
        lp_bound = lp.objective
        lp_x = lp.x
        used_keys = _used_keys(problem, range(len(problem.families)))
        # build_model appends the used budget rows last, in budgets order
        duals = lp.row_dual[len(lp.row_dual) - len(used_keys) :]
        for k, dual in zip(used_keys, duals, strict=True):
            lam[keys.index(k)] = max(0.0, -float(dual))
    lp_s = time.perf_counter() - t0
    scale0 = max(1.0, abs(lp_bound) if lp_bound is not None else 1.0)
    # Objectives without an instance cost (accuracy; carbon where no option has an idle
    # power, see MixOption) tie between plans of every count split of the same quotas; a
    # small price floor (any price >= 0 keeps the bound valid; this one costs at most a
    # tenth of the gap tolerance) keeps the cheapest ones.
    floor_price = [0.0] * nk
    if problem.objective in ("accuracy", "carbon"):
        floor_price = [0.1 * mix_model.MIP_REL_GAP * scale0 / (nk * max(b, 1.0)) for b in budgets]
    lam = [max(lk, e) for lk, e in zip(lam, floor_price, strict=True)]
    fams: list[tuple[list[_Opt], dict[str, float], float, float | None]] = []
    for fi, fam in enumerate(problem.families):
        opts = _options(problem, model, lay, fi, keys)
        if opts is None:
            return _give_up("an instance cost is negative", rounds)
        d = {v: model.cost[c] for v, c in lay.s[fi].items()}
        if any(x < -1e-15 for x in d.values()):
            return _give_up("a loading cost is negative", rounds)
        if problem.objective == "cost":
            # equal-cost plans tie in the search; a tenth of the gap tolerance of the
            # tie-break (accuracy) separates them and only lowers the bound
            for o in opts:
                o.pa = 0.1 * mix_model.MIP_REL_GAP * scale0 * o.sa
        fams.append((opts, d, fam.load_rps(problem.headroom), fam.min_accuracy))
    scale = max(1.0, abs(lp_bound) if lp_bound is not None else 1.0)
    coupled = any(len(g) > 1 for g in mix_model.components(problem))
    pool: list[dict[tuple[tuple[int, int], ...], _Plan]] = [{} for _ in fams]

    def price(
        fi: int, prices: list[float], window: float, max_nodes: int | None = None
    ) -> tuple[float, list[_Plan], int]:  # fmt: skip
        o, d, load, floor = fams[fi]
        if floor is None:
            seed = _rounded_plan(o, d, load, budgets, prices)
            if seed is not None:
                _add(pool[fi], seed)
        known = [_priced(p, prices) for p in pool[fi].values()]
        if window == 0.0 and GROUPED and floor is not None:
            try:
                got = _grouped_optimum(
                    o, d, load, budgets, tuple(prices), deadline=deadline,
                    upper=min(known, default=math.inf), floor=floor, max_nodes=GROUPED_NODES,
                )  # fmt: skip
            except _TooBig:
                got = None
            if got is not None:
                for p in got[1]:
                    _add(pool[fi], p)
                return got
        z, plans, n = _family_plans(
            o, d, load, budgets, tuple(prices), window, deadline=deadline,
            upper=min(known, default=math.inf), floor=floor, max_nodes=max_nodes,
        )  # fmt: skip
        for p in plans:
            _add(pool[fi], p)
        return z, plans, n

    try:  # the greedy plan fits the budgets together: the pool's LP is feasible from the start
        greedy = mix_model.greedy(problem, terms)
    except InfeasiblePlan:
        greedy = {}
    for fi, counts in greedy.items():
        refilled = _refill(fams[fi][0], counts, fams[fi][2], fams[fi][3])
        if refilled is not None:
            _add(pool[fi], _plan_of(fams[fi][0], fams[fi][1], refilled, nk))
    if lp_x is not None:
        # the LP relaxation's plan rounded up, per family: a first known plan (a bound that
        # prunes the first search from its first node)
        for fi, (fopts, d, _, _) in enumerate(fams):
            seed = {}
            for oi in range(len(fopts)):
                qq = max(lp_x[lay.q[fi][oi]], 0.0)
                if qq > 1e-9:
                    seed[oi] = (math.ceil(lp_x[lay.n[fi][oi]] - 1e-9), qq)
            refilled = _refill(fopts, seed, fams[fi][2], fams[fi][3])
            if refilled is not None:
                _add(pool[fi], _plan_of(fopts, d, refilled, nk))
    if coupled and nk and SEED_PRICES:
        # cheap plans at prices around the LP's, and the pool's LP first: its prices start
        # the exact searches nearer the end (the first search at the LP's prices was the
        # costliest round: no good bound yet, prices still far off)
        for factors in _seed_factors(nk):
            trial = [lk * f + (1e-3 * scale / max(b, 1.0) if f > 1 and lk == 0 else 0.0)
                     for lk, f, b in zip(lam, factors, budgets, strict=True)]  # fmt: skip
            for fi, (fopts, d, load, floor) in enumerate(fams):
                if floor is None:
                    seed_plan = _rounded_plan(fopts, d, load, budgets, trial)
                    if seed_plan is not None:
                        _add(pool[fi], seed_plan)
        first = _restricted_lp(pool, keys, budgets, big=10.0 * scale)
        if first is not None and not any(first[2]):
            lam = [max(lk, e) for lk, e in zip(first[1], floor_price, strict=True)]

    def pool_master() -> tuple[float | None, Allocation | None]:
        """The best plan over the pool (a master MILP over its plans), in time."""
        if time.perf_counter() >= deadline:
            return None, None
        everything = {fi: (0.0, list(p.values())) for fi, p in enumerate(pool)}
        master, cols, _ = _master(problem, terms, everything, [], keys, budgets, unit=unit)
        left = max(deadline - time.perf_counter(), 0.05)
        res = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
        if res.x is None or res.objective is None:
            return None, None
        xs = res.x
        return res.objective, {
            fi: dict(plan.counts) for j, (fi, plan) in cols.items() if xs[j] > 0.5
        }

    pool_solved = False
    # -- 1. prices by column generation ------------------------------------------------------
    best_ld, best_lam = -math.inf, list(lam)
    cg: list[dict[str, Any]] = []
    incumbent: Allocation | None = None
    inc: float | None = None
    for _ in range(MAX_CG if coupled and nk else 1):
        if time.perf_counter() > deadline:
            break
        t1 = time.perf_counter()
        zsum, nodes = 0.0, 0
        try:
            for fi in range(len(fams)):
                try:
                    z, _, n = price(fi, lam, 0.0, PRICE_NODES)
                except _TooBig:
                    # the family's own priced ILP: a bound, and its plan joins the pool
                    # (the search at later prices starts from it)
                    got: dict[int, tuple[int, float]] = {}
                    low = _priced_bound(problem, terms, fi, keys, lam, got, unit=unit)
                    if low is None or not got:
                        raise
                    plan = _plan_of(fams[fi][0], fams[fi][1], got, nk)
                    _add(pool[fi], plan)
                    z, n = low, 0
                if math.isinf(z):
                    return {}, {"name": "highs", "status": "infeasible", "gap": None,
                                "method": "decomposition"}  # fmt: skip
                zsum += z
                nodes += n
        except (_OutOfTime, _TooBig):
            break  # the rounds below handle hard families and the time budget
        ld = zsum - sum(lk * b for lk, b in zip(lam, budgets, strict=True))
        if ld > best_ld:
            best_ld, best_lam = ld, list(lam)
        step: dict[str, Any] = {
            "ld": ld,
            "nodes": nodes,
            "price_s": round(time.perf_counter() - t1, 4),
        }
        cg.append(step)
        if not nk or not coupled:
            break
        rmp = _restricted_lp(pool, keys, budgets, big=10.0 * scale)
        if rmp is None:
            break
        value, new_lam, over = rmp
        if any(over):
            # the pool cannot fit the budgets yet: its duals are the overuse penalty; raise
            # the prices of the overused budgets step by step instead
            new_lam = [
                max(2.0 * lk, 1e-3 * scale / max(b, 1.0)) if o else lk
                for lk, b, o in zip(lam, budgets, over, strict=True)
            ]
        new_lam = [max(lk, e) for lk, e in zip(new_lam, floor_price, strict=True)]
        step["rmp"] = None if any(over) else value
        if (not any(over) and value - best_ld <= CG_TOL * scale) or new_lam == lam:
            break
        if not any(over) and value - best_ld <= mix_model.MIP_REL_GAP * abs(value):
            # the pool's LP is within the proof's tolerance of the bound: its best plan
            # (the master over the pool, >= the LP) may already meet it; then no more rounds
            inc, incumbent = pool_master()
            step["pool_master"] = inc
            if inc is not None and inc - best_ld <= mix_model.MIP_REL_GAP * max(abs(inc), 1e-12):
                pool_solved = True
                break
        lam = new_lam
    lam = best_lam
    # the best plan over the pool, a first incumbent
    if not pool_solved and coupled and nk and math.isfinite(best_ld):
        inc, incumbent = pool_master()
    cg_s = time.perf_counter() - t0 - lp_s
    if (
        incumbent is not None
        and inc is not None
        and inc - best_ld <= mix_model.MIP_REL_GAP * max(abs(inc), 1e-12)
    ):
        # the pool's best plan meets the bound: proven without enumerating the gap
        return _finish(
            problem, terms, pool, keys, budgets, model=model, inc=inc, ld=best_ld, lam=lam,
            info={"lp_s": round(lp_s, 4), "price_rounds": cg, "prices_s": round(cg_s, 4),
                  "rounds": rounds, "t0": t0, "deadline": deadline, "unit": unit},
            alloc=incumbent,
        )  # fmt: skip

    def give_up(reason: str) -> Fallback:
        out = _give_up(reason, rounds, incumbent, best_ld * unit)
        out.price_rounds = cg
        return out

    # -- 2. proof: everything within the gap, master MILP ------------------------------------
    tie_tol = 0.0
    if second is not None and inc is not None:
        tie_tol = mix_model.TIE_BREAK_REL_TOL * abs(inc)
    if not coupled:
        window = 1e-7 * scale if second is not None else 0.0
    elif inc is not None and math.isfinite(best_ld):
        window = max(inc - best_ld, 0.0) * (1.0 + 1e-9) + tie_tol + 1e-12 * scale
    else:
        window = FIRST_WINDOW * scale
    hard: dict[int, float] = {}  # family -> lower bound on its priced optimum
    for widening in range(WIDENINGS):
        if time.perf_counter() > deadline:
            return give_up(f"over its time budget of {budget_s:g} s")
        t1 = time.perf_counter()
        results: dict[int, tuple[float, list[_Plan]]] = {}
        nodes = 0
        for fi in range(len(fams)):
            if fi in hard:
                continue
            try:
                z, plans, n = price(fi, lam, window)
            except _OutOfTime:
                return give_up(f"over its time budget of {budget_s:g} s")
            except _TooBig:
                low = _priced_bound(problem, terms, fi, keys, lam, unit=unit)
                if low is None:
                    return give_up("a hard family's own ILP did not solve")
                hard[fi] = low
                if len(hard) > MAX_HARD:
                    return give_up(f"more than {MAX_HARD} families too hard to enumerate")
                continue
            if math.isinf(z):
                return {}, {"name": "highs", "status": "infeasible", "gap": None,
                            "method": "decomposition"}  # fmt: skip
            results[fi] = (z, plans)
            nodes += n
        enum_s = time.perf_counter() - t1
        ld = (
            sum(z for z, _ in results.values())
            + sum(hard.values())
            - sum(lk * b for lk, b in zip(lam, budgets, strict=True))
        )
        best_ld = max(best_ld, ld)
        master, cols, mlay = _master(
            problem, terms, results, sorted(hard), keys, budgets, unit=unit
        )
        left = max(deadline - time.perf_counter(), 0.05)
        res = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
        rounds.append(
            {
                "window": window,
                "plans": sum(len(p) for _, p in results.values()),
                "nodes": nodes,
                "hard_families": len(hard),
                "enumerate_s": round(enum_s, 4),
                "master_s": round(res.seconds, 4),
                "master_status": res.status,
            }
        )
        if res.status == "infeasible" and not results:
            return {}, {"name": "highs", "status": "infeasible", "gap": None,
                        "method": "decomposition"}  # fmt: skip
        if res.x is None or res.objective is None:
            # too few plans per family to fit the budgets together
            window = max(window * 10.0, FIRST_WINDOW * scale)
            continue
        inc = res.objective
        alloc: Allocation = mix_model.extract(problem, mlay, res.x) if hard else {}
        for j, fi_plan in cols.items():
            if res.x[j] > 0.5:
                fi, plan = fi_plan
                alloc[fi] = dict(plan.counts)
        incumbent = alloc
        tie_tol = mix_model.TIE_BREAK_REL_TOL * abs(inc) if second is not None else 0.0
        if inc + tie_tol > ld + window + 1e-12 * scale:
            # better plans may lie outside the window: widen it to cover them all
            # (geometrically: each wider round also improves the incumbent; faster while
            # the enumeration is cheap, and at once in the last rounds: an integer duality
            # gap far above the first window, e.g. uncoupled families each filling its own
            # budget, took more than the rounds at x4)
            grow = 4.0 if nodes > CHEAP_NODES else 64.0
            if widening >= WIDENINGS - 3:
                grow = math.inf
            window = min((inc + tie_tol - ld) * (1.0 + 1e-9) + 1e-12 * scale, window * grow)
            continue
        if res.status != "optimal":
            return give_up(f"master stopped: {res.status}")
        mbound = res.bound if res.bound is not None and math.isfinite(res.bound) else inc
        proven = min(mbound, ld + window)
        gap = max(inc - proven, 0.0) / max(abs(inc), 1e-12)
        if gap > mix_model.MIP_REL_GAP:
            return give_up(f"proven gap {gap:.3g} above the tolerance")
        tb: dict[str, Any] | None = None
        proven_s = time.perf_counter() - t0
        if second is not None:
            # the joint ILP's tie-break: the best secondary among plans within tol of inc
            # (hard families' own columns carry their primary and secondary costs)
            sec_cost = [0.0] * len(master.cost)
            if hard:
                m2, _ = mix_model.build_model(
                    problem, terms, single=False, objective=second, subset=sorted(hard)
                )
                sec_cost[: len(m2.cost)] = m2.cost
            idx = [j for j, c in enumerate(master.cost) if c != 0 or j in cols]
            master.row(
                idx,
                [cols[j][1].cost if j in cols else master.cost[j] for j in idx],
                -math.inf,
                inc + tie_tol,
            )
            for j in range(len(master.cost)):
                master.cost[j] = cols[j][1].second if j in cols else sec_cost[j]
            left = max(deadline - time.perf_counter(), 0.05)
            res2 = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
            tb = {"objective": second, "status": res2.status}
            if res2.x is not None and res2.status in ("optimal", "time_limit"):
                alloc = mix_model.extract(problem, mlay, res2.x) if hard else {}
                for j, (fi, plan) in cols.items():
                    if res2.x[j] > 0.5:
                        alloc[fi] = dict(plan.counts)
        maximise = mix_model.is_maximise(problem.objective)
        info: dict[str, Any] = {
            "name": "highs",
            "method": "decomposition: Lagrangian prices (LP duals refined by column "
            "generation), exact per-family enumeration within the bound gap, master MILP "
            "over shared budgets",
            "status": "optimal",
            "gap": gap,
            "objective_bound": (-proven if maximise else proven) * unit,
            "lagrangian_bound": (-best_ld if maximise else best_ld) * unit,
            "prices": dict(zip(keys, lam, strict=True)),
            "lp_s": round(lp_s, 4),
            "price_rounds": cg,
            "prices_s": round(cg_s, 4),
            "rounds": rounds,
            "solve_s": round(time.perf_counter() - t0, 4),
            "proven_s": round(proven_s, 4),
            **_sizes(
                problem,
                columns=len(master.cost),
                rows=len(master.rows),
                integer=sum(master.integer),
            ),
        }
        if tb is not None:
            info["tie_break"] = tb
        return alloc, info
    return give_up("no proof after the last round")


def _finish(
    problem: MixProblem,
    terms: Terms,
    pool: list[dict[tuple[tuple[int, int], ...], _Plan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    model: Any,
    inc: float,
    ld: float,
    lam: list[float],
    info: dict[str, Any],
    alloc: Allocation,
) -> tuple[Allocation, dict[str, Any]]:
    """The result when the pool's best plan already meets the Lagrangian bound.

    With a tie-break objective :func:`_tie_break_stage` picks the best tie-break among
    plans within the joint ILP's tolerance of the optimum.
    """
    t0, deadline, unit = info.pop("t0"), info.pop("deadline"), info.pop("unit")
    second = tie_break(problem.objective)
    maximise = mix_model.is_maximise(problem.objective)
    info["proven_s"] = round(time.perf_counter() - t0, 4)
    if second is not None:
        alloc, info["tie_break"] = _tie_break_stage(
            problem, terms, pool, keys, budgets, model=model,
            rhs=inc + mix_model.TIE_BREAK_REL_TOL * abs(inc), alloc=alloc,
            seconds=time.perf_counter() - t0, deadline=deadline,
        )  # fmt: skip
    gap = max(inc - ld, 0.0) / max(abs(inc), 1e-12)
    out: dict[str, Any] = {
        "name": "highs",
        "method": "decomposition: Lagrangian prices (LP duals refined by column "
        "generation); the best plan over the priced plans meets the Lagrangian bound",
        "status": "optimal",
        "gap": gap,
        "objective_bound": (-ld if maximise else ld) * unit,
        "lagrangian_bound": (-ld if maximise else ld) * unit,
        "prices": dict(zip(keys, lam, strict=True)),
        **info,
        "solve_s": round(time.perf_counter() - t0, 4),
        **_sizes(
            problem,
            columns=sum(len(p) for p in pool),
            rows=len(pool) + len(keys),
            integer=sum(len(p) for p in pool),
        ),
    }
    return alloc, out


def _sizes(problem: MixProblem, *, columns: int, rows: int, integer: int) -> dict[str, Any]:
    """The size keys a proven decomposition reports in ``extra.solver`` (as the joint ILP)."""
    return {
        "build_s": 0.0,
        "columns": columns,
        "rows": rows,
        "integer_columns": integer,
        "independent_groups": len(mix_model.components(problem)),
        "mip_rel_gap_tolerance": mix_model.MIP_REL_GAP,
        "warm_start": None,
    }


def _tie_break_stage(
    problem: MixProblem,
    terms: Terms,
    pool: list[dict[tuple[tuple[int, int], ...], _Plan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    model: Any,
    rhs: float,
    alloc: Allocation,
    seconds: float,
    deadline: float,
) -> tuple[Allocation, dict[str, Any]]:
    """The joint ILP's tie-break after the primary optimum is proven.

    First the best tie-break over the priced plans (a master MILP with the row ``primary
    <= rhs``: the optimum plus the joint ILP's tolerance), then, as the joint ILP does, the
    full tie-break ILP warm-started with it, for as long as the proof took (at least 0.5 s,
    at most the time left). Its status labels how far the tie-break is proven.
    """
    second = tie_break(problem.objective)
    # objective: the tie-break cost; the row: the primary cost
    swapped = {
        fi: (0.0, [_Plan(p.second, p.usage, p.counts, p.cost) for p in plans.values()])
        for fi, plans in enumerate(pool)
    }
    maximise = mix_model.is_maximise(problem.objective)
    proven = mix_model.evaluate_allocation(problem, alloc, terms)
    limit = mix_model.TIE_BREAK_REL_TOL * abs(proven["objective"]) + 1e-15

    def acceptable(cand: Allocation) -> bool:
        # HiGHS's row tolerances (1e-6 on MIP rows) may stretch the row: check it here
        value = mix_model.evaluate_allocation(problem, cand, terms)["objective"]
        diff = (proven["objective"] - value) if maximise else (value - proven["objective"])
        return diff <= limit

    got, _ = _master_with_row(problem, terms, swapped, keys, budgets, rhs, deadline)
    if got is not None and acceptable(got):
        alloc = got
    info: dict[str, Any] = {"objective": second, "status": "best over the priced plans"}
    m2, lay2 = mix_model.build_model(problem, terms, single=False, objective=second)
    idx = [i for i, c in enumerate(model.cost) if c != 0]
    m2.row(idx, [model.cost[i] for i in idx], -math.inf, rhs)
    start = mix_model.warm_start(problem, terms, lay2, len(m2.cost), alloc)
    # at most as long again as the proof took (>= 0.5 s): the joint ILP allows twice its
    # primary solve (>= 1 s), which here would triple a sub-second answer for a tie-break
    left = min(max(0.5, seconds), max(deadline - time.perf_counter(), 0.1))
    res = mix_model.solve_highs(m2, left, start)
    info["status"] = res.status
    info["solve_s"] = round(res.seconds, 4)
    if res.x is not None and res.status in ("optimal", "time_limit"):
        cand = mix_model.extract(problem, lay2, res.x)
        if acceptable(cand):
            alloc = cand
        else:
            info["status"] += " (its plan gave up more than the tolerance: kept the one before)"
    return alloc, info


def _master_with_row(
    problem: MixProblem,
    terms: Terms,
    results: dict[int, tuple[float, list[_Plan]]],
    keys: list[str],
    budgets: tuple[float, ...],
    rhs: float,
    deadline: float,
) -> tuple[Allocation | None, float | None]:
    """The master MILP over ``results`` with the row ``sum second <= rhs``."""
    master, cols, _ = _master(problem, terms, results, [], keys, budgets)
    idx = list(cols)
    master.row(idx, [cols[j][1].second for j in idx], -math.inf, rhs)
    left = max(deadline - time.perf_counter(), 0.05)
    res = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
    if res.x is None or res.objective is None:
        return None, None
    xs = res.x
    return {fi: dict(p.counts) for j, (fi, p) in cols.items() if xs[j] > 0.5}, res.objective


def _restricted_lp(
    pool: list[dict[tuple[tuple[int, int], ...], _Plan]],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    big: float,
    second_rhs: float | None = None,
) -> tuple[float, list[float], list[bool]] | None:
    """The LP over the pool's plans (a convex combination per family, shared budgets).

    Its value bounds the Lagrangian dual from above and its budget duals are the prices
    that maximise the Lagrangian bound over the pool (column generation). Budget overuse
    costs ``big`` per unit, which keeps the LP feasible and caps the prices.
    """
    m = mix_model.Model()
    nrow = len(keys) + (second_rhs is not None)
    rows_k: list[tuple[list[int], list[float]]] = [([], []) for _ in range(nrow)]
    for plans in pool:
        idx = []
        for plan in plans.values():
            c = m.col(plan.cost, 0.0, 1.0)
            idx.append(c)
            for k, u in enumerate(plan.usage):
                if u != 0:
                    rows_k[k][0].append(c)
                    rows_k[k][1].append(u)
            if second_rhs is not None:
                rows_k[-1][0].append(c)
                rows_k[-1][1].append(plan.second)
        m.row(idx, [1.0] * len(idx), 1.0, 1.0)
    first = len(m.rows)
    slacks = []
    rhs: list[float] = [*budgets]
    if second_rhs is not None:
        rhs.append(second_rhs)
    for k, b in enumerate(rhs):
        slack = m.col(big, 0.0, math.inf)
        slacks.append(slack)
        m.row([*rows_k[k][0], slack], [*rows_k[k][1], -1.0], -math.inf, b)
    # per-family costs of order 1 (HiGHS's reduced-cost tolerance is absolute, 1e-7)
    f = float(max(len(pool), 1))
    m.cost = [c * f for c in m.cost]
    res = mix_model.solve_highs(m, None, relax=True)
    if res.status != "optimal" or res.row_dual is None or res.objective is None:
        return None
    if res.x is None:
        return None
    lam = [max(0.0, -float(res.row_dual[first + k]) / f) for k in range(nrow)]
    over = [res.x[slacks[k]] > 1e-9 for k in range(nrow)]
    return res.objective / f, lam, over


def _give_up(
    reason: str,
    rounds: list[dict[str, Any]],
    incumbent: Allocation | None = None,
    bound: float | None = None,
) -> Fallback:
    """Why the decomposition gives up, its best plan (it warm-starts the joint ILP) and its
    best Lagrangian bound (model sense: minimisation; it can tighten the joint ILP's).
    """
    finite = bound is not None and math.isfinite(bound)
    return Fallback(reason, rounds, incumbent, bound if finite else None)


def _used_keys(problem: MixProblem, fis: Any) -> list[str]:
    """Budget keys some option of families ``fis`` uses, in budgets order."""
    used = {k for fi in fis for o in problem.families[fi].options for k in o.usage}
    return [k for k in problem.budgets if k in used]


def _priced_bound(
    problem: MixProblem,
    terms: Terms,
    fi: int,
    keys: list[str],
    lam: list[float],
    plan_out: dict[int, tuple[int, float]] | None = None,
    *,
    unit: float = 1.0,
) -> float | None:
    """A lower bound on family ``fi``'s priced optimum: the dual bound of its own ILP.

    ``plan_out`` receives the ILP's plan (counts and quotas per option).
    """
    m, lay = mix_model.build_model(problem, terms, single=False, subset=[fi], cuts=False)
    m.cost = [c / unit for c in m.cost]
    fam = problem.families[fi]
    for oi, o in enumerate(fam.options):
        m.cost[lay.n[fi][oi]] += sum(
            lk * o.usage.get(k, 0.0) for lk, k in zip(lam, keys, strict=True)
        )
    res = mix_model.solve_highs(m, None)
    if res.status != "optimal" or res.bound is None or not math.isfinite(res.bound):
        return None
    if plan_out is not None and res.x is not None:
        plan_out.update(mix_model.extract(problem, lay, res.x).get(fi, {}))
    return min(res.bound, res.objective if res.objective is not None else res.bound)


def _master(
    problem: MixProblem,
    terms: Terms,
    results: dict[int, tuple[float, list[_Plan]]],
    hard: list[int],
    keys: list[str],
    budgets: tuple[float, ...],
    *,
    unit: float = 1.0,
) -> tuple[Any, dict[int, tuple[int, _Plan]], Any]:
    """One binary per (family, plan), hard families in full; the shared budget rows."""
    m, lay = mix_model.build_model(problem, terms, single=False, subset=hard)
    m.cost = [c / unit for c in m.cost]
    rows_k: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in keys}
    hard_keys = _used_keys(problem, hard)
    if hard_keys:
        tail = m.rows[len(m.rows) - len(hard_keys) :]
        del m.rows[len(m.rows) - len(hard_keys) :]
        for k, (idx, coef, _, _) in zip(hard_keys, tail, strict=True):
            rows_k[k] = (list(idx), list(coef))
    cols: dict[int, tuple[int, _Plan]] = {}
    for fi, (_, plans) in sorted(results.items()):
        idx = []
        for plan in plans:
            c = m.col(plan.cost, 0.0, 1.0, True)
            cols[c] = (fi, plan)
            idx.append(c)
            for k, u in zip(keys, plan.usage, strict=True):
                if u != 0:
                    rows_k[k][0].append(c)
                    rows_k[k][1].append(u)
        m.row(idx, [1.0] * len(idx), 1.0, 1.0)
    for k, b in zip(keys, budgets, strict=True):
        idx, coef = rows_k[k]
        if idx:
            m.row(idx, coef, -math.inf, b)
    return m, cols, lay
