"""``greenctl report``: CSV/JSON exports, savings against a baseline, PNG charts."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    check_writable,
    check_writable_folder,
    print_json,
    render_table,
    say,
    store_for,
    undone_on_failure,
)
from greenctl.cli.options import (
    DbOpt,
    FromOpt,
    JsonOpt,
    RegionFilterOpt,
    RequiredRegionOpt,
    ToOpt,
)
from greenctl.data import emissions, reports
from greenctl.data.errors import InputError, NotFoundError

report_app = typer.Typer(
    no_args_is_help=True,
    help="Export profiles, plans, runs, decisions and carbon signals (CSV/JSON, stable "
    "columns), emissions as CodeCarbon's emissions.csv, savings against a baseline plan, and "
    "PNG charts.",
)

FormatOpt = Annotated[str, typer.Option("--format", help="csv or json.")]
OutOpt = Annotated[
    str | None, typer.Option("--output", "-o", help="Write to this file (default: stdout).")
]

_HELP = {
    "profiles": "Export every stored profile (one row per measurement).",
    "plans": "Export saved plans with their predicted figures.",
    "runs": "Export measured runs beside their predictions (predicted vs measured).",
    "decisions": "Export replanning decision records.",
    "carbon": "Export stored carbon-intensity signals.",
}


def _export_command(what: str) -> Any:
    def command(
        fmt: FormatOpt = "csv",
        output: OutOpt = None,
        region: RegionFilterOpt = None,
        start: FromOpt = None,
        end: ToOpt = None,
        plan: Annotated[
            int | None,
            typer.Option("--plan", help="Only this plan (plans, runs; decisions: its replans)."),
        ] = None,
        db: DbOpt = None,
    ) -> None:

        filters: dict[str, Any] = {}
        given = {"--region": region, "--from": start, "--to": end, "--plan": plan}
        takes = {"carbon": ("--region", "--from", "--to"), "plans": ("--plan",),
                 "runs": ("--plan",), "decisions": ("--region", "--from", "--to", "--plan")}  # fmt: skip
        stray = [k for k, v in given.items() if v is not None and k not in takes.get(what, ())]
        if stray:  # a filter the report cannot apply would silently export everything
            raise InputError(
                f"report {what} has no {stray[0]} filter",
                hint=f"report {what} takes {', '.join(takes.get(what, ())) or 'no filter'}",
            )
        if what in ("carbon", "decisions"):
            filters.update(region=region, start=start, end=end)
        if what in ("plans", "runs", "decisions"):
            filters["plan_id"] = plan
        check_writable(output, option="-o")
        with store_for(db, create=False) as store:
            if plan is not None:
                store.get_plan(plan)  # an unknown id is an error, not an empty report
            res = reports.export(store, what, fmt=fmt, path=output, **filters)
        if output:
            say(f"Wrote {res['rows']} {what} rows ({fmt}) to {output}", highlight=False)
        else:
            sys.stdout.write(res["text"])

    command.__doc__ = _HELP[what]
    command.__name__ = f"report_{what}"
    return command


for _what in _HELP:
    report_app.command(_what)(_export_command(_what))


@report_app.command("emissions")
def report_emissions(
    fmt: Annotated[
        str, typer.Option("--format", help="codecarbon: CodeCarbon's emissions.csv columns.")
    ] = "codecarbon",
    output: OutOpt = None,
    plan: Annotated[
        int | None, typer.Option("--plan", help="Only this plan's verified runs and replans.")
    ] = None,
    db: DbOpt = None,
) -> None:
    """Emissions of verified runs and replan intervals as CodeCarbon's emissions.csv
    (kg CO2eq, kWh, W, s, L); tracking_mode 'modeled' marks estimated energy."""
    check_writable(output, option="-o")
    with store_for(db, create=False) as store:
        if plan is not None:
            store.get_plan(plan)  # an unknown id is an error, not an empty report
        res = emissions.emissions(store, fmt=fmt, path=output, plan_id=plan)
    note = (
        f"{res['measured_rows']} measured, {res['modeled_rows']} modeled "
        "(tracking_mode 'modeled': energy estimated from the plans, not measured)"
    )
    if res["no_intensity_rows"]:
        note += f"; {res['no_intensity_rows']} without a grid intensity (emissions empty)"
    if output:
        say(f"Wrote {res['rows']} emissions rows ({fmt}) to {output}: {note}", highlight=False)
    else:
        sys.stdout.write(res["text"])
        say(note, err=True, highlight=False)


@report_app.command("savings")
def report_savings(
    plan: Annotated[
        int,
        typer.Option(
            "--plan", help="greenctl's plan (with the plans replanning applied after it)."
        ),
    ],
    baseline: Annotated[int, typer.Option("--baseline", help="The baseline plan id (BASE).")],
    region: RequiredRegionOpt,
    start: FromOpt = None,
    end: ToOpt = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Load both serve, req/s (default: the plans' rate)."),
    ] = None,
    wue: Annotated[
        float | None,
        typer.Option("--wue", help="Water per kWh (L/kWh) where plans predict no water."),
    ] = None,
    output: OutOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Energy, carbon, water, cost, accuracy and SLO compliance against a baseline plan."""
    target = check_writable(output, option="-o")
    with store_for(db, create=False) as store:
        s = reports.savings(
            store,
            plan_id=plan,
            baseline_id=baseline,
            region=region,
            start=start,
            end=end,
            rate_rps=rate,
            wue_l_per_kwh=wue,
        )
    if target is not None:
        target.write_text(json.dumps(s, indent=2) + "\n")
    if json_out:
        print_json(s)
        return
    render_table(
        f"Savings of plan {plan} (+{s['changes']} replans) vs baseline {baseline}, {region}, "
        f"{s['period']['from']} .. {s['period']['to']} ({s['period']['hours']:.0f} h)",
        ["metric", "greenctl", "baseline", "saved", "saved %"],
        reports.savings_table(s),
        caption="modeled from the plans' predictions and the carbon signal; '-' = not "
        "predicted by the plans",
    )


