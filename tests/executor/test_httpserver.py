"""The lean inbound HTTP/1.1 server, spoken to over raw sockets.

Raw bytes rather than a client library: the cases are what clients libraries send in the
wild (keep-alive, pipelining, chunked bodies, ``Expect: 100-continue``, ``HEAD``) and what
they must never see (a reordered answer, a hung connection after a malformed request).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from collections.abc import AsyncIterator

import pytest
from greenctl.executor.runtime import httpserver as hs


async def _serve(**kw: object) -> tuple[hs.Server, int, dict[str, asyncio.Event]]:
    events = {"release": asyncio.Event(), "entered": asyncio.Event()}
    router = hs.Router()

    async def echo(request: hs.Request) -> hs.Response:
        body = await request.read()
        return hs.json_response(
            {
                "name": request.match_info.get("name"),
                "len": len(body),
                "body": body.decode(),
                "ctype": request.headers.get("content-type"),
                "remote": request.remote,
                "query": request.query_string,
            }
        )

    async def slow(request: hs.Request) -> hs.Response:
        events["entered"].set()
        await events["release"].wait()
        return hs.Response(text="slow done")

    async def fast(request: hs.Request) -> hs.Response:
        return hs.Response(text="fast")

    async def boom(request: hs.Request) -> hs.Response:
        raise RuntimeError("kaput")

    kept: list[bytes | bytearray] = []

    async def digest(request: hs.Request) -> hs.Response:
        body = await request.read()
        if request.query_string == "keep":  # a handler that holds on to the body
            kept.append(body)
        return hs.json_response(
            {"len": len(body), "sha": hashlib.sha256(body).hexdigest(), "kept": len(kept)}
        )

    router.add_post("/v2/models/{name}/infer", echo)
    router.add_get("/v2/models/{name}", echo)
    router.add_get("/slow", slow)
    router.add_get("/fast", fast)
    router.add_get("/boom", boom)
    router.add_post("/digest", digest)
    server = hs.Server(router, **kw)  # type: ignore[arg-type]
    server.kept = kept  # type: ignore[attr-defined]
    port = await server.start("127.0.0.1", 0)
    return server, port, events


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


def _run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 20))  # type: ignore[arg-type]


def test_keep_alive_path_params_headers_and_query() -> None:
    async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
        server, port, _ = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []
        for i in range(3):  # three requests on one connection
            body = json.dumps({"i": i}).encode()
            writer.write(
                b"POST /v2/models/m%d/infer?x=1 HTTP/1.1\r\nHost: h\r\n"
                b"CONTENT-TYPE: application/json\r\nContent-Length: %d\r\n\r\n"
                % (i, len(body))
                + body
            )
            out.append(await _read_response(reader))
        writer.close()
        await server.shutdown()
        return out

    answers = _run(scenario())
    for i, (status, headers, body) in enumerate(answers):  # type: ignore[union-attr]
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert "connection" not in headers  # kept alive
        doc = json.loads(body)
        assert doc == {
            "name": f"m{i}",
            "len": len(json.dumps({"i": i})),
            "body": json.dumps({"i": i}),
            "ctype": "application/json",  # looked up case-insensitively
            "remote": "127.0.0.1",
            "query": "x=1",
        }


def test_pipelined_requests_answer_in_order_even_when_the_first_is_slow() -> None:
    async def scenario() -> list[bytes]:
        server, port, ev = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\nGET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
        await ev["entered"].wait()
        await asyncio.sleep(0.05)  # /fast is parsed by now, and must wait its turn
        ev["release"].set()
        first = await _read_response(reader)
        second = await _read_response(reader)
        writer.close()
        await server.shutdown()
        return [first[2], second[2]]

    assert _run(scenario()) == [b"slow done", b"fast"]


def test_chunked_body_expect_continue_and_head() -> None:
    async def scenario() -> tuple[bytes, bytes, tuple[int, dict[str, str], bytes]]:
        server, port, _ = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v2/models/c/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        )
        chunked = (await _read_response(reader))[2]
        writer.write(
            b"POST /v2/models/e/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        interim = await reader.readuntil(b"\r\n\r\n")  # before the body is sent
        writer.write(b"abc")
        expect = (await _read_response(reader))[2]
        assert interim.startswith(b"HTTP/1.1 100 Continue")
        writer.write(b"HEAD /v2/models/h HTTP/1.1\r\nHost: h\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")  # HEAD sent no body
        after = await _read_response(reader)
        writer.close()
        await server.shutdown()
        assert (
            b"Content-Length: " in head
            and int(head.split(b"Content-Length: ")[1].split(b"\r")[0]) > 0
        )
        return chunked, expect, after

    chunked, expect, after = _run(scenario())  # type: ignore[misc]
    assert json.loads(chunked)["body"] == "hello world"
    assert json.loads(expect)["body"] == "abc"
    assert after[2] == b"fast"


def test_errors_404_405_500_and_malformed() -> None:
    async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
        server, port, _ = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []
        for req in (
            b"GET /nope HTTP/1.1\r\nHost: h\r\n\r\n",
            b"DELETE /v2/models/m/infer HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /v2/models/m/infer HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n",
            b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n",  # the connection survives all of those
        ):
            writer.write(req)
            out.append(await _read_response(reader))
        writer.write(b"THIS IS NOT HTTP\r\n\r\n")
        out.append(await _read_response(reader))
        assert await reader.read() == b""  # and a malformed request closes it
        writer.close()
        await server.shutdown()
        return out

    answers = _run(scenario())
    codes = [a[0] for a in answers]  # type: ignore[union-attr]
    assert codes == [404, 405, 405, 500, 200, 400]
    assert answers[1][1]["allow"] == "POST"  # type: ignore[index]
    assert answers[2][1]["allow"] == "POST"  # type: ignore[index]
    assert "kaput" in json.loads(answers[3][2])["error"]  # type: ignore[index]
    assert answers[5][1]["connection"] == "close"  # type: ignore[index]


def test_oversized_body_gets_413_and_the_connection_closes() -> None:
    async def scenario() -> tuple[int, dict[str, str], bytes]:
        server, port, _ = await _serve(max_body=1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 2000\r\n\r\n"
            + b"x" * 2000
        )
        answer = await _read_response(reader)
        assert await reader.read() == b""
        writer.close()
        # a chunked body that grows past the limit is refused too
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"3e8\r\n"
            + b"y" * 1000
            + b"\r\n3e8\r\n"
            + b"y" * 1000
            + b"\r\n0\r\n\r\n"
        )
        chunked = await _read_response(reader)
        writer.close()
        await server.shutdown()
        assert chunked[0] == 413
        return answer

    status, headers, body = _run(scenario())  # type: ignore[misc]
    assert status == 413
    assert headers["connection"] == "close"
    assert "1000 byte limit" in json.loads(body)["error"]


def test_connection_close_and_http10() -> None:
    async def scenario() -> list[tuple[int, dict[str, str], bytes]]:
        server, port, _ = await _serve()
        out = []
        for req in (
            b"GET /fast HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n",
            b"GET /fast HTTP/1.0\r\n\r\n",
        ):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(req)
            out.append(await _read_response(reader))
            assert await reader.read() == b""
            writer.close()
        await server.shutdown()
        return out

    for status, headers, body in _run(scenario()):  # type: ignore[union-attr]
        assert (status, headers["connection"], body) == (200, "close", b"fast")


def test_shutdown_lets_in_flight_requests_finish_and_closes_idle_ones() -> None:
    async def scenario() -> tuple[tuple[int, dict[str, str], bytes], bytes]:
        server, port, ev = await _serve()
        idle_r, idle_w = await asyncio.open_connection("127.0.0.1", port)
        idle_w.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
        await _read_response(idle_r)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        await ev["entered"].wait()
        stopping = asyncio.ensure_future(server.shutdown(timeout_s=10))
        await asyncio.sleep(0.05)
        assert await idle_r.read() == b""  # idle keep-alive connection closed at once
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)  # no longer accepting
        ev["release"].set()
        answer = await _read_response(reader)
        rest = await reader.read()
        await stopping
        writer.close()
        idle_w.close()
        return answer, rest

    (status, headers, body), rest = _run(scenario())  # type: ignore[misc]
    assert (status, body, headers["connection"], rest) == (200, b"slow done", "close", b"")


def test_idle_keepalive_connections_are_swept() -> None:
    async def scenario() -> bytes:
        server, port, _ = await _serve(keepalive_s=0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
        await _read_response(reader)
        closed = await asyncio.wait_for(reader.read(), 5)  # closed by the sweep, not by us
        writer.close()
        await server.shutdown()
        return closed

    assert _run(scenario()) == b""


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection (bounded: a test of a
    timeout must not hang when the timeout is missing)."""
    return await asyncio.wait_for(reader.read(), seconds)


