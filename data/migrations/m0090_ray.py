"""Ray backend state: which Serve application of which plan is active on which cluster."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("ray_apps").create(
        {
            "id": int,
            "plan_id": int,
            "address": str,
            "app": str,
            "url": str,
            "applied_at": str,
            "active": int,
        },
        pk="id",
    )
