"""The SQLite store: opening, migrations, transactions and the core queries.

Location: ``--db PATH``, else ``GREENCTL_DB``, else ``greenctl.db`` in the user's data
directory. WAL mode. Every write that belongs together runs in one ``transaction()``.

Only the default location's folder is created on demand: a path the user named (``--db``
or ``GREENCTL_DB``) must be in an existing folder, so that a typo is an error and not a new,
empty store somewhere.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data import migrations
from greenctl.data.errors import InputError, NotFoundError, StoreError
from greenctl.data.plan import Plan
from greenctl.data.records import (
    Hardware,
    Profile,
    Variant,
    point_preference,
    record_to_row,
    row_to_record,
    source_rank,
    source_rank_sql,
    utcnow_iso,
)

if TYPE_CHECKING:  # sqlite-utils imports pandas and numpy: load it only when a store opens
    import sqlite_utils


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/greenctl/greenctl.db`` (``~/.local/share`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "greenctl" / "greenctl.db"


def resolve_db_path(db: str | os.PathLike[str] | None = None) -> Path:
    """The store path: explicit argument, else ``GREENCTL_DB``, else the default."""
    return _resolve(db)[0]


def _resolve(db: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """The store path and whether the user named it (argument or ``GREENCTL_DB``)."""
    if db:
        return Path(db), True
    env = os.environ.get("GREENCTL_DB")
    if env:
        return Path(env), True
    return default_db_path(), False


def resource_order(label: str) -> tuple[Any, ...]:
    """Sort key of a resource label: kind, then size in natural order.

    ``cpu:2`` before ``cpu:10``, ``mig:1g.10gb`` before ``mig:3g.40gb``.
    """
    kind, _, size = label.partition(":")
    parts = re.split(r"(\d+)", size)
    return (kind, tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in parts if t))


class Store:
    """An open greenctl store. Use :func:`open_store`."""

    def __init__(self, db: sqlite_utils.Database, path: Path) -> None:
        self.db = db
        self.path = path

    # -- plumbing -------------------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[Store]:
        """One atomic unit of writes; nested calls become savepoints."""
        with self.db.atomic():
            yield self

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def applied_migrations(self) -> list[str]:
        return [r["name"] for r in self.db.table("migrations").rows_where(order_by="name")]

    # -- hardware -------------------------------------------------------------------------
    def add_hardware(self, hw: Hardware) -> int:
        """Insert or find an identical hardware row; returns its id."""
        row = record_to_row(hw)
        row.pop("id", None)
        if row.get("rapl_readable") is not None:
            row["rapl_readable"] = int(bool(row["rapl_readable"]))
        where = " and ".join(f"[{k}] is ?" for k in row)
        found = list(self.db.table("hardware").rows_where(where, list(row.values()), limit=1))
        if found:
            return int(found[0]["id"])
        return row_id(self.db.table("hardware").insert(row).last_pk)

    def hardware(self) -> list[Hardware]:
        return [
            row_to_record(Hardware, r) for r in self.db.table("hardware").rows_where(order_by="id")
        ]

    # -- variants -------------------------------------------------------------------------
    def upsert_variant(self, variant: Variant) -> None:
        """Insert a variant, or update the fields given (non-None) of an existing one."""
        row = {k: v for k, v in record_to_row(variant).items() if v is not None}
        table = self.db.table("variants")
        if table.count_where("name = ?", [variant.name]):
            table.update(variant.name, row)
        else:
            table.insert(row)

    def get_variant(self, name: str) -> Variant:
        """Raises NotFoundError naming the known variants."""
        rows = list(self.db.table("variants").rows_where("name = ?", [name], limit=1))
        if not rows:
            known = [
                r["name"]
                for r in self.db.table("variants").rows_where(order_by="name", select="name")
            ]
            hint = f"known variants: {', '.join(known)}" if known else "profile or import it first"
            raise NotFoundError(f"unknown variant '{name}'", hint=hint)
        return row_to_record(Variant, rows[0])

    def variants(self, family: str | None = None) -> list[Variant]:
        if family is None:
            rows = self.db.table("variants").rows_where(order_by="family, name")
        else:
            rows = self.db.table("variants").rows_where("family = ?", [family], order_by="name")
        return [row_to_record(Variant, r) for r in rows]

    def require_family(self, family: str) -> None:
        """Raises NotFoundError naming the known families (and a close one) unless ``family``
        has variants."""
        if not self.db.table("variants").count_where("family = ?", [family]):
            known = self.families()
            hint = f"known families: {', '.join(known)}" if known else "profile or import it first"
            close = difflib.get_close_matches(family, known, n=1)
            if close:
                hint = f"did you mean '{close[0]}'? {hint}"
            raise NotFoundError(f"unknown model family '{family}'", hint=hint)

    def families(self) -> list[str]:
        return [
            r["family"]
            for r in self.db.query("select distinct family from variants order by family")
        ]

    # -- profiles -------------------------------------------------------------------------
    def add_profiles(self, profiles: Iterable[Profile]) -> list[int]:
        """Insert profiles in one transaction; returns their ids."""
        ids = []
        with self.transaction():
            for p in profiles:
                ids.append(row_id(self.db.table("profiles").insert(record_to_row(p)).last_pk))
        return ids

    def latest_profiles(
        self,
        *,
        variant: str | None = None,
        family: str | None = None,
        resource: str | None = None,
        hardware: str | None = None,
    ) -> list[Profile]:
        """The row that represents every (variant, resource, batch, hardware, capacity SLO)
        point: the newest of its best-ranked source (:func:`~greenctl.data.records.source_rank`:
        real measurements, then MPS-emulated, then synthetic rows).

        Repeated measurements of a point are all kept (:meth:`profile_history`); a synthetic
        or emulated row stored after a real measurement of its point does not replace it.
        """
        where, params = _profile_filter(variant, family, resource, hardware)
        sql = f"""
            select * from (
              select p.*, row_number() over (
                partition by p.variant, p.resource, p.batch, coalesce(p.hardware, ''),
                             coalesce(p.capacity_slo_ms, -1)
                order by {source_rank_sql("p.source")}, p.created_at desc, p.id desc) as _rank
              from profiles p join variants v on v.name = p.variant
              {where})
            where _rank = 1
        """
        found = [row_to_record(Profile, r) for r in self.db.query(sql, params)]
        return sorted(found, key=_profile_order)

    def profile_history(
        self,
        *,
        variant: str | None = None,
        family: str | None = None,
        resource: str | None = None,
        hardware: str | None = None,
    ) -> list[Profile]:
        """Every stored row, the rows of each point together, the one that represents it
        (what :meth:`latest_profiles` returns) first."""
        where, params = _profile_filter(variant, family, resource, hardware)
        sql = f"select p.* from profiles p join variants v on v.name = p.variant {where}"
        rows = [row_to_record(Profile, r) for r in self.db.query(sql, params)]
        rows.sort(key=point_preference, reverse=True)
        return sorted(rows, key=_point_order)  # stable: best first within a point

    def has_profile(self, profile: Profile, *, same_time: bool) -> bool:
        """Whether the store holds ``profile`` already: every field equal but ``id`` and
        ``hardware_id`` (a pointer to this store's own hardware row, which an exported file
        does not carry: the machine is known by its ``hardware`` label, which is compared).

        With ``same_time`` False, ``created_at`` is not compared and only the latest row of
        the profile's point and source rank counts (re-importing figures that carry no time
        is a no-op only while nothing newer of that rank has been stored there: a newer
        synthetic row does not make a real measurement's re-import new, and the other way
        round).
        """
        row = record_to_row(profile)
        row.pop("id", None)
        row.pop("hardware_id", None)
        if same_time:
            where = " and ".join(f"[{k}] is ?" for k in row)
            return bool(self.db.table("profiles").count_where(where, list(row.values())))
        row.pop("created_at")
        point = ("variant", "resource", "batch", "hardware", "capacity_slo_ms")
        where = " and ".join(f"[{k}] is ?" for k in point)
        where += f" and {source_rank_sql('[source]')} = ?"
        latest = list(
            self.db.table("profiles").rows_where(
                where,
                [row[k] for k in point] + [source_rank(profile.source)],
                order_by="created_at desc, id desc",
                limit=1,
            )
        )
        return bool(latest) and all(latest[0].get(k) == v for k, v in row.items())

    def profile_count(self) -> int:
        return self.db.table("profiles").count

    # -- plans and runs -------------------------------------------------------------------
    def save_plan(self, plan: Plan, *, source: str = "planner") -> int:
        """Store a plan document; sets and returns ``plan.id``."""
        objective = plan.predicted.get("objective")
        with self.transaction():
            pk = (
                self.db.table("plans")
                .insert(
                    {
                        "kind": plan.kind,
                        "created_at": plan.created_at,
                        "schema": "greenctl.plan/v1",
                        "objective": float(objective)
                        if isinstance(objective, int | float)
                        else None,
                        "source": source,
                        "document": "{}",
                    }
                )
                .last_pk
            )
            plan.id = row_id(pk)
            self.db.table("plans").update(plan.id, {"document": plan.to_json(indent=None)})
        return plan.id

    def get_plan(self, plan_id: int) -> Plan:
        import sqlite_utils

        try:
            row = self.db.table("plans").get(plan_id)
        except sqlite_utils.db.NotFoundError:
            raise NotFoundError(
                f"no plan with id {plan_id} in the store", hint="`greenctl plan list` shows them"
            ) from None
        plan = Plan.from_dict(json.loads(row["document"]), source=f"plan {plan_id}")
        plan.id = plan_id
        return plan

    def plans(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Plan rows (without documents), newest first."""
        where, params = ("kind = ?", [kind]) if kind else (None, [])
        return list(
            self.db.table("plans").rows_where(
                where, params, order_by="id desc", select="id, kind, created_at, objective, source"
            )
        )

    def add_run(
        self,
        plan_id: int | None,
        *,
        kind: str,
        predicted: dict[str, Any],
        measured: dict[str, Any],
        started_at: str,
        notes: str | None = None,
    ) -> int:
        """Record a measured run of a plan beside its predictions."""
        return row_id(
            self.db.table("runs")
            .insert(
                {
                    "plan_id": plan_id,
                    "kind": kind,
                    "started_at": started_at,
                    "finished_at": utcnow_iso(),
                    "predicted": json.dumps(predicted),
                    "measured": json.dumps(measured),
                    "notes": notes,
                }
            )
            .last_pk
        )


