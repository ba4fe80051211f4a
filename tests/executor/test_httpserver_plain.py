"""Handlers marked ``plain_awaits`` run without a Task: they answer like any other handler
(awaiting futures and ``sleep(0)``, a 500 for an exception, in order when pipelined, a long
run of pipelined answers without exhausting the stack), and shutdown stops one still
waiting (its ``finally`` runs)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from greenctl.executor.runtime import httpserver as hs

T = TypeVar("T")


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 20))


async def _answers(reader: asyncio.StreamReader, n: int) -> list[tuple[int, bytes]]:
    """``n`` answers (status, body) read off one connection."""
    out = []
    for _ in range(n):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(x.split(":")[1]) for x in lines if x.lower().startswith("content-"))
        out.append((int(lines[0].split(" ")[1]), await reader.readexactly(length)))
    return out


def test_plain_handlers_await_futures_fail_with_500_and_pipeline_in_order() -> None:
    async def scenario() -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]], int]:
        loop = asyncio.get_running_loop()

        @hs.plain_awaits
        async def waits(request: hs.Request) -> hs.Response:
            fut = loop.create_future()
            loop.call_later(0.01, fut.set_result, request.match_info["n"].encode())
            await asyncio.sleep(0)
            return hs.Response(body=await fut)

        @hs.plain_awaits
        async def now(request: hs.Request) -> hs.Response:
            return hs.Response(body=request.match_info["n"].encode())

        @hs.plain_awaits
        async def breaks(request: hs.Request) -> hs.Response:
            await asyncio.sleep(0)
            raise KeyError("boom")

        router = hs.Router()
        router.add_get("/wait/{n}", waits)
        router.add_get("/now/{n}", now)
        router.add_get("/break", breaks)
        server = hs.Server(router)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /wait/1 HTTP/1.1\r\nHost: h\r\n\r\n"
            b"GET /now/2 HTTP/1.1\r\nHost: h\r\n\r\n"
            b"GET /break HTTP/1.1\r\nHost: h\r\n\r\n"
            b"GET /wait/4 HTTP/1.1\r\nHost: h\r\n\r\n"
        )
        mixed = await _answers(reader, 4)
        many = 2000  # answered at once, one after another: deeper than the stack allows
        writer.write(b"".join(b"GET /now/%d HTTP/1.1\r\nHost: h\r\n\r\n" % i for i in range(many)))
        run = await _answers(reader, many)
        writer.close()
        left = len(server.driven)
        await server.shutdown()
        return mixed, run, left

    mixed, run, left = _run(scenario())
    assert [s for s, _ in mixed] == [200, 200, 500, 200]
    assert mixed[0][1] == b"1" and mixed[1][1] == b"2" and mixed[3][1] == b"4"
    assert b"internal error: KeyError" in mixed[2][1]
    assert [b for _, b in run] == [str(i).encode() for i in range(2000)]
    assert left == 0


def test_shutdown_stops_a_plain_handler_still_waiting() -> None:
    async def scenario() -> tuple[bool, int]:
        loop = asyncio.get_running_loop()
        finished = loop.create_future()

        @hs.plain_awaits
        async def stuck(request: hs.Request) -> hs.Response:
            try:
                await loop.create_future()  # never set
            finally:
                finished.set_result(True)
            return hs.Response()

        router = hs.Router()
        router.add_get("/stuck", stuck)
        server = hs.Server(router)
        port = await server.start("127.0.0.1", 0)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /stuck HTTP/1.1\r\nHost: h\r\n\r\n")
        await writer.drain()
        for _ in range(200):
            if server.driven:
                break
            await asyncio.sleep(0.01)
        await server.shutdown(timeout_s=0.2)
        writer.close()
        return finished.done(), len(server.driven)

    finished, left = _run(scenario())
    assert finished and left == 0
