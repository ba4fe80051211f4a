"""Every command and group has help text, and --help works without torch or NVML."""

from __future__ import annotations

import subprocess
import sys

from greenctl.cli.main import app
from typer.main import get_command


def _walk(cmd, path: list[str]):
    # typer vendors its own click: duck-type groups instead of isinstance(click.Group)
    yield path, cmd
    if hasattr(cmd, "list_commands"):
        ctx = cmd.context_class(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            yield from _walk(sub, [*path, name])


def test_every_command_has_help(cli):
    root = get_command(app)
    seen = 0
    for path, cmd in _walk(root, []):
        assert cmd.help or cmd.short_help, f"`greenctl {' '.join(path)}` has no help text"
        result = cli(*path, "--help")
        assert result.exit_code == 0, (path, result.output)
        seen += 1
    assert seen > 3


def test_help_does_not_import_torch_or_nvml():
    code = (
        "import sys; from greenctl.cli.main import app; "
        "from typer.main import get_command; get_command(app); "
        "bad = [m for m in ('torch', 'pynvml', 'numpy', 'pandas', 'sqlite_utils', 'matplotlib', 'ray') if m in sys.modules]; "
        "print(','.join(bad)); sys.exit(1 if bad else 0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"imported at start-up: {out.stdout} {out.stderr}"


def test_unknown_plan_id_is_a_clear_error(cli, store):
    result = cli("plan", "show", "42")
    assert result.exit_code == 2
    assert "no plan with id 42" in result.output
