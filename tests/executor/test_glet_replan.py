"""A glet plan applied on the fake NVML (real executor daemons and
dispatcher) is replanned from the rates its dispatcher measured and reorganised, the glets
that stay kept running where they are."""

from __future__ import annotations

import json
import re
import stat
import threading
from pathlib import Path

import pytest
from greenctl.executor.control import history, replan
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
    from greenctl.executor.runtime.loadgen import run_load

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
    from greenctl.executor.deploy.apply import apply_plan, status

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
    assert history.sample_dispatcher_load(gpulet) == []  # primes the counters
    served = _load(url, {"resnet": 60.0, "vgg": 40.0, "inception": 20.0}, 1.0)
    assert all(r.errors == 0 for r in served.values())  # type: ignore[attr-defined]

    # moving glets keeps serving: the new ones start beside the old (MPS shares leave room)
    during: dict[str, object] = {}
    background = threading.Thread(
        target=lambda: during.update(_load(url, {"resnet": 30.0, "vgg": 30.0}, 2.0))
    )
    background.start()
    d = replan.replan_once(gpulet, plan=str(plan.id), apply=True, forecaster="last", min_dwell_s=0)
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
    from greenctl.executor.deploy.apply import verify_plan

    v = verify_plan(new, store=gpulet, endpoint=url, duration_s=0.5, rate_rps=90.0)
    got = {m: (r["slo_ms"], r["errors"]) for m, r in v["measured"]["models"].items()}
    assert got == {"resnet": (25.0, 0), "vgg": (30.0, 0), "inception": (40.0, 0)}
    per = v["measured"]["models"].values()
    late = sum(r["slo_violation_frac"] * r["sent"] for r in per) / sum(r["sent"] for r in per)
    assert v["measured"]["slo_violation_frac"] == pytest.approx(late)

    # the same rates again: the new schedule is the running one; nothing moves
    d2 = replan.replan_once(gpulet, plan=str(plan.id), apply=True, min_dwell_s=0, rates=rates)
    assert d2["action"] == "keep", d2["reason"]
    assert {i["id"] for i in status(gpulet)["instances"]} == {i["id"] for i in now}


