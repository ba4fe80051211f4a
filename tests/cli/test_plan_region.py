"""`plan mix` / `plan mig` take the carbon intensity from the store's signal (--region, --at)
and record the intensity they used and where it came from."""

from __future__ import annotations

import json

import pytest
from greenctl.data.records import Profile, Variant

MIX = ["plan", "mix", "--model", "m", "--rate", "20", "--slo-ms", "60", "--json"]
MIG = [
    "plan",
    "mig",
    "--gpu",
    "A30",
    "--gpus",
    "2",
    "--model",
    "albert",
    "--rate",
    "1",
    "--sla-ms",
    "5000",
    "--json",
]


@pytest.fixture
def mix_store(store):
    store.upsert_variant(Variant("m-small", "m", accuracy=0.7, load_time_s=1.0))
    store.upsert_variant(Variant("m-big", "m", accuracy=0.8, load_time_s=2.0))
    store.add_profiles(
        Profile(
            variant=name,
            resource=f"cpu:{cores}",
            batch=1,
            throughput_rps=1000.0 / p50,
            latency_p50_ms=p50 / cores,
            latency_p99_ms=1.6 * p50 / cores,
            energy_j=0.01 * p50,
            cost_per_hour=0.04 * cores,
        )
        for name, p50 in (("m-small", 8.0), ("m-big", 30.0))
        for cores in (1, 2)
    )
    return store


def _signal(cli, tmp_path, region: str, values: list[float]) -> None:
    f = tmp_path / f"{region}.csv"
    f.write_text(
        "time,carbon_g_per_kwh\n"
        + "".join(f"2024-05-01T{h:02d}:00:00Z,{v}\n" for h, v in enumerate(values))
    )
    r = cli("carbon", "import", f, "--region", region)
    assert r.exit_code == 0, r.output


def test_mix_region_at_uses_the_stored_signal(cli, mix_store, tmp_path):
    _signal(cli, tmp_path, "CISO", [100.0, 300.0, 500.0])
    _signal(cli, tmp_path, "ERCOT", [700.0])
    r = cli(*MIX, "--region", "CISO", "--at", "2024-05-01T01:30:00Z")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 300.0
    assert doc["predicted"]["carbon_intensity_g_per_kwh"] == 300.0
    src = doc["carbon_source"]
    assert src["kind"] == "signal" and src["region"] == "CISO"
    assert src["at"] == "2024-05-01T01:30:00Z" and src["signal_time"] == "2024-05-01T01:00:00Z"
    assert doc["carbon_region"] == "CISO"  # the region `replan` follows
    # without --at: "now", the newest value of a trace that lies in the past, marked stale
    r = cli(*MIX, "--region", "CISO")
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 500.0 and doc["carbon_source"]["stale"] is True
    # the table says where the intensity came from
    r = cli(*MIX[:-1], "--region", "ERCOT")
    assert "carbon intensity 700 gCO2/kWh (signal ERCOT" in " ".join(r.output.split())


def test_flag_wins_and_default_is_recorded(cli, mix_store, tmp_path):
    r = cli(*MIX, "--carbon-intensity", "123")
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 123.0
    assert doc["carbon_source"] == {"kind": "flag", "region": None, "at": None}
    # no flag, no signal: the reference intensity, recorded as the default and said so
    r = cli(*MIX)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 400.0
    assert doc["carbon_source"]["kind"] == "default"
    assert any("reference 400" in n for n in doc["notes"])
    r = cli(*MIX[:-1])
    assert "(DEFAULT: no --carbon-intensity or --region)" in " ".join(r.output.split())
    # two regions and none chosen: still the default, naming the regions
    _signal(cli, tmp_path, "CISO", [100.0])
    _signal(cli, tmp_path, "ERCOT", [700.0])
    doc = json.loads(cli(*MIX).stdout)
    assert doc["carbon_source"]["kind"] == "default"
    assert any("CISO, ERCOT" in n for n in doc["notes"])


def test_the_only_region_is_used_and_said(cli, mix_store, tmp_path):
    _signal(cli, tmp_path, "CISO", [250.0])
    r = cli(*MIX)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 250.0
    assert doc["carbon_source"]["kind"] == "signal" and doc["carbon_source"]["region"] == "CISO"
    assert any("the only region in the store" in n for n in doc["notes"])


def test_unknown_region_exits_2_naming_it_and_the_known_ones(cli, mix_store, tmp_path):
    _signal(cli, tmp_path, "CISO", [250.0])
    for cmd in (MIX, MIG):
        r = cli(*cmd, "--region", "PJM")
        assert r.exit_code == 2, r.output
        assert "no carbon signal for region 'PJM'" in r.output and "CISO" in r.output
    r = cli(*MIX, "--region", "CISO", "--at", "2020-01-01T00:00:00Z")
    assert r.exit_code == 2 and "first value is at 2024-05-01T00:00:00Z" in r.output
    r = cli(*MIX, "--region", "CISO", "--at", "yesterday")
    assert r.exit_code == 2 and "--at" in r.output
    r = cli(*MIX, "--carbon-intensity", "100", "--at", "2024-05-01T00:00:00Z")
    assert r.exit_code == 2 and "cannot be combined" in r.output
    assert cli("plan", "list", "--json").stdout.strip() == "[]"


def test_mig_takes_the_region_signal(cli, tmp_path):
    assert cli("mig", "synth", "--gpu", "A30", "--family", "albert").exit_code == 0
    r = cli(*MIG)
    assert r.exit_code == 2 and "--carbon-intensity G or --region R" in r.output
    _signal(cli, tmp_path, "CISO", [150.0, 350.0])
    _signal(cli, tmp_path, "ERCOT", [700.0])
    r = cli(*MIG, "--region", "CISO", "--at", "2024-05-01T01:00:00Z")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 350.0
    assert doc["carbon_source"]["kind"] == "signal" and doc["carbon_region"] == "CISO"
    r = cli(*MIG, "--carbon-intensity", "90")
    doc = json.loads(r.stdout)
    assert doc["request"]["carbon_intensity"] == 90.0 and doc["carbon_source"]["kind"] == "flag"
    r = cli(*MIG[:-1], "--region", "ERCOT")
    assert "carbon intensity 700 gCO2/kWh (signal ERCOT" in " ".join(r.output.split())
