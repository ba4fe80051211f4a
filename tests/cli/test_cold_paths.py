"""Cold commands that only read carbon signals and profiles (``carbon regions``, ``carbon
show``, ``carbon now``, ``plan mix --region R --at T``) load neither sqlite-utils (nor, through
it, pandas) nor scipy: each runs as a fresh process of the entry point on a seeded store."""

from __future__ import annotations

import subprocess
import sys

import pytest
from greenctl.data.records import Profile, Variant

#: what a command that only reads the store must not load
_HEAVY = frozenset({"sqlite_utils", "pandas", "scipy"})

AT = "2021-03-01T08:00:00Z"

#: runs ``greenctl ARGV`` as the entry point does, then names the modules it loaded
_PROBE = (
    "import sys\n"
    "from greenctl.cli.main import main\n"
    "sys.argv = ['greenctl', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code or 0\nelse:\n    code = 0\n"
    "names = sorted({m.split('.')[0] for m in sys.modules})\n"
    "print('exit', code, 'loaded', ','.join(names), file=sys.stderr)\n"
)


def _cold(*argv: str) -> tuple[int, str, str, set[str]]:
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
def seeded(store, cli):
    """Family ``c`` measured on one core, family ``d`` load-tested on two, the CISO trace."""
    store.upsert_variant(Variant("c-small", "c", accuracy=0.70, load_time_s=1.0))
    store.upsert_variant(Variant("d-one", "d", accuracy=0.75, load_time_s=1.0))
    rows = [
        Profile("c-small", "cpu:1", b, 250.0 * b**0.3, 4.0 * b**0.7, 6.4 * b**0.7, 7.6 * b**0.7)
        for b in (1, 2, 4)
    ]
    tested = dict(capacity_rps=90.0, capacity_slo_ms=40.0)
    rows.append(Profile("d-one", "cpu:2", 1, 150.0, 8.0, None, 30.0, energy_j=0.03, **tested))
    store.add_profiles(rows)
    assert cli("carbon", "import", "bundled:clover-ciso-march").exit_code == 0
    return store


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
def test_carbon_reads_load_no_sqlite_utils_pandas_or_scipy(seeded, argv, shown):
    code, out, err, loaded = _cold(*argv)
    assert code == 0, err
    assert shown in out
    assert loaded & _HEAVY == set(), sorted(loaded & _HEAVY)


def test_an_unknown_region_is_refused_cold(seeded):
    """The refusal reads the store the same way: a clear error naming the known regions."""
    code, _, err, loaded = _cold("carbon", "show", "--region", "NOPE", "--at", AT)
    assert code == 2
    assert "Error: no carbon signal for region 'NOPE'" in err
    assert "CISO" in err
    assert loaded & _HEAVY == set(), sorted(loaded & _HEAVY)


@pytest.mark.parametrize(("model", "budget"), [("c", "cpu=2"), ("d", "cpu=8")])
def test_plan_mix_at_a_region_and_time_loads_no_sqlite_utils(seeded, tmp_path, model, budget):
    """Planning reads the profiles, the serving runs and the region's signal at ``--at``."""
    plan = tmp_path / f"{model}.json"
    code, out, err, loaded = _cold(
        "plan", "mix", "--model", model, "--rate", "40", "--slo-ms", "100",
        "--budget", budget, "--region", "CISO", "--at", AT, "-o", str(plan),
    )  # fmt: skip
    assert code == 0, err
    assert plan.exists()
    assert "314.22" in out + err  # the signal in force at --at
    assert loaded & _HEAVY == set(), sorted(loaded & _HEAVY)


def test_the_probe_sees_sqlite_utils_when_a_command_writes(seeded):
    """A command that writes through sqlite-utils shows it loaded: the probe can fail."""
    code, _, err, loaded = _cold("carbon", "import", "bundled:clover-ciso-march")
    assert code == 0, err
    assert "sqlite_utils" in loaded
