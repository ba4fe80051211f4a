"""The ``plan mix`` problem and its exact model, shared by the planner and the decomposition.

The problem data (:class:`MixProblem` and its families, variants and options), the
objective terms and their evaluation, the flat MILP (:func:`build_model`), the solver calls
(:func:`solve`, :func:`solve_highs`), the greedy baseline that also warm-starts the ILP, and
the reading of a solution back into an :data:`Allocation`. The formulation is described in
:mod:`greenctl.planner.mix.solve`; :mod:`greenctl.planner.mix.decomp` imports it from here, not from
``mix``, so that ``mix`` can call the decomposition without an import circle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from greenctl.data.errors import InfeasiblePlan
from greenctl.data.limits import SLO_QUANTILES
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core import solvers
from greenctl.planner.core.balanced import (
    DEFAULT_ALPHA,
    DEFAULT_BETA,
    DEFAULT_GAMMA,
    REFERENCE_CARBON_INTENSITY,
)

#: Relative MIP gap at which a plan counts as optimal (HiGHS's default is 1e-4).
MIP_REL_GAP = 1e-6
#: How much of the primary optimum (relative) the tie-break may give up.
TIE_BREAK_REL_TOL = 1e-7


# --------------------------------------------------------------------------------------------
# Problem data
# --------------------------------------------------------------------------------------------
@dataclass
class MixVariant:
    """A variant as the planner sees it."""

    name: str
    accuracy: float
    load_time_s: float = 0.0


@dataclass
class MixOption:
    """One candidate deployment unit: an instance of ``variant`` on ``resource`` at ``batch``.

    Energy is priced as the evaluation core accounts it
    (:func:`greenctl.planner.core.evaluate.energy_terms`): every instance draws
    ``idle_power_w`` whether it serves or not, and each request it serves adds
    ``energy_j_per_request`` (its busy power above idle times its busy time per request). A
    plan's power is then ``sum n x idle_power_w + sum served x energy_j_per_request``, the
    core's ``power_w``: exactly for an instance serving one request at a time, at
    ``energy_rate_rps`` per instance for a batching one (``energy_linear`` False).
    """

    variant: str
    resource: str
    batch: int
    capacity_rps: float  # per instance, at the SLO and percentile
    cost_per_hour: float  # per instance
    energy_j_per_request: float | None  # per request served, above idle (class docstring)
    latency_ms: float | None = None  # the instance's latency at the planning percentile
    usage: dict[str, float] = field(default_factory=dict)  # budget key -> amount per instance
    capacity_source: str = "load-tested"  # load-tested@SLO | queueing
    hardware: str | None = None
    profile: Profile | None = field(default=None, repr=False, compare=False)
    priced: bool = True  # False: cost_per_hour is the resource amount (no price known)
    idle_power_w: float = 0.0  # per instance, served or not (class docstring)
    #: the profile row at every measured batch size up to ``batch`` of its (variant,
    #: resource): a batching instance's service model, for re-pricing its energy
    sizes: dict[int, Profile] = field(default_factory=dict, repr=False, compare=False)
    #: the per-instance rate (req/s) the energy terms were taken at; None: not from the core
    energy_rate_rps: float | None = None
    #: whether the terms hold at every rate (False: a batching instance, exact at
    #: ``energy_rate_rps`` only)
    energy_linear: bool = True

    def energy_at_capacity(self, headroom: float = 0.0) -> float | None:
        """Joules per request served by an instance filled to its capacity (its quota
        ``capacity_rps`` serves ``capacity_rps / (1 + headroom)`` requests per second)."""
        if self.energy_j_per_request is None:
            return None
        served = self.capacity_rps / (1.0 + headroom)
        return self.energy_j_per_request + self.idle_power_w / served

    @property
    def key(self) -> tuple[str, str, int, str | None]:
        return (self.variant, self.resource, self.batch, self.hardware)


@dataclass
class MixFamily:
    """One model family: its load, SLO, variants and candidate options."""

    name: str
    rate_rps: float
    slo_ms: float
    variants: dict[str, MixVariant]
    options: list[MixOption]
    min_accuracy: float | None = None
    pruned: int = 0  # options removed as dominated
    ineligible: list[str] = field(default_factory=list)  # "variant on resource: why"
    lowest_slo: tuple[float, str] | None = None  # lowest SLO one instance meets, and where

    def load_rps(self, headroom: float) -> float:
        return self.rate_rps * (1.0 + headroom)


@dataclass
class MixProblem:
    """Everything ``plan_mix`` needs; ``request`` is the canonical input document."""

    families: list[MixFamily]
    percentile: str = "p95"
    budgets: dict[str, float] = field(default_factory=dict)
    objective: str = "balanced"
    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    carbon_intensity: float | None = None  # gCO2/kWh
    reference_carbon_intensity: float = REFERENCE_CARBON_INTENSITY
    pue: float = 1.0
    headroom: float = 0.0
    current: list[Deployment] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: The profile behind each option (variant, resource, batch) and the variant records,
    #: for the evaluation core's prediction of the finished plan (optional).
    profiles: dict[tuple[str, str, int], Profile] = field(default_factory=dict)
    variant_records: dict[str, Variant] = field(default_factory=dict)
    #: The measured serving path per family, or under "*" for all (``greenctl profile
    #: serving``; an evaluate.ServingPath or bare overhead samples in ms): added to the
    #: predicted latencies.
    serving: dict[str, Any] = field(default_factory=dict)

    @property
    def quantile(self) -> float:
        return SLO_QUANTILES[self.percentile]

    @property
    def intensity(self) -> float:
        """The carbon intensity used (the reference one when none was given)."""
        if self.carbon_intensity is None:
            return self.reference_carbon_intensity
        return self.carbon_intensity

    @property
    def total_load(self) -> float:
        return sum(f.load_rps(self.headroom) for f in self.families)

    @property
    def total_rate(self) -> float:
        """The requests per second served (the load without headroom)."""
        return sum(f.rate_rps for f in self.families)

    def running_variants(self) -> set[str]:
        return {d.variant for d in self.current}


# --------------------------------------------------------------------------------------------
# Objective terms (shared by the ILP, the baselines, the brute force in tests and reporting)
# --------------------------------------------------------------------------------------------
#: An allocation: per family index, per option index -> (count, quota_rps).
Allocation = dict[int, dict[int, tuple[int, float]]]


@dataclass
class Terms:
    """Per-option linear coefficients of every objective term.

    Energy and carbon have a term per request (on the quota ``q``: the busy energy above
    idle) and one per instance (on the count ``n``: its idle power), the evaluation core's
    accounting (:class:`MixOption`): summed over a plan they are the energy and carbon per
    request its ``predicted`` block reports.
    """

    acc: list[list[float]]  # AA coefficient of q
    cc: list[list[float]]  # CC coefficient of q
    rc: list[list[float]]  # RC coefficient of n
    carbon: list[list[float]]  # carbon g/request coefficient of q
    lc: list[dict[str, float]]  # LC coefficient of s_v for variants that start new
    use_cc: bool
    ref: list[dict[str, Any]]  # per family reference (most accurate single-variant plan)
    cc_n: list[list[float]] = field(default_factory=list)  # CC coefficient of n (idle)
    carbon_n: list[list[float]] = field(default_factory=list)  # carbon g/request of n (idle)
    energy: list[list[float]] = field(default_factory=list)  # J/request coefficient of q
    energy_n: list[list[float]] = field(default_factory=list)  # J/request coefficient of n


def count_bounds(problem: MixProblem, fi: int) -> list[int]:
    """Per option the largest count any optimal plan needs (also the indicators' big-M)."""
    fam = problem.families[fi]
    load = fam.load_rps(problem.headroom)
    out = []
    for o in fam.options:
        u = math.ceil(load / o.capacity_rps - 1e-9) if load > 0 else 0
        for k, amount in o.usage.items():
            if amount > 0:
                u = min(u, math.floor(problem.budgets[k] / amount + 1e-9))
        out.append(max(u, 0))
    return out


def _reference(problem: MixProblem, fi: int) -> dict[str, Any]:
    """The most accurate variant able to serve the family alone on one option type."""
    fam = problem.families[fi]
    load = fam.load_rps(problem.headroom)
    bounds = count_bounds(problem, fi)
    best: dict[str, Any] | None = None
    for oi, o in enumerate(fam.options):
        need = math.ceil(load / o.capacity_rps - 1e-9) if load > 0 else 0
        feasible = need <= bounds[oi] or not o.usage
        acc = fam.variants[o.variant].accuracy
        cost = need * o.cost_per_hour
        energy = None
        if o.energy_j_per_request is not None:
            # the core's accounting: every instance's idle power over the requests served,
            # plus the busy energy above idle of each
            energy = o.energy_j_per_request
            if fam.rate_rps > 0:
                energy += need * o.idle_power_w / fam.rate_rps
        cand = {
            "variant": o.variant,
            "resource": o.resource,
            "count": need,
            "accuracy": acc,
            "cost_per_hour": cost,
            "energy_j_per_request": energy,
            "feasible": feasible,
        }
        rank = (feasible, acc, -cost)
        if best is None or rank > best["_rank"]:
            best = {**cand, "_rank": rank}
    if best is None:
        return {"variant": None, "cost_per_hour": 0.0, "energy_j_per_request": None}
    best.pop("_rank")
    return best


def objective_terms(problem: MixProblem) -> Terms:
    """Linear coefficients of AA, RC, LC, CC and carbon per request, per option.

    Energy per request of a plan = (``sum n x idle_power_w`` + ``sum served x
    energy_j_per_request``) / total rate served, where an option's quota ``q`` serves
    ``q / (1 + headroom)`` requests per second; carbon = energy / 3.6e6 x PUE x intensity.
    CC is each family's energy per request over its reference plan's, weighted by its share
    of the rate (and by intensity over the reference intensity).
    """
    total = problem.total_load or 1.0
    served = problem.total_rate or 1.0
    refs = [_reference(problem, fi) for fi in range(len(problem.families))]
    use_cc = all(
        o.energy_j_per_request is not None for f in problem.families for o in f.options
    ) and all((r.get("energy_j_per_request") or 0) > 0 for r in refs if r.get("variant"))
    cref_total = sum(r.get("cost_per_hour") or 0.0 for r in refs) or 1.0
    running = problem.running_variants()
    lmax = max((v.load_time_s for f in problem.families for v in f.variants.values()), default=0.0)
    ci = problem.intensity
    g_per_j = problem.pue * ci / 3.6e6
    acc, cc, rc, carbon, lc = [], [], [], [], []
    cc_n, carbon_n, energy, energy_n = [], [], [], []
    for fi, fam in enumerate(problem.families):
        acc.append([fam.variants[o.variant].accuracy / total for o in fam.options])
        # per unit of quota: served / total rate = q / total load
        energy.append([(o.energy_j_per_request or 0.0) / total for o in fam.options])
        energy_n.append(
            [
                o.idle_power_w / served if o.energy_j_per_request is not None else 0.0
                for o in fam.options
            ]
        )
        carbon.append([e * g_per_j for e in energy[-1]])
        carbon_n.append([e * g_per_j for e in energy_n[-1]])
        eref = refs[fi].get("energy_j_per_request") or 0.0
        if use_cc and eref > 0:
            scale = (ci / problem.reference_carbon_intensity) / eref
            cc.append([e * scale for e in energy[-1]])
            cc_n.append([e * scale for e in energy_n[-1]])
        else:
            cc.append([0.0 for _ in fam.options])
            cc_n.append([0.0 for _ in fam.options])
        if problem.budgets:
            nb = len(problem.budgets)
            rc.append(
                [
                    sum(
                        a / problem.budgets[k] / nb
                        for k, a in o.usage.items()
                        if problem.budgets[k] > 0
                    )
                    for o in fam.options
                ]
            )
        else:
            rc.append([o.cost_per_hour / cref_total for o in fam.options])
        lc.append(
            {
                name: (v.load_time_s / (lmax * len(problem.families)) if lmax > 0 else 0.0)
                for name, v in fam.variants.items()
                if name not in running
            }
        )
    return Terms(acc, cc, rc, carbon, lc, use_cc, refs, cc_n, carbon_n, energy, energy_n)


def evaluate_allocation(
    problem: MixProblem, alloc: Allocation, terms: Terms | None = None
) -> dict[str, Any]:
    """Metrics and objective value of an allocation (counts and quotas per option)."""
    t = terms or objective_terms(problem)
    aa = rc = lc = cc = carbon = cost = energy = 0.0
    lat = 0.0
    for fi, opts in alloc.items():
        fam = problem.families[fi]
        started = set()
        for oi, (n, qq) in opts.items():
            if n <= 0 and qq <= 0:
                continue
            o = fam.options[oi]
            aa += t.acc[fi][oi] * qq
            cc += t.cc[fi][oi] * qq + t.cc_n[fi][oi] * n
            carbon += t.carbon[fi][oi] * qq + t.carbon_n[fi][oi] * n
            rc += t.rc[fi][oi] * n
            cost += o.cost_per_hour * n
            energy += t.energy[fi][oi] * qq + t.energy_n[fi][oi] * n
            if n > 0:
                started.add(o.variant)
                if o.latency_ms is not None:
                    lat = max(lat, o.latency_ms)
        lc += sum(t.lc[fi].get(v, 0.0) for v in started)
    if problem.objective == "accuracy":
        obj = aa
    elif problem.objective == "cost":
        obj = cost
    elif problem.objective == "carbon":
        obj = carbon
    else:
        obj = aa - problem.alpha * rc - problem.beta * lc - problem.gamma * cc
    return {
        "accuracy": aa,
        "cost_per_hour": cost,
        "energy_j_per_request": energy,
        "carbon_g_per_request": carbon,
        "latency_ms": lat or None,
        "terms": {"AA": aa, "RC": rc, "LC": lc, "CC": cc},
        "objective": obj,
    }


def is_maximise(objective: str) -> bool:
    return objective in ("accuracy", "balanced")


# --------------------------------------------------------------------------------------------
# The exact model
# --------------------------------------------------------------------------------------------
@dataclass
class Model:
    """A MILP in flat arrays: minimise ``cost . x`` subject to ``row_lb <= A x <= row_ub``."""

    cost: list[float] = field(default_factory=list)
    lb: list[float] = field(default_factory=list)
    ub: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)

    def col(self, cost: float, lb: float, ub: float, integer: bool = False) -> int:
        self.cost.append(cost)
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        return len(self.cost) - 1

    def row(self, idx: list[int], coef: list[float], lb: float, ub: float) -> None:
        self.rows.append((idx, coef, lb, ub))


