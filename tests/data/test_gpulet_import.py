"""gpulet reference importer: round trip into the store, re-import, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.gpulet_import import (
    get_interference_model,
    import_gpulet,
    load_colocations,
    load_latency_table,
    load_solo_latency,
    load_utilisation,
    resolve_variant,
)


def _gpulet_dir() -> Path:
    return path_of("gpulet")


def test_import_reference_round_trip(store):
    summary = import_gpulet(store, _gpulet_dir())
    assert summary.profiles == 420 and summary.variants == 10
    assert summary.utilisations == 455 and summary.colocations == 3675
    assert "resnet50" in summary.models
    # vgg16,1,20,throughput,220.496,latency,0.0045352,1  (seconds -> ms)
    solo = load_solo_latency(store)
    assert solo[("vgg16", 1, 20)] == pytest.approx(4.5352)
    prof = [p for p in store.latest_profiles(variant="vgg16", resource="mps:20") if p.batch == 1]
    assert len(prof) == 1 and prof[0].throughput_rps == pytest.approx(220.496)
    assert prof[0].source == "imported" and prof[0].hardware == "gpulet-reference"
    assert store.get_variant("resnet50").family == "resnet"
    util = load_utilisation(store)
    assert util[("vgg16", 1, 20)] == pytest.approx((7.07, 7.35))  # (l2, dram)
    colo = load_colocations(store)
    assert len(colo) == 3675
    first = next(
        c
        for c in colo
        if (c.model, c.batch, c.partition) == ("vgg19", 1, 20)
        and (c.corunner_model, c.corunner_batch) == ("vgg19", 1)
    )
    assert first.latency_ms == pytest.approx(7.52) and first.corunner_partition == 80
    table = load_latency_table(store, ["resnet50"])
    assert set(table["resnet50"]) == {f"mps:{p}" for p in (20, 40, 50, 60, 80, 100)}
    assert table["resnet50"]["mps:100"][64] == pytest.approx(25.686, abs=1e-3)


def test_reimport_is_idempotent_for_tables(store, tmp_path):
    d = _write(tmp_path, GOOD, mem=MEM, inter=INTER)
    import_gpulet(store, d)
    s = import_gpulet(store, d)
    assert s.variants == 0 and s.utilisations == 2 and s.colocations == 1
    assert store.db.table("utilisations").count == 2
    assert store.db.table("colocations").count == 1
    assert len(store.latest_profiles(variant="m1")) == 2  # newest of each point
    assert store.profile_count() == 4  # the history is kept


def _write(tmp: Path, inference: str, mem: str | None = None, inter: str | None = None) -> Path:
    d = tmp / "gp"
    d.mkdir(exist_ok=True)
    (d / "inference.csv").write_text(inference)
    if mem is not None:
        (d / "mem_util.csv").write_text(mem)
    if inter is not None:
        (d / "interference.csv").write_text(inter)
    return d


GOOD = "m1,1,50,throughput,100.0,latency,0.01,1\nm1,2,50,throughput,150.0,latency,0.0133,1\n"
MEM = "m1,1,50,mem_util,10,l2_util,12,0\nm1,2,50,mem_util,15,l2_util,17,0\n"
INTER = "m1,1,50,m1,2,throughput,80,latency,0.0125,1\nm1,2,50,m1,1,throughput,80,latency,0.03,0\n"


def test_small_dir_and_missing_optional_files(store, tmp_path):
    d = _write(tmp_path, GOOD)
    s = import_gpulet(store, d)
    assert s.profiles == 2 and s.utilisations == 0 and s.colocations == 0
    assert load_solo_latency(store)[("m1", 2, 50)] == pytest.approx(13.3)


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        ("m1,1,50,throughput,100,latency,0.01\n", 1, None, "expected 8"),
        (GOOD + "m1,x,50,throughput,100,latency,0.01,1\n", 3, "batch", "whole number"),
        ("m1,1,50,throughput,100,latency,-1,1\n", 1, "latency", "positive"),
        ("m1,1,50,thruput,100,latency,0.01,1\n", 1, "label1", "throughput"),
        ("m1,1,150,throughput,100,latency,0.01,1\n", 1, "partition", "between 1 and 100"),
    ],
)
def test_bad_inference_rows_name_line_and_column(store, tmp_path, text, line, column, words):
    d = _write(tmp_path, text)
    with pytest.raises(FileFormatError) as exc:
        import_gpulet(store, d)
    assert exc.value.line == line and exc.value.column == column
    assert words in str(exc.value) and "inference.csv" in str(exc.value)
    assert store.profile_count() == 0


def test_bad_optional_file_leaves_store_untouched(store, tmp_path):
    d = _write(tmp_path, GOOD, mem="m1,1,50,mem_util,7,l2_util,170,0\n")
    with pytest.raises(FileFormatError, match="above 100"):
        import_gpulet(store, d)
    assert store.profile_count() == 0 and store.variants() == []


def test_missing_folder_or_inference(store, tmp_path):
    with pytest.raises(InputError, match="not a folder"):
        import_gpulet(store, tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"inference\.csv does not exist"):
        import_gpulet(store, tmp_path / "empty")


def test_resolve_variant_and_missing_interference_model(store, tmp_path):
    import_gpulet(store, _write(tmp_path, GOOD))
    assert resolve_variant(store, "m1") == "m1"
    assert resolve_variant(store, "m") == "m1"  # a family with one variant
    with pytest.raises(InputError, match="unknown model 'zzz'"):
        resolve_variant(store, "zzz")
    with pytest.raises(InputError, match="no interference model"):
        get_interference_model(store)


def test_cli_import(cli, tmp_path):
    d = _write(tmp_path, GOOD, mem=MEM, inter=INTER)
    r = cli("gpulet", "import", str(d), "--json")
    assert r.exit_code == 0, r.output
    assert '"profiles": 2' in r.stdout and '"skipped_invalid": 1' in r.stdout
    r = cli("gpulet", "import", str(d))
    assert r.exit_code == 0 and "Gpulet" in r.output
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "inference.csv").write_text("oops\n")
    r = cli("gpulet", "import", str(bad))
    assert r.exit_code == 2 and "line 1" in r.output


def _snapshot(store) -> list[str]:
    return list(store.db.conn.iterdump())


def _cpu_family(store, family: str = "m", variant: str = "m1") -> None:
    """Another data set's family: a CPU profile (with energy) under hardware 'cpu-ds'."""
    from greenctl.data.records import Profile, Variant

    store.upsert_variant(Variant(variant, family, accuracy=0.7, source="imported"))
    store.add_profiles(
        [Profile(variant, "cpu:1", 1, 10.0, latency_p50_ms=100.0, energy_j=1.0, hardware="cpu-ds")]
    )


