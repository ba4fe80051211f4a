"""``greenctl interference fit/show``: gpulet's interference model with per-point self terms."""

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


MODEL_KIND_LINEAR = "linear-l2-dram"  # a stored model's kind when it does not say

#: what each of gpulet's coefficients multiplies, and when the model uses it
_LINEAR = (
    ("c1", "L2 use, this model", "unmeasured points"),
    ("c2", "L2 use, co-runner", "always"),
    ("c3", "DRAM use, this model", "unmeasured points"),
    ("c4", "DRAM use, co-runner", "always"),
    ("c5", "1", "unmeasured points"),
)


def _render(doc: dict[str, Any]) -> None:
    """A fitted model as three tables: gpulet's coefficients, the modeled self term of each
    measured point (model and batch by partition), the held-out error beside the baselines."""
    from greenctl.planner.core.interference import model_terms  # numpy: not for `--help`

    linear, points = model_terms(doc)
    per_point = bool(points)
    formula = (
        "modeled factor = s(point) + c2 L2_other + c4 DRAM_other (at least 1); s(point): a "
        "measured point's fitted term, else c1 L2_self + c3 DRAM_self + c5"
        if per_point
        else "modeled factor = c1 L2_self + c2 L2_other + c3 DRAM_self + c4 DRAM_other + c5 "
        "(at least 1)"
    )
    render_table(
        f"interference model {doc.get('id')} ({doc.get('kind') or MODEL_KIND_LINEAR}): the "
        "modeled slowdown of a model's latency beside a co-runner on the rest of the GPU",
        ["c", "multiplies (use: 0..1)", "value", "used for"],
        [
            [c, what, f"{v:+.4f}", use if per_point else "always"]
            for (c, what, use), v in zip(_LINEAR, linear, strict=False)
        ],
        caption=formula,
    )
    if per_point:
        _render_points(linear, points)
    _render_errors(doc)


def _render_points(linear: tuple[float, ...], points: list[Any]) -> None:
    """The self terms as a grid (model and batch by partition) when every point is named
    ``MODEL:bB:pP``, else one row per point."""
    _, c2, _, c4, _ = (list(linear) + [0.0] * 5)[:5]
    other = [c2 * p.l2_self + c4 * p.dram_self for p in points]  # each point as a co-runner
    caption = (
        f"modeled factor beside a co-runner = s + its term, which spans {min(other):+.3f} to "
        f"{max(other):+.3f} over the measured points as co-runners; each point's solo L2 and "
        "DRAM use (its lookup key): --json"
    )
    if any(p.batch is None for p in points):
        render_table(
            f"modeled self term s of {len(points)} measured points",
            ["point", "s"],
            [[p.point, f"{p.term:.3f}"] for p in points],
            caption=caption,
        )
        return
    parts = sorted({p.partition for p in points})
    grid: dict[tuple[str, int], dict[int, float]] = {}
    for p in points:
        grid.setdefault((p.model, p.batch), {})[p.partition] = p.term
    render_table(
        f"modeled self term s of {len(points)} measured points, by partition (% of the GPU)",
        ["model", "batch", *[f"{q} %" for q in parts]],
        [
            [model, batch, *[f"{row[q]:.3f}" if q in row else "-" for q in parts]]
            for (model, batch), row in sorted(grid.items())
        ],
        caption=caption,
    )


def _render_errors(doc: dict[str, Any]) -> None:
    """Held-out error of the modeled latency, beside gpulet's five-coefficient form and no
    model at all on the same split, and the measured slowdown it is fitted to."""
    err = doc.get("errors") or {}

    def pct(key: str) -> str:
        v = err.get(key)
        return "-" if v is None else f"{float(v) * 100:.1f} %"

    n_test, n_train = doc.get("n_test") or 0, doc.get("n_train") or 0
    measured = doc.get("measured_factor") or err.get("measured_factor") or {}
    caption = (
        "error: |modeled - measured| / measured co-located latency; gpulet form: its five "
        "coefficients by least squares, same split; no model: factor 1"
    )
    if measured.get("mean") is not None:
        caption += (
            f"; measured slowdown over all co-locations: mean {measured['mean']:.2f}x, "
            f"p90 {measured.get('p90', float('nan')):.2f}x"
        )
    render_table(
        f"held-out error of the modeled latency: {n_test:,} of {n_train + n_test:,} measured "
        "co-locations (gpulet: 90 % within 10.26 %)",
        ["statistic", "this model", "gpulet form", "no model"],
        [
            [
                "share within 10.26 %",
                pct("within_gpulet_10_26pct"),
                pct("linear_within_gpulet_10_26pct"),
                pct("no_model_within_gpulet_10_26pct"),
            ],
            ["p90 error", pct("p90"), pct("linear_p90"), pct("no_model_p90")],
            ["p50 error", pct("p50"), "-", "-"],
            ["p95 error", pct("p95"), "-", "-"],
            ["max error", pct("max"), "-", "-"],
            ["mean error", pct("mean"), "-", "-"],
        ],
        caption=caption,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(interference_app, name="interference")
