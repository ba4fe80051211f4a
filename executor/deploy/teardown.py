"""Stopping what ``apply`` started: :func:`recover` (what an interrupted apply left) and
:func:`down` (everything greenctl runs for a store).

An apply killed at any step (even ``kill -9``) leaves only journaled processes: the next
``apply``, ``status`` or ``down`` recovers under the apply lock, putting the dispatcher's
routes back to what the store records and stopping the rest.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from greenctl.data import deployments
from greenctl.data.errors import ExecutorError, HardwareError
from greenctl.data.store import Store
from greenctl.executor.deploy import partition
from greenctl.executor.deploy.actions import BACKEND, MPS_SERVICE
from greenctl.executor.deploy.admin import admin, routed_ids, routes_doc
from greenctl.executor.deploy.georouter_procs import recover_routers, stop_routers
from greenctl.executor.deploy.llm_plan import carry_llm
from greenctl.executor.deploy.processes import (
    dispatcher_process,
    instance_processes,
    stop_instance,
    stop_pair,
    touch_stop_file,
)
from greenctl.executor.runtime.dispatch_routes import MAX_QUEUE
from greenctl.executor.runtime.offers import carry_offers
from greenctl.executor.runtime.procs import (
    apply_lock,
    process_argv,
    state_dir_for,
    stray_daemons,
    terminate,
)


def recover(store: Store) -> list[dict[str, Any]]:
    """Finish what interrupted applies left, under the apply lock (the caller holds it, so
    no apply runs): their records are closed as failed, the running dispatcher's routes are
    put back to the instances the store records as running (a killed apply may have
    switched them before it committed), and every process journaled as ``starting`` (never
    committed) or ``stopping`` (retired, not yet stopped) is stopped. Returns what it did.
    """
    done: list[dict[str, Any]] = []
    interrupted = deployments.open_applies(store)
    for rec in interrupted:
        deployments.finish_apply(
            store,
            rec["id"],
            status="failed",
            actions=json.loads(rec["actions"] or "[]"),
            error="interrupted: the apply ended before it finished (killed?); what it had "
            "started was stopped by the next greenctl command",
        )
        done.append({"action": "close-interrupted-apply", "id": rec["id"]})
    if interrupted:
        done += _resync_routes(store)
    # never committed (``starting``): stopped and forgotten; retired (``stopping``): stopped
    for row in deployments.dispatchers_in(store, [deployments.STARTING, deployments.STOPPING]):
        stopped = stop_pair(row)
        if row["state"] == deployments.STARTING:
            deployments.forget_dispatcher(store, row["id"])
        else:
            deployments.end_dispatcher(store, row["id"])
        done.append({"action": "stop-dispatcher", "id": row["id"], "processes": stopped})
    for row in deployments.instances_in(store, [deployments.STARTING, deployments.STOPPING]):
        pids = [pid for pid, _ in instance_processes(row)]
        stop_instance(row)
        if row["state"] == deployments.STARTING:
            deployments.forget_instance(store, row["id"])
        else:
            deployments.end_instance(store, row["id"])
        done.append({"action": "stop-executor", "id": row["id"], "pids": pids})
    return done + recover_routers(store)  # a geo router's apply interrupted likewise


def _resync_routes(store: Store) -> list[dict[str, Any]]:
    """Point the running dispatcher at the instances the store records as ready, if a
    killed apply left it routing elsewhere."""
    disp = deployments.running_dispatcher(store)
    if disp is None or dispatcher_process(disp) is None:
        return []
    try:
        doc = admin(disp, "GET", timeout_s=3.0)
    except ExecutorError:
        return []
    rows = deployments.ready_instances(store)
    if routed_ids(doc) == sorted(r["id"] for r in rows):
        return []
    models: dict[str, Any] = doc.get("models") or {}
    first: dict[str, Any] = next(iter(models.values()), {})
    policy = str(first.get("policy") or "fifo")
    max_queue = int(first.get("max_queue") or MAX_QUEUE)
    routes = routes_doc(rows, policy, max_queue, disp.get("apply_id"))
    routes = carry_llm(doc, carry_offers(doc, routes))  # keeps the offers and LLM tiers
    admin(disp, "POST", routes)
    return [{"action": "restore-routes", "instances": [r["id"] for r in rows]}]


def down(store: Store, *, restore_mig: bool = False, wait: bool = True) -> dict[str, Any]:
    """Stop everything greenctl started for this store, and restore the checkpointed MIG
    layout if asked.

    Every dispatcher pair is told to stop first (its stop file: nothing is restarted from
    then on), then what interrupted applies left is stopped (:func:`recover`), then the
    pairs, the executors, and last any greenctl daemon of this store still running that the
    records missed. ``stopped`` lists each process that was running.
    """
    state_dir = state_dir_for(store.path)
    stopped: list[dict[str, Any]] = []
    with apply_lock(state_dir, wait=wait, timeout_s=60.0):
        pairs = deployments.dispatchers_in(
            store, [deployments.STARTING, deployments.RUNNING, deployments.STOPPING]
        )
        for row in pairs:
            touch_stop_file(row)
        for action in recover(store):
            stopped += action.get("processes") or []
            stopped += [{"instance": action["id"], "pid": p} for p in action.get("pids") or []]
        for row in deployments.running_dispatchers(store):
            stopped += stop_pair(row)
            deployments.end_dispatcher(store, row["id"])
        for row in deployments.ready_instances(store):
            pids = [pid for pid, _ in instance_processes(row)]
            ok = stop_instance(row)
            deployments.end_instance(store, row["id"])
            stopped += [{"instance": row["id"], "pid": pid, "stopped": ok} for pid in pids]
        stopped += stop_routers(store)  # the geo router and its supervisor
        for pid, ticks in stray_daemons(state_dir, str(store.path)):
            terminate(pid, ticks)
            stopped.append({"stray": (process_argv(pid) or ["?"])[0], "pid": pid})
        if deployments.service_running(store, MPS_SERVICE):
            with contextlib.suppress(HardwareError):
                partition.stop_mps(state_dir)
            deployments.stop_service(store, MPS_SERVICE)
            stopped.append({"service": MPS_SERVICE})
        deployments.stop_backend(store, BACKEND)
        restored = _restore_mig(store) if restore_mig else []
    return {"stopped": stopped, "restored_mig": restored, "logs": str(state_dir)}


def _restore_mig(store: Store) -> list[dict[str, Any]]:
    """Put back each GPU's checkpointed MIG layout; what was restored."""
    restored: list[dict[str, Any]] = []
    checkpoints = deployments.open_mig_checkpoints(store)
    if checkpoints:
        backend = partition.gpu_backend()
        for cp in checkpoints:
            partition.restore_layout(backend, cp["gpu_index"], cp["layout"])
            deployments.mark_mig_checkpoint_restored(store, cp["id"])
            restored.append({"gpu": cp["gpu_index"], "layout": cp["layout"]})
    return restored
