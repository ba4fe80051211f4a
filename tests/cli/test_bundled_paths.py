"""Every command that takes an input file or folder also takes ``bundled:NAME``.

One parser (``cli.common.input_path``) resolves the names before a command runs: the test
finds every option using it, refuses an unknown name on each (exit 2, every name listed,
nothing done) and runs several commands on the bundled data.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from greenctl.cli.common import input_path, input_path_str
from greenctl.cli.main import app
from greenctl.data import bundled

# (command, parameter, how it is given) of each input that takes a file or folder to read.
INPUTS = {
    ("apply", "plan_file", None), ("loadgen", "trace", "--trace"),
    ("simulate", "plan_file", None), ("simulate", "trace", "--trace"),
    ("carbon import", "file", None), ("gpulet import", "directory", None),
    ("profile import", "file", None), ("geo convert-eglb", "src_dir", None),
    ("plan geo", "sites", "--sites"), ("plan geo", "demand", "--demand"),
    ("plan geo", "routes", "--routes"), ("plan mix", "spec", "--spec"),
    ("plan glet", "spec", "--spec"), ("plan mig", "current", "--current"),
    ("plan run", "request", "--request"), ("plan llm", "trace", "--trace"),
    ("forecast fit", "trace", "--trace"), ("forecast predict", "trace", "--trace"),
    ("replay", "load_trace", "--load-trace"), ("replay", "carbon_trace", "--carbon-trace"),
    ("replay mix", "spec", "--spec"), ("replay glet", "spec", "--spec"),
    ("replay geo", "sites", "--sites"), ("replay geo", "demand", "--demand"),
    ("replay geo", "routes", "--routes"),
}  # fmt: skip


def _commands(t: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, callback) of every command, and of every group's callback (its options)."""
    for c in t.registered_commands:
        yield prefix + (c.name or c.callback.__name__), c.callback
    for g in t.registered_groups:
        name = g.name or g.typer_instance.info.name
        group = g.typer_instance.registered_callback
        if group is not None and group.callback is not None:
            yield prefix + name, group.callback
        yield from _commands(g.typer_instance, f"{prefix}{name} ")


def _bundled_inputs() -> set[tuple[str, str]]:
    """(command, parameter) of every typer parameter declared with the bundled-name parser."""
    found = set()
    for name, callback in _commands(app):
        for param, hint in typing.get_type_hints(callback, include_extras=True).items():
            for info in getattr(hint, "__metadata__", ()):
                if getattr(info, "parser", None) in (input_path, input_path_str):
                    found.add((name, param))
    return found


def test_every_input_path_resolves_bundled_names() -> None:
    assert _bundled_inputs() == {(c, p) for c, p, _ in INPUTS}


@pytest.mark.parametrize(("command", "param", "option"), sorted(INPUTS, key=str))
def test_an_unknown_bundled_name_is_refused_before_any_work(cli, db_path, command, param, option):
    given = ["bundled:nosuch"] if option is None else [option, "bundled:nosuch"]
    argv = [*command.split(), *given]
    r = cli(*argv)
    assert r.exit_code == 2, r.output
    assert "unknown bundled data set 'bundled:nosuch'" in r.output
    assert all(n in r.output for n in bundled.names())
    assert "Traceback" not in r.output
    assert not db_path.exists()  # refused while parsing: no store opened


def test_commands_run_on_bundled_data(cli, store, tmp_path: Path) -> None:
    r = cli("carbon", "import", "bundled:clover-eso-march", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["format"] == "clover" and doc["regions"] == ["ESO"] and doc["rows"] == 49
    r = cli("carbon", "import", "bundled:eglb-texas", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["regions"] == ["Texas"]

    r = cli("gpulet", "import", "bundled:gpulet", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["profiles"] == 420

    out = tmp_path / "eglb"
    r = cli("geo", "convert-eglb", "bundled:eglb", "-o", out, "--steps", "24")
    assert r.exit_code == 0, r.output
    assert (out / "sites.csv").is_file() and (out / "demand.csv").is_file()

    r = cli("forecast", "predict", "--forecaster", "last", "--trace", "bundled:twitter",
            "--upto-minute", "60", "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