@dataclass
class Layout:
    n: dict[int, list[int]]  # family index -> column of each option's count
    q: dict[int, list[int]]  # family index -> column of each option's quota
    s: dict[int, dict[str, int]]  # family index -> indicator column per variant


def build_model(
    problem: MixProblem,
    terms: Terms,
    *,
    single: bool,
    objective: str | None = None,
    subset: Sequence[int] | None = None,
    cuts: bool = True,
) -> tuple[Model, Layout]:
    objective = objective or problem.objective
    fis = list(range(len(problem.families))) if subset is None else list(subset)
    inf = math.inf
    m = Model()
    sign = -1.0 if is_maximise(objective) else 1.0
    running = problem.running_variants()
    lay = Layout({}, {}, {})
    budget_rows: dict[str, tuple[list[int], list[float]]] = {k: ([], []) for k in problem.budgets}
    for fi in fis:
        fam = problem.families[fi]
        load = fam.load_rps(problem.headroom)
        bounds = count_bounds(problem, fi)
        ncols, qcols = [], []
        for oi, o in enumerate(fam.options):
            if objective == "cost":
                cn, cq = o.cost_per_hour, 0.0
            elif objective == "carbon":
                cn, cq = terms.carbon_n[fi][oi], terms.carbon[fi][oi]
            elif objective == "accuracy":
                cn, cq = 0.0, terms.acc[fi][oi]
            else:
                cn = -problem.alpha * terms.rc[fi][oi] - problem.gamma * terms.cc_n[fi][oi]
                cq = terms.acc[fi][oi] - problem.gamma * terms.cc[fi][oi]
            u = bounds[oi]
            nc = m.col(sign * cn, 0.0, float(u), True)
            qc = m.col(sign * cq, 0.0, min(load, o.capacity_rps * u))
            ncols.append(nc)
            qcols.append(qc)
            m.row([qc, nc], [1.0, -o.capacity_rps], -inf, 0.0)
            for k, a in o.usage.items():
                budget_rows[k][0].append(nc)
                budget_rows[k][1].append(a)
        lay.n[fi] = ncols
        lay.q[fi] = qcols
        m.row(qcols, [1.0] * len(qcols), load, load)
        # The same cover stated on the integer counts alone: redundant for the LP, but a
        # knapsack row the solver derives cover and MIR cuts from (ceil effects per family).
        if fam.options and load > 0:
            caps = [o.capacity_rps for o in fam.options]
            m.row(ncols, caps, load, inf)
            if MIR_CUTS and cuts:
                for idx, coef, rhs in _mir_cuts(caps, load):
                    m.row([ncols[i] for i in idx], coef, rhs, inf)
        floor = fam.min_accuracy
        if floor is not None and fam.options:
            m.row(
                qcols,
                [fam.variants[o.variant].accuracy - floor for o in fam.options],
                -1e-9 * max(load, 1.0),
                inf,
            )
        # indicators: "variant newly started" (balanced) or "the one variant" (single)
        need_s = objective == "balanced" and problem.beta > 0
        sv: dict[str, int] = {}
        for vname in sorted({o.variant for o in fam.options}):
            new = vname not in running
            if not (single or (need_s and new)):
                continue
            lc = terms.lc[fi].get(vname, 0.0) if (need_s and new) else 0.0
            sc = m.col(sign * (-problem.beta * lc), 0.0, 1.0, True)
            sv[vname] = sc
            for oi, o in enumerate(fam.options):
                if o.variant == vname:
                    m.row([ncols[oi], sc], [1.0, -float(bounds[oi])], -inf, 0.0)
        if single and sv:
            m.row(list(sv.values()), [1.0] * len(sv), -inf, 1.0)
        lay.s[fi] = sv
    for k, (idx, coef) in budget_rows.items():
        if idx:
            m.row(idx, coef, -inf, problem.budgets[k])
    return m, lay


