"""``greenctl plan``: the group the planners register on, plus ``plan list`` / ``plan show``."""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, store_for

plan_app = typer.Typer(
    no_args_is_help=True, help="Plan configurations (mix, mig, glet, geo) and list saved plans."
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
    with store_for(db) as store:
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
    with store_for(db) as store:
        plan = store.get_plan(plan_id)
    print_json(plan.to_dict())


def register(app: typer.Typer) -> None:
    app.add_typer(plan_app, name="plan")
