"""`greenctl cron install`: only lines that can work are written (issue 16, item 7)."""

from __future__ import annotations

import shlex

import pytest
from greenctl.data.errors import InputError
from greenctl.executor.control import cron
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _install(cli, *args, every="15m"):
    return cli("cron", "install", "--every", every, "--print", "--", *args)


@pytest.mark.parametrize(
    ("args", "said", "hint"),
    [
        (["replna", "--plan", "3"], "no command 'replna'", "did you mean replay or replan"),
        (["replan", "--plann", "3"], "No such option: --plann", "did you mean --plan?"),
        (["carbon", "fetc"], "`greenctl carbon` has no command 'fetc'", "did you mean fetch?"),
        (["replan", "--plan", "3", "--limit", "x"], "integer", "greenctl replan --help"),
        (["replan", "--plan", "3", "stray"], "unexpected extra argument", "replan --help"),
        (["carbon"], "`greenctl carbon` needs a command", "one of: fetch, import"),
        (["--db", "x.db"], "`greenctl` needs a command", "one of: apply"),
        (["replan", "--help"], "--help only prints", "schedule a command that does work"),
        (["carbon", "fetch", "--region", "CISO"], "Missing option '--provider'", "fetch --help"),
    ],
)
def test_a_command_greenctl_cannot_parse_is_refused(cli, tmp_path, args, said, hint):
    tab = tmp_path / "crontab"
    tab.write_text("0 1 * * * /usr/bin/backup\n")
    r = cli("cron", "install", "--every", "15m", "--crontab-file", tab, "--", *args)
    assert r.exit_code == 2, r.output
    assert "cannot schedule `greenctl " in r.output and said in r.output
    assert hint in r.output
    assert "Usage:" not in r.output  # parsing printed no help
    assert tab.read_text() == "0 1 * * * /usr/bin/backup\n"  # nothing installed


def test_a_command_that_parses_is_accepted(cli):
    r = _install(cli, "greenctl", "replan", "--plan", "3", "--apply", "--forecaster", "last")
    assert r.exit_code == 0, r.output
    assert "greenctl replan --plan 3 --apply --forecaster last >> " in r.stdout
    r = _install(cli, "carbon", "fetch", "--region", "CISO", "--provider", "watttime")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize(
    ("every", "gap", "nearest"),
    [
        ("7m", "4-minute gap", "use 6m or 10m"),
        ("45m", "15-minute gap", "use 30m or 1h"),
        ("5h", "4-hour gap", "use 4h or 6h"),
        ("7h", "3-hour gap", "use 6h or 8h"),
        ("90m", "within an hour or a day", "use 1h or 2h"),
        ("2d", "within an hour or a day", "use 1d"),
    ],
)
def test_uneven_intervals_are_refused_with_the_nearest_even_ones(cli, every, gap, nearest):
    r = _install(cli, "replan", "--plan", "3", every=every)
    assert r.exit_code == 2, r.output
    assert f"--every '{every}' does not divide" in r.output
    assert gap in r.output and nearest in r.output


@pytest.mark.parametrize(
    ("every", "schedule"),
    [
        ("1m", "* * * * *"),
        ("5m", "*/5 * * * *"),
        ("20m", "*/20 * * * *"),
        ("30m", "*/30 * * * *"),
        ("60m", "0 * * * *"),
        ("1h", "0 * * * *"),
        ("8h", "0 */8 * * *"),
        ("12h", "0 */12 * * *"),
        ("24h", "0 0 * * *"),
        ("1d", "0 0 * * *"),
    ],
)
def test_even_intervals(every, schedule):
    assert cron.cron_schedule(every) == schedule