#: The MIR rows of :func:`_mir_cuts`, added to each family's cover; off: HiGHS's own cut
#: generation does without them. Measured with :data:`MIP_OPTIONS` (``bench/bench_mix.py
#: --quick``, load 3.5 on 2 cores): the same plans and proven optima; a one-family plan
#: 72 -> 18 ms, the 30-family decomposition 0.23 -> 0.11 s. Kept as a switch for the
#: benchmarks' comparison (``bench/bench_replay.py --only speed-fixes``).
MIR_CUTS = False

#: HiGHS options of every mix ILP: a restart after root reduced-cost fixing and the
#: feasibility-jump heuristic are fixed costs that did not pay on greenctl's mix ILPs, from
#: one family (about 110 columns) to the 30-family joint ILP: on the 165 distinct ILPs of a
#: replayed day (MIR rows off) 23.7 -> 12.9 ms of CPU per solve, the same optimum on every
#: one; ``bench/bench_mix.py --quick``: the same plans, and smaller gaps at the joint ILP's
#: time limit.
MIP_OPTIONS: dict[str, object] = {
    "mip_allow_restart": False,
    "mip_heuristic_run_feasibility_jump": False,
}


def _mir_cuts(caps: list[float], load: float) -> list[tuple[list[int], list[float], float]]:
    """Mixed-integer rounding cuts of the cover ``sum c_o n_o >= L`` (n integer).

    Dividing by each distinct capacity ``c_j`` gives ``sum a_o n_o >= b`` with ``a_o = c_o/c_j``,
    ``b = L/c_j``; with ``f = b - floor(b) > 0`` and ``f_o = a_o - floor(a_o)`` the MIR
    inequality ``sum (ceil(a_o) - max(0, f - f_o)/f) n_o >= ceil(b)`` is valid for every
    integer solution and cuts off the relaxation's fractional instance counts.
    """
    out = []
    for cj in sorted(set(caps)):
        b = load / cj
        f = b - math.floor(b)
        if f < 1e-6 or f > 1 - 1e-6:
            continue
        idx, coef = [], []
        for i, c in enumerate(caps):
            a = c / cj
            fa = a - math.floor(a)
            if fa < 1e-9 or fa > 1 - 1e-9:
                value = float(round(a))
            else:
                value = math.ceil(a) - max(0.0, f - fa) / f
            if value > 1e-12:
                idx.append(i)
                coef.append(value)
        out.append((idx, coef, float(math.ceil(b))))
    return out


