"""Issue 18 (glet): a glet plan applied on the fake NVML (real executor daemons and
dispatcher) is replanned from the rates its dispatcher measured and reorganised, the glets
that stay kept running where they are."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest
from greenctl.executor import control
from greenctl.executor.kinds import get_kind

pytestmark = pytest.mark.timeout(180)

MODELS = [
    {"name": "resnet50", "rate_rps": 400.0, "slo_ms": 25.0},
    {"name": "vgg16", "rate_rps": 300.0, "slo_ms": 30.0},
    {"name": "inception", "rate_rps": 200.0, "slo_ms": 40.0},
]


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Three fake A100s (MPS, no MIG) and a stand-in MPS control daemon."""
    gpus = [
        {"name": "NVIDIA A100-SXM4-40GB", "uuid": f"GPU-{n}", "memory_mb": 40960, "mig": None}
        for n in range(3)
    ]
    path = tmp_path / "fake_nvml.json"
    path.write_text(json.dumps({"persist": True, "gpus": gpus}))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(path))
    script = tmp_path / "fake-mps-control"
    script.write_text('#!/bin/sh\n[ "$1" = "-d" ] || read cmd\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", str(script))
    return path


def _load(url: str, rates: dict[str, float], duration_s: float) -> dict[str, object]:
    """Open-loop loads on several models at once, through the dispatcher."""
    from greenctl.executor.loadgen import run_load

    out: dict[str, object] = {}

    def one(model: str, rate: float) -> None:
        out[model] = run_load(url, model, duration_s=duration_s, rate_rps=rate, connections=16)

    threads = [threading.Thread(target=one, args=item) for item in rates.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_a_glet_plan_is_replanned_from_its_measured_rates_and_reorganised(
    run_store, gpulet, fake_gpus, loaders
):
    from greenctl.executor.apply import apply_plan, status

    plan, _ = get_kind("glet").plan(gpulet, {"models": MODELS, "max_gpus": 3})
    gpulet.save_plan(plan)
    assert plan.predicted["gpus"] == 2
    applied = apply_plan(plan, store=gpulet, loader=loaders["noop"])
    url = applied.dispatcher_url
    assert url is not None
    first = {i["id"]: i for i in status(gpulet)["instances"]}
    assert len(first) == 3

    # the load falls to a fraction of the plan's: the dispatcher counts it per family
    for r in _load(url, {"resnet": 50.0, "vgg": 50.0, "inception": 50.0}, 0.3).values():
        assert r.errors == 0 and r.ok > 0  # type: ignore[attr-defined]
    assert control.sample_dispatcher_load(gpulet) == []  # primes the counters
    served = _load(url, {"resnet": 60.0, "vgg": 40.0, "inception": 20.0}, 1.0)
    assert all(r.errors == 0 for r in served.values())  # type: ignore[attr-defined]

    # moving glets keeps serving: the new ones start beside the old (MPS shares leave room)
    during: dict[str, object] = {}
    background = threading.Thread(
        target=lambda: during.update(_load(url, {"resnet": 30.0, "vgg": 30.0}, 2.0))
    )
    background.start()
    d = control.replan_once(gpulet, plan=str(plan.id), apply=True, forecaster="last", min_dwell_s=0)
    background.join()
    assert all(r.errors == 0 and r.ok > 0 for r in during.values())  # type: ignore[attr-defined]
    assert d["action"] == "apply", d["reason"]
    assert d["region"] is None and d["signal_g_per_kwh"] is None  # a glet plan plans no carbon
    assert "GPUs 2 -> 1" in d["reason"]
    new = gpulet.get_plan(d["new_plan_id"])
    rates = {m["name"]: m["rate_rps"] for m in new.request["models"]}
    for name, planned in (("resnet50", 400.0), ("vgg16", 300.0), ("inception", 200.0)):
        assert 1.0 <= rates[name] < planned / 3  # measured, well below the plan
    assert new.predicted["gpus"] == 1
    # reorganised: the new glets serve, on one GPU, and every family still answers
    now = status(gpulet)["instances"]
    assert {(i["variant"], i["resource"]) for i in now} == {
        (d_.variant, d_.resource) for d_ in new.deployments
    }
    assert len({i["device"] for i in now}) == 1
    assert all(i["ready"] for i in now)
    # the executors it started batch over their glet's duty cycle, as `simulate` predicts
    cycles = {(d_.variant, d_.placement["duty_cycle_ms"]) for d_ in new.deployments}
    started = [
        json.loads(row["spawn"])["argv"]
        for row in gpulet.db.table("executor_instances").rows_where("state = ?", ["ready"])
        if row["id"] not in first
    ]
    assert started
    for argv in started:
        wait = float(argv[argv.index("--max-wait-ms") + 1])
        assert (argv[argv.index("--variant") + 1], wait) in cycles
    # verified as planned: each model held to its own SLO
    from greenctl.executor.apply import verify_plan

    v = verify_plan(new, store=gpulet, endpoint=url, duration_s=0.5, rate_rps=90.0)
    got = {m: (r["slo_ms"], r["errors"]) for m, r in v["measured"]["models"].items()}
    assert got == {"resnet": (25.0, 0), "vgg": (30.0, 0), "inception": (40.0, 0)}
    per = v["measured"]["models"].values()
    late = sum(r["slo_violation_frac"] * r["sent"] for r in per) / sum(r["sent"] for r in per)
    assert v["measured"]["slo_violation_frac"] == pytest.approx(late)

    # the same rates again: the new schedule is the running one; nothing moves
    d2 = control.replan_once(gpulet, plan=str(plan.id), apply=True, min_dwell_s=0, rates=rates)
    assert d2["action"] == "keep", d2["reason"]
    assert {i["id"] for i in status(gpulet)["instances"]} == {i["id"] for i in now}


def test_a_move_without_room_reports_its_serving_gap(run_store, tmp_path, monkeypatch, loaders):
    """A MIG slice that goes away frees its executor before the new slice exists: a model
    with no other executor is unrouted for a while, which apply measures and reports."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.apply import apply_plan

    fake = tmp_path / "fake_nvml.json"
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-0", "memory_mb": 40960, "mig": True}
    fake.write_text(json.dumps({"persist": True, "gpus": [{**gpu, "instances": []}]}))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))

    def on(profile: str, *others: str) -> Plan:
        deps = [Deployment("x", "vx", f"mig:{profile}", quota_rps=5.0)]
        deps += [Deployment("y", "vy", f"mig:{p}", quota_rps=5.0) for p in others]
        layout = [{"profile": profile, "start": 0, "variant": "vx"}]
        layout += [{"profile": p, "start": 4, "variant": "vy"} for p in others]
        return Plan(
            kind="mig",
            deployments=deps,
            extra={"gpus": [{"index": 0, "model": "A100-SXM4-40GB", "layout": layout}]},
            predicted={"rate_rps": 10.0},
        )

    apply_plan(on("3g.20gb", "3g.20gb"), store=run_store, loader=loaders["noop"])
    res = apply_plan(on("4g.20gb", "2g.10gb"), store=run_store, loader=loaders["noop"])
    (gap,) = [a for a in res.actions if a["action"] == "serving-gap"]
    assert gap["models"] == ["x", "y"] and gap["gap_ms"] > 0
    assert any("had no executor for" in w for w in res.warnings)
    # a change that keeps every slice moves nothing and leaves no gap
    res = apply_plan(on("4g.20gb", "2g.10gb"), store=run_store, loader=loaders["noop"])
    assert not res.changed


def test_given_rates_win_over_the_forecast_and_idle_models_stay_served():
    from greenctl.data.errors import InputError
    from greenctl.data.plan import Plan
    from greenctl.executor.kinds import GLET_MIN_RATE_RPS, ReplanSignal

    request = {
        "models": [
            {"name": "resnet50", "rate_rps": 300.0, "slo_ms": 25.0, "family": "resnet"},
            {"name": "resnet101", "rate_rps": 100.0, "slo_ms": 50.0, "family": "resnet"},
            {"name": "vgg16", "rate_rps": 200.0, "slo_ms": 30.0, "family": "vgg"},
        ]
    }
    running = Plan(kind="glet", request=request, deployments=[], id=1)
    glet = get_kind("glet")
    measured = {"resnet": 0.0, "vgg": 50.0}
    out = glet.replan_request(
        running, ReplanSignal(None, forecast=measured.get, rates={"resnet101": 80.0})
    )
    rates = {m["name"]: m["rate_rps"] for m in out.request["models"]}
    # given by name wins; resnet50 measured idle (its family's 0 req/s) keeps a glet
    assert rates == {"resnet50": GLET_MIN_RATE_RPS, "resnet101": 80.0, "vgg16": 50.0}
    assert any("resnet50 measured below" in n for n in out.notes)
    # a family's given rate is shared as planned; without a forecaster the others stay, silently
    out = glet.replan_request(running, ReplanSignal(None, rates={"resnet": 800.0}))
    rates = {m["name"]: m["rate_rps"] for m in out.request["models"]}
    assert rates == {"resnet50": 600.0, "resnet101": 200.0, "vgg16": 200.0}
    assert out.notes == [] and out.forecast_rps == 800.0
    # a mig plan's one model, by name; an unknown name is refused, naming the option
    mig = Plan(kind="mig", request={"model": "resnet", "rate_rps": 40.0}, id=2)
    assert (
        get_kind("mig")
        .replan_request(mig, ReplanSignal(300.0, rates={"resnet": 90.0}))
        .request["rate_rps"]
        == 90.0
    )
    with pytest.raises(InputError, match=r"--rate bert=5: the plan serves no model 'bert'"):
        get_kind("mig").replan_request(mig, ReplanSignal(300.0, rates={"bert": 5.0}))
