"""Last seen dispatcher request counters, to turn them into load_history rates."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("load_counters").create(
        {
            "source": str,  # e.g. "dispatcher:http://127.0.0.1:8000"
            "model": str,
            "time": str,  # ISO UTC of the reading
            "count": float,  # requests_total (all status codes: arrivals)
        },
        pk=("source", "model"),
    )
