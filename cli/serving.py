"""``greenctl profile serving``: measure the serving path (client, dispatcher, executor hops)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer
from greenctl.cli.common import err_console, print_json, render_table, store_for
from greenctl.cli.options import DbOpt, JsonOpt
from greenctl.cli.profile import profile_app
from greenctl.data.batching import DEFAULT_MAX_WAIT_MS
from rich.text import Text

if TYPE_CHECKING:
    from greenctl.executor.runtime.serving import ServingMeasurement

VariantOpt = Annotated[
    str,
    typer.Option(
        "--variant",
        help="Variant to serve (with --stand-in noop: whose tensor shapes the no-op copies).",
    ),
]
RatesOpt = Annotated[
    list[float] | None,
    typer.Option("--rate", help="Offered load in req/s (repeat; default 10, 40, 160)."),
]
DurationOpt = Annotated[
    float,
    typer.Option(
        "--duration",
        help="Seconds of load per rate and path (and at least 400 requests: low rates run longer).",
    ),
]
PathOpt = Annotated[
    list[str] | None,
    typer.Option("--path", help="dispatcher and/or direct (repeat; default both)."),
]
PolicyOpt = Annotated[str, typer.Option("--policy", help="Dispatcher policy: wrr or fifo.")]
StandInOpt = Annotated[
    str,
    typer.Option(
        "--stand-in",
        help="model: the variant itself, its own queue and run times subtracted per "
        "request (default); noop: a no-op model of its tensor shapes.",
    ),
]
ResourceOpt = Annotated[
    str,
    typer.Option(
        "--resource",
        help="Where the executor runs: cpu:1 (default), or gpu:MODEL, mig:PROFILE, "
        "mps:PCT to measure served runs on that accelerator for plans that use it.",
    ),
]
BatchOpt = Annotated[
    int, typer.Option("--batch", help="The executor's largest batch (batched dynamically).", min=1)
]
MaxWaitOpt = Annotated[
    float,
    typer.Option(
        "--max-wait-ms",
        help="How long the executor waits for a batch to fill, as apply serves it "
        "(default: apply's). Its batches then carry what served batches carry.",
        min=0.0,
    ),
]
DryRunOpt = Annotated[bool, typer.Option("--dry-run", help="Measure and print, but store nothing.")]


def profile_serving(
    variant: VariantOpt,
    rate: RatesOpt = None,
    duration: DurationOpt = 5.0,
    path: PathOpt = None,
    policy: PolicyOpt = "wrr",
    stand_in: StandInOpt = "model",
    resource: ResourceOpt = "cpu:1",
    batch: BatchOpt = 1,
    max_wait_ms: MaxWaitOpt = DEFAULT_MAX_WAIT_MS,
    dry_run: DryRunOpt = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Measure what a request spends outside the model, and store it for planning.

    Starts an executor of VARIANT on one core or on --resource (or, with --stand-in noop, a
    no-op model of its tensor shapes) and a dispatcher in a scratch state folder (what runs now is not
    touched), sends open-loop Poisson loads, and stores the quantiles of the time each
    request spends outside the executor's queue and model run, per rate and path. `plan
    mix` then adds the dispatcher path to its predicted latencies (and `apply --verify`
    compares them with what is measured).
    """
    # numpy: not for `--help`
    from greenctl.executor.deploy.serving_measure import measure_serving
    from greenctl.executor.runtime.serving import DEFAULT_RATES, PATHS, save_serving

    with store_for(db) as store:
        with err_console.status("measuring the serving path") as status:
            rows = measure_serving(
                store,
                variant=variant,
                rates=rate or DEFAULT_RATES,
                duration_s=duration,
                policy=policy,
                paths=path or PATHS,
                stand_in=stand_in,
                resource=resource,
                batch=batch,
                max_wait_ms=max_wait_ms,
                progress=lambda m, f: status.update(Text(f"serving path: {m} ({100 * f:.0f}%)")),
            )
        if not dry_run:
            save_serving(store, rows)
    if json_out:
        print_json([asdict(r) for r in rows])
        return
    _render(rows, variant=variant, resource=resource, stand_in=stand_in, dry_run=dry_run)


def _render(
    rows: list[ServingMeasurement], *, variant: str, resource: str, stand_in: str, dry_run: bool
) -> None:
    """The table of measured serving paths, one row per (path, rate)."""
    render_table(
        f"Serving path of {variant} requests on {resource} ({stand_in} stand-in, measured)",
        [
            "path",
            "req/s",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "executor CPU ms/req",
            "dispatcher CPU ms/req",
            "served run p50 ms",
            "batch rows",
            "samples",
        ],
        [
            (
                r.path,
                r.rate_rps,
                r.p50_ms,
                r.p95_ms,
                r.p99_ms,
                r.executor_cpu_ms_per_request,
                r.dispatcher_cpu_ms_per_request,
                r.infer_p50_ms,
                r.infer_rows_p50,
                r.samples,
            )
            for r in rows
        ],
        caption=(
            f"{rows[0].input_bytes} request bytes, {rows[0].output_elements} output elements; "
            + ("not stored (--dry-run)" if dry_run else "stored: plan mix adds the dispatcher path")
        )
        if rows
        else None,
    )


def register(app: typer.Typer) -> None:
    del app
    profile_app.command("serving")(profile_serving)