def test_import_into_another_data_sets_variant_is_refused(store, tmp_path):
    _cpu_family(store)
    before = _snapshot(store)
    d = _write(tmp_path, GOOD, mem=MEM, inter=INTER)
    with pytest.raises(InputError) as e:
        import_gpulet(store, d)
    msg = str(e.value)
    assert e.value.exit_code == 2
    assert "variant 'm1' (family 'm') holds profiles of data set cpu-ds" in msg
    assert "adds gpulet-reference" in msg and "--prefix" in msg and "--merge" in msg
    assert _snapshot(store) == before  # nothing written


def test_import_into_another_data_sets_family_is_refused(store, tmp_path):
    _cpu_family(store, variant="m7")  # gpulet's m1 would join family m beside m7
    before = _snapshot(store)
    with pytest.raises(InputError, match=r"family 'm' holds profiles of data set cpu-ds \(m7\)"):
        import_gpulet(store, _write(tmp_path, GOOD))
    assert _snapshot(store) == before


def test_prefix_imports_beside_the_other_data_set(store, tmp_path):
    _cpu_family(store)
    s = import_gpulet(store, _write(tmp_path, GOOD, mem=MEM, inter=INTER), prefix="gpulet")
    assert s.models == ["gpulet-m1"] and s.variants == 1 and s.merged == []
    assert store.get_variant("gpulet-m1").family == "gpulet-m"
    assert {p.hardware for p in store.latest_profiles(family="m")} == {"cpu-ds"}
    assert load_solo_latency(store)[("gpulet-m1", 1, 50)] == pytest.approx(10.0)
    assert ("gpulet-m1", 1, 50) in load_utilisation(store)
    colo = load_colocations(store)
    assert [(c.model, c.corunner_model) for c in colo] == [("gpulet-m1", "gpulet-m1")]
    # the same data set again is no merge
    assert import_gpulet(store, _write(tmp_path, GOOD), prefix="gpulet").merged == []
    with pytest.raises(InputError, match="--prefix '9x' is not a name"):
        import_gpulet(store, _write(tmp_path, GOOD), prefix="9x")


