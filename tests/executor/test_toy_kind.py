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
from greenctl.executor.control.replay import replay
from greenctl.executor.kinds import KINDS, get_kind, load_kinds, plan
from greenctl.executor.kinds.replaying import replayed_kinds

#: the toy kind's module: one variant of the tiny family on cpu:1, as many instances as the
#: rate needs at 70 % of their throughput, predicted as every serving kind is
TOY_MODULE = """
import math

from greenctl.data.plan import Deployment, Plan
from greenctl.executor.kinds import PlanKind, get_kind
from greenctl.executor.kinds.serving_replay import Serving, replay_serving
from greenctl.executor.kinds.replaying import ReplayStep


def capacity(store):
    profiles = [
        p for p in store.latest_profiles(family="tiny") if p.resource == "cpu:1" and p.batch == 1
    ]
    return max(profiles, key=lambda p: p.throughput_rps)


def plan(store, request, *, current=None):
    rate = float(request["rate_rps"])
    best = capacity(store)
    count = max(1, math.ceil(rate / (0.7 * best.throughput_rps)))
    deployment = Deployment("tiny", best.variant, "cpu:1", count=count, quota_rps=rate)
    out = Plan(kind="toy", request=dict(request), deployments=[deployment])
    out.predicted = get_kind("toy").predict(store, out, rate_rps=rate, analytic=True)
    out.predicted.update(objective=float(count), objective_name="instances")
    return out, (rate, best.throughput_rps)


def score(problem, running):
    rate, per_instance = problem
    count = sum(d.count for d in running.deployments)
    if rate > 0.7 * per_instance * count:
        return None, f"{count} instances cannot carry {rate:.0f} req/s"
    return float(count), None


SERVING = Serving(
    hold=lambda first, request, notes: None,
    static=lambda *args: None,
    percentile=lambda request: "p95",
)
STEP = ReplayStep(
    run=lambda store, inputs, loop: replay_serving(store, inputs, loop, SERVING),
    baselines=(),
    default_baselines=(),
)
KIND = PlanKind(
    "toy", plan=plan, score=score, default_policy="fifo", carbon_signal=False, replay=STEP
)
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


def test_an_installed_kind_is_replayed(installed, tiny, tmp_path):
    """The loop replans the toy plan as the load moves, through the kind's own step."""
    assert replayed_kinds()[-1] == "toy"
    trace = tmp_path / "load.txt"
    trace.write_text(" ".join(["100"] * 120 + ["900"] * 120 + ["100"] * 120))
    request = {"model": "tiny", "rate_rps": 100.0, "slo_ms": 100.0, "carbon_intensity": 200.0}
    result = replay(tiny, kind="toy", request=request, load_trace=str(trace), every="60s",
                    min_dwell_s=0, baselines=())  # fmt: skip
    assert result["meta"]["kind"] == "toy"
    rows = result["intervals"]["greenctl"]
    assert len(rows) == 6
    assert {r["action"] for r in rows} >= {"start", "change"}
    assert max(r["units"] for r in rows) > min(r["units"] for r in rows)  # it scaled
    assert [s["policy"] for s in result["summary"]] == ["greenctl"]


def test_the_kind_is_gone_with_its_package(installed, tiny, tmp_path):
    path = tmp_path / "toy.json"
    write_plan_file(plan(tiny, "toy", {"model": "tiny", "rate_rps": 5.0}), path)
    sys.path.remove(str(installed))
    load_kinds()
    assert "toy" not in KINDS and "toy" not in plan_kinds()
    assert list(KINDS) == ["mix", "mig", "glet", "geo", "llm"]
    with pytest.raises(InputError, match="unknown plan kind 'toy'"):
        get_kind("toy")
    with pytest.raises(FileFormatError, match="field 'kind' is 'toy'"):
        load_plan_file(path)
