"""``greenctl plan``: the group the planners register on, plus ``plan list`` / ``plan show``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, store_for
from greenctl.data import plan as plan_docs
from greenctl.data.errors import InputError
from greenctl.data.plan import Plan

if TYPE_CHECKING:
    from greenctl.data.store import Store

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


# -- shared by the plan commands ------------------------------------------------------------

RegionOpt = Annotated[
    str | None,
    typer.Option(
        "--region",
        "-r",
        help="Carbon intensity from this region's stored signal (see `greenctl carbon "
        "regions`) when --carbon-intensity is not given.",
    ),
]
AtOpt = Annotated[
    str | None,
    typer.Option(
        "--at", help="With --region: the signal in force at this time (ISO; default now)."
    ),
]


def check_writable(path: str | Path | None, *, option: str = "-o") -> Path | None:
    """Refuse an output file that cannot be written, before any planning or saving.

    Raises:
        InputError: the folder is missing or read-only, or the path is a folder.
    """

    if path is None:
        return None
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise InputError(f"{option} {p} is a folder", hint="name a file, e.g. plan.json")
    if not folder.is_dir():
        raise InputError(
            f"{option} {p}: folder {folder} does not exist",
            hint="create the folder first or write somewhere else",
        )
    if not os.access(folder, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise InputError(f"{option} {p} is not writable", hint="write somewhere else")
    return p


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
    src = plan.extra.get("carbon_source") or {}
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
