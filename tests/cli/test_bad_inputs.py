"""A battery of malformed inputs, one per user mistake, across every command.

Each case runs one command (in-process, as the user types it) against a store holding
InfAdapter's ResNet profiles, a Clover carbon trace and a saved plan, and checks the
contract of the README: the command is refused with the expected exit code (2 for bad input),
prints ``Error:`` with a message naming what was wrong, never a traceback, and leaves the
store exactly as it was (its whole SQL dump is compared).
"""

from __future__ import annotations

import copy
import gzip
import hashlib
import json
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
CARBON_TRACE = REPO / "data" / "datasets" / "carbon" / "clover_ciso_march.csv"

pytestmark = pytest.mark.timeout(120)


@dataclass(frozen=True)
class Case:
    """argv (with ``{name}`` placeholders for files the case writes), files, expectations."""

    id: str
    argv: tuple[str, ...]
    files: tuple[tuple[str, Callable[[Path], bytes]], ...] = ()
    code: int = 2
    says: tuple[str, ...] = ()  # each must appear in the error message (case-insensitive)


def _text(s: str) -> Callable[[Path], bytes]:
    return lambda _t: s.encode()


def _bytes(b: bytes) -> Callable[[Path], bytes]:
    return lambda _t: b


def _plan(mutate: Callable[[dict], None]) -> Callable[[Path], bytes]:
    def make(template: Path) -> bytes:
        doc = json.loads((template / "mix.json").read_text())
        doc = copy.deepcopy(doc)
        mutate(doc)
        return json.dumps(doc).encode()

    return make


def _dep(field: str, value: object) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        doc["deployments"][0][field] = value

    return mutate


def _set(field: str, value: object) -> Callable[[dict], None]:
    def mutate(doc: dict) -> None:
        doc[field] = value

    return mutate


BINARY = bytes(range(256)) * 8
DEEP_JSON = ("[" * 100_000 + "]" * 100_000).encode()
GZ = gzip.compress(b"not a trace at all \x00\x01", mtime=0)
PROFILE_HEADER = "variant,model,resource,batch,throughput_rps,latency_ms,accuracy\n"


def _profile_rows(*rows: str) -> Callable[[Path], bytes]:
    return _text(PROFILE_HEADER + "".join(r + "\n" for r in rows))