@dataclass
class SolveResult:
    status: str  # optimal | time_limit | time_limit_no_solution | infeasible
    x: list[float] | None
    objective: float | None  # in the model's (minimisation) sense
    bound: float | None
    gap: float | None
    seconds: float
    build_seconds: float = 0.0
    row_dual: list[float] | None = None  # LP relaxations only


def solve(
    model: Model,
    *,
    solver: str,
    time_limit_s: float | None,
    start: list[float] | None = None,
) -> SolveResult:
    if solver == "cbc":
        return _solve_cbc(model, time_limit_s)
    return solve_highs(model, time_limit_s, start)


def solve_highs(
    model: Model,
    time_limit_s: float | None,
    start: list[float] | None = None,
    *,
    relax: bool = False,
    rel_gap: float = MIP_REL_GAP,
) -> SolveResult:
    """HiGHS through highspy, the whole model passed as CSC arrays in one call.

    pulp's ``HiGHS`` adapter adds columns and rows one Python call at a time and first builds
    pulp expression objects; for the 100-family case (12,000+ columns) that alone costs more
    than the solve, so the ILP strategy hands HiGHS its arrays directly (same solver).
    ``relax=True`` solves the LP relaxation and returns the row duals.
    """
    import highspy
    import numpy as np

    t0 = time.perf_counter()
    ncol = len(model.cost)
    lp = highspy.HighsLp()
    lp.num_col_ = ncol
    lp.num_row_ = len(model.rows)
    inf = highspy.kHighsInf
    lp.col_cost_ = np.asarray(model.cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(model.lb, dtype=np.float64)
    lp.col_upper_ = np.asarray([inf if math.isinf(u) else u for u in model.ub], dtype=np.float64)
    lp.row_lower_ = np.asarray(
        [-inf if math.isinf(r[2]) else r[2] for r in model.rows], dtype=np.float64
    )
    lp.row_upper_ = np.asarray(
        [inf if math.isinf(r[3]) else r[3] for r in model.rows], dtype=np.float64
    )
    # row-wise triplets -> row-major matrix
    starts = [0]
    index: list[int] = []
    value: list[float] = []
    for idx, coef, _, _ in model.rows:
        index.extend(idx)
        value.extend(coef)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=np.float64)
    if not relax:
        lp.integrality_ = [
            highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
            for i in model.integer
        ]
    options: dict[str, object] = {"mip_rel_gap": rel_gap, "mip_abs_gap": 1e-9}
    # more primal heuristics than HiGHS's default 0.05: on the 100-family benchmark the
    # default left the incumbent at the greedy warm start within a 10 s limit
    options["mip_heuristic_effort"] = 0.3
    if not relax:
        options.update(MIP_OPTIONS)
    if time_limit_s is not None:
        options["time_limit"] = float(time_limit_s)
    h = solvers.new_highs(options)
    h.passModel(lp)
    if start is not None:  # a feasible plan (the greedy one) as the first incumbent
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)
    build = time.perf_counter() - t0
    h.run()
    seconds = time.perf_counter() - t0
    outcome = solvers.highs_outcome(
        h, what="the mix LP relaxation" if relax else "the mix ILP", limits=True
    )
    info = h.getInfo()
    has_sol = info.primal_solution_status == 2
    if outcome == solvers.LIMIT:
        status = "time_limit" if has_sol else "time_limit_no_solution"
    else:
        status = outcome  # optimal | infeasible
    x = list(h.getSolution().col_value) if has_sol else None
    obj = info.objective_function_value if has_sol else None
    if x is not None and obj is not None and start is not None and not relax:
        # HiGHS 1.16 can report the optimum's value while handing back the warm start as the
        # solution (seen on a two-family problem presolve solved: value -0.48125, start's
        # -0.475). The value of what it returns is the truth; when the two disagree, solve
        # again without the start.
        got = float(np.dot(lp.col_cost_, np.asarray(x, dtype=np.float64)))
        if abs(got - obj) > 1e-9 * max(1.0, abs(obj)):
            return solve_highs(model, time_limit_s, None, relax=relax, rel_gap=rel_gap)
    gap = None
    bound = None
    if relax:
        duals = list(h.getSolution().row_dual) if has_sol else None
        return SolveResult(status, x, obj, obj, 0.0, seconds, build, duals)
    if any(model.integer):
        bound = info.mip_dual_bound
        gap = info.mip_gap if has_sol else None
    return SolveResult(status, x, obj, bound, gap, seconds, build)