def test_slow_loris_heads_get_408_and_are_closed() -> None:
    """A head trickled a byte at a time, and a connection that sends nothing at all, are
    dropped after ``header_timeout_s`` (not kept while bytes keep coming)."""

    async def scenario() -> tuple[bytes, bytes, bytes]:
        server, port, _ = await _serve(header_timeout_s=0.4)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
        head = b"GET /fast HTTP/1.1\r\nHost: h\r\nX-Slow: " + b"a" * 100
        reading = asyncio.ensure_future(_closed_within(reader, 5))  # read as it comes
        for byte in head[:30]:  # 3 s of one byte per 0.1 s: far past the 0.4 s limit
            if reading.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(0.1)
        trickled = await reading
        silent = await _closed_within(silent_r, 5)
        # a well-behaved client on the same server is unaffected
        ok_r, ok_w = await asyncio.open_connection("127.0.0.1", port)
        ok_w.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
        ok = (await _read_response(ok_r))[2]
        for w in (writer, silent_w, ok_w):
            w.close()
        await server.shutdown()
        return trickled, silent, ok

    trickled, silent, ok = _run(scenario())  # type: ignore[misc]
    assert trickled.startswith(b"HTTP/1.1 408 ") and b"request head not received" in trickled
    assert b"Connection: close" in trickled
    assert silent.startswith(b"HTTP/1.1 408 ")
    assert ok == b"fast"


