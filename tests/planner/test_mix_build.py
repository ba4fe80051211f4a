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
