"""``greenctl plan geo`` (equity-aware geographical load balancing) and ``greenctl geo``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from greenctl.cli.common import (
    DbOpt,
    JsonOpt,
    check_writable_folder,
    console,
    fmt,
    input_path,
    print_json,
    render_table,
    say,
    store_for,
    undone_on_failure,
)
from greenctl.cli.plan import check_writable, plan_app, save_plan
from greenctl.data.errors import InputError
from greenctl.executor.kinds import plan_problem
from rich.table import Table

if TYPE_CHECKING:
    from greenctl.planner.geo.solve import GeoRun

ALGORITHM_HELP = (
    "eglb-off (offline LP optimum), eglb (online dual mirror descent), eglb-mpc (receding "
    "horizon), glb-energy, glb-carbon, glb-water, glb-c2, glb-all, nearest, or all (every "
    "one, with a comparison table)."
)

geo_app = typer.Typer(no_args_is_help=True, help="Geographical load-balancing data helpers.")


def _path_opt(flag: str, help_text: str) -> Any:
    return typer.Option(flag, help=help_text, parser=input_path, metavar="FILE")


SitesOpt = Annotated[
    Path,
    _path_opt(
        "--sites",
        "CSV: time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw"
        "[,ewif_l_per_kwh,pue].",
    ),
]
DemandOpt = Annotated[Path, _path_opt("--demand", "CSV: time,gateway,load_mw.")]
RoutesOpt = Annotated[
    Path | None,
    _path_opt("--routes", "CSV: gateway,site[,latency_ms] allowed pairs (default: all)."),
]
EtaOpt = Annotated[
    float | None,
    typer.Option("--eta", help="eglb: dual learning rate (default 1/(mean z_max sqrt(2 S T))."),
]
ZMaxOpt = Annotated[
    float | None,
    typer.Option(
        "--z-max",
        help="eglb: cap of the auxiliary per-step weighted footprint, USD (default: each "
        "site's largest possible per-step footprint).",
    ),
]
WeightCarbonOpt = Annotated[
    float | None,
    typer.Option(
        "--weight-carbon",
        help="glb-c2/glb-all: USD per kg of total carbon (default mu-carbon / sites).",
    ),
]
WeightWaterOpt = Annotated[
    float | None,
    typer.Option(
        "--weight-water", help="glb-all: USD per litre of total water (default mu-water / sites)."
    ),
]
VariantsOpt = Annotated[
    Path | None,
    typer.Option(
        "--variants",
        help="Heterogeneous models: CSV variant,energy_j_per_request,accuracy[,site] "
        "(load_mw is the power of the most accurate variant).",
    ),
]
FamilyOpt = Annotated[
    str | None,
    typer.Option(
        "--family",
        help="Heterogeneous models from the store: this family's variants, their accuracy "
        "and lowest measured energy per request.",
    ),
]
MinAccuracyOpt = Annotated[
    float | None,
    typer.Option("--min-accuracy", help="Lowest load-weighted mean accuracy (0-1) with variants."),
]
AllocationsOpt = Annotated[
    str | None,
    typer.Option("--allocations", help="Write time,gateway,site,load_mw for non-zero flows."),
]
PlotOpt = Annotated[
    str | None,
    typer.Option("--plot", help="PNG chart of per-site carbon and water per algorithm."),
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Also write the plan document here.")
]


def plan_geo_cmd(
    sites: SitesOpt,
    demand: DemandOpt,
    routes: RoutesOpt = None,
    algorithm: Annotated[str, typer.Option("--algorithm", "-a", help=ALGORITHM_HELP)] = "eglb-off",
    mu_carbon: Annotated[
        float, typer.Option("--mu-carbon", help="USD per kg of the largest site's carbon.")
    ] = 1.5,
    mu_water: Annotated[
        float, typer.Option("--mu-water", help="USD per litre of the largest site's water.")
    ] = 0.06,
    eta: EtaOpt = None,
    z_max: ZMaxOpt = None,
    horizon: Annotated[int, typer.Option("--horizon", help="eglb-mpc: window in steps.")] = 24,
    forecast: Annotated[
        str, typer.Option("--forecast", help="eglb-mpc: oracle, persistence or seasonal.")
    ] = "oracle",
    weight_carbon: WeightCarbonOpt = None,
    weight_water: WeightWaterOpt = None,
    variants: VariantsOpt = None,
    family: FamilyOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    model: Annotated[str, typer.Option("--model", help="Model every site serves.")] = "default",
    variant: Annotated[
        str, typer.Option("--variant", help="Variant every site serves.")
    ] = "default",
    allocations: AllocationsOpt = None,
    plot: PlotOpt = None,
    output: OutputOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Split each gateway's load over sites: energy cost + the largest regional footprint.

    eGLB: min energy cost + mu_c x max-site carbon + mu_w x max-site water, over the horizon.

    The plan (kind geo) is saved in the store; all figures are modeled from the traces.
    """
    from greenctl.data.geo_io import write_allocations

    check_writable(output)
    allocations_to = check_writable(allocations, option="--allocations")
    plot_to = check_writable(plot, option="--plot")
    if variants is not None and family is not None:
        raise InputError(
            "give variants as a file (--variants) or from the store (--family), not both"
        )
    request = {  # the registry's geo entry plans it (and `replan` plans it again)
        "sites": str(sites),
        "demand": str(demand),
        "routes": None if routes is None else str(routes),
        "variants": None if variants is None else str(variants),
        "family": family,
        "min_accuracy": min_accuracy,
        "algorithm": algorithm,
        "mu_carbon_usd_per_kg": mu_carbon,
        "mu_water_usd_per_l": mu_water,
        "eta": eta,
        "z_max_usd": z_max,
        "horizon": horizon,
        "forecast": forecast,
        "weight_carbon_usd_per_kg": weight_carbon,
        "weight_water_usd_per_l": weight_water,
        "model": model,
        "variant": variant,
    }
    with store_for(db) as store:
        plan, run = plan_problem(store, "geo", request)
        if allocations_to is not None:
            write_allocations(allocations_to, run.allocation_rows())
        if plot_to is not None:
            _plot(run, plot_to)
        save_plan(store, plan, output)
    if json_out:
        print_json(run.plan.to_dict())
        return
    _render(run, allocations=allocations_to, plot=plot_to)


