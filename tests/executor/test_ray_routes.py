"""What a Ray plan version's group and replicas do (issue 19), without Ray: model-less routing
with the core's choice, the replicas' energy summed per model with its carbon at the plan's
grid intensity (the local dispatcher's series), routes re-applied in place, and which plan
runs the very replicas of the version serving. The same code runs inside Serve
(``test_ray_backend.py`` checks it on a real cluster)."""

from __future__ import annotations

import pytest
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile
from greenctl.executor.deploy.ray_backend import (
    PlanRoutes,
    ReplicaEnergy,
    RouteEntry,
    energy_spec,
)
from greenctl.executor.runtime.dispatcher import NoVariant
from greenctl.executor.runtime.metrics import (
    CARBON_TOTAL,
    ENERGY_TOTAL,
    GRID_INTENSITY,
    carbon_g,
    parse_prometheus,
)
from greenctl.planner.core.choice import Offer, QueueLatency, Requirements

FAST = Offer("tiny-s", 0.52, 0.05, 5e-6, 1e-6, QueueLatency((1.5,), 1.0))
SLOW = Offer("tiny-l", 0.79, 0.5, 5e-5, 2e-6, QueueLatency((8.0,), 6.0))


def _routes(**weights: float) -> dict:
    return {
        "tiny": [
            {"handle_index": i, "variant": o.variant, "resource": "cpu:1", "replicas": 2,
             "input_shape": [3, 32, 32], "weight": weights.get(o.variant.replace("-", "_"), 1.0),
             "offer": o.to_dict()}
            for i, o in enumerate((SLOW, FAST))
        ]
    }  # fmt: skip


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_model_less_requests_choose_by_the_core_rule():
    table = PlanRoutes(_routes(), "wrr", prefer="carbon")
    pick = table.pick
    assert pick("tiny", req=Requirements(latency_slo_ms=50)).variant == "tiny-s"  # greenest
    assert pick("tiny", req=Requirements(min_accuracy=0.75)).variant == "tiny-l"
    assert pick("tiny", "tiny-l").variant == "tiny-l"  # a variant's own name
    with pytest.raises(NoVariant) as none:
        pick("tiny", req=Requirements(min_accuracy=0.9))
    assert none.value.doc()["closest"]["variant"] == "tiny-l"
    with pytest.raises(NoVariant):
        pick("tiny", "tiny-s", Requirements(min_accuracy=0.75))  # only that variant counts
    with pytest.raises(KeyError):
        pick("other")
    # requests in flight, per replica (Serve spreads them over the deployment's two)
    fast = next(e for e in table.entries["tiny"] if e.variant == "tiny-s")
    for _ in range(22):
        fast.take()
    assert fast.inflight == 11  # 11 ahead: 11 ms + 1.5 ms predicted > 12
    assert pick("tiny", req=Requirements(latency_slo_ms=12)).variant == "tiny-l"
    for _ in range(18):
        fast.give()
    assert fast.inflight == 2
    assert pick("tiny", req=Requirements(latency_slo_ms=12)).variant == "tiny-s"
    # without requirements: the policy (wrr by quota, 3:1)
    weighted = PlanRoutes(_routes(tiny_l=3.0), "wrr")
    seen = [weighted.pick("tiny").variant for _ in range(8)]
    assert seen.count("tiny-l") == 6
    least = PlanRoutes(_routes(), "fifo")
    least.entries["tiny"][0].take()
    assert least.pick("tiny").variant == "tiny-s"


def _report(replica: str, joules: float, *, model: str = "tiny") -> dict:
    return {"replica": replica, "model": model, "variant": "tiny-s", "resource": "cpu:1",
            "source": "modeled", "joules": joules, "power_w": 5.0}  # fmt: skip


def test_replica_reports_sum_per_model_with_carbon_at_the_live_intensity():
    clock = _Clock()
    table = PlanRoutes(
        _routes(), "wrr", carbon={"carbon_g_per_kwh": 400.0, "pue": 1.2}, clock=clock,
        interval_s=1.0,
    )  # fmt: skip
    table.report(_report("r1", 10.0))  # a replica first seen: counts from zero
    table.report(_report("r2", 4.0))
    table.report(_report("r1", 16.0))
    energy = (ENERGY_TOTAL, "tiny", "modeled")
    carbon = (CARBON_TOTAL, "tiny", "modeled")
    assert table.energy.totals[energy] == pytest.approx(20.0)
    assert table.energy.totals[carbon] == pytest.approx(carbon_g(20.0, 400.0, 1.2))
    # a replan keeps the replicas at a new intensity: carbon goes on at it, energy as before
    doc = {"routes": _routes(), "carbon": {"carbon_g_per_kwh": 100.0, "pue": 1.2}}
    assert table.configure(doc) and not table.configure(doc)
    table.report(_report("r1", 26.0))
    assert table.energy.totals[energy] == pytest.approx(30.0)
    assert table.energy.totals[carbon] == pytest.approx(
        carbon_g(20.0, 400.0, 1.2) + carbon_g(10.0, 100.0, 1.2)
    )
    table.report(_report("r2", 1.0))  # its counter went back: a restart, counted whole
    assert table.energy.totals[energy] == pytest.approx(31.0)
    # a replica that cannot count says so, never a silent zero
    table.report({"replica": "r3", "model": "tiny", "variant": "tiny-l", "joules": None,
                  "why": "no profile figures"})  # fmt: skip
    text = table.metrics_text()
    flat = parse_prometheus(text)
    assert flat[f'{ENERGY_TOTAL}{{model="tiny",source="modeled"}}'] == pytest.approx(31.0)
    assert flat[GRID_INTENSITY] == 100.0
    assert "replica r3 counts no energy: tiny-l: no profile figures" in text
    # replicas silent for ten intervals are forgotten; what they counted stays
    clock.t = 20.0
    table.report(_report("r4", 2.0))
    assert set(table.seen) == {"r4"} and "r3" not in table.metrics_text()
    assert table.energy.totals[energy] == pytest.approx(33.0)
    # no intensity: energy only, and the gauge says why
    bare = PlanRoutes(_routes(), "wrr")
    bare.report(_report("r1", 5.0))
    assert carbon not in bare.energy.totals
    assert f"no {GRID_INTENSITY}" in bare.metrics_text()


