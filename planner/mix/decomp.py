"""Exact Lagrangian decomposition of ``plan mix`` for many families sharing budgets.

The joint ILP couples families only through the shared budget rows: with budget prices,
every plan within ``Delta`` of the incumbent has each family within ``Delta`` of its own
priced optimum, so a per-family branch and bound lists those plans and a small master MILP
picks the best combination, globally exact. Applies to ``strategy="ilp"`` with several
families; when it gives up (over :data:`BUDGET_S`, no proof) the caller runs the joint ILP
warm-started with its best plan. Objectives are scaled by the optimum's magnitude (carbon
per request is ~1e-5 g, below HiGHS's tolerances). The derivation is in docs/plan.md
("plan mix") and docs/models.md ("Decomposing plan mix").
"""

from __future__ import annotations

import math
import time
from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.planner.mix import budget as mix_budget
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
    problem: MixProblem, terms: Terms, *, time_limit_s: float | None, started: float | None = None
) -> tuple[Allocation, dict[str, Any]] | Fallback:
    """Solve ``problem`` exactly by Lagrangian decomposition, or say why it gives up.

    Prices come from the LP relaxation's budget duals refined by column generation; then every
    plan within ``Delta = INC - LD`` of each family's priced optimum enters a master MILP
    over the shared budgets; "hard" families enter with their full ILP rows (docs/models.md).
    The tie-break gets what is left of the planning budget since ``started``.

    Returns:
        (allocation, solver info) with ``status`` ``optimal`` (proven gap <= MIP_REL_GAP) or
        ``infeasible`` (empty allocation); or a :class:`Fallback` (the reason, the best
        plan and the best bound) to let the caller run the joint ILP.
    """
    try:
        run = _Decomposition(problem, terms, time_limit_s, started)
        run.seed_pool()
        run.price_rounds()
        return run.prove()
    except _Done as done:
        return done.value


class _Done(Exception):
    """The decomposition's answer, from whichever step settles it."""

    def __init__(self, value: tuple[Allocation, dict[str, Any]] | Fallback) -> None:
        super().__init__()
        self.value = value


def _infeasible(**extra: Any) -> _Done:
    return _Done(
        ({}, {"name": "highs", "status": "infeasible", "gap": None, "method": "decomposition",
              **extra})
    )  # fmt: skip


_Family = tuple[list[Opt], dict[str, float], float, float | None]


