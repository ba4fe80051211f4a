"""Which stored row represents a measurement point: real > mps-emulated > synthetic, newest
within a rank (data.records.source_rank), wherever a point's row is chosen; and the
provenance rule `mig synth` writes under (data.provenance.store_synthetic)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from greenctl.data.errors import InputError
from greenctl.data.mig_geometry import resolve_gpu
from greenctl.data.provenance import SYNTHETIC_DATASET, check_import_merge, store_synthetic
from greenctl.data.records import (
    ESTIMATE_SOURCES,
    PROFILE_SOURCES,
    Profile,
    Variant,
    point_preference,
    source_rank,
)
from greenctl.planner.core.synthetic import synthetic_family
from greenctl.planner.mig.problem import build_problem

HW = "NVIDIA H200"
T1, T2, T3 = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"


def row(source: str, created_at: str, p50: float) -> Profile:
    return Profile(
        "v", "mig:1g.18gb", 1, 1000.0 / p50, latency_p50_ms=p50, hardware=HW, power_w=100.0,
        idle_power_w=40.0, source=source, created_at=created_at,
    )  # fmt: skip


def test_the_rank_follows_estimate_sources():
    assert [source_rank(s) for s in ("measured", "imported", None)] == [0, 0, 0]
    assert [source_rank(s) for s in ESTIMATE_SOURCES] == [1, 2]
    assert source_rank("mps-emulated") < source_rank("synthetic")
    assert set(PROFILE_SOURCES) == {"measured", "imported", *ESTIMATE_SOURCES}


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        # a synthetic demo after a real measurement does not replace it
        ([("measured", T1, 10.0), ("synthetic", T2, 99.0)], ("measured", 10.0)),
        ([("imported", T1, 11.0), ("synthetic", T2, 99.0)], ("imported", 11.0)),
        # an emulated run after a real MIG measurement does not shadow it ...
        ([("measured", T1, 10.0), ("mps-emulated", T2, 50.0)], ("measured", 10.0)),
        # ... and a real measurement after an emulated one replaces it
        ([("mps-emulated", T1, 50.0), ("measured", T2, 10.0)], ("measured", 10.0)),
        ([("mps-emulated", T1, 50.0), ("synthetic", T2, 99.0)], ("mps-emulated", 50.0)),
        ([("synthetic", T1, 99.0), ("mps-emulated", T2, 50.0)], ("mps-emulated", 50.0)),
        # newest within a rank
        ([("measured", T1, 10.0), ("measured", T2, 12.0), ("synthetic", T3, 9.0)],
         ("measured", 12.0)),
        ([("mps-emulated", T1, 50.0), ("mps-emulated", T2, 40.0)], ("mps-emulated", 40.0)),
        ([("measured", T2, 10.0), ("imported", T1, 11.0)], ("measured", 10.0)),
    ],
)  # fmt: skip
def test_latest_profiles_ranks_sources_before_time(store, stored, expected):
    store.upsert_variant(Variant("v", "fam", accuracy=0.7))
    store.add_profiles([row(s, t, p50) for s, t, p50 in stored])
    (chosen,) = store.latest_profiles(family="fam")
    assert (chosen.source, chosen.latency_p50_ms) == expected
    history = store.profile_history(family="fam")
    assert len(history) == len(stored) and history[0].id == chosen.id
    assert max(history, key=point_preference).id == chosen.id


def test_points_stay_apart_and_history_keeps_each_point_together(store):
    store.upsert_variant(Variant("v", "fam", accuracy=0.7))
    store.add_profiles(
        [
            row("measured", T1, 10.0),
            row("synthetic", T2, 99.0),
            replace(row("synthetic", T2, 98.0), hardware="NVIDIA H200 NVL"),  # another point
            replace(row("synthetic", T3, 97.0), resource="mig:2g.35gb"),
        ]
    )
    latest = {
        (p.resource, p.hardware): (p.source, p.latency_p50_ms) for p in store.latest_profiles()
    }
    assert latest == {
        ("mig:1g.18gb", HW): ("measured", 10.0),
        ("mig:1g.18gb", "NVIDIA H200 NVL"): ("synthetic", 98.0),
        ("mig:2g.35gb", HW): ("synthetic", 97.0),
    }
    history = [(p.resource, p.hardware, p.source) for p in store.profile_history()]
    assert history == [
        ("mig:1g.18gb", HW, "measured"),
        ("mig:1g.18gb", HW, "synthetic"),
        ("mig:1g.18gb", "NVIDIA H200 NVL", "synthetic"),
        ("mig:2g.35gb", HW, "synthetic"),
    ]


def test_re_importing_a_real_row_without_time_is_a_no_op_after_a_synthetic_one(store):
    store.upsert_variant(Variant("v", "fam", accuracy=0.7))
    real = row("imported", T1, 10.0)
    store.add_profiles([real])
    store.add_profiles([row("synthetic", T2, 99.0)])
    assert store.has_profile(replace(real, created_at=T3), same_time=False)
    assert not store.has_profile(replace(real, latency_p50_ms=11.0), same_time=False)
    # a newer real row of the point does make the older figures new again
    store.add_profiles([row("imported", T3, 12.0)])
    assert not store.has_profile(replace(real, created_at=T3), same_time=False)


def test_the_mig_problem_chooses_a_slices_row_by_the_same_rule():
    geo = resolve_gpu("H200")
    variants, synthetic = synthetic_family(geo, "efficientnet")
    b0 = [p for p in synthetic if p.variant == "efficientnet-b0"]
    measured = [
        replace(p, source="measured", energy_method="nvml-attributed", created_at=T1,
                hardware="NVIDIA H200 NVL", latency_p50_ms=2 * (p.latency_p50_ms or 0),
                latency_p95_ms=2 * (p.latency_p95_ms or 0),
                latency_p99_ms=2 * (p.latency_p99_ms or 0))
        for p in b0
    ]  # fmt: skip
    emulated = [replace(p, source="mps-emulated", created_at=T2) for p in measured]
    newer_synthetic = [replace(p, created_at=T3) for p in b0]
    for rows, source in (
        (measured + newer_synthetic, "measured"),
        (newer_synthetic + emulated + measured, "measured"),
        (emulated + newer_synthetic, "mps-emulated"),
    ):
        prob = build_problem(
            geo, rows, variants, family="efficientnet", gpus=1, rate_rps=10.0,
            carbon_intensity=100.0,
        )  # fmt: skip
        assert {o.source for o in prob.options} == {source}
        assert len(prob.options) == len({o.profile for o in prob.options})


# -- mig synth's provenance rule ------------------------------------------------------------
def _builtins(store):
    from greenctl.profiler.models import builtin_variants

    with store.transaction():
        for v in builtin_variants("efficientnet"):
            store.upsert_variant(v)
    return {v.name: v for v in store.variants("efficientnet")}


def _synth(store, *, merge=False, prefix=None, gpu="H200"):
    variants, profiles = synthetic_family(resolve_gpu(gpu), "efficientnet", prefix=prefix)
    return store_synthetic(
        store, variants, profiles, what="mig synth", hint="use --prefix or --merge", merge=merge
    )


def test_synthetic_rows_are_a_data_set_of_their_own(store):
    records = _builtins(store)
    b0 = records["efficientnet-b0"]
    store.add_profiles([replace(row("measured", T1, 10.0), variant=b0.name)])
    with pytest.raises(InputError) as exc:
        _synth(store)
    assert "efficientnet-b0" in str(exc.value) and SYNTHETIC_DATASET in str(exc.value)
    assert store.profile_count() == 1
    assert {v.name: v for v in store.variants("efficientnet")} == records
    merges, kept = _synth(store, merge=True)
    assert merges and sorted(kept) == sorted(records)
    assert {v.name: v for v in store.variants("efficientnet")} == records  # untouched
    (p,) = store.latest_profiles(variant=b0.name, resource="mig:1g.18gb", hardware=HW)
    assert p.source == "measured"


def test_builtin_records_without_profiles_are_not_rewritten_either(store):
    records = _builtins(store)
    with pytest.raises(InputError, match=r"efficientnet-b0 \(builtin\)"):
        _synth(store)
    assert store.profile_count() == 0
    _synth(store, merge=True)
    assert {v.name: v for v in store.variants("efficientnet")} == records


def test_synthetic_into_a_synthetic_family_needs_no_flag(store):
    assert _synth(store) == ([], [])
    assert _synth(store, gpu="H100-80GB") == ([], [])  # one data set, whichever GPU
    assert {v.source for v in store.variants("efficientnet")} == {"synthetic"}
    # file imports name data sets by hardware label: an export of these rows re-imports ...
    incoming = [("efficientnet-b0", "efficientnet", HW)]
    assert check_import_merge(store, incoming, what="import", hint="h") == []
    # ... while to a writer that keeps synthetic rows apart, rows of that GPU are another set
    with pytest.raises(InputError, match="synthetic"):
        check_import_merge(store, incoming, what="import", hint="h", synthetic_apart=True)


def test_a_prefix_writes_beside_the_real_family(store):
    records = _builtins(store)
    store.add_profiles([replace(row("measured", T1, 10.0), variant="efficientnet-b0")])
    assert _synth(store, prefix="synthetic") == ([], [])
    assert {v.name: v for v in store.variants("efficientnet")} == records
    names = [v.name for v in store.variants("synthetic-efficientnet")]
    assert names[0] == "synthetic-efficientnet-b0" and len(names) == 8
    with pytest.raises(InputError, match="not a name"):
        _synth(store, prefix="9 bad")
