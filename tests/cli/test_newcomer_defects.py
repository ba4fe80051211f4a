"""What a new user met trying the README's commands: a profile table with values under the
wrong headers, an unknown family that listed no known ones, a refused budget that was
refused only after minutes of service modelling, replan and plan mix deciding the carbon
region by different rules, an export re-imported as duplicates, and simulate losing the
carbon and cost plan mix predicted."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

HEADER = "variant,model,resource,batch,throughput_rps,latency_ms"


@pytest.fixture
def wide(monkeypatch):
    """A wide console, so that no table cell is folded."""
    from greenctl.cli import common

    monkeypatch.setattr(common.console, "width", 250)


def table_cells(output: str) -> list[dict[str, str]]:
    """The rows of the last rich table in ``output``, as {header: cell}."""
    lines = output.splitlines()
    head = max(i for i, line in enumerate(lines) if line.startswith("┃"))
    headers = [h.strip() for h in lines[head].strip("┃").split("┃")]
    rows = []
    for line in lines[head + 1 :]:
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            rows.append(dict(zip(headers, cells, strict=True)))
    return rows


# -- profile show: every value under its own header -------------------------------------------
@pytest.mark.parametrize("command", [("show", "v1"), ("list",), ("list", "--all")])
def test_profile_tables_put_each_value_under_its_header(cli, tmp_path: Path, wide, command):
    path = tmp_path / "p.csv"
    path.write_text(
        f"{HEADER},power_w,energy_j,energy_method,capacity_rps,capacity_slo_ms,samples\n"
        "v1,fam,cpu:1,1,10,5,41.5,4.15,rapl,8.5,250,77\n"
    )
    assert cli("profile", "import", path).exit_code == 0
    r = cli("profile", *command)
    assert r.exit_code == 0, r.output
    [row] = table_cells(r.output)
    figures = {"power W": 41.5, "J/req": 4.15, "cap req/s": 8.5, "cap SLO ms": 250, "req/s": 10}
    assert {h: float(row[h]) for h in figures} == figures
    assert row["energy"] == "rapl"
    assert row.get("samples", "77") == "77"


@pytest.mark.parametrize("command", [("show", "v1"), ("list",)])
def test_profile_tables_label_modeled_energy(cli, tmp_path: Path, wide, command):
    path = tmp_path / "p.csv"
    path.write_text(f"{HEADER},power_w,energy_j,energy_method\nv1,fam,cpu:1,1,10,5,9,0.9,modeled\n")
    assert cli("profile", "import", path).exit_code == 0
    r = cli("profile", *command)
    assert r.exit_code == 0, r.output
    assert "energy 'modeled' = CPU power model, not measured" in r.output


# -- an unknown family names the known ones ----------------------------------------------------
@pytest.fixture
def tiny_profiles(cli, tmp_path: Path) -> None:
    """A profiled family 'tiny' (imported: the planner needs no measuring here)."""
    path = tmp_path / "tiny.csv"
    path.write_text(f"{HEADER},accuracy,power_w\ntiny-s,tiny,cpu:1,1,200,4,0.5,10\n")
    assert cli("profile", "import", path).exit_code == 0


def test_plan_mix_of_an_unknown_family_names_the_known_ones_and_the_close_one(cli, tiny_profiles):
    r = cli("plan", "mix", "--model", "tinyy", "--rate", "10", "--slo-ms", "100")
    assert r.exit_code == 2, r.output
    assert "unknown model family 'tinyy'" in r.stderr
    assert "known families: tiny" in r.stderr and "did you mean 'tiny'?" in r.stderr
    assert "none" not in r.stderr


# -- a refused budget is refused before any service model is built ------------------------------
def test_a_budget_no_profile_uses_is_refused_before_building_service_models(
    cli, store, monkeypatch
):
    from greenctl.data.gpulet_import import import_gpulet
    from greenctl.planner.core import queueing, service
    from greenctl.planner.mix import options

    import_gpulet(store, Path(__file__).resolve().parents[2] / "data" / "datasets" / "gpulet")

    def built(*args, **kwargs):
        raise AssertionError("a service model was built for a request refused anyway")

    # the planning modules, imported before patching (some bind the builders at their top)
    for name in ("executor.kinds", "executor.runtime.serving", "planner.core.evaluate"):
        importlib.import_module(f"greenctl.{name}")

    builders = [
        queueing.dynamic_batch,
        queueing.capacity_at_slo,
        queueing.batch_capacity_at_slo,
        service.service_time,
        service.batch_service,
        options.make_option,
    ]
    # every name a builder is bound to (a module that imported it at its top too)
    for module in [m for name, m in sys.modules.items() if name.startswith("greenctl.")]:
        for attr, value in list(vars(module).items()):
            if any(value is b for b in builders):
                monkeypatch.setattr(module, attr, built)
    r = cli(
        "plan", "mix", "--model", "resnet", "--rate", "75", "--slo-ms", "750", "--budget", "cpu=14"
    )
    assert r.exit_code == 2, r.output
    assert "budget for unknown resource kind 'cpu'" in r.stderr
    assert "mps:100" in r.stderr  # the kinds and labels it could budget


# -- replan and plan mix take the same region --------------------------------------------------
def test_replan_takes_the_only_region_as_plan_mix_does(cli, store, tiny_profiles):
    import json

    from greenctl.data import carbon_io

    plan = ("plan", "mix", "--model", "tiny", "--rate", "10", "--slo-ms", "100", "--json")
    r = cli(*plan, "--carbon-intensity", "300")  # planned before any signal was stored
    assert r.exit_code == 0, r.output
    pid = json.loads(r.stdout)["id"]
    carbon_io.import_bundled(store, "clover-ciso-march", region="ciso")
    r = cli(*plan)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["carbon_region"] == "ciso"
    r = cli("replan", "--plan", pid, "--json")
    assert r.exit_code == 0, r.output
    decision = json.loads(r.stdout)
    assert decision["region"] == "ciso" and decision["signal_g_per_kwh"] is not None
    # two regions and none named: neither decides, both say so
    carbon_io.import_bundled(store, "clover-ciso-sep", region="other")
    r = cli("replan", "--plan", pid)
    assert r.exit_code == 2 and "no carbon region" in r.stderr


# -- an export re-imported into its store adds nothing -----------------------------------------
@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_reimporting_an_export_of_measured_profiles_stores_nothing_twice(
    cli, store, tmp_path: Path, fmt
):
    """Measured rows point at this store's hardware row (``hardware_id``), which a file does
    not carry: the same rows read back are the same measurements, not new ones."""
    import json

    from greenctl.data.records import Hardware, Profile, Variant

    hw = store.add_hardware(Hardware(host="box", kind="cpu", model_name="AMD EPYC", cores=2))
    store.upsert_variant(Variant("tiny-s", "tiny", accuracy=0.5))
    store.add_profiles(
        Profile(
            "tiny-s",
            "cpu:1",
            batch,
            1000.0 / (batch + 2),
            latency_p50_ms=0.1 * batch,
            hardware="AMD EPYC",
            hardware_id=hw,
            power_w=7.98,
            energy_j=0.00145,
            energy_method="modeled",
            samples=100,
        )
        for batch in (1, 2, 4)
    )
    out = tmp_path / f"profiles.{fmt}"
    assert cli("profile", "export", "-o", out).exit_code == 0
    if fmt == "json":  # the format follows the file's name, as import reads it
        assert len(json.loads(out.read_text())) == 3
    r = cli("profile", "import", out, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert (doc["profiles"], doc["already_present"]) == (0, 3)
    assert store.profile_count() == 3


# -- simulate evaluates a plan at the carbon intensity and prices plan mix used -----------------
@pytest.mark.parametrize("method", [(), ("--analytic",)])
def test_simulate_shows_the_carbon_and_cost_plan_mix_predicted(
    cli, tiny_profiles, tmp_path: Path, wide, method
):
    import json

    out = tmp_path / "plan.json"
    r = cli(
        "plan", "mix", "--model", "tiny", "--rate", "50", "--slo-ms", "100",
        "--carbon-intensity", "300", "-o", out, "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    predicted = json.loads(r.stdout)["predicted"]
    assert predicted["carbon_g_per_request"] > 0 and predicted["cost_per_hour"] > 0
    r = cli("simulate", out, *method, "--requests", "5000", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["carbon_g_per_request"] == pytest.approx(predicted["carbon_g_per_request"], rel=0.1)
    assert got["cost_per_hour"] == pytest.approx(predicted["cost_per_hour"])
    assert got["cost_priced"] is False  # the profile has no price: its cores per hour stand in
    # the table says which intensity and what the cost counts
    r = cli("simulate", out, *method, "--requests", "5000")
    rows = {
        line.split("│")[1].strip(): line.split("│")[2].strip()
        for line in r.output.splitlines()
        if line.startswith("│")
    }
    assert rows["carbon per request"] != "-" and rows["cost"] != "-"
    text = " ".join(r.output.split())  # the caption wraps at the table's width
    assert "the plan's carbon intensity 300 gCO2/kWh (--carbon-intensity)" in text
    assert "cost: resource amount per hour" in text
    # an intensity given to simulate wins
    r = cli("simulate", out, *method, "--requests", "5000", "--carbon-intensity", "600", "--json")
    doubled = json.loads(r.stdout)["carbon_g_per_request"]
    assert doubled == pytest.approx(2 * got["carbon_g_per_request"], rel=1e-9)
