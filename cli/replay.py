"""``greenctl replay``: the control loop over a load trace and a carbon signal, what-if."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    DbOpt,
    JsonOpt,
    console,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
)
from greenctl.cli.plan_mig import mig_request
from greenctl.cli.plan_mix import (
    AlphaOpt,
    BetaOpt,
    BudgetOpt,
    GammaOpt,
    HeadroomOpt,
    MinAccuracyOpt,
    ObjectiveOpt,
    PercentileOpt,
    SloMsOpt,
    StrategyOpt,
    mix_request,
)
from greenctl.data.errors import InputError
from greenctl.data.loop_state import REPLAN_MARGIN, REPLAN_MIN_DWELL, REPLAN_THRESHOLD
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# -- the options (declared once) --------------------------------------------------------------
LoadTraceOpt = Annotated[
    str | None,
    typer.Option(
        "--load-trace",
        help="Requests per second, one value per second (gzip or not), or bundled:NAME; "
        "mix, mig, glet (geo reads --demand).",
        parser=input_path_str,
        metavar="FILE",
    ),
]

KindOpt = Annotated[
    str, typer.Option("--kind", help="Plan kind to replay: mix | mig | glet | geo.")
]

PlanOpt = Annotated[str | None, typer.Option("--plan", help="Start from this stored plan (id).")]

ModelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model",
        help="mix, mig: the model family; glet: NAME:RATE:SLO_MS, repeatable (RATE: the "
        "model's share of --load-trace, as plan glet's rate).",
    ),
]

RateOpt = Annotated[
    float | None,
    typer.Option("--rate", help="Rate of the first plan (default: the first forecast)."),
]

SpecOpt = Annotated[
    str | None,
    typer.Option(
        "--spec",
        help="TOML/JSON spec, as plan mix (or plan glet for --kind glet).",
        parser=input_path_str,
        metavar="FILE",
    ),
]

ModelTraceOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--model-trace",
        help="glet: NAME=FILE, a model's own requests per second (repeatable; the others "
        "share --load-trace).",
    ),
]

PartitionsOpt = Annotated[
    str | None,
    typer.Option("--partitions", help="glet: partition sizes, as plan glet (20,40,...,100)."),
]

MaxGpusOpt = Annotated[
    int | None, typer.Option("--max-gpus", help="glet: GPUs available (default 8).")
]

RatePercentileOpt = Annotated[
    float | None,
    typer.Option("--rate-percentile", help="glet: as plan glet (default 99)."),
]

AlgorithmOpt = Annotated[
    str | None,
    typer.Option(
        "--algorithm",
        help="glet: glet (default) | sbp | greedy | ideal; geo: eglb (default) | eglb-mpc "
        "(an offline algorithm replays eglb).",
    ),
]

NoInterferenceOpt = Annotated[
    bool, typer.Option("--no-interference", help="glet: plan without interference.")
]

InterferenceModelOpt = Annotated[
    int | None,
    typer.Option("--interference-model", help="glet: stored interference model id."),
]

HardwareOpt = Annotated[
    str | None, typer.Option("--hardware", help="glet: only profiles of this hardware.")
]

GpuPowerWOpt = Annotated[
    str | None,
    typer.Option(
        "--gpu-power-w",
        help="glet: IDLE:BUSY watts of one GPU when the profiles hold no power (assumed 50:250).",
    ),
]

SitesOpt = Annotated[
    str | None,
    typer.Option(
        "--sites", help="geo: sites CSV, as plan geo.", parser=input_path_str, metavar="FILE"
    ),
]

DemandOpt = Annotated[
    str | None,
    typer.Option(
        "--demand", help="geo: demand CSV, as plan geo.", parser=input_path_str, metavar="FILE"
    ),
]

RoutesOpt = Annotated[
    str | None,
    typer.Option(
        "--routes", help="geo: routes CSV, as plan geo.", parser=input_path_str, metavar="FILE"
    ),
]

MuCarbonOpt = Annotated[
    float, typer.Option("--mu-carbon", help="geo: USD per kg of the largest site's carbon.")
]

MuWaterOpt = Annotated[
    float, typer.Option("--mu-water", help="geo: USD per litre of the largest site's water.")
]

GpuOpt = Annotated[str | None, typer.Option("--gpu", help="mig: GPU model (A100-40GB).")]

GpusOpt = Annotated[int | None, typer.Option("--gpus", help="mig: number of GPUs.")]

SlaMsOpt = Annotated[
    float | None,
    typer.Option("--sla-ms", help="mig: p95 SLA in ms (default: the first plan's)."),
]

LamOpt = Annotated[float, typer.Option("--lambda", help="mig: weight of dCarbon vs dAccuracy.")]

BaseCarbonIntensityOpt = Annotated[
    float | None,
    typer.Option(
        "--base-carbon-intensity",
        help="mig: carbon intensity BASE is measured at in the objective, gCO2/kWh "
        "(default: each interval's own, under which the objective ignores the signal).",
    ),
]

CarbonIntensityOpt = Annotated[
    float | None,
    typer.Option(
        "--carbon-intensity",
        help="Constant gCO2/kWh when no --region or --carbon-trace (default 400).",
    ),
]

RegionOpt = Annotated[
    str | None, typer.Option("--region", "-r", help="Stored carbon signal region.")
]

CarbonTraceOpt = Annotated[
    str | None,
    typer.Option(
        "--carbon-trace",
        help="Carbon signal file (any format carbon import reads), or bundled:NAME.",
        parser=input_path_str,
        metavar="FILE",
    ),
]

StartOpt = Annotated[
    str | None,
    typer.Option("--from", help="Offset into the traces (36h, 90m) or an ISO time."),
]

HoursOpt = Annotated[
    float | None, typer.Option("--hours", help="Hours to replay (default: the rest).")
]

EveryOpt = Annotated[str, typer.Option("--every", help="Replan interval (60s, 5m).")]

ThresholdOpt = Annotated[
    float, typer.Option("--threshold", help="As replan: carbon signal move that acts.")
]

MarginOpt = Annotated[float, typer.Option("--margin", help="As replan: objective gain that acts.")]

MinDwellOpt = Annotated[
    str,
    typer.Option(
        "--min-dwell",
        help="As replan: no change sooner than this, unless the running plan cannot "
        "carry the forecast load.",
    ),
]

ForecasterOpt = Annotated[
    str | None,
    typer.Option(
        "--forecaster",
        "-f",
        help="last | moving-max | seasonal-naive | a saved name (default: greenctl's "
        "default forecaster, named in the result).",
    ),
]

BaselineOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--baseline",
        help="base | co2opt | vpa | infaas | infadapter | none; repeatable (default base, "
        "co2opt, vpa); "
        "glet: base; geo: offline | nearest | glb-energy (default offline, nearest).",
    ),
]

VpaVariantOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--vpa-variant",
        help="VPA's one variant (default: the first plan's main); repeat for one VPA each.",
    ),
]

WueOpt = Annotated[
    float | None, typer.Option("--wue", help="Direct water L/kWh (else water not modeled).")
]

EwifOpt = Annotated[
    float | None, typer.Option("--ewif", help="Indirect water L/kWh of electricity.")
]

OutputOpt = Annotated[
    str | None,
    typer.Option("-o", "--output", help="Folder for replay.json, CSVs and replay.png."),
]


def replay_cmd(
    load_trace: LoadTraceOpt = None,
    kind: KindOpt = "mix",
    plan: PlanOpt = None,
    model: ModelOpt = None,
    rate: RateOpt = None,
    slo_ms: SloMsOpt = None,
    percentile: PercentileOpt = None,
    budget: BudgetOpt = None,
    objective: ObjectiveOpt = None,
    min_accuracy: MinAccuracyOpt = None,
    alpha: AlphaOpt = None,
    beta: BetaOpt = None,
    gamma: GammaOpt = None,
    headroom: HeadroomOpt = None,
    strategy: StrategyOpt = None,
    spec: SpecOpt = None,
    model_trace: ModelTraceOpt = None,
    partitions: PartitionsOpt = None,
    max_gpus: MaxGpusOpt = None,
    rate_percentile: RatePercentileOpt = None,
    algorithm: AlgorithmOpt = None,
    no_interference: NoInterferenceOpt = False,
    interference_model: InterferenceModelOpt = None,
    hardware: HardwareOpt = None,
    gpu_power_w: GpuPowerWOpt = None,
    sites: SitesOpt = None,
    demand: DemandOpt = None,
    routes: RoutesOpt = None,
    mu_carbon: MuCarbonOpt = 1.5,
    mu_water: MuWaterOpt = 0.06,
    gpu: GpuOpt = None,
    gpus: GpusOpt = None,
    sla_ms: SlaMsOpt = None,
    lam: LamOpt = 0.5,
    base_carbon_intensity: BaseCarbonIntensityOpt = None,
    carbon_intensity: CarbonIntensityOpt = None,
    region: RegionOpt = None,
    carbon_trace: CarbonTraceOpt = None,
    start: StartOpt = None,
    hours: HoursOpt = None,
    every: EveryOpt = "60s",
    threshold: ThresholdOpt = REPLAN_THRESHOLD,
    margin: MarginOpt = REPLAN_MARGIN,
    min_dwell: MinDwellOpt = REPLAN_MIN_DWELL,
    forecaster: ForecasterOpt = None,
    baseline: BaselineOpt = None,
    vpa_variant: VpaVariantOpt = None,
    wue: WueOpt = None,
    ewif: EwifOpt = None,
    output: OutputOpt = None,
    json_out: JsonOpt = False,
    db: DbOpt = None,
) -> None:
    """Replay the replan loop over a load trace and a carbon signal, beside baselines."""
    from greenctl.executor.control import replan  # the library (and numpy) when it runs

    _check_inputs(
        kind, plan, geo=[("--sites", sites), ("--demand", demand), ("--routes", routes)],
        glet=[
            ("--model-trace", model_trace), ("--partitions", partitions),
            ("--max-gpus", max_gpus), ("--rate-percentile", rate_percentile),
            ("--no-interference", no_interference), ("--interference-model", interference_model),
            ("--hardware", hardware), ("--gpu-power-w", gpu_power_w),
        ],
        inputs=[model, spec, sites, demand],
    )  # fmt: skip
    request: dict[str, Any] | None = None
    if plan is None and kind == "mig":
        request = _mig_request(
            model, gpu=gpu, gpus=gpus, rate=rate, carbon_intensity=carbon_intensity,
            sla_ms=sla_ms, lam=lam, base_carbon_intensity=base_carbon_intensity,
        )  # fmt: skip
    elif plan is None and kind == "glet":
        request = _glet_request(
            model=model, spec=spec, partitions=partitions, max_gpus=max_gpus,
            rate_percentile=rate_percentile, algorithm=algorithm, no_interference=no_interference,
            interference_model=interference_model, hardware=hardware,
        )  # fmt: skip
    elif plan is None and kind == "geo":
        request = _geo_request(sites, demand, routes, algorithm, mu_carbon, mu_water)
    elif plan is None:
        if kind != "mix":
            raise InputError(
                f"--kind {kind}: replay takes mix, mig, glet or geo", hint="--kind mix|mig|glet|geo"
            )
        request = mix_request(
            model=None if model is None else _one_model(model), rate=rate, slo_ms=slo_ms,
            percentile=percentile, budget=budget, objective=objective, min_accuracy=min_accuracy,
            alpha=alpha, beta=beta, gamma=gamma, carbon_intensity=carbon_intensity,
            headroom=headroom, strategy=strategy, spec=spec,
        )  # fmt: skip
    options: dict[str, Any] = {"vpa_variant": vpa_variant}
    if model_trace:
        options["model_traces"] = _name_files(model_trace)
    if gpu_power_w is not None:
        options["gpu_power_w"] = _idle_busy(gpu_power_w)
    if kind == "glet" and plan is None and carbon_intensity is not None:
        options["carbon_intensity"] = carbon_intensity
    result = _run(
        db, json_out, kind=kind, request=request, plan=plan, load_trace=load_trace,
        region=region, carbon_trace=carbon_trace, start=start, hours=hours, every=every,
        threshold=threshold, margin=margin, min_dwell_s=replan.parse_duration(min_dwell),
        forecaster=forecaster,
        baselines=None if not baseline else [b for b in baseline if b != "none"],
        wue_l_per_kwh=wue, ewif_l_per_kwh=ewif, out_dir=output, kind_options=options,
    )  # fmt: skip
    if json_out:
        print_json(result)
        return
    _render(result)


def _check_inputs(
    kind: str,
    plan: str | None,
    *,
    geo: list[tuple[str, Any]],
    glet: list[tuple[str, Any]],
    inputs: list[Any],
) -> None:
    """Refuse another kind's inputs (``geo``, ``glet``: (option, value)), and a kind's
    ``inputs`` beside ``--plan``."""
    geo_given = [o for o, v in geo if v]
    if geo_given and (plan is not None or kind != "geo"):
        raise InputError(f"{geo_given[0]} is an input of --kind geo", hint="--kind geo --sites ...")
    glet_given = [o for o, v in glet if v]
    if glet_given and plan is None and kind != "glet":
        raise InputError(f"{glet_given[0]} is an option of --kind glet", hint="--kind glet ...")
    if plan is not None and any(inputs):
        raise InputError("--plan cannot be combined with the kind's inputs", hint="give one")


def _run(db: str | None, quiet: bool, **options: Any) -> dict[str, Any]:
    """The replay (:func:`greenctl.executor.control.replay.replay`), with a progress bar."""
    from greenctl.executor.control import replay  # the library (and numpy) when it runs

    bar = Progress(
        TextColumn("replanning", style="progress.description"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
        transient=True,
    )
    task = bar.add_task("replay", total=1.0)
    with store_for(db) as store, bar:
        return replay.replay(
            store, progress=lambda k, n: bar.update(task, completed=k / n), **options
        )


def _mig_request(model: list[str] | None, **options: Any) -> dict[str, Any]:
    """A mig request from ``plan mig``'s options."""
    if options["gpu"] is None or options["gpus"] is None or model is None:
        raise InputError("--kind mig needs --gpu, --gpus and --model", hint="as plan mig")
    return mig_request(model=_one_model(model), **options)


