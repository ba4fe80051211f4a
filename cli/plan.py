"""``greenctl plan``: the group the planners register on, plus ``plan list`` / ``plan show`` and
``plan run``, which plans any installed kind (one without its own subcommand included) from a
request file through the one planning twin."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from greenctl.cli.common import (
    check_writable,
    input_path_str,
    print_json,
    render_table,
    say,
    store_for,
)
from greenctl.cli.options import AtOpt, DbOpt, JsonOpt, RegionOpt
from greenctl.cli.plan_llm import register as register_llm
from greenctl.data import plan as plan_docs
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan
from greenctl.executor import kinds

if TYPE_CHECKING:
    from greenctl.data.store import Store

plan_app = typer.Typer(
    no_args_is_help=True,
    help="Plan configurations (mix, mig, glet, geo; any installed kind with `plan run`) and "
    "list saved plans.",
)


@plan_app.command("list")
def plan_list(
    kind: Annotated[
        str | None, typer.Option(help="Only plans of this kind (mix, mig, glet, geo).")
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """List the plans saved in the store, newest first."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        rows = store.plans(kind)
    if json_out:
        print_json(rows)
        return
    render_table(
        "Plans",
        ["id", "kind", "created_at", "objective", "source"],
        [[r["id"], r["kind"], r["created_at"], r["objective"], r["source"]] for r in rows],
    )


@plan_app.command("show")
def plan_show(
    plan_id: Annotated[int, typer.Argument(help="Plan id (see `greenctl plan list`).")],
    db: DbOpt = None,
) -> None:
    """Print a saved plan document as JSON."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        plan = store.get_plan(plan_id)
    print_json(plan.to_dict())


@plan_app.command("run")
def plan_run(
    kind: Annotated[
        str,
        typer.Option(
            "--kind",
            help=f"The plan kind: any installed one ({', '.join(kinds.KINDS)} here).",
            metavar="K",
        ),
    ],
    request: Annotated[
        str,
        typer.Option(
            "--request",
            help="JSON file of the kind's request fields (the `request` of its plan document).",
            parser=input_path_str,
            metavar="FILE",
        ),
    ],
    region: RegionOpt = None,
    at: AtOpt = None,
    current: Annotated[
        Path | None,
        typer.Option("--current", help="The plan running now (JSON): kept where it still fits."),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write the plan JSON here.")
    ] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Plan a request of any installed plan kind, save the plan and print it.

    The kind's typed request checks the file's fields. The carbon intensity is the
    request's, else --region's signal at --at, as every plan command plans it.
    """
    entry = kinds.get_kind(kind)  # an unknown kind is refused naming the installed ones
    check_writable(output)
    doc = kinds.read_request(request)
    running = plan_docs.load_plan_file(current) if current is not None else None
    with store_for(db) as store:
        new = kinds.plan(store, entry.name, doc, region=region, at=at, current=running)
        save_plan(store, new, output)
    if json_out:
        print_json(new.to_dict())
        return
    render_plan(new)
    for note in new.extra.get("notes") or []:
        say(f"note: {note}", err=True, highlight=False)
    if output is not None:
        say(f"plan written to {output}", highlight=False)


def render_plan(new: Plan) -> None:
    """A plan of any kind as tables: the figures it predicts, and its deployments."""
    figures = {k: v for k, v in new.predicted.items() if isinstance(v, int | float | str | None)}
    render_table(
        f"plan {new.kind} #{new.id}",
        ["predicted", "value"],
        [[k, v] for k, v in figures.items()],
        caption=carbon_caption(new) or None,
    )
    if new.deployments:
        render_table(
            "Deployments",
            ["model", "variant", "resource", "instances", "quota req/s"],
            [[d.model, d.variant, d.resource, d.count, d.quota_rps] for d in new.deployments],
        )


def save_plan(store: Store, plan: Plan, output: str | Path | None) -> None:
    """Save ``plan`` in the store and write it to ``output`` as one unit: the file is written
    inside the store transaction (so it carries the plan id), and a file that cannot be
    written rolls the plan back; a failed commit removes the file again.

    Raises:
        InputError: ``output`` cannot be written (nothing saved).
    """

    written = False
    try:
        with store.transaction():
            store.save_plan(plan)
            if output is not None:
                try:
                    plan_docs.write_plan_file(plan, output)  # looked up when written
                except OSError as exc:
                    raise InputError(
                        f"cannot write plan file {output}: {exc.strerror or exc}",
                        hint="nothing was saved; write somewhere else",
                    ) from None
                written = True
    except BaseException:
        plan.id = None
        if written and output is not None:
            Path(output).unlink(missing_ok=True)
        raise


def carbon_caption(plan: Plan) -> str:
    """One line saying which carbon intensity a plan used and where it came from."""
    src = plan.extra.get("carbon_source")
    src = src if isinstance(src, dict) else {}  # a hand-edited plan file may hold anything
    value = plan.request.get("carbon_intensity")
    kind = src.get("kind")
    text = f"carbon intensity {value:g} gCO2/kWh" if isinstance(value, int | float) else ""
    if kind == "signal":
        text += (
            f" (signal {src.get('region')}, {src.get('signal_kind')}, value of "
            f"{src.get('signal_time')}{'; STALE' if src.get('stale') else ''})"
        )
    elif kind == "flag":
        text += " (--carbon-intensity)"
    elif kind == "default":
        text += " (DEFAULT: no --carbon-intensity or --region)"
    return text


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app, name="plan")
    register_llm(plan_app, save_plan=save_plan, carbon_caption=carbon_caption)
