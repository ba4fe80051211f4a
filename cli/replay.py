"""``greenctl replay``: the control loop over a load trace and a carbon signal, what-if."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, say, store_for
from greenctl.data.errors import InputError


def replay_cmd(
    load_trace: Annotated[
        str,
        typer.Option(
            "--load-trace", help="Requests per second, one value per second (gzip or not)."
        ),
    ],
    kind: Annotated[str, typer.Option("--kind", help="Plan kind to replay: mix | mig.")] = "mix",
    plan: Annotated[
        str | None, typer.Option("--plan", help="Start from this stored plan (id).")
    ] = None,
    model: Annotated[str | None, typer.Option("--model", help="Model family (mix).")] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Rate of the first plan (default: the first forecast)."),
    ] = None,
    slo_ms: Annotated[
        float | None, typer.Option("--slo-ms", help="Latency SLO in ms at --percentile.")
    ] = None,
    percentile: Annotated[
        str | None, typer.Option("--percentile", help="SLO percentile: p95 (default) or p99.")
    ] = None,
    budget: Annotated[
        list[str] | None,
        typer.Option("--budget", help="Resource budget KIND=AMOUNT (cpu=20); repeatable."),
    ] = None,
    objective: Annotated[
        str | None,
        typer.Option("--objective", help="accuracy | cost | carbon | balanced (default)."),
    ] = None,
    min_accuracy: Annotated[
        float | None, typer.Option("--min-accuracy", help="Floor on the accuracy.")
    ] = None,
    alpha: Annotated[float | None, typer.Option("--alpha", help="Balanced: cost weight.")] = None,
    beta: Annotated[float | None, typer.Option("--beta", help="Balanced: loading weight.")] = None,
    gamma: Annotated[float | None, typer.Option("--gamma", help="Balanced: carbon weight.")] = None,
    headroom: Annotated[
        float | None, typer.Option("--headroom", help="Spare capacity fraction (0).")
    ] = None,
    strategy: Annotated[
        str | None, typer.Option("--strategy", help="ilp (exact, default) | greedy | single.")
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", help="TOML/JSON mix spec (as plan mix).")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="mig: GPU model (A100-40GB).")] = None,
    gpus: Annotated[int | None, typer.Option("--gpus", help="mig: number of GPUs.")] = None,
    sla_ms: Annotated[
        float | None,
        typer.Option("--sla-ms", help="mig: p95 SLA in ms (default: the first plan's)."),
    ] = None,
    lam: Annotated[
        float, typer.Option("--lambda", help="mig: weight of dCarbon vs dAccuracy.")
    ] = 0.5,
    carbon_intensity: Annotated[
        float | None,
        typer.Option(
            "--carbon-intensity",
            help="Constant gCO2/kWh when no --region or --carbon-trace (default 400).",
        ),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", "-r", help="Stored carbon signal region.")
    ] = None,
    carbon_trace: Annotated[
        str | None,
        typer.Option("--carbon-trace", help="Carbon signal file (any format carbon import reads)."),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option("--from", help="Offset into the traces (36h, 90m) or an ISO time."),
    ] = None,
    hours: Annotated[
        float | None, typer.Option("--hours", help="Hours to replay (default: the rest).")
    ] = None,
    every: Annotated[str, typer.Option("--every", help="Replan interval (60s, 5m).")] = "60s",
    threshold: Annotated[
        float, typer.Option("--threshold", help="As replan: carbon signal move that acts.")
    ] = 0.05,
    margin: Annotated[
        float, typer.Option("--margin", help="As replan: objective gain that acts.")
    ] = 0.02,
    min_dwell: Annotated[
        str, typer.Option("--min-dwell", help="As replan: no change sooner than this.")
    ] = "1h",
    forecaster: Annotated[
        str,
        typer.Option(
            "--forecaster", "-f", help="last | moving-max | seasonal-naive | a saved name."
        ),
    ] = "last",
    baseline: Annotated[
        list[str] | None,
        typer.Option(
            "--baseline",
            help="base | co2opt | vpa | infaas | none; repeatable (default base, co2opt, vpa).",
        ),
    ] = None,
    vpa_variant: Annotated[
        list[str] | None,
        typer.Option(
            "--vpa-variant",
            help="VPA's one variant (default: the first plan's main); repeat for one VPA each.",
        ),
    ] = None,
    wue: Annotated[
        float | None, typer.Option("--wue", help="Direct water L/kWh (else water not modeled).")
    ] = None,
    ewif: Annotated[
        float | None, typer.Option("--ewif", help="Indirect water L/kWh of electricity.")
    ] = None,
    output: Annotated[
        str | None,
        typer.Option("-o", "--output", help="Folder for replay.json, CSVs and replay.png."),
    ] = None,
    json_out: JsonOpt = False,
    db: DbOpt = None,
) -> None:
    """Replay the replan loop over a load trace and a carbon signal, beside baselines."""
    from greenctl.cli.plan_mix import mix_request
    from greenctl.executor import control, replay

    request: dict[str, Any] | None = None
    if plan is None and kind == "mig":
        from greenctl.cli.plan_mig import mig_request

        if gpu is None or gpus is None or model is None:
            raise InputError("--kind mig needs --gpu, --gpus and --model", hint="as plan mig")
        request = mig_request(
            gpu=gpu, gpus=gpus, model=model, rate=rate, carbon_intensity=carbon_intensity,
            sla_ms=sla_ms, lam=lam,
        )  # fmt: skip
    elif plan is None:
        if kind != "mix":
            raise InputError(f"--kind {kind}: replay takes mix or mig", hint="--kind mix|mig")
        request = mix_request(
            model=model, rate=rate, slo_ms=slo_ms, percentile=percentile, budget=budget,
            objective=objective, min_accuracy=min_accuracy, alpha=alpha, beta=beta, gamma=gamma,
            carbon_intensity=carbon_intensity, headroom=headroom, strategy=strategy, spec=spec,
        )  # fmt: skip
    elif model is not None or spec is not None:
        raise InputError("--plan cannot be combined with --model/--spec", hint="give one")
    chosen = [b for b in baseline or list(replay.DEFAULT_BASELINES) if b != "none"]
    dwell = control.parse_duration(min_dwell)
    from greenctl.cli.common import console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(
        TextColumn("replanning", style="progress.description"),
        BarColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=json_out,
        transient=True,
    )
    task = bar.add_task("replay", total=1.0)
    with store_for(db) as store, bar:
        result = replay.replay(
            store, load_trace=load_trace, kind=kind, request=request, plan=plan,
            region=region, carbon_trace=carbon_trace, start=start, hours=hours, every=every,
            threshold=threshold, margin=margin, min_dwell_s=dwell, forecaster=forecaster,
            baselines=chosen, vpa_variant=vpa_variant, wue_l_per_kwh=wue,
            ewif_l_per_kwh=ewif, out_dir=output,
            progress=lambda k, n: bar.update(task, completed=k / n),
        )  # fmt: skip
    if json_out:
        print_json(result)
        return
    _render(result)


def _render(result: dict[str, Any]) -> None:
    meta = result["meta"]
    render_table(
        f"Replay of {meta['family']} (modeled): {meta['hours']:.2f} h from {meta['start']}, "
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
        f"replay's memo, {r['dwell_holds']} held by --min-dwell; {meta['wall_s']:.1f} s",
        highlight=False,
    )
    if meta.get("vpa"):
        names = ", ".join(f"{k}: {v}" for k, v in meta["vpa"]["variants"].items())
        say(f"{names}. {meta['vpa']['rule']}", highlight=False)
    for note in meta["notes"]:
        say(f"note: {note}", highlight=False)
    for path in meta.get("files", []):
        say(f"wrote {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("replay")(replay_cmd)
