"""Shared CLI pieces: options, store opening, rendering helpers."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.data import bundled
from greenctl.data.errors import InputError, shown
from greenctl.data.store import Store, open_store
from rich import box
from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text

# emoji=False: ":abc:" in a name or message stays ":abc:". Text that quotes user input
# (names, paths, messages built from them) is printed with `say` (or markup=False), never
# as rich markup: "x[red]y" prints as "x[red]y".
console = Console(emoji=False)
err_console = Console(stderr=True, emoji=False)

Part = str | tuple[str, str | Style]


def say(*parts: Part, err: bool = False, highlight: bool = True, **kwargs: Any) -> None:
    """Print text as it is: never rich markup (``[red]``) nor emoji codes (``:abc:``).

    Each part is plain text, or a ``(text, style)`` pair for the parts greenctl styles itself,
    e.g. ``say(("warning:", "yellow"), f" {message}", err=True)``. ``highlight`` colours
    numbers and the like as ``console.print`` does; other keywords go to ``console.print``.
    """
    out = err_console if err else console
    text = Text.assemble(*parts)
    out.print(out.highlighter(text) if highlight else text, **kwargs)


# No envvar: GREENCTL_DB is read by the store (data.store.resolve_db_path) only when no --db
# is given anywhere; as an envvar here it would beat the root's `greenctl --db PATH`.
DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        help="Path of the SQLite store (default: the root's --db, else $GREENCTL_DB, else the "
        "user's data directory).",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for machines instead of tables.")]


def input_path(value: str | Path) -> Path:
    """The parser of every option or argument that takes an input file or folder.

    ``bundled:NAME`` becomes the installed path of that bundled data set (an unknown name is
    refused with every bundled name, exit 2); any other value is the path as given. Used as
    ``typer.Option(..., parser=input_path, metavar=...)`` so that every command resolves
    bundled names the same way, before it runs.
    """
    return bundled.resolve(value)


def input_path_str(value: str | Path) -> str:
    """:func:`input_path` for the options that hand the path on as text."""
    return str(input_path(value))


# `greenctl --db PATH COMMAND` sets this; a command's own --db wins over it.
ROOT_DB: ContextVar[str | None] = ContextVar("greenctl_root_db", default=None)


def db_option(db: str | None) -> str | None:
    """The ``--db`` in force: the command's own, else the root's (None: the store module's
    default). An empty ``--db ""`` is kept, so that the store refuses it by name."""
    return db if db is not None else ROOT_DB.get()


def store_for(db: str | None, *, create: bool = True, missing_ok: bool = False) -> Store:
    """Open the store named by ``--db`` on the command, else on the root command.

    ``create`` says the command writes: the store is created when missing, and one that
    cannot be written is refused before the command acts. Read-only commands pass
    ``create=False``: nothing is created or written, and a named store that does not exist
    is refused unless ``missing_ok`` (it then reads as empty); see
    :func:`greenctl.data.store.open_store`.
    """

    return open_store(db_option(db), create=create, missing_ok=missing_ok)


def check_writable(path: str | Path | None, *, option: str = "-o") -> Path | None:
    """Refuse an output *file* that cannot be written, before the command does any work.

    The rule of every option that names a file to write (``-o FILE``); None passes through.

    Raises:
        InputError: the value is empty, names a folder, sits in a folder that does not exist
            (or in the filesystem root), or cannot be written; the message names the option.
    """
    if path is None:
        return None
    p = _output_path(path, option)
    if p.is_dir():
        raise InputError(
            f"{option} {shown(str(p), 200)} is a folder, not a file",
            hint=f"name a file, e.g. {option} {shown(str(p / 'out.json'), 200)}",
        )
    _check_place(p, option)
    return p


def check_writable_folder(path: str | Path, *, option: str = "--out") -> Path:
    """Refuse an output *folder* that cannot be made or written, before any work.

    The rule of every option that names a folder to write files into (``--out DIR``): an
    existing folder, or a new one in an existing folder (created by the command when it
    writes, not here).

    Raises:
        InputError: the value is empty, names an existing file, sits in a folder that does
            not exist (or in the filesystem root), or cannot be written; names the option.
    """
    p = _output_path(path, option)
    if p.exists() and not p.is_dir():
        raise InputError(
            f"{option} {shown(str(p), 200)} is a file, not a folder",
            hint=f"name a folder (it is created when missing), e.g. {option} "
            f"{shown(str(p.with_suffix('')) + '-out', 200)}",
        )
    _check_place(p, option)
    return p


@contextmanager
def undone_on_failure(folder: Path) -> Iterator[Path]:
    """Run a block that writes into ``folder``; a folder it made is removed again when the
    block fails, so that a refused command leaves no new folder behind."""
    made = not folder.exists()
    try:
        yield folder
    except BaseException:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise


def _output_path(path: str | Path, option: str) -> Path:
    """``path`` as a Path; an empty value is refused by the option's name."""
    if not str(path).strip():
        raise InputError(f"{option} is empty", hint=f"give {option} a path")
    return Path(path)


