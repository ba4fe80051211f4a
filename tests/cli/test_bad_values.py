"""Bad values refused once, where the typed request or the option's bound decides them.

Each case runs the real command in-process against a copy of a seeded store and checks: exit
2, one ``Error:`` line naming the option or field, no traceback, nothing on stdout under
``--json``, the store's bytes unchanged and no file written. Usage errors (a bad type, a
missing or unknown option, a bad choice) print the same ``Error:`` line with a hint to the
command's ``--help``, and escape sequences in arguments are never echoed raw.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
CARBON = REPO / "data" / "datasets" / "carbon" / "clover_ciso_march.csv"

pytestmark = pytest.mark.timeout(300)

MIX = ["plan", "mix", "--model", "resnet", "--slo-ms", "750", "--budget", "cpu=14"]
MIG = ["plan", "mig", "--gpu", "A100-40GB", "--model", "efficientnet", "--carbon-intensity", "300"]
GLET = ["plan", "glet", "--simulate-seconds", "0"]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ResNet profiles, the CISO carbon trace, MIG profiles; a mix and a mig plan; files."""
    from greenctl.cli.main import app

    root = tmp_path_factory.mktemp("bad-values")
    db = root / "greenctl.db"

    def ok(*args: str) -> None:
        r = CliRunner().invoke(app, ["--db", str(db), *args], catch_exceptions=False)
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
    ok(*MIX, "--rate", "50", "-o", str(root / "mix.json"))
    ok(*MIG, "--gpus", "1", "--rate", "10", "-o", str(root / "mig.json"))
    (root / "empty.json").write_text("")
    (root / "object.json").write_text("{}")
    (root / "glet.json").write_text(
        json.dumps({"models": [{"name": "a", "rate_rps": 0, "slo_ms": 5}]})
    )
    return root


# (id, argv with {root} for the seeded folder, words the message must hold)
CASES = [
    ("mix-zero-rate", [*MIX, "--rate", "0"], ["rate_rps", "> 0"]),
    ("mix-negative-rate", [*MIX, "--rate", "-3"], ["rate_rps", "> 0"]),
    ("mix-inf-rate", [*MIX, "--rate", "inf"], ["rate_rps", "finite"]),
    ("mix-absurd-rate", [*MIX, "--rate", "1e300"], ["rate_rps", "<= 1e+06"]),
    ("mix-nan-slo", [*MIX, "--rate", "5", "--slo-ms", "nan"], ["slo_ms", "finite"]),
    ("mix-nan-alpha", [*MIX, "--rate", "5", "--alpha", "nan"], ["alpha", "finite"]),
    ("mix-absurd-gamma", [*MIX, "--rate", "5", "--gamma", "1e12"], ["gamma", "<="]),
    ("mix-nan-accuracy", [*MIX, "--rate", "5", "--min-accuracy", "nan"], ["min_accuracy"]),
    ("mix-negative-budget", [*MIX, "--rate", "5", "--budget", "cpu=-1"], ["budget 'cpu'"]),
    ("mix-inf-headroom", [*MIX, "--rate", "5", "--headroom", "inf"], ["headroom"]),
    ("mix-nan-time-limit", [*MIX, "--rate", "5", "--time-limit", "nan"], ["time_limit_s"]),
    ("mix-nan-intensity", [*MIX, "--rate", "5", "--carbon-intensity", "nan"], ["--carbon-intensity"]),
    ("mix-empty-spec", ["plan", "mix", "--spec", "{root}/empty.json"], ["empty.json"]),
    ("mix-empty-request", ["plan", "mix", "--spec", "{root}/object.json"], ["model family"]),
    ("mix-current-mig", [*MIX, "--rate", "5", "--current", "{root}/mig.json"], ["--current", "'mig'"]),
    ("mig-current-mix", [*MIG, "--gpus", "1", "--rate", "5", "--current", "{root}/mix.json"], ["--current", "'mix'"]),
    ("mig-zero-rate", [*MIG, "--gpus", "1", "--rate", "0"], ["--rate", "> 0"]),
    ("mig-absurd-rate", [*MIG, "--gpus", "1", "--rate", "1e300"], ["--rate", "<="]),
    ("mig-negative-gpus", [*MIG, "--gpus", "-1", "--rate", "5"], ["--gpus", ">= 1"]),
    ("mig-absurd-gpus", [*MIG, "--gpus", "100000000", "--rate", "5"], ["--gpus", "<= 4096"]),
    ("mig-nan-lambda", [*MIG, "--gpus", "1", "--rate", "5", "--lambda", "nan"], ["--lambda"]),
    ("mig-negative-seed", [*MIG, "--gpus", "1", "--rate", "5", "--seed", "-1"], ["--seed"]),
    ("mig-nan-sla", [*MIG, "--gpus", "1", "--rate", "5", "--sla-ms", "nan"], ["--sla-ms"]),
    ("glet-zero-rate", [*GLET, "--model", "a:0:100"], ["rate_rps", "> 0"]),
    ("glet-zero-rate-spec", [*GLET, "--spec", "{root}/glet.json"], ["rate"]),
    ("glet-empty-partition", [*GLET, "--model", "a:5:100", "--partitions", "20,,40"], ["--partitions", "empty item"]),
    ("glet-negative-gpus", [*GLET, "--model", "a:5:100", "--max-gpus", "-2"], ["--max-gpus"]),
    ("glet-nan-percentile", [*GLET, "--model", "a:5:100", "--rate-percentile", "nan"], ["--rate-percentile"]),
    ("glet-empty-spec", [*GLET, "--spec", "{root}/object.json"], ["models"]),
    ("simulate-negative-seed", ["simulate", "{root}/mix.json", "--seed", "-1"], ["--seed"]),
    ("simulate-empty-plan", ["simulate", "{root}/object.json"], ["object.json"]),
    ("forecast-nan-days", ["forecast", "fit", "-f", "last", "--trace", "bundled:twitter", "--train-days", "nan"], ["--train-days"]),
    ("forecast-empty-name", ["forecast", "fit", "-f", "last", "--trace", "bundled:twitter", "--name", ""], ["--name is empty"]),
    ("interference-nan-fraction", ["interference", "fit", "--test-fraction", "nan"], ["--test-fraction"]),
    # usage errors: click's, printed as greenctl's Error line with a hint
    ("usage-bad-type", [*MIX, "--rate", "abc"], ["--rate", "greenctl plan mix --help"]),
    ("usage-unknown-option", [*MIX, "--rate", "5", "--bogus", "1"], ["--bogus", "greenctl plan mix --help"]),
    ("usage-missing-option", ["plan", "mig", "--gpu", "A100-40GB"], ["--gpus", "greenctl plan mig --help"]),
    ("usage-missing-value", [*MIX, "--rate"], ["--rate", "greenctl plan mix --help"]),
    ("usage-root-option", ["--bogus"], ["--bogus", "greenctl --help"]),
    ("usage-unknown-command", ["forecast", "nope"], ["nope", "greenctl forecast --help"]),
    ("usage-below-range", ["simulate", "{root}/mix.json", "--rate", "-1"], ["--rate"]),
]  # fmt: skip


