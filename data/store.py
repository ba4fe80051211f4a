"""The SQLite store: opening, migrations, transactions and the core queries.

Location: ``--db PATH``, else ``GREENCTL_DB``, else ``greenctl.db`` in the user's data
directory. WAL mode. Every write that belongs together runs in one ``transaction()``.

Only the default location's folder is created on demand: a path the user named (``--db``
or ``GREENCTL_DB``) must be in an existing folder, so that a typo is an error and not a new,
empty store somewhere. A command that writes checks it can before it acts, and a refused
command leaves no store it created (or initialised from an empty file) behind.
"""

from __future__ import annotations

import difflib
import itertools
import json
import os
import re
import sqlite3
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from greenctl.data import migrations
from greenctl.data.errors import GreenctlError, InputError, NotFoundError, StoreError
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

if TYPE_CHECKING:  # sqlite-utils costs start-up time: load it only when a store opens
    import sqlite_utils

#: names of nested transactions' savepoints, unique in the process
_SAVEPOINTS = itertools.count(1)


def _sqlite_utils() -> ModuleType:
    """``sqlite_utils``, imported without pandas unless pandas is loaded already.

    sqlite-utils imports pandas whenever it is installed, only to map ``pandas.Timestamp``
    values to TEXT columns; the store never writes one, and pandas would cost a cold command
    about half a second. While it imports, ``import pandas`` raises ImportError, which
    sqlite-utils treats as pandas being absent.
    """
    hide = "sqlite_utils.db" not in sys.modules and "pandas" not in sys.modules
    if hide:
        sys.modules["pandas"] = None  # type: ignore[assignment]
    try:
        import sqlite_utils
    finally:
        if hide and "pandas" in sys.modules and sys.modules["pandas"] is None:
            del sys.modules["pandas"]
    return sqlite_utils


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/greenctl/greenctl.db`` (``~/.local/share`` when unset)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(Path.home(), ".local", "share")
    return Path(base) / "greenctl" / "greenctl.db"


def resolve_db_path(db: str | os.PathLike[str] | None = None) -> Path:
    """The store path: explicit argument, else ``GREENCTL_DB``, else the default."""
    return _resolve(db)[0]