def _geo_request(
    sites: str | None,
    demand: str | None,
    routes: str | None,
    algorithm: str | None,
    mu_carbon: float,
    mu_water: float,
) -> dict[str, Any]:
    """A geo request from ``plan geo``'s options."""
    if sites is None or demand is None:
        raise InputError("--kind geo needs --sites and --demand", hint="as plan geo")
    return {
        "sites": sites, "demand": demand, "routes": routes,
        "algorithm": algorithm or "eglb",
        "mu_carbon_usd_per_kg": mu_carbon, "mu_water_usd_per_l": mu_water,
    }  # fmt: skip


def _one_model(model: list[str]) -> str:
    if len(model) != 1:
        raise InputError(
            f"--model is given {len(model)} times: a mix or mig replay takes one family",
            hint="--model NAME:RATE:SLO_MS repeats for --kind glet",
        )
    return model[0]


def _glet_request(
    *,
    model: list[str] | None,
    spec: str | None,
    partitions: str | None,
    max_gpus: int | None,
    rate_percentile: float | None,
    algorithm: str | None,
    no_interference: bool,
    interference_model: int | None,
    hardware: str | None,
) -> dict[str, Any]:
    """A glet request from ``plan glet``'s options (flags win over the spec file)."""
    from pathlib import Path

    from greenctl.data.glet_spec import GletSpec, load_glet_spec, parse_model_arg, parse_partitions
    from greenctl.planner.glet.solve import ALGORITHMS

    doc = load_glet_spec(Path(spec), algorithms=ALGORITHMS) if spec is not None else GletSpec()
    models = list(doc.models) + [parse_model_arg(m) for m in model or []]
    if not models:
        raise InputError(
            "--kind glet needs its models",
            hint="pass --model NAME:RATE:SLO_MS (repeatable) or --spec FILE, as plan glet",
        )
    return {
        "spec": spec,
        "hardware": hardware,
        "models": models,
        "partitions": parse_partitions(partitions.split(",")) if partitions else doc.partitions,
        "max_gpus": max_gpus or doc.max_gpus,
        "rate_percentile": rate_percentile if rate_percentile is not None else doc.rate_percentile,
        "algorithm": algorithm or doc.algorithm or "glet",
        "interference": None
        if no_interference
        else interference_model
        if interference_model is not None
        else "newest",
    }