class _Decomposition:
    """One run of :func:`solve_decomposed`: the model in units of its size, the budget
    prices, each family's options, load and floor, the pool of plans found, and the best
    bound, prices and plan so far."""

    def __init__(
        self, problem: MixProblem, terms: Terms, time_limit_s: float | None, started: float | None
    ) -> None:
        self.problem, self.terms = problem, terms
        self.t0 = time.perf_counter()
        self.started = self.t0 if started is None else started
        self.rounds: list[dict[str, Any]] = []
        self.budget_s = BUDGET_S if time_limit_s is None else min(BUDGET_S, 0.6 * time_limit_s)
        self.deadline = self.t0 + self.budget_s
        self.second = tie_break(problem.objective)
        # without the MIR rows: the LP below only prices the budgets (3x faster, same prices
        # to within a percent on the benchmark)
        self.model, self.lay = mix_model.build_model(problem, terms, single=False, cuts=False)
        # Work in units of the objective's size: carbon per request is ~1e-5 g, far below
        # HiGHS's absolute tolerances (1e-7 on rows and reduced costs, 1e-9 on the MIP gap).
        self.unit = mix_model.objective_unit(problem, self.model, self.lay)
        self.model.cost = [c / self.unit for c in self.model.cost]
        self.keys = list(problem.budgets)
        self.budgets = tuple(float(problem.budgets[k]) for k in self.keys)
        self.nk = len(self.keys)
        lam, lp_bound, self.lp_x = self._lp_prices(time_limit_s)
        self.lp_s = time.perf_counter() - self.t0
        self.scale = max(1.0, abs(lp_bound) if lp_bound is not None else 1.0)
        # Objectives without an instance cost (accuracy; carbon where no option has an idle
        # power, see MixOption) tie between plans of every count split of the same quotas; a
        # small price floor (any price >= 0 keeps the bound valid; this one costs at most a
        # tenth of the gap tolerance) keeps the cheapest ones.
        self.floor_price = [0.0] * self.nk
        if problem.objective in ("accuracy", "carbon"):
            self.floor_price = [
                0.1 * mix_model.MIP_REL_GAP * self.scale / (self.nk * max(b, 1.0))
                for b in self.budgets
            ]
        self.lam = [max(lk, e) for lk, e in zip(lam, self.floor_price, strict=True)]
        self.fams = self._families()
        self.coupled = any(len(g) > 1 for g in mix_model.components(problem))
        self.pool: list[dict[tuple[tuple[int, int], ...], FamilyPlan]] = [{} for _ in self.fams]
        self.best_ld, self.best_lam = -math.inf, list(self.lam)
        self.cg: list[dict[str, Any]] = []
        self.incumbent: Allocation | None = None
        self.inc: float | None = None
        self.cg_s = 0.0

    def _lp_prices(
        self, time_limit_s: float | None
    ) -> tuple[list[float], float | None, list[float] | None]:
        """The shared budget rows' prices: the LP relaxation's duals (and its bound, plan)."""
        lam = [0.0] * self.nk
        self.lp_dual: list[float] | None = None
        if not self.nk:
            return lam, None, None
        lp = mix_model.solve_highs(self.model, time_limit_s, relax=True)
        self.lp_dual = lp.row_dual if mix_model.LP_FIRST else None
        if lp.status == "infeasible":
            raise _infeasible(solve_s=round(lp.seconds, 4))
        if lp.row_dual is None or lp.status != "optimal":
            raise _Done(fallback_of("the LP relaxation did not solve to optimality", self.rounds))
        used_keys = budget_keys_used(self.problem, range(len(self.problem.families)))
        # build_model appends the used budget rows last, in budgets order
        duals = lp.row_dual[len(lp.row_dual) - len(used_keys) :]
        for k, dual in zip(used_keys, duals, strict=True):
            lam[self.keys.index(k)] = max(0.0, -float(dual))
        return lam, lp.objective, lp.x

    def _families(self) -> list[_Family]:
        """Each family's options as the search sees them, loading costs, load and floor."""
        fams: list[_Family] = []
        for fi, fam in enumerate(self.problem.families):
            opts = _options(self.problem, self.model, self.lay, fi, self.keys)
            if opts is None:
                raise _Done(fallback_of("an instance cost is negative", self.rounds))
            d = {v: self.model.cost[c] for v, c in self.lay.s[fi].items()}
            if any(x < -1e-15 for x in d.values()):
                raise _Done(fallback_of("a loading cost is negative", self.rounds))
            if self.problem.objective == "cost":
                # equal-cost plans tie in the search; a tenth of the gap tolerance of the
                # tie-break (accuracy) separates them and only lowers the bound
                for o in opts:
                    o.pa = 0.1 * mix_model.MIP_REL_GAP * self.scale * o.sa
            fams.append((opts, d, fam.load_rps(self.problem.headroom), fam.min_accuracy))
        return fams

    def price(
        self, fi: int, prices: list[float], window: float, max_nodes: int | None = None
    ) -> tuple[float, list[FamilyPlan], int]:
        """Family ``fi``'s plans within ``window`` of its optimum at ``prices`` (they join
        the pool): the per-variant search where it applies, else the per-option one."""
        o, d, load, floor = self.fams[fi]
        budgets, pool = self.budgets, self.pool[fi]
        if floor is None:
            seed = rounded_plan(o, d, load, budgets, prices)
            if seed is not None:
                add_plan(pool, seed)
        known = [priced_cost(p, prices) for p in pool.values()]
        if window == 0.0 and GROUPED and floor is not None:
            try:
                got = grouped_optimum(
                    o, d, load, budgets, tuple(prices), deadline=self.deadline,
                    upper=min(known, default=math.inf), floor=floor, max_nodes=GROUPED_NODES,
                )  # fmt: skip
            except TooBig:
                got = None
            if got is not None:
                for p in got[1]:
                    add_plan(pool, p)
                return got
        z, plans, n = family_plans(
            o, d, load, budgets, tuple(prices), window, deadline=self.deadline,
            upper=min(known, default=math.inf), floor=floor,
            max_nodes=MAX_NODES if max_nodes is None else max_nodes,
        )  # fmt: skip
        for p in plans:
            add_plan(pool, p)
        return z, plans, n

    def seed_pool(self) -> None:
        """First plans: the greedy plan (it fits the budgets together, so the pool's LP is
        feasible from the start), the LP relaxation's plan rounded up, and cheap plans at
        prices around the LP's (then the pool's LP prices start the exact searches)."""
        fams, nk = self.fams, self.nk
        try:
            greedy = mix_model.greedy(self.problem, self.terms)
        except InfeasiblePlan:
            greedy = {}
        for fi, counts in greedy.items():
            refilled = refill(fams[fi][0], counts, fams[fi][2], fams[fi][3])
            if refilled is not None:
                add_plan(self.pool[fi], plan_of(fams[fi][0], fams[fi][1], refilled, nk))
        if self.lp_x is not None:
            for fi, (fopts, d, _, _) in enumerate(fams):
                seed = {}
                for oi in range(len(fopts)):
                    qq = max(self.lp_x[self.lay.q[fi][oi]], 0.0)
                    if qq > 1e-9:
                        seed[oi] = (math.ceil(self.lp_x[self.lay.n[fi][oi]] - 1e-9), qq)
                refilled = refill(fopts, seed, fams[fi][2], fams[fi][3])
                if refilled is not None:
                    add_plan(self.pool[fi], plan_of(fopts, d, refilled, nk))
        if not (self.coupled and nk and SEED_PRICES):
            return
        for factors in _seed_factors(nk):
            trial = [lk * f + (1e-3 * self.scale / max(b, 1.0) if f > 1 and lk == 0 else 0.0)
                     for lk, f, b in zip(self.lam, factors, self.budgets, strict=True)]  # fmt: skip
            for fi, (fopts, d, load, floor) in enumerate(fams):
                if floor is None:
                    seed_plan = rounded_plan(fopts, d, load, self.budgets, trial)
                    if seed_plan is not None:
                        add_plan(self.pool[fi], seed_plan)
        first = restricted_lp(self.pool, self.keys, self.budgets, big=10.0 * self.scale)
        if first is not None and not any(first[2]):
            self.lam = [max(lk, e) for lk, e in zip(first[1], self.floor_price, strict=True)]

    def pool_master(self) -> tuple[float | None, Allocation | None]:
        """The best plan over the pool (a master MILP over its plans), in time."""
        if time.perf_counter() >= self.deadline:
            return None, None
        everything = {fi: (0.0, list(p.values())) for fi, p in enumerate(self.pool)}
        master, cols, _ = build_master(
            self.problem, self.terms, everything, [], self.keys, self.budgets, unit=self.unit
        )
        left = max(self.deadline - time.perf_counter(), 0.05)
        res = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
        if res.x is None or res.objective is None:
            return None, None
        xs = res.x
        return res.objective, {
            fi: dict(plan.counts) for j, (fi, plan) in cols.items() if xs[j] > 0.5
        }

    def _price_all(self, lam: list[float]) -> tuple[float, int]:
        """Every family's priced optimum at ``lam`` (a hard one's own priced ILP gives a
        bound, and its plan joins the pool): their sum and the nodes searched."""
        zsum, nodes = 0.0, 0
        for fi in range(len(self.fams)):
            try:
                z, _, n = self.price(fi, lam, 0.0, PRICE_NODES)
            except TooBig:
                got: dict[int, tuple[int, float]] = {}
                low = priced_bound(
                    self.problem, self.terms, fi, self.keys, lam, got, unit=self.unit
                )
                if low is None or not got:
                    raise
                plan = plan_of(self.fams[fi][0], self.fams[fi][1], got, self.nk)
                add_plan(self.pool[fi], plan)
                z, n = low, 0
            if math.isinf(z):
                raise _infeasible()
            zsum += z
            nodes += n
        return zsum, nodes

    def price_rounds(self) -> None:
        """Column generation: exact prices, then the pool's best plan; done when that plan
        meets the bound (proven without enumerating the gap)."""
        coupled, nk = self.coupled, self.nk
        lam = self.lam
        self.best_ld, self.best_lam = -math.inf, list(lam)
        pool_solved = False
        for _ in range(MAX_CG if coupled and nk else 1):
            if time.perf_counter() > self.deadline:
                break
            t1 = time.perf_counter()
            try:
                zsum, nodes = self._price_all(lam)
            except (OutOfTime, TooBig):
                break  # the rounds below handle hard families and the time budget
            ld = zsum - sum(lk * b for lk, b in zip(lam, self.budgets, strict=True))
            if ld > self.best_ld:
                self.best_ld, self.best_lam = ld, list(lam)
            step: dict[str, Any] = {
                "ld": ld,
                "nodes": nodes,
                "price_s": round(time.perf_counter() - t1, 4),
            }
            self.cg.append(step)
            if not nk or not coupled:
                break
            new_lam = self._next_prices(lam, step)
            if new_lam is None:
                break
            value = step["rmp"]
            if value is not None and value - self.best_ld <= mix_model.MIP_REL_GAP * abs(value):
                # the pool's LP is within the proof's tolerance of the bound: its best plan
                # (the master over the pool, >= the LP) may already meet it; then no more rounds
                self.inc, self.incumbent = self.pool_master()
                step["pool_master"] = self.inc
                if self._meets(self.inc):
                    pool_solved = True
                    break
            lam = new_lam
        self.lam = self.best_lam
        if not pool_solved and coupled and nk and math.isfinite(self.best_ld):
            self.inc, self.incumbent = self.pool_master()
        self.cg_s = time.perf_counter() - self.t0 - self.lp_s
        if self.incumbent is not None and self.inc is not None and self._meets(self.inc):
            raise _Done(
                finish_proof(
                    self.problem, self.terms, self.pool, self.keys, self.budgets,
                    model=self.model, inc=self.inc, ld=self.best_ld, lam=self.lam,
                    lp_dual=self.lp_dual,
                    info={"lp_s": round(self.lp_s, 4), "price_rounds": self.cg,
                          "prices_s": round(self.cg_s, 4), "rounds": self.rounds,
                          "t0": self.t0, "started": self.started,
                          "deadline": self.deadline, "unit": self.unit},
                    alloc=self.incumbent,
                )
            )  # fmt: skip

    def _meets(self, inc: float | None) -> bool:
        """Whether a plan of value ``inc`` meets the best bound within the gap tolerance."""
        return inc is not None and inc - self.best_ld <= mix_model.MIP_REL_GAP * max(
            abs(inc), 1e-12
        )

    def _next_prices(self, lam: list[float], step: dict[str, Any]) -> list[float] | None:
        """The pool's LP's prices (``step["rmp"]``: its value, None while the pool cannot
        fit the budgets); None when the prices have converged."""
        rmp = restricted_lp(self.pool, self.keys, self.budgets, big=10.0 * self.scale)
        if rmp is None:
            return None
        value, new_lam, over = rmp
        if any(over):
            # the pool cannot fit the budgets yet: its duals are the overuse penalty; raise
            # the prices of the overused budgets step by step instead
            new_lam = [
                max(2.0 * lk, 1e-3 * self.scale / max(b, 1.0)) if o else lk
                for lk, b, o in zip(lam, self.budgets, over, strict=True)
            ]
        new_lam = [max(lk, e) for lk, e in zip(new_lam, self.floor_price, strict=True)]
        step["rmp"] = None if any(over) else value
        if (not any(over) and value - self.best_ld <= CG_TOL * self.scale) or new_lam == lam:
            return None
        return new_lam

    def give_up(self, reason: str) -> _Done:
        """The fallback with the best plan and bound so far."""
        out = fallback_of(reason, self.rounds, self.incumbent, self.best_ld * self.unit)
        out.price_rounds = self.cg
        return _Done(out)

    def _enumerate(
        self, window: float, hard: dict[int, float]
    ) -> tuple[dict[int, tuple[float, list[FamilyPlan]]], int]:
        """Every family's plans within ``window`` at the best prices; a family too big to
        enumerate joins ``hard`` with its own priced ILP's bound."""
        results: dict[int, tuple[float, list[FamilyPlan]]] = {}
        nodes = 0
        for fi in range(len(self.fams)):
            if fi in hard:
                continue
            try:
                z, plans, n = self.price(fi, self.lam, window)
            except OutOfTime:
                raise self.give_up(f"over its time budget of {self.budget_s:g} s") from None
            except TooBig:
                low = priced_bound(
                    self.problem, self.terms, fi, self.keys, self.lam, unit=self.unit
                )
                if low is None:
                    raise self.give_up("a hard family's own ILP did not solve") from None
                hard[fi] = low
                if len(hard) > MAX_HARD:
                    raise self.give_up(
                        f"more than {MAX_HARD} families too hard to enumerate"
                    ) from None
                continue
            if math.isinf(z):
                raise _infeasible()
            results[fi] = (z, plans)
            nodes += n
        return results, nodes

    def _first_window(self) -> float:
        """The proof's first window: the gap from the pool's best plan to the bound."""
        tie_tol = 0.0
        if self.second is not None and self.inc is not None:
            tie_tol = mix_model.TIE_BREAK_REL_TOL * abs(self.inc)
        if not self.coupled:
            return 1e-7 * self.scale if self.second is not None else 0.0
        if self.inc is not None and math.isfinite(self.best_ld):
            return max(self.inc - self.best_ld, 0.0) * (1.0 + 1e-9) + tie_tol + 1e-12 * self.scale
        return FIRST_WINDOW * self.scale

    def prove(self) -> tuple[Allocation, dict[str, Any]]:
        """Enumerate every plan within the window, solve the master, widen the window
        until the master's best plan lies within it; then the proven gap, the tie-break."""
        scale = self.scale
        window = self._first_window()
        hard: dict[int, float] = {}  # family -> lower bound on its priced optimum
        for widening in range(WIDENINGS):
            if time.perf_counter() > self.deadline:
                raise self.give_up(f"over its time budget of {self.budget_s:g} s")
            t1 = time.perf_counter()
            results, nodes = self._enumerate(window, hard)
            enum_s = time.perf_counter() - t1
            ld = (
                sum(z for z, _ in results.values())
                + sum(hard.values())
                - sum(lk * b for lk, b in zip(self.lam, self.budgets, strict=True))
            )
            self.best_ld = max(self.best_ld, ld)
            master, cols, mlay = build_master(
                self.problem, self.terms, results, sorted(hard), self.keys, self.budgets,
                unit=self.unit,
            )  # fmt: skip
            left = max(self.deadline - time.perf_counter(), 0.05)
            res = mix_model.solve_highs(master, left, rel_gap=MASTER_REL_GAP)
            self.rounds.append(
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
                raise _infeasible()
            if res.x is None or res.objective is None:
                # too few plans per family to fit the budgets together
                window = max(window * 10.0, FIRST_WINDOW * scale)
                continue
            inc = self.inc = res.objective
            alloc = self._allocation(res.x, cols, mlay, hard)
            self.incumbent = alloc
            tie_tol = mix_model.TIE_BREAK_REL_TOL * abs(inc) if self.second is not None else 0.0
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
                raise self.give_up(f"master stopped: {res.status}")
            mbound = res.bound if res.bound is not None and math.isfinite(res.bound) else inc
            proven = min(mbound, ld + window)
            gap = max(inc - proven, 0.0) / max(abs(inc), 1e-12)
            if gap > mix_model.MIP_REL_GAP:
                raise self.give_up(f"proven gap {gap:.3g} above the tolerance")
            proven_s = time.perf_counter() - self.t0
            tb: dict[str, Any] | None = None
            if self.second is not None:
                alloc, tb = self._tie_break(master, cols, mlay, hard, inc + tie_tol, res.x)
            return alloc, self._info(master, gap, proven, proven_s, tb)
        raise self.give_up("no proof after the last round")

    def _allocation(
        self, x: list[float], cols: dict[int, tuple[int, FamilyPlan]], mlay: Any, hard: Any
    ) -> Allocation:
        """The master's plan: hard families' own columns, the others' chosen plans."""
        alloc: Allocation = mix_model.extract(self.problem, mlay, x) if hard else {}
        for j, (fi, plan) in cols.items():
            if x[j] > 0.5:
                alloc[fi] = dict(plan.counts)
        return alloc

    def _tie_break(
        self,
        master: Any,
        cols: dict[int, tuple[int, FamilyPlan]],
        mlay: Any,
        hard: dict[int, float],
        rhs: float,
        x0: list[float],
    ) -> tuple[Allocation, dict[str, Any]]:
        """The joint ILP's tie-break: the best secondary among plans within ``rhs`` (hard
        families' own columns carry their primary and secondary costs), started from the
        proven master plan ``x0`` and kept when it stops at its budget without a better one."""
        assert self.second is not None
        sec_cost = [0.0] * len(master.cost)
        if hard:
            m2, _ = mix_model.build_model(
                self.problem, self.terms, single=False, objective=self.second,
                subset=sorted(hard),
            )  # fmt: skip
            sec_cost[: len(m2.cost)] = m2.cost
        idx = [j for j, c in enumerate(master.cost) if c != 0 or j in cols]
        master.row(
            idx,
            [cols[j][1].cost if j in cols else master.cost[j] for j in idx],
            -math.inf,
            rhs,
        )
        for j in range(len(master.cost)):
            master.cost[j] = cols[j][1].second if j in cols else sec_cost[j]
        left = mix_budget.tie_break_seconds(
            self.started, self.deadline - time.perf_counter(), families=len(self.problem.families)
        )
        res2 = mix_model.solve_highs(master, left, x0, rel_gap=MASTER_REL_GAP)
        tb = {
            "objective": self.second,
            "status": mix_budget.TIE_BREAK_STATUS.get(res2.status, res2.status),
            "budget_s": round(left, 4),
            "solve_s": round(res2.seconds, 4),
        }
        best = res2.x if res2.x is not None and res2.status in ("optimal", "time_limit") else x0
        return self._allocation(best, cols, mlay, hard), tb

    def _info(
        self, master: Any, gap: float, proven: float, proven_s: float, tb: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The solver info of a proven plan: bounds, prices, rounds and times."""
        maximise = mix_model.is_maximise(self.problem.objective)
        unit = self.unit
        info: dict[str, Any] = {
            "name": "highs",
            "method": "decomposition: Lagrangian prices (LP duals refined by column "
            "generation), exact per-family enumeration within the bound gap, master MILP "
            "over shared budgets",
            "status": "optimal",
            "gap": gap,
            "objective_bound": (-proven if maximise else proven) * unit,
            "lagrangian_bound": (-self.best_ld if maximise else self.best_ld) * unit,
            "prices": dict(zip(self.keys, self.lam, strict=True)),
            "lp_s": round(self.lp_s, 4),
            "price_rounds": self.cg,
            "prices_s": round(self.cg_s, 4),
            "rounds": self.rounds,
            "solve_s": round(time.perf_counter() - self.t0, 4),
            "proven_s": round(proven_s, 4),
            **solver_sizes(
                self.problem,
                columns=len(master.cost),
                rows=len(master.rows),
                integer=sum(master.integer),
            ),
        }
        if tb is not None:
            info["tie_break"] = tb
        return info
