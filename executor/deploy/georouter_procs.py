"""The geo router's processes as the store records them (``geo_routers``, see
:mod:`greenctl.data.deployments`): finding, stopping and recovering them. ``apply``'s crash
consistency, ``status`` and ``down`` call these without importing the router itself (whose
replan uses the control loop), so no import circle forms.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from greenctl.data import deployments
from greenctl.data.store import Store
from greenctl.executor.runtime.procs import (
    find_processes,
    is_alive,
    process_argv,
    read_json,
    state_dir_for,
    terminate,
)

#: the router's folder in the store's state folder
FOLDER = "georouter"


def row_processes(row: dict[str, Any]) -> list[tuple[str, int, str | None]]:
    """``(kind, pid, start ticks)`` of a router row's live processes: the pids it and its
    folder's supervisor file name, and any process with its folder on its command line
    (started, never recorded)."""
    found: list[tuple[str, int, str | None]] = []
    seen: set[int] = set()

    def add(kind: str, pid: Any, ticks: Any) -> None:
        if pid and int(pid) not in seen and is_alive(int(pid), ticks):
            seen.add(int(pid))
            found.append((kind, int(pid), ticks))

    folder = row.get("state_dir")
    sup = (read_json(Path(folder) / "supervisor.json") if folder else None) or {}
    add("supervisor", row.get("supervisor_pid"), row.get("supervisor_pid_start"))
    add("supervisor", sup.get("pid"), sup.get("pid_start"))
    add("router", row.get("router_pid"), row.get("router_pid_start"))
    add("router", sup.get("router_pid"), sup.get("router_pid_start"))
    if folder:
        for pid, ticks in find_processes(str(folder)):
            add(
                "supervisor" if "--supervise" in (process_argv(pid) or []) else "router", pid, ticks
            )
    return found


def stop_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Stop the processes of router rows (supervisors first: each stops its router);
    each process that was running."""
    stopped = []
    for row in rows:
        procs = row_processes(row) if row else []
        for kind, pid, ticks in sorted(procs, key=lambda p: p[0] != "supervisor"):
            terminate(pid, ticks)
            stopped.append({"georouter" if kind == "router" else "georouter-supervisor": pid})
    return stopped


def recover_routers(store: Store) -> list[dict[str, Any]]:
    """Stop the geo routers an interrupted apply left (journaled ``starting``, never
    committed: forgotten; retired ``stopping``: ended); what it did. The caller holds the
    apply lock (:func:`greenctl.executor.deploy.apply.recover` calls it)."""
    done = []
    for row in deployments.routers_in(store, [deployments.STARTING, deployments.STOPPING]):
        stopped = stop_rows([row])
        with store.transaction():
            if row["state"] == deployments.STARTING:
                deployments.forget_router(store, row["id"])
            else:
                deployments.end_router(store, row["id"])
        done.append({"action": "stop-georouter", "id": row["id"], "processes": stopped})
    return done


def stop_routers(store: Store) -> list[dict[str, Any]]:
    """Stop every geo router of the store (recorded ``starting``, ``running`` or
    ``stopping``, and one its folder's files name) with its supervisor (``down``); each
    process that was running."""
    folder = state_dir_for(store.path) / FOLDER
    rows = deployments.routers_in(
        store, [deployments.STARTING, deployments.RUNNING, deployments.STOPPING]
    )
    stopped = stop_rows([*rows, {"state_dir": str(folder)}])
    with store.transaction():
        for row in rows:
            if row["state"] == deployments.STARTING:
                deployments.forget_router(store, row["id"])
            else:
                deployments.end_router(store, row["id"])
    (folder / "supervisor.json").unlink(missing_ok=True)
    (folder / "router.json").unlink(missing_ok=True)
    return stopped
