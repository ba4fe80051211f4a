"""``greenctl interference fit/show``: gpulet's linear interference model."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from greenctl.cli.common import DbOpt, JsonOpt, print_json, render_table, store_for
from greenctl.data.gpulet_import import get_interference_model
from greenctl.data.limits import whole

interference_app = typer.Typer(
    no_args_is_help=True,
    help="Fit and show the interference model of co-located GPU partitions (gpulet).",
)


@interference_app.command("fit")
def interference_fit(
    test_fraction: Annotated[
        float, typer.Option("--test-fraction", help="Share of measurements held out.")
    ] = 0.2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random split.")] = 0,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Learn c1..c5 from imported co-location measurements; report held-out error; store it."""
    from greenctl.executor.control.interference import fit_and_store  # numpy: not for `--help`

    seed = whole(seed, "--seed", "seed")
    with store_for(db) as store:
        model_id, result = fit_and_store(store, test_fraction=test_fraction, seed=seed)
    doc = {"id": model_id, **result.to_dict()}
    if json_out:
        print_json(doc)
        return
    _render(doc)


@interference_app.command("show")
def interference_show(
    model_id: Annotated[int | None, typer.Argument(help="Model id (default: the newest).")] = None,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Show a stored interference model and its held-out error."""
    with store_for(db, create=False) as store:  # read-only: a missing store is not created
        doc = get_interference_model(store, model_id)
    if json_out:
        print_json(doc)
        return
    _render(doc)


def _render(doc: dict[str, Any]) -> None:
    names = doc.get("features") or ["l2_self", "l2_other", "dram_self", "dram_other", "intercept"]
    render_table(
        f"interference model {doc.get('id')}: factor = c1 L2_self + c2 L2_other + "
        "c3 DRAM_self + c4 DRAM_other + c5",
        ["coefficient", "feature", "value"],
        [
            [f"c{n + 1}", f, c]
            for n, (f, c) in enumerate(zip(names, doc["coefficients"], strict=False))
        ],
    )
    err = doc.get("errors") or {}
    render_table(
        f"held-out latency error ({doc.get('n_test')} of "
        f"{(doc.get('n_train') or 0) + (doc.get('n_test') or 0)} measurements)",
        ["statistic", "value"],
        [
            ["mean", err.get("mean")],
            ["p50", err.get("p50")],
            ["p90", err.get("p90")],
            ["p95", err.get("p95")],
            ["max", err.get("max")],
            ["share within 10.26 % (gpulet: 0.90)", err.get("within_gpulet_10_26pct")],
            ["no model (factor 1): p90", err.get("no_model_p90")],
        ],
        caption="relative error |predicted - measured| / measured of co-located latency",
    )


def register(app: typer.Typer) -> None:
    app.add_typer(interference_app, name="interference")
