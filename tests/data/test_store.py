from __future__ import annotations

import sqlite3

import pytest
from greenctl.data.errors import NotFoundError, StoreError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant
from greenctl.data.store import open_store


def test_migrated_schema(store):
    tables = set(store.db.table_names())
    assert {"migrations", "hardware", "variants", "profiles", "plans", "runs"} <= tables
    assert store.applied_migrations()[0] == "0001_core"
    cols = {c.name for c in store.db["profiles"].columns}
    for col in (
        "variant",
        "resource",
        "batch",
        "latency_p50_ms",
        "latency_p95_ms",
        "latency_p99_ms",
        "throughput_rps",
        "power_w",
        "energy_j",
        "energy_method",
        "memory_mb",
        "samples",
        "duration_s",
        "created_at",
        "torch_version",
        "capacity_rps",
        "capacity_slo_ms",
    ):
        assert col in cols
    assert store.db.execute("pragma journal_mode").fetchone()[0] == "wal"


def test_reopen_runs_no_migration_twice(db_path):
    s1 = open_store(db_path)
    first = s1.applied_migrations()
    s1.close()
    s2 = open_store(db_path)
    assert s2.applied_migrations() == first
    s2.close()


def test_unknown_migration_is_refused(db_path):
    open_store(db_path).close()
    conn = sqlite3.connect(db_path)
    conn.execute("insert into migrations values ('9999_future', 'x')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="9999_future"):
        open_store(db_path)


def test_latest_profile_wins_and_history_is_kept(store):
    store.upsert_variant(Variant(name="v1", family="fam", accuracy=0.5))
    store.add_profiles(
        [Profile("v1", "cpu:1", 1, 10.0, latency_p50_ms=100, created_at="2026-01-01T00:00:00Z")]
    )
    store.add_profiles(
        [Profile("v1", "cpu:1", 1, 12.0, latency_p50_ms=80, created_at="2026-01-02T00:00:00Z")]
    )
    latest = store.latest_profiles(family="fam")
    assert [p.latency_p50_ms for p in latest] == [80]
    assert store.profile_count() == 2


def test_transaction_rolls_back_everything(store):
    store.upsert_variant(Variant(name="v1", family="fam"))
    with pytest.raises(RuntimeError), store.transaction():
        store.add_profiles([Profile("v1", "cpu:1", 1, 10.0, latency_p50_ms=1)])
        raise RuntimeError("boom")
    assert store.profile_count() == 0


def test_plan_round_trip(store):
    plan = Plan(
        kind="mix",
        request={"rate_rps": 10},
        deployments=[Deployment("m", "v", "cpu:2", 2, 1, 5.0)],
        predicted={"objective": 0.5},
    )
    pid = store.save_plan(plan)
    again = store.get_plan(pid)
    assert again.to_dict() == plan.to_dict()
    with pytest.raises(NotFoundError):
        store.get_plan(pid + 100)


def test_a_new_store_is_private_whatever_the_umask(tmp_path):
    """The store holds the executors' restart command lines: 0600 from its creation, not only
    once apply tightens the state folder (a store only profiled into was 0644 under umask 022
    and 0666 under umask 000)."""
    import os
    import stat

    old = os.umask(0)
    try:
        path = tmp_path / "g.db"
        with open_store(path) as store:
            store.upsert_variant(Variant(name="v", family="f"))
    finally:
        os.umask(old)
    for p in tmp_path.iterdir():
        if p.name.startswith("g.db"):
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
