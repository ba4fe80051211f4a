"""`greenctl plan llm`: tables and --json, the plan saved and written, --trace, --region, and
bad inputs refused (exit 2 naming the field, exit 3 naming the closest tier) with the store
left as it was. Profiles are synthetic rows written with add_llm_profiles."""

from __future__ import annotations

import json

import pytest
from greenctl.data import carbon_io
from greenctl.data.llm_traces import synthetic_llm_trace, write_llm_trace
from greenctl.data.plan import load_plan_file

from tests.planner.llm.rows import add_family

PLAN = ("plan", "llm", "--model", "llm", "--rate", "3", "--ttft-ms", "800", "--tpot-ms", "60",
        "--budget", "cpu=4", "--min-quality", "0.7")  # fmt: skip


@pytest.fixture
def llm_store(store):
    add_family(store)
    return store


def _plans(store) -> list:
    return store.plans(None)


def test_json_is_saved_and_written(cli, llm_store, tmp_path) -> None:
    out = tmp_path / "plan.json"
    r = cli(*PLAN, "--carbon-intensity", "300", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "llm" and doc["request"]["carbon_intensity"] == 300.0
    assert doc["request"]["budget"] == {"cpu": 4.0}
    assert sum(doc["llm"]["shares"].values()) == pytest.approx(1.0)
    pred = doc["predicted"]
    assert pred["quality"] >= 0.7 - 1e-9 and pred["ttft_p95_ms"] <= 800
    assert pred["energy_method"] == "modeled" and pred["objective_name"] == "carbon"
    assert load_plan_file(out).to_dict()["id"] == doc["id"]
    assert [p["id"] for p in _plans(llm_store)] == [doc["id"]]


def test_table_output_labels_modeled_energy(cli, llm_store) -> None:
    r = cli(*PLAN, "--carbon-intensity", "300")
    assert r.exit_code == 0, r.output
    assert "llm-medium" in r.output and "modeled energy" in r.output
    assert "300 gCO2/kWh (--carbon-intensity)" in r.output


def test_region_and_at_resolve_the_intensity(cli, llm_store) -> None:
    carbon_io.import_bundled(llm_store, "clover-ciso-march")
    r = cli(*PLAN, "--region", "CISO", "--at", "2021-03-01T05:00:00Z", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == pytest.approx(291.63)
    assert doc["carbon_source"]["region"] == "CISO"


def test_a_trace_gives_the_rate_and_lengths(cli, llm_store, tmp_path) -> None:
    trace = write_llm_trace(synthetic_llm_trace(2.0, 600, seed=1), tmp_path / "t.csv")
    args = ("plan", "llm", "--model", "llm", "--ttft-ms", "3000", "--tpot-ms", "80",
            "--budget", "cpu=8", "--trace", trace, "--json")  # fmt: skip
    r = cli(*args)
    assert r.exit_code == 0, r.output
    req = json.loads(r.stdout)["request"]
    assert req["rate_rps"] == pytest.approx(2.0, rel=0.15)
    assert req["trace"]["requests"] > 0 and req["trace"]["file"] == str(trace)
    assert req["prompt_tokens"] == pytest.approx(req["trace"]["prompt_tokens"]["mean"])
    r = cli(*args[:-1], "--rate", "1.5", "--json")  # --rate wins over the trace's
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["request"]["rate_rps"] == 1.5


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        ({"--rate": "0"}, 2, "rate_rps (--rate) must be > 0"),
        ({"--ttft-ms": "nan"}, 2, "ttft_ms (--ttft-ms) must be a finite number"),
        ({"--budget": "mig=2"}, 2, "an llm plan budgets cpu cores or gpu GPUs"),
        ({"--budget": "cpu"}, 2, "--budget 'cpu' is not KIND=N"),
        ({"--min-quality": "7"}, 2, "min_quality (--min-quality) must be <= 1"),
        ({"--model": "gpt"}, 2, "no LLM profiles of family 'gpt'"),
        ({"--ttft-ms": "40"}, 3, "closest: llm-small on cpu:1"),
        ({"--min-quality": "0.99"}, 3, "quality 0.99 cannot be reached"),
        ({"--rate": "40"}, 3, "budget cpu=4 serves at most"),
        ({"--budget": "gpu=1"}, 3, "no tier of 'llm' was profiled on the budget's resources"),
    ],
)
def test_bad_inputs_are_refused_and_nothing_is_saved(
    cli, llm_store, tmp_path, change, code, text
) -> None:
    args = list(PLAN)
    for flag, value in change.items():
        args[args.index(flag) + 1] = value
    out = tmp_path / "plan.json"
    r = cli(*args, "-o", out)
    assert r.exit_code == code, r.output
    assert "Error:" in r.output and text in r.output and "Traceback" not in r.output
    assert _plans(llm_store) == [] and not out.exists()


def test_a_trace_with_token_lengths_is_refused(cli, llm_store, tmp_path) -> None:
    trace = write_llm_trace(synthetic_llm_trace(2.0, 60, seed=1), tmp_path / "t.csv")
    r = cli(*PLAN, "--trace", trace, "--prompt-tokens", "64")
    assert r.exit_code == 2 and "--trace gives the token lengths" in r.output
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens\n2024-01-01 00:00:00,3\n")
    r = cli(*PLAN, "--trace", bad)
    assert r.exit_code == 2 and "Error:" in r.output and "Traceback" not in r.output
    assert _plans(llm_store) == []


def test_plan_run_plans_the_same_request(cli, llm_store, tmp_path) -> None:
    """The request file of `plan run llm` is the plan's own request: the same plan."""
    first = json.loads(cli(*PLAN, "--carbon-intensity", "300", "--json").stdout)
    req = tmp_path / "req.json"
    req.write_text(json.dumps(first["request"]))
    r = cli("plan", "run", "--kind", "llm", "--request", req, "--json")
    assert r.exit_code == 0, r.output
    again = json.loads(r.stdout)
    assert again["deployments"] == first["deployments"]
    assert again["predicted"]["objective"] == pytest.approx(first["predicted"]["objective"])
