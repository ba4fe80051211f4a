"""The ``greenctl`` command: root app, command registration, error mapping."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import version
from typing import Annotated, Any

import typer
from greenctl.cli.common import ROOT_DB, err_console
from greenctl.data.errors import GreenctlError
from rich.text import Text
from typer.core import TyperGroup


class GreenctlGroup(TyperGroup):
    """Maps every GreenctlError raised below it to ``Error: ...`` and its exit code."""

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        try:
            return super().invoke(ctx)
        except GreenctlError as exc:
            # the message quotes user text (names, paths, values): print it as it is, never
            # as rich markup ([red]) or emoji codes (:abc:)
            err_console.print(
                Text.assemble(("Error:", "bold red"), " ", str(exc)),
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


app = typer.Typer(
    name="greenctl",
    cls=GreenctlGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
    help="Carbon-aware planning and serving for ML inference on CPUs and NVIDIA GPUs.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"greenctl {version('greenctl')}")
        raise typer.Exit()


@app.callback()
def root(
    db: Annotated[
        str | None,
        # no envvar here: GREENCTL_DB is read when the store opens, after every --db flag
        # (the command's own, then this one), so that a flag always wins over the environment
        typer.Option(
            "--db",
            help="Path of the SQLite store for every command (default: $GREENCTL_DB, else the "
            "user's data directory); a command's own --db wins.",
        ),
    ] = None,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """greenctl: profile, plan, simulate, apply, replan and report carbon-aware inference."""
    ROOT_DB.set(db)


# Command modules, each registering its commands on `app` (or a sub-app) through
# `register(app)`. One line per module; modules import their heavy dependencies lazily.
COMMAND_MODULES = [
    "greenctl.cli.plan_geo",
    "greenctl.cli.apply",
    "greenctl.cli.plan",
    "greenctl.cli.profile",
    "greenctl.cli.simulate",
    "greenctl.cli.plan_glet",
    "greenctl.cli.interference",
    "greenctl.cli.gpulet",
    "greenctl.cli.hw",
    "greenctl.cli.profile_io",
    "greenctl.cli.serving",
    "greenctl.cli.export",
    "greenctl.cli.carbon",
    "greenctl.cli.forecast",
    "greenctl.cli.report",
    "greenctl.cli.replan",
    "greenctl.cli.replay",
    "greenctl.cli.demo",
    "greenctl.cli.mig",
    "greenctl.cli.plan_mig",
    "greenctl.cli.plan_mix",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(app)


_register()


def main() -> None:
    """Console-script entry point."""
    sys.exit(app(prog_name="greenctl", standalone_mode=True) or 0)


if __name__ == "__main__":
    main()
