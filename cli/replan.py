"""``greenctl replan`` (the cron entry point) and ``greenctl cron install/remove``."""

from __future__ import annotations

import difflib
import math
import shlex
from typing import Annotated, Any

import typer
from greenctl.cli.common import db_option, print_json, render_table, say, store_for
from greenctl.cli.options import AtOpt, DbOpt, JsonOpt, RegionOpt
from greenctl.data import reports
from greenctl.data.errors import InputError, shown
from greenctl.data.limits import BOUNDS
from greenctl.data.loop_state import (
    REPLAN_MARGIN,
    REPLAN_MIN_DWELL,
    REPLAN_THRESHOLD,
    lineage_key,
)
from greenctl.data.store import resolve_db_path

try:
    from typer._click.exceptions import UsageError  # typer >= 0.23 vendors click
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click.exceptions import UsageError  # type: ignore[assignment,no-redef]

cron_app = typer.Typer(
    no_args_is_help=True,
    help="Install or remove the crontab line that runs a greenctl command on a schedule.",
)


def replan_cmd(
    plan: Annotated[
        str | None,
        typer.Option("--plan", help="Plan id in the store, or a plan JSON file, to keep current."),
    ] = None,
    apply: Annotated[
        bool, typer.Option("--apply", help="Apply the new plan when it is worth it.")
    ] = False,
    threshold: Annotated[
        float,
        typer.Option(
            "--threshold",
            help="Act when the carbon intensity moved by more than this "
            "fraction since the running plan was chosen (Clover's trigger); for a glet plan, "
            "when it saves at least one GPU and more than this fraction of its GPUs (or the "
            "running layout cannot carry the load).",
        ),
    ] = REPLAN_THRESHOLD,
    margin: Annotated[
        float,
        typer.Option(
            "--margin", help="...or when the objective improves by more than this fraction."
        ),
    ] = REPLAN_MARGIN,
    min_dwell: Annotated[
        str,
        typer.Option(
            "--min-dwell",
            help="No change sooner than this after the last one (e.g. 30m, 1h), unless the "
            "running plan cannot carry the forecast load.",
        ),
    ] = REPLAN_MIN_DWELL,
    region: RegionOpt = None,
    forecaster: Annotated[
        str | None,
        typer.Option(
            "--forecaster",
            "-f",
            help="Forecast the load with this forecaster "
            "(a saved name, or last | moving-max | seasonal-naive).",
        ),
    ] = None,
    at: AtOpt = None,
    rate: Annotated[
        list[str] | None,
        typer.Option(
            "--rate",
            help="MODEL=RPS: plan this model (or family) for this rate, over the forecast "
            "(repeat for several).",
        ),
    ] = None,
    history: Annotated[
        bool, typer.Option("--history", help="List the decision records instead of replanning.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", help="With --history: the last N.")] = 50,
    db: DbOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Replan with the latest carbon signal and load forecast; apply if worth it."""
    from greenctl.executor.control import replan  # the executor: not for `--help`

    if history:
        _show_history(db, plan=plan, region=region, limit=limit, json_out=json_out)
        return
    if plan is None:
        raise InputError("--plan ID|FILE is required", hint="or pass --history to list decisions")
    replan.check_replan_limits(threshold, margin)  # before the store is opened
    dwell = replan.parse_duration(min_dwell)
    rates = _parse_rates(rate)
    from greenctl.executor.deploy.georouter import replan_if_routed

    with store_for(db) as store:
        routed = replan_if_routed(store, plan=plan, at=at)  # a geo plan its router routes
        if routed is not None:
            _print_geo_replan(routed, json_out=json_out)
            return
        d = replan.replan_once(
            store, plan=plan, apply=apply, threshold=threshold, margin=margin,
            min_dwell_s=dwell, region=region, forecaster=forecaster, at=at, rates=rates,
        )  # fmt: skip
    if json_out:
        print_json(d)
        return
    colour = {"apply": "green", "propose": "yellow", "keep": "cyan", "hold": "cyan"}.get(
        d["action"], "red"
    )
    say((d["action"], f"bold {colour}"), f" (decision {d['id']}): {d['reason']}", highlight=False)


def _show_history(
    db: str | None, *, plan: str | None, region: str | None, limit: int, json_out: bool
) -> None:
    """List the decision records (of one plan's lineage, or all)."""
    if limit < 1:
        raise InputError(f"--limit {limit} is not a count >= 1", hint="for example --limit 20")
    lineage = None
    if plan is not None:
        lineage = lineage_key(plan)
    with store_for(db, create=False) as store:  # read-only: nothing created or written
        rows = reports.decisions(store, lineage=lineage, region=region, limit=limit)
    if json_out:
        print_json(rows)
        return
    render_table(
        "Replanning decisions",
        ["id", "at", "g/kWh", "moved", "objective old -> new", "action", "plan", "reason"],
        [
            [
                r["id"], r["at"], r["signal_g_per_kwh"],
                None if r["signal_change"] is None else f"{r['signal_change'] * 100:.1f}%",
                _objectives(r), r["action"], r["new_plan_id"] or r["running_plan_id"],
                r["reason"],
            ]
            for r in rows
        ],
    )  # fmt: skip


def _print_geo_replan(d: dict[str, object], *, json_out: bool) -> None:
    if json_out:
        print_json(d)
        return
    what = f"plan {d['new_plan_id']}" if d["changed"] else "the same fractions"
    online = d.get("online")
    if isinstance(online, dict):
        what = f"{'new' if d['changed'] else 'the same'} fractions from eGLB's online step"
    say(
        ("update-router", "bold green"),
        f" (decision {d.get('decision_id')}): the geo router at {d['router_url']} routes "
        f"{what} in slot {d['slot']} ({d['slot_time']}), no restart",
        highlight=False,
    )


def _parse_rates(items: list[str] | None) -> dict[str, float]:
    """``--rate MODEL=RPS`` options -> ``{model: rps}``."""
    out: dict[str, float] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            rps = float(value) if sep else math.nan
        except ValueError:
            rps = math.nan
        if not name or not math.isfinite(rps) or not 0 <= rps <= BOUNDS["rate_rps"].high:
            raise InputError(
                f"--rate {shown(item)} is not MODEL=RPS with a rate >= 0 and "
                f"<= {BOUNDS['rate_rps'].high:g}",
                hint="for example --rate resnet50=400 (a model of the plan, or its family)",
            )
        if name in out:
            raise InputError(f"--rate names {name} twice", hint="give each model once")
        out[name] = rps
    return out


def _objectives(r: dict[str, object]) -> str:
    def f(v: object) -> str:
        return "-" if not isinstance(v, int | float) else f"{v:.4g}"

    return f"{f(r['old_objective'])} -> {f(r['new_objective'])}"


def cron_install_cmd(
    ctx: typer.Context,
    every: Annotated[
        str,
        typer.Option(
            "--every",
            help="An interval that divides the hour or the day: 1, 2, 3, 4, 5, 6, 10, 12, 15, "
            "20 or 30m; 1, 2, 3, 4, 6, 8 or 12h; or 1d.",
        ),
    ] = "15m",
    name: Annotated[
        str, typer.Option("--name", help="Tag of the line (one line per tag).")
    ] = "replan",
    log: Annotated[
        str | None, typer.Option("--log", help="Append the output here (default beside the db).")
    ] = None,
    print_only: Annotated[
        bool, typer.Option("--print", help="Print the crontab line; install nothing.")
    ] = False,
    crontab_file: Annotated[
        str | None,
        typer.Option("--crontab-file", help="Edit this file instead of the user's crontab."),
    ] = None,
    db: DbOpt = None,
) -> None:
    """Install a crontab line running `greenctl ARGS...` (write the command after `--`)."""
    from greenctl.executor.control import cron  # the executor: not for `--help`

    args = list(ctx.args)
    if args and args[0] == "greenctl":
        args = args[1:]
    if args:
        check_greenctl_args(args, root=ctx.find_root().command)
    db_path = resolve_db_path(db_option(db)).resolve()
    line = cron.cron_line(args, every=every, db_path=db_path, log=log, name=name)
    if print_only:
        typer.echo(line)
        return
    where = cron.cron_install(line, name=name, crontab_file=crontab_file)
    say(f"installed in {where}:\n{line}", highlight=False, soft_wrap=True)


def check_greenctl_args(args: list[str], *, root: Any = None) -> None:
    """Parse ``greenctl ARGS`` with greenctl's own command tree (``root``, the click command
    of the running app, else built from it), running nothing, so a misspelt or unknown
    command or option is refused when the line is installed rather than failing every N
    minutes in a log nobody reads.

    Raises:
        InputError: the arguments do not parse, with a "did you mean" hint where one is close.
    """
    shown = f"greenctl {shlex.join(args)}"
    for token in args:
        if token in ("--help", "--version"):  # eager options would print while parsing
            raise InputError(
                f"cannot schedule `{shown}`: {token} only prints and exits",
                hint="schedule a command that does work, e.g. `-- replan --plan 3 --apply`",
            )
    if root is None:
        from greenctl.cli.main import app  # main imports this module: a cycle at the top

        root = typer.main.get_command(app)
    cmd = root
    name, rest, parent = "greenctl", list(args), None
    try:
        while True:
            commands = getattr(cmd, "commands", None)
            if commands is not None and not rest:  # (a group without arguments prints help)
                path = " ".join([*(parent.command_path.split() if parent else []), name])
                raise InputError(
                    f"cannot schedule `{shown}`: `{path}` needs a command",
                    hint="one of: " + ", ".join(sorted(commands)),
                )
            ctx = cmd.make_context(name, rest, parent=parent, resilient_parsing=False)
            if commands is None:  # a leaf command: parsed, options and arguments checked
                return
            rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
            if not rest:
                raise InputError(
                    f"cannot schedule `{shown}`: `{ctx.command_path}` needs a command",
                    hint="one of: " + ", ".join(sorted(commands)),
                )
            sub = commands.get(rest[0])
            if sub is None:
                close = difflib.get_close_matches(rest[0], list(commands), n=3)
                raise InputError(
                    f"cannot schedule `{shown}`: `{ctx.command_path}` has no command {rest[0]!r}",
                    hint=(
                        "did you mean " + " or ".join(close) + "?"
                        if close
                        else "one of: " + ", ".join(sorted(commands))
                    ),
                )
            name, rest, parent, cmd = rest[0], rest[1:], ctx, sub
    except UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "greenctl"
        possible = sorted(getattr(exc, "possibilities", None) or [])
        raise InputError(
            f"cannot schedule `{shown}`: {exc.message if possible else exc.format_message()}",
            hint=(
                "did you mean " + " or ".join(possible) + "?"
                if possible
                else f"see `{where} --help`"
            ),
        ) from None


def cron_remove_cmd(
    name: Annotated[str, typer.Option("--name", help="Tag of the line to remove.")] = "replan",
    crontab_file: Annotated[
        str | None,
        typer.Option("--crontab-file", help="Edit this file instead of the user's crontab."),
    ] = None,
) -> None:
    """Remove the crontab line installed with `greenctl cron install --name NAME`."""
    from greenctl.executor.control import cron  # the executor: not for `--help`

    removed = cron.cron_remove(name=name, crontab_file=crontab_file)
    if removed:
        say(f"removed {removed} line(s) tagged greenctl:{name}")
    else:
        say(f"no crontab line tagged greenctl:{name}", err=True)


def register(app: typer.Typer) -> None:
    app.command("replan")(replan_cmd)
    cron_app.command(
        "install",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(cron_install_cmd)
    cron_app.command("remove")(cron_remove_cmd)
    app.add_typer(cron_app, name="cron")
