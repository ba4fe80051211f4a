"""What-if replay (issue 21): the replan loop over a load trace, beside the baselines."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from greenctl.executor.control import replay as rp
from greenctl.executor.kinds import mix_replay

ARGS = ("--model", "resnet", "--slo-ms", "750", "--percentile", "p99", "--budget", "cpu=20")


@pytest.fixture
def step_trace(tmp_path: Path) -> Path:
    """Synthetic: 4 minutes at 20 req/s, then 4 at 120 req/s, then 2 at 20 (per second)."""
    rates = [20.0] * 240 + [120.0] * 240 + [20.0] * 120
    p = tmp_path / "step.txt"
    p.write_text(" ".join(f"{r:g}" for r in rates) + "\n")
    return p


def _request() -> dict:
    return {
        "model": "resnet",
        "slo_ms": 750.0,
        "percentile": "p99",
        "budgets": {"cpu": 20.0},
        "objective": "balanced",
    }


def test_replay_follows_a_step_and_accounts_the_baselines_on_the_same_intervals(resnet, step_trace):
    out = rp.replay(
        resnet, load_trace=str(step_trace), request=_request(), min_dwell_s=0, every="60s"
    )
    runs = out["intervals"]
    assert set(runs) == {"greenctl", "base", "co2opt", "vpa"}
    total = 20 * 240 + 120 * 240 + 20 * 120
    for name, rows in runs.items():
        assert [r["interval"] for r in rows] == list(range(10)), name
        assert [r["time"] for r in rows] == [r["time"] for r in runs["greenctl"]]
        assert sum(r["requests"] for r in rows) == pytest.approx(total), name
    g = runs["greenctl"]
    # the load steps up at minute 4: greenctl (forecast: last minute's peak) grows its
    # configuration at minute 5 and pays the new instances' load time (InfAdapter's 6-9 s)
    assert g[5]["action"] == "change" and g[5]["units"] > g[3]["units"]
    assert 6 <= g[5]["reconfig_s"] <= 9
    assert g[4]["violations"] > 0  # the step itself was not forecast
    # static baselines never change and are sized for the peak
    assert {r["config"] for r in runs["base"]} == {runs["base"][0]["config"]}
    assert out["meta"]["peak_rps"] == 120.0
    summary = {s["policy"]: s for s in out["summary"]}
    assert summary["base"]["violation_pct"] < 0.01
    assert summary["base"]["accuracy"] >= summary["co2opt"]["accuracy"]
    assert summary["greenctl"]["cost_usd"] < summary["base"]["cost_usd"]
    assert out["meta"]["replan"]["solves"] >= 1
    assert "modeled" in out["meta"]["modeled"]


def test_min_dwell_holds_the_plan_as_replan_does(resnet, step_trace):
    out = rp.replay(
        resnet, load_trace=str(step_trace), request=_request(), min_dwell_s=3600, baselines=()
    )
    g = out["intervals"]["greenctl"]
    changes = [r["interval"] for r in g if r["action"] == "change"]
    assert len(changes) <= 1  # one change, then held for the hour
    if changes:
        assert all(r["action"] == "hold" for r in g[changes[0] + 1 :])


def test_vpa_resizes_after_a_sustained_overload():
    pod = mix_replay.Vpa(
        "v", "m", [1, 2, 4, 8], mix_replay.VpaConfig(), 5.0, 1.0, lambda c: 10.0 * c
    )
    assert pod.cores == 1
    for k in range(30):  # saturated at its request
        pod.observe(1.0, 60.0 * k)
    assert pod.step(60.0 * 30) and pod.cores == 2  # p90 x 1.15 = 1.15 cores -> 2
    assert not pod.step(60.0 * 30.5)  # the updater runs once a minute


def test_replay_of_a_twitter_slice_writes_csv_json_and_a_chart(resnet, tmp_path, cli):
    trace = "bundled:twitter"
    r = cli(
        "replay", "--load-trace", trace, *ARGS, "--from", "24h", "--hours", "0.25",
        "--min-dwell", "0", "--vpa-variant", "resnet50", "-o", tmp_path / "out", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["intervals"] == 15 and doc["meta"]["from_offset_s"] == 86400
    assert doc["meta"]["vpa"]["variants"] == {"vpa": "resnet50"}
    out = tmp_path / "out"
    assert json.loads((out / "replay.json").read_text())["meta"]["intervals"] == 15
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["policy"] for r in rows] == ["greenctl", "base", "co2opt", "vpa"]
    with open(out / "intervals.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 4 * 15
    assert (out / "replay.png").stat().st_size > 10_000
    # the slice's own arrivals, whatever the policy
    from greenctl.data.traces import read_rps_trace

    want = float(np.sum(read_rps_trace(trace)[86400 : 86400 + 900]))
    assert all(s["requests"] == pytest.approx(want) for s in doc["summary"])


def test_the_table_labels_figures_as_modeled(resnet, step_trace, cli):
    r = cli("replay", "--load-trace", step_trace, *ARGS, "--baseline", "none")
    assert r.exit_code == 0, r.output
    assert "Replay of resnet (modeled)" in r.output and "analytic predict" in r.output


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (("--load-trace", "missing.txt"), "--load-trace"),
        (("--every", "abc"), "--every"),
        (("--every", "0.5s"), "--every"),
        (("--hours", "1"), "--hours"),
        (("--from", "nonsense"), "--from"),
        (("--baseline", "hpa"), "--baseline"),
    ],
)
def test_bad_input_exits_2_naming_the_option(resnet, step_trace, cli, extra, option):
    args = ["replay", *ARGS]
    if "--load-trace" not in extra:
        args += ["--load-trace", str(step_trace)]
    r = cli(*args, *extra)
    assert r.exit_code == 2, r.output
    assert option in r.output


def test_replay_of_a_mig_plan_with_clovers_baselines(cli, step_trace):
    """Synthetic MIG profiles (`mig synth`): the replan loop and Clover's own baselines."""
    r = cli("mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet")
    assert r.exit_code == 0, r.output
    r = cli(
        "replay", "--kind", "mig", "--gpu", "A100-40GB", "--gpus", "2", "--model",
        "efficientnet", "--load-trace", step_trace, "--every", "5m", "--min-dwell", "0",
        "--sla-ms", "200", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["kind"] == "mig" and doc["meta"]["intervals"] == 2
    assert doc["meta"]["units"] == "compute slices"
    assert {s["policy"] for s in doc["summary"]} >= {"greenctl", "co2opt"}
    assert any("synthetic" in n for n in doc["meta"]["notes"])
    assert any("vpa" in n for n in doc["meta"]["notes"])  # no CPU pod to size


def test_infaas_scales_up_on_the_load_it_saw(resnet, step_trace):
    out = rp.replay(
        resnet, load_trace=str(step_trace), request=_request(), min_dwell_s=0,
        baselines=("infaas",),
    )  # fmt: skip
    rows = out["intervals"]["infaas"]
    assert len(rows) == 10 and rows[0]["action"] == "start"
    # reactive: it sees the step (minute 4) only after it, and changes at minute 5
    assert [r["interval"] for r in rows if r["action"] == "change"] == [5]
    assert rows[5]["units"] > rows[4]["units"] and rows[5]["reconfig_s"] > 0
    assert len({r["config"].split("@")[0] for r in rows}) <= 2  # one variant at a time


def test_min_dwell_yields_to_a_load_the_running_plan_cannot_carry(resnet, tmp_path):
    """Synthetic: 20, then 120, then 240 req/s, 4 minutes each. Under a 1 h dwell the step to
    240 comes 4 minutes after the change to 120: the plan sized for 120 cannot carry it, so
    the dwell yields (replan_once's rule), and the later rounds are held again."""
    rates = [20.0] * 240 + [120.0] * 240 + [240.0] * 240
    trace = tmp_path / "steps.txt"
    trace.write_text(" ".join(f"{r:g}" for r in rates) + "\n")
    out = rp.replay(
        resnet, load_trace=str(trace), request=_request(), min_dwell_s=3600, baselines=(),
        forecaster="last",
    )  # fmt: skip
    g = out["intervals"]["greenctl"]
    changes = [r["interval"] for r in g if r["action"] == "change"]
    assert changes == [5, 9]  # each step, the minute after it shows in the last peak
    assert g[9]["units"] > g[5]["units"]
    assert all(r["action"] == "hold" for r in g[6:9] + g[10:])
    r = out["meta"]["replan"]
    assert r["dwell_yields"] == 1 and r["dwell_holds"] == len(g[6:9] + g[10:])
    # the minutes after the second step are served within the SLO (modeled: a fraction of a
    # request over it), where a held plan sized for 120 req/s would miss most of them
    assert all(row["violations"] < 0.01 for row in g[10:])


def test_a_mig_replay_charges_the_slices_its_plans_leave_empty(cli, tmp_path):
    """12 A100s at 12 % of BASE's throughput: greenctl's plan leaves compute slices empty,
    which idle all the same; the replay's energy is then plan mig's own (issue 21)."""
    r = cli("mig", "synth", "--gpu", "A100-40GB", "--family", "efficientnet")
    assert r.exit_code == 0, r.output
    common = ("--gpu", "A100-40GB", "--gpus", "12", "--model", "efficientnet", "--sla-ms",
              "200", "--carbon-intensity", "200", "--json")  # fmt: skip
    r = cli("plan", "mig", *common, "--rate", "67.5")
    assert r.exit_code == 0, r.output
    planned = json.loads(r.stdout)
    trace = tmp_path / "flat.txt"
    trace.write_text("67.5\n" * 300)
    r = cli("replay", "--kind", "mig", *common, "--load-trace", trace, "--every", "5m",
            "--baseline", "none")  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    # what the figures rest on, in every summary row (the CSV's basis column) and the meta
    assert doc["meta"]["label"] == "synthetic profiles"
    assert {s["basis"] for s in doc["summary"]} == {"modeled on synthetic profiles"}
    row = doc["intervals"]["greenctl"][0]
    assert row["units"] < 84  # compute slices left empty
    assert row["energy_j"] == pytest.approx(300 * planned["predicted"]["power_w"], rel=1e-4)
