"""``greenctl carbon``: import, show and query grid carbon-intensity signals."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from greenctl.cli.common import input_path, print_json, render_table, say, store_for
from greenctl.cli.options import DbOpt, FromOpt, JsonOpt, RequiredRegionOpt, ToOpt
from greenctl.data import carbon, carbon_io

carbon_app = typer.Typer(
    no_args_is_help=True,
    help="Grid carbon-intensity signals: import files (CSV, Carbon Aware SDK, WattTime, "
    "Electricity Maps, Clover, eGLB), show, now, live fetch.",
)

KindOpt = Annotated[
    str | None, typer.Option("--kind", help="Signal kind: average or marginal (default: all).")
]


@carbon_app.command("import")
def carbon_import(
    file: Annotated[
        Path,
        typer.Argument(
            help="Carbon file to import, or bundled:NAME for a bundled trace "
            "(bundled:clover-ciso-march, bundled:eglb-texas, ...).",
            parser=input_path,
        ),
    ],
    region: Annotated[
        str | None,
        typer.Option(
            "--region",
            "-r",
            help="Region to store the values under (required when the file "
            "names none; selects one region of a multi-region CSV).",
        ),
    ] = None,
    fmt: Annotated[
        str,
        typer.Option(
            "--format",
            help="auto | csv | carbon-aware-sdk | watttime | electricitymaps | "
            "electricitymaps-csv | clover | eglb",
        ),
    ] = "auto",
    kind: Annotated[
        str | None,
        typer.Option(
            "--kind", help="average or marginal (default: marginal for WattTime, else average)."
        ),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--start",
            help="Time of the first value of a Clover trace (no timestamps in the file); "
            "default 2021-03-01T00:00:00Z.",
        ),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Import a carbon-intensity file into the store (all rows or none)."""
    with store_for(db) as store:
        summary = carbon_io.import_carbon(
            store, file, region=region, fmt=fmt, kind=kind, start=start
        )
    if json_out:
        print_json(summary)
        return
    say(
        f"Imported {summary['rows']} {'/'.join(summary['kind'])} values ({summary['format']}) "
        f"for {', '.join(summary['regions'])}, {summary['first']} .. {summary['last']}"
    )


@carbon_app.command("show")
def carbon_show(
    region: RequiredRegionOpt,
    at: Annotated[
        str | None, typer.Option("--at", help="Only the value in force at this time (ISO).")
    ] = None,
    start: FromOpt = None,
    end: ToOpt = None,
    kind: KindOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a region's carbon intensity series (or the value at --at)."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        if at:
            rows = [carbon.value_at(store, region, at, kind=kind)]
        else:
            rows = carbon.series(store, region, start=start, end=end, kind=kind)
    if json_out:
        print_json(rows)
        return
    render_table(
        f"Carbon intensity, {region}",
        ["time", "gCO2/kWh", "kind", "source"],
        [[r["time"], r["carbon_g_per_kwh"], r["kind"], r["source"]] for r in rows],
    )


@carbon_app.command("now")
def carbon_now(
    region: RequiredRegionOpt,
    kind: KindOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The carbon intensity in force now (newest stored value when the trace is older)."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        row = carbon.now(store, region, kind=kind)
    if json_out:
        print_json(row)
        return
    say(
        f"{region}: {row['carbon_g_per_kwh']:.1f} gCO2/kWh ({row['kind']}) at {row['time']}",
        (" (stale: newest stored value, not current)", "yellow") if row.get("stale") else "",
    )


@carbon_app.command("regions")
def carbon_regions(db: DbOpt = None, json_out: JsonOpt = False) -> None:
    """List regions with stored signals."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        rows = carbon.regions(store)
    if json_out:
        print_json(rows)
        return
    render_table(
        "Carbon signals",
        ["region", "kind", "rows", "first", "last"],
        [[r["region"], r["kind"], r["rows"], r["first"], r["last"]] for r in rows],
    )


@carbon_app.command("fetch")
def carbon_fetch(
    region: RequiredRegionOpt,
    provider: Annotated[
        str,
        typer.Option(
            "--provider",
            help="electricitymaps (ELECTRICITYMAPS_TOKEN) or watttime (WATTTIME_TOKEN).",
        ),
    ],
    what: Annotated[str, typer.Option("--what", help="latest | history | forecast")] = "history",
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Fetch a live signal (off unless the provider's token is set in the environment)."""
    with store_for(db) as store:
        summary = carbon_io.fetch_live(store, provider, region, what=what)
    if json_out:
        print_json(summary)
        return
    say(f"Fetched {summary['rows']} values from {provider} for {region}")


def register(app: typer.Typer) -> None:
    app.add_typer(carbon_app, name="carbon")
