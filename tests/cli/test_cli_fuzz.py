"""A property-based fuzzer of the CLI: malformed files and option values, as a user types them.

Hypothesis mutates the files the commands read (a profile CSV, plan JSON documents, mix and
glet specs, a carbon signal CSV, geo site and demand CSVs) and the values of their number
options, runs the real command in-process against a copy of a small seeded store, and checks
the contract: exit 0, 2, or 3 (an infeasible plan); ``Error:`` when not 0; no traceback; a
refused command leaves the store's bytes as they were and writes no file.

Depth: ``HYPOTHESIS_PROFILE=deep`` (``just fuzz``) runs 20 times the examples of the default
``ci`` profile; both profiles are registered here under those names.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
CARBON = REPO / "data" / "datasets" / "carbon" / "clover_ciso_march.csv"

settings.register_profile("ci", max_examples=1, deadline=None)
settings.register_profile("deep", max_examples=20, deadline=None)
#: how many times the default examples each test runs (the profile's max_examples)
DEPTH = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci")).max_examples


def fuzz(examples: int) -> settings:
    """The settings of one fuzz test: ``examples`` times :data:`DEPTH`, no deadline."""
    return settings(
        max_examples=examples * DEPTH,
        deadline=None,
        derandomize=DEPTH == 1,  # the CI run is the same every time; a deep run explores
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


pytestmark = pytest.mark.timeout(300 * DEPTH)

# values at and past the edges of what a field takes, plus text that must never escape
GARBAGE = [
    "",
    " ",
    "0",
    "-1",
    "1e300",
    "1e400",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "99999999999999999999999",
    "0.5",
    "abc",
    "1,,2",
    "cpu:1",
    "mig:1g.10gb",
    "mps:101",
    "\x1b[31mred",
    "a\x00b",
    "[red]x",
    "x" * 300,
]
JSON_GARBAGE: list[Any] = [
    None,
    0,
    -1,
    1e300,
    float("nan"),
    float("inf"),
    "",
    "abc",
    [],
    {},
    [1, 2],
    {"a": 1},
    True,
    10**30,
]
NUMBER_TEXT = st.one_of(
    st.sampled_from(GARBAGE),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(10**12), max_value=10**12).map(str),
)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with ResNet profiles, the CISO carbon trace, MIG profiles, gpulet's
    measurements and an interference model; a mix and a mig plan; small geo files."""
    from greenctl.cli.main import app
    from greenctl.data.eglb_convert import convert_eglb

    root = tmp_path_factory.mktemp("cli-fuzz")
    db = root / "greenctl.db"
    runner = CliRunner()

    def ok(*args: str) -> None:
        r = runner.invoke(app, ["--db", str(db), *args], catch_exceptions=False)
        assert r.exit_code == 0, r.output

    csv_path = root / "resnet.csv"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "infadapter_import.py"), "-o", str(csv_path)],
        check=True,
        capture_output=True,
    )
    ok("profile", "import", str(csv_path))
    ok("carbon", "import", str(CARBON), "--format", "clover", "--region", "CISO")
    ok("mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet")
    ok("gpulet", "import", "bundled:gpulet", "--prefix", "g")
    ok("interference", "fit")
    ok("plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
       "--budget", "cpu=14", "-o", str(root / "mix.json"))  # fmt: skip
    ok("plan", "mig", "--gpu", "A100-40GB", "--gpus", "1", "--model", "efficientnet",
       "--rate", "10", "--carbon-intensity", "300", "-o", str(root / "mig.json"))  # fmt: skip
    convert_eglb(None, root / "geo", steps=4, routes="partial")
    (root / "mix_spec.json").write_text(
        json.dumps(
            {
                "families": [{"model": "resnet", "rate_rps": 20, "slo_ms": 750}],
                "budgets": {"cpu": 14},
                "objective": "balanced",
            }
        )
    )
    glet_models = [{"name": "g-resnet50", "rate_rps": 50, "slo_ms": 100}]
    (root / "glet_spec.json").write_text(json.dumps({"models": glet_models, "max_gpus": 2}))
    (root / "carbon.csv").write_text(
        "time,region,carbon_g_per_kwh\n2026-01-01T00:00:00Z,X,100\n2026-01-01T01:00:00Z,X,120\n"
    )
    (root / "profiles.csv").write_text(
        "variant,model,resource,batch,throughput_rps,latency_ms,accuracy\n"
        "v1,m,cpu:1,1,10,5,0.7\nv2,m,cpu:2,1,20,4,0.75\n"
    )
    return root


