"""Load history (measured requests per second) and fitted load forecasters."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("load_history").create(
        {
            "id": int,
            "time": str,  # ISO UTC of the start of the sample
            "model": str,  # model family, or "" for the whole endpoint
            "rate_rps": float,
            "interval_s": float,
            "source": str,  # loadgen | dispatcher | trace:<file> | ...
        },
        pk="id",
        not_null={"time", "rate_rps"},
    )
    db.table("load_history").create_index(["model", "time"])
    db.table("forecasters").create(
        {
            "name": str,
            "kind": str,  # last | moving-max | seasonal-naive | lstm
            "params": str,  # JSON
            "state": bytes,  # torch state_dict for lstm, else NULL
            "trained_on": str,
            "metrics": str,  # JSON: validation error on the training source
            "created_at": str,
        },
        pk="name",
        not_null={"kind", "params", "created_at"},
    )
