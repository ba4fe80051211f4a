"""``greenctl export k8s``: a plan as Kubernetes manifests (NVIDIA GPU operator)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from greenctl.cli.common import (
    check_writable_folder,
    print_json,
    say,
    store_for,
    undone_on_failure,
)
from greenctl.cli.options import AtOpt, DbOpt, JsonOpt
from greenctl.data.emissions import executor_energy_args
from greenctl.data.plan import Plan, load_plan_file
from greenctl.data.store import Store

export_app = typer.Typer(
    no_args_is_help=True, help="Export plans for other engines (Kubernetes, Envoy)."
)


def _is_plan_id(plan: str) -> bool:
    """Whether the PLAN argument is a store id (digits, and no file of that name)."""
    return plan.isascii() and plan.isdecimal() and len(plan) <= 18 and not Path(plan).exists()


def _open(plan: str, db: str | None) -> Store:
    """The store, read-only: it must exist for a plan id; for a plan file it is optional
    (an absent store reads as empty)."""
    return store_for(db, create=False, missing_ok=not _is_plan_id(plan))


def _load_plan(plan: str, store: Store) -> tuple[Plan, dict[str, float]]:
    """The plan (by id or file) and each variant's largest measured memory (MB)."""
    doc = store.get_plan(int(plan)) if _is_plan_id(plan) else load_plan_file(plan)
    memory: dict[str, float] = {}
    for dep in doc.deployments:
        for p in store.latest_profiles(variant=dep.variant, resource=dep.resource):
            if p.memory_mb:
                memory[dep.variant] = max(memory.get(dep.variant, 0.0), p.memory_mb)
    return doc, memory


@export_app.command("k8s")
def export_k8s(
    plan: Annotated[str, typer.Argument(help="Plan JSON file, or a plan id from the store.")],
    output: Annotated[
        str, typer.Option("-o", "--output", help="Directory to write the manifests to.")
    ],
    image: Annotated[
        str, typer.Option(help="Executor image (build it from the Dockerfile).")
    ] = "greenctl-executor:0.1.0",
    namespace: Annotated[str, typer.Option(help="Namespace of the objects.")] = "greenctl",
    name: Annotated[str | None, typer.Option(help="Base name of the objects.")] = None,
    gpus_per_node: Annotated[
        int, typer.Option(help="GPUs per node, to group a MIG plan into nodes.")
    ] = 8,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write Deployments, Services, the dispatcher and (MIG plans) the mig-parted ConfigMap."""
    # numpy: not for `--help`
    from greenctl.executor.deploy.k8s_export import build_k8s_export, write_k8s_export

    folder = check_writable_folder(output, option="-o")
    with _open(plan, db) as store:
        doc, memory = _load_plan(plan, store)
        energy = {  # each executor's energy and carbon options, as apply's
            (d.variant, d.resource, d.batch): executor_energy_args(
                store, doc, variant=d.variant, resource=d.resource, batch=d.batch
            )
            for d in doc.deployments
        }
    export = build_k8s_export(
        doc,
        name=name,
        namespace=namespace,
        image=image,
        gpus_per_node=gpus_per_node,
        memory_mb=memory,
        energy_args=energy,
    )
    with undone_on_failure(folder):
        written = write_k8s_export(export, folder)
    if json_out:
        print_json({"files": written, "node_labels": export.node_labels})
        return
    for path in written:
        say(f"wrote {path}")
    for line in export.node_labels:
        say(f"  {line}")
    say(f"apply with: kubectl apply -k {output}")


@export_app.command("envoy")
def export_envoy_cmd(
    plan: Annotated[str, typer.Argument(help="Geo plan JSON file, or a plan id from the store.")],
    output: Annotated[
        str, typer.Option("-o", "--output", help="Directory to write the Envoy configs to.")
    ],
    at: AtOpt = None,
    site: Annotated[
        list[str] | None,
        typer.Option("--site", help="A site's endpoint, NAME=URL (default: NAME:8000)."),
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Write, per gateway, an Envoy v3 config: weighted_clusters for the slot, the clusters."""
    # numpy: not for `--help`
    from greenctl.executor.deploy.envoy_export import export_envoy, write_envoy_export
    from greenctl.executor.deploy.georouter import parse_sites

    folder = check_writable_folder(output, option="-o")
    sites = parse_sites(site)
    with _open(plan, db) as store:
        doc, _ = _load_plan(plan, store)
        export = export_envoy(doc, store=store, at=at, sites=sites)
    with undone_on_failure(folder):
        written = write_envoy_export(export, folder)
    if json_out:
        print_json({"slot": export.slot, "slot_time": export.slot_time, "files": written,
                    "notes": export.notes})  # fmt: skip
        return
    say(f"slot {export.slot} ({export.slot_time})")
    for path in written:
        say(f"wrote {path}")
    for note in export.notes:
        say(f"  note: {note}")
    say(f"run with: envoy -c {output}/gateway-NAME.yaml")


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
