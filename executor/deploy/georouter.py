"""The geo router's lifecycle: a geo plan (eGLB) made real as an Open Inference Protocol
front (:mod:`~greenctl.executor.deploy.georouter_daemon`) forwarding each request to a site.

``greenctl apply GEO_PLAN --site NAME=URL ...`` starts it (:func:`apply_geo`), with the
fractions of the plan's allocation (:func:`~greenctl.executor.deploy.georouter_table.
routing_table`). ``replan`` of a running geo plan (:func:`replan_router`) takes eGLB's online
step for the new slot from the state stored after the previous one
(:mod:`greenctl.data.loop_state`), writes a decision record and hands the router the slot's
new fractions and the slot through its admin endpoint (``/admin/geo``, loopback and the
token only): no restart. The router is recorded in the store
(:mod:`greenctl.data.deployments`) like the dispatcher, so an interrupted apply's router is
stopped by the next apply, status or down.

The router and its supervisor run as this module (``python -m
greenctl.executor.deploy.georouter [--supervise]``), so what only replanning needs (the plan
kinds, the geo solver, the control loop's replan) is imported inside the functions that
replan, never at the daemons' start.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from greenctl.data import deployments, loop_state
from greenctl.data.carbon_io import normalise_time, parse_time
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import Plan
from greenctl.data.records import utcnow_iso
from greenctl.data.store import Store
from greenctl.executor.deploy.georouter_daemon import (
    GATEWAY_HEADER,
    HEALTH_INTERVAL_S,
    SITE_HEADER,
    TOKEN_HEADER,
    GeoRouter,
    Site,
    main,
)
from greenctl.executor.deploy.georouter_procs import recover_routers, stop_routers, stop_rows
from greenctl.executor.deploy.georouter_table import (
    allowed_sites,
    check_sites,
    gateway_fractions,
    parse_sites,
    plan_routes,
    routing_table,
    slot_index,
    table_from_run,
)
from greenctl.executor.runtime.procs import (
    apply_lock,
    is_alive,
    proc_start_ticks,
    python_module_argv,
    read_json,
    spawn_detached,
    state_dir_for,
    wait_for_state_file,
    write_json_atomic,
)

__all__ = [
    "GATEWAY_HEADER",
    "HEALTH_INTERVAL_S",
    "SITE_HEADER",
    "TOKEN_HEADER",
    "GeoRouter",
    "Site",
    "allowed_sites",
    "apply_geo",
    "check_sites",
    "gateway_fractions",
    "main",
    "parse_sites",
    "plan_routes",
    "read_json",
    "replan_if_routed",
    "replan_router",
    "router_dir",
    "router_status",
    "routing_table",
    "running_plan_id",
    "slot_index",
    "stop_router",
    "table_from_run",
]


def router_dir(store: Store) -> Path:
    """The geo router's folder in the store's state folder."""
    path = state_dir_for(store.path) / "georouter"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _running(folder: Path) -> dict[str, Any] | None:
    sup = read_json(folder / "supervisor.json")
    if sup and sup.get("ready") and is_alive(sup.get("pid"), sup.get("pid_start")):
        return sup
    return None


def _admin(url: str, token: str, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/admin/geo",
        data=None if doc is None else json.dumps(doc).encode(),
        headers={TOKEN_HEADER: token, "Content-Type": "application/json"},
        method="GET" if doc is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ExecutorError(f"the geo router at {url} did not answer: {exc}") from None


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{shown}:{port}"


def apply_geo(
    plan: Plan,
    *,
    store: Store,
    sites: dict[str, str],
    gateway: str | None = None,
    at: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    health_interval_s: float = HEALTH_INTERVAL_S,
    dry_run: bool = False,
    ready_timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Route a geo plan: start the geo router (or hand the running one the new table).

    The router is journaled in the store before its supervisor starts
    (:mod:`greenctl.data.deployments`) and committed once it serves, under the apply lock,
    so an interrupted apply's router is stopped by the next ``apply``, ``status`` or
    ``down`` (:func:`recover_routers`).

    Args:
        plan: a geo plan (saved to the store when it has no id).
        sites: each site's OIP endpoint; every site of the plan needs one.
        gateway: the gateway of requests without a ``Greenctl-Gateway`` header.
        at: pin the slot to this time (tests, demos); None: the clock.
        host / port: the router's address (loopback, any free port by default).

    Raises:
        InputError: not a geo plan, a site without an endpoint, an unknown gateway or time.
        ExecutorError: the router did not start. LockedError: an apply runs.
    """
    if not plan_routes(plan):
        raise InputError(f"--site routes a geo plan; this is a {plan.kind} plan")
    if not math.isfinite(health_interval_s) or not 0.05 <= health_interval_s <= 60:
        raise InputError("--health-interval-s must be 0.05-60 seconds")
    at = _normal_at(at)
    table = routing_table(plan, store)
    check_sites(table, sites)  # before anything starts
    if gateway is not None and gateway not in table["gateways"]:
        raise InputError(
            f"--gateway {gateway} is not a gateway of the plan",
            hint=f"its gateways are {', '.join(table['gateways'])}",
        )
    folder = router_dir(store)
    with apply_lock(state_dir_for(store.path)):
        recover_routers(store)  # the routers an interrupted apply left
        row = deployments.running_router(store)
        running = _running(folder) if row is not None else None
        record = read_json(folder / "router.json") or {}
        same = (
            running is not None
            and record.get("sites") == sites
            and record.get("gateway") == gateway
            and running.get("host") == host
            and port in (None, 0, running.get("port"))
        )
        action = "update" if same else ("restart" if running else "start")
        if dry_run:
            return {"action": action, "plan_id": plan.id, "sites": sites, "dry_run": True}
        if plan.id is None:
            store.save_plan(plan, source="apply")
            table["plan_id"] = plan.id
        if same and running is not None and row is not None:
            url = _url(host, int(running["port"]))
            _admin(url, str(record["token"]), {"table": table, "at": at})
            with store.transaction():
                deployments.set_router_process(store, row["id"], plan_id=plan.id)
        else:
            stop_router(store)  # the running one, or one a killed supervisor left
            url = _start_router(
                store, folder, plan=plan, table=table, at=at, sites=sites, gateway=gateway,
                host=host, port=port, health_interval_s=health_interval_s,
                ready_timeout_s=ready_timeout_s,
            )  # fmt: skip
            record = read_json(folder / "router.json") or {}
        record["plan_id"] = record["applied_id"] = plan.id
        write_json_atomic(folder / "router.json", record)
    slot, wrapped = slot_index(table, _when(at))
    return {
        "action": action,
        "plan_id": plan.id,
        "router_url": url,
        "sites": sites,
        "gateways": table["gateways"],
        "default_gateway": gateway,
        "slot": slot,
        "slot_time": table["times"][slot],
        "slot_wrapped": wrapped,
        "at": at,
    }


