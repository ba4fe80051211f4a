"""planner.solvers: silent HiGHS construction, one thread count, one status mapping, CBC.

The fresh-process tests run the CLI in a subprocess: HiGHS prints its banner on file
descriptor 1 (which CliRunner does not capture) at the first construction of a process,
and its thread pool is process-wide, so only a new process shows both as a user sees them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.eglb_convert import convert_eglb
from greenctl.data.errors import GreenctlError, InfeasiblePlan, InputError
from greenctl.data.records import Profile, Variant
from greenctl.planner.core import solvers

REPO = Path(__file__).resolve().parents[2]
MAIN = "from greenctl.cli.main import main; main()"


def _greenctl(*args: str) -> subprocess.CompletedProcess[str]:
    """``greenctl ARGS`` in a new process (GREENCTL_DB from the per-test fixture)."""
    return subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", MAIN, *args],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=300,
        check=False,
    )


def _one_json_document(out: subprocess.CompletedProcess[str]) -> dict:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Running HiGHS" not in out.stdout  # the banner
    return json.loads(out.stdout)  # the whole of stdout is one document


@pytest.fixture
def tiny_store(store):
    """One family of two variants load-tested on cpu:1/2/4."""
    store.upsert_variant(Variant("m-small", "m", accuracy=0.70, load_time_s=2.0))
    store.upsert_variant(Variant("m-big", "m", accuracy=0.80, load_time_s=5.0))
    rows = []
    for name, base in (("m-small", 8.0), ("m-big", 30.0)):
        for cores in (1, 2, 4):
            p50 = base / cores**0.8
            rows.append(
                Profile(
                    variant=name,
                    resource=f"cpu:{cores}",
                    batch=1,
                    throughput_rps=1000.0 / p50,
                    latency_p50_ms=p50,
                    latency_p99_ms=p50 * 1.6,
                    energy_j=0.01 * cores * p50,
                    cost_per_hour=0.04 * cores,
                    capacity_rps=0.7 * 1000.0 / p50,
                    capacity_slo_ms=50.0,
                )
            )
    store.add_profiles(rows)
    return store


MIX_ARGS = ("plan", "mix", "--model", "m", "--rate", "60", "--slo-ms", "200", "--budget", "cpu=8")


# -- --json is one JSON document in a fresh process -----------------------------------------------
def test_plan_geo_all_json_in_a_fresh_process(tmp_path: Path) -> None:
    """Issue 16: the banner broke --json, and after eglb-off's solve on HiGHS's default
    thread pool the online eglb asked for one thread, got "Not Set" and was reported as
    an infeasible step (exit 3); each algorithm alone worked."""
    paths = convert_eglb(None, tmp_path / "eglb", steps=48, routes="partial")
    out = _greenctl(
        "plan", "geo", "--sites", str(paths["sites"]), "--demand", str(paths["demand"]),
        "--routes", str(paths["routes"]), "--algorithm", "all", "--json",
    )  # fmt: skip
    doc = _one_json_document(out)
    assert doc["kind"] == "geo"
    assert {"eglb-off", "eglb", "eglb-mpc", "glb-energy"} <= set(doc["algorithms"])


def test_plan_mix_json_in_a_fresh_process(tiny_store) -> None:
    doc = _one_json_document(_greenctl(*MIX_ARGS, "--json"))
    assert doc["kind"] == "mix" and doc["solver"]["status"] == "optimal"


def test_plan_mig_json_in_a_fresh_process(cli) -> None:
    r = cli("mig", "synth", "--gpu", "H100-80GB", "--family", "efficientnet")
    assert r.exit_code == 0, r.output
    out = _greenctl(
        "plan", "mig", "--gpu", "H100-80GB", "--gpus", "8", "--model", "efficientnet",
        "--rate", "300", "--carbon-intensity", "250", "--json",
    )  # fmt: skip
    doc = _one_json_document(out)
    assert doc["kind"] == "mig" and doc["solver"]["name"] == "exact"


def test_first_construction_prints_nothing_and_restores_stdout() -> None:
    code = (
        "import os\nfrom greenctl.planner.core import solvers\n"
        "print('before', flush=True)\nsolvers.new_highs()\nsolvers.new_highs()\n"
        "print('after', flush=True)\nos.write(1, b'fd1\\n')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "before\nafter\nfd1\n"


def _option(h, key: str):
    value = h.getOptionValue(key)  # (status, value) in highspy >= 1.8
    return value[1] if isinstance(value, tuple) else value


# -- construction -----------------------------------------------------------------------------
def test_every_highs_object_is_silent_and_on_the_process_thread_count() -> None:
    h = solvers.new_highs({"presolve": "off"})
    assert _option(h, "threads") == solvers.HIGHS_THREADS
    assert _option(h, "output_flag") is False
    assert _option(h, "presolve") == "off"
    with pytest.raises(ValueError, match="threads"):
        solvers.new_highs({"threads": 4})
    with pytest.raises(ValueError, match="no_such_option"):
        solvers.new_highs({"no_such_option": 1})


def test_no_module_builds_a_solver_outside_planner_solvers() -> None:
    """One place constructs HiGHS / CBC objects; pulp only through its 4.0 API."""
    banned = {
        "highspy.Highs(": "solvers.new_highs()",
        "pulp.HiGHS(": "solvers.pulp_highs()",
        "PULP_CBC_CMD": "solvers.cbc_solver()",
        "COIN_CMD(": "solvers.cbc_solver()",
        "pulp.LpVariable(": "prob.add_variable(...)",
        "LpVariable.dicts": "prob.add_variable_dicts(...)",
    }
    offenders = []
    for folder in ("cli", "data", "planner", "profiler", "executor", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "solvers.py" and folder == "planner":
                continue
            text = path.read_text(encoding="utf-8")
            offenders += [
                f"{path.relative_to(REPO)}: {b} (use {u})" for b, u in banned.items() if b in text
            ]
    assert offenders == []


# -- statuses ---------------------------------------------------------------------------------
def _lp(h, upper: float, demand: float):
    """min x0 + 2 x1, 0 <= x <= upper, x0 + x1 >= demand."""
    h.addVars(2, np.zeros(2), np.full(2, upper))
    h.changeColsCost(2, np.array([0, 1], dtype=np.int32), np.array([1.0, 2.0]))
    h.addRow(demand, np.inf, 2, np.array([0, 1], dtype=np.int32), np.array([1.0, 1.0]))
    h.run()
    return h


def test_status_mapper_not_set_is_a_solver_failure_exit_1_not_infeasible() -> None:
    h = solvers.new_highs()  # never run: model status "Not Set", as after a thread clash
    with pytest.raises(GreenctlError) as info:
        solvers.highs_outcome(h, what="the test LP", limits=True)
    assert not isinstance(info.value, InfeasiblePlan)
    assert info.value.exit_code == 1
    assert "Not Set" in info.value.message and "the test LP" in info.value.message
    assert "infeasible" not in info.value.message.lower()
    assert "thread pool" in (info.value.hint or "")


def test_status_mapper_optimal_infeasible_and_limits() -> None:
    assert solvers.highs_outcome(_lp(solvers.new_highs(), 5, 3), what="t") == solvers.OPTIMAL
    assert solvers.highs_outcome(_lp(solvers.new_highs(), 1, 3), what="t") == solvers.INFEASIBLE
    stopped = _lp(solvers.new_highs({"simplex_iteration_limit": 0, "presolve": "off"}), 5, 3)
    assert solvers.highs_outcome(stopped, what="t", limits=True) == solvers.LIMIT
    with pytest.raises(GreenctlError, match="Iteration limit") as info:
        solvers.highs_outcome(stopped, what="t")  # where no incumbent is kept: a failure
    assert info.value.exit_code == 1


@pytest.mark.parametrize("kind", ["geo", "mix", "mig"])
def test_a_highs_run_that_does_not_solve_is_exit_1_not_infeasible(
    kind, cli, tiny_store, tmp_path, monkeypatch
) -> None:
    """Every planner, through the CLI: a HiGHS run that leaves the model status "Not Set"
    (what a thread-pool clash gave) is exit 1 naming the status, never exit 3."""
    import highspy

    if kind == "geo":
        paths = convert_eglb(None, tmp_path / "eglb", steps=6, routes="partial")
        args = [
            "plan", "geo", "--sites", paths["sites"], "--demand", paths["demand"],
            "--routes", paths["routes"], "--algorithm", "eglb-off",
        ]  # fmt: skip
    elif kind == "mix":
        args = list(MIX_ARGS)
    else:
        assert cli("mig", "synth", "--gpu", "H100-80GB", "--family", "efficientnet").exit_code == 0
        args = [
            "plan", "mig", "--gpu", "H100-80GB", "--gpus", "8", "--model", "efficientnet",
            "--rate", "300", "--carbon-intensity", "250", "--solver", "exact",
        ]  # fmt: skip
    monkeypatch.setattr(highspy.Highs, "run", lambda self: highspy.HighsStatus.kError)
    r = cli(*args)
    assert r.exit_code == 1, r.output
    text = " ".join(r.output.split())
    assert "solver failed" in text and "Not Set" in text
    assert "is infeasible" not in text and "no MIG configuration" not in text


# -- pulp: the 4.0 API, no deprecation warnings; CBC --------------------------------------------
def test_pulp_models_solve_without_deprecation_warnings(cli, tiny_store) -> None:
    """PuLP 3.3 warns about every API PuLP 4 removes; greenctl uses none of them."""
    from greenctl.data.mig_geometry import resolve_gpu
    from greenctl.planner.core.synthetic import synthetic_family
    from greenctl.planner.mig.solve import build_problem, plan_mig

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        if solvers.find_cbc() is not None:
            r = cli(*MIX_ARGS, "--solver", "cbc", "--json")
            assert r.exit_code == 0, r.output
            assert json.loads(r.stdout)["solver"]["name"] == "cbc"
        geo = resolve_gpu("H100-80GB")
        variants, profiles = synthetic_family(geo, "efficientnet")
        prob = build_problem(
            geo, profiles, variants, family="efficientnet", gpus=8, rate_rps=300.0,
            carbon_intensity=250.0,
        )  # fmt: skip
        plan = plan_mig(prob)
    assert plan.extra["solver"]["name"] == "exact"
    assert plan.extra["solver"]["backend"] == "HiGHS via PuLP"


def test_pulp_highs_runs_on_greenctls_highs_object() -> None:
    import pulp

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        prob = pulp.LpProblem("t", pulp.LpMaximize)
        x = prob.add_variable("x", 0, 3, cat=pulp.LpInteger)
        prob += x <= 2.5
        prob += x
        prob.solve(solvers.pulp_highs({"mip_rel_gap": 0.0}))
    assert solvers.highs_outcome(prob.solverModel, what="t") == solvers.OPTIMAL
    assert _option(prob.solverModel, "threads") == solvers.HIGHS_THREADS
    assert x.varValue == pytest.approx(2.0)


def test_plan_mix_cbc_without_cbc_is_exit_2_with_the_install_hint(
    cli, tiny_store, monkeypatch
) -> None:
    monkeypatch.setattr(solvers, "find_cbc", lambda: None)
    before = tiny_store.plans()
    r = cli(*MIX_ARGS, "--solver", "cbc", "--json")
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())
    assert "--solver cbc" in text and "no CBC solver is installed" in text
    assert "cbcbox" in text and "--solver highs" in text
    assert tiny_store.plans() == before  # nothing saved
    with pytest.raises(InputError, match="no CBC"):
        solvers.require_cbc()


def test_find_cbc_prefers_cbcbox_then_path(monkeypatch, tmp_path) -> None:
    exe = tmp_path / "bin" / "cbc"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.setitem(sys.modules, "cbcbox", None)  # not installed
    monkeypatch.setenv("PATH", str(exe.parent))
    assert solvers.find_cbc() == str(exe)
    box = type(sys)("cbcbox")
    box.cbc_bin_path = lambda: str(exe)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cbcbox", box)
    monkeypatch.setenv("PATH", "")
    assert solvers.find_cbc() == str(exe)
    assert "cbcbox" in solvers.CBC_INSTALL_HINT
