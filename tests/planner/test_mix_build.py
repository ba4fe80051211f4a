"""Building the mix problem: each family from its own profiles, in one pass over them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from greenctl.planner.mix.model import MixFamily
from greenctl.planner.mix.solve import build_mix_problem

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_mix.py"


def _synthetic(families: int, variants: int, seed: int):
    spec = importlib.util.spec_from_file_location("bench_mix", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthetic(families, variants=variants, seed=seed)


def _shape(fam: MixFamily):
    options = [
        (o.variant, o.resource, o.batch, o.capacity_rps, o.energy_j_per_request)
        for o in fam.options
    ]
    return options, fam.pruned, fam.lowest_slo


def test_each_family_is_built_from_its_own_profiles_only() -> None:
    """Families requested together get the options, sizes and lowest SLO each gets alone,
    whatever the order of the profiles (interleaved) and of the request."""
    variants, profiles, fams = _synthetic(3, variants=4, seed=5)
    mixed = profiles[::2] + profiles[1::2]
    req = {"slo_ms": 500, "percentile": "p99", "budgets": {"cpu": 400}}
    together = build_mix_problem({**req, "families": fams[::-1]}, variants, mixed)
    assert [f.name for f in together.families] == [f["model"] for f in fams[::-1]]
    for got, want in zip(together.families, fams[::-1], strict=True):
        alone = build_mix_problem({**req, "families": [want]}, variants, profiles)
        assert got.options, got.name
        assert _shape(got) == _shape(alone.families[0])
        mine = {k: v for k, v in together.profiles.items() if k[0].startswith(got.name + "_")}
        assert mine == alone.profiles


def test_latency_profiles_are_sized_by_their_own_queue() -> None:
    """Options of plain latency rows (no load test), sized in one vectorised search, get
    the one-server capacity of their own service time at the SLO."""
    import dataclasses

    from greenctl.planner.core.queueing import capacity_at_slo
    from greenctl.planner.core.service import service_time

    variants, profiles, fams = _synthetic(2, variants=3, seed=7)
    plain = [
        dataclasses.replace(
            p,
            capacity_rps=None,
            capacity_slo_ms=None,
            latency_p50_ms=p.latency_p99_ms / 2,
            latency_p95_ms=p.latency_p99_ms * 0.8,
        )
        for p in profiles
    ]
    req = {"families": fams, "slo_ms": 500, "percentile": "p99", "budgets": {"cpu": 400}}
    problem = build_mix_problem(req, variants, plain)
    options = [o for f in problem.families for o in f.options]
    assert options
    for o in options:
        assert o.capacity_source == "queueing"
        svc = service_time(o.profile)
        assert o.capacity_rps == capacity_at_slo(svc, slo_ms=500.0, percentile=0.99)