def _start_router(
    store: Store,
    folder: Path,
    *,
    plan: Plan,
    table: dict[str, Any],
    at: str | None,
    sites: dict[str, str],
    gateway: str | None,
    host: str,
    port: int | None,
    health_interval_s: float,
    ready_timeout_s: float,
) -> str:
    """Journal a router, start its supervisor, wait until the router serves, commit it;
    its URL. A failure (or a signal) stops what was started and forgets the row."""
    token = secrets.token_hex(16)
    record = {
        "sites": sites,
        "gateway": gateway,
        "token": token,
        "health_interval_s": health_interval_s,
        "plan_id": plan.id,
    }
    write_json_atomic(folder / "router.json", record)
    write_json_atomic(folder / "table.json", {"table": table, "at": at})
    for name in ("supervisor.json", "state.json"):
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    with store.transaction():
        rid = deployments.journal_router(
            store,
            {"plan_id": plan.id, "host": host, "port": int(port or 0), "state_dir": str(folder)},
        )
    try:
        argv = python_module_argv(
            "greenctl.executor.deploy.georouter",
            "--supervise", "--state-dir", str(folder), "--host", host, "--port", str(port or 0),
            "--db", str(Path(store.path).resolve()),
        )  # fmt: skip
        log = folder / "georouter.log"
        proc = spawn_detached(argv, env={}, log_file=log)
        with store.transaction():
            deployments.set_router_process(
                store, rid, supervisor_pid=proc.pid, supervisor_pid_start=proc_start_ticks(proc.pid)
            )
        sup = wait_for_state_file(
            folder / "supervisor.json",
            proc=proc,
            timeout_s=ready_timeout_s,
            what="the geo router's supervisor",
            log_file=log,
        )
        wait_for_state_file(
            folder / "state.json",
            proc=None,
            pid=sup.get("router_pid"),
            timeout_s=ready_timeout_s,
            what="the geo router",
            log_file=log,
        )
        with store.transaction():
            deployments.set_router_process(
                store,
                rid,
                port=int(sup["port"]),
                router_pid=sup.get("router_pid"),
                router_pid_start=sup.get("router_pid_start"),
            )
            deployments.commit_router(store, rid, plan_id=plan.id)
    except BaseException:
        mine = [r for r in deployments.routers_in(store, [deployments.STARTING]) if r["id"] == rid]
        stop_rows(mine or [{"state_dir": str(folder)}])
        with store.transaction():
            deployments.forget_router(store, rid)
        raise
    return _url(host, int(sup["port"]))