def test_routes_are_reapplied_in_place_for_the_same_deployments_only():
    table = PlanRoutes(_routes(), "wrr", prefer="carbon")
    cheaper = Offer("tiny-l", 0.79, 0.5, 5e-5, 1e-7, QueueLatency((8.0,), 6.0))
    routes = _routes(tiny_l=3.0)
    routes["tiny"][0]["offer"] = cheaper.to_dict()
    assert table.configure({"routes": routes, "prefer": "cost", "policy": "fifo"})
    assert table.prefer == "cost" and table.policy == "fifo"
    first = table.candidates["tiny"][0][0]
    assert first == cheaper  # ranked again by the new preference and offers
    assert [e.weight for e in table.entries["tiny"]] == [3.0, 1.0]
    other = _routes()
    other["tiny"][0]["replicas"] = 3
    with pytest.raises(ValueError, match="other deployments"):
        table.configure({"routes": other})
    assert RouteEntry({"handle_index": 0, "variant": "v", "weight": 0}).weight == 1.0


def test_a_replica_counts_with_the_executors_counter(store):
    from greenctl.profiler.models import builtin_variant

    store.upsert_variant(builtin_variant("tiny-s"))
    store.add_profiles(
        [Profile("tiny-s", "cpu:1", 1, 500.0, latency_p50_ms=2.0, power_w=12.0,
                 idle_power_w=4.0, energy_j=0.03, source="imported")]
    )  # fmt: skip
    plan = Plan(kind="mix", deployments=[Deployment("tiny", "tiny-s", "cpu:1", 1)],
                request={"carbon_intensity": 300.0})  # fmt: skip
    spec = energy_spec(store, plan, plan.deployments[0])
    assert spec == {"model": "tiny", "variant": "tiny-s", "resource": "cpu:1", "busy_w": 12.0,
                    "idle_w": 4.0, "energy_j_per_request": 0.03}  # fmt: skip
    meter = ReplicaEnergy(spec, env={})
    meter.ran(0.001, 8)
    doc = meter.report("r1")
    assert doc["source"] in ("rapl", "modeled") and doc["joules"] > 0.0
    assert doc["model"] == "tiny" and doc["replica"] == "r1" and "power_w" in doc
    assert meter.report("r1")["joules"] >= doc["joules"]  # a counter: never back
    gpu = ReplicaEnergy({"model": "m", "variant": "v", "resource": "gpu:H100"}, env={})
    none = gpu.report("r2")  # no NVML here, no figures: nothing can say, and it says why
    assert none["joules"] is None and none["why"]


def test_the_same_replicas_are_recognised_from_the_store(store):
    from greenctl.data import deployments
    from greenctl.executor.deploy.ray_backend import _same_replicas

    deps = [Deployment("tiny", "tiny-s", "cpu:1", 2, 1, 10.0),
            Deployment("tiny", "tiny-l", "cpu:1", 1, 4, 5.0)]  # fmt: skip
    running = Plan(kind="mix", deployments=deps, request={"carbon_intensity": 400.0})
    store.save_plan(running)
    with store.transaction():
        deployments.record_ray_app(store, plan_id=running.id, address="a:1", app="app-1",
                                   url="http://x")  # fmt: skip
    # the same replicas, another order, other quotas and intensity: in place
    again = Plan(kind="mix", deployments=[Deployment("tiny", "tiny-l", "cpu:1", 1, 4, 9.0),
                                          Deployment("tiny", "tiny-s", "cpu:1", 2, 1, 1.0)])  # fmt: skip
    assert _same_replicas(store, "app-1", again) == [1, 0]
    assert _same_replicas(store, "app-2", again) is None  # not the version the store records
    more = Plan(kind="mix", deployments=[*again.deployments, deps[0]])
    assert _same_replicas(store, "app-1", more) is None
    fewer = Plan(kind="mix", deployments=[deps[0]])
    assert _same_replicas(store, "app-1", fewer) is None
