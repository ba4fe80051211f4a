"""Every command and group has help text, and --help works without torch or NVML; cold
everyday commands (plan mix, reading the store) load nothing heavy they do not use."""

from __future__ import annotations

import subprocess
import sys

import pytest
from greenctl.cli.main import app
from greenctl.data.records import Profile, Variant
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


#: what a cold everyday command must not load: none of them uses these
_NOT_COLD = ("pandas", "scipy", "matplotlib", "torch", "onnxruntime", "ray")

#: runs ``greenctl ARGV`` as the entry point does, then names the modules it loaded
_PROBE = (
    "import sys\n"
    "from greenctl.cli.main import main\n"
    "sys.argv = ['greenctl', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code or 0\nelse:\n    code = 0\n"
    "names = sorted({m.split('.')[0] for m in sys.modules})\n"
    "print('exit', code, 'loaded', ','.join(names), file=sys.stderr)\n"
)


def _cold(*argv: str) -> tuple[int, set[str]]:
    """(exit code, top-level modules loaded) of a fresh ``greenctl argv`` process."""
    code, _out, _err, loaded = _cold_run(*argv)
    return code, loaded


def _cold_run(*argv: str) -> tuple[int, str, str, set[str]]:
    """(exit code, stdout, stderr, top-level modules loaded) of a fresh ``greenctl argv``."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120
    )
    assert "Traceback" not in out.stderr, out.stderr
    *text, last = out.stderr.strip().splitlines()
    words = last.split()
    assert words[0] == "exit" and words[2] == "loaded", out.stderr
    return int(words[1]), out.stdout, "\n".join(text), set(words[3].split(","))


@pytest.fixture
def planning_store(store, cli):
    """Family ``c`` measured at batch 1 to 8 on one core (the dynamic-batching and lognormal
    paths), family ``d`` load-tested on two cores (the load-test path), and a carbon trace."""
    store.upsert_variant(Variant("c-small", "c", accuracy=0.70, load_time_s=1.0))
    store.upsert_variant(Variant("c-big", "c", accuracy=0.80, load_time_s=2.0))
    store.upsert_variant(Variant("d-one", "d", accuracy=0.75, load_time_s=1.0))
    rows = [
        Profile(
            variant=name,
            resource="cpu:1",
            batch=b,
            throughput_rps=1000.0 * b / (base * b**0.7),
            latency_p50_ms=base * b**0.7,
            latency_p95_ms=1.6 * base * b**0.7,
            latency_p99_ms=1.9 * base * b**0.7,
            energy_j=0.02,
        )
        for name, base in (("c-small", 4.0), ("c-big", 9.0))
        for b in (1, 2, 4, 8)
    ]
    tested = dict(capacity_rps=90.0, capacity_slo_ms=40.0)
    rows.append(Profile("d-one", "cpu:2", 1, 150.0, 8.0, None, 30.0, energy_j=0.03, **tested))
    store.add_profiles(rows)
    assert cli("carbon", "import", "bundled:clover-ciso-march").exit_code == 0
    return store


def test_plan_mix_cold_imports_no_scipy_pandas_or_plotting(planning_store, tmp_path):
    """Planning a CPU family loads no scipy (its normal CDF, Poisson terms and root finder
    are computed exactly without it), no pandas (the store reads through sqlite3) and no
    plotting or ML framework."""
    at = ("--region", "CISO", "--at", "2021-03-01T08:00:00Z")
    for model, budget in (("c", "cpu=2"), ("d", "cpu=8")):
        code, loaded = _cold(
            "plan", "mix", "--model", model, "--rate", "40", "--slo-ms", "100",
            "--budget", budget, *at, "-o", str(tmp_path / f"{model}.json"),
        )  # fmt: skip
        assert code == 0
        assert (tmp_path / f"{model}.json").exists()
        heavy = loaded & {*_NOT_COLD, "sqlite_utils"}  # the store read through sqlite3
        assert heavy == set(), (model, sorted(heavy))


@pytest.mark.parametrize(
    "argv",
    [("profile", "list"), ("plan", "list"), ("status", "--json")],
    ids=["profile-list", "plan-list", "status"],
)
def test_reading_the_store_cold_imports_no_sqlite_utils(planning_store, argv):
    """A command that only reads the store loads neither sqlite-utils (nor, through it,
    pandas and numpy) nor anything else heavy."""
    code, loaded = _cold(*argv)
    assert code in (0, 1)  # status exits 1 when nothing serves
    heavy = loaded & {*_NOT_COLD, "sqlite_utils"}
    assert heavy == set(), sorted(heavy)


def test_status_cold_loads_no_http_client_and_the_serving_modules_no_numpy(planning_store):
    """``status`` only reads the store and asks running processes: it loads no aiohttp (the
    load generator's client) and nothing heavy, and the modules it imports for their
    constants and helpers (the OIP codec, the load generator) load numpy only with the
    first tensor or load they handle."""
    code, loaded = _cold("status", "--json")
    assert code in (0, 1)  # 1: nothing serves
    heavy = loaded & {*_NOT_COLD, "sqlite_utils", "aiohttp"}
    assert heavy == set(), sorted(heavy)
    probe = (
        "import sys\n"
        "import greenctl.executor.runtime.oip, greenctl.executor.runtime.loadgen\n"
        "print(','.join(m for m in ('numpy', 'aiohttp') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"loaded at import: {out.stdout}"


AT = "2021-03-01T08:00:00Z"


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (("carbon", "regions"), "CISO"),
        (("carbon", "regions", "--json"), '"region": "CISO"'),
        (("carbon", "show", "--region", "CISO", "--at", AT), "314.22"),
        (("carbon", "show", "--region", "CISO", "--json"), '"carbon_g_per_kwh"'),
        (("carbon", "now", "--region", "CISO"), "CISO"),
    ],
    ids=["regions", "regions-json", "show-at", "show-series", "now"],
)
def test_carbon_reads_cold_load_no_sqlite_utils(planning_store, argv, shown):
    """The carbon commands that only read signals load no sqlite-utils, pandas or scipy."""
    code, out, err, loaded = _cold_run(*argv)
    assert code == 0, err
    assert shown in out
    heavy = loaded & {*_NOT_COLD, "sqlite_utils"}
    assert heavy == set(), sorted(heavy)


def test_an_unknown_region_is_refused_cold(planning_store):
    """The refusal reads the store the same way: a clear error naming the known regions."""
    code, _, err, loaded = _cold_run("carbon", "show", "--region", "NOPE", "--at", AT)
    assert code == 2
    assert "Error: no carbon signal for region 'NOPE'" in err and "CISO" in err
    assert "sqlite_utils" not in loaded


def test_the_probe_sees_sqlite_utils_when_a_command_writes(planning_store):
    """A command that writes through sqlite-utils shows it loaded: the probe can fail."""
    code, _, err, loaded = _cold_run("carbon", "import", "bundled:clover-ciso-march")
    assert code == 0, err
    assert "sqlite_utils" in loaded