def _when(at: str | None) -> datetime:
    return parse_time(at) if at else datetime.now(UTC)


def _normal_at(at: str | None) -> str | None:
    """An ``--at`` time in the store's form.

    Raises:
        InputError: not a time.
    """
    if at is None:
        return None
    try:
        return normalise_time(at)
    except ValueError as exc:
        raise InputError(f"--at: {exc}") from None


def router_status(store: Store) -> dict[str, Any] | None:
    """The running geo router's view (None when none was applied, or it was taken down):
    per gateway and site the share served against the share planned, each site's health,
    the slot."""
    row = deployments.running_router(store)
    if row is None:
        return None
    folder = Path(row["state_dir"])
    record = read_json(folder / "router.json") or {}
    running = _running(folder)
    if running is None:
        sup = read_json(folder / "supervisor.json") or {}
        orphan = is_alive(sup.get("router_pid"), sup.get("router_pid_start"))
        why = (
            "its supervisor is gone (the router still serves, unsupervised); apply the plan "
            "again to restart both"
            if orphan
            else "neither the router nor its supervisor runs; apply the plan again"
        )
        return {"state": "down", "plan_id": row.get("plan_id"), "why": why}
    url = _url(str(running["host"]), int(running["port"]))
    try:
        doc = _admin(url, str(record["token"]))
    except (ExecutorError, KeyError) as exc:
        return {"state": "down", "url": url, "plan_id": row.get("plan_id"), "why": str(exc)}
    healthy = all(s["healthy"] for s in doc["sites"].values())
    doc.update(
        state="serving" if healthy else "degraded", url=url, restarts=running.get("restarts", 0)
    )
    return doc


def running_plan_id(store: Store) -> int | None:
    """The plan the geo router routes (None: no router runs)."""
    row = deployments.running_router(store)
    if row is None or _running(Path(row["state_dir"])) is None:
        return None
    pid = row.get("plan_id")
    return int(pid) if isinstance(pid, int) else None


def replan_router(store: Store, *, plan: Plan, at: str | None = None) -> dict[str, Any]:
    """One replanning round of the running geo plan: eGLB's online step for the new slot
    (dual mirror descent, or MPC when the plan was made with it) from the state stored
    after the previous slot, on the newest rows of the plan's sites and demand files; the
    router gets the slot's new fractions and slot through its admin endpoint (no restart).
    A decision record is written, as for every replan (``replan --history`` lists it).

    ``at`` None: the slot after the router's pinned one, or the clock's. A plan of an
    offline algorithm has no online step: it is planned again over its files and the router
    gets the whole new table (a plan with variants steps online like any other).

    Returns:
        The decision record plus ``plan_id``, ``new_plan_id``, ``slot``, ``slot_time``,
        ``changed``, ``action`` (``update-router``), ``router_url`` and ``online`` (the
        step: ``warm``, ``steps``, ``decide_s``).

    Raises:
        InputError: no geo router runs this plan, or a bad ``at``. LockedError: another
        replan runs. Any error of the step, after a ``failed`` decision is recorded.
    """
    # the control loop's replan lock and decision record (the router daemon never loads it)
    from greenctl.executor.control import replan

    row = deployments.running_router(store)
    folder = Path(row["state_dir"]) if row is not None else router_dir(store)
    running = _running(folder) if row is not None else None
    record = read_json(folder / "router.json") or {}
    if row is None or running is None or record.get("plan_id") != plan.id:
        raise InputError(
            f"no geo router routes plan {plan.id}",
            hint=f"apply it first: greenctl apply {plan.id} --site NAME=URL ...",
        )
    at = _normal_at(at)
    routed = _Routed(
        store, plan, row, folder, record, _url(str(running["host"]), int(running["port"]))
    )
    with replan.replan_lock(store):
        current = routed.admin()
        table = (read_json(folder / "table.json") or {}).get("table") or {}
        if at is None and current.get("at"):  # pinned: the next slot
            nxt = parse_time(current["at"]) + timedelta(hours=float(table.get("step_h") or 1.0))
            at = nxt.isoformat().replace("+00:00", "Z")
        slot, _ = slot_index(table, _when(at))
        decision = _decision(plan, at, routed.lineage)
        try:
            t0 = time.perf_counter()
            step = _online_step(store, plan, lineage=routed.lineage, slot=slot)
            decide_s = time.perf_counter() - t0
            if step is not None:
                push = _online_push(step, table, slot, at)
                decision["signal_g_per_kwh"] = step["carbon_g_per_kwh"]
            else:  # an offline plan: the whole horizon again
                push = _offline_push(routed, table, at, decision)
            doc = routed.admin(push.doc)
            if step is not None:  # the router took it: the state the next step starts from
                with store.transaction():
                    loop_state.add_geo_step(store, step["row"])
            decision.update(
                new_plan_id=push.new_id,
                action="apply",
                applied=1,
                reason=f"{push.reason}: the geo router at {routed.url} routes slot {doc['slot']} "
                f"({doc['slot_time']}) with the new fractions, no restart"
                + ("" if push.changed else " (the same as before)"),
            )
        except BaseException as exc:
            msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            decision["reason"] = f"{type(exc).__name__}: {msg}; the router's table is unchanged"
            replan.record_decision(store, decision)
            raise
        out = replan.record_decision(store, decision)
    out.update(
        plan_id=plan.id,
        new_plan_id=push.new_id,
        changed=push.changed,
        slot=doc["slot"],
        slot_time=doc["slot_time"],
        router_url=routed.url,
        decision_id=out["id"],
        action="update-router",
        online=None
        if step is None
        else {"warm": step["warm"], "steps": step["steps"], "decide_s": decide_s},
    )
    return out


