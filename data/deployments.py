"""What runs a plan, behind named functions: the local backend's executors, dispatcher,
apply history, restarts, MIG checkpoints and services; the Ray backend's Serve applications;
and which backend runs the plan now (``backend_applies``).

``executor/`` makes plans real and keeps them real; what it reads and writes in the store
goes through here, so the SQL lives in ``data/`` (see ARCHITECTURE.md). Writes that belong
together are grouped by the caller in one ``store.transaction()``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from greenctl.data.records import utcnow_iso
from greenctl.data.store import row_id

if TYPE_CHECKING:
    from greenctl.data.store import Store

READY = "ready"
RUNNING = "running"
#: journaled before its process starts, not yet part of the running configuration
STARTING = "starting"
#: retired by an apply that has switched away from it, not yet stopped
STOPPING = "stopping"


def _first(rows: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    return next(iter(rows), None)


def _in_states(store: Store, table: str, states: Iterable[str]) -> list[dict[str, Any]]:
    """The rows of ``table`` (one of this module's, never user text) whose ``state`` is any
    of ``states``, by id."""
    wanted = list(states)
    marks = ", ".join("?" for _ in wanted)
    return store.rows(f"select * from [{table}] where state in ({marks}) order by id", wanted)


# -- executor instances -----------------------------------------------------------------------
def ready_instances(store: Store) -> list[dict[str, Any]]:
    """The executor instances recorded as ``ready`` (as the last apply left them), by id."""
    return store.rows("select * from executor_instances where state = ? order by id", [READY])


def instance_row(store: Store, instance_id: str) -> dict[str, Any]:
    """The instance ``instance_id`` (any state).

    Raises:
        sqlite_utils.db.NotFoundError: no such instance.
    """
    return dict(store.db.table("executor_instances").get(instance_id))


def journal_instance(store: Store, row: dict[str, Any]) -> None:
    """Record an instance about to start (``starting``, no process yet): what the next
    ``apply``, ``status`` or ``down`` stops if the apply starting it never commits."""
    store.db.table("executor_instances").insert({**row, "state": STARTING})


def set_instance_process(store: Store, instance_id: str, **fields: Any) -> None:
    """Where an instance's process runs (``pid``, ``pid_start``, ``host``, ``port``),
    recorded as soon as it is known (by apply, or the supervisor restarting it); nothing
    when the instance is not recorded."""
    table = store.db.table("executor_instances")
    if table.count_where("id = ?", [instance_id]):
        table.update(instance_id, fields)


def commit_instance(store: Store, instance_id: str, **fields: Any) -> None:
    """A started instance joins the running configuration (``ready``)."""
    store.db.table("executor_instances").update(instance_id, {**fields, "state": READY})


def forget_instance(store: Store, instance_id: str) -> None:
    """Drop a journaled instance that never joined a configuration (its apply was undone
    or interrupted, and its process stopped): the store is left as the apply found it."""
    store.db.execute(
        "delete from executor_instances where id = ? and state = ?", [instance_id, STARTING]
    )


def retire_instance(store: Store, instance_id: str) -> None:
    """The running configuration no longer has the instance; it is to be stopped."""
    store.db.table("executor_instances").update(instance_id, {"state": STOPPING})


def instances_in(store: Store, states: Iterable[str]) -> list[dict[str, Any]]:
    """The instances in any of ``states``, by id."""
    return _in_states(store, "executor_instances", states)


def reassign_instance(
    store: Store, instance_id: str, *, plan_id: int | None, quota_rps: float | None
) -> None:
    """A kept instance now serves ``plan_id`` with ``quota_rps``."""
    store.db.table("executor_instances").update(
        instance_id, {"quota_rps": quota_rps, "plan_id": plan_id}
    )


def end_instance(store: Store, instance_id: str, *, state: str = "stopped") -> None:
    """Mark an instance ``stopped`` (or ``failed``: its process died) now."""
    store.db.table("executor_instances").update(
        instance_id, {"state": state, "stopped_at": utcnow_iso()}
    )


def record_restart(
    store: Store,
    instance_id: str,
    *,
    old_pid: int | None,
    new_pid: int | None,
    pid_start: str | None,
    port: int,
    restarts: int,
    reason: str = "process exited",
) -> None:
    """The dispatcher's supervisor restarted ``instance_id``: log it, and point the instance
    (when it is still recorded) at the new process."""
    store.db.table("executor_restarts").insert(
        {
            "instance_id": instance_id,
            "at": utcnow_iso(),
            "reason": reason,
            "old_pid": old_pid,
            "new_pid": new_pid,
            "new_port": port,
        }
    )
    table = store.db.table("executor_instances")
    if table.count_where("id = ?", [instance_id]):
        table.update(
            instance_id,
            {"pid": new_pid, "pid_start": pid_start, "port": port, "restarts": restarts},
        )


def restart_count(store: Store) -> int:
    """Every restart the supervisors recorded."""
    return int(store.rows("select count(*) as n from executor_restarts")[0]["n"])


# -- the dispatcher ---------------------------------------------------------------------------
def running_dispatcher(store: Store) -> dict[str, Any] | None:
    """The newest dispatcher recorded as ``running`` (as apply recorded it), or None."""
    if not store.has_table("executor_dispatcher"):
        return None
    sql = "select * from executor_dispatcher where state = ? order by id desc limit 1"
    return _first(store.rows(sql, [RUNNING]))


def running_dispatchers(store: Store) -> list[dict[str, Any]]:
    """Every dispatcher recorded as ``running`` (``down`` stops them all)."""
    return store.rows("select * from executor_dispatcher where state = ?", [RUNNING])


def dispatchers_in(store: Store, states: Iterable[str]) -> list[dict[str, Any]]:
    """The dispatchers in any of ``states``, oldest first."""
    return _in_states(store, "executor_dispatcher", states)


def journal_dispatcher(store: Store, row: dict[str, Any]) -> int:
    """Record a dispatcher (and its supervisor) about to start (``starting``); its id."""
    return row_id(store.db.table("executor_dispatcher").insert({**row, "state": STARTING}).last_pk)


def forget_dispatcher(store: Store, dispatcher_id: int) -> None:
    """Drop a journaled dispatcher that never served a configuration (its apply was undone
    or interrupted, and its processes stopped)."""
    store.db.execute(
        "delete from executor_dispatcher where id = ? and state = ?", [dispatcher_id, STARTING]
    )


def set_dispatcher_process(store: Store, dispatcher_id: int, **fields: Any) -> None:
    """Where a dispatcher pair runs now: ``pid``/``pid_start`` (the dispatcher),
    ``supervisor_pid``/``supervisor_pid_start``, ``port``. Apply records them as soon as
    they are known; the pair records each other's restarts."""
    table = store.db.table("executor_dispatcher")
    if table.count_where("id = ?", [dispatcher_id]):
        table.update(dispatcher_id, fields)


def commit_dispatcher(store: Store, dispatcher_id: int, *, plan_id: int | None) -> None:
    """A started dispatcher becomes the running one (``running``) for ``plan_id``."""
    store.db.table("executor_dispatcher").update(
        dispatcher_id, {"state": RUNNING, "plan_id": plan_id}
    )


def retire_dispatcher(store: Store, dispatcher_id: int) -> None:
    """A new dispatcher replaced this one; it is to be stopped."""
    store.db.table("executor_dispatcher").update(dispatcher_id, {"state": STOPPING})


def point_dispatcher(
    store: Store, dispatcher_id: int, *, plan_id: int | None, apply_id: int
) -> None:
    """The running dispatcher now routes ``plan_id`` (switched by apply ``apply_id``)."""
    store.db.table("executor_dispatcher").update(
        dispatcher_id, {"plan_id": plan_id, "apply_id": apply_id}
    )


def end_dispatcher(store: Store, dispatcher_id: int, *, state: str = "stopped") -> None:
    """Mark a dispatcher ``stopped`` (or ``failed``: its process died) now."""
    store.db.table("executor_dispatcher").update(
        dispatcher_id, {"state": state, "stopped_at": utcnow_iso()}
    )


# -- apply history ----------------------------------------------------------------------------
def start_apply(store: Store, *, plan_id: int | None, actions: list[dict[str, Any]]) -> int:
    """Open an apply history record (``running``) with its planned actions; returns its id."""
    return row_id(
        store.db.table("executor_apply_history")
        .insert(
            {
                "plan_id": plan_id,
                "started_at": utcnow_iso(),
                "status": "running",
                "actions": json.dumps(actions),
            }
        )
        .last_pk
    )


def set_apply_actions(store: Store, apply_id: int, actions: list[dict[str, Any]]) -> None:
    """Replace the actions an apply record lists (what was done so far)."""
    store.db.table("executor_apply_history").update(apply_id, {"actions": json.dumps(actions)})


def finish_apply(
    store: Store,
    apply_id: int,
    *,
    status: str,
    actions: list[dict[str, Any]],
    undone: list[str] | None = None,
    error: str | None = None,
) -> None:
    """Close an apply record: ``applied``, or ``failed`` with what was undone and why."""
    fields: dict[str, Any] = {
        "status": status,
        "finished_at": utcnow_iso(),
        "actions": json.dumps(actions),
    }
    if undone is not None:
        fields["undone"] = json.dumps(undone)
    if error is not None:
        fields["error"] = error
    store.db.table("executor_apply_history").update(apply_id, fields)


def open_applies(store: Store) -> list[dict[str, Any]]:
    """Apply records still ``running``: under the apply lock, applies that died unfinished."""
    sql = "select * from executor_apply_history where status = ? order by id"
    return store.rows(sql, ["running"])


def unsettled(store: Store) -> bool:
    """Whether an apply left work behind: an apply record still ``running``, or an instance
    or dispatcher ``starting`` or ``stopping`` (cheap; ``status`` asks before locking)."""
    if not store.has_table("executor_instances"):
        return False
    states = [STARTING, STOPPING]
    return bool(
        store.rows("select 1 from executor_apply_history where status = 'running' limit 1")
        or _in_states(store, "executor_instances", states)
        or _in_states(store, "executor_dispatcher", states)
        or routers_in(store, states)
    )


def last_apply(store: Store) -> dict[str, Any] | None:
    """The newest apply record, or None."""
    return _first(store.rows("select * from executor_apply_history order by id desc limit 1"))


# -- MIG checkpoints --------------------------------------------------------------------------
def has_open_mig_checkpoint(store: Store, gpu_index: int) -> bool:
    """Whether GPU ``gpu_index``'s layout before greenctl changed it is kept (not restored)."""
    sql = "select 1 from executor_mig_checkpoints where gpu_index = ? and restored_at is null"
    return bool(store.rows(sql, [gpu_index]))


def add_mig_checkpoint(
    store: Store,
    *,
    apply_id: int,
    gpu_index: int,
    gpu_uuid: str | None,
    layout: list[dict[str, Any]],
) -> None:
    """Keep GPU ``gpu_index``'s MIG layout before apply ``apply_id`` changes it."""
    store.db.table("executor_mig_checkpoints").insert(
        {
            "apply_id": apply_id,
            "created_at": utcnow_iso(),
            "gpu_index": gpu_index,
            "gpu_uuid": gpu_uuid,
            "layout": json.dumps(layout),
        }
    )


def open_mig_checkpoints(store: Store) -> list[dict[str, Any]]:
    """The kept layouts not yet restored, oldest first (``layout`` decoded)."""
    rows = store.rows(
        "select * from executor_mig_checkpoints where restored_at is null order by id"
    )
    return [{**row, "layout": json.loads(row["layout"])} for row in rows]


def mark_mig_checkpoint_restored(store: Store, checkpoint_id: int) -> None:
    store.db.table("executor_mig_checkpoints").update(checkpoint_id, {"restored_at": utcnow_iso()})


# -- services (the MPS control daemon) ---------------------------------------------------------
def service_running(store: Store, name: str) -> bool:
    """Whether apply recorded the service ``name`` (e.g. ``mps-control``) as running."""
    sql = "select 1 from executor_services where name = ? and state = ?"
    return bool(store.rows(sql, [name, RUNNING]))


def start_service(store: Store, name: str, *, info: dict[str, Any], pid: int | None = None) -> None:
    """Record the service ``name`` as running (``info``: how to reach it)."""
    store.db.table("executor_services").upsert(
        {
            "name": name,
            "pid": pid,
            "info": json.dumps(info),
            "started_at": utcnow_iso(),
            "state": RUNNING,
        },
        pk="name",
    )


def stop_service(store: Store, name: str) -> None:
    store.db.table("executor_services").update(name, {"state": "stopped"})


# -- Ray Serve applications -------------------------------------------------------------------
def record_ray_app(store: Store, *, plan_id: int | None, address: str, app: str, url: str) -> None:
    """``app`` on the cluster at ``address`` is now the active plan version (the only one)."""
    store.db.execute("update ray_apps set active = 0 where active = 1")
    store.db.table("ray_apps").insert(
        {
            "plan_id": plan_id,
            "address": address,
            "app": app,
            "url": url,
            "applied_at": utcnow_iso(),
            "active": 1,
        }
    )


def active_ray_app(store: Store) -> dict[str, Any] | None:
    """The Serve application greenctl last applied and has not taken down, or None."""
    return _first(store.rows("select * from ray_apps where active = 1 order by id desc limit 1"))


def last_ray_app(store: Store) -> dict[str, Any] | None:
    """The Serve application greenctl applied last (active or not), or None."""
    return _first(store.rows("select * from ray_apps order by id desc limit 1"))


def deactivate_ray_apps(store: Store) -> None:
    """No Serve application of greenctl's is active any more (``down``)."""
    store.db.execute("update ray_apps set active = 0")


# -- which backend runs the plan --------------------------------------------------------------
def record_backend(
    store: Store,
    backend: str,
    *,
    plan_id: int | None,
    address: str | None = None,
    options: dict[str, Any] | None = None,
) -> None:
    """``backend`` (at ``address``, applied with ``options``) now runs ``plan_id``: the
    backend ``status``, ``down`` and ``replan --apply`` ask. An earlier running record of the
    same backend is superseded; the same record again adds nothing."""
    doc = json.dumps(options or {}, sort_keys=True)
    current = running_backend(store)
    if (
        current is not None
        and current["backend"] == backend
        and current["address"] == address
        and current["plan_id"] == plan_id
        and json.dumps(current["options"], sort_keys=True) == doc
    ):
        return
    now = utcnow_iso()
    store.db.execute(
        "update backend_applies set state = 'replaced', stopped_at = ? "
        "where backend = ? and state = ?",
        [now, backend, RUNNING],
    )
    store.db.table("backend_applies").insert(
        {
            "backend": backend,
            "address": address,
            "plan_id": plan_id,
            "options": doc,
            "applied_at": now,
            "state": RUNNING,
        }
    )


def _backend_row(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {**row, "options": json.loads(row.get("options") or "{}")}


def running_backend(store: Store) -> dict[str, Any] | None:
    """The newest backend record still running (``backend, address, plan_id, options,
    applied_at``), or None: nothing applied, or everything taken down."""
    if not store.has_table("backend_applies"):
        return None
    sql = "select * from backend_applies where state = ? order by id desc limit 1"
    return _backend_row(_first(store.rows(sql, [RUNNING])))


def last_backend(store: Store) -> dict[str, Any] | None:
    """The newest backend record of any state (where a plan ran last), or None."""
    if not store.has_table("backend_applies"):
        return None
    return _backend_row(
        _first(store.rows("select * from backend_applies order by id desc limit 1"))
    )


def stop_backend(store: Store, backend: str) -> None:
    """``backend`` runs nothing any more (``down``)."""
    store.db.execute(
        "update backend_applies set state = 'stopped', stopped_at = ? "
        "where backend = ? and state = ?",
        [utcnow_iso(), backend, RUNNING],
    )


# -- the geo router ---------------------------------------------------------------------------
def journal_router(store: Store, row: dict[str, Any]) -> int:
    """Record a geo router (and its supervisor) about to start (``starting``); its id."""
    doc = {**row, "state": STARTING, "started_at": utcnow_iso()}
    return row_id(store.db.table("geo_routers").insert(doc).last_pk)


def set_router_process(store: Store, router_id: int, **fields: Any) -> None:
    """Where a geo router runs: ``supervisor_pid``/``_start``, ``router_pid``/``_start``,
    ``port``, ``plan_id``; nothing when the row is gone."""
    table = store.db.table("geo_routers")
    if table.count_where("id = ?", [router_id]):
        table.update(router_id, fields)


def commit_router(store: Store, router_id: int, *, plan_id: int | None) -> None:
    """A started geo router becomes the running one, for ``plan_id``."""
    store.db.table("geo_routers").update(router_id, {"state": RUNNING, "plan_id": plan_id})


def retire_router(store: Store, router_id: int) -> None:
    """A new geo router replaces this one; it is to be stopped."""
    store.db.table("geo_routers").update(router_id, {"state": STOPPING})


def forget_router(store: Store, router_id: int) -> None:
    """Drop a journaled geo router that never served (its apply failed or was interrupted,
    and its processes stopped)."""
    store.db.execute("delete from geo_routers where id = ? and state = ?", [router_id, STARTING])


def end_router(store: Store, router_id: int) -> None:
    """Mark a geo router ``stopped`` now."""
    store.db.table("geo_routers").update(
        router_id, {"state": "stopped", "stopped_at": utcnow_iso()}
    )


def routers_in(store: Store, states: Iterable[str]) -> list[dict[str, Any]]:
    """The geo routers in any of ``states``, oldest first."""
    if not store.has_table("geo_routers"):
        return []
    return _in_states(store, "geo_routers", states)


def running_router(store: Store) -> dict[str, Any] | None:
    """The newest geo router recorded as ``running``, or None."""
    rows = routers_in(store, [RUNNING])
    return rows[-1] if rows else None
