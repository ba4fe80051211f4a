"""Fuzzing the geo planner's CSV readers and the eGLB converter (issue 16): for any input
the outcome is a valid problem or a GreenctlError with exit code 1-3 naming the file, never
another exception; a converter that refuses writes nothing. Also `greenctl plan geo`
driven through the CLI with bad files (exit 2, ``Error:`` naming file, line, column and
fix) and with random in-range numbers (a plan or exit 1-3, never a traceback).

Inputs run per pass (max_examples): 500 mutated CSV sets + 200 arbitrary texts + 100
arbitrary byte strings + 200 mutated eGLB layouts + 20 `plan geo` runs = 1020, plus the
parametrized cases; GREENCTL_FUZZ_SCALE=N runs N times as many.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.carbon_io import check_region_name
from greenctl.data.eglb_convert import bundled_eglb_dir, convert_eglb
from greenctl.data.errors import FileFormatError, GreenctlError
from greenctl.data.geo_io import LIMITS, GeoProblem, load_geo_problem, read_variants
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

SCALE = int(os.environ.get("GREENCTL_FUZZ_SCALE", "1"))
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

BASE = {
    "sites": (
        "time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw,"
        "ewif_l_per_kwh,pue\n"
        "2024-01-01T00:00:00Z,a,50,400,2.0,1.0,1.5,1.2\n"
        "2024-01-01T00:00:00Z,b,80,100,1.0,1.0,,\n"
        "2024-01-01T01:00:00Z,a,-5,380,2.1,1.0,1.5,1.2\n"
        "2024-01-01T01:00:00Z,b,90,120,1.1,0.5,,\n"
        "2024-01-01T02:00:00+00:00,a,55,390,2.0,1.0,1.5,1.2\n"
        "2024-01-01T02:00:00+00:00,b,85,110,1.0,1.0,0,1\n"
    ),
    "demand": (
        "time,gateway,load_mw\n"
        "2024-01-01T00:00:00Z,a,0.4\n"
        "2024-01-01T00:00:00Z,b,0.3\n"
        "2024-01-01T01:00:00+00:00,a,0.5\n"
        "2024-01-01T02:00:00Z,b,0.9\n"
    ),
    "routes": "gateway,site,latency_ms\na,a,5\na,b,20\nb,b,\nb,a,40\n",
    "variants": (
        "variant,energy_j_per_request,accuracy,site\nr152,4,0.783,\nr50,2,0.761,a\nr50,2,0.761,b\n"
    ),
}
GARBAGE = [
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1e400",
    "1e300",
    "-1e300",
    "1e30",
    "-1",
    "-0.0",
    "1e-320",
    "2000.0001",
    "1_000",
    "abc",
    "\x00",
    "a\x00b",
    "x" * 200_000,
    "9" * 5000,
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "2024-02-30T00:00:00Z",
    "2024-01-01T00:30:00Z",
    "\ufeff",
    '"',
    '"unclosed',
    "a\r\nb",
    ",",
    "\u202e",
    "a",
    "b",
    "zz",
]
MUTATIONS = [
    "cell",
    "cell",
    "cell",
    "cell",
    "drop-column",
    "dup-header",
    "dup-column",
    "bom-crlf",
    "truncate",
    "insert",
    "drop-line",
    "dup-line",
]


@st.composite
def mutated_csv(draw: st.DrawFn, text: str) -> str:
    """``text`` (a CSV) with one mutation: a cell replaced by garbage, a column dropped or
    duplicated, the header doubled, BOM + CRLF, truncation, an insertion, a line dropped or
    doubled."""
    how = draw(st.sampled_from(MUTATIONS))
    garbage = draw(st.one_of(st.sampled_from(GARBAGE), st.text(max_size=12)))
    lines = text.rstrip("\n").split("\n")
    rows = [line.split(",") for line in lines]
    if how == "cell":
        i = draw(st.integers(0, len(rows) - 1))
        rows[i][draw(st.integers(0, len(rows[i]) - 1))] = garbage
        return "\n".join(",".join(r) for r in rows) + "\n"
    if how == "drop-column":
        j = draw(st.integers(0, len(rows[0]) - 1))
        return "\n".join(",".join(c for k, c in enumerate(r) if k != j) for r in rows) + "\n"
    if how == "dup-header":
        return lines[0] + "\n" + text
    if how == "dup-column":
        j = draw(st.integers(0, len(rows[0]) - 1))
        return "\n".join(",".join([*r, r[j]]) for r in rows) + "\n"
    if how == "bom-crlf":
        return "\ufeff" + text.replace("\n", "\r\n")
    if how == "truncate":
        return text[: draw(st.integers(0, len(text)))]
    if how == "insert":
        k = draw(st.integers(0, len(text)))
        return text[:k] + garbage + text[k:]
    k = draw(st.integers(0, len(lines) - 1))
    if how == "drop-line":
        return "\n".join(lines[:k] + lines[k + 1 :]) + "\n"
    return "\n".join(lines[: k + 1] + lines[k:]) + "\n"


def _check_problem(p: GeoProblem) -> None:
    """Everything a reader accepted is finite, inside LIMITS and well named."""
    for name in ("price_usd_per_mwh", "carbon_g_per_kwh", "wue_l_per_kwh", "ewif_l_per_kwh"):
        low, high = LIMITS[name]
        arr = getattr(p, name)
        assert arr.shape == (p.n_steps, len(p.sites))
        assert np.isfinite(arr).all() and (arr >= low).all() and (arr <= high).all(), name
    for name in ("pue", "capacity_mw", "load_mw"):
        low, high = LIMITS[name]
        arr = getattr(p, name)
        assert np.isfinite(arr).all() and (arr >= low).all() and (arr <= high).all(), name
    assert (p.load_mw.sum(axis=1) <= p.capacity_mw.sum(axis=1) * (1 + 1e-9) + 1e-12).all()
    assert p.step_h > 0 and math.isfinite(p.step_h)
    for name in (*p.sites, *p.gateways):
        assert check_region_name(name) == name
    if p.latency_ms is not None:
        lat = p.latency_ms[~np.isnan(p.latency_ms)]
        assert (lat >= 0).all() and (lat <= LIMITS["latency_ms"][1]).all()


def _load(folder: Path) -> str:
    """Read the four files of ``folder``; return 'ok' or the error's class name."""
    paths = {k: folder / f"{k}.csv" for k in BASE}
    try:
        p = load_geo_problem(paths["sites"], paths["demand"], paths["routes"])
        v = read_variants(paths["variants"], p.sites)
    except GreenctlError as exc:
        assert 1 <= exc.exit_code <= 3, exc
        if isinstance(exc, FileFormatError):
            assert Path(exc.path) in paths.values(), exc.path
        assert "Traceback" not in str(exc)
        return type(exc).__name__
    _check_problem(p)
    assert np.isfinite(v.energy_j_per_request).all() and (v.energy_j_per_request > 0).all()
    assert ((v.accuracy >= 0) & (v.accuracy <= 1)).all()
    return "ok"