@pytest.mark.parametrize("every", ["45s", "0m", "15", "soon", "-5m", "infm", "1.5m"])
def test_intervals_that_are_not_whole_minutes_are_refused(every):
    with pytest.raises(InputError, match="--every"):
        cron.cron_schedule(every)


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=1, max_value=3000), unit=st.sampled_from(["m", "h", "d"]))
def test_every_accepted_interval_repeats_evenly(n, unit):
    """Each schedule cron_schedule accepts fires at equal gaps all day, wrap included."""
    try:
        schedule = cron.cron_schedule(f"{n}{unit}")
    except InputError as exc:
        assert exc.exit_code == 2 and exc.hint and exc.hint.startswith("use ")
        return
    minute, hour = schedule.split()[:2]

    def field(text, top):
        if text == "*":
            return list(range(top))
        if text.startswith("*/"):
            return list(range(0, top, int(text[2:])))
        return [int(text)]

    fires = sorted(h * 60 + m for h in field(hour, 24) for m in field(minute, 60))
    gaps = {b - a for a, b in zip(fires, [*fires[1:], fires[0] + 1440], strict=True)}
    assert gaps == {n * {"m": 1, "h": 60, "d": 1440}[unit]}


def test_the_line_quotes_arguments_and_uses_absolute_paths(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = _install(cli, "--db", "rel.db", "replan", "--plan", "my plan.json", "--at", "50%")
    assert r.exit_code == 0, r.output
    line = r.stdout.strip()
    assert f"--db {tmp_path / 'rel.db'} replan" in line  # cron starts in $HOME
    assert "'my plan.json'" in line
    assert "50\\%" in line and "50%" not in line.replace("\\%", "")  # % is a newline to cron
    cmd = line.split(" ", 5)[5].replace("\\%", "%").rsplit(" # greenctl:", 1)[0]
    words = shlex.split(cmd)
    assert words[0].startswith("GREENCTL_DB=/") and words[1].startswith("/")
    assert words[2:9] == ["--db", str(tmp_path / "rel.db"), "replan", "--plan", "my plan.json",
                          "--at", "50%"]  # fmt: skip
    r = _install(cli, "--db=rel.db", "replan", "--plan", "3")
    assert f"--db={tmp_path / 'rel.db'} replan" in r.stdout


def test_a_plan_file_named_relative_to_here_is_made_absolute(cli, tmp_path, monkeypatch):
    """cron starts in $HOME: `-- replan --plan plan.json` must name the file it names here."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text("{}")
    (tmp_path / "trace.txt").write_text("1 2 3\n")
    r = _install(cli, "replan", "--plan", "plan.json", "--apply")
    assert r.exit_code == 0, r.output
    words = shlex.split(r.stdout.strip().split(" ", 5)[5].rsplit(" # greenctl:", 1)[0])
    assert words[2:6] == ["replan", "--plan", str(tmp_path / "plan.json"), "--apply"]
    # --option=value too; a plan id (no such file here) is left alone
    r = _install(cli, "forecast", "predict", "--trace=trace.txt")
    assert f"--trace={tmp_path / 'trace.txt'}" in r.stdout
    r = _install(cli, "replan", "--plan", "3")
    assert "--plan 3 " in r.stdout


def test_a_line_break_in_an_argument_is_refused(tmp_path):
    with pytest.raises(InputError, match="line break"):
        cron.cron_line(["replan", "--plan", "3\n* * * * * rm"], every="15m", db_path=tmp_path)


WORDS = ["replan", "replna", "--plan", "3", "--apply", "carbon", "fetch", "--region", "CISO",
         "--db", "x.db", "--every", "-f", "last", "--help", "plan", "mix", "--", "%", "a b", ""]  # fmt: skip


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    args=st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=8)), max_size=6),
    every=st.one_of(st.sampled_from(["15m", "7m", "1h", "5h", "1d"]), st.text(max_size=6)),
)
def test_cron_install_fuzz(cli, tmp_path, args, every):
    """Any command words and interval: installed (exit 0) or refused with exit 2, never a
    traceback, and a refused line leaves the crontab as it was."""
    tab = tmp_path / "crontab"
    tab.write_text("0 1 * * * /usr/bin/backup\n")
    r = cli("cron", "install", "--every", every, "--crontab-file", tab, "--", *args)
    assert r.exit_code in (0, 2), r.output
    if r.exit_code == 2:
        assert r.output.startswith("Error: ") and "Traceback" not in r.output
        assert tab.read_text() == "0 1 * * * /usr/bin/backup\n"
    else:
        lines = tab.read_text().splitlines()
        assert len(lines) == 2 and lines[1].endswith("# greenctl:replan")
