"""``greenctl mig``: MIG geometry (``layouts``) and SYNTHETIC per-slice profiles (``synth``)."""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, say, store_for

mig_app = typer.Typer(
    no_args_is_help=True,
    help="MIG geometry of NVIDIA GPUs: valid layouts with placements; synthetic demo profiles.",
)

GpuOpt = Annotated[
    str,
    typer.Option(
        "--gpu",
        help="GPU model as NVML names it ('NVIDIA A100-SXM4-40GB') or an alias "
        "(A100-40GB, A100-80GB, H100-80GB, H100-NVL, H200, A30).",
    ),
]


@mig_app.command("layouts")
def mig_layouts(
    gpu: GpuOpt,
    me: Annotated[
        bool, typer.Option("--me/--no-me", help="Include +me (media extension) profiles.")
    ] = False,
    profiles: Annotated[
        str | None,
        typer.Option(
            "--profiles", help="Only these profiles, comma-separated (e.g. 1g.5gb,3g.20gb)."
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """List the valid maximal MIG layouts of a GPU model with their placements.

    A layout is valid when its instances' memory-slice ranges do not overlap and their
    compute slices fit; maximal when no further instance can be added.
    """
    from greenctl.data.mig_geometry import layouts_document, resolve_gpu

    geo = resolve_gpu(gpu)
    names = [p.strip() for p in profiles.split(",") if p.strip()] if profiles else None
    doc = layouts_document(geo, profiles=names, include_me=me)
    if json_out:
        print_json(doc)
        return
    rows = []
    for i, lay in enumerate(doc["layouts"]):
        insts = lay["instances"]
        compute = sum(geo.profile(x["profile"]).compute_slices for x in insts)
        memory = sum(geo.profile(x["profile"]).memory_slices for x in insts)
        rows.append(
            [
                i,
                "  ".join(f"{x['profile']}@{x['start']}" for x in insts),
                f"{compute}/{geo.compute_slices}",
                f"{memory}/{geo.memory_slices}",
            ]
        )
    render_table(
        f"{geo.name}: {len(doc['layouts'])} maximal layouts, {len(doc['multisets'])} slice "
        "multisets",
        ["#", "instances (profile@start memory slice)", "compute", "memory"],
        rows,
        caption=None if me else "+me profiles left out (add --me)",
    )


@mig_app.command("synth")
def mig_synth(
    gpu: GpuOpt,
    family: Annotated[
        str, typer.Option("--family", help="efficientnet, yolo or albert (Clover's families).")
    ] = "efficientnet",
    me: Annotated[bool, typer.Option("--me/--no-me", help="Also +me profiles.")] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write SYNTHETIC per-MIG-slice profiles of a family into the store (for demos/tests).

    No public per-slice measurements exist: latency, power and energy come from the
    documented formula in greenctl.planner.synthetic and are stored with source and
    energy method 'synthetic'. Accuracies are the published ones Clover ships.
    Real profiles come from `greenctl profile` on a MIG GPU.
    """
    from dataclasses import asdict

    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.synthetic import synthetic_family

    geo = resolve_gpu(gpu)
    variants, profiles = synthetic_family(geo, family, include_me=me)
    with store_for(db) as store, store.transaction():
        for v in variants:
            store.upsert_variant(v)
        store.add_profiles(profiles)
    if json_out:
        print_json(
            {
                "gpu": geo.name,
                "family": family,
                "source": "synthetic",
                "variants": [asdict(v) for v in variants],
                "profiles": [asdict(p) for p in profiles],
            }
        )
        return
    render_table(
        f"SYNTHETIC profiles written: {family} on {geo.name} ({len(profiles)} rows)",
        ["variant", "resource", "p50 ms", "p95 ms", "power W", "idle W", "J/req", "source"],
        [
            [
                p.variant,
                p.resource,
                p.latency_p50_ms,
                p.latency_p95_ms,
                p.power_w,
                p.idle_power_w,
                p.energy_j,
                p.source,
            ]
            for p in profiles
        ],
        caption="synthetic: made up by greenctl.planner.synthetic, not measured",
    )
    say(f"hardware recorded as '{profiles[0].hardware}'" if profiles else "")


def register(app: typer.Typer) -> None:
    app.add_typer(mig_app, name="mig")
