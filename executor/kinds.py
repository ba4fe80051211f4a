"""The registry of plan kinds: how each kind's problem is built from the store and a request,
how it is solved, and how a running plan of the kind is scored in a new problem.

``greenctl plan mix``/``plan mig`` and ``replan`` call the same entry, so a replanned plan is
built exactly as the command builds it (before, ``replan`` rebuilt both problems with copies
of the commands' code). A kind's request is the plain dict its plan document records in
``request``: everything needed to plan it again.

Kinds whose inputs are still assembled inside their commands (``glet``, ``geo``) are listed
with no builder; ``replan`` refuses them by asking the registry, not by a list of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from greenctl.data.errors import InputError
from greenctl.data.plan import Plan

#: (new plan, the problem it solved)
Planned = tuple[Plan, Any]


@dataclass(frozen=True)
class PlanKind:
    """One kind of plan, as every command and loop that plans it sees it."""

    name: str
    #: plan(store, request, current=None, **options) -> (plan, problem); None: not yet here
    plan: Callable[..., Planned] | None = None
    #: score(problem, running plan) -> (its objective in the problem or None, note or None)
    score: Callable[[Any, Plan], tuple[float | None, str | None]] | None = None

    @property
    def replannable(self) -> bool:
        return self.plan is not None and self.score is not None


# -- mix (InfAdapter / INFaaS) -----------------------------------------------------------------
def _mix_plan(store: Any, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    from greenctl.executor.serving import serving_overheads
    from greenctl.planner import mix

    request = dict(request)
    if current is not None:
        request["current"] = [d.to_dict() for d in current.deployments]
    families = mix.normalize_request(request)["families"]
    names = [f["model"] for f in families]
    variants = [v for f in names for v in store.variants(f)]
    profiles = [p for f in names for p in store.latest_profiles(family=f)]
    serving = serving_overheads(store, {f["model"]: float(f["rate_rps"]) for f in families})
    problem = mix.build_mix_problem(request, variants, profiles, serving=serving)
    plan = mix.plan_mix(
        problem,
        strategy=problem.request.get("strategy") or "ilp",
        solver=problem.request.get("solver") or "highs",
        time_limit_s=problem.request.get("time_limit_s"),
    )
    return plan, problem


def _mix_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running plan's objective in ``problem`` (its quotas scaled to the new load)."""
    from greenctl.planner import mix

    alloc: dict[int, dict[int, tuple[int, float]]] = {}
    for fi, fam in enumerate(problem.families):
        deps = [d for d in running.deployments if d.model == fam.name]
        old_quota = sum(float(d.quota_rps or 0.0) for d in deps) or 1.0
        load = fam.load_rps(problem.headroom)
        for d in deps:
            idx = next(
                (
                    i
                    for i, o in enumerate(fam.options)
                    if (o.variant, o.resource, o.batch) == (d.variant, d.resource, d.batch)
                ),
                None,
            )
            if idx is None:
                return None, f"running option {d.variant}@{d.resource} is no longer eligible"
            q = float(d.quota_rps or 0.0) / old_quota * load
            if q > fam.options[idx].capacity_rps * d.count * (1 + 1e-6):
                return None, (
                    f"running {d.variant}@{d.resource} x{d.count} cannot carry "
                    f"{q:.1f} req/s of the forecast load"
                )
            prev_n, prev_q = alloc.setdefault(fi, {}).get(idx, (0, 0.0))
            alloc[fi][idx] = (prev_n + d.count, prev_q + q)
    return float(mix.evaluate_allocation(problem, alloc)["objective"]), None


# -- mig (Clover) -------------------------------------------------------------------------------
def _mig_plan(
    store: Any,
    request: dict[str, Any],
    *,
    current: Plan | None = None,
    baseline: str | None = None,
) -> Planned:
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner import mig

    try:
        geo = resolve_gpu(str(request["gpu"]))
        family = str(request["model"])
        gpus = int(request["gpus"])
        rate = float(request["rate_rps"])
        intensity = float(request["carbon_intensity"])
    except (KeyError, TypeError, ValueError):
        raise InputError(
            "a MIG plan's request needs gpu, gpus, model, rate_rps and carbon_intensity",
            hint="replan MIG plans made by `greenctl plan mig`",
        ) from None
    problem = mig.build_problem(
        geo,
        store.latest_profiles(family=family),
        store.variants(family),
        family=family,
        gpus=gpus,
        rate_rps=rate,
        carbon_intensity=intensity,
        sla_ms=request.get("sla_ms"),
        lam=float(request.get("lambda", 0.5)),
        base_carbon_intensity=request.get("base_carbon_intensity"),
        max_accuracy_loss_pct=request.get("max_accuracy_loss_pct"),
        percentile=float(request.get("percentile") or 0.95),
    )
    plan = mig.plan_mig(
        problem,
        solver=str(request.get("solver") or "exact"),
        baseline=baseline,
        current=current,
        time_limit_s=request.get("time_limit_s"),
        seed=request.get("seed"),
    )
    return plan, problem


def _mig_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    """The running layouts' objective in ``problem`` (None when they miss the SLA)."""
    from greenctl.planner import mig

    model = mig.MigModel(problem)
    try:
        cfg = mig.config_from_gpus(model, running.extra.get("gpus") or [], source="running plan")
        ev = model.evaluate(cfg)
    except InputError as exc:
        return None, f"running layout not comparable: {exc.message}"
    if not ev.feasible:
        return None, "the running layout misses the SLA at the forecast load"
    return float(ev.objective), None


KINDS: dict[str, PlanKind] = {
    "mix": PlanKind("mix", plan=_mix_plan, score=_mix_score),
    "mig": PlanKind("mig", plan=_mig_plan, score=_mig_score),
    # inputs still assembled in their commands (cli/plan_glet.py, cli/plan_geo.py)
    "glet": PlanKind("glet"),
    "geo": PlanKind("geo"),
}


def register(kind: PlanKind) -> None:
    """Add (or replace) a plan kind."""
    KINDS[kind.name] = kind


def get_kind(name: str) -> PlanKind:
    """The registered kind called ``name``.

    Raises:
        InputError: no such kind (names the known ones).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise InputError(
            f"unknown plan kind {name!r}", hint=f"known kinds: {', '.join(sorted(KINDS))}"
        ) from None
