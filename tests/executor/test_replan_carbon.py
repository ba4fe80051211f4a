"""A replan that keeps the running configuration while the grid moved (issue 19): with
``--apply`` the running deployment counts carbon at the new intensity from then on (the
configuration re-applied at the new signal: routes only, nothing restarts), and the lineage's
running plan, reference signal and dwell stay as they were.

Real processes: a dispatcher and a no-op executor applied by ``greenctl apply``'s library twin,
replanned over the bundled CISO trace (hourly from 2021-03-01T00:00Z: 124.57, 135.6, 148.61,
166.42, 240.4, 291.63, 295.64, 302.89 ... g/kWh).
"""

from __future__ import annotations

import time
import urllib.request

import pytest
from greenctl.data import carbon_io
from greenctl.data.records import Profile, Variant
from greenctl.executor.control import replan as replan_mod
from greenctl.executor.runtime.metrics import CARBON_TOTAL, ENERGY_TOTAL, GRID_INTENSITY, carbon_g
from greenctl.executor.runtime.metrics import parse_prometheus as parse

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(120)

OPTS = {"loader": "greenctl.executor.runtime.daemon:noop_loader", "cores": [0]}
T = "2021-03-01T{:02d}:00:00Z"


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        return parse(resp.read().decode())


def _sum(flat: dict[str, float], name: str) -> float:
    return sum(v for k, v in flat.items() if k.startswith(name + "{"))


def _intensity(flat: dict[str, float]) -> float | None:
    hits = [v for k, v in flat.items() if k.startswith(GRID_INTENSITY + "{")]
    return hits[0] if hits else None


def _wait_intensity(url: str, value: float, timeout_s: float = 5.0) -> dict[str, float]:
    """The executor's metrics once they count at ``value``: the intensity is read from the
    same snapshot as the counters (a snapshot taken before the switch, checked against a
    later read, once charged part of the interval at the old intensity)."""
    deadline = time.monotonic() + timeout_s
    flat = _metrics(url)
    while time.monotonic() < deadline:
        if _intensity(flat) == pytest.approx(value):
            return flat
        time.sleep(0.05)
        flat = _metrics(url)
    raise AssertionError(f"the executor does not count at {value} g/kWh: {_intensity(flat)}")


@pytest.fixture
def tiny_plan(run_store, monkeypatch):
    """The tiny family (modeled CPU profiles with an idle power, so energy grows with time),
    the CISO trace, and a plan of one tiny-l on cpu:1 made at 00:00 (124.57 g/kWh): the best
    configuration until 10:00."""
    from greenctl.executor.kinds import get_kind

    monkeypatch.setenv("GREENCTL_ENERGY_SCRAPE_S", "0.1")
    store = run_store
    for name, acc in (("tiny-s", 0.70), ("tiny-m", 0.76), ("tiny-l", 0.80)):
        store.upsert_variant(Variant(name, "tiny", accuracy=acc, input_shape="3,32,32"))
    rows = []
    for name, thr, e, lat in (("tiny-s", 400, 0.05, 3), ("tiny-m", 150, 0.2, 8),
                              ("tiny-l", 60, 0.6, 20)):  # fmt: skip
        rows.append(
            Profile(name, "cpu:1", 1, thr, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                    latency_p99_ms=2 * lat, power_w=10.0, idle_power_w=5.0, energy_j=e,
                    energy_method="modeled", capacity_rps=thr * 0.8, capacity_slo_ms=100,
                    cost_per_hour=0.05, source="synthetic")
        )  # fmt: skip
    store.add_profiles(rows)
    carbon_io.import_bundled(store, "clover-ciso-march")
    request = {"model": "tiny", "rate_rps": 20, "slo_ms": 100, "budgets": {"cpu": 1},
               "carbon_intensity": 124.57, "gamma": 0.5}  # fmt: skip
    plan, _ = get_kind("mix").plan(store, request)
    plan.extra["carbon_region"] = "CISO"
    pid = store.save_plan(plan)
    assert [(d.variant, d.resource) for d in plan.deployments] == [("tiny-l", "cpu:1")]
    return store, pid


