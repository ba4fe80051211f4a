"""``greenctl mig``: MIG geometry (``layouts``) and SYNTHETIC per-slice profiles (``synth``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer
from greenctl.cli.common import print_json, render_table, say, store_for
from greenctl.cli.options import DbOpt, JsonOpt
from greenctl.data.limits import split_items
from greenctl.data.mig_geometry import GpuGeometry, layouts_document, resolve_gpu
from greenctl.data.provenance import store_synthetic
from greenctl.data.records import Profile
from greenctl.planner.core.synthetic import synthetic_family

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
    geo = resolve_gpu(gpu)
    names = (
        split_items(profiles, "--profiles", example="1g.5gb,2g.10gb")
        if profiles is not None
        else None
    )
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
    prefix: Annotated[
        str | None,
        typer.Option(
            "--prefix",
            help="Write every variant and the family as PREFIX-NAME (--prefix synthetic: "
            "synthetic-efficientnet-b0 of family synthetic-efficientnet), apart from real ones.",
        ),
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge",
            help="Add the synthetic rows beside a family's real (built-in, measured, imported) "
            "variants on purpose; their records stay, and real and MPS-emulated rows of a point "
            "win over synthetic ones (refused otherwise).",
        ),
    ] = False,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write SYNTHETIC per-MIG-slice profiles of a family into the store (for demos/tests).

    No public per-slice measurements exist: latency, power and energy come from the
    documented formula in greenctl.planner.core.synthetic and are stored with source and
    energy method 'synthetic'. Accuracies are the published ones Clover ships.
    Real profiles come from `greenctl profile` on a MIG GPU. A family that holds real
    variants (built-in, measured, imported) is refused: write beside it with --prefix,
    or add to it with --merge.
    """
    geo = resolve_gpu(gpu)
    variants, profiles = synthetic_family(geo, family, include_me=me, prefix=prefix)
    written, example = variants[0].family, variants[0].name  # every family has variants
    rename = (
        f"choose another --prefix than '{prefix}'"
        if prefix is not None
        else f"write a separate family with --prefix synthetic ({example} becomes "
        f"synthetic-{example} of family synthetic-{family})"
    )
    with store_for(db) as store:
        merged, kept = store_synthetic(
            store,
            variants,
            profiles,
            what=f"mig synth of family '{written}'",
            hint=f"{rename}, or pass --merge to add the synthetic rows beside them on purpose "
            "(their variant records stay; real and MPS-emulated rows of a point win over "
            "synthetic ones)",
            merge=merge,
        )
    for line in merged:
        say(f"note: merged on purpose (--merge): {line}", err=True, highlight=False)
    if kept:
        say(
            "note: kept the records of variants that are not synthetic: " + ", ".join(kept),
            err=True,
            highlight=False,
        )
    if json_out:
        print_json(
            {
                "gpu": geo.name,
                "family": written,
                "source": "synthetic",
                "variants": [asdict(v) for v in variants if v.name not in kept],
                "kept_variants": kept,
                "merged": merged,
                "profiles": [asdict(p) for p in profiles],
            }
        )
        return
    _render_synth(profiles, geo, family=written)


def _render_synth(profiles: list[Profile], geo: GpuGeometry, *, family: str) -> None:
    """The table of synthetic rows written, labelled synthetic."""
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
        caption="synthetic: made up by greenctl.planner.core.synthetic, not measured",
    )
    say(f"hardware recorded as '{profiles[0].hardware}'" if profiles else "")


def register(app: typer.Typer) -> None:
    app.add_typer(mig_app, name="mig")
