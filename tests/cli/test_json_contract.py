"""Every command that takes ``--json`` prints exactly one JSON document on stdout.

Run as a new user runs them: each command is a separate ``greenctl`` process (so output
written by C libraries straight to file descriptor 1, such as HiGHS's banner, is seen, which
typer's CliRunner never captures), in order, against one store, with real inputs from
the package's bundled data (``bundled:NAME``). A command that fails must leave stdout
empty (its message goes to stderr) and must not print a traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CARBON_TRACE = REPO / "data" / "datasets" / "carbon" / "clover_ciso_march.csv"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@dataclass
class Step:
    """One command of the session, its arguments and what it printed."""

    name: str
    args: list[str]
    #: True: must succeed; False: must fail; None: either (a run the machine's load decides)
    expect_ok: bool | None = True
    rc: int | None = None
    stdout: str = ""
    stderr: str = ""
    doc: object = field(default=None)


def _greenctl(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "greenctl.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )


def _run(step: Step, env: dict[str, str], cwd: Path) -> Step:
    res = _greenctl(step.args, env, cwd)
    step.rc, step.stdout, step.stderr = res.returncode, res.stdout, res.stderr
    if res.returncode == 0:
        try:
            step.doc = json.loads(res.stdout)
        except ValueError:
            step.doc = None
    return step


# Names of the steps, in order; the test below is parametrised over them so that each
# command is reported on its own.
STEP_NAMES = [
    "hw",
    "mig layouts",
    "mig synth",
    "profile import",
    "profile list",
    "profile show",
    "profile compare-emulated",
    "plan mix",
    "plan mig",
    "plan run",
    "gpulet import",
    "interference fit",
    "interference show",
    "plan glet",
    "geo convert-eglb",
    "plan geo",
    "plan list",
    "simulate",
    "export k8s",
    "export envoy",
    "carbon import",
    "carbon show",
    "carbon now",
    "carbon regions",
    "carbon fetch (no token)",
    "forecast fit",
    "forecast predict",
    "forecast list",
    "replay",
    "replay mix",
    "replay mig",
    "replay glet",
    "replay geo",
    "profile (measure)",
    "variants generate",
    "plan mix tiny",
    "apply --dry-run",
    "apply",
    "status",
    "loadgen",
    "forecast sample",
    "replan",
    "report savings",
    "report charts",
    "down",
    "profile serving",
    "demo",
    "profile llm",
    "plan llm",
]


#: a user's model module for `variants generate`: a seeded small CNN and one batch of labels
VGEN = """
import torch


def build():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Flatten(), torch.nn.Linear(4 * 8 * 8, 5)
    )


def evaluate():
    torch.manual_seed(1)
    return [(torch.rand(8, 3, 8, 8), torch.arange(8) % 5)]
