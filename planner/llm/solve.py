"""Plan LLM serving exactly: instances per tier and each tier's share of requests (a MILP).

Each (variant, resource) profiled is an option with a capacity per instance
(:func:`~greenctl.planner.llm.model.capacity` at the SLOs). Integer instances ``n`` and
continuous rates ``r`` per option: ``r <= n x capacity``, ``sum r = rate``, the budget of each
resource kind (cores, GPUs) holds ``sum n x amount``, and the request-weighted quality meets
the floor. Energy per request is ``(sum r x dynamic J/request + sum n x idle W) / rate`` (the
accounting of the mix kind), carbon that x PUE x intensity / 3.6e6; cost is the instances'
hourly cost; balanced is the mix kind's ``quality - alpha RC - gamma CC`` (maximised).
HiGHS solves it through :mod:`greenctl.planner.core.solvers`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.llm_profiles import LLMProfile
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Variant
from greenctl.data.resources import hourly_cost, parse_resource
from greenctl.planner.core import solvers
from greenctl.planner.llm.model import (
    OperatingPoint,
    TierCurve,
    capacity,
    operating_point,
    tier_curve,
)
from greenctl.planner.llm.request import LLMRequest

_J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class TierOption:
    """One tier on one resource, as the MILP sees it."""

    curve: TierCurve
    capacity_rps: float  # per instance, at the SLOs
    kind: str  # the budget it draws on (cpu, gpu)
    amount: float  # of that budget per instance
    max_count: int
    dynamic_j: float | None  # per request above idle, at capacity
    cost_per_hour: float

    @property
    def variant(self) -> str:
        return self.curve.variant

    @property
    def quality(self) -> float:
        return self.curve.quality


@dataclass
class LLMProblem:
    """An LLM request and the options it is planned over."""

    request: LLMRequest
    options: list[TierOption]
    #: every tier curve profiled on a budgeted resource (capacity 0 ones included)
    curves: list[TierCurve] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def g_per_j(self) -> float:
        return self.request.pue * self.request.intensity / _J_PER_KWH


def build_problem(
    request: LLMRequest, variants: Sequence[Variant], profiles: Sequence[LLMProfile]
) -> LLMProblem:
    """The options of ``request``'s family: its tiers' newest profiles on the budget's kinds.

    Raises:
        InputError: the family has no LLM profiles. InfeasiblePlan: none on a budgeted kind.
    """
    quality = {v.name: float(v.accuracy or 0.0) for v in variants}
    runs: dict[tuple[str, str], list[LLMProfile]] = {}
    for row in profiles:
        if row.variant in quality:
            runs.setdefault((row.variant, row.resource), []).append(row)
    if not runs:
        raise InputError(
            f"no LLM profiles of family {request.model!r}",
            hint=f"profile its tiers with `greenctl profile llm --family {request.model} ...`",
        )
    problem = LLMProblem(request, [])
    need_energy = request.objective != "cost"
    for (name, resource), rows in sorted(runs.items()):
        res = parse_resource(resource)
        if res.kind not in request.budget:
            continue
        curve = tier_curve(
            rows,
            quality=quality[name],
            percentile=request.percentile,
            prompt_tokens=request.prompt_tokens,
            output_tokens=request.output_tokens,
        )
        problem.curves.append(curve)
        cap = capacity(curve, request.ttft_ms, request.tpot_ms, request.percentile)
        if cap <= 0:
            continue
        at_cap = operating_point(curve, cap, request.percentile)
        dynamic = at_cap.dynamic_j_per_request if at_cap is not None else None
        if need_energy and dynamic is None:
            problem.notes.append(
                f"{name} on {resource} has no energy figures: left out of a "
                f"{request.objective} plan (plan with --objective cost to use it)"
            )
            continue
        amount = res.amount
        problem.options.append(
            TierOption(
                curve=curve,
                capacity_rps=cap,
                kind=res.kind,
                amount=amount,
                max_count=math.floor(request.budget[res.kind] / amount + 1e-9),
                dynamic_j=dynamic,
                cost_per_hour=hourly_cost(resource, curve.cost_per_hour)[0],
            )
        )
    if not problem.curves:
        kinds = sorted({r for _, r in runs})
        raise InfeasiblePlan(
            f"no tier of {request.model!r} was profiled on the budget's resources "
            f"({', '.join(sorted(request.budget))}); profiled on {', '.join(kinds)}",
            hint="give a budget of the kind its tiers were profiled on",
        )
    return problem


# -- the MILP ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Allocation:
    """Instances and rates (req/s) per option of a problem."""

    counts: tuple[int, ...]
    rates: tuple[float, ...]


def reference_energy(problem: LLMProblem) -> float | None:
    """Energy per request (J) of the balanced objective's reference: the highest-quality
    option serving the whole rate alone (its idle power included)."""
    rate = problem.request.rate_rps
    best = max(problem.options, key=lambda o: (o.quality, -o.amount), default=None)
    if best is None or best.dynamic_j is None:
        return None
    need = math.ceil(rate / best.capacity_rps - 1e-9)
    return best.dynamic_j + need * best.curve.idle_w / rate


def objective_coefficients(problem: LLMProblem) -> tuple[list[float], list[float]]:
    """Linear costs (minimised) of each option's instances and of its rate."""
    req = problem.request
    rate = req.rate_rps
    per_n: list[float] = []
    per_r: list[float] = []
    eref = reference_energy(problem) if req.objective == "balanced" else None
    budget_scale = {k: 1.0 / (v * len(req.budget)) for k, v in req.budget.items()}
    for o in problem.options:
        dyn, idle = o.dynamic_j or 0.0, o.curve.idle_w
        if req.objective == "energy":
            per_n.append(idle / rate)
            per_r.append(dyn / rate)
        elif req.objective == "carbon":
            per_n.append(idle / rate * problem.g_per_j)
            per_r.append(dyn / rate * problem.g_per_j)
        elif req.objective == "cost":
            per_n.append(o.cost_per_hour)
            per_r.append(0.0)
        else:  # balanced, maximised: minimise its negative
            cc = (req.intensity / req.reference_carbon_intensity) / eref if eref else 0.0
            per_n.append(req.alpha * o.amount * budget_scale[o.kind] + req.gamma * cc * idle / rate)
            per_r.append(-o.quality / rate + req.gamma * cc * dyn / rate)
    return per_n, per_r


