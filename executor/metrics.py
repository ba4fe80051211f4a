"""Prometheus exposition shared by the executors and the dispatcher: bucket bounds and the
text of a histogram (https://prometheus.io/docs/instrumenting/exposition_formats/)."""

from __future__ import annotations

#: Request latency histogram bounds, seconds (Prometheus's base unit).
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
#: Rows-per-batch histogram bounds.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def bucket_index(bounds: tuple[float, ...], value: float) -> int:
    """The index of the first bound ``value`` fits under (``len(bounds)``: the +Inf bucket)."""
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds)


def histogram_lines(
    name: str,
    help_text: str,
    labels: str,
    bounds: tuple[float, ...],
    counts: list[int],
    total: float,
) -> list[str]:
    """A histogram's HELP, TYPE, cumulative buckets, sum and count lines.

    ``counts`` holds one count per bound and a last one for +Inf (see :func:`bucket_index`).
    """
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    acc = 0
    for b, c in zip(bounds, counts, strict=False):
        acc += c
        lines.append(f'{name}_bucket{{{labels},le="{b:g}"}} {acc}')
    acc += counts[-1]
    lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {acc}')
    lines.append(f"{name}_sum{{{labels}}} {total:.6f}")
    lines.append(f"{name}_count{{{labels}}} {acc}")
    return lines
