"""The Ray router's own HTTP endpoint, against a real local Ray cluster (slow): a taken
``--ray-http-port`` is refused before anything is deployed, and the router answers on the
port it was started with."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster(ray_cluster_of):
    with ray_cluster_of(3) as address:
        yield address


def _plan(plan_id: int, count: int = 1) -> Plan:
    return Plan(kind="mix", request={"policy": "wrr"}, id=plan_id,
                deployments=[Deployment("tiny", "tiny-s", "cpu:1", count=count, batch=2)])  # fmt: skip


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _infer(url: str) -> tuple[int, dict]:
    body = {"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                        "data": [0.5] * 3072}]}  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v2/models/tiny/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


@pytest.mark.slow
def test_a_taken_port_is_refused_and_the_router_keeps_its_port(cluster, store, cli, tmp_path):
    from greenctl.executor.deploy.ray_backend import apply_ray, down_ray

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(_plan(1).to_json())
    with socket.socket() as held:  # another program listens on the port asked for
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        r = cli("apply", plan_file, "--backend", "ray", "--address", cluster,
                "--ray-http-port", taken)  # fmt: skip
        assert r.exit_code == 2, r.output
        assert f"--ray-http-port {taken}" in r.output and "Traceback" not in r.output
        with pytest.raises(InputError, match="--ray-http-port"):
            apply_ray(_plan(1), store=store, address=cluster, http_port=taken)
    from ray import serve

    assert not [a for a in serve.status().applications if a.startswith("greenctl-")]

    port = _free_port()
    try:
        first = apply_ray(_plan(1), store=store, address=cluster, http_port=port, timeout_s=120)
        assert first.url == f"http://127.0.0.1:{port}"
        assert _get(f"{first.url}/v2/health/ready") == (200, {"ready": True})
        code, doc = _get(f"{first.url}/v2/nothing")
        assert code == 404 and "error" in doc
        code, doc = _infer(first.url)
        assert code == 200 and doc["model_version"] == "tiny-s"
        # a later apply naming another port: the router answers where it listens
        second = apply_ray(
            _plan(2, count=2), store=store, address=cluster, http_port=_free_port(), timeout_s=120
        )
        assert second.url == first.url and second.app != first.app
        assert _infer(second.url)[0] == 200
    finally:
        down_ray(store=store, address=cluster)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the router is gone, and its port with it
        try:
            urllib.request.urlopen(f"{first.url}/v2/health/live", timeout=5).close()
        except OSError:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"{first.url} still answers after down")
