"""`greenctl report emissions --format codecarbon`: CodeCarbon's emissions.csv from verified
runs and replan accounting (issue 19)."""

from __future__ import annotations

import pytest
from greenctl.data.emissions import CODECARBON_COLUMNS
from greenctl.data.plan import Deployment, Plan

#: CodeCarbon 3.3.2's EmissionsData fields, in order (codecarbon/output_methods/emissions_data.py),
#: written out here so a change to greenctl's list is caught
CODECARBON_3_3 = [
    "timestamp",
    "project_name",
    "run_id",
    "experiment_id",
    "duration",
    "emissions",
    "emissions_rate",
    "cpu_power",
    "gpu_power",
    "ram_power",
    "cpu_energy",
    "gpu_energy",
    "ram_energy",
    "energy_consumed",
    "water_consumed",
    "country_name",
    "country_iso_code",
    "region",
    "cloud_provider",
    "cloud_region",
    "os",
    "python_version",
    "codecarbon_version",
    "cpu_count",
    "cpu_model",
    "gpu_count",
    "gpu_model",
    "longitude",
    "latitude",
    "ram_total_size",
    "tracking_mode",
    "cpu_utilization_percent",
    "gpu_utilization_percent",
    "ram_utilization_percent",
    "ram_used_gb",
    "on_cloud",
    "pue",
    "wue",
]


@pytest.fixture
def scenario(store):
    plan = Plan(
        kind="mix",
        request={"carbon_intensity": 300.0, "pue": 1.2},
        deployments=[
            Deployment("tiny", "tiny-s", "cpu:1", 1, 1, 10.0),
            Deployment("tiny", "tiny-l", "gpu:A100-SXM4-40GB", 1, 1, 10.0),
        ],
        predicted={"rate_rps": 20.0, "energy_j_per_request": 2.0, "water_l_per_request": 1e-6},
        extra={"carbon_region": "CISO"},
    )
    pid = store.save_plan(plan)
    measured = {"rate_rps": 20.0, "duration_s": 10.0}
    energy = {"cpu_j": 100.0, "gpu_j": 300.0, "window_s": 10.5, "sources": ["nvml", "rapl"]}
    store.add_run(
        pid,
        kind="verify",
        predicted=plan.predicted,
        measured={**measured, "energy": energy},
        started_at="2026-11-26T06:00:00Z",
    )
    store.add_run(
        pid, kind="verify", predicted=plan.predicted, measured=measured, started_at="2026-11-26"
    )
    store.add_run(pid, kind="serving", predicted={}, measured={}, started_at="2026-11-26")
    from greenctl.data.loop_state import add_decision

    for at, signal in (("2026-11-26T07:00:00Z", 250.0), ("2026-11-26T08:00:00Z", 500.0)):
        add_decision(
            store,
            {
                "time": at,
                "at": at,
                "lineage": f"plan:{pid}",
                "region": "CISO",
                "signal_g_per_kwh": signal,
                "forecast_rps": 20.0,
                "running_plan_id": pid,
                "action": "hold",
                "applied": 0,
                "reason": "",
            },
        )
    return pid


def test_csv_round_trips_through_pandas_with_codecarbons_columns(cli, scenario, tmp_path):
    pd = pytest.importorskip("pandas")
    out = tmp_path / "emissions.csv"
    r = cli("report", "emissions", "--format", "codecarbon", "-o", out)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "1 measured, 2 modeled" in text and "tracking_mode 'modeled'" in text
    df = pd.read_csv(out)
    assert list(df.columns) == CODECARBON_3_3 == CODECARBON_COLUMNS
    assert len(df) == 3
    measured, modeled, replan = (df.iloc[i] for i in range(3))
    # measured: the executors' counters, x PUE, kWh; kg at the plan's intensity
    kwh = 400.0 * 1.2 / 3.6e6
    assert measured["tracking_mode"] == "machine"
    assert measured["energy_consumed"] == pytest.approx(kwh)
    assert measured["cpu_energy"] == pytest.approx(100 * 1.2 / 3.6e6)
    assert measured["gpu_energy"] == pytest.approx(300 * 1.2 / 3.6e6)
    assert measured["emissions"] == pytest.approx(kwh * 300 / 1000)
    assert measured["duration"] == pytest.approx(10.5)
    assert measured["gpu_power"] == pytest.approx(300 * 1.2 / 10.5)
    assert measured["emissions_rate"] == pytest.approx(kwh * 0.3 / 10.5)
    assert measured["pue"] == pytest.approx(1.2) and measured["region"] == "CISO"
    # water: the plan's water per kWh (its WUE) x energy
    wue = 1e-6 / (2.0 * 1.2 / 3.6e6)
    assert measured["wue"] == pytest.approx(wue)
    assert measured["water_consumed"] == pytest.approx(kwh * wue)
    # modeled: predicted J/request x requests served (20 req/s x 10 s), labelled
    assert modeled["tracking_mode"] == "modeled"
    assert modeled["energy_consumed"] == pytest.approx(2.0 * 200 * 1.2 / 3.6e6)
    # replan accounting: the hour between two decisions at the first one's intensity
    assert replan["tracking_mode"] == "modeled"
    assert replan["duration"] == pytest.approx(3600)
    replan_kwh = 2.0 * 20 * 3600 * 1.2 / 3.6e6
    assert replan["energy_consumed"] == pytest.approx(replan_kwh)
    assert replan["emissions"] == pytest.approx(replan_kwh * 250 / 1000)
    assert replan["timestamp"] == "2026-11-26T08:00:00"
    assert df["run_id"].is_unique and df["project_name"].eq("greenctl").all()


def test_stdout_and_plan_filter(cli, scenario):
    r = cli("report", "emissions", "--plan", scenario)
    assert r.exit_code == 0
    assert r.stdout.splitlines()[0] == ",".join(CODECARBON_COLUMNS)
    assert len(r.stdout.splitlines()) == 4


def test_unknown_format_exits_2_naming_the_fix(cli, scenario):
    r = cli("report", "emissions", "--format", "csv")
    assert r.exit_code == 2
    assert "--format 'csv' is unknown" in r.output and "codecarbon" in r.output


def test_unknown_plan_exits_2(cli, store):
    r = cli("report", "emissions", "--plan", "99")
    assert r.exit_code != 0 and "99" in r.output