def _run(seeded: Path, tmp_path: Path, argv: list[str], json_out: bool):
    from greenctl.cli.main import app

    db = tmp_path / "greenctl.db"
    shutil.copy(seeded / "greenctl.db", db)
    before = db.read_bytes()
    files = set(tmp_path.rglob("*"))
    argv = [a.replace("{root}", str(seeded)) for a in argv]
    if json_out and argv[0] in ("plan", "simulate", "forecast", "interference"):
        argv = [*argv, "--json"]
    r = CliRunner().invoke(app, ["--db", str(db), *argv], catch_exceptions=True)
    return r, db.read_bytes() == before, set(tmp_path.rglob("*")) - files


# every case as typed, and with --json (not the usage errors: --json would change them)
PARAMS = [
    pytest.param(*c, j, id=f"{c[0]}-{'json' if j else 'table'}")
    for c in CASES
    for j in (False, True)
    if not (j and c[0].startswith("usage-"))
]


@pytest.mark.parametrize(("case", "argv", "words", "json_out"), PARAMS)
def test_a_bad_value_is_refused_once(seeded, tmp_path, case, argv, words, json_out):
    r, same, new = _run(seeded, tmp_path, argv, json_out)
    where = f"{case}: {r.output[-1500:]}"
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback: {where}") from r.exception
    assert r.exit_code == 2, where
    assert "Traceback" not in r.output, where
    assert r.stderr.count("Error:") == 1 and r.stderr.startswith("Error:"), where
    message = " ".join(r.stderr.split())
    for word in words:
        assert word in message, f"the message does not name {word!r}: {where}"
    assert r.stdout == "", f"stdout is not empty: {where}"
    assert same, f"the store changed: {where}"
    assert not new, f"files written: {sorted(map(str, new))}: {where}"


def test_escape_sequences_in_arguments_are_never_echoed_raw(seeded, tmp_path):
    for argv, echoed in (
        ([*MIX, "--rate", "5", "--bad\x1b[2Jx", "1"], True),  # click's message
        (["plan", "mix", "--model", "a\x1b[31mb", "--rate", "5", "--slo-ms", "5"], True),
        ([*MIX, "--rate", "\x1b]0;title\x07"], False),
    ):
        r, same, _ = _run(seeded, tmp_path, argv, False)
        assert r.exit_code == 2 and same, r.output
        assert "\x1b" not in r.output and "\x07" not in r.output, repr(r.output)
        assert ("\\x1b" in r.output) is echoed, repr(r.output)


def test_a_valid_plan_still_saves(seeded, tmp_path):
    """The bounds refuse the absurd, not the ordinary: a plain request still plans."""
    r, same, _ = _run(seeded, tmp_path, [*MIX, "--rate", "20"], True)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["kind"] == "mix" and not same
