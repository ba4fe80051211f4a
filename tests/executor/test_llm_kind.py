"""The llm kind on the registry: planned through the planning twin from the store's LLM
profiles, scored, replanned at a new carbon signal and load, and predicted by its simulator."""

from __future__ import annotations

import pytest
from greenctl.data.errors import InfeasiblePlan, InputError
from greenctl.data.plan import Plan
from greenctl.executor.kinds import get_kind, load_kinds, plan, plan_problem
from greenctl.executor.kinds.base import ReplanSignal

from tests.planner.llm.rows import add_family

REQUEST = {
    "model": "llm",
    "rate_rps": 3.0,
    "ttft_ms": 800,
    "tpot_ms": 60,
    "budget": {"cpu": 4},
    "min_quality": 0.7,
}


@pytest.fixture
def llm_store(store):
    add_family(store)
    return store


def test_the_kind_is_installed() -> None:
    load_kinds()
    kind = get_kind("llm")
    assert kind.plans_at_intensity and kind.replannable and kind.serves
    assert kind.default_policy == "wrr"
    assert kind.instances is None  # apply's own expansion: count instances per deployment


def test_planned_through_the_twin_at_a_given_intensity(llm_store) -> None:
    new = plan(llm_store, "llm", {**REQUEST, "carbon_intensity": 250.0})
    assert new.kind == "llm"
    assert new.request["carbon_intensity"] == 250.0
    assert new.predicted["carbon_intensity_g_per_kwh"] == 250.0
    assert new.extra["carbon_source"]["kind"] == "flag"
    assert new.predicted["quality"] >= 0.7 - 1e-9
    assert sum(new.extra["llm"]["shares"].values()) == pytest.approx(1.0)
    # the saved document reads back as a plan of the kind
    pid = llm_store.save_plan(new)
    again = llm_store.get_plan(pid)
    assert again.kind == "llm" and again.extra["llm"] == new.extra["llm"]
    assert Plan.from_dict(new.to_dict()).deployments == new.deployments


def test_without_an_intensity_the_reference_is_planned_at_and_said(llm_store) -> None:
    new = plan(llm_store, "llm", REQUEST)
    assert new.request["carbon_intensity"] == 400.0
    assert new.extra["carbon_source"]["kind"] == "default"


def test_refusals_name_the_field_and_leave_the_store(llm_store) -> None:
    before = llm_store.plans(None)
    kind = get_kind("llm")
    with pytest.raises(InputError, match=r"tpot_ms \(--tpot-ms\) must be > 0"):
        kind.check_request({**REQUEST, "tpot_ms": 0})
    with pytest.raises(InputError, match=r"no LLM profiles of family 'nope'") as exc:
        plan(llm_store, "llm", {**REQUEST, "model": "nope"})
    assert "known LLM families: llm" in (exc.value.hint or "")
    with pytest.raises(InfeasiblePlan, match="closest: llm-small"):
        plan(llm_store, "llm", {**REQUEST, "ttft_ms": 40})
    assert llm_store.plans(None) == before


def test_score_at_a_new_load(llm_store) -> None:
    kind = get_kind("llm")
    running, problem = plan_problem(llm_store, "llm", {**REQUEST, "carbon_intensity": 300.0})
    value, note = kind.score(problem, running)
    assert value == pytest.approx(running.predicted["objective"], rel=1e-9) and note is None
    _, heavier = plan_problem(
        llm_store, "llm", {**REQUEST, "rate_rps": 30.0, "budget": {"cpu": 12}}
    )
    value, note = kind.score(heavier, running)
    assert value is None and "cannot carry" in (note or "")


def test_replan_request_takes_the_signal_and_the_forecast(llm_store) -> None:
    kind = get_kind("llm")
    running = plan(llm_store, "llm", {**REQUEST, "carbon_intensity": 300.0})
    out = kind.replan_request(running, ReplanSignal(600.0, rate_rps=2.0))
    assert out.request["carbon_intensity"] == 600.0
    assert out.request["rate_rps"] == 2.0 and out.forecast_rps == 2.0
    kind.check_request(out.request)  # a valid request of the kind


