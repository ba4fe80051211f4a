"""The plan document of a mix plan: its deployments, predicted figures and what it says
beside them (solver, budget use, per-family accuracy and capacity, scaling actions).

:func:`to_plan` turns a solved allocation into a ``kind="mix"`` :class:`Plan`; the figures
the planner optimised are refined by the evaluation core's analytic ``predict`` (imported
where used: it loads numpy, which ``greenctl --help`` does not need), and
:func:`scaling_actions` names what changes against the current deployment in INFaaS terms.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant
from greenctl.data.resources import kind_of, parse_resource
from greenctl.planner.core.policy import default_policy
from greenctl.planner.mix.model import Allocation, MixProblem, Terms, evaluate_allocation
from greenctl.planner.mix.problem import dispatcher_of

__all__ = ["scaling_actions", "to_plan"]


#: how far (relative) a model's quotas may miss its load and still be the load, off by a
#: solver's feasibility tolerance
QUOTA_TOLERANCE = 1e-5


def rounded_quotas(quotas: list[float], load: float, digits: int = 6) -> list[float]:
    """A model's ``quotas`` for the plan document: scaled to add up to its ``load`` when a
    solver's tolerance left them a hair short or over (a plan that serves less than the
    load keeps its quotas), and rounded to ``digits``, the largest taking what the rounding
    moved (each rounding alone drifts the sum by up to half a unit per deployment)."""
    total = sum(quotas)
    if total > 0 and abs(total - load) <= QUOTA_TOLERANCE * max(1.0, load):
        quotas = [q * load / total for q in quotas]
    out = [round(q, digits) for q in quotas]
    if out:
        big = max(range(len(out)), key=out.__getitem__)
        out[big] = round(out[big] + round(sum(quotas), digits) - sum(out), digits)
    return out


def to_plan(
    problem: MixProblem,
    alloc: Allocation,
    terms: Terms,
    *,
    strategy: str,
    solver_info: dict[str, Any],
) -> Plan:
    """The ``kind="mix"`` plan of ``alloc``: its deployments (quotas per instance group), the
    figures the solver optimised refined by the evaluation core, and the request it redoes
    from, with the ``strategy`` and the solver (``solver_info``) that produced it."""
    metrics = evaluate_allocation(problem, alloc, terms)
    deployments = []
    for fi, fam in enumerate(problem.families):
        placed = [
            (fam.options[oi], int(n), qq)
            for oi in sorted(alloc.get(fi, {}), key=lambda i: fam.options[i].key[:3])
            for n, qq in [alloc[fi][oi]]
            if n > 0
        ]
        quotas = rounded_quotas([qq for _, _, qq in placed], fam.load_rps(problem.headroom))
        deployments += [
            Deployment(
                model=fam.name, variant=o.variant, resource=o.resource, count=n, batch=o.batch,
                quota_rps=q,
            )
            for (o, n, _), q in zip(placed, quotas, strict=True)
        ]  # fmt: skip
    total_rate = sum(f.rate_rps for f in problem.families)
    lat_key = f"{problem.percentile}_ms"
    predicted: dict[str, Any] = {
        "rate_rps": total_rate,
        "accuracy": round(metrics["accuracy"], 6),
        "cost_per_hour": round(metrics["cost_per_hour"], 6),
        lat_key: metrics["latency_ms"],
        "energy_j_per_request": metrics["energy_j_per_request"],
        "carbon_g_per_request": metrics["carbon_g_per_request"],
        "carbon_intensity_g_per_kwh": problem.intensity,
        "objective": metrics["objective"],
        "objective_name": problem.objective,
        "terms": metrics["terms"],
        "method": "modeled: per-instance capacity at the SLO; latency is the slowest "
        "deployment's profiled latency at its capacity point; energy as the evaluation core "
        "accounts it (idle power per instance, busy energy above idle per request)",
    }
    extra = _plan_extra(problem, alloc, terms, strategy=strategy, solver_info=solver_info)
    if problem.notes:
        extra["notes"] = list(dict.fromkeys(problem.notes))
    if problem.current:
        extra["actions"] = scaling_actions(problem, deployments)
    try:
        predicted = _predict_with_core(
            problem, deployments, predicted, problem.profiles, problem.variant_records
        )
    except (InputError, ValueError) as exc:  # keep the planner's own figures
        problem.notes.append(f"evaluation core could not predict this plan: {exc}")
        extra["notes"] = list(dict.fromkeys(problem.notes))
    request = dict(problem.request)
    request["strategy"] = strategy
    request["solver"] = solver_info.get("name") if strategy != "greedy" else request.get("solver")
    return Plan(
        kind="mix", request=request, deployments=deployments, predicted=predicted, extra=extra
    )


def _plan_extra(
    problem: MixProblem,
    alloc: Allocation,
    terms: Terms,
    *,
    strategy: str,
    solver_info: dict[str, Any],
) -> dict[str, Any]:
    """What a mix plan says beside its deployments: the strategy and solver, each budget's
    use, each family's accuracy and capacity, each chosen option's capacity per instance and
    the reference plans the balanced objective is measured against."""
    usage: dict[str, float] = {k: 0.0 for k in problem.budgets}
    for fi, fam in enumerate(problem.families):
        for oi, (n, _) in alloc.get(fi, {}).items():
            for k, a in fam.options[oi].usage.items():
                usage[k] += a * n
    families_out = []
    for fi, fam in enumerate(problem.families):
        load = fam.load_rps(problem.headroom) or 1.0
        fa = alloc.get(fi, {})
        families_out.append(
            {
                "model": fam.name,
                "rate_rps": fam.rate_rps,
                "slo_ms": fam.slo_ms,
                "accuracy": sum(
                    fam.variants[fam.options[oi].variant].accuracy * qq
                    for oi, (_, qq) in fa.items()
                )
                / load,
                "capacity_rps": sum(fam.options[oi].capacity_rps * n for oi, (n, _) in fa.items()),
                "options": len(fam.options),
                "pruned_dominated": fam.pruned,
                "ineligible": len(fam.ineligible),
            }
        )
    return {
        "strategy": strategy,
        "solver": solver_info,
        "budget_use": {
            k: {"used": usage[k], "budget": problem.budgets[k]} for k in problem.budgets
        },
        "families": families_out,
        "capacity": [
            {
                "model": fam.name,
                "variant": fam.options[oi].variant,
                "resource": fam.options[oi].resource,
                "batch": fam.options[oi].batch,
                "capacity_rps_per_instance": fam.options[oi].capacity_rps,
                "source": fam.options[oi].capacity_source,
            }
            for fi, fam in enumerate(problem.families)
            for oi in sorted(alloc.get(fi, {}))
            if alloc[fi][oi][0] > 0
        ],
        "reference_single_plans": terms.ref,
    }


def _predict_with_core(
    problem: MixProblem,
    deployments: list[Deployment],
    predicted: dict[str, Any],
    profiles: dict[tuple[str, str, int], Profile] | None,
    variants: dict[str, Variant] | None,
) -> dict[str, Any]:
    """Refine the predicted block with the evaluation core's analytic ``predict`` (wrr).

    Needs the profiles behind the options (kept by :func:`build_mix_problem`). The solver
    priced energy by the core's rule (:func:`price_energy`), so the core's energy and carbon
    are the ones it minimised: exactly for instances serving one request at a time, and for
    batching ones priced at the rate the plan gives them (what :func:`plan_mix` re-prices
    towards). Where they still differ by more than 1e-6 (relative), the solver's own figure
    stays as ``solver_energy_j_per_request``.
    """
    if not profiles or not variants or not deployments:
        return predicted
    # Load-tested options too: their service model reproduces the load test
    # (greenctl.planner.core.service), so the analytic figures agree with the capacity sized.
    from greenctl.planner.core.evaluate import predict

    rates = {f.name: f.rate_rps for f in problem.families}
    keys = {(d.variant, d.resource, d.batch) for d in deployments}
    if not keys <= set(profiles):
        return predicted
    pairs = {(v, r) for v, r, _ in keys}  # every batch size: batching instances' models
    policy = default_policy("mix", (d.batch for d in deployments))  # what apply serves
    out = predict(
        deployments,
        {k: p for k, p in profiles.items() if (k[0], k[1]) in pairs},
        variants,
        rate_rps=rates,
        policy=policy,
        # each family's requests against its own SLO (a variant belongs to one family)
        percentile_slo_ms={v: f.slo_ms for f in problem.families for v in f.variants},
        carbon_g_per_kwh=problem.intensity,
        pue=problem.pue,
        serving=problem.serving or None,
    )
    merged = dict(predicted)
    mine, core = predicted.get("energy_j_per_request"), out.get("energy_j_per_request")
    if mine is not None and core is not None and abs(mine - core) > 1e-6 * abs(core):
        merged["solver_energy_j_per_request"] = mine
    for key in (
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "slo_violation_frac",
        "served_rps",
        "energy_j_per_request",
        "carbon_g_per_request",
        "power_w",
        "overloaded",
    ):
        if key in out:
            merged[key] = out[key]
    merged["method"] = (
        "modeled: latency, energy and carbon from the evaluation core's analytic predict "
        f"({policy} over quotas); accuracy, cost and objective from the planner, whose "
        "energy and carbon terms are the core's (idle power per instance, busy energy above "
        "idle per request served)"
    )
    if "solver_energy_j_per_request" in merged:
        merged["method"] += (
            "; solver_energy_j_per_request: the energy per request in the objective, where "
            "it differs from the core's (a batching deployment priced at another rate per "
            "instance than it gets, after the re-pricing rounds)"
        )
    merged["latency_includes"] = _latency_includes(problem, deployments)
    return merged


def _latency_includes(problem: MixProblem, deployments: Sequence[Deployment]) -> str:
    """What the predicted latencies include: the model alone or the measured serving path,
    the GPU, MIG and MPS instances whose served runs are not measured, their executor fronts
    and the dispatcher stage."""
    from greenctl.planner.core.evaluate import (
        LATENCY_MODEL_ONLY,
        LATENCY_WITH_PATH,
        dispatcher_note,
    )

    note = LATENCY_WITH_PATH if problem.serving else LATENCY_MODEL_ONLY
    unmeasured = [
        d
        for d in deployments
        if not kind_of(d.resource).pins_cores
        and f"{d.variant}@{d.resource}" not in (problem.serving or {})
    ]
    if unmeasured:
        # `profile serving` measures served runs on a CPU core only. On the H100 host resnet50
        # served at batch 8 ran 5.2-9.4 ms per batch against 3.6 ms profiled, and a plan
        # predicted at 15.6 ms p95 measured 67-98 ms: say so beside the figure.
        note += (
            "; GPU, MIG and MPS instances at their profiled run time (served runs there are "
            "not measured and can be several times slower: measure them with `greenctl "
            "profile serving --resource RESOURCE --batch B`, or check with `apply --verify`)"
        )
    note += _front_note(problem, deployments)
    if problem.serving:
        rates = {f.name: f.rate_rps for f in problem.families}
        variants = {f.name: list(f.variants) for f in problem.families}
        note += dispatcher_note(dispatcher_of(problem.serving, rates, variants))
    return note


def _front_note(problem: MixProblem, deployments: Sequence[Deployment]) -> str:
    """What ``latency_includes`` says of the executor fronts of the plan's GPU, MIG and MPS
    instances whose serving path was measured on their resource (``evaluate.front_cpu_ms``)."""
    from greenctl.planner.core.evaluate import front_cpu_ms, serving_path

    served = problem.serving or {}
    with_front, without = [], []
    for d in deployments:
        key = f"{d.variant}@{d.resource}"
        if not kind_of(d.resource).accelerator or key not in served:
            continue
        front = front_cpu_ms(serving_path(served, d.model, d.variant, d.resource), d.resource)
        if front > 0:
            with_front.append(
                f"{key}: {front:.2g} ms of CPU per request, at most {1000 / front:,.0f} req/s"
            )
        else:
            without.append(key)
    note = ""
    if with_front:
        note += (
            "; the executor front of GPU, MIG and MPS instances, a serial stage on one core "
            "before the device (" + ", ".join(dict.fromkeys(with_front)) + ")"
        )
    if without:
        note += (
            "; no executor CPU measured for "
            + ", ".join(dict.fromkeys(without))
            + ": its executor front is not modeled (the device alone); measure it with "
            "`greenctl profile serving --resource RESOURCE`"
        )
    return note


def scaling_actions(problem: MixProblem, deployments: Sequence[Deployment]) -> list[dict[str, Any]]:
    """Per variant, what changes from ``problem.current`` to ``deployments`` (INFaaS terms).

    ``keep`` (same instances), ``replicate`` (same variant, more instances, same sizes),
    ``upgrade`` (same variant on larger per-instance resources, or a new variant more
    accurate than the ones it replaces), ``downgrade`` (fewer or smaller instances, or a new
    variant less accurate than the ones it replaces), ``start`` (new variant replacing
    nothing), ``stop`` (variant no longer deployed).
    """
    acc = {name: v.accuracy for f in problem.families for name, v in f.variants.items()}
    fam_of = {name: f.name for f in problem.families for name in f.variants}

    def summary(ds: Iterable[Deployment]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for d in ds:
            key = f"{d.resource}/b{d.batch}"
            out.setdefault(d.variant, {})
            out[d.variant][key] = out[d.variant].get(key, 0) + d.count
        return out

    before = summary(problem.current)
    after = summary(deployments)
    actions: list[dict[str, Any]] = []
    stopped_by_family: dict[str, list[str]] = {}
    for v in before:
        if v not in after:
            stopped_by_family.setdefault(fam_of.get(v, ""), []).append(v)

    def units(sizes: dict[str, int]) -> float:
        total = 0.0
        for key, count in sizes.items():
            total += parse_resource(key.split("/b")[0]).amount * count
        return total

    for v in sorted(set(before) | set(after)):
        b, a = before.get(v, {}), after.get(v, {})
        fam = fam_of.get(v, "")
        entry: dict[str, Any] = {
            "model": fam,
            "variant": v,
            "before": b,
            "after": a,
            "count_before": sum(b.values()),
            "count_after": sum(a.values()),
        }
        if not a:
            entry["action"] = "stop"
        elif not b:
            stopped = stopped_by_family.get(fam, [])
            if not stopped:
                entry["action"] = "start"
            else:
                ref = max(acc.get(s, 0.0) for s in stopped)
                entry["action"] = "upgrade" if acc.get(v, 0.0) >= ref else "downgrade"
                entry["replaces"] = stopped
        elif a == b:
            entry["action"] = "keep"
        elif set(a) == set(b):
            entry["action"] = "replicate" if sum(a.values()) > sum(b.values()) else "downgrade"
        else:
            entry["action"] = (
                "upgrade"
                if units(a) / max(sum(a.values()), 1) > units(b) / max(sum(b.values()), 1)
                else ("replicate" if sum(a.values()) > sum(b.values()) else "downgrade")
            )
        actions.append(entry)
    return actions
