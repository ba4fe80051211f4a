"""Tables fit the terminal without breaking a value across lines."""

from __future__ import annotations

import pytest
from greenctl.cli import common
from rich.console import Console

COLUMNS = ["variant", "resource", "batch", "p50 ms", "p95 ms", "p99 ms", "req/s", "power W"]
COLUMNS += ["J/req", "energy", "hardware"]
ROWS = [
    ["resnet18", "cpu:1", 1, 59.91, 69.85, 74.62, 16.6, 9.04, 0.546, "modeled", "AMD EPYC"],
    ["resnet34", "cpu:1", 1, 103.81, 129.43, 177.76, 9.32, 9.64, 1.04, "modeled", "AMD EPYC"],
]


def _render(monkeypatch: pytest.MonkeyPatch, width: int, columns=COLUMNS, rows=ROWS) -> str:
    out = Console(width=width, record=True, emoji=False)
    monkeypatch.setattr(common, "console", out)
    common.render_table("Profiles", columns, rows, caption="energy 'modeled' = a model")
    return out.export_text()


@pytest.mark.parametrize("width", [40, 60, 80, 100, 200])
def test_no_value_is_broken_and_no_line_is_too_wide(monkeypatch, width):
    text = _render(monkeypatch, width)
    for line in text.splitlines():
        assert len(line.rstrip()) <= width, line
    for row in ROWS:
        for value in row:
            assert common.fmt(value) in text, (width, value)


def test_wide_terminal_keeps_the_boxed_table(monkeypatch):
    assert "┃ variant" in _render(monkeypatch, 200)


def test_80_columns_draws_the_compact_table_one_row_a_line(monkeypatch):
    text = _render(monkeypatch, 80)
    assert "┃" not in text
    lines = [ln for ln in text.splitlines() if ln.startswith("resnet")]
    assert len(lines) == 2 and "AMD EPYC" in lines[0] and "177.76" in lines[1]


def test_too_narrow_prints_one_block_per_row(monkeypatch):
    text = _render(monkeypatch, 40)
    assert "resource  cpu:1" in text
    assert "hardware  AMD EPYC" in text
    assert "energy 'modeled' = a model" in text