def test_merge_on_purpose(store, tmp_path):
    _cpu_family(store)
    s = import_gpulet(store, _write(tmp_path, GOOD), merge=True)
    assert s.merged and "variant 'm1'" in s.merged[0]
    assert {p.hardware for p in store.latest_profiles(variant="m1")} == {
        "cpu-ds",
        "gpulet-reference",
    }


def test_cli_refuses_a_merge_with_exit_2(cli, store, tmp_path):
    _cpu_family(store)
    d = _write(tmp_path, GOOD)
    r = cli("gpulet", "import", str(d))
    assert r.exit_code == 2, r.output
    assert "never merges data sets silently" in r.output and "--prefix gpulet" in r.output
    r = cli("gpulet", "import", str(d), "--prefix", "gpulet", "--json")
    assert r.exit_code == 0, r.output
    assert '"gpulet-m1"' in r.stdout
    r = cli("gpulet", "import", str(d), "--merge", "--json")
    assert r.exit_code == 0, r.output
    assert "merged on purpose" in r.stderr


def test_cpu_resnet_family_then_gpulet_reference_is_refused(cli, store):
    """Issue 16 item 10: gpulet's GPU resnet50/101/152 must not join a CPU `resnet` family
    of another data set (InfAdapter's) silently: plan mix would drop its carbon term."""
    from greenctl.data.records import Profile, Variant

    for name, acc, ms in (("resnet18", 0.70, 40.0), ("resnet50", 0.76, 90.0)):
        store.upsert_variant(Variant(name, "resnet", accuracy=acc, source="imported"))
        store.add_profiles(
            Profile(name, f"cpu:{c}", 1, 1000.0 / ms * c, latency_p50_ms=ms / c,
                    latency_p99_ms=1.5 * ms / c, power_w=10.0 * c, cost_per_hour=0.04 * c,
                    hardware="infadapter-cpu")
            for c in (1, 2, 4)
        )  # fmt: skip
    plan = ["plan", "mix", "--model", "resnet", "--rate", "20", "--slo-ms", "500", "--json"]
    before = cli(*plan)
    assert before.exit_code == 0 and "CC (carbon) term dropped" not in before.output
    r = cli("gpulet", "import", "bundled:gpulet")
    assert r.exit_code == 2 and "variant 'resnet50' (family 'resnet')" in r.output
    assert {p.hardware for p in store.latest_profiles(family="resnet")} == {"infadapter-cpu"}
    r = cli("gpulet", "import", "bundled:gpulet", "--prefix", "gpulet")
    assert r.exit_code == 0, r.output
    assert store.get_variant("gpulet-resnet50").family == "gpulet-resnet"
    after = cli(*plan)
    assert after.exit_code == 0 and "CC (carbon) term dropped" not in after.output