# fmt: off
CASES = [
    # -- profile import / list / show ---------------------------------------------------------
    Case("profile-import-dir", ("profile", "import", "{dir}"), (("dir/", _text("")),)),
    Case("profile-import-missing", ("profile", "import", "{missing}.csv")),
    Case("profile-import-binary", ("profile", "import", "{f}.csv"), (("f.csv", _bytes(BINARY)),)),
    Case("profile-import-empty", ("profile", "import", "{f}.csv"), (("f.csv", _text("")),)),
    Case(
        "profile-import-huge-batch",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v1,m,cpu:1,99999999999999999999999,10,5,0.7")),),
        says=("batch",),
    ),
    Case(
        "profile-import-deep-json",
        ("profile", "import", "{f}.json"),
        (("f.json", _bytes(DEEP_JSON)),),
    ),
    Case(
        "profile-import-bad-created-at",
        ("profile", "import", "{f}.csv"),
        (
            (
                "f.csv",
                _text(
                    "variant,model,resource,batch,throughput_rps,latency_ms,created_at\n"
                    "v1,m,cpu:1,1,10,5,yesterday\n"
                ),
            ),
        ),
        says=("created_at",),
    ),
    Case(
        "profile-import-conflicting-rows",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v1,m,cpu:1,1,10,5,0.7", "v1,m,cpu:1,1,20,9,0.7")),),
        says=("line 3",),
    ),
    Case(
        "profile-import-nul-name",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v\x001,m,cpu:1,1,10,5,0.7")),),
        says=("variant",),
    ),
    Case(
        "profile-import-megabyte-name",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v" * 1_000_000 + ",m,cpu:1,1,10,5,0.7")),),
        says=("line 2",),
    ),
    Case(
        "profile-import-variant-object",
        ("profile", "import", "{f}.json"),
        (
            (
                "f.json",
                _text(
                    json.dumps(
                        [
                            {
                                "variant": {"a": 1},
                                "resource": "cpu:1",
                                "batch": 1,
                                "throughput_rps": 10,
                                "latency_ms": 5,
                            }
                        ]
                    )
                ),
            ),
        ),
        says=("variant",),
    ),
    Case(
        "profile-import-model-list",
        ("profile", "import", "{f}.json"),
        (
            (
                "f.json",
                _text(
                    json.dumps(
                        [
                            {
                                "variant": "v1",
                                "model": ["m"],
                                "resource": "cpu:1",
                                "batch": 1,
                                "throughput_rps": 10,
                                "latency_ms": 5,
                            }
                        ]
                    )
                ),
            ),
        ),
        says=("model",),
    ),
    Case(
        "profile-import-negative-latency",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v1,m,cpu:1,1,10,-5,0.7")),),
        says=("latency",),
    ),
    Case(
        "profile-import-nan-throughput",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _profile_rows("v1,m,cpu:1,1,nan,5,0.7")),),
        says=("throughput",),
    ),
    Case(
        "profile-import-missing-column",
        ("profile", "import", "{f}.csv"),
        (("f.csv", _text("variant,resource,batch\nv1,cpu:1,1\n")),),
    ),
    Case("profile-list-unknown-model", ("profile", "list", "--model", "nosuch"), says=("nosuch",)),
    Case("profile-show-markup", ("profile", "show", "x[red]y"), says=("x[red]y",)),
    Case("db-in-missing-folder", ("--db", "{missing}/sub/g.db", "profile", "list")),
    Case("profile-measure-unknown-variant", ("profile", "--variant", "nosuch"), says=("nosuch",)),
    Case("profile-measure-cpus-zero", ("profile", "--variant", "tiny-s", "--cpus", "0")),
    Case("profile-measure-batch-text", ("profile", "--variant", "tiny-s", "--batch", "abc")),
    Case(
        "profile-model-path-missing-module",
        ("profile", "--model-path", "no_such_module_x:build", "--input-shape", "3"),
    ),
    # -- plan mix -------------------------------------------------------------------------------
    *(
        Case(f"plan-mix-{label}", ("plan", "mix", "--model", "resnet", *extra), says=says)
        for label, extra, says in [
            ("negative-rate", ("--rate", "-5", "--slo-ms", "750"), ("rate",)),
            ("nan-rate", ("--rate", "nan", "--slo-ms", "750"), ("rate",)),
            ("zero-slo", ("--rate", "50", "--slo-ms", "0"), ("slo",)),
            ("bad-budget", ("--rate", "50", "--slo-ms", "750", "--budget", "cpu=abc"), ("budget",)),
            ("budget-no-eq", ("--rate", "50", "--slo-ms", "750", "--budget", "cpu"), ("budget",)),
            ("objective", ("--rate", "50", "--slo-ms", "750", "--objective", "foo"), ("objective",)),
            ("percentile", ("--rate", "50", "--slo-ms", "750", "--percentile", "p42"), ("p42",)),
            ("accuracy", ("--rate", "50", "--slo-ms", "750", "--min-accuracy", "2"), ("accuracy",)),
            (
                "carbon-1e300",
                ("--rate", "50", "--slo-ms", "750", "--carbon-intensity", "1e300"),
                ("carbon",),
            ),
            (
                "carbon-negative",
                ("--rate", "50", "--slo-ms", "750", "--carbon-intensity", "-1"),
                ("carbon",),
            ),
            ("region-unknown", ("--rate", "50", "--slo-ms", "750", "--region", "NOWHERE"), ("NOWHERE",)),
            ("strategy", ("--rate", "50", "--slo-ms", "750", "--strategy", "magic"), ("strategy",)),
            ("solver", ("--rate", "50", "--slo-ms", "750", "--solver", "gurobi"), ("solver",)),
        ]
    ),
    Case(
        "plan-mix-unknown-model",
        ("plan", "mix", "--model", "nosuch", "--rate", "50", "--slo-ms", "750"),
        says=("nosuch",),
    ),
    Case(
        "plan-mix-output-missing-dir",
        (
            "plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
            "--budget", "cpu=14", "-o", "{missing}/dir/plan.json",
        ),
        says=("plan.json",),
    ),
    Case("plan-mix-spec-binary", ("plan", "mix", "--spec", "{f}.toml"), (("f.toml", _bytes(BINARY)),)),
    Case("plan-mix-spec-deep", ("plan", "mix", "--spec", "{f}.json"), (("f.json", _bytes(DEEP_JSON)),)),
    Case(
        "plan-mix-spec-toml-syntax",
        ("plan", "mix", "--spec", "{f}.toml"),
        (("f.toml", _text("[[families]\nmodel = 'resnet'\n")),),
    ),
    Case(
        "plan-mix-spec-count-text",
        ("plan", "mix", "--spec", "{f}.json"),
        (
            (
                "f.json",
                _text(
                    json.dumps(
                        {
                            "slo_ms": 750,
                            "families": [{"model": "resnet", "rate_rps": 50}],
                            "current": [
                                {
                                    "model": "resnet",
                                    "variant": "resnet50",
                                    "resource": "cpu:4",
                                    "count": "two",
                                }
                            ],
                        }
                    )
                ),
            ),
        ),
        says=("count",),
    ),
    Case(
        "plan-mix-current-binary",
        (
            "plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
            "--current", "{f}.json",
        ),
        (("f.json", _bytes(BINARY)),),
    ),
    # -- plan mig / glet / geo -------------------------------------------------------------------
    *(
        Case(f"plan-mig-{label}", ("plan", "mig", *extra), says=says)
        for label, extra, says in [
            (
                "unknown-gpu",
                ("--gpu", "NoSuchGPU", "--gpus", "2", "--model", "efficientnet", "--rate", "10",
                 "--carbon-intensity", "200"),
                ("NoSuchGPU",),
            ),
            (
                "zero-gpus",
                ("--gpu", "A100-40GB", "--gpus", "0", "--model", "efficientnet", "--rate", "10",
                 "--carbon-intensity", "200"),
                ("gpus",),
            ),
            (
                "lambda",
                ("--gpu", "A100-40GB", "--gpus", "2", "--model", "efficientnet", "--rate", "10",
                 "--carbon-intensity", "200", "--lambda", "2"),
                ("lambda",),
            ),
            (
                "negative-rate",
                ("--gpu", "A100-40GB", "--gpus", "2", "--model", "efficientnet", "--rate", "-1",
                 "--carbon-intensity", "200"),
                ("rate",),
            ),
        ]
    ),
    Case("plan-glet-markup", ("plan", "glet", "--model", "resnet50:abc:50"), says=("resnet50:abc:50",)),
    Case("plan-glet-no-rate", ("plan", "glet", "--model", "resnet50"), says=("resnet50",)),
    Case("plan-glet-negative", ("plan", "glet", "--model", "resnet50:-1:50"), says=("resnet50",)),
    Case(
        "plan-geo-binary-sites",
        ("plan", "geo", "--sites", "{s}.csv", "--demand", "{d}.csv"),
        (("s.csv", _bytes(BINARY)), ("d.csv", _text("time,gateway,load_mw\n0,g1,1\n"))),
    ),
    Case(
        "plan-geo-missing-column",
        ("plan", "geo", "--sites", "{s}.csv", "--demand", "{d}.csv"),
        (
            ("s.csv", _text("time,site,price_usd_per_mwh\n0,a,10\n")),
            ("d.csv", _text("time,gateway,load_mw\n0,g1,1\n")),
        ),
        says=("s.csv",),
    ),
    Case(
        "plan-geo-unknown-algorithm",
        ("plan", "geo", "--sites", "{s}.csv", "--demand", "{d}.csv", "--algorithm", "nope"),
        (
            (
                "s.csv",
                _text(
                    "time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw\n"
                    "0,a,10,100,1,5\n"
                ),
            ),
            ("d.csv", _text("time,gateway,load_mw\n0,g1,1\n")),
        ),
        says=("nope",),
    ),
    # -- simulate --------------------------------------------------------------------------------
    Case("simulate-binary", ("simulate", "/bin/ls")),
    Case("simulate-dir", ("simulate", "{dir}"), (("dir/", _text("")),)),
    Case("simulate-not-json", ("simulate", "{f}.json"), (("f.json", _text("{not json")),)),
    Case("simulate-json-list", ("simulate", "{f}.json"), (("f.json", _text("[1, 2]")),)),
    Case("simulate-deep-json", ("simulate", "{f}.json"), (("f.json", _bytes(DEEP_JSON)),)),
    Case("simulate-slo-zero", ("simulate", "{p}.json", "--slo-ms", "0"), (("p.json", _plan(lambda d: None)),), says=("slo",)),
    Case("simulate-slo-nan", ("simulate", "{p}.json", "--slo-ms", "nan"), (("p.json", _plan(lambda d: None)),), says=("slo",)),
    Case("simulate-count-million", ("simulate", "{p}.json"), (("p.json", _plan(_dep("count", 1_000_000))),), says=("count",)),
    Case("simulate-count-text", ("simulate", "{p}.json"), (("p.json", _plan(_dep("count", "two"))),), says=("count",)),
    Case("simulate-batch-float", ("simulate", "{p}.json"), (("p.json", _plan(_dep("batch", 1.5))),), says=("batch",)),
    Case("simulate-negative-quota", ("simulate", "{p}.json"), (("p.json", _plan(_dep("quota_rps", -3))),), says=("quota",)),
    Case("simulate-request-string", ("simulate", "{p}.json"), (("p.json", _plan(_set("request", "x"))),), says=("request",)),
    Case("simulate-deployments-object", ("simulate", "{p}.json"), (("p.json", _plan(_set("deployments", {}))),), says=("deployments",)),
    Case("simulate-wrong-family", ("simulate", "{p}.json"), (("p.json", _plan(_dep("model", "tiny"))),), says=("tiny",)),
    Case("simulate-trace-binary", ("simulate", "{p}.json", "--trace", "{t}.txt.gz"), (("p.json", _plan(lambda d: None)), ("t.txt.gz", _bytes(GZ)))),
    Case("simulate-negative-rate", ("simulate", "{p}.json", "--rate", "-4"), (("p.json", _plan(lambda d: None)),)),
    # -- apply (dry run: nothing may start) ------------------------------------------------------
    Case("apply-request-string", ("apply", "{p}.json", "--dry-run"), (("p.json", _plan(_set("request", "x"))),), says=("request",)),
    Case("apply-quantum-resource", ("apply", "{p}.json", "--dry-run"), (("p.json", _plan(_dep("resource", "quantum:7"))),), says=("quantum",)),
    Case("apply-count-million", ("apply", "{p}.json", "--dry-run"), (("p.json", _plan(_dep("count", 1_000_000))),), says=("count",)),
    Case("apply-count-zero", ("apply", "{p}.json", "--dry-run"), (("p.json", _plan(_dep("count", 0))),), says=("count",)),
    Case("apply-schema", ("apply", "{p}.json", "--dry-run"), (("p.json", _plan(_set("schema", "other/v9"))),), says=("schema",)),
    Case("apply-backend", ("apply", "{p}.json", "--dry-run", "--backend", "nope"), (("p.json", _plan(lambda d: None)),), says=("backend",)),
    Case(
        "apply-ray-no-cluster",
        ("apply", "{p}.json", "--dry-run", "--backend", "ray", "--address", "127.0.0.1:1"),
        (("p.json", _plan(lambda d: None)),),
        code=1,
        says=("127.0.0.1:1",),
    ),
    Case("status-ray-no-cluster", ("status", "--backend", "ray", "--address", "127.0.0.1:1"), code=1, says=("127.0.0.1:1",)),
    # -- loadgen ---------------------------------------------------------------------------------
    Case("loadgen-not-a-url", ("loadgen", "--endpoint", "not a url", "--model", "tiny", "--rate", "5", "--duration", "1"), says=("endpoint",)),
    Case("loadgen-nothing-listening", ("loadgen", "--endpoint", "http://127.0.0.1:1", "--model", "tiny", "--rate", "5", "--duration", "1"), code=1, says=("127.0.0.1:1",)),
    Case("loadgen-negative-rate", ("loadgen", "--endpoint", "http://127.0.0.1:1", "--model", "tiny", "--rate", "-5", "--duration", "1"), says=("rate",)),
    # -- carbon ----------------------------------------------------------------------------------
    Case("carbon-import-binary", ("carbon", "import", "{f}.csv", "--region", "X"), (("f.csv", _bytes(BINARY)),)),
    Case(
        "carbon-import-1e300",
        ("carbon", "import", "{f}.csv", "--region", "X"),
        (("f.csv", _text("time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,1e300\n")),),
        says=("line 2",),
    ),
    Case(
        "carbon-import-negative",
        ("carbon", "import", "{f}.csv", "--region", "X"),
        (("f.csv", _text("time,carbon_g_per_kwh\n2021-03-01T00:00:00Z,-3\n")),),
        says=("line 2",),
    ),
    Case(
        "carbon-import-bad-time",
        ("carbon", "import", "{f}.csv", "--region", "X"),
        (("f.csv", _text("time,carbon_g_per_kwh\nyesterday,100\n")),),
        says=("line 2",),
    ),
    Case("carbon-import-format", ("carbon", "import", str(CARBON_TRACE), "--format", "nope", "--region", "X"), says=("nope",)),
    Case("carbon-show-unknown-region", ("carbon", "show", "--region", "NOWHERE"), says=("NOWHERE",)),
    # -- cron / replan ---------------------------------------------------------------------------
    Case("cron-7m", ("cron", "install", "--every", "7m", "--print", "--", "replan"), says=("7m",)),
    Case("cron-5h", ("cron", "install", "--every", "5h", "--print", "--", "replan"), says=("5h",)),
    Case("cron-misspelt", ("cron", "install", "--every", "15m", "--print", "--", "replna"), says=("replna",)),
    Case("cron-unknown-option", ("cron", "install", "--every", "15m", "--print", "--", "replan", "--nosuch"), says=("--nosuch",)),
    Case("replan-unknown-plan", ("replan", "--plan", "999"), says=("999",)),
    Case("replan-binary-plan", ("replan", "--plan", "/bin/ls")),
    Case("replan-bad-dwell", ("replan", "--plan", "1", "--min-dwell", "xyz"), says=("xyz",)),
    # -- export / report / forecast / gpulet / geo / mig ----------------------------------------
    Case("export-k8s-binary-plan", ("export", "k8s", "/bin/ls", "-o", "{out}")),
    Case("report-savings-unknown-plan", ("report", "savings", "--plan", "999", "--baseline", "1", "--region", "CISO"), says=("999",)),
    Case("report-plans-unknown-plan", ("report", "plans", "--plan", "99999"), says=("99999",)),
    Case("report-profiles-stray-filter", ("report", "profiles", "--region", "CISO"), says=("--region",)),
    Case("forecast-fit-binary-trace", ("forecast", "fit", "--forecaster", "last", "--trace", "{t}.txt.gz"), (("t.txt.gz", _bytes(GZ)),)),
    Case("forecast-unknown-forecaster", ("forecast", "predict", "--forecaster", "nosuch", "--trace", "{t}.txt"), (("t.txt", _text("1 2 3 4 5\n")),), says=("nosuch",)),
    Case("gpulet-import-missing", ("gpulet", "import", "{missing}"), says=("missing",)),
    Case("gpulet-import-garbage", ("gpulet", "import", "{dir}"), (("dir/", _text("")), ("dir/resnet50.txt", _bytes(BINARY)))),
    Case("geo-convert-missing", ("geo", "convert-eglb", "{missing}", "-o", "{out}")),
    Case("mig-layouts-unknown-gpu", ("mig", "layouts", "--gpu", "NoSuchGPU"), says=("NoSuchGPU",)),
    Case("mig-synth-unknown-family", ("mig", "synth", "--gpu", "A100-40GB", "--family", "nosuch"), says=("nosuch",)),
    # -- bundled:NAME: an unknown name is refused before any work, listing every name -----------
    Case("bundled-unknown-carbon", ("carbon", "import", "bundled:clover-ciso-mar"), says=("bundled:clover-ciso-mar", "bundled:clover-ciso-march", "bundled:twitter")),
    Case("bundled-unknown-gpulet", ("gpulet", "import", "bundled:gpulets"), says=("bundled:gpulets", "bundled:gpulet,")),
    Case("bundled-unknown-trace", ("forecast", "fit", "--forecaster", "last", "--trace", "bundled:twiter"), says=("bundled:twiter", "bundled:twitter")),
    Case("bundled-unknown-sites", ("plan", "geo", "--sites", "bundled:sites", "--demand", "bundled:eglb"), says=("bundled:sites", "bundled:eglb")),
    Case("bundled-unknown-profiles", ("profile", "import", "bundled:"), says=("bundled:infadapter",)),
    Case("bundled-not-a-carbon-trace", ("carbon", "import", "bundled:twitter", "--region", "X"), says=("requests_per_second",)),
]
# fmt: on


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with InfAdapter's ResNet profiles, the CISO carbon trace and one mix plan."""
    from greenctl.cli.main import app

    root = tmp_path_factory.mktemp("bad-inputs")
    db = root / "greenctl.db"
    runner = CliRunner()

    def ok(*args: str) -> None:
        r = runner.invoke(app, ["--db", str(db), *args], catch_exceptions=False)
        assert r.exit_code == 0, r.output

    import subprocess
    import sys

    csv_path = root / "resnet.csv"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "infadapter_import.py"), "-o", str(csv_path)],
        check=True,
        capture_output=True,
    )
    ok("profile", "import", str(csv_path))
    ok("carbon", "import", str(CARBON_TRACE), "--format", "clover", "--region", "CISO")
    ok("mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet")
    ok(
        "plan", "mix", "--model", "resnet", "--rate", "50", "--slo-ms", "750",
        "--budget", "cpu=14", "-o", str(root / "mix.json"),
    )  # fmt: skip
    return root


