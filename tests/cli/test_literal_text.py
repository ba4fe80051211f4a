"""User text (names of variants, models, regions, files; reasons and notes built from them)
is printed as it is, never read as rich markup (``[red]``) or emoji codes (``:abc:``); and
read-only commands pointed at a path with no store create none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from greenctl.data import carbon_io
from greenctl.data.bundled import path_of
from greenctl.data.records import Profile, Variant

# rich would read each of these as markup or an emoji code and drop or change it
ODD = "[red]x[/red][bold]:abc:"
ODD_FILE = "[red]x[bold]:abc:"  # the same in a file name (no slash)
GPULET = path_of("gpulet")


@pytest.fixture
def wide(monkeypatch):
    """Wide consoles, so that no line or table cell is folded in the middle of a name."""
    from greenctl.cli import common

    monkeypatch.setattr(common.console, "width", 400)
    monkeypatch.setattr(common.err_console, "width", 400)


def flat(text: str) -> str:
    """``text`` with runs of white space as one space: titles and captions wrap to the
    table's width."""
    return " ".join(text.split())


def _carbon_csv(tmp_path: Path, region: str) -> Path:
    f = tmp_path / "carbon.csv"
    f.write_text(
        "time,region,carbon_g_per_kwh\n"
        f'2021-03-01T00:00:00Z,"{region}",124.57\n2021-03-01T01:00:00Z,"{region}",135.6\n'
    )
    return f


def _tiny(store, names: tuple[str, str]) -> None:
    """A family "tiny" of two variants called ``names``, modeled on cpu:1 and cpu:2."""
    rows = []
    for name, acc, thr, lat in ((names[0], 0.7, 400, 3), (names[1], 0.8, 60, 20)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc, load_time_s=1.0))
        for c in (1, 2):
            rows.append(
                Profile(
                    name, f"cpu:{c}", 1, thr * c,
                    latency_p50_ms=lat / c, latency_p95_ms=1.5 * lat / c,
                    latency_p99_ms=2 * lat / c, power_w=10 * c, energy_j=0.1,
                    energy_method="modeled", capacity_rps=thr * c * 0.8,
                    capacity_slo_ms=100, cost_per_hour=0.05 * c, source="synthetic",
                )
            )  # fmt: skip
    store.add_profiles(rows)


# -- the print helper and render_table -----------------------------------------------------------
def test_say_and_render_table_print_user_text_literally(capsys, wide):
    from greenctl.cli.common import render_table, say

    say(("warning:", "yellow"), f" variant {ODD} ends with a backslash \\")
    say(f"note: {ODD}", err=True, highlight=False)
    render_table(f"Plan of {ODD}", ["name"], [[ODD]], caption=f"caption {ODD}")
    out, err = capsys.readouterr()
    assert f"warning: variant {ODD} ends with a backslash \\\n" in out
    assert f"Plan of {ODD}" in flat(out) and f"caption {ODD}" in flat(out)
    assert out.count(ODD) == 4
    assert f"note: {ODD}" in err


# -- commands -------------------------------------------------------------------------------------
def test_carbon_show_and_now_print_the_region_literally(cli, tmp_path, wide):
    region = f"X{ODD}Y"
    r = cli("carbon", "import", _carbon_csv(tmp_path, region))
    assert r.exit_code == 0, r.output
    assert f"for {region}," in r.output
    r = cli("carbon", "show", "--region", region)
    assert r.exit_code == 0, r.output
    assert f"Carbon intensity, {region}" in flat(r.output)  # the table title
    r = cli("carbon", "now", "--region", region)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"{region}: 135.6 gCO2/kWh")
    assert "(stale: newest stored value, not current)" in r.output
    r = cli("carbon", "show", "--region", f"Z{ODD}")  # an error message, printed by main
    assert r.exit_code == 2 and f"Z{ODD}" in r.output