class Workspace:
    """A copy of the seeded store in a folder of its own, and the contract's checks."""

    def __init__(self, seeded: Path, folder: Path) -> None:
        self.seeded = seeded
        self.folder = folder
        self.db = folder / "greenctl.db"

    def run(self, argv: list[str]) -> int:
        """Run ``greenctl --db DB *argv`` and check the contract; its exit code."""
        from greenctl.cli.main import app

        shutil.copy(self.seeded / "greenctl.db", self.db)
        before = self.db.read_bytes()
        files = set(self.folder.rglob("*"))
        r = CliRunner().invoke(app, ["--db", str(self.db), *argv], catch_exceptions=True)
        where = f"greenctl {' '.join(a[:60] for a in argv)}\n{r.output[-1500:]}"
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            raise AssertionError(f"{type(r.exception).__name__}: {where}") from r.exception
        assert r.exit_code in (0, 2, 3), where
        assert "Traceback" not in r.output, where
        event(f"exit {r.exit_code}")
        if r.exit_code != 0:
            assert "Error:" in r.output, where
            assert "\x1b" not in r.stderr, f"a raw escape sequence in the message: {where}"
            assert self.db.read_bytes() == before, f"a refused command changed the store: {where}"
            new = set(self.folder.rglob("*")) - files
            assert not new, f"a refused command wrote {sorted(map(str, new))}: {where}"
        return r.exit_code


@pytest.fixture
def work(seeded: Path, tmp_path: Path) -> Workspace:
    return Workspace(seeded, tmp_path)


# -- file mutations ------------------------------------------------------------------------


@st.composite
def mutated_csv(draw: st.DrawFn, text: str) -> str:
    """``text`` (a CSV) with one to three edits: a cell replaced, a line dropped, doubled or
    cut, a column added, or the whole emptied."""
    rows = [line.split(",") for line in text.splitlines()]
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["cell", "cell", "drop", "double", "cut", "column", "empty"]))
        if not rows or op == "empty":
            return draw(st.sampled_from(["", "\n", ",,,\n", text.splitlines()[0] + "\n"]))
        i = draw(st.integers(0, len(rows) - 1))
        if op == "cell" and rows[i]:
            j = draw(st.integers(0, len(rows[i]) - 1))
            rows[i][j] = draw(st.sampled_from(GARBAGE))
        elif op == "drop":
            rows.pop(i)
        elif op == "double":
            rows.insert(i, list(rows[i]))
        elif op == "cut":
            rows[i] = rows[i][: draw(st.integers(0, len(rows[i])))]
        elif op == "column" or not rows[i]:
            rows[i].append(draw(st.sampled_from(GARBAGE)))
    return "\n".join(",".join(r) for r in rows) + "\n"


