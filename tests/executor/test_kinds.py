"""The registry of plan kinds: every plan command, `simulate`, `apply` and `replan` go
through one entry per kind; a kind registered at run time works through all of them."""

from __future__ import annotations

import json

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.control import history, replan
from greenctl.executor.kinds import GLET_REPLAN_HEADROOM, KINDS, PlanKind, get_kind, register


def test_replan_at_the_same_signal_finds_the_commands_plan(cli, resnet):
    """What `plan mix` made, `replan` (same signal, same load) makes again, and scores the
    running plan at the objective the solver reported: one builder, not two."""
    r = cli(
        "plan", "mix", "--model", "resnet", "--rate", "75", "--slo-ms", "750",
        "--budget", "cpu=14", "--carbon-intensity", "300", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    planned = resnet.get_plan(json.loads(r.stdout)["id"])
    new, old_obj, note, _ = replan._replan_kind(resnet, planned, intensity=300.0, rate=None)
    key = sorted((d.variant, d.resource, d.count) for d in planned.deployments)
    assert sorted((d.variant, d.resource, d.count) for d in new.deployments) == key
    assert note is None
    # scored in the same problem as the new plan; running instances pay no loading cost there
    assert old_obj == pytest.approx(new.predicted["objective"], rel=1e-6)
    assert old_obj >= planned.predicted["objective"] - 1e-9


def test_replan_asks_the_registry_which_kinds_it_can_replan(store):
    assert {k for k, v in KINDS.items() if v.replannable} == {"mix", "mig", "glet", "geo", "llm"}
    with pytest.raises(InputError, match=r"(?s)unknown plan kind 'nope'.*glet"):
        get_kind("nope")


def test_a_registered_kind_is_planned_and_scored_through_the_registry(store, monkeypatch):
    """A kind added with register() is what replan plans and scores (no list elsewhere)."""
    from greenctl.data.plan import Deployment, Plan

    calls = []

    def plan(store, request, *, current=None):
        calls.append(("plan", request["carbon_intensity"], current.id))
        return Plan(kind="mix", request=request, deployments=list(current.deployments)), "P"

    def score(problem, running):
        calls.append(("score", problem))
        return 1.0, None

    monkeypatch.setitem(KINDS, "mix", KINDS["mix"])  # restored after the test
    register(PlanKind("mix", plan=plan, score=score))
    running = Plan(
        kind="mix",
        request={"model": "tiny", "rate_rps": 5.0, "carbon_region": "X"},
        deployments=[Deployment("tiny", "tiny-s", "cpu:1", count=1, quota_rps=5.0)],
        id=7,
    )
    new, old_obj, note, _ = replan._replan_kind(store, running, intensity=123.0, rate=9.0)
    assert calls == [("plan", 123.0, 7), ("score", "P")]
    assert new.request["rate_rps"] == 9.0 and "carbon_region" not in new.request
    assert (old_obj, note) == (1.0, None)


# -- glet and geo: planned by the commands through the registry, and planned again by it ------
def test_a_glet_plan_is_planned_again_from_its_request(cli, gpulet):
    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--model", "vgg16:300:30",
        "--simulate-seconds", "0", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    planned = gpulet.get_plan(json.loads(r.stdout)["id"])
    assert planned.request["interference"]["id"] is not None  # the model used, recorded
    again, _ = get_kind("glet").plan(gpulet, dict(planned.request))
    assert again.extra["gpus"] == planned.extra["gpus"]  # its request plans it again
    new, old_obj, note, _ = replan._replan_kind(gpulet, planned, intensity=300.0, rate=None)
    assert new.request["rate_headroom"] == GLET_REPLAN_HEADROOM  # a replan packs with room
    assert new.request["models"] == planned.request["models"]
    assert new.request["interference"] == planned.request["interference"]
    assert (old_obj, note) == (planned.predicted["gpus"], None)
    assert get_kind("glet").objective(new) == ("GPUs", new.predicted["gpus"], False)


def test_a_glet_layout_that_cannot_carry_the_load_is_not_scored(cli, gpulet):
    import dataclasses

    from greenctl.planner.glet.solve import layout_gpus

    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--simulate-seconds", "0", "--json",
    )  # fmt: skip
    planned = gpulet.get_plan(json.loads(r.stdout)["id"])
    _, problem = get_kind("glet").plan(gpulet, planned.request)
    assert layout_gpus(problem, planned.extra["gpus"]) == (planned.predicted["gpus"], None)
    busier = dataclasses.replace(
        problem, models=[dataclasses.replace(m, rate_rps=m.rate_rps * 5) for m in problem.models]
    )
    gpus, note = layout_gpus(busier, planned.extra["gpus"])
    assert gpus is None and "misses an SLO" in note
    moved = json.loads(json.dumps(planned.extra["gpus"]))
    moved[0]["glets"][0]["resource"] = "mps:30"
    gpus, note = layout_gpus(problem, moved)
    assert gpus is None and "not one of the partitions" in note