def _write_base(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for k, text in BASE.items():
        (folder / f"{k}.csv").write_text(text, encoding="utf-8")


def test_the_base_problem_is_valid(tmp_path: Path) -> None:
    _write_base(tmp_path)
    assert _load(tmp_path) == "ok"


@settings(FUZZ, max_examples=500 * SCALE)
@given(which=st.sampled_from(sorted(BASE)), data=st.data())
def test_mutated_csvs_load_or_refuse(tmp_path: Path, which: str, data: st.DataObject) -> None:
    _write_base(tmp_path)
    text = data.draw(mutated_csv(BASE[which]))
    (tmp_path / f"{which}.csv").write_text(text, encoding="utf-8", newline="")
    event(f"{which}: {_load(tmp_path)}")


@settings(FUZZ, max_examples=200 * SCALE)
@given(which=st.sampled_from(sorted(BASE)), text=st.text(max_size=300))
def test_arbitrary_text_loads_or_refuses(tmp_path: Path, which: str, text: str) -> None:
    _write_base(tmp_path)
    (tmp_path / f"{which}.csv").write_text(text, encoding="utf-8", newline="")
    _load(tmp_path)


@settings(FUZZ, max_examples=100 * SCALE)
@given(which=st.sampled_from(sorted(BASE)), blob=st.binary(max_size=400))
def test_arbitrary_bytes_load_or_refuse(tmp_path: Path, which: str, blob: bytes) -> None:
    _write_base(tmp_path)
    (tmp_path / f"{which}.csv").write_bytes(blob)
    _load(tmp_path)


@pytest.mark.parametrize("which", sorted(BASE))
def test_paths_that_are_not_csv_files(tmp_path: Path, which: str) -> None:
    for kind in ("dir", "missing", "empty", "png"):
        _write_base(tmp_path)
        path = tmp_path / f"{which}.csv"
        path.unlink()
        if kind == "dir":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "png":
            path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
        assert _load(tmp_path) in ("InputError", "FileFormatError")
        if kind == "dir":
            path.rmdir()


# -- the eGLB converter on mutated copies of its input ----------------------------------
EGLB_SITES = ("Texas", "Japan")
EGLB_FILES = (
    "AI_workload.csv",
    *(
        f"{d}/{s}_{n}.csv"
        for s in EGLB_SITES
        for d, n in (("carbon", "carbon"), ("price", "Price"), ("water", "water"))
    ),
)


def _trimmed_eglb() -> dict[str, str]:
    src = bundled_eglb_dir()
    return {rel: "\n".join((src / rel).read_text().splitlines()[:7]) + "\n" for rel in EGLB_FILES}


EGLB_TRIMMED = _trimmed_eglb()


def _write_eglb(folder: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")


def test_trimmed_eglb_converts(tmp_path: Path) -> None:
    _write_eglb(tmp_path / "src", dict(EGLB_TRIMMED))
    paths = convert_eglb(tmp_path / "src", tmp_path / "out", sites=EGLB_SITES, routes="partial")
    p = load_geo_problem(paths["sites"], paths["demand"], paths["routes"])
    assert p.n_steps == 6 and p.sites == list(EGLB_SITES)


@settings(FUZZ, max_examples=200 * SCALE)
@given(
    rel=st.sampled_from(EGLB_FILES),
    data=st.data(),
    routes=st.sampled_from(["all", "partial"]),
    steps=st.sampled_from([None, 1, 6]),
)
def test_mutated_eglb_layout_converts_or_refuses(
    tmp_path: Path, rel: str, data: st.DataObject, routes: str, steps: int | None
) -> None:
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    files: dict[str, str | bytes] = dict(EGLB_TRIMMED)
    files[rel] = data.draw(
        st.one_of(
            mutated_csv(EGLB_TRIMMED[rel]),
            mutated_csv(EGLB_TRIMMED[rel]).map(lambda t: t.replace(",", ", ")),
            st.binary(max_size=200),
        )
    )
    _write_eglb(work / "src", files)
    out = work / "out"
    try:
        paths = convert_eglb(work / "src", out, sites=EGLB_SITES, routes=routes, steps=steps)
    except GreenctlError as exc:
        assert 1 <= exc.exit_code <= 3, exc
        assert not out.exists(), "a refused conversion wrote files"
        event(f"convert: {type(exc).__name__}")
    else:
        # what the converter writes, the reader takes (or refuses a step over capacity)
        try:
            p = load_geo_problem(paths["sites"], paths["demand"], paths.get("routes"))
        except FileFormatError as exc:
            assert "exceeds the total site capacity" in exc.reason, exc
            event("convert: ok, load over capacity")
        else:
            _check_problem(p)
            event("convert: ok")
    shutil.rmtree(work)


# -- `greenctl plan geo` through the CLI ---------------------------------------------------
def _plan_args(folder: Path) -> list[str]:
    return [
        "plan",
        "geo",
        "--sites",
        str(folder / "sites.csv"),
        "--demand",
        str(folder / "demand.csv"),
        "--routes",
        str(folder / "routes.csv"),
        "--json",
    ]


@pytest.mark.parametrize(
    ("which", "old", "new", "needles"),
    [
        # exit 0 on main: a 1e300 g/kWh site was planned
        (
            "sites",
            "a,50,400,",
            "a,50,1e300,",
            ["sites.csv, line 2, column 'carbon_g_per_kwh': 1e+300 is above 2000", "hint:"],
        ),
        # exit 3 "infeasible" on main: a 1e30 USD/MWh price broke the LP
        (
            "sites",
            "b,80,100,",
            "b,1e30,100,",
            ["sites.csv, line 3, column 'price_usd_per_mwh': 1e+30 is above 100000"],
        ),
        # a UnicodeDecodeError traceback on main
        ("demand", "b,0.9\n", None, ["demand.csv, line 6: not UTF-8 text"]),
        # an OverflowError traceback on main
        (
            "demand",
            "2024-01-01T00:00:00Z,a",
            "0001-01-01T00:00:00+01:00,a",
            ["demand.csv, line 2, column 'time'", "hint: write times like"],
        ),
        (
            "sites",
            "ewif_l_per_kwh,pue",
            "ewif_l_per_kwh,site",
            ["sites.csv, line 1, column 'site': column 'site' appears twice"],
        ),
        ("routes", "a,b,20", "a,b,nan", ["routes.csv, line 3, column 'latency_ms'"]),
    ],
)
def test_cli_plan_geo_refuses_bad_files(
    cli, tmp_path: Path, which: str, old: str, new: str | None, needles: list[str]
) -> None:
    _write_base(tmp_path)
    path = tmp_path / f"{which}.csv"
    text = BASE[which]
    assert old in text
    if new is None:  # a byte that is not UTF-8 after the last line
        path.write_bytes(text.encode() + b"\xff\n")
    else:
        path.write_text(text.replace(old, new, 1), encoding="utf-8")
    r = cli(*_plan_args(tmp_path))
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    assert r.stderr.startswith("Error: ")
    for needle in needles:
        assert needle in r.stderr, r.stderr
    assert "Traceback" not in r.output
    assert json.loads(cli("plan", "list", "--json").stdout or "[]") == []


@settings(FUZZ, max_examples=20 * SCALE)
@given(data=st.data(), algorithm=st.sampled_from(["eglb-off", "eglb", "nearest", "glb-all"]))
def test_cli_plan_geo_on_random_in_range_numbers(
    cli, tmp_path: Path, data: st.DataObject, algorithm: str
) -> None:
    """Any numbers inside LIMITS give a plan or exit 1-3, never a traceback."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path))
    _write_base(folder)
    lines = BASE["sites"].rstrip("\n").split("\n")
    header = lines[0].split(",")
    rows = [line.split(",") for line in lines[1:]]
    for row in rows:
        for j, column in enumerate(header[2:], start=2):
            low, high = LIMITS[column]
            value = data.draw(
                st.one_of(
                    st.floats(low, high, allow_nan=False),
                    st.sampled_from([low, high, 0.0 if low <= 0 else low]),
                )
            )
            row[j] = repr(value)
    (folder / "sites.csv").write_text(
        "\n".join([lines[0], *(",".join(r) for r in rows)]) + "\n", encoding="utf-8"
    )
    r = cli(*_plan_args(folder), "--algorithm", algorithm)
    assert r.exit_code in (0, 1, 2, 3), r.output
    if r.exit_code == 0:
        doc = json.loads(r.stdout)
        assert doc["kind"] == "geo"
    else:
        assert r.stdout == "" and r.stderr.startswith("Error: ")
    event(f"plan geo: exit {r.exit_code}")
    shutil.rmtree(folder)
