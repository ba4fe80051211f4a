"""Options several commands share are declared once (cli/options) and read the same."""

from __future__ import annotations

import ast
from pathlib import Path

import greenctl.cli as cli_pkg

SHARED = {"RegionOpt", "RequiredRegionOpt", "AtOpt", "FromOpt", "ToOpt", "RateOpt"}
#: declarations of a shared name made again in a command module: none (a command whose help
#: must say more imports the shared one, whose help says it for every command)
KNOWN: set[str] = set()


def test_shared_option_types_are_declared_only_in_cli_options():
    """A command module that needs --region, --at, --from, --to or --rate as the shared
    option imports it; declaring one of those names again would fork its help text."""
    folder = Path(cli_pkg.__file__).parent
    again = []
    for path in sorted(folder.glob("*.py")):
        if path.name == "options.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign):
                names = {t.id for t in node.targets if isinstance(t, ast.Name)}
                again += [f"{path.name}: {n}" for n in names & SHARED]
    assert set(again) <= KNOWN, sorted(set(again) - KNOWN)


def test_shared_options_say_the_same_in_every_command(cli):
    seen = {}
    for command in (("carbon", "show"), ("report", "savings")):
        out = cli(*command, "--help").output
        assert "--region" in out, command
        seen[command] = "Carbon signal region" in " ".join(out.split())
    assert all(seen.values()), seen