@dataclass
class _Routed:
    """The running geo router a replan talks to: its store row, folder, record and URL."""

    store: Store
    plan: Plan
    row: dict[str, Any]
    folder: Path
    record: dict[str, Any]
    url: str

    @property
    def lineage(self) -> str:
        """The replan lineage of the routed plan: the plan it was applied as."""
        return f"plan:{self.record.get('applied_id') or self.plan.id}"

    def admin(self, doc: dict[str, Any] | None = None) -> dict[str, Any]:
        """The router's view (GET), or hand it a new table or fractions (POST)."""
        return _admin(self.url, str(self.record["token"]), doc)


@dataclass
class _Push:
    """What a replan hands the router, whether it changes the fractions, why, and the
    plan the router routes afterwards."""

    doc: dict[str, Any]
    changed: bool
    reason: str
    new_id: int | None


def _decision(plan: Plan, at: str | None, lineage: str) -> dict[str, Any]:
    """A geo replan's decision record, ``failed`` until the router takes the new slot."""
    return {
        "time": utcnow_iso(),
        "at": at or utcnow_iso(),
        "lineage": lineage,
        "region": None,
        "signal_g_per_kwh": None,
        "reference_g_per_kwh": None,
        "signal_change": None,
        "forecaster": None,
        "forecast_rps": None,
        "running_plan_id": plan.id,
        "new_plan_id": None,
        "old_objective": _objective(plan),
        "new_objective": None,
        "improvement": None,
        "action": "failed",
        "applied": 0,
        "reason": "",
    }


def _online_push(step: dict[str, Any], table: dict[str, Any], slot: int, at: str | None) -> _Push:
    """The slot's fractions from eGLB's online step, and how the step started."""
    slots = table.get("slots") or []
    was = slots[slot] if slot < len(slots) else {}
    if step["warm"] and step["steps"] == 1:
        how = "from the stored state of the slot before"
    elif step["warm"]:
        how = f"{step['steps']} step(s) from the stored state"
    else:
        how = "state rebuilt from slot 0: none stored"
    return _Push(
        {"slots": {str(slot): step["fractions"]}, "at": at},
        not _same_fractions(was, step["fractions"]),
        f"eGLB online step ({step['algorithm']}, {how}) for slot {slot} ({step['slot_time']})",
        step["row"]["plan_id"],
    )


def _offline_push(
    routed: _Routed, table: dict[str, Any], at: str | None, decision: dict[str, Any]
) -> _Push:
    """The whole new table of a plan of an offline algorithm, planned again over its files;
    a changed plan is saved and becomes the one the router routes."""
    from greenctl.executor.kinds import get_kind  # planning, not the router daemon's

    store, plan = routed.store, routed.plan
    new, run = get_kind(plan.kind).solve(store, dict(plan.request))
    new_table = table_from_run(run, plan_id=plan.id)
    changed = new_table["slots"] != table.get("slots")
    new_id = plan.id
    if changed:
        new_id = store.save_plan(new, source="replan")
        new_table["plan_id"] = new_id
        routed.record["plan_id"] = new_id
        write_json_atomic(routed.folder / "router.json", routed.record)
        with store.transaction():
            deployments.set_router_process(store, routed.row["id"], plan_id=new_id)
        decision["new_objective"] = _objective(new)
    return _Push(
        {"table": new_table, "at": at},
        changed,
        f"algorithm {plan.request.get('algorithm')} has no online step: planned "
        f"again over its files ({'new fractions' if changed else 'unchanged'})",
        new_id,
    )