def test_a_kept_glet_layout_must_carry_the_load_at_its_running_batches(cli, gpulet):
    """The running executors keep their batch sizes and duty cycle while the layout is kept:
    a rate rise that a larger batch on the same glet would carry, but the running batch does
    not, is not scored as carried (replay saw 100 % violations behind such a keep)."""
    import dataclasses

    from greenctl.planner.glet.solve import layout_gpus

    r = cli(
        "plan", "glet", "--model", "resnet50:100:25", "--simulate-seconds", "0", "--json",
    )  # fmt: skip
    planned = gpulet.get_plan(json.loads(r.stdout)["id"])
    _, problem = get_kind("glet").plan(gpulet, planned.request)
    notes = {}
    for factor in (1.5, 2, 3, 4, 6, 9):
        busier = dataclasses.replace(
            problem,
            models=[dataclasses.replace(m, rate_rps=m.rate_rps * factor) for m in problem.models],
        )
        notes[factor] = layout_gpus(busier, planned.extra["gpus"])
    held = [
        f for f, (gpus, note) in notes.items() if gpus is None and "running batch" in (note or "")
    ]
    assert held, notes  # some rise a fresh batch choice would carry on the running glet
    assert all(notes[f][0] is None for f in notes if f >= min(held))  # and every larger one