def _name_files(values: list[str]) -> dict[str, str]:
    """``NAME=FILE`` arguments of --model-trace."""
    out: dict[str, str] = {}
    for text in values:
        name, sep, path = text.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise InputError(
                f"--model-trace '{text}' is not NAME=FILE",
                hint="for example --model-trace resnet50=resnet50_rps.txt",
            )
        if name.strip() in out:
            raise InputError(f"--model-trace names {name.strip()} twice")
        out[name.strip()] = path.strip()
    return out


def _idle_busy(text: str) -> tuple[float, float]:
    parts = text.split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        return float(parts[0]), float(parts[1])
    except ValueError:
        raise InputError(
            f"--gpu-power-w '{text}' is not IDLE:BUSY", hint="watts of one GPU, e.g. 50:250"
        ) from None


def _render(result: dict[str, Any]) -> None:
    meta = result["meta"]
    if meta["kind"] == "glet":
        _render_glet(result)
    elif meta["kind"] == "geo":
        _render_geo(result)
    else:
        _render_mix(result)
    for note in meta["notes"]:
        say(f"note: {note}", highlight=False)
    for path in meta.get("files", []):
        say(f"wrote {path}", highlight=False)


def _render_glet(result: dict[str, Any]) -> None:
    meta = result["meta"]
    names = [m["name"] for m in meta["models"]]
    render_table(
        f"Replay of {meta['family']} (modeled): {meta['hours']:.2f} h from {meta['start']}, "
        f"{meta['intervals']} intervals of {meta['every_s']} s",
        ["policy", "SLO viol. %", "GPU-h", "mean GPUs", "max GPUs", "kWh", "gCO2", "water L",
         "changes"],
        [
            [s["policy"], s["violation_pct"], s["gpu_hours"], s["mean_units"], s["max_units"],
             s["energy_kwh"], s["carbon_g"], s["water_l"], s["changes"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; carbon: {meta['carbon']}; forecast: {meta['forecast']}",
    )  # fmt: skip
    render_table(
        "SLO violations per model, % of its requests (modeled)",
        ["policy", *names],
        [
            [s["policy"], *[s["per_model"][n]["violation_pct"] for n in names]]
            for s in result["summary"]
        ],
        caption="SLOs: "
        + ", ".join(f"{n} {meta['slos_ms'][n]:g} ms" for n in names if meta["slos_ms"].get(n)),
    )
    r = meta["replan"]
    say(
        f"replan: {r['solves']} solves, {r['cached']} repeated rounds answered from the "
        f"replay's memo, {r['dwell_holds']} held by --min-dwell, "
        f"{r.get('dwell_yields', 0)} changed within it (the running plan could not carry the "
        f"forecast); {meta['wall_s']:.1f} s",
        highlight=False,
    )


def _render_geo(result: dict[str, Any]) -> None:
    meta = result["meta"]
    render_table(
        f"Replay of {meta['family']} (modeled): {meta['hours']:g} h from {meta['start']}, "
        f"{meta['algorithm']} online step every {meta['every_s'] / 3600:g} h",
        ["policy", "MWh", "unserved MWh", "USD", "t CO2", "water m3", "objective USD",
         "changes"],
        [
            [s["policy"], s["load_mwh"], s["unserved_mwh"], s["cost_usd"], s["carbon_g"] / 1e6,
             s["water_l"] / 1000, s["objective_usd"], s["changes"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; objective = energy cost + {meta['mu_carbon_usd_per_kg']:g} "
        f"USD/kg x max-site CO2 + {meta['mu_water_usd_per_l']:g} USD/L x max-site water; "
        "changes: slots whose routing moved",
    )  # fmt: skip
    render_table(
        "Equity: the largest site's footprint, and over the per-site average (modeled)",
        ["policy", "max-site t CO2", "CO2 max/avg", "max-site water m3", "water max/avg"],
        [
            [s["policy"], s["carbon_kg_max_site"] / 1000, s["carbon_max_over_avg"],
             s["water_l_max_site"] / 1000, s["water_max_over_avg"]]
            for s in result["summary"]
        ],
    )  # fmt: skip
    r = meta["replan"]
    say(
        f"replan: {r['replans']} online rounds ({r['online_steps']} steps) in "
        f"{r['decide_s']:.2f} s; {meta['wall_s']:.1f} s",
        highlight=False,
    )


def _render_mix(result: dict[str, Any]) -> None:
    meta = result["meta"]
    label = f", {str(meta['label']).upper()}" if meta.get("label") else ""
    render_table(
        f"Replay of {meta['family']} (modeled{label}): {meta['hours']:.2f} h from {meta['start']}, "
        f"{meta['intervals']} intervals of {meta['every_s']} s",
        ["policy", "SLO viol. %", "accuracy", "kWh", "gCO2", "water L", "USD", "changes",
         "units"],
        [
            [s["policy"], s["violation_pct"], s["accuracy"], s["energy_kwh"], s["carbon_g"],
             s["water_l"], s["cost_usd"], s["changes"], s["mean_units"]]
            for s in result["summary"]
        ],
        caption=f"{meta['modeled']}; carbon: {meta['carbon']}; SLO {meta['slo_ms']:.4g} ms at "
        f"{meta['percentile']}; forecast: {meta['forecast']}",
    )  # fmt: skip
    r = meta["replan"]
    say(
        f"replan: {r['solves']} solves, {r['cached']} repeated rounds answered from the "
        f"replay's memo, {r['dwell_holds']} held by --min-dwell, "
        f"{r.get('dwell_yields', 0)} changed within it (the running plan could not carry the "
        f"forecast); {meta['wall_s']:.1f} s",
        highlight=False,
    )
    if meta.get("vpa"):
        names = ", ".join(f"{k}: {v}" for k, v in meta["vpa"]["variants"].items())
        say(f"{names}. {meta['vpa']['rule']}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
