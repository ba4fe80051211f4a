"""The registry of bundled data sets: every name resolves to installed data; bad names refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from greenctl.data import bundled, carbon_io
from greenctl.data.errors import InputError
from greenctl.data.gpulet_import import read_gpulet_dir
from greenctl.data.traces import read_rps_trace

# Names other parts of greenctl (tests, docs, the README tour) rely on.
CONTRACT = (
    "gpulet", "twitter", "infadapter", "eglb", "clover-mig-partitions", "clover-accuracy",
    "clover-ciso-march", "clover-ciso-sep", "clover-eso-march", "eglb-texas", "eglb-germany",
)  # fmt: skip


@pytest.mark.parametrize("name", list(bundled.DATASETS))
def test_every_bundled_name_resolves_to_installed_data(name: str) -> None:
    path = bundled.resolve(f"bundled:{name}")
    assert path == bundled.path_of(name)
    assert path.is_relative_to(bundled.datasets_dir())
    if path.is_dir():
        assert any(p.is_file() and p.stat().st_size > 0 for p in path.rglob("*"))
    else:
        assert path.is_file() and path.stat().st_size > 0
    assert bundled.DATASETS[name].description


def test_the_contract_names_are_registered() -> None:
    assert set(CONTRACT) <= set(bundled.DATASETS)
    assert bundled.path_of("gpulet").is_dir() and bundled.path_of("eglb").is_dir()
    assert bundled.path_of("twitter").name == "requests_per_second.txt.gz"


def test_every_bundled_copy_carries_its_attribution() -> None:
    """Third-party data ships with where it came from: a README, LICENSE or ATTRIBUTION."""
    root = bundled.datasets_dir()
    for ds in bundled.DATASETS.values():
        top = root / Path(ds.path).parts[0]
        folder = top if top.is_dir() else root
        notes = {"README.md", "LICENSE", "ATTRIBUTION.md"} & {p.name for p in folder.iterdir()}
        if folder == root:  # a loose file (clover_accuracy.json) carries its own attribution
            assert "sc23-clover" in (root / ds.path).read_text()
        else:
            assert notes, f"{folder} has no README, LICENSE or ATTRIBUTION"


def test_an_unknown_name_is_refused_listing_every_name() -> None:
    with pytest.raises(InputError) as exc:
        bundled.resolve("bundled:twiter")
    assert exc.value.exit_code == 2
    text = str(exc.value)
    assert "bundled:twiter" in text
    for name in bundled.DATASETS:
        assert f"bundled:{name}" in text


def test_a_plain_path_is_left_as_it_is(tmp_path: Path) -> None:
    assert bundled.resolve(tmp_path / "x.csv") == tmp_path / "x.csv"
    assert bundled.resolve("relative/bundled:x") == Path("relative/bundled:x")
    assert not bundled.is_bundled(Path("bundled:twitter"))  # a Path is a file name


def test_carbon_traces_come_from_the_registry() -> None:
    """carbon_io's list of traces is the registry's carbon traces, not a second list."""
    traces = {n for n, d in bundled.DATASETS.items() if d.carbon_format}
    assert set(carbon_io.BUNDLED_TRACES) == traces
    assert len(traces) == 13
    for name in traces:
        assert carbon_io.bundled_trace_path(name) == bundled.path_of(name)
    with pytest.raises(InputError, match="not a carbon trace"):
        carbon_io.bundled_trace_path("twitter")
    with pytest.raises(InputError, match="bundled:gpulet"):
        carbon_io.bundled_trace_path("nope")


def test_a_bundled_carbon_trace_is_read_with_its_own_format_and_region() -> None:
    """Clover's traces have no timestamps nor region: a bundled one needs neither flag."""
    fmt, points = carbon_io.read_carbon_file("bundled:clover-eso-march")
    assert fmt == "clover" and {p.region for p in points} == {"ESO"} and len(points) == 49
    fmt, points = carbon_io.read_carbon_file(
        bundled.path_of("eglb-germany"), region="DE"
    )  # the resolved path is recognised too; an explicit region wins
    assert fmt == "eglb" and {p.region for p in points} == {"DE"}
    assert bundled.carbon_trace_at(bundled.path_of("twitter")) is None


def test_readers_take_bundled_names() -> None:
    rps = read_rps_trace("bundled:twitter")
    assert rps.size == 1_899_061 and rps.max() == 388
    assert len(read_gpulet_dir("bundled:gpulet").solo) == 420