def _profile_filter(
    variant: str | None, family: str | None, resource: str | None, hardware: str | None
) -> tuple[str, list[Any]]:
    """The ``where`` clause (over ``profiles p join variants v``) of the profile queries."""
    clauses, params = [], []
    for column, value in (
        ("p.variant", variant),
        ("v.family", family),
        ("p.resource", resource),
        ("p.hardware", hardware),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    return ("where " + " and ".join(clauses)) if clauses else "", params


def _profile_order(p: Profile) -> tuple[Any, ...]:
    slo = p.capacity_slo_ms
    return (p.variant, resource_order(p.resource), p.batch, slo is not None, slo or 0.0)


def _point_order(p: Profile) -> tuple[Any, ...]:
    """:func:`_profile_order` with the hardware label: the whole point."""
    return (*_profile_order(p)[:3], p.hardware or "", *_profile_order(p)[3:])


def row_id(value: object) -> int:
    """The id an insert gave its row (sqlite_utils types ``last_pk`` as optional; the store's
    integer keys always set it)."""
    if not isinstance(value, int):
        raise StoreError(f"unexpected primary key {value!r}")
    return value


def open_store(db: str | os.PathLike[str] | None = None, *, create: bool = True) -> Store:
    """Open the store and run pending migrations.

    Args:
        db: the path (``--db``); None for ``GREENCTL_DB``, else the default location.
        create: create the store file when it does not exist. Read-only callers pass False:
            a path the user named must then hold a store, and the default location, when it
            holds none yet, opens as an empty store in memory (no file is created).

    Raises:
        InputError: a path the user named is in a folder that does not exist, is a folder,
            or (``create=False``) holds no store (NotFoundError).
        StoreError: the file cannot be opened or is not a greenctl store.
    """
    path, named = _resolve(db)
    folder = path.parent
    if named and not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise InputError(
            f"cannot open store {path}: the folder {folder} {what}",
            hint=f"create the folder first (mkdir -p {folder}), or pass another --db",
        )
    if path.is_dir():
        raise InputError(
            f"cannot open store {path}: it is a folder",
            hint=f"name a file, for example --db {path / 'greenctl.db'}",
        )
    in_memory = False
    if not create and not path.exists():
        if named:
            raise NotFoundError(
                f"no greenctl store at {path}",
                hint="measure or import profiles first (greenctl profile, greenctl profile "
                "import FILE), or pass the right --db / GREENCTL_DB",
            )
        in_memory = True  # the default store is not made yet: read it as empty
    try:
        if not named and not in_memory:
            folder.mkdir(parents=True, exist_ok=True)
        target = ":memory:" if in_memory else str(path)
        if not in_memory and not path.exists():
            # the store holds the executors' restart command lines, which the supervisor
            # runs: owner-only whatever the umask (SQLite gives its -wal/-shm files this mode)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        conn = sqlite3.connect(target, timeout=30.0, check_same_thread=False)
        import sqlite_utils

        database = sqlite_utils.Database(conn)
        if not in_memory:
            database.enable_wal()
        database.execute("pragma foreign_keys = on")
        _migrate(database)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"cannot open store {path}: {exc}",
            hint="pass --db PATH or set GREENCTL_DB to a writable greenctl database",
        ) from None
    except OSError as exc:
        raise StoreError(f"cannot create store {path}: {exc.strerror}") from None
    return Store(database, path)


def _migrate(db: sqlite_utils.Database) -> None:
    if "migrations" not in db.table_names():
        db.table("migrations").create({"name": str, "applied_at": str}, pk="name")
    done = {r["name"] for r in db.table("migrations").rows}
    known = migrations.discover()
    unknown = done - {name for name, _ in known}
    if unknown:
        raise StoreError(
            f"the store has migrations this greenctl does not know: {', '.join(sorted(unknown))}",
            hint="upgrade greenctl, or use another --db",
        )
    for name, up in known:
        if name in done:
            continue
        with db.atomic():
            up(db)
            db.table("migrations").insert({"name": name, "applied_at": utcnow_iso()})
