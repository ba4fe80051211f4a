"""``greenctl hw``: list this machine's CPUs and NVIDIA GPUs (MIG instances, MPS)."""

from __future__ import annotations

from dataclasses import asdict

import typer
from greenctl.cli.common import JsonOpt, print_json, render_table, say
from greenctl.profiler.hw import discover


def hw_cmd(json_out: JsonOpt = False) -> None:
    """List CPUs (model, cores, RAPL) and NVIDIA GPUs with MIG instances and their UUIDs."""
    inv = discover()
    if json_out:
        print_json(
            {
                "host": inv.host,
                "cpu": {
                    **asdict(inv.cpu),
                    "logical_cores": inv.cpu_info.logical_cores,
                    "physical_cores": inv.cpu_info.physical_cores,
                    "usable_cores": inv.cpu_info.usable_cores,
                    "rapl_files": inv.cpu_info.rapl_files,
                },
                "gpus": [asdict(g) for g in inv.gpus],
                "mig": [
                    {
                        **asdict(h),
                        "gi_id": m.gi_id,
                        "ci_id": m.ci_id,
                        "placement_start": m.placement_start,
                        "placement_size": m.placement_size,
                    }
                    for h, m in zip(inv.mig, inv.mig_instances, strict=True)
                ],
                "mps_pipe": inv.mps_pipe,
                "notes": inv.notes,
            }
        )
        return
    info = inv.cpu_info
    render_table(
        f"CPUs on {inv.host}",
        ["model", "logical cores", "physical cores", "usable cores", "RAPL readable"],
        [
            [
                info.model_name,
                info.logical_cores,
                info.physical_cores,
                ",".join(map(str, info.usable_cores)),
                info.rapl_readable,
            ]
        ],
        caption=None if info.rapl_readable else "no readable RAPL: CPU energy will be 'modeled'",
    )
    if inv.gpus:
        mig_on = inv.mig_enabled
        render_table(
            "NVIDIA GPUs",
            ["index", "name", "memory MB", "MIG", "uuid", "driver", "CUDA"],
            [
                [
                    g.device_index,
                    g.model_name,
                    g.memory_mb,
                    "on" if g.device_index in mig_on else "-",
                    g.uuid,
                    g.driver_version,
                    g.cuda_version,
                ]
                for g in inv.gpus
            ],
        )
    if inv.mig_instances:
        render_table(
            "MIG instances (use the UUID in CUDA_VISIBLE_DEVICES)",
            ["gpu", "profile", "GI", "CI", "placement", "slices", "memory MB", "uuid"],
            [
                [
                    m.gpu_index,
                    m.profile,
                    m.gi_id,
                    m.ci_id,
                    f"{m.placement_start}+{m.placement_size}",
                    f"{m.slices}/{m.gi_slices}",
                    m.memory_mb,
                    m.uuid,
                ]
                for m in inv.mig_instances
            ],
        )
    if inv.mps_pipe:
        say(f"MPS daemon running (control pipe {inv.mps_pipe})")
    for note in inv.notes:
        say(note)


def register(app: typer.Typer) -> None:
    app.command("hw")(hw_cmd)
