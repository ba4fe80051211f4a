"""The serving path's stored measurements (``serving_profiles``) behind named functions.

``executor/runtime/serving.py`` turns them into :class:`ServingMeasurement` records and serving
overheads; the SQL lives here (see ARCHITECTURE.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from greenctl.data.store import Store


def add_serving_row(store: Store, row: dict[str, Any]) -> int | None:
    """Append one measurement row; returns its id."""
    pk = store.db.table("serving_profiles").insert(row).last_pk
    return None if pk is None else int(pk)


def serving_profile_rows(store: Store, *, variant: str | None = None) -> list[dict[str, Any]]:
    """Stored measurements (of one variant, or all), newest first."""
    sql = "select * from serving_profiles"
    params: list[Any] = []
    if variant:
        sql += " where variant = ?"
        params.append(variant)
    sql += " order by created_at desc, id desc"
    return store.rows(sql, params)


def family_serving_rows(
    store: Store, *, path: str, family: str, stand_in: str | None = None
) -> list[dict[str, Any]]:
    """A family's measurements on ``path`` (``dispatcher`` or ``direct``), newest first;
    ``stand_in`` keeps only ``model`` or ``noop`` runs (None: either; rows without one count
    as ``noop``)."""
    return store.rows(
        "select * from serving_profiles where path = ? and family = ? "
        "and coalesce(stand_in, 'noop') = coalesce(?, stand_in, 'noop') "
        "order by created_at desc, id desc",
        [path, family, stand_in],
    )
