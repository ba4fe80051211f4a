"""The dispatcher's energy and carbon per model (issue 19): the sums of its executors' counters,
counted across an executor's restart as Prometheus's ``increase()`` counts a reset, the grid
intensity of the running plan, and executors kept by a replan counting carbon at the new
plan's intensity without a restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from greenctl.executor.runtime.metrics import (
    CARBON_TOTAL,
    ENERGY_TOTAL,
    GRID_INTENSITY,
    EnergyExport,
    IncreaseSum,
    carbon_g,
    model_energy_lines,
    parse_prometheus,
)

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(120)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
J_PER_REQUEST = 0.5


# -- the sums, in-process ------------------------------------------------------------------------
def test_increase_sum_counts_resets_new_processes_and_baselines():
    s = IncreaseSum()
    into = (ENERGY_TOTAL, "m", "modeled")
    s.observe(("a", 1), 10.0, into)  # a process first seen: counts from zero
    s.observe(("a", 1), 15.0, into)
    s.observe(("a", 1), 4.0, into)  # a reset (counter restarted): counts whole
    s.observe(("a", 2), 3.0, into)  # the next process of the instance
    s.observe(("b", 7), 100.0, into, baseline=True)  # counted by a dispatcher before this one
    s.observe(("b", 7), 101.0, into)
    assert s.totals[into] == pytest.approx(10 + 5 + 4 + 3 + 1)
    s.keep(lambda series: series == ("a", 2))
    s.observe(("b", 7), 102.0, into)  # forgotten: seen anew (its total stays)
    assert s.totals[into] == pytest.approx(23 + 102)
    lines = model_energy_lines(s.totals, 250.0)
    assert f'{ENERGY_TOTAL}{{model="m",source="modeled"}} 125.0' in lines
    assert f"{GRID_INTENSITY} 250" in lines
    assert any("no greenctl_grid" in x for x in model_energy_lines({}, None))


def test_only_a_dispatcher_that_replaced_another_baselines_older_executors(tmp_path):
    """A first dispatcher counts its executors' counters from zero although they started
    before it (nobody summed them: a first scrape after some requests must not drop them);
    one restarted on its predecessor's table counts from what it first reads."""
    from greenctl.executor.runtime.dispatcher import Backend, Dispatcher

    disp = Dispatcher(token="t", db=None, max_queue=8, state_dir=tmp_path)
    older = Backend({"id": "a", "url": "http://127.0.0.1:1", "pid": 1, "pid_start": "1"})
    assert int(disp.started_ticks or 0) > 1
    assert not disp._predates(older)
    disp.succeeds = True
    assert disp._predates(older)


class _Counter:
    source = "modeled"

    def __init__(self) -> None:
        self.j = 0.0

    def joules(self) -> float:
        return self.j


def test_a_new_intensity_counts_from_now_on_and_the_counter_never_goes_back():
    counter = _Counter()
    export = EnergyExport(counter, carbon_g_per_kwh=400.0, pue=1.5)
    counter.j = 3.6e6  # 1 kWh at 400 g x 1.5
    export.set_carbon(100.0, 1.0)
    counter.j = 2 * 3.6e6  # one more kWh at 100 g x 1
    flat = parse_prometheus("\n".join(export.render('model="m"')))
    assert flat[f'{CARBON_TOTAL}{{model="m",source="modeled"}}'] == pytest.approx(600.0 + 100.0)
    assert flat[f'{GRID_INTENSITY}{{model="m"}}'] == 100.0


def test_a_routing_table_with_a_bad_carbon_is_refused():
    from greenctl.executor.runtime.dispatcher import Dispatcher

    d = Dispatcher(token="t", db=None, max_queue=4, state_dir=None)  # type: ignore[arg-type]
    d.set_routes({"models": {}, "carbon": {"carbon_g_per_kwh": 300, "pue": 1.2}})
    assert d.routes_doc()["carbon"] == {"carbon_g_per_kwh": 300.0, "pue": 1.2}
    d.set_routes({"models": {}})  # an older apply's table: the intensity in force stays
    assert d.carbon == {"carbon_g_per_kwh": 300.0, "pue": 1.2}
    for bad in ({"carbon_g_per_kwh": -1}, {"carbon_g_per_kwh": 300, "pue": 0.5}, "x"):
        with pytest.raises(ValueError):
            d.set_routes({"models": {}, "carbon": bad})
    assert d.carbon == {"carbon_g_per_kwh": 300.0, "pue": 1.2}


