"""The ``geo`` kind (eGLB): load allocated across sites, not instances, planned by
:mod:`greenctl.planner.geo` from its sites, demand and routes files; its plans are routed
(:mod:`greenctl.executor.deploy.georouter`), not served."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.executor.kinds.base import (
    Objective,
    PlanKind,
    Planned,
    ReplanRequest,
    ReplanSignal,
    base_request,
    finite_number,
)
from greenctl.planner.geo.request import GeoRequest


def _geo_plan(store: Store, request: dict[str, Any], *, current: Plan | None = None) -> Planned:
    """Plan ``request`` (a geo plan's ``request``, or what ``plan geo`` parsed): the
    ``sites``, ``demand`` and ``routes`` CSVs, heterogeneous variants from a ``family`` in
    the store or else a ``variants`` CSV, and ``plan geo``'s options under the names the
    plan records them (``mu_carbon_usd_per_kg``, ...). The plan's request records absolute
    paths (and the family), so the plan can be made again from anywhere.

    Returns:
        (the plan, the :class:`~greenctl.planner.geo.solve.GeoRun`: the problem and every
        algorithm's solution).
    """
    from greenctl.planner.geo import solve as geo

    problem, options, variants = geo_inputs(store, request)
    run = geo.run_geo(problem, variants=variants, **options)
    if request.get("family"):
        run.plan.request["family"] = request["family"]
    return run.plan, run


def geo_inputs(store: Store, request: dict[str, Any]) -> tuple[Any, dict[str, Any], Any]:
    """What a geo ``request`` plans with, read afresh (the files' newest rows): the
    :class:`~greenctl.data.geo_io.GeoProblem`, ``run_geo``'s options and the variants (or
    None); bad options fail before the files are read.

    Raises:
        InputError: a bad option or path. FileFormatError: a bad file.
    """
    import numpy as np
    from greenctl.data.geo_io import (
        GeoVariants,
        load_geo_problem,
        read_variants,
        variants_from_store,
    )
    from greenctl.planner.geo import solve as geo

    typed = GeoRequest.from_dict(request)
    variants = variants_from_store(store, typed.family) if typed.family else None
    options = typed.options()
    checked = dict(options)
    if typed.variants is not None:  # stands in for the file's variants in the option checks
        checked["variants"] = GeoVariants(["?"], np.ones(1), np.ones(1))
    elif variants is not None:
        checked["variants"] = variants
    geo.check_options(**checked)  # a bad option fails before the files are read
    problem = load_geo_problem(typed.sites, typed.demand, typed.routes)
    problem.sources = {k: str(Path(v).resolve()) for k, v in problem.sources.items()}
    if typed.variants is not None:
        variants = read_variants(typed.variants, problem.sites)
        variants.source = str(Path(typed.variants).resolve())
    return problem, options, variants


def _geo_replan_request(running: Plan, signal: ReplanSignal) -> ReplanRequest:
    """None: a geo plan is planned from its files (each site's carbon and water intensity,
    the demand per step); the region's signal and a load forecast are not its inputs."""
    note = (
        "a geo plan takes each site's carbon, water and demand from its sites and demand "
        "files: the region's signal"
        + (" and the load forecast are" if signal.forecast or signal.rate_rps else " is")
        + " not planned with"
    )
    return ReplanRequest(base_request(running), None, [note])


def _geo_score(problem: Any, running: Plan) -> tuple[float | None, str | None]:
    # a geo plan keeps each site's totals, not the per-step flows its objective is made of
    return None, "a geo plan records per-site totals, not its per-step allocation"


def _geo_objective(plan: Plan) -> Objective:
    # energy cost + mu_c x max-site carbon + mu_w x max-site water (USD)
    return "eGLB", finite_number(plan.predicted.get("objective")), False


def _geo_routes(store: Store, plan: Plan) -> Any:
    """The eGLB run of a geo plan's request over its files: the per-slot fractions the geo
    router and the Envoy export follow."""
    return _geo_plan(store, dict(plan.request))[1]


#: the kind, as the registry holds it
KIND = PlanKind(
    "geo",
    routes=_geo_routes,
    replay="greenctl.executor.kinds.geo_replay:STEP",
    order=40,
    default_policy="wrr",  # as mix: a site's plans follow their quotas
    plan=_geo_plan,
    score=_geo_score,
    score_checks_load=False,
    replan_request=_geo_replan_request,
    request_type=GeoRequest,
    objective=_geo_objective,
    serves=False,
    not_served="it allocates load across sites, not instances on one cluster",
    not_served_hint="its figures are modeled by `greenctl plan geo`; plan, simulate and "
    "apply (or export) a mix/mig/glet plan for each site, and route with the geo plan's "
    "allocations: `greenctl apply GEO_PLAN --site NAME=URL ...` or `greenctl export envoy`",
)
