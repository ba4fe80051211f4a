from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data.errors import FileFormatError, InputError
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


# -- bad input refused (issue 16) -------------------------------------------------------------
HEAD = "variant,model,resource,batch,throughput_rps,latency_ms"


def _json_row(**fields):
    row = {"variant": "v", "model": "m", "resource": "cpu:1", "batch": 1}
    row.update(throughput_rps=2, latency_ms=3)
    row.update(fields)
    return json.dumps([row])


@pytest.mark.parametrize(
    ("name", "text", "line", "column", "fragment"),
    [
        ("big.csv", f"{HEAD}\nv,m,cpu:1,99999999999999999999999,2,3\n", 2, "batch", "above 65536"),
        ("big.csv", f"{HEAD}\nv,m,cpu:1,65537,2,3\n", 2, "batch", "above 65536"),
        ("zero.csv", f"{HEAD}\nv,m,cpu:1,0,2,3\n", 2, "batch", "must be > 0"),
        ("lat.csv", f"{HEAD}\nv,m,cpu:1,1,2,1e12\n", 2, "latency_ms", "above"),
        ("inf.csv", f"{HEAD}\nv,m,cpu:1,1,2,inf\n", 2, "latency_ms", "not a finite number"),
        ("t.csv", f"{HEAD},created_at\nv,m,cpu:1,1,2,3,yesterday\n", 2, "created_at", "ISO 8601"),
        (
            "t.csv",
            f"{HEAD},created_at\nv,m,cpu:1,1,2,3,9999-01-01T00:00:00Z\n",
            2,
            "created_at",
            "in the future",
        ),
        ("nul.csv", f"{HEAD}\nv\x00x,m,cpu:1,1,2,3\n", 2, "variant", "control character (\\x00)"),
        (
            "nul.csv",
            f"{HEAD},hardware\nv,m,cpu:1,1,2,3,Xe\x07on\n",
            2,
            "hardware",
            "control character",
        ),
        ("long.csv", f"{HEAD}\nv,{'m' * 201},cpu:1,1,2,3\n", 2, "model", "201 characters long"),
        (
            "long.csv",
            f"{HEAD}\nv,m,cpu:1,1,2,3\n" + "w" * 200_000 + ",m,cpu:1,1,2,3\n",
            3,
            None,
            "field limit",
        ),
        (
            "dup.csv",
            "variant,model,resource,batch,batch,throughput_rps,latency_ms\nv,m,cpu:1,1,2,2,3\n",
            1,
            "batch",
            "appears twice",
        ),
        ("o.json", _json_row(variant={"a": 1}), 1, "variant", "not a JSON object"),
        ("l.json", _json_row(model=["m"]), 1, "model", "not a JSON list"),
        ("b.json", _json_row(hardware=True), 1, "hardware", "must be text"),
        ("n.json", _json_row(batch=[1]), 1, "batch", "not a number"),
        ("s.json", _json_row(variant="\ud800"), 1, "variant", "control character"),
        ("deep.json", "[" * 100_000 + "]" * 100_000, None, None, "nested too deeply"),
        (
            "digits.json",
            _json_row().replace('"batch": 1', '"batch": ' + "9" * 5000),
            None,
            None,
            "invalid JSON",
        ),
        (
            "conflict.csv",
            f"{HEAD}\nv,m,cpu:1,1,2,3\nv,m,cpu:2,1,2,3\nv,m,cpu:1,1,2,4\n",
            4,
            "latency_p50_ms",
            "conflicts with line 2",
        ),
        (
            "conflict.csv",
            f"{HEAD},capacity_rps,capacity_slo_ms\nv,m,cpu:1,1,2,3,5,100\nv,m,cpu:1,1,2,3,6,100\n",
            3,
            "capacity_rps",
            "conflicts with line 2",
        ),
    ],
)
def test_bad_input_is_refused_naming_line_and_field(
    store, tmp_path, name, text, line, column, fragment
):
    import_profiles(store, write(tmp_path, GOOD, "good.csv"))
    before = store.profile_count()
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    with pytest.raises(FileFormatError) as info:
        import_profiles(store, path)
    err = info.value
    assert err.exit_code == 2
    assert str(path) in str(err) and fragment in str(err)
    assert (err.line, err.column) == (line, column)
    assert len(str(err)) < 600  # long values are cut in the message
    assert store.profile_count() == before


def test_a_folder_or_missing_file_is_an_input_error(store, tmp_path):
    for path, fragment in ((tmp_path, "cannot read"), (tmp_path / "none.csv", "does not exist")):
        with pytest.raises(InputError, match=fragment) as info:
            import_profiles(store, path)
        assert info.value.exit_code == 2


def test_created_at_is_normalised_to_utc(store, tmp_path):
    text = (
        f"{HEAD},created_at\n"
        "v,m,cpu:1,1,2,3,2026-03-01T10:00:00+02:00\n"
        "v,m,cpu:2,1,2,3,2026-03-01 09:30\n"
        "v,m,cpu:4,1,2,3,2026-03-01T08:00:00.75Z\n"
    )
    import_profiles(store, write(tmp_path, text))
    got = {p.resource: p.created_at for p in store.latest_profiles()}
    assert got == {
        "cpu:1": "2026-03-01T08:00:00Z",
        "cpu:2": "2026-03-01T09:30:00Z",
        "cpu:4": "2026-03-01T08:00:00Z",
    }


def test_rows_differing_only_in_capacity_are_one_measurement(store, tmp_path):
    text = (
        f"{HEAD},capacity_rps,capacity_slo_ms\n"
        "v,m,cpu:1,1,2,3,5,100\n"
        "v,m,cpu:1,1,2,3,6,200\n"
        "v,m,cpu:1,1,2,3,6,200\n"  # a repeated row counts once
    )
    result = import_profiles(store, write(tmp_path, text))
    assert (result.rows, result.profiles, result.already_present) == (3, 2, 1)
    assert store.profile_count() == 2


def test_import_is_idempotent(store, tmp_path):
    path = write(tmp_path, GOOD)
    first = import_profiles(store, path)
    again = import_profiles(store, path)
    assert (first.profiles, first.already_present) == (3, 0)
    assert (again.profiles, again.already_present) == (0, 3)
    assert store.profile_count() == 3
    # the same figures after a newer measurement of the point are a new measurement
    newer = f"{HEAD}\nresnet18,resnet,cpu:4,1,31,33\n"
    import_profiles(store, write(tmp_path, newer, "newer.csv"))
    assert import_profiles(store, path).profiles == 1  # resnet18 cpu:4 is current again
    (p,) = store.latest_profiles(variant="resnet18", resource="cpu:4")
    assert p.throughput_rps == 30.5


def test_load_tests_at_several_slos_may_differ_in_what_they_measured(store, tmp_path):
    # InfAdapter's capacity rows (bench/infadapter_import.py): one load test per SLA, each with
    # the p99 it measured at its load
    text = (
        "variant,model,resource,batch,throughput_rps,latency_p99_ms,capacity_rps,capacity_slo_ms\n"
        "r18,resnet,cpu:1,1,22,361.99,15,500\n"
        "r18,resnet,cpu:1,1,22,389.09,19,750\n"
    )
    assert import_profiles(store, write(tmp_path, text)).profiles == 2


def test_a_repeated_row_may_add_the_variants_facts(store, tmp_path):
    text = f"{HEAD},accuracy\nv,m,cpu:1,1,2,3,\nv,m,cpu:1,1,2,3,0.7\n"
    result = import_profiles(store, write(tmp_path, text))
    assert (result.profiles, result.already_present) == (1, 1)
    assert store.get_variant("v").accuracy == 0.7
