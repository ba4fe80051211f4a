"""The upstream pool's timeouts (one timer per pool, checked every tick): a request to an
executor that never answers fails with UpstreamTimeout, in every event loop the pool is used
from; one answered in time leaves no deadline behind."""

from __future__ import annotations

import asyncio
import time

import pytest
from greenctl.executor.runtime.upstream import UpstreamPool, UpstreamTimeout


async def _silent_server() -> tuple[asyncio.AbstractServer, int]:
    """A server that reads requests and answers only ``POST /answer``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            if data.startswith(b"POST /answer"):
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_a_silent_upstream_times_out_in_every_loop_and_answers_leave_no_deadline() -> None:
    pool: UpstreamPool | None = None

    async def once() -> tuple[float, tuple[int, bytes], int]:
        nonlocal pool
        server, port = await _silent_server()
        if pool is None:
            pool = UpstreamPool(f"http://127.0.0.1:{port}")
        pool.port = port  # the same pool, a new server in a new loop
        pool.idle.clear()
        t0 = time.monotonic()
        with pytest.raises(UpstreamTimeout):
            await pool.post("/never", b"x", {}, 0.2)
        took = time.monotonic() - t0
        status, _, body = await pool.post("/answer", b"x", {}, 5.0)
        left = len(pool.deadlines.due)
        pool.close()
        server.close()
        return took, (status, body), left

    for _ in range(2):  # the second run: a fresh loop, the timer armed on it again
        took, answer, left = asyncio.run(asyncio.wait_for(once(), 20))
        assert 0.2 <= took < 5.0
        assert answer == (200, b"ok")
        assert left == 0