def _render(run: GeoRun, *, allocations: Path | None, plot: Path | None) -> None:
    plan = run.plan
    extra = plan.extra
    algs = extra.get("algorithms")
    if algs:
        _comparison(
            algs,
            "Algorithms: energy cost and carbon, per-site average and max (modeled)",
            ["objective", "USD avg", "CO2 t avg", "CO2 t max", "max/avg", "solve ms"],
            lambda b: [
                b["summary"]["objective"],
                b["summary"]["energy_cost_usd_avg"],
                b["summary"]["carbon_kg_avg"] / 1000,
                b["summary"]["carbon_kg_max"] / 1000,
                b["summary"]["carbon_max_over_avg"],
                round(b["solve_s"] * 1000, 1),
            ],
            caption="USD avg: energy cost per site; objective (USD) = energy cost + mu_c x "
            "max-site CO2 + mu_w x max-site water",
        )
        _comparison(
            algs,
            "Algorithms: water, per-site average and max (modeled)",
            ["water m3 avg", "water m3 max", "max/avg"],
            lambda b: [
                b["summary"]["water_l_avg"] / 1000,
                b["summary"]["water_l_max"] / 1000,
                b["summary"]["water_max_over_avg"],
            ],
        )
    render_table(
        f"Sites ({extra['algorithm']}; modeled)",
        ["site", "load MWh", "energy cost USD", "carbon kg", "water L"],
        [
            [s["site"], s["load_mwh"], s["energy_cost_usd"], s["carbon_kg"], s["water_l"]]
            for s in extra["sites"]
        ],
    )
    sm = extra["summary"]
    render_table(
        "Summary",
        ["metric", "value"],
        [[k, v] for k, v in sm.items()],
        caption=f"solved in {extra['solve_s']:.3f} s",
    )
    for note in extra.get("notes", []):
        say(f"note: {note}", highlight=False)
    say(f"plan {plan.id} saved (kind geo)", highlight=False)
    if allocations is not None:
        say(f"allocations written to {allocations}", highlight=False)
    if plot is not None:
        say(f"chart written to {plot}", highlight=False)


def _comparison(
    algs: dict[str, Any],
    title: str,
    columns: list[str],
    cells: Callable[[dict[str, Any]], list[Any]],
    *,
    caption: str | None = None,
) -> None:

    table = Table(title=title, caption=caption, header_style="bold")
    table.add_column("algorithm", no_wrap=True)
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    for name, block in algs.items():
        table.add_row(name, *(fmt(v) for v in cells(block)))
    console.print(table)


def _plot(run: GeoRun, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    extra = run.plan.extra
    blocks: dict[str, Any] = extra.get("algorithms") or {
        extra["algorithm"]: {"sites": extra["sites"], "summary": extra["summary"]}
    }
    names = list(blocks)
    sites = [s["site"] for s in next(iter(blocks.values()))["sites"]]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.9 * len(sites) + 3), 7), sharex=True)
    x = np.arange(len(sites))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        rows = blocks[name]["sites"]
        axes[0].bar(x + k * width, [r["carbon_kg"] for r in rows], width, label=name)
        axes[1].bar(x + k * width, [r["water_l"] for r in rows], width, label=name)
    axes[0].set_ylabel("carbon (kg)")
    axes[1].set_ylabel("water (L)")
    axes[0].set_title("Per-site carbon and water by algorithm (modeled)")
    axes[1].set_xticks(x + 0.4 - width / 2, sites, rotation=45, ha="right")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="center right", fontsize="small")
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    try:
        fig.savefig(path, dpi=100)
    except OSError as exc:
        raise InputError(f"cannot write chart {path}: {exc.strerror}") from None
    finally:
        plt.close(fig)


def convert_eglb_cmd(
    src_dir: Annotated[
        Path | None,
        typer.Argument(
            help="The eGLB authors' data/ folder (carbon/, price/, water/, AI_workload.csv); "
            "default: the copy bundled with greenctl (bundled:eglb).",
            parser=input_path,
        ),
    ] = None,
    out_dir: Annotated[
        str, typer.Option("--output", "-o", help="Folder for the CSVs.")
    ] = "eglb-csv",
    routes: Annotated[
        str, typer.Option("--routes", help="all (no routes file) or partial (the authors' mask).")
    ] = "all",
    steps: Annotated[
        int | None, typer.Option("--steps", help="Keep the first N hours (default: all 457).")
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Convert the eGLB reference layout into sites.csv, demand.csv (and routes.csv).

    The workload is normalised as the authors do (W / 2708 per gateway, ten gateways named
    like the sites, capacity 1 per site), read as MW.
    """
    from greenctl.data.eglb_convert import convert_eglb

    folder = check_writable_folder(out_dir, option="-o")
    with undone_on_failure(folder):
        paths = convert_eglb(src_dir, folder, steps=steps, routes=routes)
    if json_out:
        print_json({k: str(v) for k, v in paths.items()})
        return
    for key, path in paths.items():
        say(f"{key}: {path}", highlight=False)


def register(app: typer.Typer) -> None:
    plan_app.command("geo")(plan_geo_cmd)
    geo_app.command("convert-eglb")(convert_eglb_cmd)
    app.add_typer(geo_app, name="geo")