#: Solve the LP relaxation before a mix ILP: a rounded LP plan that meets its bound is the
#: proven optimum (:func:`rounded_solution`), and its duals bound what a tie-break may move
#: (:func:`implied_bounds`). Off: the ILPs alone (the benchmark's comparison).
LP_FIRST = True


def rounded_solution(model: Model, x: Sequence[float]) -> tuple[list[float], float] | None:
    """The LP relaxation's solution ``x`` with its integer columns rounded up, and its
    value, when that satisfies every row and bound (None otherwise).

    Rounding counts and indicators up keeps ``q <= capacity x n`` and ``n <= u x s``; only a
    budget row (or a bound) can break, which the check catches. When the value meets the
    LP bound within the gap tolerance the rounded plan is a proven optimum, no search needed.
    """
    out = list(x)
    for j, integer in enumerate(model.integer):
        if integer:
            out[j] = float(math.ceil(out[j] - 1e-9))
            if out[j] > model.ub[j] + 1e-9:
                return None
        elif out[j] < model.lb[j] - 1e-9 or out[j] > model.ub[j] + 1e-9:
            return None
    for idx, coef, lo, hi in model.rows:
        v = sum(out[j] * a for j, a in zip(idx, coef, strict=True))
        if v < lo - 1e-7 * max(1.0, abs(lo)) or v > hi + 1e-7 * max(1.0, abs(hi)):
            return None
    return out, math.fsum(c * v for c, v in zip(model.cost, out, strict=True))