"""


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Step]]:
    work = tmp_path_factory.mktemp("json-contract")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ELECTRICITYMAPS_TOKEN", "WATTTIME_TOKEN", "GREENCTL_DB")
    }
    env.update(
        {
            "GREENCTL_DB": str(work / "greenctl.db"),
            "GREENCTL_STATE_DIR": str(work / "state"),
            "XDG_DATA_HOME": str(work / "xdg"),
            "COLUMNS": "200",
            "PYTHONWARNINGS": "ignore",
        }
    )
    # InfAdapter's ResNet CPU profiles, as the README's plan mix example uses them
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "infadapter_import.py"),
            "-o",
            str(work / "resnet.csv"),
        ],
        check=True,
        capture_output=True,
        cwd=work,
    )
    steps: dict[str, Step] = {}

    def run(name: str, *args: str, ok: bool | None = True) -> Step:
        assert name in STEP_NAMES, name
        steps[name] = _run(Step(name, [*args, "--json"], ok), env, work)
        return steps[name]

    run("hw", "hw")
    run("mig layouts", "mig", "layouts", "--gpu", "A100-40GB")
    run("mig synth", "mig", "synth", "--gpu", "H100-80GB", "--family", "efficientnet")
    run("profile import", "profile", "import", str(work / "resnet.csv"))
    run("profile list", "profile", "list", "--model", "resnet")
    run("profile show", "profile", "show", "resnet50")
    # no MPS-emulated rows in this store: an error, and nothing on stdout
    run("profile compare-emulated", "profile", "compare-emulated", ok=False)
    run(
        "plan mix",
        "plan", "mix", "--model", "resnet", "--rate", "75", "--slo-ms", "750",
        "--percentile", "p99", "--budget", "cpu=14", "-o", str(work / "mix.json"),
    )  # fmt: skip
    run(
        "plan mig",
        "plan", "mig", "--gpu", "H100-80GB", "--gpus", "8", "--model", "efficientnet",
        "--rate", "300", "--carbon-intensity", "250",
    )  # fmt: skip
    # any installed kind through one command: plan mix's own request, as a file
    request = (steps["plan mix"].doc or {}).get("request") or {}
    (work / "request.json").write_text(json.dumps(request))
    run("plan run", "plan", "run", "--kind", "mix", "--request", str(work / "request.json"))
    # InfAdapter's resnet family is in the store: gpulet's data set goes beside it
    run(
        "gpulet import",
        "gpulet", "import", "bundled:gpulet", "--prefix", "gpulet",
    )  # fmt: skip
    run("interference fit", "interference", "fit")
    run("interference show", "interference", "show")
    glet_models = _gpulet_models(steps["gpulet import"].doc)
    run(
        "plan glet",
        "plan", "glet", "--model", f"{glet_models[0]}:200:50", "--model",
        f"{glet_models[1]}:100:100", "--simulate-seconds", "1",
    )  # fmt: skip
    run(
        "geo convert-eglb",
        "geo", "convert-eglb", "bundled:eglb", "-o", str(work / "eglb"),
        "--steps", "24",
    )  # fmt: skip
    run(
        "plan geo",
        "plan", "geo", "--sites", str(work / "eglb" / "sites.csv"), "--demand",
        str(work / "eglb" / "demand.csv"), "--algorithm", "all",
    )  # fmt: skip
    run("plan list", "plan", "list")
    run("simulate", "simulate", str(work / "mix.json"), "--requests", "5000")
    run("export k8s", "export", "k8s", str(work / "mix.json"), "-o", str(work / "k8s"))
    geo_id = str((steps["plan geo"].doc or {}).get("id"))
    run("export envoy", "export", "envoy", geo_id, "-o", str(work / "envoy"), "--at", "2024-01-01")
    run(
        "carbon import",
        "carbon", "import", str(CARBON_TRACE), "--format", "clover", "--region", "CISO",
    )  # fmt: skip
    run("carbon show", "carbon", "show", "--region", "CISO", "--at", "2021-03-01T06:00:00Z")
    run("carbon now", "carbon", "now", "--region", "CISO")
    run("carbon regions", "carbon", "regions")
    run(
        "carbon fetch (no token)",
        "carbon", "fetch", "--region", "CISO", "--provider", "electricitymaps",
        ok=False,
    )  # fmt: skip
    twitter = "bundled:twitter"
    run("forecast fit", "forecast", "fit", "--forecaster", "moving-max", "--trace", twitter)
    run("forecast predict", "forecast", "predict", "--trace", twitter, "--upto-minute", "600")
    run("forecast list", "forecast", "list")
    run(
        "replay",
        "replay", "--load-trace", twitter, "--model", "resnet", "--slo-ms", "750",
        "--budget", "cpu=14", "--from", "24h", "--hours", "0.1", "--region", "CISO",
        "--min-dwell", "0", "-o", str(work / "replay"),
    )  # fmt: skip
    run(
        "replay mix",
        "replay", "mix", "--model", "resnet", "--slo-ms", "750", "--budget", "cpu=14",
        "--load-trace", twitter, "--hours", "0.05", "--baseline", "none",
    )  # fmt: skip
    for kind in ("mig", "glet", "geo"):  # each kind's plan of this session, replayed briefly
        planned = str((steps[f"plan {kind}"].doc or {}).get("id"))
        window = ["--hours", "2"] if kind == "geo" else ["--load-trace", twitter, "--hours", "0.05"]
        run(f"replay {kind}", "replay", kind, "--plan", planned, *window)
    run(
        "profile (measure)",
        "profile", "--variant", "tiny-s", "--batch", "1", "--duration", "0.3",
    )  # fmt: skip
    (work / "vgen.py").write_text(VGEN)
    run(
        "variants generate",
        "variants", "generate", "--model-path", "vgen:build", "--input-shape", "3,8,8",
        "--eval", "vgen:evaluate", "--name", "vgen", "--batch", "1", "--requests", "3",
    )  # fmt: skip
    run(
        "plan mix tiny",
        "plan", "mix", "--model", "tiny", "--rate", "20", "--slo-ms", "200",
        "--budget", "cpu=1", "-o", str(work / "tiny.json"),
    )  # fmt: skip
    run("apply --dry-run", "apply", str(work / "tiny.json"), "--dry-run")
    try:
        applied = run("apply", "apply", str(work / "tiny.json"))
        doc = applied.doc if isinstance(applied.doc, dict) else {}
        url = (doc.get("dispatcher") or {}).get("url")
        run("status", "status")
        run(
            "loadgen",
            "loadgen", "--endpoint", str(url), "--model", "tiny", "--rate", "20",
            "--duration", "1",
        )  # fmt: skip
        run("forecast sample", "forecast", "sample")
        plan_id = str(_plan_id(steps["plan mix tiny"].doc))
        run("replan", "replan", "--plan", plan_id, "--region", "CISO")
        run(
            "report savings",
            "report", "savings", "--plan", plan_id, "--baseline", plan_id, "--region", "CISO",
            "--from", "2021-03-01T00:00:00Z", "--to", "2021-03-02T00:00:00Z",
        )  # fmt: skip
        run(
            "report charts",
            "report", "charts", "--plan", plan_id, "--region", "CISO", "--out",
            str(work / "charts"), "--from", "2021-03-01T00:00:00Z", "--to",
            "2021-03-02T00:00:00Z",
        )  # fmt: skip
    finally:
        run("down", "down")
    run(
        "profile serving",
        "profile", "serving", "--variant", "tiny-s", "--rate", "400", "--duration", "1",
        "--stand-in", "noop", "--path", "direct",
    )  # fmt: skip
    # the JSON contract, not the scenario: the tiny one is the fastest. On a loaded machine its
    # measured serving path alone can exceed the 100 ms SLO (exit 3); either way the contract
    # holds: one document on success, nothing on stdout on failure
    run("demo", "demo", "--quick", "--model", "tiny", "--out", str(work / "demo"), ok=None)
    _llm_steps(run, work)
    yield steps


def _llm_steps(run, work: Path) -> None:
    """An LLM tier profiled on a real engine (the tiny random Llama), then planned."""
    from greenctl.profiler.llm_models import random_llama

    random_llama(work / "llama", "tiny")
    run(
        "profile llm",
        "profile", "llm", "--engine", "transformers", "--model-dir", str(work / "llama"),
        "--name", "llama-t", "--family", "llama", "--quality", "0.5", "--concurrency", "1,2",
        "--duration", "1", "--prompt-tokens", "16", "--output-tokens", "8",
    )  # fmt: skip
    run(
        "plan llm",
        "plan", "llm", "--model", "llama", "--rate", "0.5", "--ttft-ms", "5000",
        "--tpot-ms", "1000", "--prompt-tokens", "16", "--output-tokens", "8",
        "--budget", "cpu=1",
    )  # fmt: skip


def _gpulet_models(doc: object) -> list[str]:
    """Two variant names the gpulet import stored (whatever family it put them in)."""
    names: list[str] = []
    if isinstance(doc, dict):
        names = [str(m) for m in doc.get("models") or []]
    wanted = [n for n in names if n.endswith(("resnet50", "vgg16"))]
    return sorted(wanted) if len(wanted) == 2 else ["gpulet-resnet50", "gpulet-vgg16"]


def _plan_id(doc: object) -> int | str:
    if isinstance(doc, dict) and doc.get("id") is not None:
        return doc["id"]
    return "1"


def test_every_json_command_is_listed():
    """A new command that takes --json must join this contract test."""
    import typer
    from greenctl.cli.main import app

    found: set[str] = set()

    def walk(cmd, path: list[str]) -> None:
        if any("--json" in getattr(p, "opts", []) for p in cmd.params):
            found.add(" ".join(path))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    covered = {n.split(" (")[0].split(" --")[0].removesuffix(" tiny") for n in STEP_NAMES}
    assert found - covered == set()


@pytest.mark.parametrize("name", STEP_NAMES)
def test_json_is_one_document_on_stdout(session: dict[str, Step], name: str):
    step = session[name]
    where = f"greenctl {' '.join(step.args)}\n--- stderr:\n{step.stderr[-3000:]}"
    assert "Traceback (most recent call last)" not in step.stderr, where
    expect_ok = step.expect_ok if step.expect_ok is not None else step.rc != 3
    if expect_ok:
        assert step.rc == 0, where
        # the whole of stdout parses as one JSON document
        assert step.doc is not None, f"stdout is not JSON:\n{step.stdout[:2000]}\n{where}"
        assert json.loads(step.stdout) == step.doc
    else:
        assert step.rc in (1, 2, 3), where
        assert step.stdout.strip() == "", f"a failed --json command wrote to stdout: {where}"
        assert "Error:" in step.stderr, where
