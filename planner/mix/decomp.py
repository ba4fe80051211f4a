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
refining prices such a family is priced per variant by :func:`grouped_optimum`, a dynamic
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

import math
import time
from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.planner.mix import model as mix_model
from greenctl.planner.mix.decomp_master import (
    MASTER_REL_GAP,
    Fallback,
    budget_keys_used,
    build_master,
    fallback_of,
    finish_proof,
    priced_bound,
    restricted_lp,
    solver_sizes,
    tie_break,
)
from greenctl.planner.mix.family_search import (
    MAX_PLANS,
    FamilyPlan,
    Opt,
    OutOfTime,
    TooBig,
    add_plan,
    family_plans,
    grouped_optimum,
    plan_of,
    priced_cost,
    refill,
    rounded_plan,
)
from greenctl.planner.mix.model import Allocation, MixProblem, Terms

__all__ = ["MAX_PLANS", "Fallback", "applicable", "solve_decomposed", "tie_break"]

#: Enumeration limits per family (nodes of the search, plans kept); past them: fall back.
MAX_NODES = 30_000
#: While refining prices a search past this many nodes hands its family to the family's own
#: priced ILP (a bound and a plan) instead: a few ms where the search would take seconds.
PRICE_NODES = 3_000
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
#: Column generation rounds that refine the prices, and when their bound counts as converged
#: (times max(1, |LP bound|)).
MAX_CG = 12
CG_TOL = 1e-7
#: Objectives the decomposition takes (the others keep the joint ILP).
OBJECTIVES = ("balanced", "accuracy", "cost", "carbon")
#: Seed the pool with cheap plans at prices around the LP's before the first exact search.
SEED_PRICES = True
#: Price (window 0) a family with an accuracy floor by the per-variant search where it
#: applies (:func:`grouped_optimum`), with this limit on its states before the per-option
#: search takes over. Without a floor the per-option search was as fast on the benchmark
#: (the frontiers cost ~2-3 ms a family to build), so it keeps those families.
GROUPED = True
GROUPED_NODES = 300_000


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