@report_app.command("charts")
def report_charts(
    plan: Annotated[int, typer.Option("--plan", help="greenctl's plan (and its replans).")],
    region: RequiredRegionOpt,
    baseline: Annotated[
        int | None, typer.Option("--baseline", help="Baseline plan to draw beside it.")
    ] = None,
    geo_plan: Annotated[
        int | None, typer.Option("--geo-plan", help="A geo plan for the per-site chart.")
    ] = None,
    out: Annotated[
        str, typer.Option("--out", help="Folder for the PNG files.")
    ] = "greenctl-report",
    start: FromOpt = None,
    end: ToOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write PNG charts: carbon.png, latency.png (if runs were measured), sites.png (geo)."""
    folder = check_writable_folder(out, option="--out")
    written: list[dict[str, Any]] = []
    skipped = []
    with undone_on_failure(folder), store_for(db, create=False) as store:
        for plan_id in (plan, baseline, geo_plan):  # unknown ids: refused before any chart
            if plan_id is not None:
                store.get_plan(plan_id)
        folder.mkdir(exist_ok=True)
        written.append(
            reports.chart_carbon(
                store,
                folder / "carbon.png",
                plan_id=plan,
                region=region,
                baseline_id=baseline,
                start=start,
                end=end,
            )
        )
        try:
            written.append(reports.chart_latency(store, folder / "latency.png"))
        except NotFoundError as exc:
            skipped.append({"chart": "latency", "reason": exc.message})
        if geo_plan is not None:
            written.append(reports.chart_sites(store, folder / "sites.png", plan_id=geo_plan))
    if json_out:
        print_json({"written": written, "skipped": skipped})
        return
    for w in written:
        say(f"wrote {w['path']}", highlight=False)
    for s in skipped:
        say((f"skipped {s['chart']}", "yellow"), f": {s['reason']}")


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")
