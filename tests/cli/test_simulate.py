"""``greenctl simulate``: plan + store profiles -> predicted metrics."""

from __future__ import annotations

import gzip
import json

import pytest
from greenctl.data.plan import Deployment, Plan, write_plan_file
from greenctl.data.records import Profile, Variant


@pytest.fixture
def plan_file(tmp_path, store):
    store.upsert_variant(Variant("r18", "resnet", accuracy=0.69758))
    store.upsert_variant(Variant("r50", "resnet", accuracy=0.7613))
    store.add_profiles(
        [
            Profile(
                "r18",
                "cpu:2",
                1,
                throughput_rps=50.0,
                latency_p50_ms=18.0,
                latency_p95_ms=25.0,
                latency_p99_ms=30.0,
                power_w=30.0,
                idle_power_w=10.0,
                cost_per_hour=0.1,
            ),
            Profile(
                "r50",
                "cpu:4",
                1,
                throughput_rps=25.0,
                latency_p50_ms=35.0,
                latency_p95_ms=50.0,
                power_w=60.0,
                idle_power_w=20.0,
                cost_per_hour=0.2,
            ),
        ]
    )
    plan = Plan(
        kind="mix",
        request={"slo_ms": 100.0},
        deployments=[
            Deployment("resnet", "r18", "cpu:2", count=2, quota_rps=40.0),
            Deployment("resnet", "r50", "cpu:4", count=3, quota_rps=30.0),
        ],
        predicted={"rate_rps": 70.0, "p95_ms": 50.0},
    )
    path = tmp_path / "plan.json"
    write_plan_file(plan, path)
    return path


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_simulate_json_uses_plan_rate_policy_and_slo(cli, plan_file):
    out = _json(cli("simulate", plan_file, "--requests", "20000", "--seed", "3", "--json"))
    assert out["method"] == "simulated" and out["policy"] == "wrr"  # every deployment has a quota
    assert out["rate_rps"] == pytest.approx(70.0, rel=0.05)
    assert out["accuracy"] == pytest.approx((40 * 0.69758 + 30 * 0.7613) / 70, abs=0.002)
    assert 0 < out["p50_ms"] < out["p95_ms"] < out["p99_ms"] < 100
    assert out["slo_violation_frac"] < 0.01 and out["overloaded"] is False
    assert out["cost_per_hour"] == pytest.approx(0.8)
    again = _json(cli("simulate", plan_file, "--requests", "20000", "--seed", "3", "--json"))
    assert again == out


def test_simulate_analytic_close_to_simulation(cli, plan_file):
    args = (
        "simulate",
        plan_file,
        "--rate",
        "100",
        "--policy",
        "fifo",
        "--json",
        "--carbon-intensity",
        "400",
        "--pue",
        "1.2",
    )
    sim = _json(cli(*args, "--requests", "50000"))
    ana = _json(cli(*args, "--analytic"))
    assert ana["method"] == "analytic"
    assert ana["p95_ms"] == pytest.approx(sim["p95_ms"], rel=0.1)
    assert ana["carbon_g_per_request"] == pytest.approx(
        ana["energy_j_per_request"] / 3.6e6 * 1.2 * 400
    )


def test_simulate_table_and_overload(cli, plan_file):
    r = cli("simulate", plan_file, "--rate", "400", "--duration", "30")
    assert r.exit_code == 0, r.output
    assert "latency p95" in r.stdout and "unbounded" in r.stdout
    assert "Overloaded" in r.stdout and "simulated" in r.stdout
    out = _json(cli("simulate", plan_file, "--rate", "400", "--analytic", "--json"))
    assert out["overloaded"] is True and out["p95_ms"] is None and out["dropped_rps"] > 0


def test_simulate_trace(cli, plan_file, tmp_path):
    trace = tmp_path / "rps.txt.gz"
    trace.write_bytes(gzip.compress(" ".join(["50", "80", "20", "60"] * 30).encode()))
    out = _json(cli("simulate", plan_file, "--trace", trace, "--scale", "0.5", "--json"))
    assert out["rate_rps"] == pytest.approx(26.25, rel=0.1)
    short = _json(cli("simulate", plan_file, "--trace", trace, "--duration", "20", "--json"))
    assert short["rate_rps"] == pytest.approx(52.5, rel=0.15)


def test_simulate_missing_profile_is_a_clear_error(cli, plan_file, tmp_path):
    doc = json.loads(plan_file.read_text())
    doc["deployments"][0]["resource"] = "cpu:16"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    r = cli("simulate", bad)
    assert r.exit_code == 2
    assert "r18" in r.output and "cpu:16" in r.output and "batch 1" in r.output
    assert "profile import" in r.output