def _objective(plan: Plan) -> float | None:
    value = plan.predicted.get("objective")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _online_step(store: Store, plan: Plan, *, lineage: str, slot: int) -> dict[str, Any] | None:
    """eGLB's online step of a routed plan for ``slot``, from the state stored for its
    lineage (:mod:`greenctl.data.loop_state`), on the files' newest rows; ``row`` is what to
    store once the router took the fractions. None: the plan's algorithm has no online step.
    A plan made with ``--variants`` steps the same way (its state also carries the accuracy
    banked so far and the site LP's basis); ``variant_mw`` is then the slot's load per site
    and variant (reference MW)."""
    import numpy as np

    # planning (kinds, the geo solver): loaded when a replan steps, never by the router daemon
    from greenctl.executor.kinds import geo_inputs
    from greenctl.planner.geo import solve as geo

    algorithm = plan.request.get("algorithm")
    if algorithm not in geo.ONLINE_ALGORITHMS:
        return None
    problem, options, variants = geo_inputs(store, dict(plan.request))
    opts = geo.check_options(**options, variants=variants)
    last = loop_state.last_geo_step(store, lineage)
    state = None
    if last is not None and last.get("algorithm") == algorithm:
        state = geo.OnlineState.from_dict(last["state"], n_sites=len(problem.sites))
    step = geo.online_replan(problem, algorithm, opts, slot=slot, state=state)
    y = step.site_load_mw  # power: the intensity is weighted by the energy drawn
    carbon = problem.carbon_g_per_kwh[slot]
    intensity = float((carbon * y).sum() / y.sum()) if y.sum() > 0 else None
    variant_mw = None
    if variants is not None and step.variant_load is not None:
        variant_mw = {
            site: {
                name: float(step.variant_load[j, m])
                for m, name in enumerate(variants.names)
                if step.variant_load[j, m] > 1e-12
            }
            for j, site in enumerate(problem.sites)
            if step.variant_load[j].sum() > 1e-12
        }
    return {
        "row": {
            "lineage": lineage,
            "plan_id": plan.id,
            "algorithm": algorithm,
            "slot": slot,
            "slot_time": problem.times[slot],
            "state": step.state.to_dict(),
            "fractions": step.fractions,
        },
        "algorithm": algorithm,
        "fractions": step.fractions,
        "warm": step.warm,
        "steps": step.steps,
        "slot_time": problem.times[slot],
        "carbon_g_per_kwh": None if intensity is None or not np.isfinite(intensity) else intensity,
        "variant_mw": variant_mw,
    }


def replan_if_routed(
    store: Store, *, plan: str | int, at: str | None = None
) -> dict[str, Any] | None:
    """``replan --plan`` of the plan the geo router routes (its id, or the id it was applied
    as): :func:`replan_router`; None when no geo router routes it (replan as any plan)."""
    text = str(plan)
    if not (text.isascii() and text.isdecimal() and len(text) <= 18):
        return None
    row = deployments.running_router(store)
    if row is None:
        return None
    folder = Path(row["state_dir"])
    record = read_json(folder / "router.json") or {}
    if _running(folder) is None or int(text) not in (
        record.get("plan_id"),
        record.get("applied_id"),
    ):
        return None
    return replan_router(store, plan=store.get_plan(int(record["plan_id"])), at=at)


def _same_fractions(a: Any, b: Any, tol: float = 1e-9) -> bool:
    """Whether two slots' fractions (gateway -> site -> share) agree within ``tol``: a step
    and the whole-horizon solve agree to about 1e-9, which is no change to route by."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return False
        return all(_same_fractions(a[k], b[k], tol) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) <= tol
    return bool(a == b)


def stop_router(store: Store) -> int:
    """Stop every geo router of the store with its supervisor
    (:func:`~greenctl.executor.deploy.georouter_procs.stop_routers`); the number of processes
    that were running."""
    return len(stop_routers(store))


if __name__ == "__main__":
    sys.exit(main())
