"""Carbon signals: grid carbon intensity time series per region."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    # One row per (region, time, kind): a re-import of the same hour replaces the value.
    db.table("carbon_signals").create(
        {
            "region": str,
            "time": str,  # ISO 8601 UTC, "YYYY-MM-DDTHH:MM:SSZ"
            "kind": str,  # average | marginal
            "carbon_g_per_kwh": float,
            "source": str,
            "imported_at": str,
        },
        pk=("region", "time", "kind"),
        not_null={"region", "time", "kind", "carbon_g_per_kwh"},
    )
    db.table("carbon_signals").create_index(["region", "time"])
