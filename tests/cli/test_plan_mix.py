"""`greenctl plan mix`: JSON/table output, store, spec files, --current, exit codes."""

from __future__ import annotations

import json

import pytest
from greenctl.data.plan import load_plan_file
from greenctl.data.records import Profile, Variant


@pytest.fixture
def tiny_store(store):
    """Two families (m, n) of two variants each, load-tested on cpu:1/2/4."""
    for fam, scale in (("m", 1.0), ("n", 2.0)):
        store.upsert_variant(Variant(f"{fam}-small", fam, accuracy=0.70, load_time_s=2.0))
        store.upsert_variant(Variant(f"{fam}-big", fam, accuracy=0.80, load_time_s=5.0))
        rows = []
        for name, base in ((f"{fam}-small", 8.0 * scale), (f"{fam}-big", 30.0 * scale)):
            for cores in (1, 2, 4):
                p50 = base / cores**0.8
                rows.append(
                    Profile(
                        variant=name,
                        resource=f"cpu:{cores}",
                        batch=1,
                        throughput_rps=1000.0 / p50,
                        latency_p50_ms=p50,
                        latency_p99_ms=p50 * 1.6,
                        energy_j=0.01 * cores * p50,
                        cost_per_hour=0.04 * cores,
                        capacity_rps=0.7 * 1000.0 / p50,
                        capacity_slo_ms=50.0,
                    )
                )
        store.add_profiles(rows)
    return store


