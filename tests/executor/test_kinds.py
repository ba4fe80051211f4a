"""The registry of plan kinds: `plan mix`/`plan mig` and `replan` plan through one entry."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from greenctl.data.errors import InputError
from greenctl.executor import control
from greenctl.executor.kinds import KINDS, PlanKind, get_kind, register

BENCH = Path(__file__).resolve().parents[2] / "bench" / "infadapter_import.py"


@pytest.fixture
def resnet(store, reference):
    spec = importlib.util.spec_from_file_location("infadapter_import", BENCH)
    assert spec is not None and spec.loader is not None
    conv = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conv)
    conv.load_into_store(store, reference / "infadapter" / "capacity_result_Feb_21.csv")
    return store


def test_replan_at_the_same_signal_finds_the_commands_plan(cli, resnet):
    """What `plan mix` made, `replan` (same signal, same load) makes again, and scores the
    running plan at the objective the solver reported: one builder, not two."""
    r = cli(
        "plan", "mix", "--model", "resnet", "--rate", "75", "--slo-ms", "750",
        "--budget", "cpu=14", "--carbon-intensity", "300", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    planned = resnet.get_plan(json.loads(r.stdout)["id"])
    new, old_obj, note = control._replan_kind(resnet, planned, intensity=300.0, rate=None)
    key = sorted((d.variant, d.resource, d.count) for d in planned.deployments)
    assert sorted((d.variant, d.resource, d.count) for d in new.deployments) == key
    assert note is None
    # scored in the same problem as the new plan; running instances pay no loading cost there
    assert old_obj == pytest.approx(new.predicted["objective"], rel=1e-6)
    assert old_obj >= planned.predicted["objective"] - 1e-9


def test_replan_asks_the_registry_which_kinds_it_can_replan(store):
    assert {k for k, v in KINDS.items() if v.replannable} == {"mix", "mig"}
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
    new, old_obj, note = control._replan_kind(store, running, intensity=123.0, rate=9.0)
    assert calls == [("plan", 123.0, 7), ("score", "P")]
    assert new.request["rate_rps"] == 9.0 and "carbon_region" not in new.request
    assert (old_obj, note) == (1.0, None)
