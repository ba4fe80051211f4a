"""LLM request traces: when each request arrives and how many tokens it reads and writes.

Two public schemas, found by their CSV header (gzip-compressed or not): the Azure LLM
inference traces (``TIMESTAMP, ContextTokens, GeneratedTokens``, the time a wall-clock
stamp such as ``2023-11-16 18:15:46.6805900``) and BurstGPT's (``Timestamp, Model, Request
tokens, Response tokens, Total tokens, Log Type``, the time in seconds from the start;
``model`` and ``log_type`` keep one model's or one kind of log's rows).
:func:`synthetic_llm_trace` draws a workload as BurstGPT models one (Gamma inter-arrival
times, whose shape sets the burstiness, and Zipf token counts), for tests and the demo.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import io
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from greenctl.data import bundled
from greenctl.data.errors import FileFormatError, InputError, shown
from greenctl.data.limits import BOUNDS, SLO_QUANTILES, bounded, number, whole
from greenctl.data.llm_profiles import percentiles

#: the columns of each schema: (time, prompt tokens, output tokens)
AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")
HINT = (
    "an LLM trace is a CSV with the Azure LLM trace's columns (TIMESTAMP, ContextTokens, "
    "GeneratedTokens) or BurstGPT's (Timestamp, Model, Request tokens, Response tokens, ...)"
)
#: the summary of no values (an empty trace)
_NO_PERCENTILES = dict.fromkeys(SLO_QUANTILES, 0.0)
#: the most tokens one request may state (prompt or output); more is a unit mistake
MAX_TOKENS = 10_000_000


@dataclass(frozen=True)
class LLMTrace:
    """Requests in arrival order: seconds from the first, prompt and output tokens each."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return int(self.arrival_s.size)

    @property
    def duration_s(self) -> float:
        """Seconds from the first arrival to the last (at least one second)."""
        return max(float(self.arrival_s[-1]) if len(self) else 0.0, 1.0)

    def rate_rps(self) -> float:
        """Mean arrival rate over the trace, requests per second."""
        return len(self) / self.duration_s

    def per_second(self) -> np.ndarray:
        """Requests arriving in each whole second: the trace as a requests-per-second trace."""
        return np.bincount(self.arrival_s.astype(np.int64)).astype(np.float64)

    def summary(self) -> dict[str, Any]:
        """Count, span, rate and the token counts' mean and percentiles."""

        def stats(values: np.ndarray) -> dict[str, float]:
            mean = float(values.mean()) if values.size else 0.0
            return {"mean": mean, **(percentiles(values.tolist()) or _NO_PERCENTILES)}

        return {
            "source": self.source,
            "requests": len(self),
            "duration_s": self.duration_s,
            "rate_rps": self.rate_rps(),
            "prompt_tokens": stats(self.prompt_tokens),
            "output_tokens": stats(self.output_tokens),
        }


def read_llm_trace(
    path: str | Path, *, model: str | None = None, log_type: str | None = None
) -> LLMTrace:
    """The requests of an Azure or BurstGPT trace file (or ``bundled:NAME``), sorted by time.

    Raises:
        InputError: the file is missing or unreadable; ``model``/``log_type`` on an Azure
            trace, or keeping no row.
        FileFormatError: not UTF-8 CSV text (or corrupt gzip), neither schema's columns, or a
            value that is not a time or a whole number of tokens (naming line and column).
    """
    p = bundled.resolve(path)
    rows = csv.DictReader(io.StringIO(_text(p)))
    header = rows.fieldnames or []
    if set(AZURE) <= set(header):
        if model is not None or log_type is not None:
            raise InputError("an Azure LLM trace has no Model or Log Type column to filter by")
        times, prompt, output = _read(p, rows, AZURE, _wall_seconds, {})
    elif set(BURSTGPT) <= set(header):
        keep = {k: v for k, v in (("Model", model), ("Log Type", log_type)) if v is not None}
        times, prompt, output = _read(p, rows, BURSTGPT, _seconds, keep)
    else:
        raise FileFormatError(str(p), f"columns {shown(', '.join(header))} are neither schema's",
                              line=1, hint=HINT)  # fmt: skip
    if not times:
        what = " matching the filter" if model is not None or log_type is not None else ""
        raise InputError(f"{p}: no requests{what}", hint=HINT)
    order = np.argsort(np.asarray(times), kind="stable")
    t = np.asarray(times, dtype=np.float64)[order]
    return LLMTrace(
        t - t[0],
        np.asarray(prompt, dtype=np.int64)[order],
        np.asarray(output, dtype=np.int64)[order],
        str(path),
    )


def _text(p: Path) -> str:
    """The file's text, gunzipped when it starts with gzip's magic bytes."""
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"LLM trace {p} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read LLM trace {p}: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise FileFormatError(str(p), f"not a valid gzip file ({exc})") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise FileFormatError(str(p), "not UTF-8 CSV text", line=line, hint=HINT) from None


def _read(
    p: Path, rows: csv.DictReader, cols: tuple[str, str, str], when: Any, keep: dict[str, str]
) -> tuple[list[float], list[int], list[int]]:
    """Each kept row's (time, prompt tokens, output tokens), checked."""
    times: list[float] = []
    prompt: list[int] = []
    output: list[int] = []
    for row in rows:
        line = rows.line_num
        if any(row.get(k) != v for k, v in keep.items()):
            continue
        times.append(when(p, row.get(cols[0]), line, cols[0]))
        prompt.append(_tokens(p, row.get(cols[1]), line, cols[1]))
        output.append(_tokens(p, row.get(cols[2]), line, cols[2]))
    return times, prompt, output


