"""`greenctl carbon import/show/now/regions/fetch` through the CLI."""

from __future__ import annotations

import json


def test_import_show_json_contract(cli, tmp_path):
    f = tmp_path / "c.csv"
    f.write_text("time,carbon_kg_per_kwh\n2024-05-01T00:00:00Z,0.2\n2024-05-01T01:00:00Z,0.3\n")
    r = cli("carbon", "import", str(f), "--region", "DE")
    assert r.exit_code == 0, r.output
    assert "Imported 2" in r.output
    r = cli("carbon", "show", "--region", "DE", "--json")
    assert r.exit_code == 0
    rows = json.loads(r.stdout)
    assert rows == [
        {
            "time": "2024-05-01T00:00:00Z",
            "region": "DE",
            "carbon_g_per_kwh": 200.0,
            "kind": "average",
            "source": "csv:c.csv",
        },
        {
            "time": "2024-05-01T01:00:00Z",
            "region": "DE",
            "carbon_g_per_kwh": 300.0,
            "kind": "average",
            "source": "csv:c.csv",
        },
    ]
    r = cli("carbon", "show", "--region", "DE", "--at", "2024-05-01T00:59:00Z", "--json")
    assert [x["carbon_g_per_kwh"] for x in json.loads(r.stdout)] == [200.0]
    r = cli("carbon", "now", "--region", "DE")
    assert r.exit_code == 0 and "300.0 gCO2/kWh" in r.output and "stale" in r.output


def test_bundled_and_regions(cli):
    r = cli("carbon", "import", "bundled:clover-ciso-sep", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["rows"] == 49
    r = cli("carbon", "regions", "--json")
    assert json.loads(r.stdout)[0]["region"] == "CISO"


def test_malformed_file_exit_2_and_nothing_stored(cli, tmp_path, db_path):
    f = tmp_path / "bad.csv"
    f.write_text(
        "time,region,carbon_g_per_kwh\n2024-05-01T00:00:00Z,DE,1\n2024-05-01T01:00Z,DE,x\n"
    )
    r = cli("carbon", "import", str(f))
    assert r.exit_code == 2
    assert "bad.csv, line 3, column 'carbon_g_per_kwh'" in r.output
    assert not db_path.exists()  # a refused import leaves no store behind


def test_fetch_not_configured(cli, monkeypatch):
    monkeypatch.delenv("ELECTRICITYMAPS_TOKEN", raising=False)
    r = cli("carbon", "fetch", "--region", "DE", "--provider", "electricitymaps")
    assert r.exit_code == 2 and "ELECTRICITYMAPS_TOKEN" in r.output
