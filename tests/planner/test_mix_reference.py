"""plan mix on InfAdapter's real CPU profiles of ResNet 18..152 (bundled:infadapter)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from greenctl.data.bundled import path_of
from greenctl.planner.mix.solve import build_mix_problem, plan_mix

BENCH = Path(__file__).resolve().parents[2] / "bench" / "infadapter_import.py"


def _converter():
    spec = importlib.util.spec_from_file_location("infadapter_import", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_converter_rows_follow_the_import_contract():
    conv = _converter()
    rows = conv.convert_rows(path_of("infadapter"))
    assert len(rows) == 400
    assert {r["variant"] for r in rows} == {f"resnet{n}" for n in (18, 34, 50, 101, 152)}
    assert {r["capacity_slo_ms"] for r in rows} == {500.0, 750.0, 1000.0, 1500.0}
    for r in rows:
        assert r["resource"].startswith("cpu:") and r["batch"] == 1
        assert r["latency_ms"] != "" or r["latency_p99_ms"] != ""
        assert r["cost_per_hour"] == pytest.approx(
            conv.PRICE_PER_CORE_HOUR * int(r["resource"][4:])
        )


def test_infadapter_point_mixed_beats_single_variant(store):
    conv = _converter()
    n = conv.load_into_store(store, path_of("infadapter"))
    assert n == 400
    variants = store.variants("resnet")
    profiles = store.latest_profiles(family="resnet")
    gains = {}
    for cores in (8, 14, 20):
        req = {"model": "resnet", "rate_rps": 75, "slo_ms": 750, "percentile": "p99",
               "budgets": {"cpu": cores}, "objective": "accuracy"}  # fmt: skip
        problem = build_mix_problem(req, variants, profiles)
        assert {o.capacity_source for o in problem.families[0].options} == {"load-tested@750ms"}
        mixed = plan_mix(problem)
        single = plan_mix(problem, strategy="single")
        used = sum(int(d.resource[4:]) * d.count for d in mixed.deployments)
        assert used <= cores
        assert sum(d.quota_rps for d in mixed.deployments) == pytest.approx(75.0)
        assert len({d.variant for d in single.deployments}) == 1
        assert mixed.predicted["accuracy"] >= single.predicted["accuracy"] - 1e-9
        gains[cores] = mixed.predicted["accuracy"] - single.predicted["accuracy"]
    # InfAdapter's point: under a tight budget a mix of variants beats any single variant
    assert gains[8] > 0 and gains[14] > 0
    # with 20 cores ResNet-152 alone carries the load: nothing left to gain
    assert gains[20] == pytest.approx(0.0, abs=1e-9)
