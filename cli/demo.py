"""``greenctl demo``: the whole loop on embedded defaults (the README's first command)."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from greenctl.cli.common import (
    JsonOpt,
    check_writable_folder,
    console,
    print_json,
    render_table,
    say,
)
from greenctl.data.store import resolve_db_path
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn


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
            help="Scenario: resnet (the default: ResNet-18/34/50, 3 req/s at p95 <= 1 s; the "
            "plan follows the grid) or tiny (tiny-s/m/l, 40 req/s at p95 <= 100 ms; faster, "
            "idle-bound: nothing to save).",
        ),
    ] = None,
    rate: Annotated[
        float | None,
        typer.Option("--rate", help="Request rate to plan for, req/s (default: the scenario's)."),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """Profile, import carbon, plan, apply, load, replan over a carbon trace, report, stop."""
    from greenctl.executor.control import demo  # numpy: not for `--help`

    check_writable_folder(out, option="--out")
    if db is not None:
        resolve_db_path(db)  # an empty --db is refused by name, not read as "none given"

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

        summary = demo.run_demo(
            out_dir=out, db=db, quick=quick, model=model, rate_rps=rate, progress=progress
        )
    if json_out:
        print_json(summary)
        return
    _render(summary, out=out, db=db)


def _render(summary: dict[str, Any], *, out: str, db: str | None) -> None:
    """The demo's story in lines that fit 80 columns: what was planned and applied, how the
    plan followed the grid, what the dispatcher measured, the saving against the
    carbon-unaware plan, and what to try next."""
    console.print()
    slo = summary.get("slo_ms")
    if summary.get("rate_note"):
        say(summary["rate_note"], highlight=False)
    say(
        f"plan {summary['plan_id']} ({summary.get('plan_deployments', '-')}) applied for "
        f"{_num(summary.get('rate_rps'))} req/s at p95 <= {_num(slo)} ms",
        highlight=False,
    )
    acts = [d["action"] for d in summary["decisions"]]
    hours, step = summary.get("hours"), summary.get("step_h")
    every = f"every {_num(step)} h " if step else ""
    period = f" over {_num(hours)} h of {summary.get('region', '-')}" if hours else ""
    say(
        f"replanned {every}{period.strip()}: "
        + ", ".join(f"{a} x{acts.count(a)}" for a in dict.fromkeys(acts)),
        highlight=False,
    )
    for c in summary.get("changes") or []:
        say(
            f"  {c['at'][11:16]} at {c['signal_g_per_kwh']:.0f} g/kWh: plan {c['plan_id']} "
            f"({c['deployments']})",
            highlight=False,
        )
    signals = [d["signal_g_per_kwh"] for d in summary["decisions"] if "signal_g_per_kwh" in d]
    if not summary.get("changes") and signals:
        say(
            f"  no change: plan {summary['plan_id']} scored best at every intensity "
            f"({min(signals):.0f}-{max(signals):.0f} g/kWh)",
            highlight=False,
        )
    measured = [summary.get("verify") or {}, *(summary.get("verified_later") or [])]
    measured = [m for m in measured if m]
    if measured:
        say(f"measured through the dispatcher (SLO p95 <= {_num(slo)} ms):", highlight=False)
    for m in measured:
        failed = int(m.get("failed") or 0)
        say(
            f"  plan {m.get('plan_id', summary['plan_id'])} {m.get('deployments', '')}: "
            f"p95 {_ms(m.get('measured_p95_ms'))} ms at {_ms(m.get('measured_rate_rps'))} "
            f"req/s (predicted {_ms(m.get('predicted_p95_ms'))})"
            + (f", {failed} unanswered" if failed else "")
            + ": ",
            ("SLO met", "green") if m.get("meets_slo") else ("SLO missed", "red"),
            highlight=False,
        )
    s = summary["savings"]
    render_table(
        f"Against the carbon-unaware plan {summary['baseline_id']} "
        f"({summary.get('baseline_deployments', 'most accurate')}), "
        f"{s['period']['hours']:.0f} h of {s['region']}",
        ["metric", "greenctl", "baseline", "saved", "saved %"],
        # the measured runs are the lines above; the rest is modeled
        [r for r in summary["savings_table"] if not str(r[0]).startswith("verified runs")],
        caption=f"modeled: {_energy_source(summary)}, plans, carbon trace",
    )
    _verdict(summary, measured)
    alt = summary.get("lowest_carbon") or {}
    less = alt.get("carbon_per_request_less_pct")
    used = summary.get("deployments_used") or [alt.get("plan_deployments")]
    if alt and alt.get("deployments") not in used and isinstance(less, int | float):
        say(
            f"not used: {alt['deployments']}, the lowest-carbon plan for this rate and SLO, "
            f"emits {less:.1f}% less carbon per request at accuracy {_acc(alt.get('accuracy'))} "
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
    _next(summary, out=out, db=db)


def _verdict(summary: dict[str, Any], measured: list[dict[str, Any]]) -> None:
    """One line: the carbon saved (modeled), at what accuracy, and whether the SLO held."""
    s = summary["savings"]
    pct = (s.get("savings_pct") or {}).get("carbon_kg")
    kg = (s.get("savings") or {}).get("carbon_kg")
    ok = sum(1 for m in measured if m.get("meets_slo"))
    met = f"SLO met in {ok}/{len(measured)} measured runs" if measured else "SLO not measured"
    if not isinstance(pct, int | float) or not isinstance(kg, int | float):
        say(f"carbon saved: - ; {met}", highlight=False)
        return
    say(
        (f"greenctl saved {pct:.1f}% of the carbon", "bold green" if pct > 0 else "bold"),
        f" ({kg * 1000:.1f} g CO2, modeled) against the carbon-unaware plan at the same SLO, "
        f"at accuracy {_acc(s['greenctl'].get('accuracy'), 3)} against "
        f"{_acc(s['baseline'].get('accuracy'), 3)}; {met}",
        highlight=False,
    )


def _next(summary: dict[str, Any], *, out: str, db: str | None) -> None:
    """Commands to paste next, each line within 80 columns."""
    store = db or f"{out.rstrip('/')}/greenctl-demo.db"
    other = "tiny" if summary.get("scenario") != "tiny" else "resnet"
    why = {
        "tiny": "idle-bound: nothing to save, and why",
        "resnet": "ResNet-18/34/50: the plan follows the grid",
    }[other]
    console.print()
    say("next:", highlight=False)
    to = f"--to {summary['to']} " if summary.get("to") else ""
    for line in (
        f"  greenctl report savings --plan {summary['plan_id']} "
        f"--baseline {summary['baseline_id']} --region {summary.get('region', 'CISO')} \\",
        f"      {to}--db {store}",
        f"  greenctl demo --model {other}   # {why}",
        "  the README's tour: profile, plan, simulate, apply, loadgen, replan, ...",
        "  docs/demo.md: what the demo does; docs/index.md: every command",
    ):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def _energy_source(summary: dict[str, Any]) -> str:
    """Where the table's energy comes from: the profiles' energy methods, in words."""
    methods = summary.get("energy_methods") or ["modeled"]
    if methods == ["modeled"]:
        return "profiles (CPU energy from a power model)"
    if "modeled" not in methods:
        return f"profiles (energy measured: {', '.join(methods)})"
    return f"profiles (energy {', '.join(methods)})"


def _num(v: object) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:g}"


def _ms(v: object) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.1f}"


def _acc(v: object, digits: int = 2) -> str:
    return "-" if not isinstance(v, int | float) else f"{v:.{digits}f}"


def _short(msg: str, n: int = 60) -> str:
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def register(app: typer.Typer) -> None:
    app.command("demo")(demo_cmd)
