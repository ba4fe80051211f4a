"""``greenctl profile``: measure variants, list/show profiles, import/export them."""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, store_for

profile_app = typer.Typer(
    help="Measure variants on this machine's CPUs/GPUs/MIG/MPS; list, import, export profiles.",
    invoke_without_command=True,
)


@profile_app.command("list")
def profile_list(
    model: Annotated[str | None, typer.Option("--model", help="Only this model family.")] = None,
    variant: Annotated[str | None, typer.Option("--variant", help="Only this variant.")] = None,
    resource: Annotated[
        str | None, typer.Option("--resource", help="Only this resource label.")
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List the latest profile of every (variant, resource, batch) point."""
    with store_for(db) as store:
        profiles = store.latest_profiles(family=model, variant=variant, resource=resource)
    if json_out:
        from dataclasses import asdict

        print_json([asdict(p) for p in profiles])
        return
    render_table(
        "Profiles (latest of each point)",
        [
            "variant",
            "resource",
            "batch",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "req/s",
            "power W",
            "J/req",
            "energy",
            "hardware",
        ],
        [
            [
                p.variant,
                p.resource,
                p.batch,
                p.latency_p50_ms,
                p.latency_p95_ms,
                p.latency_p99_ms,
                p.throughput_rps,
                p.power_w,
                p.energy_j,
                p.energy_method,
                p.hardware,
            ]
            for p in profiles
        ],
        caption="energy 'modeled' = estimated from a CPU power model, not measured"
        if any(p.energy_method == "modeled" for p in profiles)
        else None,
    )


@profile_app.command("show")
def profile_show(
    variant: Annotated[str, typer.Argument(help="Variant name, for example resnet50.")],
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show one variant and its latest profiles."""
    with store_for(db) as store:
        v = store.get_variant(variant)
        profiles = store.latest_profiles(variant=variant)
    if json_out:
        from dataclasses import asdict

        print_json({"variant": asdict(v), "profiles": [asdict(p) for p in profiles]})
        return
    render_table(
        f"{v.name} ({v.family})",
        ["accuracy", "metric", "source", "params", "memory MB", "load s"],
        [[v.accuracy, v.accuracy_metric, v.accuracy_source, v.params, v.memory_mb, v.load_time_s]],
    )
    render_table(
        None,
        [
            "resource",
            "batch",
            "p50 ms",
            "p95 ms",
            "p99 ms",
            "req/s",
            "power W",
            "J/req",
            "energy",
            "samples",
            "created_at",
        ],
        [
            [
                p.resource,
                p.batch,
                p.latency_p50_ms,
                p.latency_p95_ms,
                p.latency_p99_ms,
                p.throughput_rps,
                p.power_w,
                p.energy_j,
                p.energy_method,
                p.samples,
                p.created_at,
            ]
            for p in profiles
        ],
    )


def register(app: typer.Typer) -> None:
    app.add_typer(profile_app, name="profile")