def implied_bounds(
    model: Model, row_dual: Sequence[float], rhs: float
) -> tuple[list[float], list[float]]:
    """Column bounds every solution with ``cost . x <= rhs`` satisfies (reduced-cost fixing).

    Any row prices ``y`` (sign-clipped to the rows' finite sides) give the Lagrangian bound
    ``cost . x >= L(y) + sum_j |d_j| x (distance of x_j from its cheaper bound)`` with
    ``d = cost - A^T y``; so column ``j`` stays within ``(rhs - L) / |d_j|`` of that bound.
    Valid for any ``y``; the LP relaxation's duals make it tight. The tie-break ILP gets
    these bounds: with the primary optimum fixed, most quotas can only move by slivers (a
    sliver under the MIP's feasibility tolerance counts as none).
    """
    d = list(model.cost)
    low = 0.0
    for (idx, coef, lo, hi), y in zip(model.rows, row_dual, strict=True):
        y = float(y)
        if (y > 0 and math.isinf(lo)) or (y < 0 and math.isinf(hi)):
            y = 0.0
        if y == 0.0:
            continue
        low += y * (lo if y > 0 else hi)
        for j, a in zip(idx, coef, strict=True):
            d[j] -= y * a
    for j, dj in enumerate(d):
        if dj != 0.0:
            end = model.lb[j] if dj > 0 else model.ub[j]
            if math.isinf(end):
                return list(model.lb), list(model.ub)
            low += dj * end
    slack = rhs - low + 1e-9 * max(1.0, abs(rhs), abs(low))
    lb, ub = list(model.lb), list(model.ub)
    if slack < 0:  # no solution meets rhs: leave the ILP to say so
        return lb, ub
    for j, dj in enumerate(d):
        # a continuous column's room below the MIP's feasibility tolerance (of its range) is
        # none: HiGHS would otherwise fill it by stretching a row (a quota on no instance)
        snap = 0.0 if model.integer[j] else 1e-6 * max(1.0, model.ub[j] - model.lb[j])
        if dj > 0:
            top = lb[j] + slack / dj
            if model.integer[j]:
                top = math.floor(top + 1e-9)
            elif top - lb[j] < snap:
                top = lb[j]
            ub[j] = max(min(ub[j], top), lb[j])
        elif dj < 0:
            bottom = ub[j] - slack / -dj
            if model.integer[j]:
                bottom = math.ceil(bottom - 1e-9)
            elif ub[j] - bottom < snap:
                bottom = ub[j]
            lb[j] = min(max(lb[j], bottom), ub[j])
    return lb, ub