def test_a_move_without_room_reports_its_serving_gap(run_store, tmp_path, monkeypatch, loaders):
    """A MIG slice that goes away frees its executor before the new slice exists: a model
    with no other executor is unrouted for a while, which apply measures and reports."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.deploy.apply import apply_plan

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


# -- when a replan changes a glet plan: forced, a GPU saved with headroom, nothing else ------
def _scaled(factor: float, **each: float) -> dict[str, float]:
    return {m["name"]: m["rate_rps"] * each.get(m["name"], factor) for m in MODELS}


def _models(factor: float) -> list[dict[str, object]]:
    return [{**m, "rate_rps": m["rate_rps"] * factor} for m in MODELS]


def _planned(store, *, max_gpus: int = 4):
    plan, _ = get_kind("glet").plan(store, {"models": MODELS, "max_gpus": max_gpus})
    store.save_plan(plan)
    assert plan.predicted["gpus"] == 2 and plan.request["rate_headroom"] == 0.0
    return plan


def test_rate_noise_the_running_layout_carries_changes_nothing(gpulet):
    plan = _planned(gpulet)
    # noise within +-20 % for which the best new schedule differs from the running one (some
    # glets would move) on as many GPUs: the running layout carries it, so nothing changes
    for rates in (
        _scaled(1.0, resnet50=1.05, vgg16=0.95, inception=0.9),
        _scaled(1.0, resnet50=0.92, vgg16=1.04, inception=0.8),
    ):
        d = replan.replan_once(gpulet, plan=str(plan.id), min_dwell_s=0, rates=rates)
        assert d["action"] == "hold" and d["new_plan_id"] is None, d["reason"]
        assert re.search(r"GPUs 2 -> 2 with .*, [1-3] of 3 glets would move", d["reason"])
        assert "the running layout carries the new rates: a change must save a GPU" in d["reason"]


def test_a_dip_keeps_its_gpus_and_a_real_fall_gives_one_back_with_headroom(gpulet):
    from greenctl.executor.kinds import GLET_REPLAN_HEADROOM

    plan = _planned(gpulet)
    # at 65 % of the load one GPU would do (it carries up to about 70 %), but not with the
    # headroom (65 % x 1.3 = 85 %): hysteresis, no change
    alone, _ = get_kind("glet").plan(gpulet, {"models": _models(0.65), "max_gpus": 4})
    assert alone.predicted["gpus"] == 1
    d = replan.replan_once(gpulet, plan=str(plan.id), min_dwell_s=0, rates=_scaled(0.65))
    assert d["action"] == "hold" and d["new_plan_id"] is None, d["reason"]
    assert "GPUs 2 -> 2 with the rates + 30 % headroom" in d["reason"]
    # at half the load one GPU carries the rates + the headroom (65 %): the GPU goes back
    d = replan.replan_once(gpulet, plan=str(plan.id), min_dwell_s=0, rates=_scaled(0.5))
    assert d["action"] == "propose", d["reason"]
    assert "GPUs 2 -> 1 with the rates + 30 % headroom: saves 1 GPU (50 % > 5 %)" in d["reason"]
    new = gpulet.get_plan(d["new_plan_id"])
    assert new.predicted["gpus"] == 1 and new.request["rate_headroom"] == GLET_REPLAN_HEADROOM
    # the plan routes and records the rates themselves; only the packing has room
    want = _scaled(0.5)
    assert {m["name"]: m["rate_rps"] for m in new.request["models"]} == pytest.approx(want)
    assert {p["model"]: p["rate_rps"] for p in new.predicted["per_model"]} == pytest.approx(want)
    # a threshold above the share saved keeps the GPUs (1 of 2 is 50 %)
    d = replan.replan_once(
        gpulet, plan=str(plan.id), min_dwell_s=0, rates=_scaled(0.5), threshold=0.6
    )
    assert d["new_plan_id"] is None and "is 50 % (<= 60 %)" in d["reason"]


def test_doubled_rates_force_a_change_packed_with_headroom_or_without_when_none_fits(gpulet):
    plan = _planned(gpulet)
    d = replan.replan_once(gpulet, plan=str(plan.id), min_dwell_s=0, rates=_scaled(2.0))
    assert d["action"] == "propose", d["reason"]
    assert d["old_objective"] is None  # the running layout cannot carry the doubled load
    assert re.search(r"misses an SLO at the new load|cannot carry the new load", d["reason"])
    new = gpulet.get_plan(d["new_plan_id"])
    assert new.request["rate_headroom"] == 0.3 and new.predicted["gpus"] == 3
    # within 2 GPUs there is no room for the headroom: planned at the rates, noted
    small = _planned(gpulet, max_gpus=2)
    d = replan.replan_once(gpulet, plan=str(small.id), min_dwell_s=0, rates=_scaled(2.0))
    assert d["action"] == "propose", d["reason"]
    new = gpulet.get_plan(d["new_plan_id"])
    assert new.predicted["gpus"] == 2
    assert any("headroom need more than 2 GPUs" in n for n in new.extra["notes"])


def test_the_replan_headroom_is_the_plans_own_when_it_sets_one(gpulet):
    from greenctl.data.errors import InputError

    plan, _ = get_kind("glet").plan(
        gpulet, {"models": MODELS, "max_gpus": 4, "replan_headroom": 0.0}
    )
    gpulet.save_plan(plan)
    assert plan.request["replan_headroom"] == 0.0
    # no headroom: at half the load the fewest GPUs are 1, so the GPU goes back at once
    d = replan.replan_once(gpulet, plan=str(plan.id), min_dwell_s=0, rates=_scaled(0.5))
    assert d["action"] == "propose" and "GPUs 2 -> 1 with the rates + 0 % headroom" in d["reason"]
    assert gpulet.get_plan(d["new_plan_id"]).request["replan_headroom"] == 0.0  # kept
    with pytest.raises(InputError, match="replan_headroom"):
        get_kind("glet").plan(gpulet, {"models": MODELS, "replan_headroom": -1})


def test_apply_refuses_glets_whose_memory_the_gpu_cannot_hold(
    run_store, gpulet, tmp_path, monkeypatch, loaders
):
    """MPS partitions share their GPU's memory: a glet plan whose executors on one GPU need
    more than that GPU has is refused before anything starts, naming the GPU, the models and
    the MiB needed and available."""
    from dataclasses import replace

    from greenctl.data.errors import InputError
    from greenctl.executor.deploy.apply import apply_plan, status

    for name in ("resnet50", "vgg16", "inception"):  # weights, as a profile would say
        gpulet.upsert_variant(replace(gpulet.get_variant(name), memory_mb=9000.0))
    plan, _ = get_kind("glet").plan(
        gpulet, {"models": MODELS, "max_gpus": 3, "gpu_memory_mb": 40960.0}
    )
    gpulet.save_plan(plan)
    assert plan.request["gpu_memory_mb"] == 40960.0
    per_gpu = {g["index"]: g["memory_mb"] for g in plan.extra["gpus"]}
    assert max(per_gpu.values()) > 16384.0  # what the smaller GPUs below cannot hold
    fake = tmp_path / "small_nvml.json"
    small = {"name": "NVIDIA A2", "memory_mb": 16384, "mig": None}
    fake.write_text(json.dumps({"gpus": [{**small, "uuid": f"GPU-{n}"} for n in range(3)]}))
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))
    monkeypatch.setenv("GREENCTL_MPS_CONTROL", "/bin/false")  # must not be reached
    for dry in (True, False):
        with pytest.raises(InputError) as err:
            apply_plan(plan, store=gpulet, loader=loaders["noop"], dry_run=dry)
        msg = err.value.message
        gpu = max(per_gpu, key=per_gpu.__getitem__)
        assert msg.startswith(f"GPU {gpu} (NVIDIA A2) cannot hold its glets: ")
        assert f"= {per_gpu[gpu]:,.0f} MiB needed, 16,384 MiB available" in msg
        assert "(resnet50, mps:" in msg or "(vgg16, mps:" in msg or "(inception, mps:" in msg
    doc = status(gpulet)
    assert doc["instances"] == [] and doc.get("dispatcher") in (None, {})
    # on 40 GB GPUs it fits, unless other processes hold the memory (nothing of ours runs)
    big = {"name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "mig": None}
    fake.write_text(json.dumps({"gpus": [
        {**big, "uuid": f"GPU-{n}", "memory_used_mb": 30000} for n in range(3)
    ]}))  # fmt: skip
    with pytest.raises(InputError, match="in use by other processes"):
        apply_plan(plan, store=gpulet, loader=loaders["noop"], dry_run=True)
    fake.write_text(json.dumps({"gpus": [{**big, "uuid": f"GPU-{n}"} for n in range(3)]}))
    assert apply_plan(plan, store=gpulet, loader=loaders["noop"], dry_run=True).dry_run


MIG_PARTS = ["mig:1g.5gb", "mig:2g.10gb", "mig:3g.20gb", "mig:4g.20gb", "mig:7g.40gb"]


def _mig_problem(rates: dict[str, float]):
    """Synthetic profiles on an A100-40GB's MIG profiles (latency inverse to the slices)."""
    from greenctl.planner.glet.solve import GletModel, GletProblem

    lat = {
        name: {
            p: {b: (base + 0.5 * b) * 7 / int(p[4]) for b in (1, 2, 4, 8, 16)} for p in MIG_PARTS
        }
        for name, base in (("alpha", 2.0), ("beta", 3.0), ("gamma", 1.5))
    }
    models = [GletModel(n, r, 60.0) for n, r in rates.items()]
    return GletProblem(models=models, latency_ms=lat, partitions=MIG_PARTS, max_gpus=2)


