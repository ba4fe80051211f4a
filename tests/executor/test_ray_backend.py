"""Ray backend: without a cluster (fast: addresses refused in a blink) and against a real
local Ray cluster (a head and a second node on this machine; slow)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Variant
from greenctl.executor.deploy import ray_backend
from greenctl.executor.deploy.ray_backend import actor_options, apply_ray, status_ray
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import free_port, listening_port


@pytest.fixture(scope="module")
def cluster(ray_cluster_of):
    # 4 + 2 logical CPUs on two nodes leave room for two plan versions side by side
    with ray_cluster_of(4, resources={"mig-1g.10gb": 1}, worker_cpus=2) as address:
        yield address


@pytest.fixture(scope="module")
def http_port() -> int:
    """Serve's HTTP proxy port, one per cluster: once Serve runs, a later `serve.start` keeps
    the port it started with, so every test on the module's cluster uses the same one."""
    return free_port()


def _infer(url: str, model: str, rows: int = 2) -> dict:
    shape = [rows, 3, 32, 32]
    body = {
        "id": "r1",
        "inputs": [
            {
                "name": "input",
                "shape": shape,
                "datatype": "FP32",
                "data": [0.5] * (rows * 3 * 32 * 32),
            }
        ],
    }
    req = urllib.request.Request(
        f"{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


def plan(*deps: Deployment, plan_id: int) -> Plan:
    return Plan(kind="mix", request={"policy": "wrr"}, deployments=list(deps), id=plan_id)


def test_actor_options_pin_resources():
    assert actor_options("cpu:2") == {"num_cpus": 2.0}
    assert actor_options("mig:3g.40gb") == {"num_cpus": 0.25, "resources": {"mig-3g.40gb": 1.0}}
    assert actor_options("mps:40")["num_gpus"] == pytest.approx(0.4)
    assert actor_options("gpu:H100")["num_gpus"] == 1.0


@pytest.mark.slow
def test_apply_infer_scale_rollback_down(cluster, store, cli, tmp_path, http_port):
    first = plan(Deployment("tiny", "tiny-s", "cpu:1", count=1, batch=4, quota_rps=10.0), plan_id=1)
    plan_file = tmp_path / "first.json"
    plan_file.write_text(first.to_json())
    # through the CLI: apply --backend ray, then a binary-tensor load with greenctl loadgen
    applied = cli(
        "apply",
        plan_file,
        "--backend",
        "ray",
        "--address",
        cluster,
        "--ray-http-port",
        http_port,
        "--json",
    )
    assert applied.exit_code == 0, applied.output
    url = json.loads(applied.stdout)["url"]
    out = _infer(url, "tiny")
    assert out["model_name"] == "tiny" and out["outputs"][0]["shape"][0] == 2
    assert out["model_version"] == "tiny-s"
    big = _infer(url, "tiny", rows=400)  # 6 MB of JSON: past gRPC's default 4 MiB message
    assert big["outputs"][0]["shape"][0] == 400
    load = cli(
        "loadgen", "--endpoint", url, "--model", "tiny", "--rate", "20", "--duration", "2", "--json"
    )
    assert load.exit_code == 0, load.output
    measured = json.loads(load.stdout)
    assert measured["errors"] == 0 and measured["ok"] > 10
    result = apply_ray(first, store=store, address=cluster, http_port=http_port, timeout_s=120)
    assert result.url == url

    # idempotent: the same plan again does nothing
    assert not result.changed

    # scale: a changed plan with two variants, one on the declared MIG resource
    second = plan(
        Deployment("tiny", "tiny-s", "cpu:1", count=2, batch=4, quota_rps=10.0),
        Deployment("tiny", "tiny-m", "mig:1g.10gb", count=1, batch=2, quota_rps=10.0),
        plan_id=2,
    )
    apply_ray(second, store=store, address=cluster, http_port=http_port, timeout_s=120)
    seen = {_infer(result.url, "tiny", rows=1)["model_version"] for _ in range(6)}
    assert seen == {"tiny-s", "tiny-m"}  # wrr by equal quotas alternates
    status = status_ray(store=store)
    assert status["plan_id"] == 2 and status["dispatcher"]["url"] == result.url
    by_variant = {i["variant"]: i for i in status["instances"]}
    assert by_variant["tiny-s"]["replicas"].get("RUNNING") == 2
    assert by_variant["tiny-m"]["resource"] == "mig:1g.10gb"

    # a plan that needs more than the cluster has is refused before anything changes
    with pytest.raises(InputError, match="lacks resources"):
        apply_ray(
            plan(Deployment("tiny", "tiny-s", "cpu:1", count=9), plan_id=3),
            store=store,
            address=cluster,
            http_port=http_port,
        )

    # a version that fails to load is rolled back; plan 2 keeps serving
    store.upsert_variant(
        Variant(
            name="broken",
            family="tiny",
            source="torchscript:/nonexistent/model.pt",
            input_shape="3,32,32",
        )
    )
    with pytest.raises(ExecutorError, match="previous version"):
        apply_ray(
            plan(Deployment("tiny", "broken", "cpu:1"), plan_id=4),
            store=store,
            address=cluster,
            http_port=http_port,
            timeout_s=120,
        )
    assert _infer(result.url, "tiny", rows=1)["model_version"] in {"tiny-s", "tiny-m"}
    assert status_ray(store=store)["plan_id"] == 2

    status_cli = cli("status", "--backend", "ray", "--json")
    assert json.loads(status_cli.stdout)["plan_id"] == 2
    down = cli("down", "--backend", "ray", "--json")
    assert down.exit_code == 0, down.output
    assert ray_backend.ROUTER_APP in json.loads(down.stdout)["deleted"]
    assert status_ray(store=store)["instances"] == []


@pytest.mark.slow
def test_replan_apply_switches_the_plan_on_ray(cluster, store, cli, http_port):
    """A plan applied on Ray is replanned there: the backend that runs it is recorded, and
    `replan --apply`, `status` and `down` (no --backend) ask it."""
    from greenctl.data import carbon_io, deployments
    from greenctl.data.records import Profile
    from greenctl.executor.kinds import get_kind
    from greenctl.profiler.models import builtin_variant

    rows = []
    for name, thr, energy, lat in (("tiny-s", 400, 0.05, 3), ("tiny-m", 150, 0.2, 8)):
        store.upsert_variant(builtin_variant(name))
        rows.append(
            Profile(
                name, "cpu:1", 1, thr, latency_p50_ms=lat, latency_p95_ms=1.5 * lat,
                latency_p99_ms=2 * lat, power_w=10.0, energy_j=energy, energy_method="modeled",
                capacity_rps=thr * 0.8, capacity_slo_ms=100, source="synthetic",
            )
        )  # fmt: skip
    store.add_profiles(rows)
    carbon_io.import_bundled(store, "clover-ciso-march")
    request = {"model": "tiny", "rate_rps": 50, "slo_ms": 100, "budgets": {"cpu": 1},
               "carbon_intensity": 124.57, "gamma": 0.5}  # fmt: skip
    first, _ = get_kind("mix").plan(store, request)
    first.extra["carbon_region"] = "CISO"
    pid = store.save_plan(first)
    assert [d.variant for d in first.deployments] == ["tiny-m"]  # accurate while the grid is clean
    r = cli("apply", _plan_path(store, pid), "--backend", "ray",
            "--address", cluster, "--ray-http-port", http_port, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    url = json.loads(r.stdout)["url"]
    recorded = deployments.running_backend(store)
    assert recorded is not None and recorded["backend"] == "ray"
    assert (recorded["address"], recorded["options"]) == (cluster, {"http_port": http_port})
    try:
        # 05:00: the grid is more than twice as dirty; the cheaper variant is applied on Ray
        r = cli("replan", "--plan", pid, "--region", "CISO", "--at", "2021-03-01T05:00:00Z",
                "--apply", "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        d = json.loads(r.stdout)
        assert d["action"] == "apply" and d["running_plan_id"] == pid, d["reason"]
        assert deployments.running_dispatcher(store) is None  # nothing started locally
        doc = json.loads(cli("status", "--json").stdout)
        assert doc["backend"] == "ray" and doc["plan_id"] == d["new_plan_id"]
        assert doc["dispatcher"]["url"] == url  # the same endpoint, the new version behind it
        assert _infer(url, "tiny", rows=1)["model_version"] == "tiny-s"
    finally:
        down = cli("down", "--json")
    assert down.exit_code == 0, down.output
    assert ray_backend.ROUTER_APP in json.loads(down.stdout)["deleted"]
    assert deployments.running_backend(store) is None


def _plan_path(store, plan_id: int):
    """The stored plan as a file (what `greenctl apply` takes)."""
    from greenctl.data.plan import write_plan_file

    path = store.path.parent / f"plan-{plan_id}.json"
    write_plan_file(store.get_plan(plan_id), path)
    return path


# -- without a cluster: fast failures, no Ray import, nothing on stdout ------------------------
@pytest.fixture
def no_ray_init(monkeypatch):
    """Fail the test if Ray would be imported and initialised (an unreachable address must be
    refused before ``ray.init``, which retries the GCS for minutes)."""

    def refuse():
        raise AssertionError("ray.init reached with an unreachable or malformed address")

    monkeypatch.setattr(ray_backend, "_ray", refuse)


@pytest.fixture
def closed_port() -> int:
    return free_port()  # bound and released: nothing listens there


@pytest.fixture
def plan_file(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text(plan(Deployment("tiny", "tiny-s", "cpu:1"), plan_id=1).to_json())
    return f


@pytest.mark.parametrize("json_out", [False, True])
def test_apply_without_a_cluster_fails_fast(cli, plan_file, closed_port, no_ray_init, json_out):
    address = f"127.0.0.1:{closed_port}"
    args = ["apply", plan_file, "--dry-run", "--backend", "ray", "--address", address]
    r = cli(*args, *(["--json"] if json_out else []))
    assert r.exit_code == 1, r.output
    assert f"no Ray cluster answers at {address}" in r.stderr
    assert "ray start --head" in r.stderr
    assert r.stdout == ""  # (with --json: no half document, no Ray log lines)


def test_apply_without_backend_goes_where_the_running_plan_runs(
    cli, store, plan_file, closed_port, no_ray_init
):
    """`apply` with no --backend switches the plan on the backend that runs it (here a Ray
    cluster recorded by the last apply), not on local daemons beside it."""
    from greenctl.data import deployments

    address = f"127.0.0.1:{closed_port}"
    deployments.record_backend(store, "ray", plan_id=1, address=address)
    r = cli("apply", plan_file, "--dry-run")
    assert r.exit_code == 1, r.output
    assert f"no Ray cluster answers at {address}" in r.stderr
    # --backend still wins, and with nothing running the default is local
    r = cli("apply", plan_file, "--dry-run", "--backend", "local")
    assert r.exit_code == 0, r.output
    deployments.stop_backend(store, "ray")
    r = cli("apply", plan_file, "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["dry_run"] is True


def test_ray_apply_refuses_a_model_that_is_not_the_variants_family(store, no_ray_init):
    """The local backend's family rule holds on Ray too, before any cluster is contacted."""
    wrong = plan(Deployment("resnet", "tiny-s", "cpu:1"), plan_id=1)
    with pytest.raises(InputError, match=r"deployments\[0\]\.model is 'resnet'.*'tiny'"):
        apply_ray(wrong, store=store, address="127.0.0.1:1", dry_run=True)


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "127.0.0.1:99999", "head:port", ":6379", "http://h:1/x", "a b:1"]
)
def test_a_malformed_address_is_refused(cli, plan_file, no_ray_init, address):
    r = cli("apply", plan_file, "--dry-run", "--backend", "ray", "--address", address)
    assert r.exit_code == 2, r.output
    assert f"--address {address!r} is not a Ray cluster address" in r.stderr
    assert "HOST:PORT" in r.stderr
    r = cli("status", "--backend", "ray", "--address", address)
    assert r.exit_code == 2, r.output


def test_status_with_an_unreachable_cluster_is_an_error(cli, store, closed_port, no_ray_init):
    address = f"127.0.0.1:{closed_port}"
    r = cli("status", "--backend", "ray", "--address", address)
    assert r.exit_code == 1, r.output
    assert f"no Ray cluster answers at {address}" in r.stderr and "Deployments" not in r.stdout
    # the cluster recorded by the last apply is gone: no empty table either
    store.db.table("ray_apps").insert(
        {"plan_id": 1, "address": address, "app": "greenctl-p1-x", "url": "http://h:1",
         "applied_at": "2026-01-01T00:00:00Z", "active": 1}
    )  # fmt: skip
    r = cli("status", "--backend", "ray", "--json")
    assert r.exit_code == 1 and r.stdout == ""
    assert f"no Ray cluster answers at {address}" in r.stderr


def test_status_with_nothing_applied_says_so(cli, no_ray_init):
    r = cli("status", "--backend", "ray")
    assert r.exit_code == 1, r.output  # nothing serves
    assert "nothing is applied" in r.stderr
    assert "Nothing greenctl applied runs on Ray" in r.stdout and "Deployments" not in r.stdout
    doc = json.loads(cli("status", "--backend", "ray", "--json").stdout)
    assert doc["app"] is None and doc["running"] is False and doc["instances"] == []


def test_probe_accepts_a_listening_address():
    with listening_port() as port:
        ray_backend.probe_address(f"127.0.0.1:{port}", timeout_s=2)
        ray_backend.probe_address(f"ray://127.0.0.1:{port}", timeout_s=2)


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(
        st.text(max_size=40),
        st.builds(
            lambda scheme, host, port: f"{scheme}{host}:{port}",
            st.sampled_from(["", "ray://", "http://"]),
            st.text(alphabet="abc.-_:[]1 /\x00é", max_size=12),
            st.one_of(st.integers(-5, 70000).map(str), st.text(max_size=6)),
        ),
    )
)
def test_parse_address_fuzz(text):
    """Any --address text parses to (host, port 1..65535) or is an InputError (exit 2)."""
    try:
        host, port = ray_backend.parse_address(text)
    except InputError as exc:
        assert exc.exit_code == 2 and "is not a Ray cluster address" in exc.message
        return
    assert host and 0 < port < 65536 and int(text.strip().rsplit(":", 1)[1]) == port


def test_a_head_named_by_another_address_of_this_machine_is_the_same_cluster():
    """Ray may report a head it was asked for on loopback by this node's address: that is
    no reason to disconnect (and reconnect) this process's Ray."""
    node = socket.gethostbyname(socket.gethostname())
    assert ray_backend._same_cluster(("127.0.0.1", 6379), (node, 6379))
    assert ray_backend._same_cluster(("localhost", 6379), ("127.0.0.1", 6379))
    assert not ray_backend._same_cluster(("127.0.0.1", 6379), ("127.0.0.1", 6380))
    assert not ray_backend._same_cluster(("127.0.0.1", 6379), ("198.51.100.77", 6379))
    assert not ray_backend._same_cluster(("127.0.0.1", 6379), ("no-such-host.invalid", 6379))


# -- issue 19 on Ray: model-less requests, energy and carbon series ---------------------------
def _post(url: str, name: str, parameters: dict | None = None) -> tuple[int, dict, Any]:
    """(status, answer, headers: case-insensitive, as uvicorn sends them lowercase)."""
    body: dict = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                              "data": [0.5] * 3072}]}  # fmt: skip
    if parameters is not None:
        body["parameters"] = parameters
    req = urllib.request.Request(
        f"{url}/v2/models/{name}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read()), resp.headers
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers


def _ray_metrics(url: str) -> dict[str, float]:
    from greenctl.executor.runtime.metrics import parse_prometheus

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return parse_prometheus(resp.read().decode())


@pytest.mark.slow
def test_model_less_requests_and_energy_series_on_ray(cluster, store, http_port):
    """The router picks a variant for a request's requirements as the local dispatcher does,
    exports each model's energy and carbon, and a plan of the very replicas at a new grid
    intensity is applied in place: the counters go on, at the new intensity."""
    import time

    from greenctl.data.records import Profile
    from greenctl.executor.runtime.metrics import CARBON_TOTAL, ENERGY_TOTAL, GRID_INTENSITY
    from greenctl.profiler.models import builtin_variant

    for name, lat, energy in (("tiny-s", 1.0, 0.05), ("tiny-l", 6.0, 0.5)):
        store.upsert_variant(builtin_variant(name))
        store.add_profiles(
            [Profile(name, "cpu:1", 1, 1000.0 / lat, latency_p50_ms=lat,
                     latency_p95_ms=1.5 * lat, latency_p99_ms=2 * lat, power_w=10.0,
                     idle_power_w=5.0, energy_j=energy, cost_per_hour=0.1, source="imported")]
        )  # fmt: skip

    def at(intensity: float) -> Plan:
        p = Plan(kind="mix", request={"carbon_intensity": intensity, "policy": "wrr"},
                 deployments=[Deployment("tiny", "tiny-s", "cpu:1", 1, 1, 10.0),
                              Deployment("tiny", "tiny-l", "cpu:1", 1, 1, 10.0)])  # fmt: skip
        store.save_plan(p)
        return p

    first = apply_ray(at(400.0), store=store, address=cluster, http_port=http_port, timeout_s=180)
    url = first.url
    try:
        code, doc, headers = _post(url, "tiny", {"latency_slo_ms": 1000})
        assert code == 200 and doc["parameters"]["variant"] == "tiny-s", doc  # the greenest
        assert headers["Greenctl-Variant"] == "tiny-s"
        code, doc, _ = _post(url, "tiny", {"min_accuracy": 0.75})
        assert code == 200 and doc["parameters"]["variant"] == "tiny-l"
        assert doc["outputs"][0]["shape"][0] == 1
        code, doc, _ = _post(url, "tiny", {"min_accuracy": 0.95})
        assert code == 422 and doc["closest"]["variant"] == "tiny-l", doc
        code, doc, _ = _post(url, "tiny", {"max_latency_ms": 3})
        assert code == 400 and "max_latency_ms" in doc["error"]
        code, doc, headers = _post(url, "tiny-l")  # a variant's own name
        assert code == 200 and headers["Greenctl-Variant"] == "tiny-l"
        assert doc["model_name"] == "tiny-l"

        energy = [f'{ENERGY_TOTAL}{{model="tiny",source="{s}"}}' for s in ("modeled", "rapl")]
        deadline = time.monotonic() + 60
        flat: dict[str, float] = {}
        while time.monotonic() < deadline:
            flat = _ray_metrics(url)
            if any(flat.get(k, 0) > 0 for k in energy):
                break
            time.sleep(1)
        key = next(k for k in energy if flat.get(k, 0) > 0)
        assert flat[GRID_INTENSITY] == 400.0
        assert flat[key.replace(ENERGY_TOTAL, CARBON_TOTAL)] > 0

        # the same replicas at 100 g/kWh (a replan that keeps the plan): in place
        second = apply_ray(at(100.0), store=store, address=cluster, http_port=http_port)
        assert second.app == first.app and "re-apply the routes" in second.actions[0]
        assert status_ray(store=store)["plan_id"] == second.plan_id
        later = _ray_metrics(url)
        assert later[GRID_INTENSITY] == 100.0
        assert later[key] >= flat[key]  # no new version: the sums go on
        assert _post(url, "tiny", {"min_accuracy": 0.75})[0] == 200
    finally:
        from greenctl.executor.deploy.ray_backend import down_ray

        down_ray(store=store, address=cluster)