def _solve_cbc(model: Model, time_limit_s: float | None) -> SolveResult:
    """CBC through pulp (a separate process reading an MPS file)."""
    import pulp

    solver = solvers.cbc_solver(time_limit_s=time_limit_s, gap_rel=MIP_REL_GAP, gap_abs=1e-9)
    t0 = time.perf_counter()
    prob = pulp.LpProblem("mix", pulp.LpMinimize)
    xs = [
        prob.add_variable(
            f"x{i}",
            lowBound=lb,
            upBound=None if math.isinf(ub) else ub,
            cat=pulp.LpInteger if it else pulp.LpContinuous,
        )
        for i, (lb, ub, it) in enumerate(zip(model.lb, model.ub, model.integer, strict=True))
    ]
    prob.setObjective(
        pulp.LpAffineExpression([(xs[i], c) for i, c in enumerate(model.cost) if c != 0])
    )
    for r, (idx, coef, lo, hi) in enumerate(model.rows):
        expr = pulp.LpAffineExpression([(xs[i], c) for i, c in zip(idx, coef, strict=True)])
        if lo == hi:
            prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintEQ, f"r{r}", lo))
            continue
        if not math.isinf(lo):
            prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintGE, f"l{r}", lo))
        if not math.isinf(hi):
            prob.addConstraint(pulp.LpConstraint(expr, pulp.LpConstraintLE, f"u{r}", hi))
    build = time.perf_counter() - t0
    solvers.pulp_solve(prob, solver, what="the mix ILP")
    seconds = time.perf_counter() - t0
    outcome = solvers.pulp_outcome(prob, what="the mix ILP", time_limit_s=time_limit_s)
    if outcome == solvers.INFEASIBLE:
        return SolveResult("infeasible", None, None, None, None, seconds, build)
    if outcome == solvers.OPTIMAL:
        status = "optimal"
    elif prob.sol_status == pulp.LpSolutionIntegerFeasible:
        status = "time_limit"
    else:
        return SolveResult("time_limit_no_solution", None, None, None, None, seconds, build)
    x = [float(v.varValue or 0.0) for v in xs]
    obj = sum(c * xv for c, xv in zip(model.cost, x, strict=True))
    return SolveResult(status, x, obj, None, 0.0 if status == "optimal" else None, seconds, build)


def warm_start(
    problem: MixProblem,
    terms: Terms,
    lay: Layout,
    ncols: int,
    alloc: Allocation | None = None,
) -> list[float] | None:
    """``alloc`` (else the greedy plan) as a column vector, or None when greedy finds none."""
    if alloc is None:
        try:
            alloc = greedy(problem, terms)
        except InfeasiblePlan:
            return None
    x = [0.0] * ncols
    for fi, opts in alloc.items():
        if fi not in lay.n:
            continue
        for oi, (n, qq) in opts.items():
            x[lay.n[fi][oi]] = float(n)
            x[lay.q[fi][oi]] = qq
            sc = lay.s[fi].get(problem.families[fi].options[oi].variant)
            if sc is not None and n > 0:
                x[sc] = 1.0
    return x


def extract(problem: MixProblem, lay: Layout, x: list[float]) -> Allocation:
    """Counts and quotas from a solution; counts trimmed to what the quotas need."""
    alloc: Allocation = {}
    for fi in lay.n:
        fam = problem.families[fi]
        opts: dict[int, tuple[int, float]] = {}
        for oi, o in enumerate(fam.options):
            qq = max(0.0, x[lay.q[fi][oi]])
            n = round(x[lay.n[fi][oi]])
            if qq <= 1e-7:
                qq = 0.0
            need = math.ceil(qq / o.capacity_rps - 1e-7) if qq > 0 else 0
            n = min(n, need) if n >= need else n
            if n > 0 or qq > 0:
                opts[oi] = (n, qq)
        alloc[fi] = opts
    return alloc


