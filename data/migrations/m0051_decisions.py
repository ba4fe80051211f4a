"""Replanning decisions: one row per `greenctl replan` run."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("decisions").create(
        {
            "id": int,
            "time": str,  # when the decision was taken (wall clock, ISO UTC)
            "at": str,  # the signal time it was taken for (differs in simulation)
            "lineage": str,  # "plan:ID" or "file:PATH": the plan series being replanned
            "region": str,
            "signal_g_per_kwh": float,
            "reference_g_per_kwh": float,  # the signal when the running plan was chosen
            "signal_change": float,  # relative change against reference_g_per_kwh
            "forecaster": str,
            "forecast_rps": float,
            "running_plan_id": int,
            "new_plan_id": int,
            "old_objective": float,
            "new_objective": float,
            "improvement": float,
            "action": str,  # apply | propose | keep | hold | failed
            "applied": int,
            "reason": str,
        },
        pk="id",
        not_null={"time", "lineage", "action", "reason"},
    )
    db.table("decisions").create_index(["lineage", "id"])
