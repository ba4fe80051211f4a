"""Fuzzing the carbon-signal readers (issue 16): for any input, `import_carbon` either
stores sensible values or raises a GreenctlError with exit code 1-3, never another
exception, and a refused file leaves the store as it was. Also `greenctl carbon import`
driven through the CLI with bad files: exit 2, ``Error:`` naming the file, line, column
and fix, and no traceback.

Inputs run per pass (max_examples): 1000 mutated files + 400 mutated JSON documents + 300
arbitrary texts + 200 arbitrary byte strings = 1900, plus the parametrized cases;
GREENCTL_FUZZ_SCALE=N runs N times as many.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from greenctl.data import carbon_io
from greenctl.data.errors import FileFormatError, GreenctlError
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

# GREENCTL_FUZZ_SCALE=50 multiplies every max_examples for a long campaign.
SCALE = int(os.environ.get("GREENCTL_FUZZ_SCALE", "1"))
FUZZ = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
)

# One small valid file per format: (file name, text, the region option it needs).
SAMPLES: dict[str, tuple[str, str, str | None]] = {
    "csv": (
        "plain.csv",
        "time,region,carbon_g_per_kwh,kind\n"
        "2024-01-01T00:00:00Z,DE,300,average\n"
        "2024-01-01T01:00:00+01:00,DE,310.5,\n"
        "2024-01-01 02:00,FR,55,marginal\n",
        None,
    ),
    "csv-kg": ("kg.csv", "time,kg_per_kwh\n2024-01-02T00:00:00Z,0.25\n", "PL"),
    "carbon-aware-sdk": (
        "sdk.json",
        json.dumps(
            [
                {"location": "eastus", "time": "2022-06-01T14:00:00Z", "rating": 425.5},
                {
                    "location": "westus",
                    "forecastData": [
                        {"location": "westus", "timestamp": "2022-06-01T12:05:00Z", "value": 380.1}
                    ],
                },
            ]
        ),
        None,
    ),
    "watttime": (
        "wt.json",
        json.dumps(
            {
                "data": [
                    {"point_time": "2023-03-01T00:00:00+00:00", "value": 950.0},
                    {"point_time": "2023-03-01T00:05:00+00:00", "value": 1001.5},
                ],
                "meta": {"region": "CAISO_NORTH", "units": "lbs_co2_per_mwh"},
            }
        ),
        None,
    ),
    "watttime-forecast": (
        "wtf.json",
        json.dumps(
            {
                "data": [
                    {
                        "generated_at": "2023-03-01T00:00:00Z",
                        "forecast": [{"point_time": "2023-03-01T00:05:00Z", "value": 900}],
                    }
                ],
                "meta": {"region": "CAISO_NORTH", "units": "g_co2_per_kwh"},
            }
        ),
        None,
    ),
    "electricitymaps": (
        "em.json",
        json.dumps(
            {
                "zone": "DE",
                "history": [
                    {"carbonIntensity": 302, "datetime": "2024-01-01T00:00:00.000Z"},
                    {"carbonIntensity": 296, "datetime": "2024-01-01T01:00:00.000Z"},
                ],
                "forecast": [{"carbonIntensity": 250, "datetime": "2024-01-01T02:00:00Z"}],
            }
        ),
        None,
    ),
    "electricitymaps-csv": (
        "em.csv",
        "Datetime (UTC),Country,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
        "Carbon Intensity gCO₂eq/kWh (LCA)\n"
        "2024-01-01 00:00:00,Germany,DE,280.5,350.25\n"
        "2024-01-01 01:00:00,Germany,DE,270,340\n",
        None,
    ),
    "clover": ("clover.csv", "CISO_March\n120.5\n130\n\n125\n", None),
    "eglb": (
        "Texas_carbon.csv",
        "Time (UTC),Carbon (kg/kWh)\n2022-09-22 00,0.449\n2022-09-22 01,0.42\n",
        None,
    ),
}
FORMAT_OF = {"csv-kg": "csv", "watttime-forecast": "watttime"}

# Cell / value replacements that broke readers or must be refused.
GARBAGE = [
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e400",
    "-1e400",
    "1e300",
    "-1",
    "-0.0",
    "2000.0001",
    "1e-320",
    "abc",
    "\x00",
    "a\x00b",
    "x" * 200_000,
    "9" * 5000,
    "0001-01-01T00:00:00+01:00",
    "9999-12-31T23:59:59-01:00",
    "2024-02-30T00:00:00Z",
    "\ufeff",
    '"',
    '"unclosed',
    "a\r\nb",
    ",",
    "\u202e",
    "average",
    "marginal",
    "median",
]
JSON_GARBAGE = [
    "null",
    "true",
    "[]",
    "{}",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e400",
    "-5",
    "2000.5",
    "9" * 400,
    "9" * 5000,
    '"abc"',
    '"nan"',
    '""',
    '"\\u0000"',
    '"0001-01-01T00:00:00+01:00"',
    "[" * 5000 + "]" * 5000,
    json.dumps("x" * 200_000),
    '{"a": [1, 2]}',
]


def _snapshot(store: Any) -> list[Any]:
    return list(
        store.db.execute(
            "select region, time, carbon_g_per_kwh, kind, source, imported_at"
            " from carbon_signals order by region, time, kind"
        )
    )


def _check(store: Any, path: Path, **options: Any) -> str:
    """Import once; assert the contract; return 'ok' or the error class name."""
    before = _snapshot(store)
    try:
        summary = carbon_io.import_carbon(store, path, **options)
    except GreenctlError as exc:
        assert 1 <= exc.exit_code <= 3, exc
        assert _snapshot(store) == before, "a refused file changed the store"
        if isinstance(exc, FileFormatError):
            assert exc.path == str(path)
        else:
            assert str(path) in str(exc) or str(exc).startswith("--"), exc
        assert "Traceback" not in str(exc)
        return type(exc).__name__
    assert summary["rows"] >= 1
    for region, time, value, kind, _source, _at in _snapshot(store):
        assert isinstance(value, float) and math.isfinite(value)
        assert 0.0 <= value <= carbon_io.MAX_CARBON_G_PER_KWH
        assert carbon_io.normalise_time(time) == time
        assert kind in carbon_io.KINDS
        assert carbon_io.check_region_name(region) == region
    return "ok"


def _split(text: str) -> list[list[str]]:
    return [line.split(",") for line in text.split("\n")]


def _join(rows: list[list[str]]) -> str:
    return "\n".join(",".join(r) for r in rows)


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, str, str, str | None]:
    """(sample name, file name, mutated text, region option)."""
    sample = draw(st.sampled_from(sorted(SAMPLES)))
    name, text, region = SAMPLES[sample]
    how = draw(
        st.sampled_from(
            [
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
        )
    )
    rows = _split(text)
    garbage = draw(st.one_of(st.sampled_from(GARBAGE), st.text(max_size=12)))
    if how == "cell":
        i = draw(st.integers(0, len(rows) - 1))
        j = draw(st.integers(0, max(len(rows[i]) - 1, 0)))
        if rows[i]:
            rows[i][j] = garbage
        text = _join(rows)
    elif how == "drop-column":
        j = draw(st.integers(0, len(rows[0]) - 1))
        text = _join([[c for k, c in enumerate(r) if k != j] for r in rows])
    elif how == "dup-header":
        text = "\n".join([text.split("\n")[0], text])
    elif how == "dup-column":
        j = draw(st.integers(0, len(rows[0]) - 1))
        text = _join([[*r, r[j]] if j < len(r) else r for r in rows])
    elif how == "bom-crlf":
        text = "\ufeff" + text.replace("\n", "\r\n")
    elif how == "truncate":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "insert":
        k = draw(st.integers(0, len(text)))
        text = text[:k] + garbage + text[k:]
    elif how == "drop-line":
        lines = text.split("\n")
        del lines[draw(st.integers(0, len(lines) - 1))]
        text = "\n".join(lines)
    else:
        lines = text.split("\n")
        k = draw(st.integers(0, len(lines) - 1))
        text = "\n".join([*lines[: k + 1], lines[k], *lines[k + 1 :]])
    return sample, name, text, region


@settings(FUZZ, max_examples=1000 * SCALE)
@given(case=mutated_files(), auto=st.booleans())
def test_mutated_files_import_or_refuse(tmp_path, store, case, auto):
    sample, name, text, region = case
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    fmt = "auto" if auto else FORMAT_OF.get(sample, sample)
    event(f"{sample}: {_check(store, path, fmt=fmt, region=region)}")


def _leaves(doc: Any, where: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(doc, dict):
        return [where] + [p for k, v in doc.items() for p in _leaves(v, (*where, k))]
    if isinstance(doc, list):
        return [where] + [p for i, v in enumerate(doc) for p in _leaves(v, (*where, i))]
    return [where]


@settings(FUZZ, max_examples=400 * SCALE)
@given(
    sample=st.sampled_from(
        ["carbon-aware-sdk", "watttime", "watttime-forecast", "electricitymaps"]
    ),
    data=st.data(),
)
def test_mutated_json_documents_import_or_refuse(tmp_path, store, sample, data):
    name, text, region = SAMPLES[sample]
    doc = json.loads(text)
    where = data.draw(st.sampled_from(_leaves(doc)))
    garbage = data.draw(
        st.one_of(st.sampled_from(JSON_GARBAGE), st.text(max_size=12).map(json.dumps))
    )
    marker = "__MUTATED__"
    if not where:
        doc = marker
    else:
        parent = doc
        for k in where[:-1]:
            parent = parent[k]
        if data.draw(st.booleans()) and isinstance(parent, dict):
            del parent[where[-1]]  # a missing key
        else:
            parent[where[-1]] = marker
    mutated = json.dumps(doc).replace(json.dumps(marker), garbage)
    path = tmp_path / name
    path.write_text(mutated, encoding="utf-8")
    fmt = data.draw(st.sampled_from(["auto", FORMAT_OF.get(sample, sample)]))
    event(f"{sample}: {_check(store, path, fmt=fmt, region=region)}")


@settings(FUZZ, max_examples=300 * SCALE)
@given(
    text=st.text(max_size=300),
    fmt=st.sampled_from(carbon_io.FORMATS),
    region=st.sampled_from([None, "DE", " ", "x\x00"]),
)
def test_arbitrary_text_imports_or_refuses(tmp_path, store, text, fmt, region):
    path = tmp_path / "any.txt"
    path.write_text(text, encoding="utf-8", newline="")
    _check(store, path, fmt=fmt, region=region)


@settings(FUZZ, max_examples=200 * SCALE)
@given(blob=st.binary(max_size=400), fmt=st.sampled_from(carbon_io.FORMATS))
def test_arbitrary_bytes_import_or_refuse(tmp_path, store, blob, fmt):
    path = tmp_path / "any.bin"
    path.write_bytes(blob)
    _check(store, path, fmt=fmt, region="DE")


@pytest.mark.parametrize("fmt", carbon_io.FORMATS)
def test_paths_that_are_not_carbon_files(tmp_path, store, fmt):
    (tmp_path / "dir.csv").mkdir()
    (tmp_path / "png.csv").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    (tmp_path / "nul.csv").write_bytes(b"\x00" * 64)
    (tmp_path / "empty.csv").write_bytes(b"")
    for name in ("dir.csv", "png.csv", "nul.csv", "empty.csv", "missing.csv"):
        assert _check(store, tmp_path / name, fmt=fmt, region="DE") != "ok"
    assert _snapshot(store) == []


# -- through the CLI -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "text", "args", "needles"),
    [
        (
            "big.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00:00Z,DE,300\n"
            "2024-01-01T01:00:00Z,DE,1e300\n",
            [],
            ["big.csv, line 3, column 'carbon_g_per_kwh'", "above 2000 g/kWh", "hint:"],
        ),
        (
            "nan.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00:00Z,DE,nan\n",
            [],
            ["nan.csv, line 2, column 'carbon_g_per_kwh'", "not a finite number"],
        ),
        (
            "time.csv",
            "time,region,carbon_g_per_kwh\n0001-01-01T00:00:00+01:00,DE,300\n",
            [],
            ["time.csv, line 2, column 'time'", "hint: write times as ISO 8601"],
        ),
        (
            "deep.json",
            "[" * 50_000 + "]" * 50_000,
            ["--format", "carbon-aware-sdk"],
            ["deep.json", "nested too deeply"],
        ),
        (
            "wt.json",
            '{"data": [{"forecast": []}, 7], "meta": {"region": "X"}}',
            [],
            ["wt.json, column 'data[1].forecast'"],
        ),
        (
            "CISO.csv",
            "CISO_March\n100\n3000\n",
            ["--format", "clover"],
            ["CISO.csv, line 3, column 'CISO_March'", "3000 g/kWh is above"],
        ),
    ],
)
def test_cli_carbon_import_refuses_bad_files(cli, tmp_path, name, text, args, needles):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    assert cli("carbon", "import", "bundled:clover-eso-march").exit_code == 0
    before = cli("carbon", "regions", "--json").stdout
    r = cli("carbon", "import", path, *args, "--json")
    assert r.exit_code == 2, r.output
    assert r.stdout == ""  # nothing but the error, and that on stderr
    assert r.stderr.startswith("Error: ")
    for needle in needles:
        assert needle in r.stderr
    assert "Traceback" not in r.output
    assert cli("carbon", "regions", "--json").stdout == before


def test_cli_carbon_import_of_a_directory_and_a_binary(cli, tmp_path, db_path):
    (tmp_path / "d").mkdir()
    r = cli("carbon", "import", tmp_path / "d", "--region", "DE")
    assert r.exit_code == 2 and "Error: cannot read" in r.stderr
    (tmp_path / "b.csv").write_bytes(b"\xff\xfe\x00\x01binary")
    r = cli("carbon", "import", tmp_path / "b.csv", "--region", "DE")
    assert r.exit_code == 2 and "b.csv, line 1: not UTF-8 text" in r.stderr
    assert not db_path.exists()  # refused imports leave no store behind
