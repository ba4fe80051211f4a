"""A load test's service time in closed form: the search it replaces gives the same time."""

from __future__ import annotations

import random

import pytest
from greenctl.data.errors import InputError
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.queueing import capacities_at_slo, capacity_at_slo
from greenctl.planner.core.service import load_test_service_ms, searched_service_ms


def _cases(seed: int, n: int, quantiles: tuple[float, ...]) -> list[tuple[float, float, float]]:
    rng = random.Random(seed)
    return [
        (10 ** rng.uniform(-3, 3.5), rng.uniform(1.0, 2000.0), rng.choice(quantiles))
        for _ in range(n)
    ]


@pytest.mark.parametrize(
    "case",
    [
        *_cases(1, 40, (0.95, 0.99)),
        (12.0, 704.51, 0.99),  # InfAdapter's resnet34 on one core
        (0.01, 500.0, 0.99),  # a light load: the SLO itself is the service time
        (5000.0, 0.1, 0.99),
        (200.0, 30.0, 0.95),
    ],
)
def test_closed_form_matches_the_search(case: tuple[float, float, float]) -> None:
    rate, latency, q = case
    closed = load_test_service_ms(rate, latency, q)
    assert closed == pytest.approx(searched_service_ms(rate, latency, q), rel=1e-8)
    # the largest service time whose queue still carries the load test's rate
    cap = capacity_at_slo(ServiceTime.deterministic(closed), slo_ms=latency, percentile=q)
    assert cap >= rate
    longer = ServiceTime.deterministic(closed * (1 + 1e-7))
    if closed < min(latency, 1000.0 / rate):
        assert capacity_at_slo(longer, slo_ms=latency, percentile=q) < rate


@pytest.mark.parametrize("case", _cases(2, 30, (0.5,)))
def test_median_load_tests_stay_feasible(case: tuple[float, float, float]) -> None:
    """At the median the grid level rho = 1/2 has a wait probability of 1 - q to rounding:
    the search may land on either side of that level's noise, the closed form on the safe
    one, within one grid step (1/65536 of the capacity) of it."""
    rate, latency, q = case
    closed = load_test_service_ms(rate, latency, q)
    assert closed == pytest.approx(searched_service_ms(rate, latency, q), rel=4e-5)
    cap = capacity_at_slo(ServiceTime.deterministic(closed), slo_ms=latency, percentile=q)
    assert cap >= rate


@pytest.mark.parametrize("bad", [(0.0, 100.0), (-1.0, 100.0), (10.0, float("nan")), (10.0, 0.0)])
def test_a_load_test_needs_positive_numbers(bad: tuple[float, float]) -> None:
    with pytest.raises(InputError, match="must be a positive number"):
        load_test_service_ms(bad[0], bad[1], 0.99)


def _services(seed: int, n: int) -> tuple[list[ServiceTime], list[float]]:
    rng = random.Random(seed)
    out, slos = [], []
    for _ in range(n):
        p50 = rng.uniform(1.0, 300.0)
        pick = rng.random()
        if pick < 0.3:
            s = ServiceTime.from_percentiles(p50, p50 * rng.uniform(1.05, 2.0))
        elif pick < 0.6:
            s = ServiceTime.from_percentiles(
                p50, p50 * rng.uniform(1.05, 1.6), p50 * rng.uniform(1.7, 3.0)
            )
        elif pick < 0.9:
            s = ServiceTime.deterministic(p50)
        else:
            s = ServiceTime.exponential(p50)
        out.append(s)
        slos.append(rng.uniform(0.5, 10.0) * p50)
    return out, slos


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_many_capacities_at_once_are_each_ones(q: float) -> None:
    """The vectorised search gives every service the capacity of its own search (some
    services miss the SLO alone: 0)."""
    services, slos = _services(11, 300)
    many = capacities_at_slo(services, slos, q)
    one = [
        capacity_at_slo(s, slo_ms=slo, percentile=q) for s, slo in zip(services, slos, strict=True)
    ]
    assert many == one
    assert 0 < sum(c > 0 for c in one) < len(one)
