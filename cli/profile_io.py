"""``greenctl profile import`` / ``profile export``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from greenctl.cli.common import check_writable, console, input_path, print_json, store_for
from greenctl.cli.options import DbOpt, JsonOpt, ModelFilterOpt, VariantFilterOpt
from greenctl.cli.profile import profile_app
from greenctl.data.errors import InputError
from greenctl.data.profile_io import (
    export_profiles,
    file_format,
    import_parsed,
    profile_rows,
    read_profiles,
)


def profile_import(
    file: Annotated[
        Path,
        typer.Argument(
            help="CSV or JSON file of profiles (see README: column contract).", parser=input_path
        ),
    ],
    fmt: Annotated[
        str, typer.Option("--format", help="csv, json or auto (by extension/content).")
    ] = "auto",
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Add the file's profiles to variants or families that hold another data set "
            "(another hardware label) on purpose.",
        ),
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Import profiles from CSV or JSON; a bad row fails the whole import and writes nothing.

    Rows the store holds already are not stored twice: importing a file again is a no-op.
    A file never adds another data set to an existing family silently (see --merge).
    """
    parsed = read_profiles(file, fmt=fmt)  # a bad file fails before any store is opened
    with store_for(db) as store:
        result = import_parsed(store, parsed, merge=merge)
    if json_out:
        print_json(result.__dict__)
        return
    already = (
        f"; {result.already_present} already in the store or repeated in the file"
        if result.already_present
        else ""
    )
    console.print(
        f"Imported {result.profiles} profile rows from {result.path} "
        f"({len(result.variants_created)} new variants"
        + (f", updated {', '.join(result.variants_updated)}" if result.variants_updated else "")
        + f"{already}).",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def profile_export(
    fmt: Annotated[
        str | None,
        typer.Option("--format", help="csv or json (default: json for -o FILE.json, else csv)."),
    ] = None,
    output: Annotated[
        str | None, typer.Option("-o", "--output", help="Write to FILE instead of stdout.")
    ] = None,
    model: ModelFilterOpt = None,
    variant: VariantFilterOpt = None,
    history: Annotated[
        bool, typer.Option("--all", help="Every measurement, not only the latest per point.")
    ] = False,
    db: DbOpt = None,
) -> None:
    """Export profiles as CSV or JSON (importable again with `profile import`)."""
    target = check_writable(output, option="-o")
    with store_for(db, create=False) as store:
        if model is not None:
            store.require_family(model)
        if variant is not None:
            store.get_variant(variant)
        text = export_profiles(
            profile_rows(store, family=model, variant=variant, history=history),
            fmt=fmt or file_format(target),
        )
    if target is None:
        sys.stdout.write(text)
    else:
        try:
            target.write_text(text)
        except OSError as exc:  # a fault the check before could not see (disk full)
            raise InputError(
                f"cannot write {target}: {exc.strerror or exc}",
                hint="give -o a file in an existing, writable folder",
            ) from None
        console.print(f"Wrote {target}", markup=False, highlight=False, soft_wrap=True)


def register(app: typer.Typer) -> None:
    profile_app.command("import")(profile_import)
    profile_app.command("export")(profile_export)