def solve(problem: LLMProblem, *, maximise_rate: bool = False) -> Allocation | None:
    """The least-objective allocation (None: infeasible). ``maximise_rate``: instead the
    largest rate the budget serves within the SLOs and the quality floor (``sum r`` free)."""
    import highspy

    req = problem.request
    opts = problem.options
    if not opts:
        return None
    inf = highspy.kHighsInf
    h = solvers.new_highs({"mip_rel_gap": 1e-9, "mip_abs_gap": 1e-12})
    per_n, per_r = objective_coefficients(problem)
    if maximise_rate:
        per_n, per_r = [0.0] * len(opts), [-1.0] * len(opts)
    for i, o in enumerate(opts):
        h.addCol(per_n[i], 0.0, float(o.max_count), 0, [], [])
        h.changeColIntegrality(i, highspy.HighsVarType.kInteger)
    k = len(opts)
    for i, o in enumerate(opts):
        h.addCol(per_r[i], 0.0, inf, 0, [], [])
        h.addRow(-inf, 0.0, 2, [k + i, i], [1.0, -o.capacity_rps])  # r <= n x capacity
    rates = list(range(k, 2 * k))
    if not maximise_rate:
        h.addRow(req.rate_rps, req.rate_rps, k, rates, [1.0] * k)
    if req.min_quality is not None:  # sum (q - floor) r >= 0
        h.addRow(0.0, inf, k, rates, [o.quality - req.min_quality for o in opts])
    for kind, amount in req.budget.items():
        idx = [i for i, o in enumerate(opts) if o.kind == kind]
        if idx:
            h.addRow(-inf, amount + 1e-9, len(idx), idx, [opts[i].amount for i in idx])
    h.run()
    if solvers.highs_outcome(h, what="the llm MILP") == solvers.INFEASIBLE:
        return None
    x = list(h.getSolution().col_value)
    counts = tuple(round(v) for v in x[:k])
    flows = tuple(max(float(v), 0.0) for v in x[k:])
    return Allocation(counts, flows)


