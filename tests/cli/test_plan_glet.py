"""CLI: gpulet import, interference fit/show, plan glet."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from greenctl.data.bundled import path_of

GPULET = path_of("gpulet")


@pytest.fixture(scope="module")
def prepared_db(tmp_path_factory) -> Path:
    """A store with the gpulet reference imported and an interference model fitted."""
    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.data.store import open_store
    from greenctl.executor.control.interference import fit_and_store

    path = tmp_path_factory.mktemp("glet") / "base.db"
    with open_store(path) as store:
        import_gpulet(store, GPULET)
        fit_and_store(store, source="test")
    return path


@pytest.fixture
def db(prepared_db, tmp_path) -> str:
    from greenctl.data.store import open_store

    # a private copy per test (checkpoint the WAL first so the copy is complete)
    with open_store(prepared_db) as s:
        s.db.execute("pragma wal_checkpoint(truncate)")
    target = tmp_path / "g.db"
    shutil.copy(prepared_db, target)
    return str(target)


MODELS = ["--model", "resnet50:400:25", "--model", "vgg16:300:30", "--model", "mobilenet:800:20"]


def test_plan_glet_json_and_output_file(cli, db, tmp_path):
    out = tmp_path / "plan.json"
    r = cli(
        "plan", "glet", *MODELS, "--db", db, "--json", "-o", str(out), "--simulate-seconds", "3"
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "glet" and doc["schema"] == "greenctl.plan/v1"
    assert doc["predicted"]["gpus"] == len(doc["gpus"]) >= 1
    g = doc["gpus"][0]
    assert set(g) >= {"index", "glets"}
    assert set(g["glets"][0]) >= {"partition", "resource", "models"}
    assert set(g["glets"][0]["models"][0]) >= {
        "model",
        "variant",
        "batch",
        "rate_rps",
        "duty_cycle_ms",
    }
    per = {p["model"]: p for p in doc["predicted"]["per_model"]}
    assert set(per) == {"resnet50", "vgg16", "mobilenet"}
    assert all(p["slo_met"] and p["p99_ms"] <= p["slo_ms"] for p in per.values())
    assert all("p99_ms_simulated" in p for p in per.values())
    assert doc["request"]["interference"]["coefficients"]
    from greenctl.data.plan import load_plan_file

    assert load_plan_file(out).predicted["gpus"] == doc["predicted"]["gpus"]
    r = cli("plan", "list", "--kind", "glet", "--db", db, "--json")
    assert len(json.loads(r.stdout)) == 1


def test_plan_glet_table_spec_and_algorithms(cli, db, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'max_gpus = 4\n[[models]]\nname = "inception"\nrate_rps = 200\nslo_ms = 30\n'
        '[[models]]\nname = "densenet121"\nrate_rps = 300\nslo_ms = 40\n'
    )
    for algo in ("glet", "sbp", "greedy", "ideal"):
        r = cli(
            "plan",
            "glet",
            "--spec",
            str(spec),
            "--algorithm",
            algo,
            "--db",
            db,
            "--simulate-seconds",
            "1",
        )
        assert r.exit_code == 0, r.output
        assert "inception" in r.output and "modeled" in r.output
    r = cli(
        "plan",
        "glet",
        "--spec",
        str(spec),
        "--no-interference",
        "--db",
        db,
        "--json",
        "--simulate-seconds",
        "0",
    )
    doc = json.loads(r.stdout)
    assert doc["request"]["interference"] is None


def test_infeasible_model_exit_3_names_it(cli, db):
    r = cli(
        "plan", "glet", "--model", "resnet50:100:25", "--model", "densenet201:50:10", "--db", db
    )
    assert r.exit_code == 3
    assert "densenet201" in r.output and "resnet50 (" not in r.output


def test_bad_inputs_exit_2(cli, db):
    r = cli("plan", "glet", "--model", "resnet50:100", "--db", db)
    assert r.exit_code == 2 and "NAME:RATE:SLO_MS" in r.output
    r = cli("plan", "glet", "--model", "nosuch:100:20", "--db", db)
    assert r.exit_code == 2 and "unknown model 'nosuch'" in r.output
    r = cli("plan", "glet", "--db", db)
    assert r.exit_code == 2 and "no models" in r.output
    r = cli("plan", "glet", *MODELS, "--algorithm", "magic", "--db", db)
    assert r.exit_code == 2


def test_interference_fit_and_show(cli, db):
    r = cli("interference", "fit", "--db", db, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert len(doc["coefficients"]) == 5 and doc["n_test"] > 0
    assert 0 < doc["errors"]["p90"] < 1
    r = cli("interference", "show", str(doc["id"]), "--db", db)
    assert r.exit_code == 0 and "10.26" in r.output
    r = cli("interference", "show", "999", "--db", db)
    assert r.exit_code == 2


def test_plan_without_interference_model_notes_it(cli, tmp_path):
    d = tmp_path / "gp"
    d.mkdir()
    shutil.copy(GPULET / "inference.csv", d / "inference.csv")
    db = str(tmp_path / "n.db")
    assert cli("gpulet", "import", str(d), "--db", db).exit_code == 0
    r = cli("plan", "glet", *MODELS, "--db", db, "--json", "--simulate-seconds", "0")
    assert r.exit_code == 0, r.output
    assert any("no interference model" in n for n in json.loads(r.stdout)["notes"])
    r = cli("interference", "fit", "--db", db)
    assert r.exit_code == 2 and "only 0 usable" in r.output


def test_unwritable_output_exit_2_and_saves_nothing(cli, db, tmp_path):
    r = cli("plan", "glet", *MODELS, "--db", db, "-o", tmp_path / "missing" / "plan.json")
    assert r.exit_code == 2 and "does not exist" in r.output
    assert cli("plan", "list", "--db", db, "--json").stdout.strip() == "[]"
