"""What the dispatcher needs for model-less requests: each instance's offer in its routing
table (:mod:`greenctl.planner.core.choice`).

``greenctl apply`` adds per model the plan's preference (``prefer``: ``carbon`` when its
kind's objective weighs carbon, else ``cost``) and per instance its variant's offer: accuracy,
energy, carbon and cost per request at the instance's capacity (at the plan's carbon intensity
and PUE), and its service model's latency table plus, when the serving path was measured
(``greenctl profile serving``), the overhead ``predict`` adds to each request
(:func:`greenctl.executor.runtime.serving.serving_overheads`). The dispatcher only reads
these; without them it routes by model and variant name only, and a model-less request finds
no variant that meets it.
"""

from __future__ import annotations

from typing import Any

from greenctl.data.batching import executor_batching
from greenctl.data.errors import GreenctlError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.store import Store
from greenctl.executor.kinds import get_kind, plan_inputs, plan_rates
from greenctl.planner.core.choice import Offer, queue_latency

#: the routing table's keys this module writes (per model, per instance)
MODEL_KEYS = ("prefer",)
INSTANCE_KEYS = ("offer",)


def instance_offers(
    store: Store,
    plan: Plan,
    keys: set[tuple[str, str, int]],
    *,
    max_wait_ms: float | None = None,
    serving_path: str | None = "dispatcher",
) -> dict[tuple[str, str, int], Offer]:
    """The offer of each (variant, resource, batch) in ``keys``; one without a profile in the
    store offers only its accuracy.

    ``serving_path``: which measured serving path (``greenctl profile serving --path``) the
    requests take, whose overhead each offer's latency includes (None: none, the model's
    latency alone); a family never measured gets none either.
    """
    # the evaluation core (numpy, scipy) only when a plan is applied
    from greenctl.data.emissions import plan_carbon
    from greenctl.executor.runtime.serving import serving_overheads
    from greenctl.planner.core.evaluate import account, build_instances
    from greenctl.planner.core.evaluate import serving_path as path_of
    from greenctl.planner.core.latency import BatchService
    from greenctl.planner.core.simulator import pick_profiles, sized_slo_ms

    profiles, variants = plan_inputs(store, plan)
    by_name = {v.name: v for v in variants}
    table = pick_profiles(profiles, sized_slo_ms(plan, by_name))
    intensity, pue = plan_carbon(plan)  # the intensity the counters and the metrics use
    # the serving path each model's requests take, as the planner measured it for the plan
    paths = (
        serving_overheads(store, plan_rates(plan), path=serving_path)
        if serving_path is not None
        else {}
    )
    model_of = {d.variant: d.model for d in plan.deployments}
    out: dict[tuple[str, str, int], Offer] = {}
    for variant, resource, batch in sorted(keys):
        record = by_name.get(variant)
        accuracy = None if record is None or record.accuracy is None else float(record.accuracy)
        path = path_of(paths, model_of.get(variant, ""), variant, resource) if paths else None
        dep = Deployment(model="", variant=variant, resource=resource, count=1, batch=batch)
        try:
            (inst,) = build_instances([dep], table, max_wait_ms=max_wait_ms)
        except GreenctlError:  # no profile: nothing to predict from
            out[(variant, resource, batch)] = Offer(variant, accuracy)
            continue
        service = inst.batches or BatchService(
            ((batch, inst.service),), executor_batching(resource, batch, max_wait_ms=max_wait_ms)
        )
        cap = inst.capacity_rps
        figures = account(
            [inst],
            by_name,
            rate_rps=cap,
            served_rps=[cap],
            busy_frac=[1.0],
            carbon_g_per_kwh=intensity,
            pue=pue,
        )
        cost_h = figures.get("cost_per_hour")
        out[(variant, resource, batch)] = Offer(
            variant,
            accuracy,
            figures.get("energy_j_per_request"),
            figures.get("carbon_g_per_request"),
            None if cost_h is None or cap <= 0 else cost_h / 3600.0 / cap,
            queue_latency(service, overhead_ms=None if path is None else path.overhead_ms),
        )
    return out


def add_offers(
    routes: dict[str, Any],
    rows: list[dict[str, Any]],
    store: Store,
    plan: Plan,
    *,
    max_wait_ms: float | None = None,
) -> dict[str, Any]:
    """``routes`` (the dispatcher's routing table for instance ``rows``) with each model's
    ``prefer`` and each instance's ``offer``."""
    by_id = {row["id"]: row for row in rows}
    keys = {(r["variant"], r["resource"], int(r["batch"])) for r in rows}
    offers = instance_offers(store, plan, keys, max_wait_ms=max_wait_ms)
    prefer = "carbon" if get_kind(plan.kind).carbon_aware(plan) else "cost"
    for model in (routes.get("models") or {}).values():
        model["prefer"] = prefer
        for inst in model["instances"]:
            row = by_id.get(inst["id"])
            if row is not None:
                key = (row["variant"], row["resource"], int(row["batch"]))
                inst["offer"] = offers[key].to_dict()
    return routes


def carry_offers(previous: dict[str, Any], routes: dict[str, Any]) -> dict[str, Any]:
    """``routes`` with what ``previous`` (the table the dispatcher serves now) said of the same
    models and instances (a table rebuilt from the store's rows alone lacks it)."""
    old = previous.get("models") or {}
    for name, model in (routes.get("models") or {}).items():
        before = old.get(name) or {}
        for key in MODEL_KEYS:
            if key in before:
                model.setdefault(key, before[key])
        known = {b.get("id"): b for b in before.get("instances") or []}
        for inst in model["instances"]:
            for key in INSTANCE_KEYS:
                if key in known.get(inst["id"], {}):
                    inst.setdefault(key, known[inst["id"]][key])
    return routes
