"""gpulet reference importer: round trip into the store, re-import, bad files."""

from __future__ import annotations

from pathlib import Path

import pytest
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


def _gpulet_dir(reference: Path) -> Path:
    return reference / "gpulet" / "data"


def test_import_reference_round_trip(store, reference):
    summary = import_gpulet(store, _gpulet_dir(reference))
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
