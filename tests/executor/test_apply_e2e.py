"""End to end on CPU: apply a plan, infer through the dispatcher, load it, status, down."""

from __future__ import annotations

import json
import socket
import urllib.request

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(180)


def _plan(
    model: str, variants: list[tuple[str, int]], *, batch: int = 2, quota: float = 20.0
) -> Plan:
    return Plan(
        kind="mix",
        deployments=[
            Deployment(
                model=model, variant=v, resource="cpu:1", count=n, batch=batch, quota_rps=quota
            )
            for v, n in variants
        ],
        predicted={"rate_rps": quota * len(variants), "p95_ms": 20.0},
    )


def _post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, resp.read(), dict(resp.headers)


def _bound(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_apply_infer_load_status_down(run_store, leftovers):
    """Two built-in tiny executors behind the dispatcher answer OIP JSON and binary requests."""
    import torch
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.runtime import oip
    from greenctl.executor.runtime.loadgen import run_load
    from greenctl.profiler.models import build_builtin

    plan = _plan("tiny", [("tiny-s", 1), ("tiny-m", 1)])
    result = apply_plan(plan, store=run_store, policy="fifo")
    assert result.changed and result.dispatcher_url
    started = [a for a in result.actions if a["action"] == "start-executor"]
    assert len(started) == 2
    url = result.dispatcher_url

    # an OIP JSON request through the dispatcher; the answer is one of the two MLPs
    x = (np.arange(2 * 3 * 32 * 32, dtype=np.float32) % 17).reshape(2, 3, 32, 32) / 17
    body, headers = oip.encode_request([("input", x)], request_id="r1")
    code, raw, _ = _post(f"{url}/v2/models/tiny/infer", body, headers)
    assert code == 200
    doc = json.loads(raw)
    assert doc["model_name"] == "tiny" and doc["id"] == "r1"
    out = np.asarray(doc["outputs"][0]["data"], dtype=np.float32).reshape(
        doc["outputs"][0]["shape"]
    )
    expected = []
    for name in ("tiny-s", "tiny-m"):
        torch.manual_seed(0)  # the daemon seeds the same way before building
        with torch.no_grad():
            expected.append(build_builtin(name).eval()(torch.from_numpy(x)).numpy())
    assert out.shape == (2, 10)
    assert any(np.allclose(out, e, atol=1e-5) for e in expected)

    # the binary tensor extension (what tritonclient sends by default) gives the same numbers
    body, headers = oip.encode_request([("input", x)], binary=True, binary_outputs=True)
    code, raw, resp_headers = _post(f"{url}/v2/models/tiny/infer", body, headers)
    length = int(resp_headers[oip.HEADER_LENGTH])
    out_bin = oip.decode_response(raw, length)["output"]
    assert any(np.allclose(out_bin, e, atol=1e-5) for e in expected)

    # metadata and health through the dispatcher
    with urllib.request.urlopen(f"{url}/v2/models/tiny", timeout=5) as resp:
        meta = json.loads(resp.read())
    assert meta["inputs"][0]["shape"] == [-1, 3, 32, 32]
    assert meta["outputs"][0]["shape"] == [-1, 10]
    with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=5) as resp:
        assert resp.status == 200

    load = run_load(url, "tiny", duration_s=1.5, rate_rps=40, seed=1)
    assert load.sent > 20 and load.ok == load.sent and load.errors == 0
    assert load.p50_ms is not None and load.p95_ms is not None and load.p95_ms >= load.p50_ms
    # measured with a fine clock (uvloop's loop clock is cached per pass at 1 ms resolution
    # and gave latencies below zero)
    assert min(load.latencies_ms) > 0

    st = status(run_store)
    assert st["dispatcher"]["url"] == url and st["dispatcher"]["ready"]
    assert len(st["instances"]) == 2
    assert {i["variant"] for i in st["instances"]} == {"tiny-s", "tiny-m"}
    assert all(i["ready"] and i["pid"] and i["port"] for i in st["instances"])
    assert sum(i["requests"] for i in st["instances"]) >= load.ok
    assert all(i["p95_ms"] is not None for i in st["instances"])

    # applying the running plan again does nothing
    again = apply_plan(plan, store=run_store, policy="fifo")
    assert not again.changed and again.actions == []

    ports = [i["port"] for i in st["instances"]] + [int(url.rsplit(":", 1)[1])]
    down(run_store)
    assert leftovers() == []
    assert not any(_bound(p) for p in ports)
    assert status(run_store)["instances"] == []


def test_replace_variant_keeps_serving(run_store, loaders, leftovers):
    """A new plan starts its executors before the old ones stop, then routes switch."""
    from greenctl.executor.deploy.apply import apply_plan, status
    from greenctl.executor.runtime.loadgen import run_load

    first = apply_plan(_plan("m", [("v1", 1)]), store=run_store, loader=loaders["noop"])
    old = status(run_store)["instances"][0]
    second = apply_plan(_plan("m", [("v2", 1)]), store=run_store, loader=loaders["noop"])
    kinds = [a["action"] for a in second.actions]
    assert (
        kinds.index("start-executor") < kinds.index("switch-routes") < kinds.index("stop-executor")
    )
    assert second.dispatcher_url == first.dispatcher_url  # the front endpoint stays
    now = status(run_store)["instances"]
    assert [i["variant"] for i in now] == ["v2"] and now[0]["pid"] != old["pid"]
    assert len(leftovers()) == 3  # a supervisor, its dispatcher, one executor

    # a dead dispatcher (with its supervisor) is noticed: applying again starts a new pair,
    # on the same port, for the same executors
    import os
    import signal

    from greenctl.executor.runtime.procs import wait_dead

    disp = status(run_store)["dispatcher"]
    for pid in (disp["supervisor"]["pid"], disp["pid"]):
        os.kill(pid, signal.SIGKILL)
    # both hold the listening socket: the port is free once both are gone
    assert wait_dead(disp["pid"], 10) and wait_dead(disp["supervisor"]["pid"], 10)
    healed = apply_plan(_plan("m", [("v2", 1)]), store=run_store, loader=loaders["noop"])
    assert [a["action"] for a in healed.actions] == ["start-dispatcher", "switch-routes"]
    assert healed.dispatcher_url == first.dispatcher_url
    assert status(run_store)["instances"][0]["pid"] == now[0]["pid"]
    states = [
        r["state"] for r in run_store.db.table("executor_dispatcher").rows_where(order_by="id")
    ]
    assert states == ["failed", "running"]
    assert run_load(healed.dispatcher_url or "", "m", duration_s=0.5, rate_rps=20).errors == 0


def test_policy_change_only_switches_routes(run_store, loaders, leftovers):
    """wrr, then batch, then fifo on the same two executors: no process starts or stops."""
    from greenctl.executor.deploy.apply import apply_plan
    from greenctl.executor.runtime.loadgen import run_load

    plan = _plan("m", [("v1", 2)])
    url = apply_plan(plan, store=run_store, loader=loaders["noop"], policy="wrr").dispatcher_url
    pids = sorted(leftovers())
    for k, policy in enumerate(("wrr", "batch", "fifo")):
        if k:
            res = apply_plan(plan, store=run_store, loader=loaders["noop"], policy=policy)
            assert [a["action"] for a in res.actions] == ["switch-routes"]
        load = run_load(url or "", "m", duration_s=1.0, rate_rps=60, seed=k)
        assert load.ok == load.sent > 0, policy
    assert sorted(leftovers()) == pids