def _tokens(p: Path, value: str | None, line: int, column: str) -> int:
    text = (value or "").strip()
    if not text.isdigit() or int(text) > MAX_TOKENS:
        raise FileFormatError(str(p), f"{_cell(text)} is not a whole number of tokens "
                              f"(0 to {MAX_TOKENS:,})", line=line, column=column, hint=HINT)  # fmt: skip
    return int(text)


def _cell(value: str | None) -> str:
    """A cell's text as a message shows it; an empty cell said as such."""
    text = (value or "").strip()
    return shown(text) if text else "an empty cell"


def _seconds(p: Path, value: str | None, line: int, column: str) -> float:
    try:
        seconds = float((value or "").strip())
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise FileFormatError(str(p), f"{_cell(value)} is not a time in seconds >= 0",
                              line=line, column=column, hint=HINT)  # fmt: skip
    return seconds


def _wall_seconds(p: Path, value: str | None, line: int, column: str) -> float:
    """A wall-clock stamp as seconds since the epoch; fractions of any length (the Azure
    traces write seven digits, more than ``fromisoformat`` reads)."""
    text = (value or "").strip()
    head, _, frac = text.partition(".")
    try:
        stamp = dt.datetime.fromisoformat(head)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=dt.UTC)
        fraction = float(f"0.{frac}") if frac else 0.0
    except ValueError:
        raise FileFormatError(str(p), f"{_cell(text)} is not a time such as "
                              "2023-11-16 18:15:46.6805900", line=line, column=column,
                              hint=HINT) from None  # fmt: skip
    return stamp.timestamp() + fraction


def synthetic_llm_trace(
    rate_rps: float,
    duration_s: float,
    *,
    burstiness: float = 1.0,
    prompt_min: int = 32,
    output_min: int = 16,
    prompt_zipf: float = 2.0,
    output_zipf: float = 2.5,
    max_prompt: int = 4096,
    max_output: int = 1024,
    seed: int = 0,
) -> LLMTrace:
    """A workload of ``rate_rps`` for ``duration_s``: Gamma inter-arrival times with a
    coefficient of variation of ``burstiness`` (1: Poisson; BurstGPT fits above 1), and
    token counts from a power law (Zipf's, continuous: ``P(X > x) = (min / x)^(s - 1)`` for
    exponent ``s``) above each minimum, cut at each maximum. The defaults give prompts of
    64 tokens and outputs of 25 at the median.

    Raises:
        InputError: a value outside its bound, naming it.
    """
    rate = bounded(rate_rps, "rate_rps", "rate_rps")
    span = number(duration_s, "duration_s", minimum=0.0, strict=True,
                  maximum=BOUNDS["duration_s"].high)  # fmt: skip
    cv = number(burstiness, "burstiness", minimum=0.0, strict=True, maximum=100.0)
    for name, a in (("prompt_zipf", prompt_zipf), ("output_zipf", output_zipf)):
        if not (isinstance(a, int | float) and math.isfinite(a) and a > 1.0):
            raise InputError(f"{name} must be a number > 1 (a Zipf exponent), got {shown(a)}")
    lo_prompt = whole(prompt_min, "prompt_min", "count")
    lo_output = whole(output_min, "output_min", "count")
    hi_prompt = whole(max_prompt, "max_prompt", "count")
    hi_output = whole(max_output, "max_output", "count")
    rng = np.random.default_rng(whole(seed, "seed", "seed"))
    shape = 1.0 / (cv * cv)  # a Gamma of shape k has a coefficient of variation 1/sqrt(k)
    chunk = int(rate * span) + 16
    gaps = rng.gamma(shape, 1.0 / (shape * rate), size=chunk)
    while gaps[1:].sum() < span:  # a burstier draw may need more gaps to cover the span
        gaps = np.concatenate([gaps, rng.gamma(shape, 1.0 / (shape * rate), size=chunk)])
    arrival = np.cumsum(gaps) - gaps[0]
    arrival = arrival[arrival < span]
    n = arrival.size
    prompt = _power_law(rng, n, lo_prompt, prompt_zipf, hi_prompt)
    output = _power_law(rng, n, lo_output, output_zipf, hi_output)
    return LLMTrace(arrival, prompt, output, f"synthetic:{rate:g}rps:{span:g}s:cv{cv:g}")


def _power_law(rng: np.random.Generator, n: int, low: int, s: float, high: int) -> np.ndarray:
    """``n`` whole counts with ``P(X > x) = (low / x)^(s - 1)``, cut at ``high``."""
    draws = np.floor(low * (1.0 + rng.pareto(s - 1.0, size=n)))
    return np.minimum(draws, max(high, low)).astype(np.int64)


def write_llm_trace(trace: LLMTrace, path: str | Path) -> Path:
    """``trace`` as a BurstGPT-schema CSV (times in seconds), which :func:`read_llm_trace`
    reads back unchanged."""
    p = Path(path)
    with p.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens",
                    "Log Type"])  # fmt: skip
        for t, a, b in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens, strict=True):
            w.writerow([repr(float(t)), "", int(a), int(b), int(a + b), ""])
    return p
