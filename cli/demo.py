"""``greenctl demo``: the whole loop on embedded defaults (the README's first command)."""

from __future__ import annotations

from typing import Annotated

import typer
from greenctl.cli.common import JsonOpt, console, print_json, render_table, say


def demo_cmd(
    quick: Annotated[
        bool, typer.Option("--quick", help="Shorter measurements, load and replay (for CI).")
    ] = False,
    out: Annotated[
        str, typer.Option("--out", help="Folder for the report, charts and the demo store.")
    ] = "greenctl-report",
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Use this store instead of a fresh one in --out (not "
            "$GREENCTL_DB: the demo keeps your store clean).",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Scenario: tiny (the default: tiny-s/m/l, 40 req/s at p95 <= 100 ms; idle power "
            "dominates, nothing to save) or resnet (ResNet-18/34/50, 5 req/s at p95 <= 1 s, "
            "where the plan follows the grid; slower).",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Request rate to plan for, req/s (default: the scenario's)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Profile, import carbon, plan, apply, load, replan over a carbon trace, report, stop."""
    from greenctl.executor import control
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        # markup=False: a step's message quotes paths and names as they are
        TextColumn("{task.description}", style="progress.description", markup=False),
        BarColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=json_out, transient=False) as bar:
        task = bar.add_task("greenctl demo", total=1.0)
        last = {"msg": ""}

        def progress(msg: str, frac: float) -> None:
            # log each step once (inner profiling progress only moves the bar)
            step = msg.split(":")[0]
            if step != last["msg"] and not json_out:
                say(("-", "dim"), f" {msg}", highlight=False)
                last["msg"] = step
            bar.update(task, completed=frac, description=_short(msg))

        summary = control.run_demo(
            out_dir=out, db=db, quick=quick, model=model, rate_rps=rate, progress=progress
        )
    if json_out:
        print_json(summary)
        return
    acts = [d["action"] for d in summary["decisions"]]
    console.print(
        f"\nplan {summary['plan_id']} applied; {len(acts)} replanning rounds: "
        + ", ".join(f"{a} x{acts.count(a)}" for a in dict.fromkeys(acts)),
        highlight=False,
    )
    v = summary.get("verify") or {}
    if v:
        console.print(
            f"verification through the dispatcher: predicted p95 {_ms(v.get('predicted_p95_ms'))} ms "
            "(modeled: profile + measured serving path), "
            f"measured p95 {_ms(v.get('measured_p95_ms'))} ms at {_ms(v.get('measured_rate_rps'))} "
            "req/s",
            highlight=False,
        )
    for later in summary.get("verified_later") or []:
        console.print(
            f"plan {later['plan_id']} ({later['deployments']}), which the replay applied: "
            f"predicted p95 {_ms(later.get('predicted_p95_ms'))} ms, measured p95 "
            f"{_ms(later.get('measured_p95_ms'))} ms at {_ms(later.get('measured_rate_rps'))} req/s",
            highlight=False,
        )
    s = summary["savings"]
    render_table(
        f"Against the carbon-unaware most-accurate plan {summary['baseline_id']} "
        f"({s['period']['hours']:.0f} h of {s['region']})",
        ["metric", "greenctl", "baseline", "saved", "saved %"],
        summary["savings_table"],
        caption="modeled from profiles (CPU energy is modeled) and the carbon trace",
    )
    alt = summary.get("lowest_carbon") or {}
    less = alt.get("carbon_per_request_less_pct")
    if alt and not alt.get("same_as_plan") and isinstance(less, int | float):
        console.print(
            f"the lowest-carbon plan for the same rate and SLO, {alt['deployments']}, would emit "
            f"{less:.1f} % less carbon per request at accuracy {_acc(alt.get('accuracy'))} "
            f"(greenctl's {alt['plan_deployments']}: {_acc(alt.get('plan_accuracy'))}); "
            f"modeled, not applied: the {alt.get('plan_objective')} objective "
            f"(gamma {alt.get('plan_gamma')}) chose greenctl's plan over it",
            highlight=False,
        )
    say(
        f"report: {summary['out_dir']} ({len(summary['files'])} files); "
        f"stopped {summary['stopped']} processes",
        highlight=False,
    )


def _ms(v: object) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.1f}"


def _acc(v: object) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.2f}"


def _short(msg: str, n: int = 60) -> str:
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
