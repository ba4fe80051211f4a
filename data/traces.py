"""Requests-per-second load traces: the one reader of every trace greenctl takes.

A trace holds one rate (requests per second, >= 0) per second, as numbers separated by
whitespace or commas (``#`` starts a comment line), or as a CSV whose header names a
``rate_rps`` column; either may be gzip-compressed (found by its magic bytes, whatever the
file is called); a path may also be ``bundled:NAME``, such as the Twitter trace
(``bundled:twitter``), the reference.
``simulate --trace``, ``loadgen --trace``, ``forecast fit/predict --trace`` and the replay
all read through :func:`read_rps_trace`.
"""

from __future__ import annotations

import csv
import gzip
import io
import zlib
from pathlib import Path

import numpy as np
from greenctl.data import bundled
from greenctl.data.errors import FileFormatError, InputError, shown

TRACE_HINT = "a trace holds one requests-per-second value (a number >= 0) per second"
GZIP_MAGIC = b"\x1f\x8b"


def read_rps_trace(path: str | Path) -> np.ndarray:
    """The per-second request rates of a trace file or ``bundled:NAME`` (see the module docstring).

    Raises:
        InputError: the file is missing or unreadable.
        FileFormatError: not text (or corrupt gzip), no values, or a value that is not a
            finite number >= 0 (naming its line, and the column of a CSV).
    """
    p = bundled.resolve(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"trace file {p} does not exist") from None
    except OSError as exc:  # a directory, no permission
        raise InputError(f"cannot read trace file {p}: {exc.strerror or exc}") from None
    if raw[:2] == GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise FileFormatError(str(p), f"not a valid gzip file ({exc})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            str(p),
            "not a text file of numbers",
            line=raw.count(b"\n", 0, exc.start) + 1,
            hint=TRACE_HINT,
        ) from None
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
    values = _csv_rates(p, text) if "rate_rps" in first else _plain_rates(p, lines)
    if values.size == 0:
        raise FileFormatError(str(p), "the trace has no values", hint=TRACE_HINT)
    return values


def _plain_rates(p: Path, lines: list[str]) -> np.ndarray:
    body = [ln for ln in lines if not ln.lstrip().startswith("#")]
    try:  # the fast path (the Twitter trace is 1.2M values); errors are found line by line
        values = np.asarray(" ".join(body).replace(",", " ").split(), dtype=float)
        if np.isfinite(values).all() and (values >= 0).all():
            return values
    except (ValueError, OverflowError):
        pass
    out: list[float] = []
    for lineno, line in enumerate(lines, 1):
        if line.lstrip().startswith("#"):
            continue
        for token in line.replace(",", " ").split():
            out.append(_rate(p, token, line=lineno))
    return np.asarray(out, dtype=float)


def _csv_rates(p: Path, text: str) -> np.ndarray:
    body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    try:
        reader = csv.DictReader(io.StringIO(body))
        out = [
            _rate(p, row.get("rate_rps"), line=i, column="rate_rps")
            for i, row in enumerate(reader, start=2)
        ]
    except csv.Error as exc:
        raise FileFormatError(str(p), f"not readable as CSV: {exc}", hint=TRACE_HINT) from None
    return np.asarray(out, dtype=float)


def _rate(p: Path, token: object, *, line: int, column: str | None = None) -> float:
    try:
        value = float(token)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise FileFormatError(
            str(p), f"'{shown(token)}' is not a number", line=line, column=column, hint=TRACE_HINT
        ) from None
    if not np.isfinite(value) or value < 0:
        raise FileFormatError(
            str(p),
            f"'{shown(token)}' is not a rate >= 0",
            line=line,
            column=column,
            hint=TRACE_HINT,
        )
    return value
