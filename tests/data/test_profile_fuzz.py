"""Fuzzing the profile CSV and JSON readers: any file either imports or is refused with a
GreenctlError (exit 2 for a bad file), never another exception, and a refused file leaves the
store as it was. Through the library (read + store) and through `greenctl profile import`.

Inputs per run: 250 CSV + 250 JSON + 100 raw-byte files through the library, 60 through the
CLI: 660 in all.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from greenctl.data.errors import GreenctlError
from greenctl.data.profile_io import EXPORT_COLUMNS, import_profiles
from greenctl.data.store import Store, open_store
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

COLUMNS = [*EXPORT_COLUMNS, "latency_ms"]
HEADER = "variant,model,resource,batch,throughput_rps,latency_ms"

# values near the edges of what the readers accept, plus anything at all
_edge_text = st.sampled_from(
    [
        "",
        " ",
        "0",
        "1",
        "-1",
        "1.5",
        "1e400",
        "-0",
        "nan",
        "inf",
        "65536",
        "65537",
        "99999999999999999999999",
        "cpu:1",
        "cpu:0",
        "cpu:10",
        "mig:1g.10gb",
        "mps:101",
        "gpu:H100",
        "tpu",
        "2026-01-01T00:00:00Z",
        "2026-01-01",
        "9999-12-31T23:59:59Z",
        "0001-01-01T00:00:00+01:00",
        "yesterday",
        "modeled",
        "v[red]x",
        ":smile:",
        "a\x00b",
        "\u2028",
        "x" * 201,
    ]
)
_scalar = st.one_of(
    _edge_text,
    st.text(max_size=12),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=2**62, max_value=2**64),  # around SQLite's largest integer
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.booleans(),
)
_json_value = st.recursive(
    _scalar,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
# the columns whose checks matter most, drawn as often as all the others together
_HOT = [
    "variant",
    "model",
    "resource",
    "batch",
    "throughput_rps",
    "latency_ms",
    "latency_p99_ms",
    "hardware",
    "created_at",
    "samples",
    "capacity_rps",
    "capacity_slo_ms",
]
_column = st.sampled_from(_HOT) | st.sampled_from(COLUMNS)
_columns = st.lists(
    st.sampled_from(COLUMNS) | st.text(max_size=6), min_size=1, max_size=12, unique=True
)


def _valid_base() -> dict[str, object]:
    return {
        "variant": "fz",
        "model": "fam",
        "resource": "cpu:1",
        "batch": 1,
        "throughput_rps": 10,
        "latency_ms": 5,
    }


@st.composite
def csv_files(draw) -> str:
    if draw(st.integers(0, 3)):  # mostly valid rows with a few values replaced
        columns = list(_valid_base()) + draw(st.lists(_column, max_size=4, unique=True))
        columns = list(dict.fromkeys(columns))
    else:
        columns = draw(_columns)
    rows = []
    for n in range(draw(st.integers(0, 4))):
        base = {**_valid_base(), "resource": f"cpu:{n + 1}"}
        row = [str(base.get(c, "")) for c in columns]
        if draw(st.integers(0, 2)) == 0:  # a third of the rows get odd values
            for col in draw(st.lists(_column, min_size=1, max_size=2)):
                if col in columns:
                    v = draw(_scalar)
                    row[columns.index(col)] = "" if v is None else str(v)
        rows.append(row)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    text = buf.getvalue()
    if draw(st.integers(0, 4)) == 0:  # break the CSV itself now and then
        pos = draw(st.integers(0, len(text)))
        text = (
            text[:pos]
            + draw(st.sampled_from(['"', ",", "\n", "\r", "\x00", "\ufeff"]))
            + text[pos:]
        )
    return text


@st.composite
def json_files(draw) -> str:
    rows = []
    for n in range(draw(st.integers(0, 4))):
        row: dict[str, object] = {}
        if draw(st.integers(0, 3)):
            row = {**_valid_base(), "resource": f"cpu:{n + 1}"}
        if draw(st.integers(0, 2)) == 0:  # a third of the rows get odd values
            for key in draw(st.lists(_column | st.text(max_size=4), min_size=1, max_size=2)):
                row[key] = draw(_scalar | _json_value)
        rows.append(row)
    doc: object = rows
    shape = draw(st.integers(0, 5))
    if shape == 1:
        doc = {"profiles": rows}
    elif shape == 2:
        doc = draw(_json_value)
    return json.dumps(doc, allow_nan=True)


def _snapshot(store: Store) -> tuple[int, list[str]]:
    return store.profile_count(), [v.name for v in store.variants()]


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def _check_library(fuzz_dir: Path, name: str, data: bytes) -> None:
    path = fuzz_dir / name
    path.write_bytes(data)
    with open_store(fuzz_dir / "fuzz.db") as store:
        before = _snapshot(store)
        try:
            result = import_profiles(store, path)
        except GreenctlError as exc:
            event("refused")
            assert exc.exit_code == 2, exc
            assert str(path) in str(exc)  # names the file
            assert _snapshot(store) == before
        else:
            event("imported")
            assert result.profiles + result.already_present == result.rows
            assert store.profile_count() == before[0] + result.profiles


def _settings(n: int) -> settings:
    return settings(
        max_examples=n,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_settings(250)
@given(text=csv_files())
@example(text=f"{HEADER}\nv,m,cpu:1,99999999999999999999999,2,3\n")  # a traceback on main
@example(text=f"{HEADER}\nv,m,cpu:1,1,2,3\n" + "v" * 200_000 + ",m,cpu:1,1,2,3\n")
def test_csv_reader_fuzz(fuzz_dir, text):
    _check_library(fuzz_dir, "f.csv", text.encode("utf-8", "surrogatepass"))


@_settings(250)
@given(text=json_files())
@example(text=json.dumps([{**_valid_base(), "batch": 10**30}]))  # tracebacks on main
@example(text=json.dumps([{**_valid_base(), "variant": "\ud800"}]))
@example(text="[" * 100_000 + "]" * 100_000)
def test_json_reader_fuzz(fuzz_dir, text):
    _check_library(fuzz_dir, "f.json", text.encode("utf-8", "surrogatepass"))


@_settings(100)
@given(data=st.binary(max_size=200), suffix=st.sampled_from(["csv", "json", "txt"]))
def test_raw_bytes_fuzz(fuzz_dir, data, suffix):
    _check_library(fuzz_dir, f"raw.{suffix}", data)


@_settings(60)
@given(text=st.one_of(csv_files(), json_files()), suffix=st.sampled_from(["csv", "json"]))
def test_cli_import_fuzz(cli, fuzz_dir, text, suffix):
    path = fuzz_dir / f"cli.{suffix}"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    db = fuzz_dir / "cli.db"
    with open_store(db) as store:
        before = _snapshot(store)
    result = cli("profile", "import", "--db", db, path, "--json")  # raises on a traceback
    with open_store(db) as store:
        after = _snapshot(store)
    event(f"exit {result.exit_code}")
    if result.exit_code == 0:
        doc = json.loads(result.stdout)  # one JSON document
        assert after[0] == before[0] + doc["profiles"]
    else:
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert "Error: " in result.stderr and str(path) in result.stderr
        assert after == before
