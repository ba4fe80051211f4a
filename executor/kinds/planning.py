"""Planning a request of any kind, with the carbon intensity it is planned at: the library
twin of ``greenctl plan mix|mig|glet|geo``, which ``replan`` plans through too.

The intensity follows one rule (:func:`greenctl.data.carbon.plan_intensity`): the request's
own, else the region's stored signal at ``at``, else the store's only region's, else the
kind's reference (:attr:`PlanKind.reference_intensity`); the plan records it and where it
came from (``request.carbon_intensity``, ``carbon_source``, ``carbon_region``). Saving the
plan stays the caller's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from greenctl.data import carbon as carbon_signal
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.executor.kinds.base import PlanKind, Planned, get_kind

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: plan_intensity's answer: ``{"carbon_g_per_kwh", "source", "note"}``
Carbon = dict[str, Any]


def plan_carbon(
    store: Store,
    kind: PlanKind,
    *,
    intensity: float | None = None,
    region: str | None = None,
    at: str | None = None,
    request: dict[str, Any] | None = None,
) -> Carbon | None:
    """The carbon intensity a plan of ``kind`` is planned at and where it comes from: an
    explicit ``intensity``, else ``region``'s signal at ``at`` (default now), else the
    store's only region's, else the kind's reference for ``request``. None for a kind that
    plans no grid intensity, unless a region or an intensity is named (then recorded).

    Raises:
        NotFoundError / InputError: as :func:`greenctl.data.carbon.plan_intensity`.
    """
    if not kind.plans_at_intensity and intensity is None and region is None:
        return None
    default = None
    if kind.plans_at_intensity and kind.reference_intensity is not None:
        default = kind.reference_intensity(request or {})
    return carbon_signal.plan_intensity(
        store, carbon_intensity=intensity, region=region, at=at, default=default
    )


def plan_problem(
    store: Store,
    kind: str,
    request: dict[str, Any],
    *,
    region: str | None = None,
    at: str | None = None,
    current: Plan | None = None,
    carbon: Carbon | None = None,
    **options: Any,
) -> Planned:
    """As :func:`plan`, returning the problem the kind solved beside the plan (``replan``
    scores the running plan in it)."""
    entry = get_kind(kind)
    if current is not None and current.kind != entry.name:
        raise InputError(
            f"--current plan is a '{current.kind}' plan, expected '{entry.name}'",
            hint=f"give --current the {entry.name} plan running now (`greenctl plan list`)",
        )
    ci = carbon
    if ci is None:
        ci = plan_carbon(
            store,
            entry,
            intensity=request.get("carbon_intensity"),
            region=region,
            at=at,
            request=request,
        )
    request = dict(request)
    if ci is not None and entry.plans_at_intensity:
        request["carbon_intensity"] = ci["carbon_g_per_kwh"]
    new, problem = entry.solve(store, request, current=current, **options)
    if ci is not None:
        carbon_signal.record_intensity(new, ci)  # the value, its source and carbon_region
        if ci["note"]:
            new.extra["notes"] = [*new.extra.get("notes", []), ci["note"]]
    return new, problem


def plan(
    store: Store,
    kind: str,
    request: dict[str, Any],
    *,
    region: str | None = None,
    at: str | None = None,
    current: Plan | None = None,
    carbon: Carbon | None = None,
    **options: Any,
) -> Plan:
    """Plan ``request`` (the kind's request document) through the registry of plan kinds.

    Args:
        store: profiles, variants and carbon signals.
        kind: the plan kind's name.
        request: its request (:attr:`PlanKind.request_type` as a dict).
        region, at: the carbon signal to plan at when the request names no intensity.
        current: the plan running now (kept where it still fits).
        carbon: an intensity already resolved (:func:`plan_carbon`), recorded as it is.
        options: the kind's own planning options (``baseline`` for mig).

    Raises:
        InputError: unknown kind, bad request or signal, a ``current`` plan of another
            kind. InfeasiblePlan: nothing fits.
    """
    return plan_problem(
        store, kind, request, region=region, at=at, current=current, carbon=carbon, **options
    )[0]
