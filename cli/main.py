"""The ``greenctl`` command: root app, command registration, error mapping."""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import version
from typing import Annotated, Any

import typer
from greenctl.cli.common import ROOT_DB, err_console
from greenctl.data.errors import GreenctlError, printable
from rich.text import Text
from typer.core import TyperGroup

try:  # typer >= 0.23 vendors click: its usage errors are its own classes
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import exceptions as click_errors  # type: ignore[no-redef]


def print_error(message: str) -> None:
    """The one ``Error: ...`` line (and its ``hint:`` line) on stderr.

    The message quotes user text (names, paths, values): it is printed as it is, never as
    rich markup (``[red]``) or emoji codes (``:abc:``), with every non-printable character
    escaped as a last guard, so that an argument never drives the terminal.
    """
    err_console.print(
        Text.assemble(("Error:", "bold red"), " ", printable(message, keep_newlines=True)),
        highlight=False,
        soft_wrap=True,
    )


def _command_words(group: Any, args: list[str]) -> list[str]:
    """The subcommand names leading ``args`` (``["plan", "mix"]``), walked down from
    ``group``: where a usage error that knows no context was raised."""
    words: list[str] = []
    cmd = group
    for arg in args:
        sub = getattr(cmd, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        cmd = sub
    return words


def _usage_error(exc: click_errors.ClickException, words: list[str]) -> typer.Exit:
    """click's usage error (bad value type, missing or unknown option, bad choice) as
    greenctl's Error line, with the failing command's help as the hint; exit 2."""
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        words = ctx.command_path.split()[1:]
    where = " ".join(["greenctl", *words])
    print_error(f"{exc.format_message()}\n  hint: see `{where} --help`")
    usage = isinstance(exc, click_errors.UsageError | click_errors.FileError)
    return typer.Exit(2 if usage else exc.exit_code)


class GreenctlGroup(TyperGroup):
    """Maps every GreenctlError raised below it, and click's usage errors, to
    ``Error: ...`` and its exit code."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        """The root's own options parsed (``greenctl --bogus``: a usage error, exit 2)."""
        try:
            return super().make_context(*args, **kwargs)
        except click_errors.NoArgsIsHelpError:
            raise
        except click_errors.ClickException as exc:
            raise _usage_error(exc, []) from None

    def invoke(self, ctx: Any) -> Any:  # typer's vendored click.Context
        words = _command_words(self, [*getattr(ctx, "_protected_args", []), *ctx.args])
        try:
            return super().invoke(ctx)
        except GreenctlError as exc:
            print_error(str(exc))
            raise typer.Exit(exc.exit_code) from None
        except click_errors.NoArgsIsHelpError:
            raise
        except click_errors.ClickException as exc:
            raise _usage_error(exc, words) from None
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
    "greenctl.cli.variants",
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