def test_a_body_shorter_than_its_content_length_times_out() -> None:
    async def scenario() -> tuple[bytes, bytes]:
        server, port, _ = await _serve(body_timeout_s=0.3)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n{"
        )
        stalled = await _closed_within(reader, 5)
        writer.close()
        # a body trickled faster than body_timeout_s still ends at request_timeout_s
        await server.shutdown()
        server, port, _ = await _serve(body_timeout_s=0.3, request_timeout_s=0.8)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v2/models/m/infer HTTP/1.1\r\nHost: h\r\nContent-Length: 1000\r\n\r\n")
        reading = asyncio.ensure_future(_closed_within(reader, 5))
        for _ in range(40):  # 4 s of a byte per 0.1 s
            if reading.done():
                break
            writer.write(b"x")
            await asyncio.sleep(0.1)
        trickled = await reading
        writer.close()
        await server.shutdown()
        return stalled, trickled

    stalled, trickled = _run(scenario())  # type: ignore[misc]
    assert stalled.startswith(b"HTTP/1.1 408 ") and b"body stalled" in stalled
    assert trickled.startswith(b"HTTP/1.1 408 ") and b"request not received" in trickled


def test_connection_cap_closes_the_longest_idle_then_refuses_with_503() -> None:
    async def scenario() -> dict[str, object]:
        server, port, _ = await _serve(max_connections=2)
        out: dict[str, object] = {}
        conns = []
        for _ in range(2):  # two idle keep-alive connections
            r, w = await asyncio.open_connection("127.0.0.1", port)
            w.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
            await _read_response(r)
            conns.append((r, w))
            await asyncio.sleep(0.02)
        # a third connection closes the one idle the longest, and is served
        r3, w3 = await asyncio.open_connection("127.0.0.1", port)
        out["oldest"] = await _closed_within(conns[0][0], 5)
        w3.write(b"GET /fast HTTP/1.1\r\nHost: h\r\n")  # mid-request: not idle
        r4, w4 = await asyncio.open_connection("127.0.0.1", port)  # closes conns[1]
        out["second"] = await _closed_within(conns[1][0], 5)
        w4.write(b"GET /fast HTTP/1.1\r\n")  # mid-request too
        await asyncio.sleep(0.05)
        r5, w5 = await asyncio.open_connection("127.0.0.1", port)  # nothing idle: refused
        out["refused"] = await _closed_within(r5, 5)
        w3.write(b"\r\n")
        out["third"] = (await _read_response(r3))[2]
        out["count"] = server.refused
        for _, w in [*conns, (r3, w3), (r4, w4), (r5, w5)]:
            w.close()
        await server.shutdown()
        return out

    out = _run(scenario())
    assert out["oldest"] == b"" and out["second"] == b""  # type: ignore[index]
    refused = out["refused"]  # type: ignore[index]
    assert refused.startswith(b"HTTP/1.1 503 ") and b"Retry-After: 1" in refused
    assert out["third"] == b"fast" and out["count"] == 1  # type: ignore[index]


def test_oversized_head_gets_431() -> None:
    async def scenario() -> bytes:
        server, port, _ = await _serve(max_header_bytes=1000)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /fast HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
        answer = await _closed_within(reader, 5)
        writer.close()
        await server.shutdown()
        return answer

    answer = _run(scenario())
    assert answer.startswith(b"HTTP/1.1 431 ") and b"1000 byte limit" in answer  # type: ignore[union-attr]


