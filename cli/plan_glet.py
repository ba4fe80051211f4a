"""``greenctl plan glet``: spatio-temporal GPU sharing for many models (gpulet)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from greenctl.cli.common import DbOpt, JsonOpt, input_path, print_json, render_table, say, store_for
from greenctl.cli.plan import check_writable, plan_app, save_plan
from greenctl.data.errors import InputError
from greenctl.data.glet_spec import GletSpec, load_glet_spec, parse_model_arg, parse_partitions
from greenctl.data.limits import split_items
from greenctl.executor.kinds import plan

SpecOpt = Annotated[
    Path | None,
    typer.Option(
        "--spec",
        help="TOML or JSON file: a 'models' list of name, rate_rps, slo_ms.",
        parser=input_path,
        metavar="FILE",
    ),
]
ModelsOpt = Annotated[
    list[str] | None, typer.Option("--model", help="NAME:RATE:SLO_MS (repeat for each model).")
]
PartitionsOpt = Annotated[
    str | None,
    typer.Option(
        "--partitions",
        help="Partition sizes: MPS percentages (20,40,50,60,80,100) or resource labels.",
    ),
]
MaxGpusOpt = Annotated[int | None, typer.Option("--max-gpus", help="GPUs available (default 8).")]
RatePercentileOpt = Annotated[
    float | None,
    typer.Option(
        "--rate-percentile",
        help="Pack each rate at this Poisson upper percentile of its arrivals per duty "
        "cycle (default 99; 0 = the mean rate).",
    ),
]
AlgorithmOpt = Annotated[
    str | None, typer.Option("--algorithm", help="glet (default), sbp, greedy or ideal.")
]
NoInterferenceOpt = Annotated[
    bool, typer.Option("--no-interference", help="Plan as if co-located glets did not interfere.")
]
InterferenceModelOpt = Annotated[
    int | None,
    typer.Option(
        "--interference-model", help="Id of a stored interference model (default newest)."
    ),
]
HardwareOpt = Annotated[
    str | None, typer.Option("--hardware", help="Only profiles of this hardware model.")
]
SimulateOpt = Annotated[
    float,
    typer.Option(
        "--simulate-seconds",
        help="Check the schedule in a Poisson simulation of this many seconds (0: skip).",
    ),
]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Also write the plan to this JSON file.")
]


def plan_glet_cmd(
    spec: SpecOpt = None,
    model: ModelsOpt = None,
    partitions: PartitionsOpt = None,
    max_gpus: MaxGpusOpt = None,
    rate_percentile: RatePercentileOpt = None,
    algorithm: AlgorithmOpt = None,
    no_interference: NoInterferenceOpt = False,
    interference_model: InterferenceModelOpt = None,
    hardware: HardwareOpt = None,
    simulate_seconds: SimulateOpt = 10.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the simulation.")] = 0,
    output: OutputOpt = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Pack models onto the fewest GPUs with partitions (glets) and time sharing (gpulet)."""
    check_writable(output)
    interference = (
        None if no_interference else "newest" if interference_model is None else interference_model
    )
    request = glet_request(
        spec, model or [], partitions=partitions, max_gpus=max_gpus,
        rate_percentile=rate_percentile, algorithm=algorithm, interference=interference,
        hardware=hardware, simulate_s=simulate_seconds, seed=seed,
    )  # fmt: skip
    with store_for(db) as store:
        new = plan(store, "glet", request)
        save_plan(store, new, output)
    if json_out:
        print_json(new.to_dict())
        return
    _render(new, request["algorithm"])
    if output is not None:
        say(f"plan written to {output}")


def glet_request(
    spec: Path | None,
    models: list[str],
    *,
    partitions: str | None,
    max_gpus: int | None,
    rate_percentile: float | None,
    algorithm: str | None,
    interference: int | str | None,
    hardware: str | None,
    simulate_s: float,
    seed: int,
) -> dict[str, Any]:
    """The glet request of ``plan glet``'s options: the spec file's, flags winning.

    Raises:
        InputError: no models, a bad spec file or argument.
    """
    from greenctl.planner.glet.solve import ALGORITHMS

    spec_doc = load_glet_spec(spec, algorithms=ALGORITHMS) if spec is not None else GletSpec()
    entries = list(spec_doc.models) + [parse_model_arg(m) for m in models]
    if not entries:
        raise InputError(
            "no models given", hint="pass --model NAME:RATE:SLO_MS (repeatable) or --spec FILE"
        )
    return {
        "spec": str(spec) if spec else None,
        "hardware": hardware,
        "models": entries,
        "partitions": (
            parse_partitions(split_items(partitions, "--partitions"))
            if partitions is not None
            else spec_doc.partitions
        ),
        "max_gpus": max_gpus or spec_doc.max_gpus,
        "rate_percentile": (
            rate_percentile if rate_percentile is not None else spec_doc.rate_percentile
        ),
        "algorithm": algorithm or spec_doc.algorithm or "glet",
        "interference": interference,
        "simulate_s": simulate_s,
        "seed": seed,
    }


def _render(plan: Any, algo: str) -> None:
    for note in plan.extra.get("notes", []):
        say(("note:", "yellow"), f" {note}", err=True, highlight=False)
    rows = [
        [
            gpu["index"],
            g["resource"],
            m["model"],
            m["batch"],
            m["rate_rps"],
            m["duty_cycle_ms"],
            m["interference_factor"],
            m["latency_bound_ms"],
        ]
        for gpu in plan.extra["gpus"]
        for g in gpu["glets"]
        for m in g["models"]
    ]
    render_table(
        f"glet plan {plan.id} ({algo}): {plan.predicted['gpus']} GPU(s)",
        ["gpu", "glet", "model", "batch", "req/s", "cycle ms", "interf. x", "bound ms"],
        rows,
        caption="latencies modeled: duty-cycle bound = cycle + batch latency x interference",
    )
    render_table(
        None,
        ["model", "req/s", "p99 ms (bound)", "p99 ms (simulated)", "SLO ms", "SLO met"],
        [
            [
                p["model"],
                p["rate_rps"],
                p["p99_ms"],
                p.get("p99_ms_simulated"),
                p["slo_ms"],
                p["slo_met"],
            ]
            for p in plan.predicted["per_model"]
        ],
        caption="modeled from profiles; simulated = Poisson arrivals over the planned cycles",
    )


def register(app: typer.Typer) -> None:
    plan_app.command("glet")(plan_glet_cmd)