def test_simulate_bad_inputs(cli, plan_file, tmp_path):
    r = cli("simulate", plan_file, "--rate", "10", "--trace", plan_file)
    assert r.exit_code == 2 and "not both" in r.output
    r = cli("simulate", plan_file, "--policy", "random")
    assert r.exit_code == 2 and "unknown policy" in r.output
    r = cli("simulate", tmp_path / "nope.json")
    assert r.exit_code == 2 and "does not exist" in r.output
    bad_trace = tmp_path / "t.txt"
    bad_trace.write_text("1 2\nthree\n")
    r = cli("simulate", plan_file, "--trace", bad_trace)
    assert r.exit_code == 2 and "line 2" in r.output


# -- refusals (issue 16): exit 2 naming the file / field / flag, never a traceback -------------
def _mutated(plan_file, tmp_path, change) -> str:
    doc = json.loads(plan_file.read_text())
    change(doc)
    path = tmp_path / "mutated.json"
    path.write_text(json.dumps(doc))
    return str(path)


def _refused(result, *needles):
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "Error:" in result.output
    for needle in needles:
        assert needle in result.output, result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe\x00\x00", "not UTF-8 text"),
        (gzip.compress(b'{"schema": "greenctl.plan/v1"}', mtime=0), "gzip-compressed"),
        (b"[" * 50_000, "nested too deeply"),
    ],
)
def test_simulate_binary_or_odd_plan_files(cli, tmp_path, content, message):
    path = tmp_path / "plan.bin"
    path.write_bytes(content)
    _refused(cli("simulate", path, "--json"), str(path), message)
    _refused(cli("simulate", tmp_path), "is a directory")


def test_simulate_binary_trace(cli, plan_file, tmp_path):
    trace = tmp_path / "trace.txt"
    trace.write_bytes(b"\x7fELF\x02\x01\xd0\xff\xfe")
    _refused(cli("simulate", plan_file, "--trace", trace), str(trace))
    gz = tmp_path / "trace.txt.gz"
    gz.write_bytes(gzip.compress(b"\x00\xff\xfe\xd0"))
    _refused(cli("simulate", plan_file, "--trace", gz), str(gz))


@pytest.mark.parametrize("slo", ["0", "-5", "nan", "inf"])
def test_simulate_slo_must_be_positive(cli, plan_file, slo):
    _refused(cli("simulate", plan_file, "--slo-ms", slo, "--requests", "200"), "SLO", "--slo-ms")


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d.update(request="fast"), "'request' must be a JSON object"),
        (lambda d: d["deployments"][0].update(count=1_000_000), "'deployments[0].count'"),
        (lambda d: d["deployments"][1].update(count="two"), "'deployments[1].count'"),
        (lambda d: d["deployments"][1].update(quota_rps=-3), "'deployments[1].quota_rps'"),
        (lambda d: d["deployments"][1].update(quota_rps=float("nan")), "'deployments[1].quota"),
        (lambda d: d["predicted"].update(rate_rps=-70), "'predicted.rate_rps'"),
        (lambda d: d["request"].update(slo_ms=0), "'request.slo_ms'"),
    ],
)
def test_simulate_refuses_bad_plan_fields(cli, plan_file, tmp_path, change, field):
    bad = _mutated(plan_file, tmp_path, change)
    _refused(cli("simulate", bad, "--json", "--requests", "200"), bad, field)


def test_simulate_refuses_a_model_that_is_not_the_variants_family(cli, plan_file, tmp_path):
    bad = _mutated(plan_file, tmp_path, lambda d: d["deployments"][1].update(model="bert"))
    _refused(cli("simulate", bad, "--requests", "200"), "deployments[1].model is 'bert'", "resnet")


def test_simulate_refuses_runs_too_long_to_hold(cli, plan_file):
    _refused(cli("simulate", plan_file, "--requests", "100000000000"), "--requests", "--analytic")
    _refused(cli("simulate", plan_file, "--rate", "1e6", "--duration", "100000"), "--duration")
    # a rate beyond the rate bound, or none at all, is refused by the option's name
    _refused(cli("simulate", plan_file, "--rate", "1e308"), "--rate must be <= 1e+06")
    _refused(cli("simulate", plan_file, "--rate", "0"), "--rate must be > 0")


def test_simulate_predicts_other_resource_kinds(cli, store, tmp_path):
    """Any ``kind:size`` label can be simulated from its profile (only apply refuses it)."""
    store.upsert_variant(Variant("q1", "qnet", accuracy=0.5))
    store.add_profiles([Profile("q1", "quantum:7", 1, throughput_rps=50.0, latency_p50_ms=5.0)])
    plan = Plan(kind="mix", deployments=[Deployment("qnet", "q1", "quantum:7", quota_rps=10.0)])
    path = tmp_path / "q.json"
    write_plan_file(plan, path)
    out = _json(cli("simulate", path, "--rate", "10", "--requests", "500", "--json"))
    assert out["rate_rps"] == pytest.approx(10, rel=0.2) and out["overloaded"] is False