def test_a_client_that_does_not_read_its_answers_is_dropped() -> None:
    """Pipelined requests from a client that never reads: answering stops when its socket
    is full (no unbounded buffering), and it is disconnected after ``send_timeout_s``."""
    import socket

    async def scenario() -> tuple[int, int]:
        router = hs.Router()

        async def big(request: hs.Request) -> hs.Response:
            return hs.Response(body=b"z" * 1_000_000)

        router.add_get("/big", big)
        server = hs.Server(router, send_timeout_s=0.5)
        port = await server.start("127.0.0.1", 0)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: h\r\n\r\n" * 50)  # 50 MB of answers
        for _ in range(100):
            await asyncio.sleep(0.1)
            if not server.connections:
                break
        left = len(server.connections)
        running = len(server.tasks)  # handlers still waiting to write
        sock.close()
        await server.shutdown()
        return left, running

    left, running = _run(scenario())  # type: ignore[misc]
    assert left == 0 and running == 0


def _stream_server(pieces: int, size: int, closed: list[bool], **kw: object) -> hs.Server:
    """A server whose ``/stream`` sends ``pieces`` pieces of ``size`` bytes (piece i is
    filled with byte ``i % 256``); ``closed`` records that the source was closed."""
    router = hs.Router()

    async def source() -> AsyncIterator[bytes]:
        try:
            for i in range(pieces):
                yield bytes([i % 256]) * size
        finally:
            closed.append(True)

    async def stream(request: hs.Request) -> hs.Response:
        return hs.StreamResponse(source())

    async def fast(request: hs.Request) -> hs.Response:
        return hs.Response(text="fast")

    router.add_get("/stream", stream)
    router.add_get("/fast", fast)
    return hs.Server(router, **kw)  # type: ignore[arg-type]


def test_a_stream_waits_for_a_slow_reader_then_sends_the_rest_in_order() -> None:
    """A stream larger than the socket buffers to a client that reads only later: the
    server stops writing while the client does not read, resumes when it does, and every
    piece arrives in order; the pipelined request behind it is answered after it."""
    import socket

    pieces, size = 64, 256 * 1024

    async def scenario() -> tuple[bytes, int, bytes, list[bool]]:
        closed: list[bool] = []
        server = _stream_server(pieces, size, closed)
        port = await server.start("127.0.0.1", 0)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        sock.sendall(
            b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\nGET /fast HTTP/1.1\r\nHost: h\r\n\r\n"
        )
        await asyncio.sleep(0.3)  # not reading: the server's writes stall
        # stalled, and waiting to be woken when the client reads (not polling)
        stalled = [
            (c.write_stalled_since is not None, c._drained is not None) for c in server.connections
        ]
        reader, writer = await asyncio.open_connection(sock=sock)
        head = await reader.readuntil(b"\r\n\r\n")
        body = bytearray()
        while True:
            n = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            body += await reader.readexactly(n + 2)
            if n == 0:
                break
        fast = await _read_response(reader)
        writer.close()
        await server.shutdown()
        assert stalled == [(True, True)]
        return head, len(body), bytes(body[:-2]), [*closed, fast[2] == b"fast"]

    head, total, body, flags = _run(scenario())  # type: ignore[misc]
    assert head.startswith(b"HTTP/1.1 200 ") and b"Transfer-Encoding: chunked" in head
    expected = b"".join(bytes([i % 256]) * size + b"\r\n" for i in range(pieces))
    assert total == len(expected) + 2 and body == expected
    assert flags == [True, True]  # the source was closed; the next request answered


def test_a_stream_to_a_client_that_never_reads_is_cut_and_its_source_closed() -> None:
    """A stalled stream whose client never reads again ends after ``send_timeout_s``:
    the connection is dropped and the stream's source closed (nothing left running)."""
    import socket

    async def scenario() -> tuple[list[bool], int, int]:
        closed: list[bool] = []
        server = _stream_server(10_000, 256 * 1024, closed, send_timeout_s=0.5)
        port = await server.start("127.0.0.1", 0)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
        for _ in range(100):
            await asyncio.sleep(0.1)
            if closed:
                break
        left, running = len(server.connections), len(server.tasks)
        sock.close()
        await server.shutdown()
        return closed, left, running

    assert _run(scenario()) == ([True], 0, 0)


