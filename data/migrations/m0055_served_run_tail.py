"""Serving paths: the tail of the model's own runs inside the served executor."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    table = db.table("serving_profiles")
    for col in ("infer_p95_ms", "infer_p99_ms"):  # beside infer_p50_ms (model stand-in)
        if col not in table.columns_dict:
            table.add_column(col, float)