def _leaves(doc: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [where] + [p for k, v in doc.items() for p in _leaves(v, (*where, k))]
    if isinstance(doc, list):
        return [where] + [p for i, v in enumerate(doc) for p in _leaves(v, (*where, i))]
    return [where]


@st.composite
def mutated_json(draw: st.DrawFn, text: str) -> str:
    """A JSON document with one to three of its values replaced or keys dropped, or cut."""
    doc = json.loads(text)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _leaves(doc) if p]
        if not paths or draw(st.integers(0, 9)) == 0:
            return draw(st.sampled_from(["", "{}", "[]", "null", text[: len(text) // 2]]))
        path = draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(JSON_GARBAGE)))
    return json.dumps(doc)


def _mix_current(f: str) -> list[str]:
    return ["plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
            "--budget", "cpu=14", "--current", f]  # fmt: skip


def _mig_current(f: str) -> list[str]:
    return ["plan", "mig", "--gpu", "A100-40GB", "--gpus", "1", "--model", "efficientnet",
            "--rate", "10", "--carbon-intensity", "300", "--current", f]  # fmt: skip


#: file -> (its extension, how it is mutated, the commands that read it)
FILES: dict[str, tuple[str, str, list[Callable[[str], list[str]]]]] = {
    "profiles.csv": (".csv", "csv", [lambda f: ["profile", "import", f]]),
    "carbon.csv": (".csv", "csv", [lambda f: ["carbon", "import", f, "--format", "csv"]]),
    "mix.json": (
        ".json",
        "json",
        [lambda f: ["simulate", f, "--analytic"], _mix_current],
    ),
    "mig.json": (".json", "json", [lambda f: ["simulate", f, "--analytic"], _mig_current]),
    "mix_spec.json": (".json", "json", [lambda f: ["plan", "mix", "--spec", f]]),
    "glet_spec.json": (
        ".json",
        "json",
        [lambda f: ["plan", "glet", "--spec", f, "--simulate-seconds", "0"]],
    ),
    "geo/sites.csv": (".csv", "csv", []),
    "geo/demand.csv": (".csv", "csv", []),
}


def _geo(seeded: Path, which: str, f: str) -> list[str]:
    files = {
        "sites": str(seeded / "geo" / "sites.csv"),
        "demand": str(seeded / "geo" / "demand.csv"),
    }
    files[which] = f
    return ["plan", "geo", "--sites", files["sites"], "--demand", files["demand"],
            "-a", "glb-energy"]  # fmt: skip


@fuzz(200)
@given(name=st.sampled_from(sorted(FILES)), data=st.data())
def test_a_malformed_file_is_refused_cleanly(work: Workspace, name: str, data: Any) -> None:
    ext, how, commands = FILES[name]
    text = (work.seeded / name).read_text()
    body = data.draw(mutated_csv(text) if how == "csv" else mutated_json(text), label="file")
    path = work.folder / f"input{ext}"
    path.write_text(body, encoding="utf-8")
    if name.startswith("geo/"):
        argv = _geo(work.seeded, name[4:-4], str(path))
    else:
        argv = data.draw(st.sampled_from(commands), label="command")(str(path))
    work.run(argv)


@fuzz(80)
@given(blob=st.binary(max_size=300), name=st.sampled_from(sorted(FILES)), data=st.data())
def test_arbitrary_bytes_are_refused_cleanly(work: Workspace, blob: bytes, name: str, data: Any):
    ext, _, commands = FILES[name]
    path = work.folder / f"input{ext}"
    path.write_bytes(blob)
    if name.startswith("geo/"):
        argv = _geo(work.seeded, name[4:-4], str(path))
    else:
        argv = data.draw(st.sampled_from(commands), label="command")(str(path))
    work.run(argv)


# -- option values --------------------------------------------------------------------------


def _mix(opt: str, value: str) -> list[str]:
    base = {"--rate": "50", "--slo-ms": "750", "--budget": "cpu=14"}
    base[opt] = value
    return ["plan", "mix", "--model", "resnet", *(x for kv in base.items() for x in kv)]


def _mig(opt: str, value: str) -> list[str]:
    base = {"--gpus": "1", "--rate": "10", "--carbon-intensity": "300"}
    base[opt] = value
    return ["plan", "mig", "--gpu", "A100-40GB", "--model", "efficientnet",
            *(x for kv in base.items() for x in kv)]  # fmt: skip


def _glet(opt: str, value: str) -> list[str]:
    base = {"--model": "g-resnet50:50:100", "--simulate-seconds": "0"}
    base[opt] = value
    return ["plan", "glet", *(x for kv in base.items() for x in kv)]


#: command -> (its number or list options, how the argv is built)
OPTIONS: dict[str, tuple[list[str], Callable[..., list[str]]]] = {
    "plan mix": (
        [
            "--rate",
            "--slo-ms",
            "--budget",
            "--min-accuracy",
            "--alpha",
            "--beta",
            "--gamma",
            "--carbon-intensity",
            "--headroom",
            "--time-limit",
            "--percentile",
        ],
        _mix,
    ),
    "plan mig": (
        [
            "--gpus",
            "--rate",
            "--carbon-intensity",
            "--sla-ms",
            "--lambda",
            "--base-carbon-intensity",
            "--max-accuracy-loss",
            "--time-limit",
            "--seed",
        ],
        _mig,
    ),
    "plan glet": (
        [
            "--max-gpus",
            "--rate-percentile",
            "--partitions",
            "--seed",
            "--simulate-seconds",
            "--interference-model",
        ],
        _glet,
    ),
}


@fuzz(200)
@given(command=st.sampled_from(sorted(OPTIONS)), data=st.data())
def test_a_bad_option_value_is_refused_cleanly(work: Workspace, command: str, data: Any) -> None:
    options, build = OPTIONS[command]
    opt = data.draw(st.sampled_from(options), label="option")
    value = data.draw(NUMBER_TEXT, label="value")
    if opt == "--budget":
        value = f"cpu={value}"
    work.run(build(opt, value))


SIMULATE_OPTIONS = ["--rate", "--duration", "--requests", "--pue", "--wue", "--ewif",
                    "--device-idle-power", "--slo-ms", "--queue-limit", "--seed",
                    "--carbon-intensity"]  # fmt: skip


@fuzz(30)
@given(opt=st.sampled_from(SIMULATE_OPTIONS), value=NUMBER_TEXT)
def test_a_bad_simulate_option_is_refused_cleanly(work: Workspace, opt: str, value: str) -> None:
    extra = [] if opt in ("--duration", "--requests") else ["--requests", "200"]
    work.run(["simulate", str(work.seeded / "mix.json"), opt, value, *extra])
