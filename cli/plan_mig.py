"""``greenctl plan mig``: carbon-aware MIG layouts with mixed-quality variants (Clover)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.cli.common import DbOpt, JsonOpt, input_path, print_json, render_table, say, store_for
from greenctl.cli.plan import AtOpt, RegionOpt, carbon_caption, check_writable, plan_app, save_plan
from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import resolve_gpu
from greenctl.data.mig_parted import write_mig_parted
from greenctl.data.plan import load_plan_file
from greenctl.executor.kinds import get_kind, plan, plan_carbon


def mig_request(
    *,
    gpu: str,
    gpus: int,
    model: str,
    rate: float | None,
    carbon_intensity: float | None,
    sla_ms: float | None = None,
    lam: float = 0.5,
    base_carbon_intensity: float | None = None,
    max_accuracy_loss: float | None = None,
    solver: str = "exact",
    time_limit: float | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """The MIG request of ``plan mig``'s options (``replay --kind mig`` parses the same);
    ``gpu`` resolved to its geometry's name."""

    return {
        "gpu": resolve_gpu(gpu).name,
        "gpus": gpus,
        "model": model,
        "rate_rps": rate,
        "carbon_intensity": carbon_intensity,
        "sla_ms": sla_ms,
        "lambda": lam,
        "base_carbon_intensity": base_carbon_intensity,
        "max_accuracy_loss_pct": max_accuracy_loss,
        "solver": solver,
        "time_limit_s": time_limit,
        "seed": seed,
    }


GpuOpt = Annotated[
    str, typer.Option("--gpu", help="GPU model: NVML name or alias (A100-40GB, H100-80GB, A30).")
]
CarbonOpt = Annotated[
    float | None,
    typer.Option(
        "--carbon-intensity",
        help="Current grid carbon intensity, gCO2/kWh (default: the --region signal, "
        "else the only region's in the store).",
    ),
]
SlaOpt = Annotated[
    float | None,
    typer.Option("--sla-ms", help="p95 latency SLA in ms (default: BASE's p95 at --rate)."),
]
LambdaOpt = Annotated[
    float, typer.Option("--lambda", help="Weight of dCarbon vs dAccuracy in the objective (0..1).")
]
BaseCarbonOpt = Annotated[
    float | None,
    typer.Option(
        "--base-carbon-intensity",
        help="Carbon intensity BASE is measured at, gCO2/kWh (default: --carbon-intensity).",
    ),
]
AccuracyLossOpt = Annotated[
    float | None,
    typer.Option(
        "--max-accuracy-loss", help="Hard floor: accuracy at most this many percent below BASE's."
    ),
]
SolverOpt = Annotated[
    str,
    typer.Option(
        "--solver", help="exact (ILP), anneal (Clover's graph annealing) or random (BLOVER)."
    ),
]
BaselineOpt = Annotated[
    str | None,
    typer.Option("--baseline", help="Emit a baseline instead: base (7g, best variant) or co2opt."),
]
CurrentOpt = Annotated[
    Path | None,
    typer.Option(
        "--current",
        help="Previous MIG plan JSON: warm start, and GPUs keep their layout.",
        parser=input_path,
        metavar="FILE",
    ),
]
ExportOpt = Annotated[
    tuple[str, Path] | None,
    typer.Option(
        "--export",
        help="Also write the layouts in another format: `--export mig-parted FILE` "
        "(NVIDIA mig-parted v1 YAML).",
    ),
]


