"""The Ray router's own HTTP endpoint, against a real local Ray cluster (slow): a taken
``--ray-http-port`` is refused before anything is deployed, the router answers on the
port it was started with and, restarted by Serve, routes again; and its grouping of requests
(plain asyncio)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan

from tests.conftest import free_port, listening_port


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


def _answers(url: str, want: bool, within_s: float = 120.0) -> bool:
    """Whether ``url`` comes to answer 200 (``want``) or to fail (not ``want``) in time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ok = _get(url)[0] == 200
        except OSError:
            ok = False
        if ok == want:
            return True
        time.sleep(0.2)
    return False


def _kill_the_router() -> None:
    """Kill the router's replica actor (as a crash would)."""
    import ray

    names = [a for a in ray.util.list_named_actors(all_namespaces=True)
             if "greenctl-router" in a["name"] and "Router" in a["name"]]  # fmt: skip
    assert len(names) == 1, names
    ray.kill(ray.get_actor(names[0]["name"], namespace=names[0]["namespace"]), no_restart=True)


@pytest.mark.slow
def test_a_taken_port_is_refused_and_the_router_keeps_its_port(cluster, store, cli, tmp_path):
    from greenctl.executor.deploy.ray_backend import apply_ray, down_ray

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(_plan(1).to_json())
    with listening_port() as taken:  # another program listens on the port asked for
        r = cli("apply", plan_file, "--backend", "ray", "--address", cluster,
                "--ray-http-port", taken)  # fmt: skip
        assert r.exit_code == 2, r.output
        assert f"--ray-http-port {taken}" in r.output and "Traceback" not in r.output
        with pytest.raises(InputError, match="--ray-http-port"):
            apply_ray(_plan(1), store=store, address=cluster, http_port=taken)
    from ray import serve

    assert not [a for a in serve.status().applications if a.startswith("greenctl-")]

    port = free_port()
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
            _plan(2, count=2), store=store, address=cluster, http_port=free_port(), timeout_s=120
        )
        assert second.url == first.url and second.app != first.app
        assert _infer(second.url)[0] == 200
        _kill_the_router()  # Serve starts another: it routes with the version running again
        assert _answers(f"{second.url}/v2/health/live", False), "the killed router answers"
        assert _answers(f"{second.url}/v2/health/ready", True), "no router after 120 s"
        code, doc = _infer(second.url)
        assert code == 200 and doc["model_version"] == "tiny-s"
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


# -- the router's grouping of requests per deployment (plain asyncio, no Ray) -----------------
class _Replica:
    """A deployment handle's stand-in: records each call's requests and answers them when
    ``gate`` opens (a request ``boom`` fails its whole call)."""

    def __init__(self) -> None:
        self.calls: list[list[tuple]] = []
        self.gate = asyncio.Event()
        self.answer_all = self

    def remote(self, requests: list[tuple]):
        self.calls.append(list(requests))

        async def answer() -> list:
            await self.gate.wait()
            if any(r[0] == "boom" for r in requests):
                raise RuntimeError("the replica died")
            return [("ok", r) for r in requests]

        return answer()


async def _settle() -> None:
    """Let every ready task run (sends queue, calls start)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_sender_sends_an_idle_request_at_once_and_groups_those_that_wait():
    from greenctl.executor.deploy.ray_serve import Sender

    async def main() -> None:
        replica = _Replica()
        sender = Sender(replica, calls=1, most=3)
        first = asyncio.ensure_future(sender.send("a"))
        await _settle()
        assert replica.calls == [[("a",)]]  # nothing in flight: it goes alone, at once
        rest = [asyncio.ensure_future(sender.send(x)) for x in "bcde"]
        await _settle()
        assert len(replica.calls) == 1  # one call in flight at most: the rest wait
        replica.gate.set()
        assert await asyncio.gather(first, *rest) == [("ok", (x,)) for x in "abcde"]
        assert replica.calls == [[("a",)], [("b",), ("c",), ("d",)], [("e",)]]

    asyncio.run(main())


def test_sender_fails_each_request_of_a_failed_call_and_goes_on():
    from greenctl.executor.deploy.ray_serve import Sender

    async def main() -> None:
        replica = _Replica()
        sender = Sender(replica, calls=1, most=2)
        first = asyncio.ensure_future(sender.send("a"))
        await _settle()
        grouped = [asyncio.ensure_future(sender.send(x)) for x in ("boom", "b")]
        await _settle()  # both wait for the call in flight
        replica.gate.set()
        assert await first == ("ok", ("a",))
        for request in grouped:
            with pytest.raises(RuntimeError, match="replica died"):
                await request
        assert replica.calls[1] == [("boom",), ("b",)]
        assert await sender.send("c") == ("ok", ("c",))  # the failed call freed its slot
        assert sender.inflight == 0 and not sender.waiting

    asyncio.run(main())


def test_the_router_calls_replicas_over_serves_grpc_data_plane_where_ray_has_it():
    from greenctl.executor.deploy.ray_serve import direct

    class Handle:
        def __init__(self, accepts: bool) -> None:
            self.accepts, self.options_given = accepts, None

        def options(self, **kw):
            if not self.accepts:
                raise TypeError("options() got an unexpected keyword argument '_by_reference'")
            self.options_given = kw
            return ("by gRPC", self)

    new = Handle(accepts=True)
    assert direct(new) == ("by gRPC", new) and new.options_given == {"_by_reference": False}
    old = Handle(accepts=False)
    assert direct(old) is old  # a Ray without the option: the plain handle
    pytest.importorskip("ray.serve")
    import inspect

    from ray.serve.handle import DeploymentHandle

    # the Ray installed here has the option (or the fallback would hide its loss)
    assert "_by_reference" in inspect.signature(DeploymentHandle.options).parameters


def test_sender_closes_a_group_before_it_passes_the_bytes_a_call_may_carry(monkeypatch):
    from greenctl.executor.deploy import ray_serve

    monkeypatch.setattr(ray_serve, "CALL_MAX_BYTES", 10)

    async def main() -> None:
        replica = _Replica()
        sender = ray_serve.Sender(replica, calls=1, most=8)
        first = asyncio.ensure_future(sender.send(b"x"))
        await _settle()
        bodies = [b"aaaa", b"bbbb", b"cc", b"d" * 30, b"e"]
        rest = [asyncio.ensure_future(sender.send(x)) for x in bodies]
        await _settle()
        replica.gate.set()
        await asyncio.gather(first, *rest)
        # 4 + 4 + 2 bytes fill a call; one over the bound goes alone, as a request must
        sizes = [[len(args[0]) for args in call] for call in replica.calls]
        assert sizes == [[1], [4, 4, 2], [30], [1]]

    asyncio.run(main())
