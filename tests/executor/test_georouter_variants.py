"""`replan` of a routed geo plan made with `--variants` (heterogeneous models): one eGLB online
step for the new slot from the state stored after the previous one, as for a plain plan. The
router runs over endpoints that do not answer (its sites are drained; replanning does not
need them), a real router process."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

SITES = ("west", "central", "east")
HOURS = ("00", "01", "02", "03")
T0 = "2024-01-01T00:30:00Z"


def write_inputs(folder: Path) -> dict[str, Path]:
    """Three 1 MW sites, three gateways of 0.6 MW with overlapping routes, four hourly steps,
    and three variants (a frugal one below the accuracy floor)."""
    prices = ((40, 60, 80), (90, 50, 70), (60, 80, 40), (70, 40, 90))
    sites = ["time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw"]
    for t, hour in enumerate(HOURS):
        for j, s in enumerate(SITES):
            carbon = 300 - 100 * j + 40 * t
            sites.append(f"2024-01-01T{hour}:00:00Z,{s},{prices[t][j]},{carbon},2,1.0")
    demand = ["time,gateway,load_mw"] + [
        f"2024-01-01T{h}:00:00Z,{g},0.6" for h in HOURS for g in ("g1", "g2", "g3")
    ]
    routes = ["gateway,site", "g1,west", "g1,central", "g2,central", "g2,east"]
    routes += ["g3,west", "g3,central", "g3,east"]
    variants = ["variant,energy_j_per_request,accuracy", "big,10,0.783", "mid,5,0.761"]
    variants += ["small,2.5,0.698"]
    out = {}
    for name, lines in (("sites", sites), ("demand", demand), ("routes", routes),
                        ("variants", variants)):  # fmt: skip
        out[name] = folder / f"{name}.csv"
        out[name].write_text("\n".join(lines) + "\n")
    return out


@pytest.fixture
def routed(tmp_path):
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.georouter import apply_geo, stop_router
    from greenctl.executor.kinds import get_kind

    saved = os.environ.pop("GREENCTL_STATE_DIR", None)
    store = open_store(tmp_path / "router.db")
    try:
        files = write_inputs(tmp_path)
        request = {k: str(v) for k, v in files.items()}
        request |= {"algorithm": "eglb", "min_accuracy": 0.76}
        plan, run = get_kind("geo").plan(store, request)
        assert run.variants is not None
        store.save_plan(plan)
        urls = {s: f"http://127.0.0.1:9/{s}" for s in SITES}  # nothing answers there
        apply_geo(plan, store=store, sites=urls, at=T0, health_interval_s=5.0)
        yield store, plan, run
    finally:
        with contextlib.suppress(Exception):
            stop_router(store)
        store.close()
        if saved is not None:
            os.environ["GREENCTL_STATE_DIR"] = saved


def test_variants_plan_replans_one_online_step_per_slot(routed):
    from greenctl.data import loop_state, reports
    from greenctl.executor.deploy.georouter import replan_if_routed, routing_table

    store, plan, run = routed
    lineage = f"plan:{plan.id}"
    whole = routing_table(plan, store)
    sol = run.solutions["eglb"]
    first = replan_if_routed(store, plan=str(plan.id), at=T0)
    assert first is not None and first["slot"] == 0
    assert not first["online"]["warm"]  # nothing stored yet: rebuilt (no step before 0)
    for slot in (1, 2, 3):
        out = replan_if_routed(store, plan=str(plan.id))  # the next slot
        assert out is not None and out["slot"] == slot and out["action"] == "update-router"
        assert out["online"]["warm"] and out["online"]["steps"] == 1
        step = loop_state.last_geo_step(store, lineage)
        assert step is not None and step["slot"] == slot
        state = step["state"]
        assert state["slot"] == slot and len(state["basis"]["key"]) == 7  # the LP's basis
        # unchanged files: the slot's fractions are the whole solve's
        assert step["fractions"].keys() == whole["slots"][slot].keys()
        for gw, fr in whole["slots"][slot].items():
            assert step["fractions"][gw] == pytest.approx(fr, abs=1e-7)
    assert sol.variant_load is not None
    v = run.variants
    banked = float(((v.accuracy - 0.76) * sol.variant_load).sum())
    assert state["accuracy_surplus"] == pytest.approx(banked, abs=1e-9)
    last = reports.decisions(store, lineage=lineage)[-1]
    assert "eGLB online step (eglb, from the stored state of the slot before" in last["reason"]