def test_a_glet_plan_is_planned_simulated_and_applied(cli, gpulet, tmp_path, monkeypatch):
    """A glet plan's deployments serve their variant's family (as every plan document's and
    as apply checks): `plan glet` -> `simulate` -> `apply --dry-run` on a (fake) GPU."""
    path = tmp_path / "glet.json"
    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--model", "vgg16:300:30",
        "--simulate-seconds", "0", "-o", path, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert {(d["model"], d["variant"]) for d in doc["deployments"]} == {
        ("resnet", "resnet50"),
        ("vgg", "vgg16"),
    }
    # the glets and the request keep each model's own name (and now its family)
    assert {m["model"] for g in doc["gpus"] for gl in g["glets"] for m in gl["models"]} == {
        "resnet50",
        "vgg16",
    }
    assert [(m["name"], m["family"]) for m in doc["request"]["models"]] == [
        ("resnet50", "resnet"),
        ("vgg16", "vgg"),
    ]
    r = cli("simulate", path, "--json", "--analytic")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["policy"] == "batch"
    r = cli("simulate", path, "--json", "--requests", "2000")
    assert r.exit_code == 0, r.output
    fake = tmp_path / "fake_nvml.json"
    fake.write_text(
        json.dumps(
            {"gpus": [{"name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-1", "memory_mb": 40960}]}
        )
    )
    monkeypatch.setenv("GREENCTL_FAKE_NVML", str(fake))
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))
    r = cli("apply", path, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    applied = json.loads(r.stdout)
    assert applied["dry_run"] and applied["policy"] == "batch"
    starts = {
        (a["model"], a["variant"], a["resource"])
        for a in applied["actions"]
        if a["action"] == "start-executor"
    }
    assert starts == {(d["model"], d["variant"], d["resource"]) for d in doc["deployments"]}


# -- replanning: each kind rewrites its own request -------------------------------------------
def _running(kind: str, request: dict, deployments=()) -> Plan:
    return Plan(kind=kind, request=request, deployments=list(deployments), id=1)


def test_each_kind_rewrites_its_request_for_a_new_signal_and_load():
    from greenctl.executor.kinds import ReplanSignal

    loads = {"resnet": 90.0, "tiny": 12.0}
    forecast = loads.get
    # mix, one family: its rate is the family's forecast; the baseline and region go
    mix = _running(
        "mix",
        {"model": "tiny", "rate_rps": 5.0, "baseline": "accuracy", "carbon_region": "CISO"},
    )
    out = get_kind("mix").replan_request(mix, ReplanSignal(300.0, forecast=forecast))
    assert out.request == {"model": "tiny", "rate_rps": 12.0, "carbon_intensity": 300.0}
    assert (out.forecast_rps, out.notes) == (12.0, [])
    # mix, several families: each takes its own forecast; one never measured keeps its rate
    fams = [{"model": "tiny", "rate_rps": 5.0}, {"model": "vgg", "rate_rps": 7.0}]
    out = get_kind("mix").replan_request(
        _running("mix", {"families": fams}), ReplanSignal(300.0, forecast=forecast)
    )
    assert [f["rate_rps"] for f in out.request["families"]] == [12.0, 7.0]
    assert out.forecast_rps == 12.0 and "vgg" in out.notes[0]
    # ...and a whole-plan forecast is spread over them as planned
    out = get_kind("mix").replan_request(
        _running("mix", {"families": fams}), ReplanSignal(300.0, rate_rps=24.0)
    )
    assert [f["rate_rps"] for f in out.request["families"]] == [10.0, 14.0]
    # mig: the family's rate and the signal
    mig = _running("mig", {"model": "resnet", "rate_rps": 40.0, "gpu": "A100-40GB", "gpus": 1})
    out = get_kind("mig").replan_request(mig, ReplanSignal(250.0, forecast=forecast))
    assert (out.request["rate_rps"], out.request["carbon_intensity"]) == (90.0, 250.0)
    out = get_kind("mig").replan_request(mig, ReplanSignal(250.0, forecast=lambda m: None))
    assert out.request["rate_rps"] == 40.0
    assert out.notes == ["no measured load yet: planned rate kept"]
    # no forecaster: rates stay, nothing to say
    out = get_kind("mig").replan_request(mig, ReplanSignal(250.0))
    assert (out.request["rate_rps"], out.forecast_rps, out.notes) == (40.0, None, [])
    # geo: its files are its inputs; it says so, and sets nothing
    geo = _running("geo", {"sites": "/s.csv", "demand": "/d.csv", "carbon_region": "X"})
    out = get_kind("geo").replan_request(geo, ReplanSignal(250.0, forecast=forecast))
    assert out.request == {"sites": "/s.csv", "demand": "/d.csv"}
    assert out.forecast_rps is None and "sites and demand files" in out.notes[0]
    assert "load forecast are not planned with" in out.notes[0]


def test_a_glet_plans_models_take_their_measured_rates():
    from greenctl.executor.kinds import ReplanSignal

    request = {
        "models": [
            {"name": "resnet50", "variant": "resnet50", "rate_rps": 300.0, "slo_ms": 25.0,
             "family": "resnet"},
            {"name": "resnet101", "variant": "resnet101", "rate_rps": 100.0, "slo_ms": 50.0,
             "family": "resnet"},
            {"name": "vgg16", "variant": "vgg16", "rate_rps": 200.0, "slo_ms": 30.0},
            {"name": "bert", "variant": "bert", "rate_rps": 50.0, "slo_ms": 80.0},
        ],
        "max_gpus": 8,
    }  # fmt: skip
    # vgg16's family comes from the running deployments (plans made before it was recorded)
    deps = [Deployment("vgg", "vgg16", "mps:50", count=1, batch=4, quota_rps=200.0)]
    running = _running("glet", request, deps)
    measured = {"resnet": 600.0, "vgg": 50.0, "resnet101": 120.0}
    out = get_kind("glet").replan_request(running, ReplanSignal(300.0, forecast=measured.get))
    rates = {m["name"]: m["rate_rps"] for m in out.request["models"]}
    # resnet101 is measured by its own name; resnet50 takes its planned share (3/4) of the
    # family's load; vgg16 its family's; bert, never measured, keeps its rate
    assert rates == {"resnet50": 450.0, "resnet101": 120.0, "vgg16": 50.0, "bert": 50.0}
    assert out.forecast_rps == pytest.approx(620.0)
    assert out.notes == ["no measured load yet for bert: its planned rate kept"]
    assert "carbon_intensity" not in out.request  # glet plans minimise GPUs, not carbon
    # a whole-plan forecast is spread over the models as planned
    out = get_kind("glet").replan_request(running, ReplanSignal(300.0, rate_rps=1300.0))
    assert [m["rate_rps"] for m in out.request["models"]] == [600.0, 200.0, 400.0, 100.0]


def test_replan_forecasts_a_glet_plans_load_model_by_model(cli, gpulet):
    from greenctl.data import carbon_io

    r = cli(
        "plan", "glet", "--model", "resnet50:400:25", "--model", "vgg16:300:30",
        "--simulate-seconds", "0", "--json",
    )  # fmt: skip
    planned = gpulet.get_plan(json.loads(r.stdout)["id"])
    planned.extra["carbon_region"] = "CISO"
    gpulet.save_plan(planned)
    carbon_io.import_bundled(gpulet, "clover-ciso-march")
    # the dispatcher measured resnet (the family it routes), never vgg
    history.record_load(
        gpulet,
        [history.LoadSample(f"2021-03-01T00:0{m}:00Z", 200.0, model="resnet") for m in range(3)],
    )
    d = replan.replan_once(
        gpulet, plan=str(planned.id), at="2021-03-01T00:00:00Z", region="CISO",
        forecaster="last",
    )  # fmt: skip
    assert d["forecast_rps"] == 200.0
    assert "no measured load yet for vgg16" in d["reason"]
    # less load than planned, no GPU saved: the running layout stays (a glet plans no carbon)
    assert d["action"] in ("hold", "keep") and d["new_plan_id"] is None, d["reason"]
    # more than the running layout carries: a new schedule at the measured rates
    history.record_load(gpulet, [history.LoadSample("2021-03-01T00:04:00Z", 900.0, model="resnet")])
    d = replan.replan_once(
        gpulet, plan=str(planned.id), at="2021-03-01T00:05:00Z", region="CISO",
        forecaster="last", min_dwell_s=0,
    )  # fmt: skip
    assert d["action"] == "propose" and "at the new load" in d["reason"], d["reason"]
    new = gpulet.get_plan(d["new_plan_id"])
    rates = {m["name"]: m["rate_rps"] for m in new.request["models"]}
    assert rates == {"resnet50": 900.0, "vgg16": 300.0}
    assert new.predicted["rate_rps"] == 1200.0


@pytest.fixture
def eglb(tmp_path, monkeypatch):
    """12 hours of the bundled eGLB traces, written to tmp_path/eglb; the working folder is
    tmp_path, so relative paths name them."""
    from greenctl.data.eglb_convert import convert_eglb

    monkeypatch.chdir(tmp_path)
    convert_eglb(None, tmp_path / "eglb", steps=12, routes="partial")
    return ["--sites", "eglb/sites.csv", "--demand", "eglb/demand.csv"]


def test_a_geo_plan_is_planned_again_from_anywhere(cli, store, eglb, tmp_path, monkeypatch):
    from greenctl.data import carbon_io

    r = cli("plan", "geo", *eglb, "--routes", "eglb/routes.csv", "-a", "eglb", "--json")
    assert r.exit_code == 0, r.output
    planned = store.get_plan(json.loads(r.stdout)["id"])
    # the request names its files absolutely: a cron job in another folder reads the same
    assert planned.request["sites"] == str(tmp_path / "eglb" / "sites.csv")
    assert planned.request["routes"] == str(tmp_path / "eglb" / "routes.csv")
    monkeypatch.chdir("/")
    new, old_obj, note, _ = replan._replan_kind(store, planned, intensity=300.0, rate=None)
    assert new.predicted["objective"] == pytest.approx(planned.predicted["objective"])
    assert [d.to_dict() for d in new.deployments] == [d.to_dict() for d in planned.deployments]
    assert old_obj is None and "per-step" in note  # its per-step flows are not in the plan
    carbon_io.import_bundled(store, "clover-ciso-march")
    args = ("replan", "--plan", planned.id, "--region", "CISO", "--at", "2021-03-01T00:00:00Z")
    r = cli(*args, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["action"] == "keep"
    r = cli(*args, "--apply")  # no backend runs a geo plan: said plainly, nothing recorded
    assert r.exit_code == 2
    assert "cannot apply plan" in r.output and "replan without --apply" in r.output


def test_a_geo_plan_of_a_store_family_keeps_the_family(cli, store, eglb):
    from greenctl.data.records import Profile, Variant

    for name, acc, energy in (("tiny-s", 0.70, 0.05), ("tiny-l", 0.80, 0.6)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc))
        store.add_profiles([Profile(name, "cpu:1", 1, 100.0, latency_p50_ms=5.0, energy_j=energy)])
    r = cli("plan", "geo", *eglb, "--family", "tiny", "--min-accuracy", "0.75", "--json")
    assert r.exit_code == 0, r.output
    planned = store.get_plan(json.loads(r.stdout)["id"])
    assert planned.request["family"] == "tiny"
    again, _ = get_kind("geo").plan(store, planned.request)
    assert again.predicted["objective"] == pytest.approx(planned.predicted["objective"])
    assert again.request == planned.request
    r = cli("plan", "geo", *eglb, "--family", "tiny", "--variants", "v.csv")
    assert r.exit_code == 2 and "not both" in r.output


def test_a_geo_plan_is_not_simulated_and_applied_only_as_routes(cli, eglb, tmp_path):
    r = cli("plan", "geo", *eglb, "-o", "geo.json")
    assert r.exit_code == 0, r.output
    r = cli("simulate", "geo.json", "--rate", "5")
    assert r.exit_code == 2
    assert "a geo plan: it allocates load across sites" in " ".join(r.output.split())
    # apply routes it across sites (the geo router): every site needs its endpoint
    r = cli("apply", "geo.json", "--dry-run")
    assert r.exit_code == 2
    assert "no endpoint" in r.output and "--site" in r.output


# -- the acceptance test: a kind registered at run time, through every step -----------------
NOOP = "greenctl.executor.runtime.daemon:noop_loader"
TOY_ENERGY_J = {"tiny-s": 0.05, "tiny-m": 0.2}
TOY_ACCURACY = {"tiny-s": 0.70, "tiny-m": 0.76}


def _toy_cost(intensity: float, variant: str) -> float:
    """Carbon per request priced against lost accuracy: tiny-m below 160 g/kWh, else tiny-s."""
    return intensity * TOY_ENERGY_J[variant] + 400 * (1 - TOY_ACCURACY[variant])


def _toy_plan(store, request, *, current=None):
    from greenctl.data.plan import Deployment, Plan

    intensity, rate = float(request["carbon_intensity"]), float(request["rate_rps"])
    best = min(TOY_ENERGY_J, key=lambda v: _toy_cost(intensity, v))
    plan = Plan(
        kind="toy",
        request=dict(request),
        deployments=[Deployment(request["model"], best, "cpu:1", count=1, quota_rps=rate)],
        predicted={"rate_rps": rate, "objective": _toy_cost(intensity, best)},
    )
    return plan, intensity  # the toy's problem is the intensity it was planned at


def _toy_score(intensity, running):
    return _toy_cost(intensity, running.deployments[0].variant), None


@pytest.fixture
def toy(store, monkeypatch, tmp_path):
    """A tiny family profiled on one core, the CISO carbon trace, and the kind ``toy``
    registered (with ``fifo`` as its default policy) for the test only."""
    from greenctl.data import carbon_io
    from greenctl.data.records import Profile, Variant
    from greenctl.executor.kinds import unregister

    for name, lat in (("tiny-s", 3.0), ("tiny-m", 8.0)):
        store.upsert_variant(Variant(name, "tiny", accuracy=TOY_ACCURACY[name]))
        store.add_profiles(
            [
                Profile(
                    name, "cpu:1", 1, 1000 / lat, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                    latency_p99_ms=2 * lat, power_w=10.0, energy_j=TOY_ENERGY_J[name],
                    energy_method="modeled", source="synthetic",
                )
            ]
        )  # fmt: skip
    carbon_io.import_bundled(store, "clover-ciso-march")
    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "state"))
    register(
        PlanKind(
            "toy",
            plan=_toy_plan,
            score=_toy_score,
            objective=lambda p: ("toy", p.predicted.get("objective"), False),
            default_policy="fifo",
        )
    )
    yield store
    unregister("toy")