def test_a_kept_plan_counts_carbon_at_the_new_signal(tiny_plan):
    from greenctl.executor.deploy.apply import apply_plan, status

    store, pid = tiny_plan
    applied = apply_plan(store.get_plan(pid), store=store, **OPTS)
    disp_url = applied.dispatcher_url or ""
    first = status(store)
    (inst,) = first["instances"]
    before = _wait_intensity(inst["url"], 124.57)

    def replan(hour: int, **kw: object) -> dict:
        return replan_mod.replan_once(
            store, plan=str(pid), at=T.format(hour), region="CISO", threshold=0.1, **kw
        )

    # 05:00, 291.63 g/kWh: the same configuration is best; it now counts at the signal
    d = replan(5, apply=True, apply_options=OPTS)
    assert d["action"] == "keep"
    assert "counts carbon at 291.63 g/kWh from now on (was 124.57 g/kWh)" in d["reason"]
    st = status(store)
    assert [i["pid"] for i in st["instances"]] == [inst["pid"]]  # kept, not restarted
    assert st["dispatcher"]["pid"] == first["dispatcher"]["pid"]
    counted_plan = st["dispatcher"]["plan_id"]
    assert counted_plan != pid and f"plan {counted_plan}," in d["reason"]
    # the record says what happened: the kept configuration was applied at the new signal
    assert d["applied"] is True and d["new_plan_id"] == counted_plan
    assert _metrics(disp_url)[GRID_INTENSITY] == pytest.approx(291.63)
    now = _wait_intensity(inst["url"], 291.63)
    time.sleep(0.3)
    later = _metrics(inst["url"])
    e1, c1 = _sum(now, ENERGY_TOTAL), _sum(now, CARBON_TOTAL)
    e2, c2 = _sum(later, ENERGY_TOTAL), _sum(later, CARBON_TOTAL)
    assert _sum(before, CARBON_TOTAL) <= c1 <= c2 and e2 > e1
    assert c2 - c1 == pytest.approx(carbon_g(e2 - e1, 291.63), rel=1e-3)  # not at 124.57

    # 06:00: kept again, pushed again; the lineage's reference is still the plan's own signal
    # (the push is no change of plan: no drift of the threshold, no dwell)
    d = replan(6, apply=True, apply_options=OPTS)
    assert d["action"] == "keep" and d["reference_g_per_kwh"] == pytest.approx(124.57)
    assert d["running_plan_id"] == counted_plan  # what really serves
    assert "counts carbon at 295.64 g/kWh from now on (was 291.63 g/kWh)" in d["reason"]
    _wait_intensity(inst["url"], 295.64)
    # the same signal again: nothing to push, no plan saved
    plans = store.db.table("plans").count
    d = replan(6, apply=True, apply_options=OPTS)
    assert d["action"] == "keep" and "counts carbon" not in d["reason"]
    assert store.db.table("plans").count == plans
    # without --apply nothing that runs changes
    d = replan(7)
    assert d["action"] == "keep" and "counts carbon" not in d["reason"]
    assert _intensity(_metrics(inst["url"])) == pytest.approx(295.64)
    # 10:00 (330.58): another configuration is best; measured against the plan's own signal
    d = replan(10, apply=True, apply_options=OPTS)
    assert d["action"] == "apply" and d["reference_g_per_kwh"] == pytest.approx(124.57)
    assert [i["variant"] for i in status(store)["instances"]] == ["tiny-m"]


def test_the_push_is_skipped_when_counted_and_reported_when_it_fails(store):
    """In-process: nothing to do at the intensity the serving plan counts at; a failed apply
    leaves the deployment counting as before, and the reason says so."""
    from greenctl.data.errors import ExecutorError
    from greenctl.data.plan import Deployment, Plan

    def plan(intensity: float) -> Plan:
        return Plan(kind="mix", request={"carbon_intensity": intensity},
                    deployments=[Deployment("tiny", "tiny-l", "cpu:1", 1, 1, 20.0)])  # fmt: skip

    serving = plan(124.57)
    store.save_plan(serving)
    applied: list[int] = []

    def ok(p: Plan, *, store: object, **kw: object) -> None:
        applied.append(int(p.id or 0))

    def fails(p: Plan, *, store: object, **kw: object) -> None:
        raise ExecutorError("the dispatcher does not answer")

    assert replan_mod._count_at_signal(store, serving.id, plan(124.57), ok, None) is None
    assert replan_mod._count_at_signal(store, None, plan(300.0), ok, None) is None
    assert applied == []
    said = replan_mod._count_at_signal(store, serving.id, plan(300.0), fails, None)
    assert said is not None and said.startswith("the running deployment still counts carbon at")
    assert "124.57 g/kWh" in said and "the dispatcher does not answer" in said
    new = plan(300.0)
    said = replan_mod._count_at_signal(store, serving.id, new, ok, {"cores": [0]})
    assert applied == [new.id] and f"plan {new.id}," in (said or "")