def _check_place(p: Path, option: str) -> None:
    """The folder that holds ``p`` exists and is not the filesystem root (for a new entry),
    and ``p`` (or, when new, its folder) can be written."""
    folder = p.parent
    name = shown(str(p), 200)
    if not p.exists():
        if not folder.is_dir():
            where = shown(str(folder), 200)
            if folder.exists():
                raise InputError(
                    f"{option} {name}: {where} is a file, not a folder",
                    hint=f"name a path in a folder, e.g. {option} ./{shown(p.name, 200)}",
                )
            raise InputError(
                f"{option} {name}: the folder {where} does not exist",
                hint=f"create the folder first (mkdir -p {where}), or write somewhere else",
            )
        if folder.resolve() == Path(folder.resolve().anchor):
            raise InputError(
                f"{option} {name}: greenctl does not create files or folders in the "
                "filesystem root",
                hint=f"write under the current folder or your home, e.g. {option} "
                f"./{shown(p.name, 200)}",
            )
    target = p if p.exists() else folder  # a new entry is made in its folder
    if not os.access(target, os.W_OK | (os.X_OK if target.is_dir() else 0)):
        raise InputError(
            f"{option} {name} is not writable",
            hint="make it writable (chmod u+w), or write somewhere else",
        )


def print_json(obj: Any) -> None:
    """Write a JSON document to stdout (no rich markup, stable key order)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=_default) + "\n")
    sys.stdout.flush()


def _default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return str(obj)


def fmt(value: Any, digits: int = 3) -> str:
    """Format a cell: None as '-', floats with ``digits`` significant decimals."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}" if abs(value) < 1 else f"{value:.{max(digits - 1, 1)}f}"
    return str(value)


def render_table(
    title: str | None,
    columns: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    caption: str | None = None,
) -> None:
    """Print a rich table with formatted cells, never breaking a value across lines.

    The title, the caption and the cells are printed as they are (a name like ``x[red]y`` in
    any of them is not markup), so callers pass user text (names, regions, paths) unescaped.
    A table wider than the terminal is drawn compact (no vertical rules, headers wrapped); if
    its values still do not fit, each row prints as a block of ``column: value`` lines.
    """
    cells = [[fmt(v) for v in row] for row in rows]
    width = console.width
    boxed = _table(title, columns, cells, caption=caption, compact=False)
    if console.measure(boxed, options=console.options.update_width(10_000)).maximum <= width:
        console.print(boxed)
    elif _min_width(columns, cells) <= width:
        console.print(_table(title, columns, cells, caption=caption, compact=True))
    else:
        _render_records(title, columns, cells, caption=caption)


def _table(
    title: str | None,
    columns: Sequence[str],
    cells: list[list[str]],
    *,
    caption: str | None,
    compact: bool,
) -> Table:
    """The table itself; compact: a rule under the headers, one space between columns, each
    column as wide as its widest value (or header word)."""
    table = Table(
        title=None if title is None else Text(title, style="table.title"),
        caption=None if caption is None else Text(caption, style="table.caption"),
        header_style="bold",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        padding=(0, 0) if compact else (0, 1),
        show_edge=not compact,
    )
    widths = _compact_widths(columns, cells) if compact else [None] * len(columns)
    for col, w in zip(columns, widths, strict=True):
        table.add_column(col, overflow="fold", width=w)
    for row in cells:
        table.add_row(*(Text(c) for c in row))
    return table


def _compact_widths(columns: Sequence[str], cells: list[list[str]]) -> list[int]:
    """Each column's compact width: its widest value or header word, whichever is wider."""
    return [
        max(
            max((len(r[i]) for r in cells if i < len(r)), default=1),
            max((len(word) for word in col.split()), default=1),
        )
        for i, col in enumerate(columns)
    ]


def _min_width(columns: Sequence[str], cells: list[list[str]]) -> int:
    """Width of the compact table: its columns and one space between each two."""
    return sum(_compact_widths(columns, cells)) + len(columns) - 1


def _render_records(
    title: str | None, columns: Sequence[str], cells: list[list[str]], *, caption: str | None
) -> None:
    """Each row as ``column: value`` lines, for tables too wide for the terminal."""
    if title:
        console.print(Text(title, style="table.title"))
    label = max((len(c) for c in columns), default=0)
    for n, row in enumerate(cells):
        if n:
            console.print()
        for col, value in zip(columns, row, strict=False):
            console.print(Text.assemble((f"{col:>{label}}", "bold"), f"  {value}"))
    if caption:
        console.print(Text(caption, style="table.caption"))
