"""``greenctl gpulet import DIR``: load the gpulet reference measurements into the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt, input_path, print_json, render_table, say, store_for
from greenctl.data.gpulet_import import import_gpulet

gpulet_app = typer.Typer(
    no_args_is_help=True, help="gpulet reference data: import MPS profiles, utilisations, pairs."
)


@gpulet_app.command("import")
def gpulet_import_cmd(
    directory: Annotated[
        Path,
        typer.Argument(
            help="Folder with inference.csv, mem_util.csv and interference.csv, or "
            "bundled:gpulet (gpulet's published measurements).",
            parser=input_path,
        ),
    ],
    hardware: Annotated[
        str, typer.Option("--hardware", help="Hardware label stored on the imported profiles.")
    ] = "gpulet-reference",
    prefix: Annotated[
        str | None,
        typer.Option(
            "--prefix",
            help="Import every model as PREFIX-MODEL (resnet50 -> gpulet-resnet50 of family "
            "gpulet-resnet), to keep them apart from another data set's variants.",
        ),
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Add the profiles to variants/families that hold another data set's on "
            "purpose (refused otherwise).",
        ),
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Import profiles on mps:20..100, L2/DRAM utilisations and co-location measurements."""
    with store_for(db) as store:
        summary = import_gpulet(store, directory, hardware=hardware, prefix=prefix, merge=merge)
    for line in summary.merged:
        say(f"note: merged on purpose (--merge): {line}", err=True, highlight=False)
    if json_out:
        print_json(summary.to_dict())
        return
    render_table(
        f"Imported {directory}",
        ["new variants", "profiles", "utilisations", "co-locations", "skipped (invalid)"],
        [
            [
                summary.variants,
                summary.profiles,
                summary.utilisations,
                summary.colocations,
                summary.skipped_invalid,
            ]
        ],
        caption="source: 0909wlgur/Gpulet (imported measurements); latency seconds -> ms",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(gpulet_app, name="gpulet")
