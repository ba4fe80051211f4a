"""The geo router's table: per plan step (slot) and gateway, each site's share of the load,
from a geo plan's allocation (eGLB), and the sites' endpoints checked against it.

A geo plan records per-site totals, not per-step flows, so the table comes from the plan
planned again through the registry of plan kinds (its planner is deterministic over its
files).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from greenctl.data.carbon_io import parse_time
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.data.store import Store
from greenctl.executor.runtime.loadgen import check_endpoint


def plan_routes(plan: Plan) -> bool:
    """Whether ``plan``'s kind allocates load across sites (its record's ``routes``): the geo
    router routes it, where other plans are applied as executor instances."""
    from greenctl.executor.kinds import get_kind  # the router daemon imports no plan kind

    return get_kind(plan.kind).routes is not None


def routing_table(plan: Plan, store: Store) -> dict[str, Any]:
    """The router's table for a geo plan: per slot, per gateway, each site's fraction, planned
    again from the plan's request and files (a geo plan records per-site totals, not flows).

    Returns:
        ``{"plan_id", "start", "step_h", "times", "sites", "gateways", "allowed": {gw:
        [sites]}, "slots": [{gw: {site: fraction}}], "overall": {gw: {site: fraction}}}``;
        a gateway without load in a slot is absent (the router uses its overall fractions).

    Raises:
        InputError: not a geo plan, or its files are gone or changed shape.
    """
    from greenctl.executor.kinds import get_kind  # the router daemon imports no plan kind

    routes = get_kind(plan.kind).routes
    if routes is None:
        raise InputError(f"plan {plan.id} is a {plan.kind} plan, not a geo plan")
    return table_from_run(routes(store, plan), plan_id=plan.id)


def table_from_run(run: Any, *, plan_id: int | None = None) -> dict[str, Any]:
    """:func:`routing_table` from a :class:`~greenctl.planner.geo.solve.GeoRun`."""
    problem = run.problem
    sol = run.solutions[run.plan.extra["algorithm"]]
    slots, overall = sol.gateway_fractions(problem)
    return {
        "plan_id": plan_id,
        "start": problem.times[0],
        "step_h": float(problem.step_h),
        "times": list(problem.times),
        "sites": list(problem.sites),
        "gateways": list(problem.gateways),
        "allowed": allowed_sites(problem),
        "slots": slots,
        "overall": overall,
    }


def allowed_sites(problem: Any) -> dict[str, list[str]]:
    """Each gateway's allowed sites (every site without routes)."""
    if problem.routes is None:
        return {gw: list(problem.sites) for gw in problem.gateways}
    return {
        gw: [s for j, s in enumerate(problem.sites) if problem.routes[g, j]]
        for g, gw in enumerate(problem.gateways)
    }


def slot_index(table: dict[str, Any], at: datetime) -> tuple[int, bool]:
    """The slot ``at`` falls in, and whether it was wrapped (``at`` outside the plan's span:
    the slot at the same offset modulo the span, as traces repeat by day or year)."""
    start = parse_time(table["start"])
    n = max(1, len(table["slots"]))
    k = math.floor((at - start).total_seconds() / (3600.0 * float(table["step_h"])))
    return k % n, not 0 <= k < n


def gateway_fractions(table: dict[str, Any], slot: int, gateway: str) -> dict[str, float]:
    """The gateway's fractions in ``slot`` (its overall ones when it has no load there)."""
    slots = table["slots"]
    fr = slots[slot].get(gateway) if 0 <= slot < len(slots) else None
    return dict(fr or table["overall"].get(gateway) or {})


def parse_sites(values: list[str] | None) -> dict[str, str]:
    """``NAME=URL`` options as a dict.

    Raises:
        InputError: a value without ``=``, a name given twice, or a URL that is no base URL.
    """
    out: dict[str, str] = {}
    for text in values or []:
        name, sep, url = str(text).partition("=")
        name = name.strip()
        if not sep or not name or not url.strip():
            raise InputError(
                f"--site '{text}' is not NAME=URL",
                hint="name a site of the plan and its endpoint: --site west=http://10.0.0.5:8000",
            )
        if name in out:
            raise InputError(f"--site {name} is given twice", hint="give each site once")
        try:
            out[name] = check_endpoint(url.strip()).rstrip("/")
        except InputError as exc:
            raise InputError(f"--site {name}: {exc.message}", hint=exc.hint) from None
    return out


def check_sites(table: dict[str, Any], sites: dict[str, str]) -> None:
    """Every site of the plan has an endpoint and every endpoint names a site of the plan.

    Raises:
        InputError: naming the sites and the fix.
    """
    missing = [s for s in table["sites"] if s not in sites]
    if missing:
        example = " ".join(f"--site {s}=http://HOST:PORT" for s in missing)
        raise InputError(
            f"site{'s' if len(missing) > 1 else ''} {', '.join(missing)} of plan "
            f"{table.get('plan_id')} ha{'ve' if len(missing) > 1 else 's'} no endpoint",
            hint=f"give every site of the plan its OIP endpoint: {example}",
        )
    unknown = [s for s in sites if s not in table["sites"]]
    if unknown:
        raise InputError(
            f"--site {', '.join(unknown)}: not a site of plan {table.get('plan_id')}",
            hint=f"its sites are {', '.join(table['sites'])}",
        )