def _dump(db: Path) -> str:
    if not db.exists():
        return "<no store>"
    con = sqlite3.connect(db)
    try:
        h = hashlib.sha256()
        for line in con.iterdump():
            h.update(line.encode())
        return h.hexdigest()
    finally:
        con.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_cleanly(case: Case, template: Path, tmp_path: Path, db_path: Path):
    from greenctl.cli.main import app

    shutil.copy(template / "greenctl.db", db_path)
    names: dict[str, str] = {"missing": str(tmp_path / "missing"), "out": str(tmp_path / "out")}
    for name, make in case.files:
        target = tmp_path / name
        if name.endswith("/"):
            target.mkdir(parents=True, exist_ok=True)
            names[name.rstrip("/")] = str(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(make(template))
        stem = name.split(".")[0]  # argv spells the extension: "{f}.csv"
        names.setdefault(stem, str(tmp_path / stem))
    argv = [a.format(**names) if "{" in a else a for a in case.argv]
    before = _dump(db_path)

    r = CliRunner().invoke(app, argv, catch_exceptions=True)

    where = f"greenctl {' '.join(a[:80] for a in argv)}\n{r.output[-2000:]}"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback ({type(r.exception).__name__}): {where}") from r.exception
    assert r.exit_code == case.code, where
    # greenctl's own "Error: ..." or click's usage error panel ("╭─ Error ─")
    assert "Error:" in r.output or "─ Error ─" in r.output, where
    message = " ".join(r.output.split()).lower()
    for needle in case.says:
        assert needle.lower() in message, f"message does not name {needle!r}: {where}"
    assert _dump(db_path) == before, f"the store changed: {where}"
