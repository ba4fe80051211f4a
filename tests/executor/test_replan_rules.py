"""Replan rules found by replaying Clover (issue 21): a tied plan is no reason to change, and
a MIG replan holds the intensity BASE is priced at."""

from __future__ import annotations

import pytest
from greenctl.data.plan import Deployment, Plan
from greenctl.executor.control import replan
from greenctl.executor.kinds import ReplanSignal, get_kind


def _plan(variant: str, objective: float) -> Plan:
    return Plan(
        kind="mix",
        request={"model": "m", "rate_rps": 10.0, "carbon_intensity": 100.0},
        deployments=[Deployment(model="m", variant=variant, resource="cpu:1", count=1)],
        predicted={"objective": objective, "objective_name": "carbon"},
    )


@pytest.mark.parametrize(
    ("new_objective", "changes"),
    [(5.0, False), (5.0 * (1 - 1e-12), False), (5.0 * 1.001, False), (4.0, True)],
)
def test_a_moved_signal_changes_the_plan_only_for_a_better_one(monkeypatch, new_objective, changes):
    """The signal moved 100 % (> threshold): a different plan that ties the running one in
    the new problem (an exact solver's other optimum), or is worse, triggers nothing; a
    better one does (carbon: lower is better)."""
    running = _plan("a", 5.0)
    new = _plan("b", new_objective)

    def replan_kind(store, running_, **kw):
        from greenctl.executor.kinds import ReplanRequest

        return new, 5.0, None, ReplanRequest(dict(running_.request), None, [])

    monkeypatch.setattr(replan, "_replan_kind", replan_kind)
    choice = replan.replan_choice(
        None, running, signal=200.0, reference=100.0, threshold=0.05, margin=0.02
    )
    assert not choice.same
    assert bool(choice.triggers) is changes
    if changes:
        assert "signal moved 100.0 %" in choice.triggers[0]
    else:
        assert "only ties the running one or is worse" in choice.not_worth


def test_a_mig_replan_prices_base_at_the_intensity_the_plan_was_made_at():
    """Clover's objective weighs carbon against BASE's: BASE priced at the new signal itself
    cancels the signal out, so a replan keeps the running plan's reference."""
    kind = get_kind("mig")
    running = Plan(
        kind="mig",
        request={"gpu": "A100-40GB", "gpus": 2, "model": "m", "rate_rps": 10.0,
                 "carbon_intensity": 120.0, "base_carbon_intensity": None},
        deployments=[],
    )  # fmt: skip
    out = kind.replan_request(running, ReplanSignal(300.0))
    assert out.request["carbon_intensity"] == 300.0
    assert out.request["base_carbon_intensity"] == 120.0
    # a reference given to plan mig stays
    running.request["base_carbon_intensity"] = 200.0
    out = kind.replan_request(running, ReplanSignal(300.0))
    assert out.request["base_carbon_intensity"] == 200.0
