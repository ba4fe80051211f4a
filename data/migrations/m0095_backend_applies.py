"""Which backend runs the plan: one row per apply on a backend (local daemons, Ray), so
``status``, ``down`` and ``replan --apply`` ask the backend that runs it.

A store that already serves (a running local dispatcher, an active Ray application) gets
that recorded, newest last, so the first ``status`` after the upgrade asks the right one.
"""

from __future__ import annotations

import json
from typing import Any


def up(db: Any) -> None:
    db.table("backend_applies").create(
        {
            "id": int,
            "backend": str,  # local | ray
            "address": str,  # the Ray cluster's address; None for local
            "plan_id": int,
            "options": str,  # JSON: how it was applied (local host/port, Ray http_port)
            "applied_at": str,
            "state": str,  # running | replaced | stopped
            "stopped_at": str,
        },
        pk="id",
        not_null={"backend", "state"},
    )
    found: list[tuple[str, dict[str, Any]]] = []  # (applied at, record)
    if "executor_dispatcher" in db.table_names():
        for row in db.table("executor_dispatcher").rows_where(
            "state = 'running'", order_by="id desc", limit=1
        ):
            found.append(
                (
                    str(row.get("started_at") or ""),
                    {"backend": "local", "address": None, "plan_id": row["plan_id"], "options": {}},
                )
            )
    if "ray_apps" in db.table_names():
        for row in db.table("ray_apps").rows_where("active = 1", order_by="id desc", limit=1):
            port = str(row.get("url") or "").rpartition(":")[2]
            options = {"http_port": int(port)} if port.isdigit() else {}
            found.append(
                (
                    str(row.get("applied_at") or ""),
                    {
                        "backend": "ray",
                        "address": row["address"],
                        "plan_id": row["plan_id"],
                        "options": options,
                    },
                )
            )
    for at, rec in sorted(found, key=lambda item: item[0]):
        db.table("backend_applies").insert(
            {
                **rec,
                "options": json.dumps(rec["options"]),
                "applied_at": at or None,
                "state": "running",
            }
        )
