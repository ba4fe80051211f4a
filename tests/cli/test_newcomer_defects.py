"""What a new user met trying the README's commands: a profile table with values under the
wrong headers, an unknown family that listed no known ones, a refused budget that was
refused only after minutes of service modelling, replan and plan mix deciding the carbon
region by different rules, an export re-imported as duplicates, and simulate losing the
carbon and cost plan mix predicted."""

from __future__ import annotations

from pathlib import Path

import pytest

HEADER = "variant,model,resource,batch,throughput_rps,latency_ms"


@pytest.fixture
def wide(monkeypatch):
    """A wide console, so that no table cell is folded."""
    from greenctl.cli import common

    monkeypatch.setattr(common.console, "width", 250)


def table_cells(output: str) -> list[dict[str, str]]:
    """The rows of the last rich table in ``output``, as {header: cell}."""
    lines = output.splitlines()
    head = max(i for i, line in enumerate(lines) if line.startswith("┃"))
    headers = [h.strip() for h in lines[head].strip("┃").split("┃")]
    rows = []
    for line in lines[head + 1 :]:
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows.append(dict(zip(headers, cells, strict=True)))
    return rows


# -- profile show: every value under its own header -------------------------------------------
@pytest.mark.parametrize("command", [("show", "v1"), ("list",), ("list", "--all")])
def test_profile_tables_put_each_value_under_its_header(cli, tmp_path: Path, wide, command):
    path = tmp_path / "p.csv"
    path.write_text(
        f"{HEADER},power_w,energy_j,energy_method,capacity_rps,capacity_slo_ms,samples\n"
        "v1,fam,cpu:1,1,10,5,41.5,4.15,rapl,8.5,250,77\n"
    )
    assert cli("profile", "import", path).exit_code == 0
    r = cli("profile", *command)
    assert r.exit_code == 0, r.output
    [row] = table_cells(r.output)
    figures = {"power W": 41.5, "J/req": 4.15, "cap req/s": 8.5, "cap SLO ms": 250, "req/s": 10}
    assert {h: float(row[h]) for h in figures} == figures
    assert row["energy"] == "rapl"
    assert row.get("samples", "77") == "77"
