"""Which tiers ``apply`` starts as engines (:func:`~greenctl.executor.deploy.llm_plan.engine_tiers`)
and how it agrees with the kind's ``local_engines`` flag, which the Ray backend and the
Kubernetes export refuse by: the llm kind's planner names an engine for every tier, so each
of its plans is all engines by both rules; a plan of another kind that deploys an LLM tier
without naming its engine is refused by ``greenctl apply``, naming the field, store unchanged.
"""

from __future__ import annotations

from greenctl.data.plan import Deployment, Plan, write_plan_file
from greenctl.executor.deploy.llm_plan import engine_tiers, names_engines
from greenctl.executor.kinds import get_kind, plan

from tests.planner.llm.rows import TIERS, add_family

REQUEST = {"model": "llm", "rate_rps": 3.0, "ttft_ms": 800, "tpot_ms": 60, "budget": {"cpu": 8}}


def _mix_plan(*variants: str) -> Plan:
    return Plan(
        kind="mix",
        request={"models": [{"model": "llm", "rate_rps": 1.0, "slo_ms": 500}]},
        deployments=[Deployment("llm", v, "cpu:1") for v in variants],
    )


def test_the_llm_kinds_plans_are_engines_by_both_rules(store) -> None:
    add_family(store)
    made = plan(store, "llm", REQUEST)
    assert get_kind(made.kind).local_engines
    assert names_engines(made)
    assert engine_tiers(made, store) == list(dict.fromkeys(d.variant for d in made.deployments))
    assert not get_kind("mix").local_engines


def test_without_engines_named_only_the_llm_tiers_need_one(store) -> None:
    add_family(store, tiers=("llm-small",))
    mixed = _mix_plan("resnet18", "llm-small", "llm-small")
    assert not names_engines(mixed)
    assert engine_tiers(mixed, store) == ["llm-small"]
    assert engine_tiers(_mix_plan("resnet18"), store) == []
    named = _mix_plan("resnet18", "llm-small")
    named.extra["llm"] = {"engines": {}}
    assert names_engines(named) and engine_tiers(named, store) == ["resnet18", "llm-small"]


def test_apply_refuses_an_llm_tier_without_its_engine(store, cli, tmp_path) -> None:
    add_family(store, tiers=tuple(TIERS))
    path = tmp_path / "p.json"
    write_plan_file(_mix_plan("llm-medium"), path)
    before = (store.plans(None), store.path.read_bytes())
    r = cli("apply", path, "--dry-run")
    assert r.exit_code == 2, r.output
    assert "Error: the plan deploys LLM tier llm-medium but names no engine for it" in r.output
    assert "(llm.engines.llm-medium)" in r.output and "Traceback" not in r.output
    assert (store.plans(None), store.path.read_bytes()) == before


def test_a_plan_of_another_kind_with_llm_tiers_is_refused_away_from_this_machine(
    store, cli, tmp_path
) -> None:
    """Only the local backend starts engines: the Ray backend refuses a mix plan whose tier
    is an LLM variant (before reaching any cluster), the Kubernetes export one that names
    engines."""
    import pytest
    from greenctl.data.errors import InputError
    from greenctl.executor.deploy.ray_backend import apply_ray

    add_family(store, tiers=("llm-small",))
    mixed = _mix_plan("llm-small")
    with pytest.raises(InputError, match="the Ray backend cannot take mix plans"):
        apply_ray(mixed, store=store, address="127.0.0.1:1")
    engines = {"llm-small": {"engine": "transformers", "model_dir": "m"}}
    named = Plan.from_dict({**mixed.to_dict(), "llm": {"engines": engines}})
    path = tmp_path / "named.json"
    write_plan_file(named, path)
    r = cli("export", "k8s", path, "-o", tmp_path / "k8s")
    assert r.exit_code == 2, r.output
    assert "the Kubernetes export cannot take mix plans" in r.output
    assert not (tmp_path / "k8s").exists()
