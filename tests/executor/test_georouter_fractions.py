"""A geo replan pushes new fractions only when they moved: a warm step and the whole-horizon
solve agree to about 1e-9, which is no change (exact comparison reported one)."""

from __future__ import annotations

from greenctl.executor.deploy.georouter import _same_fractions


def test_fractions_within_1e_9_are_the_same_and_others_are_not():
    slot = {"g1": {"a": 0.25, "b": 0.75}, "g2": {"a": 1.0}}
    near = {"g1": {"a": 0.25 + 4e-10, "b": 0.75 - 4e-10}, "g2": {"a": 1.0}}
    assert _same_fractions(slot, near)
    assert not _same_fractions(slot, {"g1": {"a": 0.3, "b": 0.7}, "g2": {"a": 1.0}})
    assert not _same_fractions(slot, {"g1": {"a": 0.25, "b": 0.75}})  # a gateway gone
    assert not _same_fractions({"g": {"a": 1.0}}, {"g": {"a": 1.0, "b": 0.0}})  # a new site
    assert not _same_fractions({}, slot)  # the slot had none
