"""``greenctl simulate`` of an llm plan shows its time to first token and per output token."""

from __future__ import annotations

from greenctl.data.plan import write_plan_file
from greenctl.executor.kinds import plan

from tests.planner.llm.rows import add_family


def test_the_table_shows_ttft_and_tpot_at_the_plans_percentile(store, db_path, cli, tmp_path):
    add_family(store)
    made = plan(store, "llm", {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60,
                               "budget": {"cpu": 8}})  # fmt: skip
    path = tmp_path / "llm.json"
    write_plan_file(made, path)
    r = cli("simulate", path, "--requests", "5000", "--db", db_path)
    assert r.exit_code == 0, r.output
    assert "time to first token p95" in r.output
    assert "time per output token p95" in r.output
    assert "Traceback" not in r.output
    analytic = cli("simulate", path, "--analytic", "--db", db_path)
    assert analytic.exit_code == 0, analytic.output
    assert "time to first token p95" in analytic.output
