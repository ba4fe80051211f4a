"""Serving paths: the resource and batch a served run was measured on, and its batches' rows."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    table = db.table("serving_profiles")
    # resource/batch: NULL on older rows, which were all measured on cpu:1 at batch 1;
    # infer_rows_p50: median rows of the batches the served runs carried (batching executors)
    for col, kind in (("resource", str), ("batch", int), ("infer_rows_p50", float)):
        if col not in table.columns_dict:
            table.add_column(col, kind)