def test_balanced_shares_follow_the_carbon_signal(llm_store) -> None:
    """Quality Time's move: planned again at a dirtier grid, a balanced plan serves a larger
    share of the cheaper tiers (less quality, less carbon per request)."""
    kind = get_kind("llm")
    req = {**REQUEST, "objective": "balanced", "gamma": 0.3, "min_quality": 0.55}
    clean = plan(llm_store, "llm", {**req, "carbon_intensity": 20.0})
    assert kind.carbon_aware(clean)
    name, value, larger = kind.objective(clean)
    assert name == "balanced" and larger and value is not None
    dirty_req = kind.replan_request(clean, ReplanSignal(900.0)).request
    dirty = plan(llm_store, "llm", dirty_req)
    assert dirty.predicted["quality"] < clean.predicted["quality"]
    assert dirty.predicted["energy_j_per_request"] < clean.predicted["energy_j_per_request"]


def test_predict_simulates_the_plan(llm_store) -> None:
    kind = get_kind("llm")
    new = plan(llm_store, "llm", {**REQUEST, "carbon_intensity": 300.0})
    sim = kind.predict(llm_store, new, n_requests=20_000, seed=1)
    assert sim["rate_rps"] == pytest.approx(3.0)
    assert sim["ttft_p95_ms"] <= new.predicted["ttft_p95_ms"] * 1.12
    assert sim["tpot_p95_ms"] <= new.predicted["tpot_p95_ms"] * 1.12
    assert sim["slo_violation_frac"] <= 0.05 and not sim["overloaded"]
    assert sim["carbon_g_per_request"] > 0 and sim["accuracy"] == pytest.approx(
        new.predicted["quality"]
    )
    analytic = kind.predict(llm_store, new, analytic=True)
    assert analytic["ttft_p95_ms"] == pytest.approx(new.predicted["ttft_p95_ms"], rel=1e-9)
    # three times the load on the same instances: past what was profiled
    over = kind.predict(llm_store, new, rate_rps=9.0, n_requests=20_000)
    assert over["overloaded"] and over["slo_violation_frac"] > 0.05


def test_an_llm_plan_is_served_and_simulated_by_its_shares(store):
    """Requests follow the tiers' shares (wrr), not the batching an engine's concurrency
    would pick by the policy rule."""
    from greenctl.executor.kinds import get_kind, plan

    from tests.planner.llm.rows import add_family

    add_family(store)
    made = plan(store, "llm", {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60,
                               "budget": {"cpu": 8}})  # fmt: skip
    assert max(d.batch for d in made.deployments) > 1
    assert get_kind("llm").dispatch_policy(made) == "wrr"


def test_kubernetes_export_refuses_an_llm_plan(store, cli, tmp_path):
    from greenctl.data.plan import write_plan_file
    from greenctl.executor.kinds import plan

    from tests.planner.llm.rows import add_family

    add_family(store)
    made = plan(store, "llm", {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60,
                               "budget": {"cpu": 8}})  # fmt: skip
    path = tmp_path / "p.json"
    write_plan_file(made, path)
    r = cli("export", "k8s", path, "-o", tmp_path / "k8s")
    assert r.exit_code == 2, r.output
    assert "the Kubernetes export cannot take llm plans" in r.output
    assert "greenctl apply PLAN" in r.output and not (tmp_path / "k8s").exists()


def test_the_ray_backend_refuses_an_llm_plan_before_reaching_a_cluster(store):
    from greenctl.data.errors import InputError
    from greenctl.executor.deploy.ray_backend import apply_ray
    from greenctl.executor.kinds import plan

    from tests.planner.llm.rows import add_family

    add_family(store)
    made = plan(store, "llm", {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60,
                               "budget": {"cpu": 8}})  # fmt: skip
    with pytest.raises(InputError, match="the Ray backend cannot take llm plans"):
        apply_ray(made, store=store, address="127.0.0.1:1")
