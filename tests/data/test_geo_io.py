"""Geo CSV readers: validation errors name file, line and reason; the eGLB converter."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.eglb_convert import EGLB_SITES, bundled_eglb_dir, convert_eglb
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.geo_io import load_geo_problem, problem_to_csv, write_allocations

SITES_HEADER = "time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw"


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    sites = write(
        tmp_path / "sites.csv",
        [
            SITES_HEADER + ",ewif_l_per_kwh,pue",
            "2024-01-01T00:00:00Z,a,50,400,2.0,1.0,1.5,1.2",
            "2024-01-01T00:00:00Z,b,80,100,1.0,1.0,,",
            "2024-01-01T01:00:00Z,a,-5,380,2.1,1.0,1.5,1.2",
            "2024-01-01T01:00:00Z,b,90,120,1.1,0.5,,",
        ],
    )
    demand = write(
        tmp_path / "demand.csv",
        [
            "time,gateway,load_mw",
            "2024-01-01T00:00:00Z,a,0.4",
            "2024-01-01T00:00:00Z,b,0.3",
            "2024-01-01T01:00:00+00:00,a,0.5",
        ],
    )
    routes = write(tmp_path / "routes.csv", ["gateway,site,latency_ms", "a,a,5", "a,b,20", "b,b,"])
    return {"sites": sites, "demand": demand, "routes": routes}


def test_reads_a_valid_problem(files: dict[str, Path]) -> None:
    p = load_geo_problem(files["sites"], files["demand"], files["routes"])
    assert p.sites == ["a", "b"] and p.gateways == ["a", "b"]
    assert p.step_h == 1.0 and p.n_steps == 2
    assert p.price_usd_per_mwh[1, 0] == -5  # negative market prices are allowed
    assert p.pue[0, 1] == 1.0 and p.ewif_l_per_kwh[0, 1] == 0.0  # defaults
    assert p.load_mw[1].tolist() == [0.5, 0.0]  # missing row = no load
    assert p.routes is not None and p.routes.tolist() == [[True, True], [False, True]]
    assert p.latency_ms is not None and np.isnan(p.latency_ms[1, 1])
    # per-MW coefficients: water = 1000 h (wue + pue ewif); carbon = h pue g/kWh (kg/MWh)
    assert p.water_l_per_mw[0, 0] == pytest.approx(1000 * (2.0 + 1.2 * 1.5))
    assert p.carbon_kg_per_mw[0, 0] == pytest.approx(1.2 * 400)
    assert p.cost_usd_per_mw[0, 1] == pytest.approx(80)


def test_round_trip(files: dict[str, Path], tmp_path: Path) -> None:
    p = load_geo_problem(files["sites"], files["demand"], files["routes"])
    out = problem_to_csv(p, tmp_path / "rt")
    q = load_geo_problem(out["sites"], out["demand"], out["routes"])
    for name in ("price_usd_per_mwh", "carbon_g_per_kwh", "pue", "capacity_mw", "load_mw"):
        np.testing.assert_array_equal(getattr(p, name), getattr(q, name))
    assert q.routes is not None and (q.routes == p.routes).all()


def _edit(path: Path, line: int, text: str | None) -> None:
    lines = path.read_text().splitlines()
    if text is None:
        del lines[line - 1]
    else:
        lines[line - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("which", "line", "text", "match"),
    [
        (
            "sites",
            1,
            "time,site,price_usd_per_mwh,carbon_g_per_kwh,capacity_mw",
            r"line 1: .*'wue_l_per_kwh'",
        ),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,-100,1.0,1.0,,",
            r"line 3, column 'carbon_g_per_kwh'.*negative",
        ),
        ("sites", 3, "2024-01-01T00:00:00Z,b,80,abc,1.0,1.0,,", r"line 3, .*'abc' is not a number"),
        ("sites", 3, "2024-01-01T00:00:00Z,b,80,100,1.0,nan,,", r"line 3, .*not a finite"),
        ("sites", 3, "2024-01-01T00:00:00Z,b,80,100,1.0,1.0,,0.8", r"line 3, column 'pue'"),
        ("sites", 3, "yesterday,b,80,100,1.0,1.0,,", r"line 3, column 'time'.*ISO 8601"),
        ("sites", 3, "2024-01-01T00:00:00Z,a,80,100,1.0,1.0,,", r"line 3: .*second row.*line 2"),
        ("sites", 5, None, r"site 'b' has no row for time 2024-01-01T01:00:00Z"),
        ("sites", 3, "2024-01-01T00:00:00Z,b,80,100,1.0", r"line 3: 5 fields, the header has 8"),
        (
            "demand",
            4,
            "2024-01-01T05:00:00Z,a,0.5",
            r"demand.csv, line 4, column 'time'.*not a time",
        ),
        ("demand", 3, "2024-01-01T00:00:00Z,b,-0.3", r"demand.csv, line 3, column 'load_mw'"),
        (
            "demand",
            3,
            "2024-01-01T00:00:00Z,b,1.7",
            r"demand.csv, line 2: at time 2024-01-01T00:00:00Z.*exceeds",
        ),
        ("routes", 3, "a,c,20", r"routes.csv, line 3, column 'site': unknown site 'c'"),
        ("routes", 4, "x,b,", r"routes.csv, line 4, column 'gateway': unknown gateway 'x'"),
        ("routes", 4, None, r"routes.csv: gateway 'b' .* has no allowed site"),
        ("routes", 3, "a,a,1", r"routes.csv, line 3: route a -> a listed twice"),
    ],
)
def test_validation_errors(
    files: dict[str, Path], which: str, line: int, text: str | None, match: str
) -> None:
    _edit(files[which], line, text)
    with pytest.raises(FileFormatError, match=match) as err:
        load_geo_problem(files["sites"], files["demand"], files["routes"])
    assert err.value.exit_code == 2
    assert Path(err.value.path).name == f"{which}.csv"


def test_uneven_steps(tmp_path: Path) -> None:
    sites = write(
        tmp_path / "s.csv",
        [
            SITES_HEADER,
            "2024-01-01T00:00:00Z,a,1,1,1,1",
            "2024-01-01T01:00:00Z,a,1,1,1,1",
            "2024-01-01T03:00:00Z,a,1,1,1,1",
        ],
    )
    demand = write(tmp_path / "d.csv", ["time,gateway,load_mw", "2024-01-01T00:00:00Z,a,1"])
    with pytest.raises(FileFormatError, match=r"line 4, column 'time': uneven time steps"):
        load_geo_problem(sites, demand)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_geo_problem(tmp_path / "nope.csv", tmp_path / "d.csv")
    empty = write(tmp_path / "e.csv", [])
    empty.write_text("")
    with pytest.raises(FileFormatError, match="empty"):
        load_geo_problem(empty, empty)


def test_write_allocations(tmp_path: Path) -> None:
    n = write_allocations(tmp_path / "a.csv", [("t0", "g", "s", 0.25)])
    rows = list(csv.reader((tmp_path / "a.csv").open()))
    assert n == 1 and rows == [["time", "gateway", "site", "load_mw"], ["t0", "g", "s", "0.25"]]


def test_convert_bundled_eglb(tmp_path: Path) -> None:
    paths = convert_eglb(None, tmp_path, steps=48, routes="partial")
    p = load_geo_problem(paths["sites"], paths["demand"], paths["routes"])
    assert p.sites == list(EGLB_SITES) and p.gateways == list(EGLB_SITES)
    assert p.n_steps == 48 and p.step_h == 1.0 and p.times[0] == "2022-09-22T00:00:00Z"
    assert (p.capacity_mw == 1.0).all()
    # Texas, 2022-09-22 00: 0.4494737760460783 kg/kWh, 38.35 USD/MWh, WUE 6.100516801435519
    assert p.carbon_g_per_kwh[0, 0] == pytest.approx(449.4737760460783)
    assert p.price_usd_per_mwh[0, 0] == 38.35
    assert p.wue_l_per_kwh[0, 0] == pytest.approx(6.100516801435519)
    # workload 2700 W at hour 0: 2700 / 2708 per gateway
    assert p.load_mw[0] == pytest.approx(np.full(10, 2700 / 2708))
    assert p.routes is not None and p.routes.sum() == 56
    assert p.routes[EGLB_SITES.index("Japan")].tolist() == [
        s in ("Nevada", "Japan", "Singapore") for s in EGLB_SITES
    ]


def test_convert_bundled_name_matches_the_default_copy(tmp_path: Path) -> None:
    a = convert_eglb("bundled:eglb", tmp_path / "named")
    b = convert_eglb(None, tmp_path / "default")
    assert a["sites"].read_text() == b["sites"].read_text()
    assert a["demand"].read_text() == b["demand"].read_text()
    p = load_geo_problem(a["sites"], a["demand"])
    assert p.n_steps == 457  # Japan & co. have 481 price rows: the first 457 are kept


def test_convert_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        convert_eglb(tmp_path, tmp_path / "out")
    with pytest.raises(InputError, match="routes"):
        convert_eglb(None, tmp_path / "out", routes="some")
    with pytest.raises(InputError, match="steps"):
        convert_eglb(None, tmp_path / "out", steps=10_000)


def test_read_variants(tmp_path: Path) -> None:
    from greenctl.data.geo_io import read_variants

    f = write(
        tmp_path / "v.csv",
        [
            "variant,energy_j_per_request,accuracy,site",
            "r152,10,0.783,",
            "r50,5,0.761,a",
            "r50,5,0.761,b",
            "r18,2.5,0.698,b",
        ],
    )
    v = read_variants(f, ["a", "b", "c"])
    assert v.names == ["r152", "r50", "r18"] and v.reference == 0
    assert v.relative_energy.tolist() == [1.0, 0.5, 0.25]
    assert v.allowed is not None
    assert v.allowed.tolist() == [[1, 1, 1], [1, 1, 0], [0, 1, 0]]


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("r50,0,0.761", r"line 3, column 'energy_j_per_request'"),
        ("r50,5,76.1", r"line 3, column 'accuracy': 76.1 is above 1\n  hint: .*fraction"),
        ("r50,5,-0.1", r"line 3, column 'accuracy'.*negative"),
        ("r152,9,0.783", r"line 3: variant 'r152' has different figures"),
    ],
)
def test_variants_errors(tmp_path: Path, line: str, match: str) -> None:
    from greenctl.data.geo_io import read_variants

    f = write(tmp_path / "v.csv", ["variant,energy_j_per_request,accuracy", "r152,10,0.783", line])
    with pytest.raises(FileFormatError, match=match):
        read_variants(f, ["a"])
    g = write(tmp_path / "w.csv", ["variant,energy_j_per_request,accuracy,site", "r,1,0.5,zz"])
    with pytest.raises(FileFormatError, match="unknown site 'zz'"):
        read_variants(g, ["a"])


def test_variants_from_store(store) -> None:
    from greenctl.data.errors import NotFoundError
    from greenctl.data.geo_io import variants_from_store
    from greenctl.data.records import Profile, Variant

    with pytest.raises(NotFoundError):
        variants_from_store(store, "resnet")
    store.upsert_variant(Variant(name="resnet50", family="resnet", accuracy=0.761))
    store.upsert_variant(Variant(name="resnet18", family="resnet", accuracy=69.758))
    store.upsert_variant(Variant(name="resnet34", family="resnet", accuracy=None))
    store.add_profiles(
        [
            Profile("resnet50", "cpu:4", 1, 20.0, energy_j=3.0),
            Profile("resnet50", "cpu:8", 1, 35.0, energy_j=2.5),
            Profile("resnet18", "cpu:4", 1, 50.0, energy_j=1.0),
            Profile("resnet34", "cpu:4", 1, 30.0, energy_j=1.5),
        ]
    )
    v = variants_from_store(store, "resnet")
    got = dict(zip(v.names, zip(v.energy_j_per_request, v.accuracy, strict=True), strict=True))
    assert set(got) == {"resnet50", "resnet18"}  # resnet34 has no accuracy
    assert got["resnet50"] == (2.5, 0.761)  # the lowest energy per request measured
    assert got["resnet18"][1] == pytest.approx(0.69758)  # stored as a percentage


# -- refused inputs (issue 16): exit 2 naming file, line, column and fix -------------------
@pytest.mark.parametrize(
    ("which", "line", "text", "match"),
    [
        # accepted with exit 0 on main: 1e300 g/kWh, capacity 1e300, PUE 11, 1e4 L/kWh
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,1e300,1.0,1.0,,",
            r"line 3, column 'carbon_g_per_kwh': 1e\+300 is above 2000\n  hint: carbon",
        ),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,2000.5,1.0,1.0,,",
            r"line 3, column 'carbon_g_per_kwh': 2000.5 is above 2000",
        ),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,100,1.0,1e300,,",
            r"line 3, column 'capacity_mw': 1e\+300 is above 1e\+06",
        ),
        ("sites", 3, "2024-01-01T00:00:00Z,b,80,100,1.0,1.0,,11", r"column 'pue': 11 is above 10"),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,100,1e4,1.0,,",
            r"column 'wue_l_per_kwh': 10000 is above 1000",
        ),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,80,100,1.0,1.0,-1e-9,",
            r"column 'ewif_l_per_kwh': -1e-09 is negative",
        ),
        # exit 3 "infeasible" on main (the LP's numerics broke), not a named bad value
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,1e30,100,1.0,1.0,,",
            r"line 3, column 'price_usd_per_mwh': 1e\+30 is above 100000",
        ),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b,-1e30,100,1.0,1.0,,",
            r"column 'price_usd_per_mwh': -1e\+30 is below -100000",
        ),
        ("demand", 3, "2024-01-01T00:00:00Z,b,2e6", r"line 3, column 'load_mw': 2e\+06 is above"),
        ("routes", 3, "a,b,1e7", r"line 3, column 'latency_ms': 1e\+07 is above 1e\+06"),
        # OverflowError on main: before year 1 once moved to UTC
        (
            "sites",
            3,
            "0001-01-01T00:00:00+01:00,b,80,100,1.0,1.0,,",
            r"line 3, column 'time': .* in years 1-9999\n  hint: write times",
        ),
        (
            "demand",
            3,
            "0001-01-01T00:30:00+01:00,b,0.3",
            r"demand.csv, line 3, column 'time'.*years 1-9999",
        ),
        # silently accepted on main: a second 'site' column (ignored), names with NUL or 150
        # characters
        (
            "sites",
            1,
            SITES_HEADER + ",ewif_l_per_kwh,site",
            r"sites.csv, line 1, column 'site': column 'site' appears twice",
        ),
        ("demand", 1, "time,gateway,load_mw,load_mw", r"column 'load_mw' appears twice"),
        (
            "sites",
            3,
            "2024-01-01T00:00:00Z,b\x00,80,100,1.0,1.0,,",
            r"line 3, column 'site': site 'b\\x00' is not a name",
        ),
        ("routes", 3, "a," + "s" * 150 + ",20", r"line 3, column 'site': .*\(150 characters\)"),
    ],
)
def test_values_outside_limits_and_garbage_refused(
    files: dict[str, Path], which: str, line: int, text: str, match: str
) -> None:
    _edit(files[which], line, text)
    with pytest.raises(FileFormatError, match=match) as err:
        load_geo_problem(files["sites"], files["demand"], files["routes"])
    assert err.value.exit_code == 2
    assert Path(err.value.path).name == f"{which}.csv"


def test_the_limits_themselves_are_accepted(files: dict[str, Path]) -> None:
    _edit(files["sites"], 3, "2024-01-01T00:00:00Z,b,-1e5,2000,1000,1e6,1000,10")
    _edit(files["routes"], 3, "a,b,1e6")
    p = load_geo_problem(files["sites"], files["demand"], files["routes"])
    assert p.carbon_g_per_kwh[0, 1] == 2000 and p.pue[0, 1] == 10


@pytest.mark.parametrize("which", ["sites", "demand", "routes"])
def test_binary_files_refused(files: dict[str, Path], which: str) -> None:
    # UnicodeDecodeError escaped on main
    text = files[which].read_bytes()
    files[which].write_bytes(text + b"\xff\xfe\x00\x89PNG\n")
    with pytest.raises(FileFormatError, match=r"line \d+: not UTF-8 text.*\n  hint: save") as err:
        load_geo_problem(files["sites"], files["demand"], files["routes"])
    assert err.value.line == text.count(b"\n") + 1
    assert Path(err.value.path).name == f"{which}.csv"


def test_binary_variants_file_refused(tmp_path: Path) -> None:
    from greenctl.data.geo_io import read_variants

    f = tmp_path / "v.csv"
    f.write_bytes(b"\x80\x81\x82")
    with pytest.raises(FileFormatError, match="line 1: not UTF-8 text"):
        read_variants(f, ["a"])


def test_variants_above_limits_refused(tmp_path: Path) -> None:
    from greenctl.data.geo_io import read_variants

    f = write(tmp_path / "v.csv", ["variant,energy_j_per_request,accuracy", "r,1e300,0.5"])
    with pytest.raises(FileFormatError, match=r"line 2, column 'energy_j_per_request'.*above"):
        read_variants(f, ["a"])


# -- the eGLB converter on broken copies of its input -----------------------------------
@pytest.fixture
def eglb_src(tmp_path: Path) -> Path:
    """The first 6 hours of the bundled eGLB layout for two sites."""
    src = bundled_eglb_dir()
    out = tmp_path / "src"
    for rel in (
        "AI_workload.csv",
        *(f"{d}/{s}_{n}.csv" for s in ("Texas", "Japan") for d, n in _EGLB_KINDS),
    ):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        lines = (src / rel).read_text().splitlines()[:7]
        (out / rel).write_text("\n".join(lines) + "\n")
    return out


_EGLB_KINDS = (("carbon", "carbon"), ("price", "Price"), ("water", "water"))


def _convert(src: Path, tmp_path: Path) -> dict[str, Path]:
    return convert_eglb(src, tmp_path / "out", sites=("Texas", "Japan"), routes="partial")


def test_converter_reads_a_trimmed_copy(eglb_src: Path, tmp_path: Path) -> None:
    paths = _convert(eglb_src, tmp_path)
    p = load_geo_problem(paths["sites"], paths["demand"], paths["routes"])
    assert p.sites == ["Texas", "Japan"] and p.n_steps == 6


@pytest.mark.parametrize(
    ("rel", "content", "error", "match"),
    [
        # accepted on main: 2.5 kg/kWh became 2500 g/kWh in sites.csv
        (
            "carbon/Japan_carbon.csv",
            "Time (UTC),Carbon (kg/kWh)\n2022-09-22 00,2.5\n",
            FileFormatError,
            r"Japan_carbon.csv, line 2, column 'Carbon \(kg/kWh\)': 2.5 is not a finite number "
            r"from 0 to 2",
        ),
        # UnicodeDecodeError on main
        (
            "AI_workload.csv",
            b"Time (UTC),Power (Watt)\n\xff\xfe\n",
            FileFormatError,
            "line 2: not UTF-8",
        ),
        # IndexError on main: the time column after a row's last field
        (
            "price/Texas_Price.csv",
            "Price (USD/MWh),Time (UTC)\n38.35\n",
            FileFormatError,
            r"Texas_Price.csv, line 2: 1 fields, the header has 2",
        ),
        # csv.Error on main: a field over csv's limit
        (
            "water/Texas_water.csv",
            'Time (UTC), WUE (L/kWh)\n"' + "9" * 200_000 + '",1\n',
            FileFormatError,
            r"Texas_water.csv, line 2: not a CSV row",
        ),
        # IsADirectoryError on main
        ("carbon/Texas_carbon.csv", None, InputError, r"cannot read .*Texas_carbon.csv"),
    ],
)
def test_converter_refuses_broken_sources(
    eglb_src: Path, tmp_path: Path, rel: str, content: str | bytes | None, error: type, match: str
) -> None:
    path = eglb_src / rel
    if content is None:
        path.unlink()
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(error, match=match) as err:
        _convert(eglb_src, tmp_path)
    assert err.value.exit_code == 2
    assert not (tmp_path / "out").exists()  # nothing written


def test_converter_output_onto_a_file_refused(eglb_src: Path, tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file")  # FileExistsError on main
    with pytest.raises(InputError, match=r"cannot write the CSVs to .*out") as err:
        _convert(eglb_src, tmp_path)
    assert err.value.exit_code == 2
