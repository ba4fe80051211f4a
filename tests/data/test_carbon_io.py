"""Carbon importers: every format on hand-written samples, unit conversion, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.data import carbon, carbon_io
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError, NotFoundError
from hypothesis import given, settings
from hypothesis import strategies as st


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _count(store) -> int:
    return store.db.table("carbon_signals").count


def test_plain_csv_g_and_kg(tmp_path, store):
    p = _write(
        tmp_path,
        "a.csv",
        "time,region,carbon_g_per_kwh\n2024-01-01T00:00:00Z,DE,300\n"
        "2024-01-01T02:00:00+01:00,DE,310.5\n2024-01-01 02:00,FR,55\n",
    )
    summary = carbon_io.import_carbon(store, p)
    assert summary["format"] == "csv" and summary["rows"] == 3
    rows = carbon.series(store, "DE")
    # +01:00 is normalised to UTC
    assert [r["time"] for r in rows] == ["2024-01-01T00:00:00Z", "2024-01-01T01:00:00Z"]
    assert carbon.value_at(store, "FR", "2024-01-01T02:30:00Z")["carbon_g_per_kwh"] == 55
    kg = _write(tmp_path, "b.csv", "time,kg_per_kwh\n2024-01-02T00:00:00Z,0.25\n")
    carbon_io.import_carbon(store, kg, region="PL")
    assert carbon.latest(store, "PL")["carbon_g_per_kwh"] == pytest.approx(250.0)


def test_plain_csv_offsets_collapse_to_utc(tmp_path):
    p = _write(
        tmp_path,
        "a.csv",
        "time,region,carbon_g_per_kwh\n2024-01-01T01:00:00+01:00,DE,300\n",
    )
    _, pts = carbon_io.read_carbon_file(p)
    assert pts[0].time == "2024-01-01T00:00:00Z"


def test_carbon_aware_sdk_emissions_and_forecast(tmp_path, store):
    em = [
        {
            "location": "eastus",
            "time": "2022-06-01T14:00:00Z",
            "rating": 425.5,
            "duration": "01:00",
        },
        {
            "location": "eastus",
            "time": "2022-06-01T15:00:00Z",
            "rating": 410.0,
            "duration": "01:00",
        },
    ]
    p = _write(tmp_path, "em.json", json.dumps(em))
    s = carbon_io.import_carbon(store, p)
    assert s["format"] == "carbon-aware-sdk" and s["regions"] == ["eastus"]
    fc = [
        {
            "generatedAt": "2022-06-01T12:00:00Z",
            "location": "westus",
            "forecastData": [
                {
                    "location": "westus",
                    "timestamp": "2022-06-01T12:05:00Z",
                    "duration": 5,
                    "value": 380.1,
                },
                {
                    "location": "westus",
                    "timestamp": "2022-06-01T12:10:00Z",
                    "duration": 5,
                    "value": 377.0,
                },
            ],
        }
    ]
    p2 = _write(tmp_path, "fc.json", json.dumps(fc))
    carbon_io.import_carbon(store, p2, kind="marginal")
    rows = carbon.series(store, "westus")
    assert [r["carbon_g_per_kwh"] for r in rows] == [380.1, 377.0]
    assert rows[0]["kind"] == "marginal"
    assert rows[0]["source"] == "carbon-aware-sdk-forecast:fc.json"


def test_watttime_lbs_per_mwh_converted_and_marginal(tmp_path, store):
    doc = {
        "data": [
            {"point_time": "2023-03-01T00:00:00+00:00", "value": 1000.0},
            {"point_time": "2023-03-01T00:05:00+00:00", "value": 500.0},
        ],
        "meta": {"region": "CAISO_NORTH", "signal_type": "co2_moer", "units": "lbs_co2_per_mwh"},
    }
    p = _write(tmp_path, "wt.json", json.dumps(doc))
    s = carbon_io.import_carbon(store, p)
    assert s["format"] == "watttime" and s["kind"] == ["marginal"]
    rows = carbon.series(store, "CAISO_NORTH")
    assert rows[0]["carbon_g_per_kwh"] == pytest.approx(453.59237)
    assert rows[1]["carbon_g_per_kwh"] == pytest.approx(226.796185)


def test_watttime_unknown_units_rejected(tmp_path, store):
    doc = {
        "data": [{"point_time": "2023-03-01T00:00:00Z", "value": 50}],
        "meta": {"region": "X", "units": "percentile"},
    }
    p = _write(tmp_path, "wt.json", json.dumps(doc))
    with pytest.raises(FileFormatError, match=r"meta.units"):
        carbon_io.import_carbon(store, p)
    assert _count(store) == 0


def test_electricitymaps_json_history_forecast_latest(tmp_path, store):
    doc = {
        "zone": "DE",
        "history": [
            {"carbonIntensity": 302, "datetime": "2019-05-21T00:00:00.000Z"},
            {"carbonIntensity": 298, "datetime": "2019-05-21T01:00:00.000Z"},
        ],
    }
    carbon_io.import_carbon(store, _write(tmp_path, "em.json", json.dumps(doc)))
    assert [r["carbon_g_per_kwh"] for r in carbon.series(store, "DE")] == [302, 298]
    fc = {"zone": "DE", "forecast": [{"carbonIntensity": 280, "datetime": "2019-05-21T02:00Z"}]}
    carbon_io.import_carbon(store, _write(tmp_path, "f.json", json.dumps(fc)))
    assert carbon.latest(store, "DE")["carbon_g_per_kwh"] == 280
    latest = {"zone": "FR", "carbonIntensity": 61, "datetime": "2019-05-21T02:00:00Z"}
    carbon_io.import_carbon(store, _write(tmp_path, "l.json", json.dumps(latest)))
    assert carbon.latest(store, "FR")["carbon_g_per_kwh"] == 61


def test_electricitymaps_csv_prefers_life_cycle(tmp_path, store):
    text = (
        "Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
        "Carbon Intensity gCO₂eq/kWh (LCA),Low Carbon Percentage\n"
        "2023-01-01 00:00:00,Germany,Germany,DE,350.1,402.2,40\n"
        "2023-01-01 01:00:00,Germany,Germany,DE,340.0,390.0,41\n"
    )
    s = carbon_io.import_carbon(store, _write(tmp_path, "DE_2023_hourly.csv", text))
    assert s["format"] == "electricitymaps-csv"
    rows = carbon.series(store, "DE")
    assert [r["carbon_g_per_kwh"] for r in rows] == [402.2, 390.0]
    assert rows[0]["source"] == "electricitymaps-csv:DE_2023_hourly.csv:lca"
    direct = "Datetime (UTC),Carbon intensity gCO₂eq/kWh (direct)\n2023-01-01 00:00:00,120\n"
    carbon_io.import_carbon(store, _write(tmp_path, "x.csv", direct), region="NO")
    assert carbon.latest(store, "NO")["carbon_g_per_kwh"] == 120


def test_clover_trace_hourly_from_start(store):
    path = path_of("clover-ciso-march")
    s = carbon_io.import_carbon(store, path, region="CISO", start="2023-03-01T00:00:00Z")
    assert s["format"] == "clover" and s["rows"] == 49
    rows = carbon.series(store, "CISO")
    assert rows[0]["time"] == "2023-03-01T00:00:00Z"
    assert rows[1]["time"] == "2023-03-01T01:00:00Z"
    assert rows[0]["carbon_g_per_kwh"] == pytest.approx(124.57)
    assert rows[-1]["time"] == "2023-03-03T00:00:00Z"


def test_clover_default_epoch(tmp_path):
    _, pts = carbon_io.read_carbon_file(_write(tmp_path, "c.csv", "ESO_March\n97\n71\n"))
    assert pts[0].time == carbon_io.CLOVER_DEFAULT_START and pts[0].region == "ESO"
    assert pts[1].carbon_g_per_kwh == 71


def test_eglb_kg_converted(store):
    path = path_of("eglb-texas")
    s = carbon_io.import_carbon(store, path)
    assert s["format"] == "eglb" and s["regions"] == ["Texas"] and s["rows"] == 457
    first = carbon.series(store, "Texas")[0]
    assert first["time"] == "2022-09-22T00:00:00Z"
    assert first["carbon_g_per_kwh"] == pytest.approx(449.4737760460783)


def test_bundled_traces_import_offline(store):
    for name in carbon_io.BUNDLED_TRACES:
        s = carbon_io.import_bundled(store, name)
        assert s["rows"] >= 49
    assert {r["region"] for r in carbon.regions(store)} >= {"CISO", "ESO", "Texas", "Germany"}
    attribution = carbon_io.bundled_trace_path("clover-ciso-march").parent / "ATTRIBUTION.md"
    assert "MIT" in attribution.read_text() and "sc23-clover" in attribution.read_text()
    eglb_licence = carbon_io.bundled_trace_path("eglb-texas").parent.parent / "LICENSE"
    assert "MIT" in eglb_licence.read_text()


@pytest.mark.parametrize(
    ("name", "text", "fmt", "needle"),
    [
        (
            "a.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,300\n2024-01-01T01:00Z,DE,abc\n",
            "csv",
            "line 3, column 'carbon_g_per_kwh'",
        ),
        (
            "b.csv",
            "time,region,carbon_g_per_kwh\nyesterday,DE,300\n",
            "csv",
            "line 2, column 'time'",
        ),
        ("c.csv", "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,-5\n", "csv", "negative"),
        ("d.csv", "time,region,watts\n2024-01-01T00:00Z,DE,5\n", "csv", "no carbon value column"),
        (
            "e.json",
            '{"data": [{"point_time": "2023-03-01T00:00Z"}], "meta": {"region": "X"}}',
            "watttime",
            "data[0].value is missing",
        ),
        (
            "f.json",
            '[{"location": "x", "time": "2022-01-01T00:00Z", "rating": "high"}]',
            "auto",
            "[0].rating",
        ),
        ("g.json", '{"zone": "DE", "history": [{"carbonIntensity": 3', "auto", "invalid JSON"),
        ("h.csv", "CISO\n120\n\n13x\n", "clover", "line 4"),
        (
            "i.csv",
            "Time (UTC),Carbon (kg/kWh)\n2022-09-22 00,0.4\n2022-09-22 01\n",
            "eglb",
            "line 3",
        ),
    ],
)
def test_malformed_files_name_line_and_store_nothing(tmp_path, store, name, text, fmt, needle):
    carbon_io.import_bundled(store, "clover-eso-march")
    before = _count(store)
    with pytest.raises(FileFormatError) as info:
        carbon_io.import_carbon(store, _write(tmp_path, name, text), fmt=fmt, region="DE")
    assert needle in str(info.value)
    assert _count(store) == before


def test_bad_options(tmp_path, store):
    p = _write(tmp_path, "a.csv", "time,carbon_g_per_kwh\n2024-01-01T00:00Z,1\n")
    with pytest.raises(InputError, match="--region"):
        carbon_io.import_carbon(store, p)
    with pytest.raises(InputError, match="--format"):
        carbon_io.import_carbon(store, p, fmt="xml", region="X")
    with pytest.raises(InputError, match="--kind"):
        carbon_io.import_carbon(store, p, kind="median", region="X")
    with pytest.raises(InputError, match="does not exist"):
        carbon_io.import_carbon(store, tmp_path / "missing.csv", region="X")


def test_queries_errors(store):
    with pytest.raises(NotFoundError, match="no carbon signal for region 'XX'"):
        carbon.series(store, "XX")
    carbon_io.import_bundled(store, "clover-ciso-march")
    with pytest.raises(NotFoundError, match="first value"):
        carbon.value_at(store, "CISO", "2020-01-01T00:00:00Z")
    assert carbon.value_at(store, "CISO", "2030-01-01")["time"] == "2021-03-03T00:00:00Z"
    assert carbon.now(store, "CISO")["stale"] is True


def test_reimport_replaces_same_hour(tmp_path, store):
    p = _write(tmp_path, "a.csv", "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,300\n")
    carbon_io.import_carbon(store, p)
    p.write_text("time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,280\n")
    carbon_io.import_carbon(store, p)
    assert [r["carbon_g_per_kwh"] for r in carbon.series(store, "DE")] == [280]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=2000, allow_nan=False), min_size=1, max_size=30))
def test_csv_round_trip_property(values):
    text = "time,region,carbon_kg_per_kwh\n" + "".join(
        f"2024-01-01T{i // 60:02d}:{i % 60:02d}:00Z,R,{v / 1000!r}\n" for i, v in enumerate(values)
    )
    _, pts = carbon_io.parse_carbon_text(text, path="x.csv")
    assert [p.carbon_g_per_kwh for p in pts] == pytest.approx(values)


class _FakeResponse:
    def __init__(self, body: str) -> None:
        self.body = body.encode()

    def read(self) -> bytes:
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return None


def test_live_adapters_build_requests_without_network(store):
    with pytest.raises(InputError, match="ELECTRICITYMAPS_TOKEN"):
        carbon_io.live_request("electricitymaps", "DE", env={})
    with pytest.raises(InputError, match="WATTTIME_TOKEN"):
        carbon_io.live_request("watttime", "CAISO_NORTH", env={})
    seen = []

    def opener(req, timeout):
        seen.append(req)
        return _FakeResponse(
            json.dumps(
                {
                    "zone": "DE",
                    "history": [{"carbonIntensity": 333, "datetime": "2024-01-01T00:00:00Z"}],
                }
            )
        )

    s = carbon_io.fetch_live(
        store, "electricitymaps", "DE", env={"ELECTRICITYMAPS_TOKEN": "t0k"}, opener=opener
    )
    assert s["rows"] == 1
    req = seen[0]
    assert req.full_url == "https://api.electricitymap.org/v3/carbon-intensity/history?zone=DE"
    assert req.get_header("Auth-token") == "t0k"
    wt = carbon_io.live_request(
        "watttime", "CAISO_NORTH", env={"WATTTIME_TOKEN": "abc"}, what="forecast"
    )
    assert wt.full_url.startswith("https://api.watttime.org/v3/forecast?region=CAISO_NORTH")
    assert wt.get_header("Authorization") == "Bearer abc"

    def failing(req, timeout):
        raise OSError("connection refused")

    from greenctl.data.errors import GreenctlError

    with pytest.raises(GreenctlError, match="connection refused"):
        carbon_io.fetch_live(store, "watttime", "X", env={"WATTTIME_TOKEN": "a"}, opener=failing)


# -- refused values (issue 16): each names file, line/field and fix, and stores nothing -----
def _refused(store, path: Path, needles: list[str], **kw) -> FileFormatError | InputError:
    carbon_io.import_bundled(store, "clover-eso-march")
    before = list(store.db.query("select * from carbon_signals order by region, time, kind"))
    with pytest.raises((FileFormatError, InputError)) as info:
        carbon_io.import_carbon(store, path, **kw)
    assert info.value.exit_code == 2
    for needle in needles:
        assert needle in str(info.value)
    assert list(store.db.query("select * from carbon_signals order by region, time, kind")) == (
        before
    )
    return info.value


@pytest.mark.parametrize(
    ("name", "text", "fmt", "needles"),
    [
        (
            "a.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,300\n2024-01-01T01:00Z,DE,1e300\n",
            "auto",
            ["line 3, column 'carbon_g_per_kwh'", "above 2000 g/kWh", "hint: "],
        ),
        (
            "b.csv",
            "time,region,carbon_kg_per_kwh\n2024-01-01T00:00Z,DE,2.5\n",
            "csv",
            ["line 2, column 'carbon_kg_per_kwh'", "2500 g/kWh is above", "unit"],
        ),
        (
            "c.json",
            '{"data": [{"point_time": "2023-03-01T00:00Z", "value": 5000}],'
            ' "meta": {"region": "X", "units": "lbs_co2_per_mwh"}}',
            "auto",
            ["column 'data[0].value'", "above 2000"],
        ),
        (
            "d.json",
            '[{"location": "x", "time": "2022-01-01T00:00Z", "rating": 2000.5}]',
            "carbon-aware-sdk",
            ["column '[0].rating'", "2000.5 g/kWh is above"],
        ),
        (
            "e.json",
            '{"zone": "DE", "history": [{"carbonIntensity": 1e300, "datetime": "2024-01-01"}]}',
            "electricitymaps",
            ["column 'history[0].carbonIntensity'", "above 2000"],
        ),
        ("f.csv", "CISO_March\n120\n2001\n", "clover", ["line 3, column 'CISO_March'", "above"]),
        (
            "Texas_carbon.csv",
            "Time (UTC),Carbon (kg/kWh)\n2022-09-22 00,0.4\n2022-09-22 01,3\n",
            "eglb",
            ["line 3, column 'Carbon (kg/kWh)'", "3000 g/kWh is above"],
        ),
        (
            "g.csv",
            "Datetime (UTC),Zone Id,Carbon Intensity gCO₂eq/kWh (LCA)\n2024-01-01T00:00Z,DE,9e9\n",
            "electricitymaps-csv",
            ["line 2, column 'Carbon Intensity gCO₂eq/kWh (LCA)'", "above"],
        ),
    ],
)
def test_carbon_above_the_ceiling_is_refused(tmp_path, store, name, text, fmt, needles):
    # today's main stores 1e300 g/kWh and exits 0
    _refused(store, _write(tmp_path, name, text), needles, fmt=fmt)
    assert carbon_io.MAX_CARBON_G_PER_KWH == 2000.0


def test_the_ceiling_itself_and_zero_are_accepted(tmp_path, store):
    p = _write(
        tmp_path,
        "a.csv",
        "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,2000\n2024-01-01T01:00Z,DE,0\n",
    )
    assert carbon_io.import_carbon(store, p)["rows"] == 2


@pytest.mark.parametrize(
    ("name", "text", "needles"),
    [
        # RecursionError escaped from json.loads
        ("deep.json", "[" * 100_000 + "]" * 100_000, ["deep.json", "nested too deeply"]),
        # OverflowError: float() of a 400-digit JSON integer
        (
            "big.json",
            '{"data": [{"point_time": "2023-03-01T00:00Z", "value": ' + "9" * 400 + "}],"
            ' "meta": {"region": "X"}}',
            ["column 'data[0].value'", "too large"],
        ),
        # ValueError (not a JSONDecodeError): an integer over Python's 4300-digit limit
        (
            "huge.json",
            '{"zone": "DE", "carbonIntensity": ' + "9" * 5000 + ', "datetime": "2024-01-01"}',
            ["huge.json", "invalid JSON"],
        ),
        # AttributeError: a WattTime forecast list holding a non-object
        (
            "fc.json",
            '{"data": [{"forecast": []}, 5], "meta": {"region": "X"}}',
            ["column 'data[1].forecast'", "must be a list"],
        ),
        # OverflowError: a time before year 1 once moved to UTC
        (
            "t.csv",
            "time,region,carbon_g_per_kwh\n0001-01-01T00:00:00+01:00,DE,300\n",
            ["line 2, column 'time'", "outside years 1-9999", "ISO 8601"],
        ),
        # csv.Error: a field over csv's 128 KiB limit
        (
            "wide.csv",
            'time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,"' + "x" * 200_000 + '",300\n',
            ["wide.csv, line 2", "field larger than field limit"],
        ),
        # a NUL byte in a region was stored as is
        (
            "nul.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z,D\x00E,300\n",
            ["line 2, column 'region'", "D\\x00E", "hint: "],
        ),
        # a 150-character region was stored as is
        (
            "long.csv",
            "time,region,carbon_g_per_kwh\n2024-01-01T00:00Z," + "R" * 150 + ",300\n",
            ["line 2, column 'region'", "(150 characters)"],
        ),
        # a zone that is not a string was stored as its repr
        (
            "zone.json",
            '{"zone": {"a": 1}, "history": [{"carbonIntensity": 3, "datetime": "2024-01-01"}]}',
            ["column 'zone'", "not a string"],
        ),
        # a duplicated column: the first was read, the second ignored
        (
            "dup.csv",
            "time,region,carbon_g_per_kwh,carbon_g_per_kwh\n2024-01-01T00:00Z,DE,300,200\n",
            ["line 1, column 'carbon_g_per_kwh'", "appears twice"],
        ),
    ],
)
def test_malformed_files_that_crashed_or_passed(tmp_path, store, name, text, needles):
    _refused(store, _write(tmp_path, name, text), needles)


def test_clover_start_near_year_9999_is_refused(tmp_path, store):
    # OverflowError: the hourly times ran past 9999-12-31
    p = _write(tmp_path, "c.csv", "CISO_March\n120\n130\n")
    err = _refused(
        store, p, ["line 3", "after year 9999", "earlier --start"], fmt="clover",
        start="9999-12-31T23:00:00Z",
    )  # fmt: skip
    assert isinstance(err, FileFormatError)


def test_region_option_must_be_a_name(tmp_path, store):
    p = _write(tmp_path, "a.csv", "time,carbon_g_per_kwh\n2024-01-01T00:00Z,1\n")
    _refused(store, p, ["--region", "not a name"], region="A\nB")