def test_request_json_refuses_deep_nesting_as_a_value_error() -> None:
    request = hs.Request("POST", "/", "", hs.Headers(), b"[" * 100_000 + b"]" * 100_000, None)
    with pytest.raises(ValueError, match="nested too deeply"):
        asyncio.run(request.json())


def test_settle_heap_freezes_what_is_alive_and_still_collects_later_garbage() -> None:
    """Run in a child so the test process's own collector is left as it was."""
    import subprocess
    import sys

    code = """
import gc, weakref
from greenctl.executor.runtime.procs import settle_heap
keep = [[i] for i in range(1000)]
settle_heap()
frozen = gc.get_freeze_count()
class Node: pass
a, b = Node(), Node()
a.b, b.a = b, a
gone = weakref.ref(a)
del a, b
gc.collect()
print(frozen >= 1000, gone() is None)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True"]


def _post(body: bytes, query: str = "") -> tuple[bytes, bytes]:
    head = b"POST /digest%s HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % (
        (b"?" + query.encode()) if query else b"",
        len(body),
    )
    return head, body


def test_bodies_of_known_length_arrive_whole_however_the_bytes_are_split() -> None:
    """A 600 KB tensor body is read straight into its own buffer: the head may end in one
    read and the body start in it, the head's CRLF CRLF may straddle two reads, requests may
    be pipelined with their bodies, and each arrives whole, in order."""
    rng = random.Random(7)
    bodies = [rng.randbytes(602_263), rng.randbytes(602_263), b"x" * 5, rng.randbytes(70_000)]

    async def scenario() -> list[tuple[int, dict[str, object]]]:
        server, port, _ = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []

        async def answer() -> None:
            status, _, body = await _read_response(reader)
            out.append((status, json.loads(body)))

        for body in bodies:
            head, data = _post(body)
            whole = head + data
            splits = [
                [whole],  # one write
                [head, data],  # the head, then the body
                [head[:-2], head[-2:] + data],  # CRLF CRLF across two writes
                [head[:-1], head[-1:], data[:10], data[10:]],
                [head + data[:1000], data[1000:]],  # the body starts with the head
                [bytes([b]) for b in head]
                + [data[i : i + 65_536] for i in range(0, len(data), 65_536)],
            ]
            for parts in splits:
                for part in parts:
                    writer.write(part)
                    await writer.drain()
                    await asyncio.sleep(0)
                await answer()
        # pipelined: three requests and a GET in one write, the last POST split mid-body
        h1, d1 = _post(bodies[0])
        h2, d2 = _post(b"")
        h3, d3 = _post(bodies[3])
        burst = h1 + d1 + h2 + d2 + h3 + d3[:500]
        writer.write(burst + d3[500:] + b"GET /fast HTTP/1.1\r\nHost: h\r\n\r\n")
        for _ in range(3):
            await answer()
        fast = await _read_response(reader)
        writer.close()
        await server.shutdown()
        assert fast[2] == b"fast"
        return out

    got = _run(scenario())
    expect = [b for b in bodies for _ in range(6)] + [bodies[0], b"", bodies[3]]
    assert len(got) == len(expect)  # type: ignore[arg-type]
    for (status, doc), body in zip(got, expect, strict=True):  # type: ignore[misc]
        assert status == 200
        assert doc["len"] == len(body) and doc["sha"] == hashlib.sha256(body).hexdigest()


def test_body_buffers_are_reused_only_once_nothing_holds_them() -> None:
    """Bodies of one size take turns in one buffer; a body a handler still holds is never
    written over by a later request."""
    rng = random.Random(3)
    bodies = [rng.randbytes(100_000) for _ in range(6)]

    async def scenario() -> tuple[list[dict[str, object]], object, int]:
        server, port, _ = await _serve()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        docs = []
        for i, body in enumerate(bodies):
            head, data = _post(body, "keep" if i == 2 else "")
            writer.write(head + data)
            docs.append(json.loads((await _read_response(reader))[2]))
        writer.close()
        kept = server.kept  # type: ignore[attr-defined]
        buffers = len(server.body_buffers.kept)
        await server.shutdown()
        return docs, kept, buffers

    docs, kept, buffers = _run(scenario())  # type: ignore[misc]
    for doc, body in zip(docs, bodies, strict=True):  # type: ignore[arg-type]
        assert doc["sha"] == hashlib.sha256(body).hexdigest()
    (held,) = kept  # type: ignore[misc]
    assert bytes(held) == bodies[2]  # untouched by the three requests after it
    assert buffers == 2  # one taking turns, one held by the handler
