"""``greenctl replay mix|mig|glet|geo``: one subcommand per kind with its own options, the
shared options on either side of its name, and ``replay --kind K`` as ``replay K``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from greenctl.cli.main import app
from greenctl.cli.replay import ReplayGroup
from typer.main import get_command

GLET = ["--model", "resnet50:4:25", "--model", "vgg16:3:30", "--model", "inception:2:40"]


def _arrange(*args: str) -> list[str]:
    root: Any = get_command(app)
    group = root.get_command(root.context_class(root), "replay")
    assert isinstance(group, ReplayGroup)
    return group.arrange(group.context_class(group), list(args))


@pytest.mark.parametrize(
    ("given", "arranged"),
    [
        # no subcommand and no --kind: mix
        ((), ["mix"]),
        (("--load-trace", "t.txt", "--model", "resnet"),
         ["--load-trace", "t.txt", "mix", "--model", "resnet"]),
        # --kind K names the subcommand, in either spelling
        (("--kind", "glet", "--every", "5m", "--max-gpus", "2"),
         ["--every", "5m", "glet", "--max-gpus", "2"]),
        (("--kind=geo", "--sites", "s.csv"), ["geo", "--sites", "s.csv"]),
        # shared options after the subcommand move in front of it, short ones included
        (("mig", "--gpu", "A100-40GB", "-rCISO", "-o", "out", "--json"),
         ["-rCISO", "-o", "out", "--json", "mig", "--gpu", "A100-40GB"]),
        # an option's value that spells a kind is a value, not the subcommand
        (("--region", "mix", "--model", "glet", "mig"),
         ["--region", "mix", "mig", "--model", "glet"]),
        # --help: the subcommand's when one is named, else the group's (listing them)
        (("glet", "--help"), ["glet", "--help"]),
        (("--kind", "geo", "--help"), ["geo", "--help"]),
        (("--help", "--model", "resnet"), ["--help"]),
        # after --, everything is the subcommand's
        (("mix", "--", "--json"), ["mix", "--", "--json"]),
    ],
)  # fmt: skip
def test_the_arguments_are_arranged_as_shared_then_kind_then_its_own(given, arranged):
    assert _arrange(*given) == arranged


def test_replay_help_lists_the_subcommands_and_the_shared_options(cli):
    r = cli("replay", "--help")
    assert r.exit_code == 0, r.output
    for text in ("mix", "mig", "glet", "geo", "--load-trace", "--baseline", "--kind K"):
        assert text in r.output
    assert "--model-trace" not in r.output and "--sites" not in r.output


@pytest.mark.parametrize(
    ("kind", "own", "others"),
    [
        ("mix", ["--slo-ms", "--budget", "--vpa-variant"], ["--gpus", "--model-trace"]),
        ("mig", ["--gpu", "--gpus", "--lambda"], ["--budget", "--sites"]),
        ("glet", ["--model-trace", "--max-gpus", "--gpu-power-w"], ["--gpus", "--budget"]),
        ("geo", ["--sites", "--demand", "--mu-carbon"], ["--model", "--max-gpus"]),
    ],
)
def test_each_subcommand_lists_its_own_options(cli, kind, own, others):
    for argv in (["replay", kind, "--help"], ["replay", "--kind", kind, "--help"]):
        r = cli(*argv)
        assert r.exit_code == 0, r.output
        assert all(o in r.output for o in own), r.output
        assert not any(o in r.output for o in others), r.output
        assert "--carbon-trace" not in r.output  # the shared options are replay's own


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--kind", "glet", "--sites", "s.csv"], "--sites is an option of replay geo"),
        (["geo", "--budget", "cpu=2"], "--budget is an option of replay mix"),
        (["--plan", "3", "--model-trace", "a=b.txt"], "--model-trace is an option of replay glet"),
        (["--kind", "tpu"], "--kind tpu: replay takes mix, mig, glet, geo or llm"),
        (["glet", "--kind", "geo"], "disagree"),
        (["--kind"], "requires an argument"),
    ],
)
def test_a_bad_kind_or_another_kinds_option_exits_2_before_any_work(cli, db_path, argv, said):
    r = cli("replay", *argv)
    assert r.exit_code == 2, r.output
    assert said in " ".join(r.output.split()), r.output
    assert "Traceback" not in r.output
    assert not db_path.exists()
    if said != "requires an argument":  # greenctl's own refusals: the one Error: line
        assert r.output.lstrip().startswith("Error:"), r.output


@pytest.mark.parametrize(
    "argv",
    [
        ["--spec", "bundled:nosuch"],
        ["--kind", "glet", "--spec", "bundled:nosuch"],
        ["--kind", "geo", "--sites", "bundled:nosuch"],
        ["geo", "--demand", "bundled:nosuch"],
        ["mig", "--load-trace", "bundled:nosuch"],
    ],
)
def test_the_alias_and_the_subcommand_refuse_an_unknown_bundled_name(cli, db_path, argv):
    r = cli("replay", *argv)
    assert r.exit_code == 2, r.output
    assert "unknown bundled data set 'bundled:nosuch'" in r.output
    assert not db_path.exists()


def test_the_subcommand_and_the_alias_replay_alike(gpulet, cli, tmp_path: Path):
    """The same glet replay, the shared options on either side, by name and by --kind."""
    trace = tmp_path / "step.txt"
    trace.write_text(" ".join(["100"] * 240 + ["900"] * 240) + "\n")
    shared = ["--load-trace", str(trace), "--min-dwell", "0", "--every", "2m", "--json"]
    runs = [
        cli("replay", "glet", *GLET, *shared),
        cli("replay", *shared, "glet", *GLET),
        cli("replay", "--kind", "glet", *shared[:2], *GLET, *shared[2:]),
    ]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    docs = [json.loads(r.stdout) for r in runs]
    assert docs[0]["meta"]["kind"] == "glet" and docs[0]["meta"]["intervals"] == 4
    assert docs[1]["summary"] == docs[0]["summary"] == docs[2]["summary"]