def _options(
    problem: MixProblem, model: Any, lay: Any, fi: int, keys: list[str]
) -> list[Opt] | None:
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
            Opt(
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


def _seed_factors(nk: int) -> list[tuple[float, ...]]:
    """Multipliers of the LP's prices for the seed plans: all together, then each alone."""
    out = [tuple([f] * nk) for f in (0.0, 0.5, 0.8, 1.25, 2.0, 4.0)]
    for k in range(nk):
        for f in (0.5, 2.0):
            out.append(tuple(f if i == k else 1.0 for i in range(nk)))
    return out


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
            return fallback_of("the LP relaxation did not solve to optimality", rounds)
        lp_bound = lp.objective
        lp_x = lp.x
        used_keys = budget_keys_used(problem, range(len(problem.families)))
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
    fams: list[tuple[list[Opt], dict[str, float], float, float | None]] = []
    for fi, fam in enumerate(problem.families):
        opts = _options(problem, model, lay, fi, keys)
        if opts is None:
            return fallback_of("an instance cost is negative", rounds)
        d = {v: model.cost[c] for v, c in lay.s[fi].items()}
        if any(x < -1e-15 for x in d.values()):
            return fallback_of("a loading cost is negative", rounds)
        if problem.objective == "cost":
            # equal-cost plans tie in the search; a tenth of the gap tolerance of the
            # tie-break (accuracy) separates them and only lowers the bound
            for o in opts:
                o.pa = 0.1 * mix_model.MIP_REL_GAP * scale0 * o.sa
        fams.append((opts, d, fam.load_rps(problem.headroom), fam.min_accuracy))
    scale = max(1.0, abs(lp_bound) if lp_bound is not None else 1.0)
    coupled = any(len(g) > 1 for g in mix_model.components(problem))
    pool: list[dict[tuple[tuple[int, int], ...], FamilyPlan]] = [{} for _ in fams]

    def price(
        fi: int, prices: list[float], window: float, max_nodes: int | None = None
    ) -> tuple[float, list[FamilyPlan], int]:  # fmt: skip
        o, d, load, floor = fams[fi]
        if floor is None:
            seed = rounded_plan(o, d, load, budgets, prices)
            if seed is not None:
                add_plan(pool[fi], seed)
        known = [priced_cost(p, prices) for p in pool[fi].values()]
        if window == 0.0 and GROUPED and floor is not None:
            try:
                got = grouped_optimum(
                    o, d, load, budgets, tuple(prices), deadline=deadline,
                    upper=min(known, default=math.inf), floor=floor, max_nodes=GROUPED_NODES,
                )  # fmt: skip
            except TooBig:
                got = None
            if got is not None:
                for p in got[1]:
                    add_plan(pool[fi], p)
                return got
        z, plans, n = family_plans(
            o, d, load, budgets, tuple(prices), window, deadline=deadline,
            upper=min(known, default=math.inf), floor=floor,
            max_nodes=MAX_NODES if max_nodes is None else max_nodes,
        )  # fmt: skip
        for p in plans:
            add_plan(pool[fi], p)
        return z, plans, n

    try:  # the greedy plan fits the budgets together: the pool's LP is feasible from the start
        greedy = mix_model.greedy(problem, terms)
    except InfeasiblePlan:
        greedy = {}
    for fi, counts in greedy.items():
        refilled = refill(fams[fi][0], counts, fams[fi][2], fams[fi][3])
        if refilled is not None:
            add_plan(pool[fi], plan_of(fams[fi][0], fams[fi][1], refilled, nk))
    if lp_x is not None:
        # the LP relaxation's plan rounded up, per family: a first known plan (a bound that
        # prunes the first search from its first node)
        for fi, (fopts, d, _, _) in enumerate(fams):
            seed = {}
            for oi in range(len(fopts)):
                qq = max(lp_x[lay.q[fi][oi]], 0.0)
                if qq > 1e-9:
                    seed[oi] = (math.ceil(lp_x[lay.n[fi][oi]] - 1e-9), qq)
            refilled = refill(fopts, seed, fams[fi][2], fams[fi][3])
            if refilled is not None:
                add_plan(pool[fi], plan_of(fopts, d, refilled, nk))
    if coupled and nk and SEED_PRICES:
        # cheap plans at prices around the LP's, and the pool's LP first: its prices start
        # the exact searches nearer the end (the first search at the LP's prices was the
        # costliest round: no good bound yet, prices still far off)
        for factors in _seed_factors(nk):
            trial = [lk * f + (1e-3 * scale / max(b, 1.0) if f > 1 and lk == 0 else 0.0)
                     for lk, f, b in zip(lam, factors, budgets, strict=True)]  # fmt: skip
            for fi, (fopts, d, load, floor) in enumerate(fams):
                if floor is None:
                    seed_plan = rounded_plan(fopts, d, load, budgets, trial)
                    if seed_plan is not None:
                        add_plan(pool[fi], seed_plan)
        first = restricted_lp(pool, keys, budgets, big=10.0 * scale)
        if first is not None and not any(first[2]):
            lam = [max(lk, e) for lk, e in zip(first[1], floor_price, strict=True)]

    def pool_master() -> tuple[float | None, Allocation | None]:
        """The best plan over the pool (a master MILP over its plans), in time."""
        if time.perf_counter() >= deadline:
            return None, None
        everything = {fi: (0.0, list(p.values())) for fi, p in enumerate(pool)}
        master, cols, _ = build_master(problem, terms, everything, [], keys, budgets, unit=unit)
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
                except TooBig:
                    # the family's own priced ILP: a bound, and its plan joins the pool
                    # (the search at later prices starts from it)
                    got: dict[int, tuple[int, float]] = {}
                    low = priced_bound(problem, terms, fi, keys, lam, got, unit=unit)
                    if low is None or not got:
                        raise
                    plan = plan_of(fams[fi][0], fams[fi][1], got, nk)
                    add_plan(pool[fi], plan)
                    z, n = low, 0
                if math.isinf(z):
                    return {}, {"name": "highs", "status": "infeasible", "gap": None,
                                "method": "decomposition"}  # fmt: skip
                zsum += z
                nodes += n
        except (OutOfTime, TooBig):
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
        rmp = restricted_lp(pool, keys, budgets, big=10.0 * scale)
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
        return finish_proof(
            problem, terms, pool, keys, budgets, model=model, inc=inc, ld=best_ld, lam=lam,
            info={"lp_s": round(lp_s, 4), "price_rounds": cg, "prices_s": round(cg_s, 4),
                  "rounds": rounds, "t0": t0, "deadline": deadline, "unit": unit},
            alloc=incumbent,
        )  # fmt: skip

    def give_up(reason: str) -> Fallback:
        out = fallback_of(reason, rounds, incumbent, best_ld * unit)
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
        results: dict[int, tuple[float, list[FamilyPlan]]] = {}
        nodes = 0
        for fi in range(len(fams)):
            if fi in hard:
                continue
            try:
                z, plans, n = price(fi, lam, window)
            except OutOfTime:
                return give_up(f"over its time budget of {budget_s:g} s")
            except TooBig:
                low = priced_bound(problem, terms, fi, keys, lam, unit=unit)
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
        master, cols, mlay = build_master(
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
            **solver_sizes(
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