def test_a_registered_kind_goes_through_plan_simulate_apply_and_replan(cli, toy, tmp_path):
    from greenctl.data.errors import FileFormatError
    from greenctl.data.plan import load_plan_file, write_plan_file

    # plan: the kind's entry, as `plan X` commands call theirs (1 March, 00:00: 124.57 g/kWh)
    request = {"model": "tiny", "rate_rps": 20.0, "slo_ms": 100.0, "carbon_intensity": 124.57}
    plan, _ = get_kind("toy").plan(toy, request)
    plan.extra["carbon_region"] = "CISO"
    toy.save_plan(plan)
    path = tmp_path / "toy.json"
    write_plan_file(plan, path)
    assert [d.variant for d in load_plan_file(path).deployments] == ["tiny-m"]

    # simulate: predicted by the kind's hook, under the kind's default policy
    for extra in (("--analytic",), ("--requests", "3000")):
        r = cli("simulate", path, "--json", *extra)
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["policy"] == "fifo" and not doc["overloaded"]
        assert doc["rate_rps"] == pytest.approx(20.0, rel=0.05)  # the simulated is measured

    # apply --dry-run: the kind's instances, served under the same policy
    r = cli("apply", path, "--dry-run", "--json", "--loader", NOOP)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["dry_run"] and doc["policy"] == "fifo"
    starts = [a for a in doc["actions"] if a["action"] == "start-executor"]
    assert [a["variant"] for a in starts] == ["tiny-m"]

    # replan: at 04:00 the grid is at 240.4 g/kWh; the kind plans tiny-s and scores tiny-m
    r = cli("replan", "--plan", plan.id, "--at", "2021-03-01T04:00:00Z", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["action"] == "propose" and d["signal_g_per_kwh"] == pytest.approx(240.4)
    assert d["old_objective"] == pytest.approx(_toy_cost(240.4, "tiny-m"))
    assert d["new_objective"] == pytest.approx(_toy_cost(240.4, "tiny-s"))
    assert d["improvement"] > 0
    new = toy.get_plan(d["new_plan_id"])
    assert new.kind == "toy" and [x.variant for x in new.deployments] == ["tiny-s"]

    # once the kind is gone its plans are refused where they are read
    from greenctl.executor.kinds import unregister

    unregister("toy")
    with pytest.raises(FileFormatError, match="field 'kind' is 'toy'"):
        load_plan_file(path)


@pytest.mark.parametrize(
    ("kind", "request_doc", "words"),
    [
        ("glet", {}, "no models"),
        ("glet", {"models": [{"name": "a", "rate_rps": "x", "slo_ms": 5}]}, "models[0]"),
        (
            "glet",
            {"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "max_gpus": 1.5},
            "max_gpus",
        ),
        (
            "glet",
            {"models": [{"name": "a", "rate_rps": 1, "slo_ms": 5}], "partitions": "20"},
            "partitions",
        ),
        ("geo", {"demand": "d.csv"}, "needs sites"),
        ("geo", {"sites": "s.csv", "demand": "d.csv", "horizon": "3"}, "request.horizon"),
        ("geo", {"sites": "s.csv", "demand": "d.csv", "family": 3}, "request.family"),
    ],
)
def test_a_bad_request_is_refused_naming_the_field(store, kind, request_doc, words):
    """A hand-edited plan's request is refused naming the field (exit 2), never a traceback."""
    with pytest.raises(InputError) as err:
        get_kind(kind).plan(store, request_doc)
    assert words in err.value.message
