"""The dispatcher's per-request shortcuts give what the general rules give.

Small bodies that come whole with their head are read by the parser (larger ones into a
buffer of their own), dynamic route matches are remembered, upstream answers are parsed
where they came, histogram buckets are found by bisection: each is checked here against the
general rule or over real sockets, with the bytes split every way that matters.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import random

import pytest
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.metrics import BATCH_BUCKETS, LATENCY_BUCKETS_S, bucket_index
from greenctl.executor.runtime.upstream import UpstreamError, UpstreamPool


def _run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def _linear_bucket(bounds: tuple[float, ...], value: float) -> int:
    for i, b in enumerate(bounds):
        if value <= b:
            return i
    return len(bounds)


def test_bucket_index_is_the_first_bound_a_value_fits_under() -> None:
    rng = random.Random(7)
    for bounds in (LATENCY_BUCKETS_S, BATCH_BUCKETS):
        values = [*bounds, *(b * 0.999 for b in bounds), *(b * 1.001 for b in bounds)]
        values += [0.0, -1.0, math.inf, -math.inf, math.nan, 10**9]
        values += [rng.uniform(0, 2 * bounds[-1]) for _ in range(500)]
        for v in values:
            assert bucket_index(bounds, v) == _linear_bucket(bounds, v), (bounds, v)


def test_router_remembers_dynamic_matches_without_sharing_their_parameters() -> None:
    async def a(request: hs.Request) -> hs.Response:
        return hs.Response(text="a")

    async def b(request: hs.Request) -> hs.Response:
        return hs.Response(text="b")

    router = hs.Router()
    router.add_get("/v2/models/{name}", a)
    first, params, _ = router.resolve("GET", "/v2/models/m1")
    assert first is a and params == {"name": "m1"}
    params["name"] = "changed by a handler"
    again, params2, _ = router.resolve("HEAD", "/v2/models/m1")
    assert again is a and params2 == {"name": "m1"}
    # a miss is not remembered: a route added later answers it
    none, _, allowed = router.resolve("POST", "/v2/models/m1")
    assert none is None and allowed == {"GET"}
    router.add_post("/v2/models/{name}", b)
    got, params3, _ = router.resolve("POST", "/v2/models/m1")
    assert got is b and params3 == {"name": "m1"}


async def _digest_server() -> tuple[hs.Server, int]:
    router = hs.Router()

    async def digest(request: hs.Request) -> hs.Response:
        body = await request.read()
        return hs.Response(
            text=f"{request.match_info['name']} {len(body)} {hashlib.sha256(body).hexdigest()}"
        )

    router.add_post("/v2/models/{name}/infer", digest)
    server = hs.Server(router)
    return server, await server.start("127.0.0.1", 0)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        int(v) for k, _, v in (x.partition(":") for x in lines) if k.lower() == "content-length"
    )
    return int(lines[0].split()[1]), await reader.readexactly(length)


@pytest.mark.parametrize("split", ["whole", "bytewise", "random"])
def test_pipelined_small_and_large_bodies_arrive_whole_and_in_order(split: str) -> None:
    rng = random.Random(3)
    sizes = [1, 155, 16 * 1024, 16 * 1024 + 1, 3, 70_000, 40, 0]
    bodies = [bytes(rng.randrange(256) for _ in range(n)) for n in sizes]
    stream = b"".join(
        b"POST /v2/models/m%d/infer HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n%s"
        % (i, len(body), body)
        for i, body in enumerate(bodies)
    )

    async def scenario() -> list[tuple[int, bytes]]:
        server, port = await _digest_server()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if split == "whole":
            writer.write(stream)
        else:
            at = 0
            while at < len(stream):
                step = 1 if split == "bytewise" and at < 2000 else rng.randint(1, 9000)
                writer.write(stream[at : at + step])
                await writer.drain()
                at += step
        out = [await _answer(reader) for _ in bodies]
        writer.close()
        await server.shutdown()
        return out

    answers = _run(scenario())
    for i, (body, (status, text)) in enumerate(zip(bodies, answers, strict=True)):  # type: ignore[arg-type]
        assert status == 200
        assert text.decode() == f"m{i} {len(body)} {hashlib.sha256(body).hexdigest()}"


async def _executor_stand_in(
    chunks: list[bytes], *, pause_s: float = 0.01
) -> tuple[asyncio.Server, int]:
    """Answers each request (whatever it is) with ``chunks`` written one by one."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(v)
                    for k, _, v in (x.partition(b":") for x in head.split(b"\r\n"))
                    if k.lower() == b"content-length"
                )
                await reader.readexactly(length)
                for chunk in chunks:
                    writer.write(chunk)
                    await writer.drain()
                    await asyncio.sleep(pause_s)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Type: application/octet-stream\r\n"
    b'Inference-Header-Content-Length: 5\r\nGreenctl-Queue-Ms:  0.5 \r\n\r\n{"a"}binary!'
)


@pytest.mark.parametrize(
    "cut", [[], [10], [len(ANSWER) - 3], [30, 31, 80], list(range(1, len(ANSWER)))]
)
def test_upstream_answers_parse_the_same_however_they_are_split(cut: list[int]) -> None:
    marks = [0, *cut, len(ANSWER)]
    chunks = [ANSWER[a:b] for a, b in itertools.pairwise(marks)]

    async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
        server, port = await _executor_stand_in(chunks, pause_s=0.0 if len(chunks) > 10 else 0.01)
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        try:
            return [  # twice: the second on the kept-alive connection
                await pool.post("/v2/models/m/infer", b"x" * 5, {"Content-Type": "a/b"}, 5.0)
                for _ in range(2)
            ]
        finally:
            pool.close()
            server.close()

    for status, headers, body in _run(scenario()):  # type: ignore[union-attr]
        assert status == 200
        assert body == b'{"a"}binary!'
        assert headers == {
            "content-length": "12",
            "content-type": "application/octet-stream",
            "inference-header-content-length": "5",
            "greenctl-queue-ms": "0.5",
        }


def test_an_upstream_answer_without_length_is_an_upstream_error() -> None:
    async def scenario() -> str:
        server, port = await _executor_stand_in([b"HTTP/1.1 200 OK\r\n", b"X: y\r\n\r\nbody"])
        pool = UpstreamPool(f"http://127.0.0.1:{port}")
        try:
            await pool.post("/v2/models/m/infer", b"x", {}, 5.0)
        except UpstreamError as exc:
            return str(exc)
        finally:
            pool.close()
            server.close()
        return "no error"

    assert _run(scenario()) == "response without Content-Length"


def test_repeated_request_headers_are_joined_in_order_and_looked_up_in_any_case() -> None:
    async def scenario() -> bytes:
        router = hs.Router()

        async def show(request: hs.Request) -> hs.Response:
            return hs.json_response(
                [request.headers.get("X-Tag"), request.headers["accept"], request.headers["x-1"]]
            )

        router.add_get("/show", show)
        server = hs.Server(router)
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /show HTTP/1.1\r\nHost: h\r\nX-Tag: one\r\nAccept: */*\r\nx-tag: one\r\n"
            b"X-TAG: three\r\nX-1: 1\r\nX-1: 1\r\nX-1:\r\n\r\n"
        )
        _, body = await _answer(reader)
        writer.close()
        await server.shutdown()
        return body

    assert _run(scenario()) == b'["one, one, three", "*/*", "1, 1, "]'
