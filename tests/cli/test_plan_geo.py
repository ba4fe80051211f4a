"""CLI tests for `greenctl plan geo` and `greenctl geo convert-eglb`."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from pathlib import Path

import pytest
from greenctl.data.eglb_convert import convert_eglb

SUMMARY_KEYS = {
    "energy_cost_usd_total",
    "energy_cost_usd_avg",
    "carbon_kg_total",
    "carbon_kg_avg",
    "carbon_kg_max",
    "carbon_max_over_avg",
    "water_l_total",
    "water_l_avg",
    "water_l_max",
    "water_max_over_avg",
    "objective",
}
ALGS = [
    "eglb-off",
    "eglb",
    "eglb-mpc",
    "glb-energy",
    "glb-carbon",
    "glb-water",
    "glb-c2",
    "glb-all",
    "nearest",
]


@pytest.fixture
def eglb(tmp_path: Path) -> dict[str, Path]:
    """24 hours of the bundled eGLB traces, partial routes."""
    return convert_eglb(None, tmp_path / "eglb", steps=24, routes="partial")


def _args(paths: dict[str, Path]) -> list[str]:
    args = ["--sites", str(paths["sites"]), "--demand", str(paths["demand"])]
    if "routes" in paths:
        args += ["--routes", str(paths["routes"])]
    return args


def test_json_document_and_allocations(cli, eglb: dict[str, Path], tmp_path: Path) -> None:
    alloc = tmp_path / "alloc.csv"
    r = cli("plan", "geo", *_args(eglb), "--json", "--allocations", alloc)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["kind"] == "geo" and doc["schema"] == "greenctl.plan/v1"
    assert doc["algorithm"] == "eglb-off"
    assert set(doc["summary"]) == SUMMARY_KEYS
    assert [s["site"] for s in doc["sites"]][:2] == ["Texas", "Virginia"]
    assert set(doc["sites"][0]) == {"site", "load_mwh", "energy_cost_usd", "carbon_kg", "water_l"}
    assert "algorithms" not in doc
    assert len(doc["deployments"]) == 10
    assert doc["deployments"][0]["resource"] == "site:Texas"
    # allocations: every gateway's load is served, only on allowed routes, within capacity
    routes = {tuple(row) for row in list(csv.reader(eglb["routes"].open()))[1:]}
    demand = {
        (row["time"], row["gateway"]): float(row["load_mw"])
        for row in csv.DictReader(eglb["demand"].open())
    }
    served: dict[tuple[str, str], float] = defaultdict(float)
    site_load: dict[tuple[str, str], float] = defaultdict(float)
    with alloc.open() as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == ["time", "gateway", "site", "load_mw"]
        for row in reader:
            assert (row["gateway"], row["site"]) in routes
            v = float(row["load_mw"])
            assert v > 0
            served[(row["time"], row["gateway"])] += v
            site_load[(row["time"], row["site"])] += v
    for key, load in demand.items():
        assert served[key] == pytest.approx(load, rel=1e-8, abs=1e-9)
    assert max(site_load.values()) <= 1.0 + 1e-7  # LP tolerance
    total_mwh = sum(s["load_mwh"] for s in doc["sites"])
    assert total_mwh == pytest.approx(sum(demand.values()), rel=1e-8)
    # the plan is in the store
    r = cli("plan", "list", "--kind", "geo", "--json")
    assert [p["id"] for p in json.loads(r.stdout)] == [doc["id"]]


def test_all_algorithms_table_and_plot(cli, eglb: dict[str, Path], tmp_path: Path) -> None:
    png = tmp_path / "geo.png"
    r = cli("plan", "geo", *_args(eglb), "-a", "all", "--horizon", "3", "--plot", png, "--json")
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(r.stdout)
    assert list(doc["algorithms"]) == ALGS
    for block in doc["algorithms"].values():
        assert set(block["summary"]) == SUMMARY_KEYS
        assert len(block["sites"]) == 10
    best = doc["algorithms"]["eglb-off"]["summary"]["objective"]
    assert all(b["summary"]["objective"] >= best * (1 - 1e-7) for b in doc["algorithms"].values())
    # the rich tables (a shorter case)
    short = convert_eglb(None, tmp_path / "short", steps=6)
    r = cli("plan", "geo", *_args(short), "-a", "all", "--horizon", "2")
    assert r.exit_code == 0, r.output
    for name in ALGS:
        assert name in r.output
    assert "plan 2 saved (kind geo)" in r.output


def test_options_reach_the_algorithms(cli, eglb: dict[str, Path]) -> None:
    r = cli(
        "plan", "geo", *_args(eglb), "-a", "eglb", "--eta", "1e-5", "--z-max", "500",
        "--mu-carbon", "0.5", "--mu-water", "0.01", "--json",
    )  # fmt: skip
    doc = json.loads(r.stdout)
    assert doc["request"]["mu_carbon_usd_per_kg"] == 0.5
    s = doc["summary"]
    assert s["objective"] == pytest.approx(
        s["energy_cost_usd_total"] + 0.5 * s["carbon_kg_max"] + 0.01 * s["water_l_max"]
    )
    r = cli(
        "plan", "geo", *_args(eglb), "-a", "eglb-mpc", "--horizon", "3",
        "--forecast", "seasonal", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["request"]["forecast"] == "seasonal"
    r = cli("plan", "geo", *_args(eglb), "-a", "glb-c2", "--weight-carbon", "2", "--json")
    assert json.loads(r.stdout)["request"]["weight_carbon_usd_per_kg"] == 2


def test_plan_file_and_plan_show(cli, eglb: dict[str, Path], tmp_path: Path) -> None:
    from greenctl.data.plan import load_plan_file

    out = tmp_path / "plan.json"
    r = cli("plan", "geo", *_args(eglb), "-a", "glb-energy", "-o", out)
    assert r.exit_code == 0, r.output
    plan = load_plan_file(out)
    assert plan.kind == "geo" and plan.extra["algorithm"] == "glb-energy"
    r = cli("plan", "show", "1")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["summary"] == plan.extra["summary"]


def test_bad_input_exit_2_names_file_and_line(cli, store, eglb: dict[str, Path]) -> None:
    lines = eglb["demand"].read_text().splitlines()
    lines[5] = lines[5].rsplit(",", 1)[0] + ",-1"
    eglb["demand"].write_text("\n".join(lines) + "\n")
    r = cli("plan", "geo", *_args(eglb))
    assert r.exit_code == 2
    assert "demand.csv, line 6, column 'load_mw'" in r.output
    r = cli("plan", "geo", *_args(eglb), "-a", "fastest")
    assert r.exit_code == 2 and "unknown algorithm" in r.output
    r = cli("plan", "list", "--json")
    assert json.loads(r.stdout) == []  # store untouched


def test_infeasible_exit_3_names_step(cli, tmp_path: Path) -> None:
    paths = convert_eglb(None, tmp_path / "e", steps=6)
    (tmp_path / "routes.csv").write_text(
        "gateway,site\n"
        + "".join(f"{g},Texas\n" for g in ("Texas", "Virginia"))
        + "".join(f"{g},Japan\n" for g in ("Georgia", "Nevada", "Germany", "Belguim"))
        + "".join(f"{g},Singapore\n" for g in ("Netherlands", "Denmark", "Japan", "Singapore"))
    )
    r = cli("plan", "geo", *_args(paths), "--routes", tmp_path / "routes.csv")
    assert r.exit_code == 3
    assert "step 0 (2022-09-22T00:00:00Z) is infeasible" in r.output


def test_convert_eglb_command(cli, tmp_path: Path) -> None:
    r = cli("geo", "convert-eglb", "-o", tmp_path / "o", "--routes", "partial", "--steps", "5")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "o" / "routes.csv").exists()
    assert len((tmp_path / "o" / "sites.csv").read_text().splitlines()) == 51
    r = cli("geo", "convert-eglb", tmp_path / "missing", "-o", tmp_path / "p")
    assert r.exit_code == 2 and "does not exist" in r.output


def test_variants_and_min_accuracy(cli, eglb: dict[str, Path], tmp_path: Path) -> None:
    variants = tmp_path / "variants.csv"
    variants.write_text(
        "variant,energy_j_per_request,accuracy\nresnet152,10,0.783\nresnet50,5,0.761\n"
        "resnet18,2.5,0.698\n"
    )
    alloc = tmp_path / "alloc.csv"
    r = cli(
        "plan", "geo", *_args(eglb), "--variants", variants, "--min-accuracy", "0.76",
        "--allocations", alloc, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["summary"]["accuracy_mean"] >= 0.76 - 1e-7
    assert {d["variant"] for d in doc["deployments"]} <= {"resnet152", "resnet50", "resnet18"}
    with alloc.open() as fh:
        rows = list(csv.DictReader(fh))
    assert set(rows[0]) == {"time", "gateway", "site", "load_mw", "variant"}
    demand = sum(float(r["load_mw"]) for r in csv.DictReader(eglb["demand"].open()))
    assert sum(float(r["load_mw"]) for r in rows) == pytest.approx(demand, rel=1e-7)
    r = cli("plan", "geo", *_args(eglb), "--min-accuracy", "0.7")
    assert r.exit_code == 2 and "needs variants" in r.output
    r = cli("plan", "geo", *_args(eglb), "--variants", variants, "--min-accuracy", "0.9")
    assert r.exit_code == 3 and "min-accuracy" in r.output
    r = cli("plan", "geo", *_args(eglb), "--family", "nothing")
    assert r.exit_code == 2 and "no variants of family 'nothing'" in r.output


def test_unwritable_outputs_exit_2_and_save_nothing(
    cli, eglb: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_path: Path
) -> None:
    missing = tmp_path / "missing" / "x"
    for opt in ("-o", "--allocations", "--plot"):
        r = cli("plan", "geo", *_args(eglb), "-a", "glb-energy", opt, missing)
        assert r.exit_code == 2, r.output
        assert f"{opt} {missing}: the folder {missing.parent} does not exist" in " ".join(
            r.output.split()
        )
    r = cli("plan", "geo", *_args(eglb), "-a", "glb-energy", "-o", tmp_path)
    assert r.exit_code == 2 and "is a folder" in r.output
    import greenctl.data.plan as plan_mod

    def fail(plan, path):
        raise OSError(13, "Permission denied")

    monkeypatch.setattr(plan_mod, "write_plan_file", fail)
    r = cli("plan", "geo", *_args(eglb), "-a", "glb-energy", "-o", tmp_path / "p.json")
    assert r.exit_code == 2 and "Permission denied" in r.output
    # nothing saved: the refused command left no store, or one without a plan
    assert not db_path.exists() or cli("plan", "list", "--json").stdout.strip() == "[]"