def plan_mig_cmd(
    gpu: GpuOpt,
    gpus: Annotated[int, typer.Option("--gpus", help="Number of GPUs of that model.")],
    model: Annotated[str, typer.Option("--model", help="Model family to serve.")],
    rate: Annotated[float, typer.Option("--rate", help="Poisson request rate, req/s.")],
    carbon_intensity: CarbonOpt = None,
    region: RegionOpt = None,
    at: AtOpt = None,
    sla_ms: SlaOpt = None,
    lam: LambdaOpt = 0.5,
    base_carbon_intensity: BaseCarbonOpt = None,
    max_accuracy_loss: AccuracyLossOpt = None,
    solver: SolverOpt = "exact",
    baseline: BaselineOpt = None,
    current: CurrentOpt = None,
    time_limit: Annotated[
        float | None, typer.Option("--time-limit", help="Solver time limit, seconds.")
    ] = None,
    seed: Annotated[int | None, typer.Option("--seed", help="Seed of anneal/random.")] = None,
    export: ExportOpt = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the plan JSON here.")
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Choose MIG layouts and a variant per slice that maximise
    lambda*dCarbon + (1-lambda)*dAccuracy under a p95 SLA (Clover).

    Profiles come from the store: batch-1 rows on mig:<profile> resources whose hardware
    names the GPU model. The plan is saved in the store and printed.
    """
    if export is not None and export[0] != "mig-parted":
        raise InputError(
            f"--export format '{export[0]}' is not supported", hint="use --export mig-parted FILE"
        )
    check_writable(output)
    if export is not None:
        check_writable(export[1], option="--export mig-parted")
    current_plan = load_plan_file(current) if current is not None else None
    request = mig_request(
        gpu=gpu, gpus=gpus, model=model, rate=rate, carbon_intensity=carbon_intensity,
        sla_ms=sla_ms, lam=lam, base_carbon_intensity=base_carbon_intensity,
        max_accuracy_loss=max_accuracy_loss, solver=solver, time_limit=time_limit, seed=seed,
    )  # fmt: skip
    with store_for(db) as store:
        ci = plan_carbon(store, get_kind("mig"), intensity=carbon_intensity, region=region, at=at)
        # the registry's MIG entry: `replan` plans it again the same way
        new = plan(store, "mig", request, carbon=ci, current=current_plan, baseline=baseline)
        if export is not None:
            _export_mig_parted(new, export[1])
        save_plan(store, new, output)
    if ci is not None and ci["note"]:
        say(f"note: {ci['note']}", err=True, highlight=False)
    if json_out:
        print_json(new.to_dict())
        return
    _render(new)
    if export is not None:
        say(f"mig-parted config written to {export[1]}", highlight=False)
    if output is not None:
        say(f"plan written to {output}", highlight=False)


def _export_mig_parted(plan: Any, path: Path) -> None:
    """Write the plan's MIG layouts as a mig-parted v1 config (largest profiles first)."""

    geo = resolve_gpu(plan.request["gpu"])
    order = [p.name for p in sorted(geo.profiles, key=lambda p: -p.compute_slices)]
    write_mig_parted(
        path,
        [(g["index"], [i["profile"] for i in g["layout"]]) for g in plan.extra["gpus"]],
        label="greenctl-mig",
        order=order,
    )


def _render(plan: Any) -> None:
    pred = plan.predicted
    rows = [["plan", pred, plan.extra["solver"].get("name", "")]]
    for name, b in plan.extra["baselines"].items():
        what = b.get("description", "")
        if b.get("sla_met") is False:
            what = f"{what} (misses the SLA)"
        rows.append([name.upper(), b, what])
    # the plan's own label: "synthetic profiles", "mps-emulated profiles" (data.records)
    estimate = plan.extra["model"].get("label")
    label = f" ({str(estimate).upper()})" if estimate else ""
    render_table(
        f"plan mig #{plan.id}: {plan.request['gpus']} x {plan.request['gpu']}, "
        f"{plan.request['model']} at {plan.request['rate_rps']:g} req/s, SLA p95 "
        f"{plan.extra['model']['sla_ms']:.4g} ms{label}",
        ["", "p95 ms", "accuracy", "J/req", "gCO2/req", "dCarbon %", "dAcc %", "objective", "what"],
        [
            [
                n,
                b.get("p95_ms"),
                b.get("accuracy"),
                b.get("energy_j_per_request"),
                b.get("carbon_g_per_request"),
                b.get("delta_carbon_pct"),
                b.get("delta_accuracy_pct"),
                b.get("objective"),
                what,
            ]
            for n, b, what in rows
        ],
        caption=f"energy: {pred.get('energy_method')}; solver {plan.extra['solver'].get('name')} "
        f"in {plan.extra['solver'].get('wall_s', 0):.2f} s; {carbon_caption(plan)}",
    )
    render_table(
        "Deployments",
        ["variant", "resource", "instances", "quota req/s"],
        [[d.variant, d.resource, d.count, d.quota_rps] for d in plan.deployments],
    )
    layouts = plan.extra["configuration"]["layouts"]
    render_table("Layouts", ["slice multiset", "GPUs"], [[k, v] for k, v in layouts.items()])


def register(app: typer.Typer) -> None:
    plan_app.command("mig")(plan_mig_cmd)
