"""A mix plan's quotas add up to each model's load as written (six decimals), whatever the
solver's tolerance and the rounding of each deployment's quota did to the sum."""

from __future__ import annotations

import math

from greenctl.planner.mix.document import rounded_quotas


def test_quotas_a_hair_short_are_the_load_and_roundings_do_not_drift_the_sum() -> None:
    short = [0.9999994]  # a solver's answer for a load of 1 req/s
    assert rounded_quotas(short, 1.0) == [1.0]
    thirds = [1 / 3, 1 / 3, 1 / 3 + 2e-7]  # each rounds down: the sum would lose 1e-6
    got = rounded_quotas(thirds, 1.0)
    assert math.isclose(sum(got), 1.0, abs_tol=1e-12)
    assert all(round(q, 6) == q for q in got)


def test_a_plan_serving_less_than_its_load_keeps_its_quotas() -> None:
    assert rounded_quotas([0.5, 0.25], 1.0) == [0.5, 0.25]
    assert rounded_quotas([], 1.0) == []
    assert rounded_quotas([0.0], 1.0) == [0.0]