# -- the plan ------------------------------------------------------------------------------------
def evaluate(problem: LLMProblem, alloc: Allocation) -> dict[str, Any]:
    """What an allocation predicts: per-tier operating points, the plan's percentiles (the
    worst tier serving requests), quality, energy, carbon, cost and the objective value."""
    req = problem.request
    rate = sum(alloc.rates) or req.rate_rps
    tiers: list[dict[str, Any]] = []
    energy = 0.0
    energy_known = True
    cost = quality = 0.0
    worst = {"ttft": 0.0, "tpot": 0.0, "latency": 0.0}
    modeled = False
    for o, n, r in zip(problem.options, alloc.counts, alloc.rates, strict=True):
        if n <= 0:
            continue
        op = operating_point(o.curve, r / n, req.percentile) if r > 0 else None
        cost += n * o.cost_per_hour
        energy += n * o.curve.idle_w
        if r > 0:
            quality += o.quality * r / rate
            if o.dynamic_j is None:
                energy_known = False
            energy += r * (o.dynamic_j or 0.0)
            modeled = modeled or o.curve.energy_method == "modeled"
        tiers.append(_tier_row(o, n, r, rate, op, req.percentile))
        if op is not None:
            worst["ttft"] = max(worst["ttft"], op.ttft_ms)
            worst["tpot"] = max(worst["tpot"], op.tpot_ms)
            worst["latency"] = max(worst["latency"], op.latency_ms)
    j_req = energy / rate if energy_known else None
    out_tokens = _mean_output_tokens(problem, alloc)
    carbon = None if j_req is None else j_req * problem.g_per_j
    pct = req.percentile
    predicted: dict[str, Any] = {
        "rate_rps": rate,
        f"ttft_{pct}_ms": worst["ttft"],
        f"tpot_{pct}_ms": worst["tpot"],
        f"{pct}_ms": worst["latency"],
        "quality": quality,
        "accuracy": quality,
        "energy_j_per_request": j_req,
        "j_per_output_token": None if j_req is None or not out_tokens else j_req / out_tokens,
        "carbon_g_per_request": carbon,
        "carbon_intensity_g_per_kwh": req.intensity,
        "cost_per_hour": cost,
        "energy_method": "modeled" if modeled else _method(problem, alloc),
        "objective": _objective_value(problem, alloc, quality, j_req, carbon, cost),
        "objective_name": req.objective,
    }
    return {"predicted": predicted, "tiers": tiers}


def plan_llm(problem: LLMProblem) -> Plan:
    """Solve ``problem`` and write its plan document (kind ``llm``).

    Raises:
        InfeasiblePlan: no allocation meets the SLOs, the quality floor and the budget; the
            message names the closest tier or the bound that binds.
    """
    alloc = solve(problem)
    if alloc is None:
        raise infeasible(problem)
    ev = evaluate(problem, alloc)
    req = problem.request
    deployments = []
    shares: dict[str, float] = {}
    engines: dict[str, dict[str, Any]] = {}
    for o, n, r in zip(problem.options, alloc.counts, alloc.rates, strict=True):
        if n <= 0:
            continue
        deployments.append(
            Deployment(
                model=req.model,
                variant=o.variant,
                resource=o.curve.resource,
                count=n,
                batch=max(int(o.curve.max_concurrency), 1),
                quota_rps=r,
            )
        )
        shares[o.variant] = shares.get(o.variant, 0.0) + r / req.rate_rps
        wl = o.curve.workload
        engines.setdefault(
            o.variant,
            {
                "engine": o.curve.engine,
                "model": wl.get("model"),
                "endpoint": wl.get("endpoint"),
            },
        )
    extra = {
        # requests follow the tiers' shares, whatever concurrency an engine batches to
        "policy": "wrr",
        "llm": {"shares": shares, "engines": engines, "tiers": ev["tiers"]},
        "capacity": [
            {
                "variant": o.variant,
                "resource": o.curve.resource,
                "capacity_rps_per_instance": o.capacity_rps,
                "quality": o.quality,
            }
            for o in problem.options
        ],
        "solver": {"name": "highs", "status": "optimal"},
    }
    if problem.notes:
        extra["notes"] = list(problem.notes)
    return Plan(
        kind="llm",
        request=req.to_dict(),
        deployments=deployments,
        predicted=ev["predicted"],
        extra=extra,
    )


