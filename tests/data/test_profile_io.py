from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data.errors import FileFormatError
from greenctl.data.profile_io import export_profiles, import_profiles, profile_rows
from greenctl.data.store import open_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

GOOD = """variant,model,resource,batch,throughput_rps,latency_ms,accuracy,power_w,energy_j,cost_per_hour
resnet18,resnet,cpu:4,1,30.5,33.1,0.69758,45,1.5,0.2
resnet18,resnet,cpu:8,2,55,36,0.69758,,,
resnet50,resnet,mig:1g.10gb,4,120,30,0.7613,80,0.6,1.1
"""


def write(tmp_path: Path, text: str, name: str = "p.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_import_good_csv(store, tmp_path):
    result = import_profiles(store, write(tmp_path, GOOD))
    assert result.profiles == 3
    assert sorted(result.variants_created) == ["resnet18", "resnet50"]
    v = store.get_variant("resnet50")
    assert v.family == "resnet" and v.accuracy == pytest.approx(0.7613)
    profiles = store.latest_profiles(variant="resnet18")
    assert [(p.resource, p.batch, p.latency_p50_ms) for p in profiles] == [
        ("cpu:4", 1, 33.1),
        ("cpu:8", 2, 36.0),
    ]
    assert profiles[0].energy_method == "imported"


def test_isolated_latencies_import_and_export(store, tmp_path):
    text = (
        "variant,model,resource,batch,throughput_rps,latency_p50_ms,isolated_p50_ms,isolated_p95_ms\n"
        "v,m,cpu:1,1,480,2.0,3.6,4.0\n"
    )
    import_profiles(store, write(tmp_path, text))
    (p,) = store.latest_profiles(variant="v")
    assert (p.isolated_p50_ms, p.isolated_p95_ms, p.isolated_p99_ms) == (3.6, 4.0, None)
    (row,) = profile_rows(store, variant="v")
    assert row["isolated_p50_ms"] == 3.6 and "isolated_p99_ms" in row


def test_capacity_rows_differing_only_in_slo_are_kept(store, tmp_path):
    text = (
        "variant,model,resource,batch,throughput_rps,latency_p99_ms,capacity_rps,capacity_slo_ms\n"
        "r18,resnet,cpu:2,1,20,90,12,500\n"
        "r18,resnet,cpu:2,1,20,90,15,750\n"
    )
    import_profiles(store, write(tmp_path, text))
    latest = store.latest_profiles(variant="r18")
    assert sorted(p.capacity_slo_ms for p in latest) == [500, 750]


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        (
            "variant,model,batch,throughput_rps,latency_ms\nv,m,1,2,3\n",
            1,
            "resource",
            "missing required column",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms\nv,m,cpu:1,1,fast,3\n",
            2,
            "throughput_rps",
            "not a number",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms\nv,m,cpu:1,1,2,3\nv,m,cpu:1,-2,2,3\n",
            3,
            "batch",
            "negative",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms\nv,m,tpu,1,2,3\n",
            2,
            "resource",
            "unknown resource label",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms\nv,m,cpu:1,1.5,2,3\n",
            2,
            "batch",
            "whole number",
        ),
        (
            "variant,model,resource,batch,throughput_rps\nv,m,cpu:1,1,2\n",
            1,
            None,
            "no latency column",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms,capacity_rps\nv,m,cpu:1,1,2,3,4\n",
            2,
            "capacity_slo_ms",
            "pair",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms,accuracy\nv,m,cpu:1,1,2,3,76.1\n",
            2,
            "accuracy",
            "above 1",
        ),
        (
            "variant,resource,batch,throughput_rps,latency_ms\nv,cpu:1,1,2,3\n",
            2,
            "model",
            "names no model family",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms,isolated_p95_ms\nv,m,cpu:1,1,2,3,0\n",
            2,
            "isolated_p95_ms",
            "must be > 0",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms,colour\nv,m,cpu:1,1,2,3,red\n",
            1,
            None,
            "unknown column 'colour'",
        ),
        (
            "variant,model,resource,batch,throughput_rps,latency_ms,accuracy\nv,m,cpu:1,1,2,3,0.5\nv,m,cpu:2,1,2,3,0.6\n",
            3,
            "accuracy",
            "line 2",
        ),
    ],
)
def test_malformed_files_fail_whole_import_and_store_untouched(
    store, tmp_path, text, line, column, fragment
):
    import_profiles(store, write(tmp_path, GOOD, "good.csv"))
    before = (store.profile_count(), [v.name for v in store.variants()])
    path = write(tmp_path, text)
    with pytest.raises(FileFormatError) as info:
        import_profiles(store, path)
    err = info.value
    assert str(path) in str(err)
    assert fragment in str(err)
    assert err.line == line
    if column:
        assert err.column == column
    assert (store.profile_count(), [v.name for v in store.variants()]) == before