def test_a_glet_plan_on_mig_slices_is_applied_on_its_layout(
    run_store, tmp_path, monkeypatch, loaders
):
    """Glets on MIG: each GPU's glets get a valid layout (memory-slot starts), apply creates
    those GPU instances on the fake NVML and starts each glet's executors on its slice (the
    models of a time-shared glet on the same one), and a new schedule reshapes them."""
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.planner.glet.solve import plan_glet
    from greenctl.profiler.fake_nvml import FakeNvml

    fake = tmp_path / "fake_nvml.json"
    gpu = {"name": "NVIDIA A100-SXM4-40GB", "memory_mb": 40960, "mig": True, "instances": []}
    fake.write_text(json.dumps({"persist": True, "gpus": [
        {**gpu, "uuid": f"GPU-{n}"} for n in range(2)
    ]}))  # fmt: skip
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))

    def applied(plan):
        apply_plan(plan, store=run_store, loader=loaders["noop"])
        nvml = FakeNvml.from_file(fake)
        slots = {
            (i.gpu_index, i.profile, i.placement_start)
            for g in (0, 1)
            for i in nvml.mig_instances(g)
        }
        want = {
            (gpu["index"], g["resource"].removeprefix("mig:"), g["start"])
            for gpu in plan.extra["gpus"]
            for g in gpu["glets"]
        }
        assert slots == want  # exactly the glets' GPU instances
        running = status(run_store)["instances"]
        assert all(i["ready"] for i in running)
        assert len(running) == sum(
            len(g["models"]) for gp in plan.extra["gpus"] for g in gp["glets"]
        )
        return running

    low = plan_glet(_mig_problem({"alpha": 20.0, "beta": 15.0, "gamma": 10.0}))
    shared = [g for gp in low.extra["gpus"] for g in gp["glets"] if len(g["models"]) > 1]
    assert shared, "low rates: models time-share a glet"
    for d in low.deployments:
        assert len(d.placement["starts"]) == len(d.placement["gpus"]) == d.count
    applied(low)
    high = plan_glet(_mig_problem({"alpha": 400.0, "beta": 300.0, "gamma": 350.0}))
    assert high.predicted["gpus"] >= low.predicted["gpus"]
    applied(high)