def test_plan_mix_json_is_saved_and_written(cli, tiny_store, tmp_path):
    out = tmp_path / "plan.json"
    r = cli(
        "plan", "mix", "--model", "m", "--rate", "100", "--slo-ms", "60",
        "--budget", "cpu=8", "--objective", "accuracy", "-o", out, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "greenctl.plan/v1" and doc["kind"] == "mix"
    for key in ("rate_rps", "accuracy", "cost_per_hour", "p95_ms", "energy_j_per_request",
                "carbon_g_per_request", "objective"):  # fmt: skip
        assert key in doc["predicted"]
    assert doc["solver"]["status"] == "optimal"
    dep = doc["deployments"][0]
    assert {"model", "variant", "resource", "count", "batch", "quota_rps"} <= set(dep)
    assert sum(d["quota_rps"] for d in doc["deployments"]) == pytest.approx(100.0)
    assert load_plan_file(out).to_dict()["id"] == doc["id"]
    listed = cli("plan", "list", "--json")
    assert [p["id"] for p in json.loads(listed.stdout)] == [doc["id"]]


def test_plan_mix_table(cli, tiny_store):
    r = cli("plan", "mix", "--model", "m", "--rate", "100", "--slo-ms", "60", "--budget", "cpu=8")
    assert r.exit_code == 0, r.output
    assert "Predicted (modeled)" in r.output and "solver: highs optimal" in r.output


@pytest.mark.parametrize(
    ("args", "code", "text"),
    [
        (["--model", "zzz", "--rate", "5", "--slo-ms", "60"], 2, "unknown model family 'zzz'"),
        (["--model", "m", "--rate", "-5", "--slo-ms", "60"], 2, "rate of 'm' (rate_rps) must be > 0"),
        (["--model", "m", "--rate", "5", "--slo-ms", "0"], 2, "must be > 0"),
        (["--model", "m", "--rate", "5", "--slo-ms", "60", "--budget", "tpu=2"], 2,
         "unknown resource kind 'tpu'"),
        (["--model", "m", "--rate", "5", "--slo-ms", "60", "--budget", "cpu"], 2,
         "not KIND=AMOUNT"),
        (["--model", "m", "--rate", "5", "--slo-ms", "60", "--strategy", "magic"], 2,
         "unknown strategy"),
        (["--model", "m", "--rate", "5", "--slo-ms", "1"], 3, "meets the SLO"),
        (["--model", "m", "--rate", "5000", "--slo-ms", "60", "--budget", "cpu=4"], 3,
         "budget too small for the rate"),
        (["--model", "m", "--rate", "5", "--slo-ms", "60", "--min-accuracy", "0.9",
          "--objective", "cost"], 3, "accuracy floor unreachable"),
    ],
)  # fmt: skip
def test_errors_and_exit_codes(cli, tiny_store, args, code, text):
    r = cli("plan", "mix", *args)
    assert r.exit_code == code, r.output
    assert text in r.output
    assert cli("plan", "list", "--json").stdout.strip() == "[]"  # nothing saved


def test_strategies_and_cbc(cli, tiny_store):
    from greenctl.planner.core.solvers import find_cbc

    values = {}
    runs = [["--strategy", "ilp"], ["--strategy", "greedy"], ["--strategy", "single"]]
    if find_cbc() is not None:  # PuLP 4 ships no CBC: `pip install greenctl[cbc]`
        runs.append(["--solver", "cbc"])
    for extra in runs:
        r = cli(
            "plan", "mix", "--model", "m", "--rate", "100", "--slo-ms", "60",
            "--budget", "cpu=8", "--objective", "accuracy", "--json", *extra,
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        values[" ".join(extra)] = json.loads(r.stdout)["predicted"]["objective"]
    ilp = values["--strategy ilp"]
    assert values["--strategy greedy"] <= ilp + 1e-9
    assert values["--strategy single"] <= ilp + 1e-9
    if "--solver cbc" in values:
        assert values["--solver cbc"] == pytest.approx(ilp, rel=1e-5)


def test_current_plan_gives_actions(cli, tiny_store, tmp_path):
    first = tmp_path / "first.json"
    r = cli("plan", "mix", "--model", "m", "--rate", "20", "--slo-ms", "60", "--budget", "cpu=16",
            "--objective", "accuracy", "-o", first)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert [(d.variant, d.resource, d.count) for d in load_plan_file(first).deployments] == [
        ("m-big", "cpu:1", 1)
    ]
    # more load, same variant and size: replicate
    r = cli("plan", "mix", "--model", "m", "--rate", "45", "--slo-ms", "60", "--budget",
            "cpu=16", "--objective", "accuracy", "--current", first, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {a["variant"]: a["action"] for a in doc["actions"]} == {"m-big": "replicate"}
    assert doc["request"]["current"]
    # a tight budget at a high rate: the big variant gives way to the small one
    r = cli("plan", "mix", "--model", "m", "--rate", "200", "--slo-ms", "60", "--budget",
            "cpu=8", "--objective", "cost", "--current", first, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    actions = {a["variant"]: a["action"] for a in json.loads(r.stdout)["actions"]}
    assert actions == {"m-big": "stop", "m-small": "downgrade"}
    r = cli("plan", "mix", "--model", "m", "--rate", "20", "--slo-ms", "60", "--budget", "cpu=16",
            "--objective", "accuracy", "--current", first)  # fmt: skip
    assert "Scaling actions" in r.output and "keep" in r.output


def test_current_plan_file_errors(cli, tiny_store, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = cli("plan", "mix", "--model", "m", "--rate", "5", "--slo-ms", "60", "--current", bad)
    assert r.exit_code == 2 and "bad.json" in r.output


def test_spec_toml_and_json_share_budgets(cli, tiny_store, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'slo_ms = 60\nobjective = "accuracy"\n[budgets]\ncpu = 12\n'
        '[[families]]\nmodel = "m"\nrate_rps = 60\n'
        '[[families]]\nmodel = "n"\nrate_rps = 30\nslo_ms = 150\n'
    )
    r = cli("plan", "mix", "--spec", spec, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {d["model"] for d in doc["deployments"]} == {"m", "n"}
    assert doc["budget_use"]["cpu"]["used"] <= 12
    assert doc["predicted"]["rate_rps"] == pytest.approx(90.0)
    # a flag overrides the spec; JSON spec works the same
    js = tmp_path / "spec.json"
    js.write_text(json.dumps({"families": [{"model": "m", "rate_rps": 60}], "slo_ms": 60}))
    r = cli("plan", "mix", "--spec", js, "--budget", "cpu=3", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["request"]["budgets"] == {"cpu": 3.0}
    bad = tmp_path / "bad.toml"
    bad.write_text("slo_ms = = 3\n")
    r = cli("plan", "mix", "--spec", bad)
    assert r.exit_code == 2 and "bad.toml" in r.output
    r = cli("plan", "mix", "--spec", js, "--model", "m")
    assert r.exit_code == 2 and "cannot be combined" in r.output


@pytest.mark.parametrize(
    ("name", "content", "text"),
    [
        ("bin.toml", bytes(range(128, 256)) * 4, "not a UTF-8 text file"),
        ("count.json", json.dumps({"families": [{"model": "m", "rate_rps": 5}], "slo_ms": 60,
         "current": [{"variant": "m-big", "resource": "cpu:1", "count": "two"}]}),
         "field 'current[0].count' must be a whole number"),
        ("count.toml", 'slo_ms = 60\n[[families]]\nmodel = "m"\nrate_rps = 5\n'
         '[[current]]\nvariant = "m-big"\nresource = "cpu:1"\ncount = 1.5\n',
         "field 'current[0].count' must be a whole number"),
        ("deep.json", '{"families":' + "[" * 50_000 + "]" * 50_000 + "}", "nested too deeply"),
        ("deep.toml", "slo_ms = " + "[" * 50_000 + "]" * 50_000 + "\n", "nested too deeply"),
    ],
)  # fmt: skip
def test_bad_spec_files_exit_2_naming_file_and_field(
    cli, tiny_store, tmp_path, name, content, text
):
    spec = tmp_path / name
    if isinstance(content, bytes):
        spec.write_bytes(content)
    else:
        spec.write_text(content)
    r = cli("plan", "mix", "--spec", spec)  # a traceback would raise here
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert str(spec) in out and text in out
    assert cli("plan", "list", "--json").stdout.strip() == "[]"


def test_spec_strategy_is_not_overridden_by_the_flag_default(cli, tiny_store, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('slo_ms = 60\nstrategy = "single"\nmodel = "m"\nrate_rps = 20\n')
    r = cli("plan", "mix", "--spec", spec, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["request"]["strategy"] == "single"


def test_output_that_cannot_be_written_saves_nothing(cli, tiny_store, tmp_path, monkeypatch):
    args = ["plan", "mix", "--model", "m", "--rate", "20", "--slo-ms", "60", "--json"]
    r = cli(*args, "-o", tmp_path / "missing" / "plan.json")
    assert r.exit_code == 2 and "missing does not exist" in r.output
    assert cli("plan", "list", "--json").stdout.strip() == "[]"
    # a write that fails after planning rolls the saved plan back
    import greenctl.data.plan as plan_mod

    def fail(plan, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plan_mod, "write_plan_file", fail)
    r = cli(*args, "-o", tmp_path / "plan.json")
    assert r.exit_code == 2 and "No space left on device" in r.output
    assert cli("plan", "list", "--json").stdout.strip() == "[]"
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("source", [-1, "signal", ["x"], None])
def test_carbon_caption_of_a_hand_edited_source(source):
    """A plan file's carbon_source that is not an object is shown as no source, not a crash."""
    from greenctl.cli.plan import carbon_caption
    from greenctl.data.plan import Plan

    plan = Plan(kind="mix", request={"carbon_intensity": 100.0}, deployments=[])
    plan.extra["carbon_source"] = source
    assert carbon_caption(plan).startswith("carbon intensity 100 gCO2/kWh")