def _resolve(db: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """The store path and whether the user named it (argument or ``GREENCTL_DB``).

    Raises:
        InputError: ``--db`` or ``GREENCTL_DB`` is given but empty (a blank value would
            otherwise fall through to another store without a word).
    """
    if db is not None:
        if not os.fspath(db).strip():
            raise InputError(
                "--db is empty",
                hint="name a store file (--db PATH), or leave --db out for $GREENCTL_DB or "
                "the default store",
            )
        return Path(db), True
    env = os.environ.get("GREENCTL_DB")
    if env is not None:
        if not env.strip():
            raise InputError(
                "GREENCTL_DB is set but empty",
                hint="set it to a store file, or unset it (unset GREENCTL_DB) for the default "
                "store",
            )
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
    """An open greenctl store. Use :func:`open_store`.

    Reads go through sqlite3 alone (:meth:`rows`); :attr:`db`, the sqlite-utils view of the
    same connection that most writes use, is made on first use, so that a command that only
    reads never imports sqlite-utils (and the numpy it loads).

    Used as a context manager (``with open_store(...) as store``), it closes the store on
    leaving, turns an SQLite fault of the file (read-only, locked, disk full, not a store)
    into greenctl's error, and, when the block is refused (exit code 2), undoes what opening
    did to the file: a store file created by this open is removed, an empty file that it
    initialised is emptied again.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        path: Path,
        *,
        made: str | None = None,
        db: sqlite_utils.Database | None = None,
    ) -> None:
        self.conn = conn
        self.path = path
        #: what opening did to the file, undone on a refusal: "created" or "initialised"
        self.made = made
        self._db = db

    # -- plumbing -------------------------------------------------------------------------
    @property
    def db(self) -> sqlite_utils.Database:
        """The store's connection as a sqlite-utils database (made on first use)."""
        if self._db is None:
            self._db = _database(self.conn)
        return self._db

    def rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        """The rows of one query, each a dict by column name, through sqlite3 alone."""
        cursor = self.conn.execute(sql, list(params))
        keys = [d[0] for d in cursor.description]
        return [dict(zip(keys, row, strict=True)) for row in cursor]

    def has_table(self, name: str) -> bool:
        """Whether the store holds a table ``name``."""
        sql = "select 1 from sqlite_master where type = 'table' and name = ?"
        return bool(self.rows(sql, [name]))

    @contextmanager
    def transaction(self) -> Iterator[Store]:
        """One atomic unit of writes; nested calls (and sqlite-utils' ``atomic()`` inside)
        become savepoints. An error rolls the unit back and propagates."""
        conn = self.conn
        if conn.in_transaction:
            savepoint = f"greenctl_{next(_SAVEPOINTS)}"
            conn.execute(f"savepoint {savepoint}")
            try:
                yield self
            except BaseException:
                if conn.in_transaction:  # a trigger's RAISE(ROLLBACK) may have ended it
                    conn.execute(f"rollback to savepoint {savepoint}")
                    conn.execute(f"release savepoint {savepoint}")
                raise
            conn.execute(f"release savepoint {savepoint}")
            return
        conn.execute("begin")
        try:
            yield self
            conn.execute("commit")
        except BaseException:
            conn.rollback()
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.close()
        fault = store_fault(exc, self.path) if isinstance(exc, sqlite3.Error) else None
        if getattr(fault or exc, "exit_code", None) == 2:
            self.undo_opening()
        if fault is not None:
            raise fault from None

    def undo_opening(self) -> None:
        """Leave the file as it was before :func:`open_store`: remove a store file it created,
        empty again a zero-byte file it initialised (and their WAL files). Call it closed."""
        made, self.made = self.made, None
        _undo_file(self.path, made)

    def applied_migrations(self) -> list[str]:
        return [r["name"] for r in self.rows("select name from migrations order by name")]

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
        return [row_to_record(Hardware, r) for r in self.rows("select * from hardware order by id")]

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
        rows = self.rows("select * from variants where name = ? limit 1", [name])
        if not rows:
            known = [r["name"] for r in self.rows("select name from variants order by name")]
            hint = f"known variants: {', '.join(known)}" if known else "profile or import it first"
            raise NotFoundError(f"unknown variant '{name}'", hint=hint)
        return row_to_record(Variant, rows[0])

    def variants(self, family: str | None = None) -> list[Variant]:
        if family is None:
            rows = self.rows("select * from variants order by family, name")
        else:
            rows = self.rows("select * from variants where family = ? order by name", [family])
        return [row_to_record(Variant, r) for r in rows]

    def require_family(self, family: str) -> None:
        """Raises NotFoundError naming the known families (and a close one) unless ``family``
        has variants."""
        if not self.rows("select 1 from variants where family = ? limit 1", [family]):
            known = self.families()
            hint = f"known families: {', '.join(known)}" if known else "profile or import it first"
            close = difflib.get_close_matches(family, known, n=1)
            if close:
                hint = f"did you mean '{close[0]}'? {hint}"
            raise NotFoundError(f"unknown model family '{family}'", hint=hint)

    def families(self) -> list[str]:
        return [
            r["family"] for r in self.rows("select distinct family from variants order by family")
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
        found = [row_to_record(Profile, r) for r in self.rows(sql, params)]
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
        rows = [row_to_record(Profile, r) for r in self.rows(sql, params)]
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
            return bool(self.rows(f"select 1 from profiles where {where} limit 1", row.values()))
        row.pop("created_at")
        point = ("variant", "resource", "batch", "hardware", "capacity_slo_ms")
        where = " and ".join(f"[{k}] is ?" for k in point)
        where += f" and {source_rank_sql('[source]')} = ?"
        latest = self.rows(
            f"select * from profiles where {where} order by created_at desc, id desc limit 1",
            [row[k] for k in point] + [source_rank(profile.source)],
        )
        return bool(latest) and all(latest[0].get(k) == v for k, v in row.items())

    def profile_count(self) -> int:
        return int(self.rows("select count(*) as n from profiles")[0]["n"])

    # -- plans and runs -------------------------------------------------------------------
    def save_plan(self, plan: Plan, *, source: str = "planner") -> int:
        """Store a plan document; sets and returns ``plan.id``."""
        objective = plan.predicted.get("objective")
        score = float(objective) if isinstance(objective, int | float) else None
        with self.transaction():
            cursor = self.conn.execute(
                "insert into plans (kind, created_at, schema, objective, source, document) "
                "values (?, ?, ?, ?, ?, '{}')",
                [plan.kind, plan.created_at, "greenctl.plan/v1", score, source],
            )
            plan.id = row_id(cursor.lastrowid)
            self.conn.execute(
                "update plans set document = ? where id = ?",
                [plan.to_json(indent=None), plan.id],
            )
        return plan.id

    def get_plan(self, plan_id: int) -> Plan:
        found = self.rows("select document from plans where id = ?", [plan_id])
        if not found:
            raise NotFoundError(
                f"no plan with id {plan_id} in the store", hint="`greenctl plan list` shows them"
            )
        plan = Plan.from_dict(json.loads(found[0]["document"]), source=f"plan {plan_id}")
        plan.id = plan_id
        return plan

    def plans(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Plan rows (without documents), newest first."""
        where, params = ("where kind = ?", [kind]) if kind else ("", [])
        return self.rows(
            f"select id, kind, created_at, objective, source from plans {where} order by id desc",
            params,
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


def open_store(
    db: str | os.PathLike[str] | None = None, *, create: bool = True, missing_ok: bool = False
) -> Store:
    """Open the store and run pending migrations.

    Args:
        db: the path (``--db``); None for ``GREENCTL_DB``, else the default location.
        create: the caller writes: the store file is created when it does not exist, and a
            store that cannot be written (a read-only file or folder) is refused before the
            command acts. Read-only callers pass False: a path the user named must then
            hold a store, and the default location when it holds none yet, or an empty
            (zero-byte) file, opens as an empty store in memory (nothing is written).
        missing_ok: with ``create=False``, a named path that holds no store reads as empty
            too (for commands whose store is optional, such as exporting a plan file).

    Raises:
        InputError: ``--db`` is empty; a path the user named is in a folder that does not
            exist, is a folder, is not a greenctl store, or (``create=False``) holds no
            store (NotFoundError); the store cannot be written (``create=True``).
        StoreError: the file cannot be opened, is locked, or is from a newer greenctl.
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
    empty = _is_empty(path)
    if not create and not path.exists() and named and not missing_ok:
        raise NotFoundError(
            f"no greenctl store at {path}",
            hint="measure or import profiles first (greenctl profile, greenctl profile "
            "import FILE), or pass the right --db / GREENCTL_DB",
        )
    # a read-only caller reads a store not made yet (or an empty file) as empty, in memory
    in_memory = not create and (empty or not path.exists())
    made = None
    try:
        if not named and not in_memory:
            folder.mkdir(parents=True, exist_ok=True)
        if create:
            check_store_writable(path)
            made = "initialised" if empty else None
        if not in_memory and not path.exists():
            # the store holds the executors' restart command lines, which the supervisor
            # runs: owner-only whatever the umask (SQLite gives its -wal/-shm files this mode)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            made = "created"
        conn, database = _connect(path, in_memory=in_memory, writes=create)
        store = Store(conn, path, made=made, db=database)
    except sqlite3.Error as exc:
        _undo_file(path, made)
        raise store_fault(exc, path) or StoreError(
            f"cannot open store {path}: {exc}",
            hint="pass --db PATH or set GREENCTL_DB to a writable greenctl store",
        ) from None
    except OSError as exc:
        _undo_file(path, made)
        raise StoreError(f"cannot create store {path}: {exc.strerror}") from None
    except GreenctlError:
        _undo_file(path, made)
        raise
    return store


def _connect(
    path: Path, *, in_memory: bool, writes: bool
) -> tuple[sqlite3.Connection, sqlite_utils.Database | None]:
    """The migrated database at ``path`` (or an empty one in memory); WAL mode when written.
    With it, the sqlite-utils database that migrating it made (None when nothing was due).

    A reader of a store whose folder it cannot write (SQLite could make no -shm file there)
    opens the file immutable when no WAL file holds pages: nothing can change it meanwhile.
    """
    immutable = (
        not in_memory
        and not writes
        and not os.access(path.parent, os.W_OK | os.X_OK)
        and not Path(f"{path}-wal").exists()
    )
    if in_memory:
        conn = sqlite3.connect(":memory:", check_same_thread=False)
    elif immutable:
        uri = f"{path.resolve().as_uri()}?immutable=1"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    else:
        conn = sqlite3.connect(str(path), timeout=30.0, check_same_thread=False)
    try:
        conn.execute("pragma recursive_triggers = on")  # as sqlite-utils sets it
        tables = [] if in_memory else _table_names(conn)
        if tables and "migrations" not in tables:
            raise InputError(
                f"{path} is an SQLite database but not a greenctl store",
                hint="pass the right --db, or a new file for a new store",
            )
        wal = not in_memory and not immutable and (writes or os.access(path, os.W_OK))
        if wal and conn.execute("pragma journal_mode").fetchone()[0] != "wal":
            conn.execute("pragma journal_mode = wal")
        conn.execute("pragma foreign_keys = on")
        database = _migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn, database


def _database(conn: sqlite3.Connection) -> sqlite_utils.Database:
    """``conn`` as a sqlite-utils database, without sqlite-utils plugins (an installed one
    would load every entry point and could change the store's connection)."""
    return _sqlite_utils().Database(conn, execute_plugins=False)


def _table_names(conn: sqlite3.Connection) -> list[str]:
    return [r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")]


def _is_empty(path: Path) -> bool:
    """Whether ``path`` is a zero-byte file (and no WAL file holds its pages)."""
    try:
        if path.stat().st_size:
            return False
        return not Path(f"{path}-wal").exists() or not Path(f"{path}-wal").stat().st_size
    except OSError:
        return False


def _undo_file(path: Path, made: str | None) -> None:
    """Remove the store file at ``path`` (made "created") or empty it again ("initialised"),
    with the SQLite files beside it; nothing when ``made`` is None, or when the store holds
    rows by now (another process that opened the new store meanwhile keeps its data)."""
    if made is None or _holds_data(path):
        return
    for extra in ("-wal", "-shm", "-journal"):
        Path(f"{path}{extra}").unlink(missing_ok=True)
    if made == "created":
        path.unlink(missing_ok=True)
    elif path.exists():
        os.truncate(path, 0)


def _holds_data(path: Path) -> bool:
    """Whether the store at ``path`` holds a row besides its migration records (True when
    it cannot be read: then it is left alone)."""
    if not path.exists() or not path.stat().st_size:
        return False
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=1.0)
        try:
            tables = [r[0] for r in con.execute("select name from sqlite_master where "
                      "type = 'table' and name not like 'sqlite_%' and name != 'migrations'")]  # fmt: skip
            return any(con.execute(f"select exists (select 1 from [{t}])").fetchone()[0]
                       for t in tables)  # fmt: skip
        finally:
            con.close()
    except sqlite3.Error:
        return True


def check_store_writable(path: Path) -> None:
    """Refuse a store that cannot be written before a command acts: the file and the SQLite
    files beside it, and its folder (SQLite keeps its journal and WAL files there).

    Raises:
        InputError: names the read-only file or folder and the fix.
    """
    for target in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        if target.exists() and not os.access(target, os.W_OK):
            what = "the file" if target == path else target
            raise InputError(
                f"cannot write store {path}: {what} is read-only",
                hint=f"make it writable (chmod u+w {target}), or pass another --db",
            )
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(
            f"cannot write store {path}: its folder {folder} is read-only (SQLite writes its "
            "journal beside the store)",
            hint=f"make the folder writable (chmod u+w {folder}), or pass another --db",
        )


def store_fault(exc: BaseException | None, path: Path) -> GreenctlError | None:
    """greenctl's error for an SQLite fault of the store file at ``path``: read-only (exit
    2, the user's to fix), not a database (exit 2), locked, disk full or unreadable (exit 1);
    None for other SQLite errors (programming errors keep their traceback)."""
    if not isinstance(exc, sqlite3.Error):
        return None
    text = str(exc).lower()
    if "readonly" in text or "read-only" in text:
        return InputError(
            f"cannot write store {path}: the file or its folder is read-only",
            hint=f"make both writable (chmod u+w {path} {path.parent}), or pass another --db",
        )
    if "not a database" in text or "malformed" in text or "encrypted" in text:
        return InputError(
            f"{path} is not a greenctl store ({exc})",
            hint="pass the right --db, or a new file for a new store",
        )
    if "locked" in text or "busy" in text:
        return StoreError(
            f"store {path} is locked by another process",
            hint="wait for the other greenctl command to finish, then run this again",
        )
    if "full" in text:
        return StoreError(
            f"cannot write store {path}: the disk is full",
            hint="free space on its disk, or pass another --db",
        )
    if "unable to open" in text or "i/o error" in text or "disk" in text:
        return StoreError(
            f"cannot open store {path}: {exc}",
            hint="pass --db PATH or set GREENCTL_DB to a writable greenctl store",
        )
    return None


def _migrate(conn: sqlite3.Connection) -> sqlite_utils.Database | None:
    """Apply the migrations not applied yet; the sqlite-utils database that did it, if any."""
    fresh = "migrations" not in _table_names(conn)
    done = set() if fresh else {r[0] for r in conn.execute("select name from migrations")}
    known = migrations.discover()
    unknown = done - {name for name, _ in known}
    if unknown:
        raise StoreError(
            f"the store has migrations this greenctl does not know: {', '.join(sorted(unknown))}",
            hint="upgrade greenctl, or use another --db",
        )
    due = [(name, up) for name, up in known if name not in done]
    if not due:
        return None
    db = _database(conn)
    if fresh:
        db.table("migrations").create({"name": str, "applied_at": str}, pk="name")
    for name, up in due:
        with db.atomic():
            up(db)
            db.table("migrations").insert({"name": name, "applied_at": utcnow_iso()})
    return db
