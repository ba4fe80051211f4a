"""Ray backend against a real local Ray cluster: a head and a second node on this machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import urllib.request

import pytest
from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Variant
from greenctl.executor import ray_backend
from greenctl.executor.ray_backend import actor_options, apply_ray, status_ray

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray_bin = shutil.which("ray")
    if ray_bin is None:
        pytest.skip("the ray command is not installed")
    # a local test cluster without token auth (a stale ~/.ray/auth_token would otherwise
    # make the second node's join fail)
    settings = {
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_DISABLE_DOCKER_CPU_WARNING": "1",
    }
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    env = dict(os.environ)
    port = _free_port()
    # loopback only; 4 + 2 logical CPUs leave room for two plan versions side by side
    common = [
        "--object-store-memory",
        str(80 * 1024 * 1024),
        "--disable-usage-stats",
        "--node-ip-address",
        "127.0.0.1",
    ]
    head = [ray_bin, "start", "--head", "--port", str(port), "--num-cpus", "4", "--include-dashboard", "false",
            "--resources", json.dumps({"mig-1g.10gb": 1}), *common]  # fmt: skip
    subprocess.run(head, check=True, env=env, capture_output=True, timeout=180)
    address = f"127.0.0.1:{port}"
    try:
        worker = [ray_bin, "start", "--address", address, "--num-cpus", "2", *common]
        subprocess.run(worker, check=True, env=env, capture_output=True, timeout=180)
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True, timeout=120)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _infer(url: str, model: str, rows: int = 2) -> dict:
    shape = [rows, 3, 32, 32]
    body = {
        "id": "r1",
        "inputs": [
            {
                "name": "input0",
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


def test_apply_infer_scale_rollback_down(cluster, store, cli, tmp_path):
    http_port = _free_port()
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
