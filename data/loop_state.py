"""The control loop's tables behind named functions: measured load, saved forecasters,
replanning decisions, the dispatcher's request counters (what runs, and on which backend,
is in :mod:`greenctl.data.deployments`).

``executor/control/`` observes, decides and reconciles; what it reads and writes in the
store goes through here, so the SQL lives in ``data/`` (see ARCHITECTURE.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.records import utcnow_iso
from greenctl.data.store import row_id

if TYPE_CHECKING:
    from greenctl.data.store import Store

#: the replan loop's defaults, for ``replan``, ``replay`` and every kind's replay: the carbon
#: signal's move (a fraction of the reference) that is worth a new plan, the objective's
#: improvement that is, and the least time between two changes (``--min-dwell``)
REPLAN_THRESHOLD = 0.05
REPLAN_MARGIN = 0.02
REPLAN_MIN_DWELL = "1h"
REPLAN_MIN_DWELL_S = 3600.0


def lineage_key(plan: str | int) -> str:
    """The key decisions of one replanned lineage share: ``plan:ID`` for a stored plan's id,
    ``file:PATH`` (resolved) for a plan file."""
    text = str(plan).strip()
    if text.isdigit():
        return f"plan:{int(text)}"
    return f"file:{Path(text).resolve()}"


# -- load history -----------------------------------------------------------------------------
def add_load_rows(store: Store, rows: Iterable[dict[str, Any]]) -> None:
    """Append measured load rows (``time, model, rate_rps, interval_s, source``)."""
    store.db.table("load_history").insert_all(list(rows))


def load_minute_peaks(store: Store, *, model: str | None = None) -> list[float]:
    """The measured load's per-minute maxima, oldest first (one model, or all)."""
    where, params = ("model = ?", [model]) if model is not None else ("1 = 1", [])
    rows = store.rows(
        f"select substr(time, 1, 16) as minute, max(rate_rps) as peak from load_history "
        f"where {where} group by minute order by minute",
        params,
    )
    return [float(r["peak"]) for r in rows]


# -- forecasters ------------------------------------------------------------------------------
def save_forecaster(store: Store, row: dict[str, Any]) -> None:
    """Store a fitted forecaster (replacing one of the same name)."""
    store.db.table("forecasters").insert(row, replace=True)


def forecaster_row(store: Store, name: str) -> dict[str, Any] | None:
    """The saved forecaster called ``name``, or None."""
    rows = store.rows("select * from forecasters where name = ? limit 1", [name])
    return rows[0] if rows else None


def forecaster_rows(store: Store) -> list[dict[str, Any]]:
    """Every saved forecaster, by name."""
    return store.rows("select * from forecasters order by name")


# -- plans and decisions ----------------------------------------------------------------------
def plan_documents(store: Store, *, source: str, kind: str) -> Iterator[tuple[int, str]]:
    """``(id, document JSON)`` of the stored plans of one source and kind, oldest first."""
    for row in store.rows(
        "select id, document from plans where source = ? and kind = ? order by id", [source, kind]
    ):
        yield int(row["id"]), row["document"]


def add_decision(store: Store, record: dict[str, Any]) -> int:
    """Append a replanning decision record; returns its id."""
    return row_id(store.db.table("decisions").insert(record).last_pk)


def lineage_new_plan_ids(store: Store, lineage: str) -> set[int]:
    """Every plan the rounds of ``lineage`` made (applied or proposed)."""
    return {
        int(row["new_plan_id"])
        for row in store.rows(
            "select new_plan_id from decisions where lineage = ? and new_plan_id is not null",
            [lineage],
        )
    }


def last_applied_decision(store: Store, lineage: str) -> dict[str, Any] | None:
    """The newest decision of ``lineage`` that applied a plan, or None."""
    rows = store.rows(
        "select * from decisions where lineage = ? and action = 'apply' and applied = 1 "
        "order by id desc limit 1",
        [lineage],
    )
    return rows[0] if rows else None


# -- the dispatcher's counters (the running dispatcher itself: data/deployments.py) -----------
def load_counter(store: Store, *, source: str, model: str) -> dict[str, Any] | None:
    """The last request count read from ``source`` for ``model`` (``time, count``), or None."""
    rows = store.rows(
        "select * from load_counters where source = ? and model = ? limit 1", [source, model]
    )
    return rows[0] if rows else None


def set_load_counter(store: Store, *, source: str, model: str, time: str, count: float) -> None:
    """Remember the request count read from ``source`` for ``model`` at ``time``."""
    store.db.table("load_counters").insert(
        {"source": source, "model": model, "time": time, "count": count}, replace=True
    )


# -- eGLB's online state of a routed geo plan ------------------------------------------------
def add_geo_step(store: Store, row: dict[str, Any]) -> int:
    """Append one online step of a routed geo plan (``lineage, plan_id, algorithm, slot,
    slot_time, state, fractions``; the last two as dicts, stored as JSON); returns its id."""

    doc = {
        **row,
        "state": json.dumps(row["state"]),
        "fractions": json.dumps(row.get("fractions") or {}),
        "created_at": utcnow_iso(),
    }
    return row_id(store.db.table("geo_online_steps").insert(doc).last_pk)


def last_geo_step(store: Store, lineage: str) -> dict[str, Any] | None:
    """The newest online step of ``lineage`` (``state`` and ``fractions`` decoded), or None."""
    rows = store.rows(
        "select * from geo_online_steps where lineage = ? order by id desc limit 1", [lineage]
    )
    if not rows:
        return None
    row = rows[0]
    row["state"] = json.loads(row["state"])
    row["fractions"] = json.loads(row["fractions"] or "{}")
    return row