def infeasible(problem: LLMProblem) -> InfeasiblePlan:
    """Why nothing fits, naming the closest tier or the binding bound."""
    req = problem.request
    pct = req.percentile
    if not problem.options:
        best: tuple[float, str] | None = None
        for c in problem.curves:
            op = operating_point(c, 1e-9, pct)
            if op is None:
                continue
            ratio = max(op.ttft_ms / req.ttft_ms, op.tpot_ms / req.tpot_ms)
            text = (
                f"{c.variant} on {c.resource}: {pct} TTFT {op.ttft_ms:.0f} ms (SLO "
                f"{req.ttft_ms:g}), {pct} TPOT {op.tpot_ms:.1f} ms (SLO {req.tpot_ms:g}) "
                "at no load"
            )
            if best is None or ratio < best[0]:
                best = (ratio, text)
        closest = f"; closest: {best[1]}" if best else ""
        return InfeasiblePlan(
            f"no tier of {req.model!r} meets the {pct} SLOs (TTFT {req.ttft_ms:g} ms, TPOT "
            f"{req.tpot_ms:g} ms){closest}",
            hint="relax --ttft-ms/--tpot-ms, or profile a faster tier or resource",
        )
    top = max(problem.options, key=lambda o: o.quality)
    if req.min_quality is not None and top.quality < req.min_quality - 1e-12:
        return InfeasiblePlan(
            f"quality {req.min_quality:g} cannot be reached within the SLOs: the best tier "
            f"that meets them is {top.variant} (quality {top.quality:g})",
            hint=f"lower --min-quality to {top.quality:g} or relax the SLOs",
        )
    most = solve(problem, maximise_rate=True)
    served = sum(most.rates) if most is not None else 0.0
    budget = ", ".join(f"{k}={v:g}" for k, v in req.budget.items())
    err = InfeasiblePlan(
        f"budget {budget} serves at most {served:.3g} req/s of the {req.rate_rps:g} asked "
        f"within the SLOs{' and the quality floor' if req.min_quality else ''}; "
        + ", ".join(
            f"{o.variant} on {o.curve.resource}: {o.capacity_rps:.3g} req/s per instance"
            for o in problem.options
        ),
        hint="raise --budget, lower --rate, or relax the SLOs",
    )
    err.servable_scale = served / req.rate_rps
    return err


def _tier_row(
    o: TierOption, n: int, r: float, rate: float, op: OperatingPoint | None, pct: str
) -> dict[str, Any]:
    """One tier of the plan document's ``llm.tiers`` (times at the request's percentile)."""
    return {
        "variant": o.variant,
        "resource": o.curve.resource,
        "quality": o.quality,
        "share": r / rate,
        "instances": n,
        "rate_rps": r,
        "capacity_rps_per_instance": o.capacity_rps,
        "concurrency": None if op is None else op.concurrency,
        f"ttft_{pct}_ms": None if op is None else op.ttft_ms,
        f"tpot_{pct}_ms": None if op is None else op.tpot_ms,
        "j_per_request": None if op is None else op.energy_j_per_request,
        "energy_method": o.curve.energy_method,
    }


def _mean_output_tokens(problem: LLMProblem, alloc: Allocation) -> float | None:
    total = sum(alloc.rates)
    if total <= 0:
        return None
    return (
        sum(o.curve.output_tokens * r for o, r in zip(problem.options, alloc.rates, strict=True))
        / total
    )


def _method(problem: LLMProblem, alloc: Allocation) -> str:
    used = {o.curve.energy_method for o, n in zip(problem.options, alloc.counts, strict=True) if n}
    return used.pop() if len(used) == 1 else "mixed"


def _objective_value(
    problem: LLMProblem,
    alloc: Allocation,
    quality: float,
    j_req: float | None,
    carbon: float | None,
    cost: float,
) -> float | None:
    req = problem.request
    if req.objective == "carbon":
        return carbon
    if req.objective == "energy":
        return j_req
    if req.objective == "cost":
        return cost
    per_n, per_r = objective_coefficients(problem)
    penalty = sum(a * n for a, n in zip(per_n, alloc.counts, strict=True)) + sum(
        b * r for b, r in zip(per_r, alloc.rates, strict=True)
    )
    return -penalty  # quality - alpha RC - gamma CC
