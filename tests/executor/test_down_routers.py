"""``greenctl down`` on a backend other than the local daemons still stops the geo router,
which runs on this host whichever backend serves its sites."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_down_on_ray_stops_the_local_geo_router(tmp_path, monkeypatch):
    from greenctl.data.store import open_store
    from greenctl.executor.deploy import backends, ray_backend
    from greenctl.executor.deploy.georouter import apply_geo
    from greenctl.executor.deploy.georouter_procs import stop_routers

    from tests.executor.test_georouter import SITES, T0, geo_plan

    monkeypatch.setenv("GREENCTL_STATE_DIR", str(tmp_path / "run"))
    store = open_store(tmp_path / "router.db")
    try:
        plan = geo_plan(store, tmp_path)
        # sites that do not answer: the router starts and drains them
        sites = {s: f"http://127.0.0.1:{9 + i}" for i, s in enumerate(SITES)}
        applied = apply_geo(plan, store=store, sites=sites, at=T0, health_interval_s=0.25)
        assert applied["router_url"]
        monkeypatch.setattr(ray_backend, "down_ray", lambda **_: ["greenctl-router"])
        doc = backends.down(store, backend="ray")
        assert doc["backend"] == "ray" and doc["deleted"] == ["greenctl-router"]
        assert len(doc["stopped"]) >= 1  # the router (and its supervisor)
        assert stop_routers(store) == []  # nothing left to stop
    finally:
        stop_routers(store)
        store.close()
