"""Routing policies and the bounded queue of the dispatcher, in-process (no sockets)."""

from __future__ import annotations

import asyncio
import collections

import pytest
from greenctl.executor.runtime.dispatcher import Dispatcher, ModelRoute, QueueFull


def _route(
    policy: str, slots: list[int], weights: list[float] | None = None, max_queue: int = 2
) -> ModelRoute:
    weights = weights or [1.0] * len(slots)
    return ModelRoute(
        "m",
        {
            "policy": policy,
            "instances": [
                {"id": f"i{k}", "url": f"http://127.0.0.1:{9000 + k}", "slots": s, "weight": w}
                for k, (s, w) in enumerate(zip(slots, weights, strict=True))
            ],
        },
        max_queue=max_queue,
    )


def test_fifo_queue_is_bounded_and_first_come_first_served():
    async def scenario() -> list[str]:
        route = _route("fifo", [1, 1], max_queue=2)
        a = await route.acquire(set())
        b = await route.acquire(set())
        assert {a.id, b.id} == {"i0", "i1"}  # next free instance
        order: list[str] = []

        async def waiter(tag: str) -> None:
            got = await route.acquire(set())
            order.append(f"{tag}->{got.id}")

        w1 = asyncio.ensure_future(waiter("w1"))
        await asyncio.sleep(0)
        w2 = asyncio.ensure_future(waiter("w2"))
        await asyncio.sleep(0)
        with pytest.raises(QueueFull):  # two queued already: the third is refused (503)
            await route.acquire(set())
        route.release(b)
        await asyncio.sleep(0)
        route.release(a)
        await asyncio.gather(w1, w2)
        return order

    assert asyncio.run(scenario()) == ["w1->i1", "w2->i0"]


def test_wrr_follows_quotas():
    async def scenario() -> collections.Counter[str]:
        route = _route("wrr", [100, 100], weights=[30.0, 10.0])
        seen: collections.Counter[str] = collections.Counter()
        for _ in range(400):
            b = await route.acquire(set())
            seen[b.id] += 1
            route.release(b)
        return seen

    seen = asyncio.run(scenario())
    assert seen == {"i0": 300, "i1": 100}


def test_batch_policy_fills_one_instance_first():
    async def scenario() -> list[str]:
        route = _route("batch", [4, 4])
        got = [await route.acquire(set()) for _ in range(6)]
        return [b.id for b in got]

    ids = asyncio.run(scenario())
    assert ids[:4] == [ids[0]] * 4 and set(ids[4:]) == {"i1" if ids[0] == "i0" else "i0"}


def test_retry_skips_the_failed_instance_and_dead_instances_fail_queue():
    async def scenario() -> None:
        route = _route("fifo", [1, 1])
        b = await route.acquire({"i0"})
        assert b.id == "i1"
        route.release(b)
        for inst in route.backends:
            inst.up = False
        with pytest.raises(QueueFull):
            await route.acquire(set())

    asyncio.run(scenario())


def test_route_switch_moves_queued_requests():
    async def scenario() -> str:
        d = Dispatcher(token="t", db=None, max_queue=4, state_dir=None)  # type: ignore[arg-type]
        d.set_routes(
            {
                "models": {
                    "m": {"policy": "fifo", "instances": [{"id": "old", "url": "u", "slots": 1}]}
                }
            }
        )
        held = await d.routes["m"].acquire(set())
        assert held.id == "old"
        waiter = asyncio.ensure_future(d.routes["m"].acquire(set()))
        await asyncio.sleep(0)
        d.set_routes(
            {
                "models": {
                    "m": {"policy": "fifo", "instances": [{"id": "new", "url": "u2", "slots": 1}]}
                }
            }
        )
        got = await asyncio.wait_for(waiter, 1.0)
        return got.id

    assert asyncio.run(scenario()) == "new"


def test_full_queue_answers_503_with_retry_after():
    """The real dispatcher app in front of a slow upstream: one in service, one queued
    (max_queue=1), the rest refused with 503 and Retry-After rather than queued."""
    import aiohttp
    from aiohttp import web

    async def scenario() -> list[tuple[int, str | None]]:
        release = asyncio.Event()

        async def slow_infer(request: web.Request) -> web.Response:
            await release.wait()
            return web.json_response({"model_name": "m", "outputs": []})

        upstream = web.Application()
        upstream.router.add_post("/v2/models/{name}/infer", slow_infer)
        up_runner = web.AppRunner(upstream)
        await up_runner.setup()
        up_site = web.TCPSite(up_runner, "127.0.0.1", 0)
        await up_site.start()
        up_port = up_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        d = Dispatcher(token="t", db=None, max_queue=1, state_dir=None)  # type: ignore[arg-type]
        d.set_routes(
            {
                "models": {
                    "m": {
                        "policy": "fifo",
                        "instances": [
                            {"id": "a", "url": f"http://127.0.0.1:{up_port}", "slots": 1}
                        ],
                    }
                }
            }
        )
        server, port = await d.start("127.0.0.1", 0)
        try:
            async with aiohttp.ClientSession() as session:

                async def one() -> tuple[int, str | None]:
                    url = f"http://127.0.0.1:{port}/v2/models/m/infer"
                    async with session.post(url, data=b'{"inputs": []}') as resp:
                        await resp.read()
                        return resp.status, resp.headers.get("Retry-After")

                tasks = [asyncio.ensure_future(one()) for _ in range(6)]
                while d.rejected < 4:  # bounded: 4 of 6 must be refused before any finishes
                    await asyncio.sleep(0.01)
                release.set()
                return await asyncio.gather(*tasks)
        finally:
            await d.stop(server)
            await up_runner.cleanup()

    answers = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert sorted(code for code, _ in answers) == [200, 200, 503, 503, 503, 503]
    assert all(retry == "1" for code, retry in answers if code == 503)
