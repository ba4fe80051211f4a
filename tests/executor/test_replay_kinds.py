"""What-if replay of glet and geo plans (issue 21): ``replay --kind glet|geo``."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from greenctl.executor.control import replay as rp
from greenctl.executor.kinds.replaying import replay_step

MODELS = [
    {"name": "resnet50", "rate_rps": 4.0, "slo_ms": 25.0},
    {"name": "vgg16", "rate_rps": 3.0, "slo_ms": 30.0},
    {"name": "inception", "rate_rps": 2.0, "slo_ms": 40.0},
]
GLET_ARGS = ("--kind", "glet", "--model", "resnet50:4:25", "--model", "vgg16:3:30",
             "--model", "inception:2:40")  # fmt: skip


@pytest.fixture
def step_trace(tmp_path: Path) -> Path:
    """Synthetic: 4 minutes at 100 req/s, 4 at 900 (one GPU, then two), then 2 at 100."""
    rates = [100.0] * 240 + [900.0] * 240 + [100.0] * 120
    p = tmp_path / "step.txt"
    p.write_text(" ".join(f"{r:g}" for r in rates) + "\n")
    return p


def _glet(store, trace: Path, **kw):
    return rp.replay(
        store, kind="glet", load_trace=str(trace), request={"models": MODELS}, min_dwell_s=0, **kw
    )


def test_glet_follows_the_step_and_takes_fewer_gpu_hours_than_the_peak_plan(gpulet, step_trace):
    out = _glet(gpulet, step_trace)
    runs = out["intervals"]
    assert set(runs) == {"greenctl", "base"}  # replay's default baselines: the kind's own
    g, base = runs["greenctl"], runs["base"]
    assert [r["interval"] for r in g] == list(range(10))
    # the step up is seen at minute 5 (forecast: the last minute's peak): one GPU, then two
    assert g[3]["units"] == 1 and g[5]["action"] == "change" and g[5]["units"] == 2
    assert g[4]["violations"] > 0  # the step itself was not forecast
    assert {r["config"] for r in base} == {base[0]["config"]} and base[0]["units"] == 2
    s = {x["policy"]: x for x in out["summary"]}
    assert s["greenctl"]["gpu_hours"] < s["base"]["gpu_hours"]
    assert s["greenctl"]["gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in g))
    # every request of the trace, split over the models as their planned rates are
    total = 100 * 240 + 900 * 240 + 100 * 120
    for x in s.values():
        assert x["requests"] == pytest.approx(total)
        assert x["per_model"]["resnet50"]["requests"] == pytest.approx(total * 4 / 9)
        assert set(x["per_model"]) == {"resnet50", "vgg16", "inception"}
    assert s["base"]["violation_pct"] < 0.01
    assert out["meta"]["units"] == "GPUs" and out["meta"]["replan"]["solves"] >= 2
    assert out["meta"]["power"]["assumed"] is True  # gpulet's profiles hold no power
    assert any("ASSUMED" in n for n in out["meta"]["notes"])
    assert s["greenctl"]["energy_kwh"] > 0 and s["greenctl"]["carbon_g"] > 0


def test_glet_reconfiguration_pays_the_started_glets_load_time_on_both_layouts(gpulet, step_trace):
    for name in ("resnet50", "vgg16", "inception"):
        gpulet.upsert_variant(replace(gpulet.get_variant(name), load_time_s=7.0))
    out = _glet(gpulet, step_trace)
    g = out["intervals"]["greenctl"]
    up = g[5]
    assert up["action"] == "change" and up["reconfig_s"] == 7.0
    # the running GPU serves while the new glets load; both GPUs are held meanwhile
    assert up["gpu_hours"] == pytest.approx(2 * 60 / 3600)
    assert not any("not modeled for" in n for n in out["meta"]["notes"])


def test_glet_min_dwell_holds_and_the_memo_answers_repeated_rounds(gpulet, step_trace):
    out = _glet(gpulet, step_trace) | {}
    held = rp.replay(
        gpulet, kind="glet", load_trace=str(step_trace), request={"models": MODELS},
        min_dwell_s=3600, baselines=(),
    )  # fmt: skip
    g = held["intervals"]["greenctl"]
    first = next(r["interval"] for r in g if r["action"] == "change")
    assert all(r["action"] == "hold" for r in g[first + 1 :])
    assert set(held["intervals"]) == {"greenctl"}
    assert out["meta"]["replan"]["cached"] >= 1


def test_glet_model_traces_on_the_cli_with_csv_json_and_a_chart(gpulet, step_trace, tmp_path, cli):
    own = tmp_path / "vgg.txt"
    own.write_text(" ".join(["50"] * 600) + "\n")
    r = cli(
        "replay", *GLET_ARGS, "--load-trace", step_trace, "--model-trace", f"vgg16={own}",
        "--every", "2m", "--min-dwell", "0", "--gpu-power-w", "40:300", "-o", tmp_path / "out",
        "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["kind"] == "glet" and doc["meta"]["intervals"] == 5
    assert doc["meta"]["model_traces"] == {"vgg16": str(own)}
    assert doc["meta"]["power"] == {"idle_w": 40.0, "busy_w": 300.0, "assumed": True}
    s = {x["policy"]: x for x in doc["summary"]}
    assert s["greenctl"]["per_model"]["vgg16"]["requests"] == pytest.approx(50 * 600)
    # the others share the load trace as their rates do (4 : 2)
    total = 100 * 240 + 900 * 240 + 100 * 120
    assert s["greenctl"]["per_model"]["resnet50"]["requests"] == pytest.approx(total * 4 / 6)
    out = tmp_path / "out"
    with open(out / "summary.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [x["policy"] for x in rows] == ["greenctl", "base"]
    assert {"gpu_hours", "violation_pct:vgg16"} <= set(rows[0])
    with open(out / "intervals.csv") as fh:
        assert len(list(csv.DictReader(fh))) == 2 * 5
    assert (out / "replay.png").stat().st_size > 10_000
    assert json.loads((out / "replay.json").read_text())["meta"]["kind"] == "glet"


def test_glet_table_and_a_stored_plan(gpulet, step_trace, cli):
    from greenctl.executor.kinds import get_kind

    plan, _ = get_kind("glet").plan(gpulet, {"models": MODELS, "simulate_s": 5.0})
    gpulet.save_plan(plan)
    r = cli("replay", "--plan", str(plan.id), "--load-trace", step_trace, "--min-dwell", "0")
    assert r.exit_code == 0, r.output
    assert "Replay of glet: resnet50, vgg16, inception (modeled)" in r.output
    assert "SLO violations per model" in r.output and "inception" in r.output


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (("--model-trace", "nope=x.txt"), "--model-trace"),
        (("--model-trace", "novalue"), "--model-trace"),
        (("--baseline", "hpa"), "--baseline"),
        (("--gpu-power-w", "300:50"), "--gpu-power-w"),
        (("--sites", "s.csv"), "--sites"),
    ],
)
def test_glet_bad_input_exits_2_naming_the_option(gpulet, step_trace, cli, extra, option):
    r = cli("replay", *GLET_ARGS, "--load-trace", step_trace, *extra)
    assert r.exit_code == 2, r.output
    assert option in r.output


def test_glet_needs_a_load_trace_unless_every_model_has_its_own(gpulet, cli):
    r = cli("replay", *GLET_ARGS)
    assert r.exit_code == 2 and "--load-trace" in r.output


def test_a_mix_baseline_asked_of_a_glet_replay_is_left_out_with_a_note(gpulet, step_trace):
    out = _glet(gpulet, step_trace, baselines=("base", "vpa"))
    assert set(out["intervals"]) == {"greenctl", "base"}
    assert any(n.startswith("vpa: not a baseline of a glet plan") for n in out["meta"]["notes"])


# -- geo ------------------------------------------------------------------------------------------
def _geo_files(folder: Path, *, hours: int = 6) -> dict[str, str]:
    """Two sites: the gateway's nearest ("dirty", named like it) is dirty and dear; "clean" is
    clean and cheap, with room for all the load; the load changes every hour."""
    sites = ["time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw"]
    demand = ["time,gateway,load_mw"]
    for h in range(hours):
        t = f"2024-01-01T{h:02d}:00:00Z"
        sites.append(f"{t},dirty,90,700,1.0,2.0")
        sites.append(f"{t},clean,40,{80 + 10 * h},1.5,1.0")
        demand.append(f"{t},dirty,{0.5 + 0.1 * (h % 3)}")
    out = {}
    for name, lines in (("sites", sites), ("demand", demand)):
        path = folder / f"{name}.csv"
        path.write_text("\n".join(lines) + "\n")
        out[name] = str(path)
    return out


def test_geo_online_step_beats_the_nearest_site_on_carbon_where_it_must(store, tmp_path):
    files = _geo_files(tmp_path)
    out = rp.replay(store, kind="geo", request={**files, "algorithm": "eglb"}, every="1h")
    s = {x["policy"]: x for x in out["summary"]}
    assert set(s) == {"greenctl", "offline", "nearest"}
    assert s["greenctl"]["carbon_g"] <= s["nearest"]["carbon_g"] * 0.5
    assert s["greenctl"]["cost_usd"] < s["nearest"]["cost_usd"]
    # the offline optimum knows the whole window: no online step does better on its objective
    assert s["offline"]["objective_usd"] <= s["greenctl"]["objective_usd"] + 1e-6
    for x in s.values():
        assert x["load_mwh"] == pytest.approx(sum(0.5 + 0.1 * (h % 3) for h in range(6)))
        assert x["unserved_mwh"] == 0
    g = out["intervals"]["greenctl"]
    assert len(g) == 6 and g[0]["action"] == "start"
    assert {"carbon_kg_max_site", "carbon_max_over_avg", "objective_usd"} <= set(g[0])
    assert out["meta"]["replan"]["online_steps"] == 6
    # the same figures the geo planner reports for the same allocation
    assert g[-1]["objective_usd"] == pytest.approx(s["greenctl"]["objective_usd"])


def test_geo_every_two_slots_holds_the_last_fractions_and_counts_what_overflows(store, tmp_path):
    files = _geo_files(tmp_path)
    out = rp.replay(store, kind="geo", request={**files, "algorithm": "eglb"}, every="2h")
    g = out["intervals"]["greenctl"]
    assert [r["action"] for r in g][::2] != ["hold"] * 3
    assert all(r["action"] == "hold" for r in g[1::2])
    assert out["meta"]["replan"] == pytest.approx(
        {"online_steps": 5, "replans": 3, "decide_s": out["meta"]["replan"]["decide_s"]}
    )


def test_geo_on_the_cli_from_an_offset_with_json_csv_and_a_chart(store, tmp_path, cli):
    files = _geo_files(tmp_path)
    r = cli(
        "replay", "--kind", "geo", "--sites", files["sites"], "--demand", files["demand"],
        "--from", "2h", "--hours", "3", "--baseline", "offline", "--baseline", "glb-energy",
        "-o", tmp_path / "out", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["meta"]["start"] == "2024-01-01T02:00:00Z" and doc["meta"]["intervals"] == 3
    assert [x["policy"] for x in doc["summary"]] == ["greenctl", "offline", "glb-energy"]
    out = tmp_path / "out"
    with open(out / "intervals.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 9 and "carbon_max_over_avg" in rows[0]
    assert (out / "replay.png").stat().st_size > 10_000
    r = cli("replay", "--kind", "geo", "--sites", files["sites"], "--demand", files["demand"])
    assert r.exit_code == 0, r.output
    assert "Replay of geo: 1 gateway over 2 sites (modeled)" in r.output
    assert "greenctl" in r.output and "nearest" in r.output


def test_geo_replays_a_stored_plan_of_an_offline_algorithm_with_its_online_twin(store, tmp_path):
    from greenctl.executor.kinds import get_kind

    files = _geo_files(tmp_path)
    plan, _ = get_kind("geo").plan(store, {**files, "algorithm": "eglb-off"})
    store.save_plan(plan)
    out = rp.replay(store, plan=str(plan.id), baselines=("offline",))
    assert out["meta"]["algorithm"] == "eglb" and out["meta"]["plan_algorithm"] == "eglb-off"
    assert any("has no online step" in n for n in out["meta"]["notes"])


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (("--hours", "1.5"), "--hours"),
        (("--hours", "9"), "--hours"),
        (("--from", "30m"), "--from"),
        (("--every", "90m"), "--every"),
        (("--load-trace", "x.txt"), "--load-trace"),
        (("--baseline", "hpa"), "--baseline"),
    ],
)
def test_geo_bad_input_exits_2_naming_the_option(store, tmp_path, cli, extra, option):
    files = _geo_files(tmp_path)
    r = cli("replay", "--kind", "geo", "--sites", files["sites"], "--demand", files["demand"],
            *extra)  # fmt: skip
    assert r.exit_code == 2, r.output
    assert option in r.output


def test_the_kinds_replay_defaults_are_their_own():
    defaults = {k: replay_step(k).default_baselines for k in ("glet", "geo")}
    assert defaults == {"glet": ("base",), "geo": ("offline", "nearest")}
    assert set(rp.REPLAYED) == {"mix", "mig", "glet", "geo", "llm"}
