"""Cron: the schedule and crontab line of a periodic ``greenctl replan``, installed into or
removed from the user's crontab."""

from __future__ import annotations

import math
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from greenctl.data.errors import InputError
from greenctl.executor.control.replan import parse_duration

CRON_TAG = "# greenctl:"
# cron's */N restarts at every hour (minutes) or day (hours): only divisors run evenly
EVEN_MINUTES = (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30)
EVEN_HOURS = (1, 2, 3, 4, 6, 8, 12)
PERCENT_ESCAPED = "\\%"


def _interval_text(minutes: int) -> str:
    if minutes % 1440 == 0:
        return f"{minutes // 1440}d"
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def cron_schedule(every: str) -> str:
    """The crontab schedule of ``--every``: an interval that divides the hour (1, 2, 3, 4, 5,
    6, 10, 12, 15, 20 or 30 minutes) or the day (1, 2, 3, 4, 6, 8 or 12 hours), or ``1d``.

    Raises:
        InputError: an interval cron cannot run evenly (``*/7`` leaves a 4-minute gap after
            :56, ``*/5`` hours a 4-hour gap at midnight), naming the nearest even ones.
    """
    even = [*EVEN_MINUTES, *(60 * h for h in EVEN_HOURS), 1440]
    seconds = parse_duration(every, option="--every")
    if not math.isfinite(seconds) or seconds < 60 or seconds % 60:
        raise InputError(
            f"--every '{every}' is not a whole number of minutes (cron's step is one minute)",
            hint="write the unit: e.g. 5m, 15m, 1h, 6h or 1d",
        )
    minutes = int(seconds // 60)
    if minutes in EVEN_MINUTES:
        return "* * * * *" if minutes == 1 else f"*/{minutes} * * * *"
    if minutes % 60 == 0 and minutes // 60 in EVEN_HOURS:
        hours = minutes // 60
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    if minutes == 1440:
        return "0 0 * * *"
    if minutes < 60:
        why = f"*/{minutes} leaves a {60 - 59 // minutes * minutes}-minute gap every hour"
    elif minutes < 1440 and minutes % 60 == 0:
        hours = minutes // 60
        why = f"*/{hours} hours leaves a {24 - 23 // hours * hours}-hour gap every day"
    else:
        why = "cron's */N repeats only within an hour or a day"
    near = [max((e for e in even if e < minutes), default=None)]
    near.append(min((e for e in even if e > minutes), default=None))
    nearest = " or ".join(_interval_text(e) for e in near if e is not None)
    raise InputError(
        f"--every '{every}' does not divide the hour or the day evenly ({why})",
        hint=f"use {nearest} (even intervals: " + ", ".join(_interval_text(e) for e in even) + ")",
    )


def greenctl_executable() -> list[str]:
    """Absolute command line that starts this greenctl (the console script next to this
    Python, else ``python -c``)."""
    beside = Path(sys.executable).parent / "greenctl"
    if beside.exists():
        return [str(beside.absolute())]
    found = shutil.which("greenctl")
    if found:
        return [str(Path(found).absolute())]
    return [sys.executable, "-c", "from greenctl.cli.main import main; main()"]


def cron_line(
    args: list[str], *, every: str, db_path: Path, log: str | None = None, name: str = "replan"
) -> str:
    """A crontab line running ``greenctl ARGS`` with absolute paths and the store location.

    The arguments are shell-quoted and ``%`` (a newline to cron) escaped; a ``--db`` among
    them, and any argument naming a file here, is made absolute (cron starts in $HOME).

    Raises:
        InputError: no command given, a bad interval or name, or an argument cron cannot carry.
    """
    if not args:
        raise InputError(
            "no greenctl command to schedule",
            hint="write it after --, e.g. `greenctl cron install --every 15m -- replan "
            "--plan 3 --apply`",
        )
    if args[0] == "greenctl":
        args = args[1:]
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InputError(f"--name '{name}' must be letters, digits, - or _")
    bad = [a for a in args if "\n" in a or "\r" in a]
    if bad:
        raise InputError(
            f"argument {bad[0]!r} holds a line break, which a crontab line cannot carry"
        )
    schedule = cron_schedule(every)
    log_path = Path(log).absolute() if log else db_path.parent / f"greenctl-{name}.log"
    cmd = " ".join(shlex.quote(a) for a in [*greenctl_executable(), *absolute_db_args(args)])
    line = f"GREENCTL_DB={shlex.quote(str(db_path))} {cmd} >> {shlex.quote(str(log_path))} 2>&1"
    # cron turns an unescaped % into a newline, even inside quotes
    return f"{schedule} {line.replace('%', PERCENT_ESCAPED)} {CRON_TAG}{name}"


def absolute_db_args(args: list[str]) -> list[str]:
    """``args`` with paths made absolute (relative to this directory; cron starts in $HOME).

    The value of every ``--db`` (the store need not exist yet), and every other argument or
    ``--option=value`` that names a file or folder existing here (a ``--plan plan.json``, a
    ``--trace``).
    """
    out = list(args)
    for i, a in enumerate(out):
        if a.startswith("--db=") and len(a) > 5:
            out[i] = "--db=" + str(Path(a[5:]).absolute())
        elif a == "--db" and i + 1 < len(out):
            out[i + 1] = str(Path(out[i + 1]).absolute())
        elif i > 0 and out[i - 1] == "--db":
            continue
        elif a.startswith("--") and "=" in a:
            opt, value = a.split("=", 1)
            if _names_a_path_here(value):
                out[i] = f"{opt}={Path(value).absolute()}"
        elif not a.startswith("-") and _names_a_path_here(a):
            out[i] = str(Path(a).absolute())
    return out


def _names_a_path_here(value: str) -> bool:
    if not value or Path(value).is_absolute():
        return False
    try:
        return Path(value).exists()
    except (OSError, ValueError):  # a name too long, or holding NUL
        return False


def _read_crontab(crontab_file: str | None) -> str:

    if crontab_file:
        p = Path(crontab_file)
        return p.read_text() if p.exists() else ""
    try:
        res = subprocess.run(["crontab", "-l"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise InputError(
            "the crontab command is not installed",
            hint="install cron, or use --print and add the line yourself",
        ) from None
    if res.returncode != 0:
        if "no crontab" in res.stderr.lower():
            return ""
        raise InputError(f"crontab -l failed: {res.stderr.strip()}")
    return res.stdout


def _write_crontab(text: str, crontab_file: str | None) -> str:

    if crontab_file:
        Path(crontab_file).write_text(text)
        return str(Path(crontab_file).absolute())
    res = subprocess.run(["crontab", "-"], input=text, capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        raise InputError(f"crontab - failed: {res.stderr.strip()}")
    return "the user's crontab"


def cron_install(line: str, *, name: str = "replan", crontab_file: str | None = None) -> str:
    """Install ``line``, replacing any line with the same tag; returns where."""
    kept = [
        ln for ln in _read_crontab(crontab_file).splitlines() if not ln.endswith(CRON_TAG + name)
    ]
    return _write_crontab("\n".join([*kept, line]) + "\n", crontab_file)


def cron_remove(*, name: str = "replan", crontab_file: str | None = None) -> int:
    """Remove the lines tagged ``name``; returns how many."""
    lines = _read_crontab(crontab_file).splitlines()
    kept = [ln for ln in lines if not ln.endswith(CRON_TAG + name)]
    if len(kept) != len(lines):
        _write_crontab("\n".join(kept) + ("\n" if kept else ""), crontab_file)
    return len(lines) - len(kept)
