"""`plan geo` on the eGLB authors' real traces: their published numbers, reproduced."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenctl.data.bundled import path_of
from greenctl.data.eglb_convert import convert_eglb
from greenctl.data.geo_io import load_geo_problem
from greenctl.planner.geo.solve import allocation_violations, evaluate, solve


@pytest.fixture
def eglb_case(tmp_path: Path) -> dict[str, Path]:
    """The bundled eGLB layout converted with the authors' partial routes."""
    return convert_eglb(path_of("eglb"), tmp_path / "eglb", routes="partial")


def test_offline_optimum_matches_the_authors(eglb_case: dict[str, Path]) -> None:
    """quick_demo.ipynb (cvxpy + ECOS, every route): optimal value 623661.3524764299 with
    l_1 = 60 (USD/kL) and l_2 = 1500 (USD/t); per-site means 33669.45 USD, 1432.79 kL water,
    104.91 t carbon; maxima 1818.73 kL and 118.56 t. Min-price total 291698.606287178."""
    p = load_geo_problem(eglb_case["sites"], eglb_case["demand"])
    sol = solve(p, "eglb-off")
    assert allocation_violations(p, sol) == []
    s = evaluate(p, sol.site_load_mw, mu_carbon=1.5, mu_water=0.06)[1]
    assert s["objective"] == pytest.approx(623661.3524764299, rel=1e-8)
    assert s["energy_cost_usd_avg"] == pytest.approx(33669.45105842025, rel=1e-6)
    assert s["water_l_avg"] == pytest.approx(1432.792210790843e3, rel=1e-6)
    assert s["water_l_max"] == pytest.approx(1818.734618500509e3, rel=1e-6)
    assert s["carbon_kg_avg"] == pytest.approx(104.91162881039315e3, rel=1e-6)
    assert s["carbon_kg_max"] == pytest.approx(118.5618431881312e3, rel=1e-6)
    cheap = evaluate(p, solve(p, "glb-energy").site_load_mw, mu_carbon=1.5, mu_water=0.06)[1]
    assert cheap["energy_cost_usd_total"] == pytest.approx(291698.606287178, rel=1e-8)
    assert cheap["water_l_max"] == pytest.approx(2607.499995942185e3, rel=1e-6)


def test_partial_routes_cost_more_and_stay_feasible(eglb_case: dict[str, Path]) -> None:
    full = load_geo_problem(eglb_case["sites"], eglb_case["demand"])
    p = load_geo_problem(eglb_case["sites"], eglb_case["demand"], eglb_case["routes"])
    off = solve(p, "eglb-off")
    on = solve(p, "eglb")
    assert allocation_violations(p, off) == [] and allocation_violations(p, on) == []
    obj = {
        n: evaluate(p, s.site_load_mw, mu_carbon=1.5, mu_water=0.06)[1]["objective"]
        for n, s in (("off", off), ("on", on))
    }
    full_off = evaluate(full, solve(full, "eglb-off").site_load_mw, mu_carbon=1.5, mu_water=0.06)
    assert obj["off"] >= full_off[1]["objective"] * (1 - 1e-9)
    assert obj["off"] <= obj["on"] <= obj["off"] * 1.1  # online within 10 % of offline
