"""A plan kind installed from outside greenctl, the way a third party's is: a package on the
path with a ``greenctl.kinds`` entry point. The registry loads it, its plans are planned,
saved, read back and simulated, and once the package is gone so is the kind."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
from pathlib import Path

import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.plan import load_plan_file, plan_kinds, write_plan_file
from greenctl.data.records import Profile, Variant
from greenctl.executor.kinds import KINDS, get_kind, load_kinds, plan

#: the toy kind's module: one variant of the tiny family on cpu:1, as many instances as the
#: rate needs at 70 % of their throughput, predicted as every serving kind is
TOY_MODULE = """
import math

from greenctl.data.plan import Deployment, Plan
from greenctl.executor.kinds import PlanKind, get_kind


def plan(store, request, *, current=None):
    rate = float(request["rate_rps"])
    profiles = [
        p for p in store.latest_profiles(family="tiny") if p.resource == "cpu:1" and p.batch == 1
    ]
    best = max(profiles, key=lambda p: p.throughput_rps)
    count = max(1, math.ceil(rate / (0.7 * best.throughput_rps)))
    deployment = Deployment("tiny", best.variant, "cpu:1", count=count, quota_rps=rate)
    out = Plan(kind="toy", request=dict(request), deployments=[deployment])
    out.predicted = get_kind("toy").predict(store, out, rate_rps=rate, analytic=True)
    return out, None


KIND = PlanKind("toy", plan=plan, default_policy="fifo")
"""


@pytest.fixture
def installed(tmp_path: Path):
    """The toy kind's package, installed on the path (module and dist-info) for the test."""
    site = tmp_path / "site"
    (site / "greenctl_toykind-0.1.dist-info").mkdir(parents=True)
    (site / "greenctl_toykind.py").write_text(textwrap.dedent(TOY_MODULE))
    info = site / "greenctl_toykind-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: greenctl-toykind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[greenctl.kinds]\ntoy = greenctl_toykind:KIND\n")
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()
    load_kinds()
    yield site
    if str(site) in sys.path:  # the package leaves the path
        sys.path.remove(str(site))
    sys.modules.pop("greenctl_toykind", None)
    load_kinds()


@pytest.fixture
def tiny(store):
    """The tiny family: two variants measured on one core."""
    for name, lat, acc in (("tiny-s", 3.0, 0.70), ("tiny-m", 8.0, 0.76)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc))
        store.add_profiles(
            [
                Profile(
                    name, "cpu:1", 1, 1000 / lat, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                    latency_p99_ms=2 * lat, power_w=10.0, energy_j=lat / 100,
                    energy_method="modeled", source="synthetic",
                )
            ]
        )  # fmt: skip
    return store


def test_an_installed_kind_is_planned_saved_and_simulated(installed, tiny, cli, tmp_path):
    assert list(KINDS)[:4] == ["mix", "mig", "glet", "geo"]  # the built-ins keep their order
    assert "toy" in KINDS and "toy" in plan_kinds()
    request = {"model": "tiny", "rate_rps": 500.0, "carbon_intensity": 200.0}
    new = plan(tiny, "toy", request)  # the library twin of `greenctl plan`
    assert [(d.variant, d.count) for d in new.deployments] == [("tiny-s", 3)]
    assert new.predicted["rate_rps"] == pytest.approx(500.0)
    tiny.save_plan(new)
    assert tiny.get_plan(new.id).kind == "toy"
    path = tmp_path / "toy.json"
    write_plan_file(new, path)
    r = cli("simulate", path, "--analytic", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["policy"] == "fifo" and not doc["overloaded"]  # the kind's default policy


def test_the_kind_is_gone_with_its_package(installed, tiny, tmp_path):
    path = tmp_path / "toy.json"
    write_plan_file(plan(tiny, "toy", {"model": "tiny", "rate_rps": 5.0}), path)
    sys.path.remove(str(installed))
    load_kinds()
    assert "toy" not in KINDS and "toy" not in plan_kinds()
    assert list(KINDS) == ["mix", "mig", "glet", "geo"]
    with pytest.raises(InputError, match="unknown plan kind 'toy'"):
        get_kind("toy")
    with pytest.raises(FileFormatError, match="field 'kind' is 'toy'"):
        load_plan_file(path)
