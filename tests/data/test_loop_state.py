"""The key that names one replanned lineage, said once for the CLI and the control loop."""

from __future__ import annotations

from pathlib import Path

from greenctl.data.loop_state import lineage_key


def test_a_plan_id_or_a_plan_file_names_its_lineage(tmp_path, monkeypatch):
    assert lineage_key(3) == lineage_key("3") == lineage_key(" 3 ") == "plan:3"
    monkeypatch.chdir(tmp_path)
    assert lineage_key("plan.json") == f"file:{Path(tmp_path / 'plan.json').resolve()}"
