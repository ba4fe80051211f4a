"""The one error tree of greenctl.

Library code raises these; `greenctl.cli.main` maps them to ``Error: ...`` messages and
exit codes in one place (0 ok, 1 runtime failure, 2 bad input or usage, 3 infeasible plan).
Messages are written for the user: they name the file, line, field and the fix.
"""

from __future__ import annotations

from typing import Any


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every non-printable character (terminal escapes, NUL, bidi controls)
    written as its Python escape, so that a message never drives the user's terminal;
    ``keep_newlines`` keeps line breaks (a message and its hint line)."""
    return "".join(
        c if c.isprintable() or (keep_newlines and c == "\n") else ascii(c)[1:-1] for c in text
    )


def shown(value: Any, limit: int = 40) -> str:
    """A value as it goes into an error message: non-printables escaped, long text cut."""
    text = printable(value if isinstance(value, str) else repr(value))
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class GreenctlError(Exception):
    """Base class of every error greenctl raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class InputError(GreenctlError):
    """Bad input from the user: a file, a flag, a field. Exit code 2."""

    exit_code = 2


class FileFormatError(InputError):
    """A malformed input file; names the file, line and column."""

    def __init__(
        self,
        path: str,
        reason: str,
        *,
        line: int | None = None,
        column: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = str(path)
        if line is not None:
            where += f", line {line}"
        if column is not None:
            where += f", column '{column}'"
        super().__init__(f"{where}: {reason}", hint=hint)
        self.path = str(path)
        self.line = line
        self.column = column
        self.reason = reason


class NotFoundError(InputError):
    """A named thing (variant, plan, region, model) is not in the store."""


class InfeasiblePlan(GreenctlError):
    """The planning problem has no solution; the message names the binding constraint. Exit 3."""

    exit_code = 3
    #: where the budgets bind: the largest share (< 1) of the requested load they can serve
    servable_scale: float | None = None


class SolverError(GreenctlError):
    """A solver stopped without an answer (not an infeasible plan: a failure). Exit code 1."""

    exit_code = 1


class HardwareError(GreenctlError):
    """The hardware (NVML, MIG, CPU affinity) refused or failed. Exit code 1."""

    exit_code = 1


class StoreError(GreenctlError):
    """The SQLite store is unreadable, locked or from a newer greenctl. Exit code 1."""

    exit_code = 1


class ExecutorError(GreenctlError):
    """Starting, stopping or talking to executor daemons failed. Exit code 1."""

    exit_code = 1


class LockedError(GreenctlError):
    """Another greenctl run holds the lock (apply, replan). Exit code 1."""

    exit_code = 1