def test_cli_import_error_exit_code_and_message(cli, tmp_path, db_path):
    path = write(
        tmp_path, "variant,model,resource,batch,throughput_rps,latency_ms\nv,m,cpu:1,x,2,3\n"
    )
    result = cli("profile", "import", str(path))
    assert result.exit_code == 2
    assert "line 2" in result.output and "'batch'" in result.output
    with open_store(db_path) as s:
        assert s.profile_count() == 0


def test_cli_import_export_round_trip(cli, tmp_path):
    src = write(tmp_path, GOOD)
    assert cli("profile", "import", str(src)).exit_code == 0
    out = tmp_path / "out.json"
    assert cli("profile", "export", "--format", "json", "-o", str(out)).exit_code == 0
    rows = json.loads(out.read_text())
    assert {r["variant"] for r in rows} == {"resnet18", "resnet50"}
    listed = cli("profile", "list", "--json")
    assert len(json.loads(listed.stdout)) == 3


_names = st.sampled_from(["alpha", "beta-1", "gamma_2", "d.3"])
_resources = st.sampled_from(
    ["cpu:1", "cpu:4", "gpu:H100", "mig:1g.10gb", "mig:3g.40gb", "mps:40", "tpu:v5e"]
)
_pos = st.floats(min_value=1e-3, max_value=1e5, allow_nan=False, allow_infinity=False)
_opt = st.none() | _pos


@st.composite
def profile_sets(draw):
    n = draw(st.integers(1, 6))
    rows, seen = [], set()
    accuracies = {
        name: draw(st.none() | st.floats(0, 1)) for name in ["alpha", "beta-1", "gamma_2", "d.3"]
    }
    for _ in range(n):
        key = (draw(_names), draw(_resources), draw(st.integers(1, 64)))
        if key in seen:
            continue
        seen.add(key)
        lat = sorted(draw(st.lists(_pos, min_size=3, max_size=3)))
        cap = draw(st.none() | st.tuples(_pos, _pos))
        rows.append(
            {
                "model": "fam",
                "variant": key[0],
                "resource": key[1],
                "batch": key[2],
                "hardware": draw(
                    st.none() | st.sampled_from(["NVIDIA H100 80GB HBM3", "Xeon, 8 cores"])
                ),
                "throughput_rps": draw(_pos),
                "latency_p50_ms": lat[0],
                "latency_p95_ms": draw(st.none() | st.just(lat[1])),
                "latency_p99_ms": lat[2],
                "power_w": draw(_opt),
                "energy_j": draw(_opt),
                "memory_mb": draw(_opt),
                "accuracy": accuracies[key[0]],
                "cost_per_hour": draw(_opt),
                "capacity_rps": cap[0] if cap else None,
                "capacity_slo_ms": cap[1] if cap else None,
                "created_at": "2026-11-22T10:00:00Z",
            }
        )
    return rows


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=profile_sets(), fmt=st.sampled_from(["csv", "json"]))
def test_export_import_round_trip(tmp_path_factory, rows, fmt):
    tmp = tmp_path_factory.mktemp("rt")
    src = tmp / f"src.{fmt}"
    src.write_text(json.dumps(rows) if fmt == "json" else export_profiles(rows, fmt="csv"))
    with open_store(tmp / "a.db") as a:
        import_profiles(a, src)
        first = profile_rows(a)
        dumped = tmp / f"dump.{fmt}"
        dumped.write_text(export_profiles(first, fmt=fmt))
    with open_store(tmp / "b.db") as b:
        import_profiles(b, dumped)
        second = profile_rows(b)
    assert second == first
    assert len(first) == len(rows)
    by_key = {(r["variant"], r["resource"], r["batch"]): r for r in first}
    for r in rows:
        got = by_key[(r["variant"], r["resource"], r["batch"])]
        for col in (
            "throughput_rps",
            "latency_p50_ms",
            "latency_p99_ms",
            "energy_j",
            "capacity_rps",
            "hardware",
        ):
            assert got[col] == r[col]