# -- real processes ----------------------------------------------------------------------------
def _executor_argv(tmp_path: Path, name: str) -> tuple[list[str], Path]:
    state = tmp_path / f"{name}.json"
    argv = [
        sys.executable,
        "-m",
        "greenctl.executor.runtime.daemon",
        "--model",
        "m",
        "--variant",
        "v",
    ]
    argv += ["--loader", NOOP, "--input-shape", "4", "--state-file", str(state)]
    argv += ["--resource", "cpu:1", "--energy-source", "modeled", "--idle-power-w", "0"]
    argv += ["--energy-j-per-request", str(J_PER_REQUEST), "--carbon-intensity", "400"]
    return argv, state


def _wait_state(state: Path, *, not_pid: int | None = None, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(state.read_text())
            assert "error" not in doc, doc["error"]
            if doc.get("ready") and doc.get("pid") != not_pid:
                return doc
        time.sleep(0.05)
    raise AssertionError(f"{state} not ready")


def _metrics(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        return parse_prometheus(r.read().decode())


def _sum(flat: dict[str, float], name: str) -> float:
    return sum(v for k, v in flat.items() if k.startswith(name + "{"))


@pytest.fixture
def pair(tmp_path: Path, pids_mentioning):
    """Two executors (modeled: 0.5 J a request, no idle power, 400 g/kWh) behind a real
    dispatcher that supervises them and reads their counters every 0.1 s."""
    env = {**os.environ, "GREENCTL_NOOP_SERVICE_MS": "2", "GREENCTL_ENERGY_SCRAPE_S": "0.1"}
    procs, instances, states = [], [], {}
    for name in ("a", "b"):
        argv, state = _executor_argv(tmp_path, name)
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL))
        states[name] = state
    for name, state in states.items():
        doc = _wait_state(state)
        instances.append(
            {
                "id": name,
                "url": doc["url"],
                "variant": "v",
                "slots": 2,
                "pid": doc["pid"],
                "pid_start": doc["pid_start"],
                "spawn": {
                    "argv": _executor_argv(tmp_path, name)[0],
                    "state_file": str(state),
                    "log_file": str(tmp_path / f"{name}.log"),
                    "env": {"GREENCTL_NOOP_SERVICE_MS": "2"},
                    "ready_timeout_s": 30,
                },
            }
        )
    routes = tmp_path / "routes.json"
    routes.write_text(
        json.dumps(
            {
                "models": {"m": {"policy": "fifo", "instances": instances}},
                "carbon": {"carbon_g_per_kwh": 400.0, "pue": 1.0},
            }
        )
    )
    disp_state = tmp_path / "dispatcher.json"
    disp = subprocess.Popen(
        [
            *(sys.executable, "-m", "greenctl.executor.runtime.dispatcher"),
            *("--state-file", str(disp_state), "--routes", str(routes)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield {"url": _wait_state(disp_state)["url"], "states": states, "procs": procs}
    finally:
        disp.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            disp.wait(10)
        for pid in pids_mentioning(str(tmp_path)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.wait(5)


def _settled(url: str, expected_j: float, timeout_s: float = 5.0) -> dict[str, float]:
    """The dispatcher's series once its energy total reaches ``expected_j`` (it reads the
    executors every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while True:
        flat = _metrics(url)
        if _sum(flat, ENERGY_TOTAL) >= expected_j * 0.999 or time.monotonic() > deadline:
            return flat
        time.sleep(0.05)


def test_dispatcher_totals_sum_its_executors_and_survive_a_kill_9(pair):
    from greenctl.executor.runtime.loadgen import run_load

    url, states = pair["url"], pair["states"]
    res = run_load(url, "m", duration_s=1.5, rate_rps=80, seed=1)
    assert res.ok > 100 and res.errors == 0
    execs = {n: _metrics(_wait_state(s)["url"]) for n, s in states.items()}
    joules = {n: _sum(f, ENERGY_TOTAL) for n, f in execs.items()}
    assert all(j > 0 for j in joules.values())  # both served
    total = sum(joules.values())
    assert total == pytest.approx(J_PER_REQUEST * res.ok, rel=1e-6)
    flat = _settled(url, total)
    key = f'{ENERGY_TOTAL}{{model="m",source="modeled"}}'
    print(f"dispatcher {flat[key]:.3f} J, executors {total:.3f} J")
    assert flat[key] == pytest.approx(total, rel=0.01)
    grams = flat[f'{CARBON_TOTAL}{{model="m",source="modeled"}}']
    assert grams == pytest.approx(carbon_g(total, 400.0), rel=0.01)
    assert flat[GRID_INTENSITY] == 400.0

    # kill -9 one executor: its restart counts from zero, the dispatcher's total goes on
    victim = _wait_state(states["a"])
    os.kill(victim["pid"], signal.SIGKILL)
    seen = [flat[key]]
    deadline = time.monotonic() + 30
    back = None
    while back is None and time.monotonic() < deadline:
        seen.append(_metrics(url).get(key, 0.0))
        with contextlib.suppress(AssertionError):
            back = _wait_state(states["a"], not_pid=victim["pid"], timeout_s=0.05)
    assert back is not None, "the executor was not restarted"
    res2 = run_load(url, "m", duration_s=1.0, rate_rps=80, seed=2)
    assert res2.ok > 50
    fresh = {n: _sum(_metrics(_wait_state(s)["url"]), ENERGY_TOTAL) for n, s in states.items()}
    assert fresh["a"] < joules["a"] + J_PER_REQUEST * res2.ok  # a new counter, from zero
    expected = joules["a"] + fresh["a"] + fresh["b"]
    flat = _settled(url, expected)
    seen.append(flat[key])
    assert seen == sorted(seen), "the dispatcher's energy total went backwards"
    print(f"after the restart: dispatcher {flat[key]:.3f} J, expected {expected:.3f} J")
    assert flat[key] == pytest.approx(expected, rel=0.01)
    assert flat[key] == pytest.approx(J_PER_REQUEST * (res.ok + res2.ok), rel=0.01)


def test_replan_keeps_executors_and_they_count_carbon_at_the_new_intensity(run_store, monkeypatch):
    """Apply at 400 g/kWh, then the same deployments at 100 g/kWh (what ``replan --apply``
    applies when the signal moves): no executor restarts, the dispatcher exports the new
    intensity and hands it to the executor, whose carbon counter goes on from where it was."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.deploy.apply import apply_plan, status

    monkeypatch.setenv("GREENCTL_ENERGY_SCRAPE_S", "0.1")

    def plan(intensity: float) -> Plan:
        return Plan(
            kind="mix",
            request={"carbon_intensity": intensity},
            deployments=[Deployment("m", "v1", "cpu:1", 1, 1, 20.0)],
        )

    first = apply_plan(plan(400.0), store=run_store, loader=NOOP)
    url = first.dispatcher_url or ""
    inst = status(run_store)["instances"][0]
    flat = _metrics(url)
    assert flat[GRID_INTENSITY] == 400.0
    before = _metrics(inst["url"])
    assert before[f'{GRID_INTENSITY}{{model="m",variant="v1",resource="cpu:1"}}'] == 400.0
    c0 = _sum(before, CARBON_TOTAL)

    second = apply_plan(plan(100.0), store=run_store, loader=NOOP)
    assert second.changed and [a["action"] for a in second.actions] == ["switch-routes"]
    assert status(run_store)["instances"][0]["pid"] == inst["pid"]  # kept, not restarted
    assert _metrics(url)[GRID_INTENSITY] == 100.0
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        now = _metrics(inst["url"])
        if now[f'{GRID_INTENSITY}{{model="m",variant="v1",resource="cpu:1"}}'] == 100.0:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the executor was not told the new intensity")
    time.sleep(0.3)
    later = _metrics(inst["url"])
    e1, c1 = _sum(now, ENERGY_TOTAL), _sum(now, CARBON_TOTAL)
    e2, c2 = _sum(later, ENERGY_TOTAL), _sum(later, CARBON_TOTAL)
    assert c0 <= c1 <= c2 and e2 > e1
    # from the switch on, carbon at 100 g/kWh (not 400; not all energy re-priced)
    assert c2 - c1 == pytest.approx(carbon_g(e2 - e1, 100.0), rel=1e-3)
    assert c2 < carbon_g(e2, 400.0) and c2 > carbon_g(e2, 100.0)

    third = apply_plan(plan(100.0), store=run_store, loader=NOOP)  # same intensity: nothing
    assert not third.changed


def test_the_executor_admin_endpoint_checks_its_input(pair):
    states = pair["states"]
    state = _wait_state(states["b"])
    url = state["url"]

    def post(body: object, token: str | None = state["token"]) -> int:
        req = urllib.request.Request(
            url + "/admin/carbon", data=json.dumps(body).encode(), method="POST"
        )
        if token is not None:
            req.add_header("X-Greenctl-Token", token)
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as exc:
            return exc.code

    assert post({"carbon_g_per_kwh": 50}, token=None) == 403  # admin needs the token
    assert post({"carbon_g_per_kwh": 50}, token="0" * 32) == 403
    assert post({"carbon_g_per_kwh": -3}) == 400
    assert post({"carbon_g_per_kwh": 50, "pue": 0.9}) == 400
    assert post([1]) == 400
    assert post({"carbon_g_per_kwh": 50, "pue": 1.1}) == 200
    key = f'{GRID_INTENSITY}{{model="m",variant="v",resource="cpu:1"}}'
    assert _metrics(url)[key] == 50.0
    # the dispatcher puts back the intensity of the plan it serves
    deadline = time.monotonic() + 5
    while _metrics(url)[key] != 400.0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metrics(url)[key] == 400.0
