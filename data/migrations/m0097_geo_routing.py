"""The geo router in the store: one row per router apply starts, journaled
before its supervisor starts (``starting``), ``running`` once it serves, ``stopping`` while
an apply replaces it, ``stopped`` after; so the next ``apply``, ``status`` or ``down`` can
stop what an interrupted apply left, as for the dispatcher. And eGLB's online state per
routed plan lineage and step (``geo_online_steps``), so ``replan`` takes one online step
from the stored state instead of solving the whole horizon again.
"""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("geo_routers").create(
        {
            "id": int,
            "plan_id": int,  # the plan it routes now (replans move it)
            "host": str,
            "port": int,
            "supervisor_pid": int,
            "supervisor_pid_start": str,
            "router_pid": int,
            "router_pid_start": str,
            "state_dir": str,  # its folder: record (token, sites) and table, 0700
            "state": str,  # starting | running | stopping | stopped
            "started_at": str,
            "stopped_at": str,
        },
        pk="id",
        not_null={"state", "state_dir"},
    )
    db.table("geo_routers").create_index(["state"])
    db.table("geo_online_steps").create(
        {
            "id": int,
            "lineage": str,  # "plan:ID": the plan the router was applied with
            "plan_id": int,  # the plan whose files the step read
            "algorithm": str,  # eglb | eglb-mpc
            "slot": int,  # the step taken (the state is the one after it)
            "slot_time": str,
            "state": str,  # JSON: the planner's OnlineState.to_dict()
            "fractions": str,  # JSON: {gateway: {site: fraction}} of the slot
            "created_at": str,
        },
        pk="id",
        not_null={"lineage", "slot", "state"},
    )
    db.table("geo_online_steps").create_index(["lineage", "id"])