def test_plan_mix_note_and_caption_quote_the_region_literally(cli, store, tmp_path, wide):
    _tiny(store, ("tiny-s", "tiny-l"))
    region = f"R{ODD}"
    carbon_io.import_carbon(store, _carbon_csv(tmp_path, region))
    r = cli(
        "plan", "mix", "--model", "tiny", "--rate", "50", "--slo-ms", "100", "--budget", "cpu=4",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    # the only region in the store is used: the note and the table caption name it
    assert f"note: carbon intensity from the signal of {region}, the only region" in r.output
    assert f"(signal {region}, average" in flat(r.output)
    r = cli(
        "plan", "mix", "--model", f"a[b]c{ODD}", "--rate", "50", "--slo-ms", "100",
        "--carbon-intensity", "100",
    )  # fmt: skip
    assert r.exit_code == 2 and f"a[b]c{ODD}" in r.output


def test_replan_prints_its_reason_literally(cli, store, wide):
    names = (f"t{ODD}s", f"t{ODD}l")
    _tiny(store, names)
    carbon_io.import_bundled(store, "clover-ciso-march")
    from greenctl.planner.mix import solve as mix

    req = {"model": "tiny", "rate_rps": 50, "slo_ms": 100, "budgets": {"cpu": 4},
           "carbon_intensity": 124.57}  # fmt: skip
    plan = mix.plan_mix(
        mix.build_mix_problem(req, store.variants("tiny"), store.latest_profiles(family="tiny"))
    )
    # a running option no longer in the problem: the reason quotes its variant
    plan.deployments = [dataclasses.replace(d, resource="cpu:3") for d in plan.deployments]
    pid = store.save_plan(plan)
    r = cli("replan", "--plan", str(pid), "--region", "CISO", "--at", "2021-03-01T00:00:00Z")
    assert r.exit_code == 0, r.output
    variant = plan.deployments[0].variant
    assert f"running option {variant}@cpu:3 is no longer eligible" in r.output
    r = cli("replan", "--history")
    assert r.exit_code == 0 and variant in r.output


def test_forecast_and_cron_print_names_literally(cli, tmp_path, wide):
    trace = tmp_path / "rps.txt"
    trace.write_text(" ".join(str(50 + (i % 7)) for i in range(120 * 60)))
    name = f"f{ODD}"
    r = cli("forecast", "fit", "-f", "last", "--name", name, "--trace", trace)
    assert r.exit_code == 0, r.output
    assert f"Saved forecaster '{name}' (last)" in r.output
    r = cli("forecast", "predict", "-f", name, "--trace", trace)
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"{name}: next minute's peak")
    r = cli("forecast", "list")
    assert r.exit_code == 0 and name in r.output
    crontab = tmp_path / "crontab"
    crontab.write_text("")
    r = cli("cron", "remove", "--name", name, "--crontab-file", crontab)
    assert r.exit_code == 0
    assert f"no crontab line tagged greenctl:{name}" in r.output


def test_plan_glet_prints_the_output_path_literally(cli, tmp_path, wide):
    assert cli("gpulet", "import", "bundled:gpulet").exit_code == 0
    out = tmp_path / f"p{ODD_FILE}.json"
    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--no-interference",
        "--simulate-seconds", "1", "-o", out,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert out.is_file()
    assert f"plan written to {out}" in r.output
    r = cli("plan", "glet", "--model", "resnet50:abc:50")  # the message quotes it as given
    assert r.exit_code == 2 and "resnet50:abc:50" in r.output


# -- read-only commands create no store ----------------------------------------------------------
READ_ONLY = [
    ("plan", "list"),
    ("plan", "show", "1"),
    ("carbon", "show", "--region", "CISO"),
    ("carbon", "now", "--region", "CISO"),
    ("carbon", "regions"),
    ("forecast", "list"),
    ("interference", "show"),
    ("status",),
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=" ".join)
@pytest.mark.parametrize("where", ["root", "command", "env"])
def test_read_only_commands_create_no_store(cli, tmp_path, monkeypatch, argv, where):
    path = tmp_path / "x" / "new.db"
    path.parent.mkdir()
    if where == "root":
        r = cli("--db", path, *argv)
    elif where == "command":
        r = cli(*argv, "--db", path)
    else:
        monkeypatch.setenv("GREENCTL_DB", str(path))
        r = cli(*argv)
    assert r.exit_code == 2, r.output
    assert f"no greenctl store at {path}" in " ".join(r.output.split())
    assert list(path.parent.iterdir()) == []  # no store, no -wal / -shm beside it
    # once the store is made, the same command reads it (an empty store: a list or "no plan")
    from greenctl.data.store import open_store

    open_store(path).close()
    r = cli("--db", path, *argv)
    # 1: status of nothing applied (nothing serves)
    assert r.exit_code in ((0, 1) if argv == ("status",) else (0, 2)), r.output
    assert "no greenctl store" not in r.output, r.output