def components(problem: MixProblem) -> list[list[int]]:
    """Groups of families coupled by a budget that options of more than one family use.

    Families in different groups share no constraint, so solving each group on its own is
    exact (the objective is a sum over families) and much faster than one joint tree.
    """
    parent = list(range(len(problem.families)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first: dict[str, int] = {}
    for fi, fam in enumerate(problem.families):
        for k in {k for o in fam.options for k in o.usage}:
            if k in first:
                parent[find(fi)] = find(first[k])
            else:
                first[k] = fi
    groups: dict[int, list[int]] = {}
    for fi in range(len(problem.families)):
        groups.setdefault(find(fi), []).append(fi)
    return list(groups.values())


def objective_unit(problem: MixProblem, model: Model, lay: Layout, fis: Any = None) -> float:
    """The objective's order of magnitude: per family its cheapest cost per req/s x load."""
    total = 0.0
    for fi, fam in enumerate(problem.families):
        if fis is not None and fi not in fis:
            continue
        load = fam.load_rps(problem.headroom)
        rates = [
            abs(model.cost[lay.q[fi][oi]]) + abs(model.cost[lay.n[fi][oi]]) / o.capacity_rps
            for oi, o in enumerate(fam.options)
        ]
        total += min(rates, default=0.0) * load
    return total if total > 1e-300 else 1.0


# --------------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------------
def _greedy_options(
    problem: MixProblem, scale: dict[str, float]
) -> tuple[dict[int, list[int]], dict[int, int]]:
    """Per family the options whose variant meets its accuracy floor on its own, and the
    most budget-efficient of them (most capacity per share of the budgets, ``scale`` being
    one over each budget; the cheapest per req/s without budgets)."""
    allowed: dict[int, list[int]] = {}
    efficient: dict[int, int] = {}
    for fi, fam in enumerate(problem.families):
        floor = fam.min_accuracy
        allowed[fi] = [
            oi
            for oi, o in enumerate(fam.options)
            if floor is None or fam.variants[o.variant].accuracy >= floor - 1e-12
        ]
        if not allowed[fi]:
            raise InfeasiblePlan(
                f"the greedy heuristic found no variant of '{fam.name}' meeting the accuracy "
                "floor on its own",
                hint="try --strategy ilp, which mixes variants to meet the floor",
            )

        def per_rps(oi: int, fam: MixFamily = fam) -> tuple[float, float]:
            o = fam.options[oi]
            share = sum(a * scale[k] for k, a in o.usage.items())
            return (share / o.capacity_rps, o.cost_per_hour / o.capacity_rps)

        efficient[fi] = min(allowed[fi], key=per_rps)

    return allowed, efficient


def greedy(problem: MixProblem, terms: Terms) -> Allocation:
    """INFaaS-style replicate-or-upgrade heuristic.

    First every family is served by its most budget-efficient option (feasibility). Then,
    family by family (largest load first), variants are tried in the objective's order of
    preference among those meeting the accuracy floor: each step replicates a small option or
    upgrades to a larger one, whichever serves the remaining load at the lower objective cost
    per useful req/s, if the rest still fits its efficient option; else the rest downgrades to
    the next variant. Details in docs/models.md ("The greedy mix heuristic").
    """
    budgets = problem.budgets
    scale = {k: 1.0 / b if b > 0 else 0.0 for k, b in budgets.items()}
    order = sorted(
        range(len(problem.families)),
        key=lambda i: -problem.families[i].load_rps(problem.headroom),
    )
    allowed, efficient = _greedy_options(problem, scale)

    def need(fi: int, load: float) -> tuple[int, dict[str, float]]:
        o = problem.families[fi].options[efficient[fi]]
        count = math.ceil(load / o.capacity_rps - 1e-9) if load > 1e-9 else 0
        return count, {k: count * o.usage.get(k, 0.0) for k in budgets}

    pool = dict(budgets)
    held: dict[int, dict[str, float]] = {}
    for fi in order:
        _, use = need(fi, problem.families[fi].load_rps(problem.headroom))
        held[fi] = use
        for k, a in use.items():
            pool[k] -= a
    if any(v < -1e-9 for v in pool.values()):
        raise InfeasiblePlan(
            "the greedy heuristic found no plan: the budgets do not cover the load even on "
            "the most budget-efficient options",
            hint="try --strategy ilp, which is exact",
        )
    alloc: Allocation = {}
    for fi in order:
        fam = problem.families[fi]
        left = {k: pool[k] + held[fi][k] for k in budgets}
        remaining = fam.load_rps(problem.headroom)
        by_var: dict[str, list[int]] = {}
        for oi in allowed[fi]:
            by_var.setdefault(fam.options[oi].variant, []).append(oi)

        def pref(v: str, by_var: dict[str, list[int]] = by_var, fam: MixFamily = fam) -> Any:
            acc = fam.variants[v].accuracy
            opts = [fam.options[i] for i in by_var[v]]
            if problem.objective == "cost":
                return (min(o.cost_per_hour / o.capacity_rps for o in opts), -acc)
            if problem.objective == "carbon":
                return (min(o.energy_at_capacity(problem.headroom) or 0.0 for o in opts), -acc)
            return (-acc,)

        opts_alloc: dict[int, tuple[int, float]] = {}
        for v in sorted(by_var, key=pref):
            while remaining > 1e-9:
                best: tuple[tuple[float, ...], int] | None = None
                for oi in by_var[v]:
                    o = fam.options[oi]
                    served = min(o.capacity_rps, remaining)
                    _, rest = need(fi, remaining - served)
                    if any(left[k] - o.usage.get(k, 0.0) - rest[k] < -1e-9 for k in budgets):
                        continue
                    score: tuple[float, ...] = (o.cost_per_hour / served, -o.capacity_rps)
                    if problem.objective == "carbon":
                        grams = terms.carbon_n[fi][oi] + terms.carbon[fi][oi] * served
                        score = (grams / served, *score)
                    if best is None or score < best[0]:
                        best = (score, oi)
                if best is None:
                    break  # this variant cannot take more: downgrade the rest
                oi = best[1]
                o = fam.options[oi]
                served = min(o.capacity_rps, remaining)
                n, qq = opts_alloc.get(oi, (0, 0.0))
                opts_alloc[oi] = (n + 1, qq + served)
                remaining -= served
                for k, a in o.usage.items():
                    left[k] -= a
            if remaining <= 1e-9:
                break
        if remaining > 1e-6:  # cannot happen: the efficient option always fits
            raise InfeasiblePlan(
                f"the greedy heuristic found no plan for '{fam.name}'",
                hint="try --strategy ilp, which is exact",
            )
        alloc[fi] = opts_alloc
        pool = left
    return alloc
