"""The dispatcher's relay of plain requests as bytes, and the server shortcut under it.

What is plain is checked against the parser (anything the relay takes, httptools reads the
same way); the server's shortcut is checked over real sockets with the bytes split every way
that matters; the dispatcher's relayed answers are checked against the answers the parsed
way gives the same request, and against an instance that drops its connection.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import httptools
import pytest
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.dispatch_relay import parsed_request, plain_answer, plain_request
from greenctl.executor.runtime.dispatcher import Dispatcher

_HEAD = (
    b"POST /v2/models/resnet/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nUser-Agent: t/1\r\n"
    b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: 12\r\n"
    b"Content-Length: 76\r\n\r\n"
)


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


def test_a_plain_head_gives_its_model_length_and_tensor_head() -> None:
    assert plain_request(_HEAD) == ("resnet", 76, "12")
    keep = _HEAD.replace(b"Host:", b"Connection: Keep-Alive\r\nHost:")
    assert plain_request(keep) == ("resnet", 76, "12")
    no_tensor = _HEAD.replace(b"Inference-Header-Content-Length: 12\r\n", b"")
    assert plain_request(no_tensor) == ("resnet", 76, None)
    shouting = _HEAD.replace(b"Content-Length: 76", b"CONTENT-LENGTH:   76 ")
    assert plain_request(shouting) == ("resnet", 76, "12")
    # long heads are read afresh each time, short ones remembered: the same answers
    long = _HEAD.replace(b"Host:", b"X-Pad: %b\r\nHost:" % (b"p" * 5000))
    assert [plain_request(h) for h in (long, long, _HEAD, _HEAD)] == [("resnet", 76, "12")] * 4
    assert plain_request(long.replace(b"Host:", b"Expect: x\r\nHost:")) is None


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"HTTP/1.1", b"HTTP/1.0"),
        (b"POST ", b"PUT "),
        (b"/infer ", b"/infer?x=1 "),
        (b"/resnet/", b"/resnet/versions/1/"),
        (b"/resnet/", b"/res net/"),
        (b"Host:", b"Transfer-Encoding: chunked\r\nHost:"),
        (b"Host:", b"Expect: 100-continue\r\nHost:"),
        (b"Host:", b"Upgrade: h2c\r\nHost:"),
        (b"Host:", b"Connection: close\r\nHost:"),
        (b"Host:", b"Connection: keep-alive\r\nConnection: keep-alive\r\nHost:"),
        (b"Host:", b"Content-Length: 76\r\nHost:"),
        (b"Content-Length: 76\r\n", b""),
        (b"Content-Length: 76", b"Content-Length: +76"),
        (b"Content-Length: 76", b"Content-Length: 7 6"),
        (b"Host:", b"Inference-Header-Content-Length: 3\r\nHost:"),
        (b"User-Agent: t/1", b"User-Agent: t\x01"),
        (b"User-Agent: t/1", b"User-Agent: t/1\r\n folded"),
        (b"User-Agent:", b"User-Agent :"),
        (b"User-Agent: t/1", b"User-Agent: a\nb"),
        (b"Accept: */*", b"Accept */*"),
    ],
)
def test_what_is_not_plain_goes_the_parsed_way(old: bytes, new: bytes) -> None:
    head = _HEAD.replace(old, new, 1)
    assert head != _HEAD
    assert plain_request(head) is None


class _Parsed:
    def __init__(self) -> None:
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_message_complete(self) -> None:
        self.done = True


def test_whatever_the_relay_takes_the_parser_reads_alike() -> None:
    """Random damage to a plain head: each head the relay still takes, httptools parses
    without error, to the same path and body length, kept alive."""
    rng = random.Random(11)
    alphabet = b" \t\r\n:/?#,;\x00\x01\x7f\x80\xffaZ09-"
    taken = 0
    for _ in range(4000):
        head = bytearray(_HEAD)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(head) - 4)
            action = rng.random()
            if action < 0.4:
                head[at] = rng.choice(alphabet)
            elif action < 0.7:
                head.insert(at, rng.choice(alphabet))
            else:
                del head[at]
        got = plain_request(bytes(head))
        if got is None:
            continue
        taken += 1
        name, size, _ = got
        seen = _Parsed()
        parser = httptools.HttpRequestParser(seen)
        parser.feed_data(bytes(head) + b"x" * size)
        assert seen.done and parser.should_keep_alive(), bytes(head)
        assert seen.url == f"/v2/models/{name}/infer".encode()
        lengths = [v for k, v in seen.headers if k == b"content-length"]
        assert [int(v) for v in lengths] == [size]
    assert taken > 100  # damage that keeps a head plain (a letter in a value) is common


def test_a_plain_answer_is_what_executors_write_and_nothing_else() -> None:
    headers = {
        "Content-Type": "application/octet-stream",
        oip.HEADER_LENGTH: "40",
        oip.QUEUE_MS_HEADER: "0.0100",
        oip.INFER_MS_HEADER: "0.5000",
    }
    ok = hs.Response(body=b"x" * 50, headers=headers).encode(keep_alive=True)
    assert plain_answer(ok[: ok.find(b"\r\n\r\n")])
    for doc in (
        hs.Response(status=503, body=b"{}", headers=headers),
        hs.Response(body=b"{}", headers={**headers, "Retry-After": "1"}),
        hs.Response(body=b"{}", headers={oip.HEADER_LENGTH: "2"}),  # no content type
    ):
        raw = doc.encode(keep_alive=True)
        assert not plain_answer(raw[: raw.find(b"\r\n\r\n")])
    closing = ok.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n", 1)
    assert not plain_answer(closing[: closing.find(b"\r\n\r\n")])
    assert not plain_answer(ok[: ok.find(b"\r\n\r\n")].replace(b"Content-Type", b"content-type"))


def test_a_relayed_request_reads_as_the_parser_reads_it() -> None:
    request = parsed_request(_HEAD.replace(b"Accept: */*", b"Accept: a\r\nAccept: b"), b"q")
    assert (request.method, request.path, request.body) == ("POST", "/v2/models/resnet/infer", b"q")
    assert request.headers["accept"] == "a, b" and request.headers["Content-Length"] == "76"


# -- the server's shortcut --------------------------------------------------------------------


async def _shortcut_server(**kw: Any) -> tuple[hs.Server, int, dict[str, Any]]:
    """A server whose shortcut takes ``POST /short`` (answering after ``delay`` s) and
    whose router answers everything else (``/parsed`` echoes what it got)."""
    state: dict[str, Any] = {"taken": 0, "offers": 0, "delay": 0.0, "decline_again": False}
    loop = asyncio.get_running_loop()

    def shortcut(raw: Any, pos: int, end: int, n: int, reply: hs.Reply) -> int:
        head = bytes(raw[pos:end])
        if not head.startswith(b"POST /short "):
            return -1
        state["offers"] += 1
        if head.find(b"Boom") >= 0:
            raise RuntimeError("boom")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        stop = end + length
        if stop > n:
            return stop
        if state["decline_again"] and state["offers"] > 1:
            return -1
        body = bytes(raw[end:stop])
        state["taken"] += 1
        answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-Via: shortcut\r\n\r\n%b" % (
            len(body),
            body,
        )
        if state["delay"]:
            loop.call_later(state["delay"], reply, answer)
        else:
            reply(answer)
        return stop

    async def parsed(request: hs.Request) -> hs.Response:
        return hs.Response(body=bytes(request.body), headers={"X-Via": "parser"})

    router = hs.Router()
    router.add_post("/short", parsed)
    router.add_post("/parsed", parsed)
    server = hs.Server(router, shortcut=shortcut, **kw)
    port = await server.start("127.0.0.1", 0)
    return server, port, state


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


def _post(path: str, body: bytes, extra: bytes = b"") -> tuple[bytes, bytes]:
    return (
        b"POST %b HTTP/1.1\r\nHost: h\r\n%bContent-Length: %d\r\n\r\n"
        % (path.encode(), extra, len(body)),
        body,
    )


def test_the_shortcut_takes_requests_however_their_bytes_are_split() -> None:
    """A head that comes whole is offered; a body that comes later is gathered and the
    request offered again; a head that straddles reads goes to the parser."""

    async def scenario() -> tuple[list[tuple[int, str, bytes]], dict[str, Any]]:
        server, port, state = await _shortcut_server()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        out = []
        body = bytes(range(256)) * 20
        head, data = _post("/short", body)
        splits = [
            [head + data],
            [head, data],
            [head, data[:7], data[7:1000], data[1000:]],
            [head + data[:100], data[100:]],
            [head[:-2], head[-2:] + data],  # CRLF CRLF across reads: the parser's
            [bytes([b]) for b in head] + [data],
        ]
        for parts in splits:
            for part in parts:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(0.002)
            status, headers, got = await _answer(reader)
            out.append((status, headers["x-via"], got))
        writer.close()
        await server.shutdown()
        return out, state

    out, state = _run(scenario())
    body = bytes(range(256)) * 20
    assert [got for _, _, got in out] == [body] * 6
    assert [via for _, via, _ in out][:4] == ["shortcut"] * 4
    assert out[4][1] == "parser"
    assert state["taken"] >= 4


def test_pipelined_requests_behind_a_shortcut_one_are_answered_in_order() -> None:
    async def scenario() -> list[tuple[str, bytes]]:
        server, port, state = await _shortcut_server()
        state["delay"] = 0.05  # the shortcut answers later, from a callback
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        burst = b"".join(
            b"".join(_post(p, b))
            for p, b in (("/short", b"one"), ("/parsed", b"two"), ("/short", b"three"))
        )
        writer.write(burst)
        out = []
        for _ in range(3):
            _, headers, got = await _answer(reader)
            out.append((headers["x-via"], got))
        writer.close()
        await server.shutdown()
        return out

    # the first is the shortcut's; those behind it came while it was busy: the parser's
    assert _run(scenario()) == [("shortcut", b"one"), ("parser", b"two"), ("parser", b"three")]


def test_a_request_declined_once_gathered_goes_to_the_parser() -> None:
    async def scenario() -> tuple[str, bytes]:
        server, port, state = await _shortcut_server()
        state["decline_again"] = True
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head, data = _post("/short", b"later")
        writer.write(head)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(data)
        _, headers, got = await _answer(reader)
        writer.close()
        await server.shutdown()
        return headers["x-via"], got

    assert _run(scenario()) == ("parser", b"later")


def test_a_head_over_the_header_limit_is_not_offered_but_refused_431() -> None:
    """A head the parser refuses (over ``max_header_bytes``) is refused even when it came
    whole and the shortcut would take it."""

    async def scenario() -> tuple[int, int]:
        server, port, state = await _shortcut_server(max_header_bytes=1024)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head, data = _post("/short", b"x", extra=b"X-Pad: %b\r\n" % (b"p" * 2000))
        writer.write(head + data)
        status, _, _ = await _answer(reader)
        writer.close()
        await server.shutdown()
        return status, state["offers"]

    assert _run(scenario()) == (431, 0)


def test_a_failing_shortcut_answers_500_and_closes() -> None:
    async def scenario() -> tuple[int, dict[str, str], bytes]:
        server, port, _ = await _shortcut_server()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head, data = _post("/short", b"x", extra=b"X-Boom: 1\r\n")
        writer.write(head + data)
        answer = await _answer(reader)
        assert await reader.read() == b""  # closed
        writer.close()
        await server.shutdown()
        return answer

    status, headers, body = _run(scenario())
    assert status == 500 and headers["connection"] == "close"
    assert "boom" in json.loads(body)["error"]


def test_shutdown_waits_for_a_shortcut_answer_on_its_way() -> None:
    async def scenario() -> tuple[int, bytes]:
        server, port, state = await _shortcut_server()
        state["delay"] = 0.3
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(_post("/short", b"in flight")))
        await asyncio.sleep(0.05)
        await server.shutdown()
        status, _, body = await _answer(reader)
        writer.close()
        return status, body

    assert _run(scenario()) == (200, b"in flight")


def test_a_body_that_stops_coming_while_gathered_times_out() -> None:
    async def scenario() -> int:
        server, port, _ = await _shortcut_server(body_timeout_s=0.2)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head, data = _post("/short", b"x" * 100)
        writer.write(head + data[:10])
        status, _, _ = await _answer(reader)
        writer.close()
        await server.shutdown()
        return status

    assert _run(scenario()) == 408


# -- the dispatcher's relay -------------------------------------------------------------------


async def _executor(drop_second: bool = False, delay_s: float = 0.0) -> tuple[Any, int]:
    """An executor stand-in answering as executors do (timing headers); with
    ``drop_second``, a raw server that answers one request and drops every connection
    from the second on."""
    if drop_second:
        seen = [0]

        class Drop(asyncio.Protocol):
            def connection_made(self, transport: Any) -> None:
                self.t = transport

            def data_received(self, data: bytes) -> None:
                seen[0] += data.count(b"HTTP/1.1\r\n")
                if seen[0] >= 2:
                    self.t.close()
                    return
                body = b'{"model_name":"m","outputs":[]}'
                self.t.write(
                    b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: application/json"
                    b"\r\n\r\n%b" % (len(body), body)
                )

        server = await asyncio.get_running_loop().create_server(Drop, "127.0.0.1", 0)
        return server, server.sockets[0].getsockname()[1]

    async def infer(request: hs.Request) -> hs.Response:
        await asyncio.sleep(delay_s)
        body = json.dumps({"model_name": "m", "echo": bytes(request.body).decode()}).encode()
        return hs.Response(
            body=body,
            headers={
                "Content-Type": "application/json",
                oip.QUEUE_MS_HEADER: "0.0100",
                oip.INFER_MS_HEADER: "0.2000",
                oip.BATCH_ROWS_HEADER: "1",
            },
        )

    router = hs.Router()
    router.add_post("/v2/models/{name}/infer", infer)
    server = hs.Server(router)
    return server, await server.start("127.0.0.1", 0)


def _dispatcher(
    urls: list[str], policy: str = "wrr", slots: int = 2, max_queue: int = 8
) -> tuple[Dispatcher, list[int]]:
    d = Dispatcher(token="t", db=None, max_queue=max_queue, state_dir=None)  # type: ignore[arg-type]
    instances = [
        {"id": f"i{k}", "url": url, "slots": slots, "variant": "m-small"}
        for k, url in enumerate(urls)
    ]
    d.set_routes({"models": {"m": {"policy": policy, "instances": instances}}})
    relayed = [0]
    relay = d.relay

    def counting(raw: Any, pos: int, end: int, n: int, reply: hs.Reply) -> int:
        done = relay(raw, pos, end, n, reply)
        relayed[0] += 0 <= done <= n
        return done

    d.relay = counting  # type: ignore[method-assign]
    return d, relayed


def test_a_relayed_answer_is_the_parsed_way_s_answer() -> None:
    """The same request, plain (relayed as bytes) and with a query string (the parsed way),
    gets the same status, headers and body, and both are counted."""

    async def scenario() -> tuple[list[tuple[int, dict[str, str], bytes]], Dispatcher, int]:
        up, up_port = await _executor()
        d, relayed = _dispatcher([f"http://127.0.0.1:{up_port}"])
        server, port = await d.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            out = []
            for path in ["/v2/models/m/infer"] * 3 + ["/v2/models/m/infer?x=1"]:
                head, data = _post(
                    path, b'{"inputs":[]}', extra=b"Content-Type: application/json\r\n"
                )
                writer.write(head)
                await writer.drain()
                await asyncio.sleep(0.002)  # the body comes in a read of its own: gathered
                writer.write(data)
                out.append(await _answer(reader))
            writer.close()
            return out, d, relayed[0]
        finally:
            await d.stop(server)
            await up.shutdown()

    out, d, relayed = _run(scenario())
    assert relayed == 3  # (the first one's connection opened the parsed way) not the query
    assert out[1] == out[2] == out[3]
    status, headers, body = out[1]
    assert status == 200 and json.loads(body)["echo"] == '{"inputs":[]}'
    assert headers["greenctl-variant"] == "m-small"
    assert headers[oip.QUEUE_MS_HEADER.lower()] == "0.0100"
    assert d.requests[("m", "200")] == 4
    assert sum(d.latency_counts["m"]) == 4


def test_a_relayed_request_whose_instance_drops_it_is_answered_by_another() -> None:
    async def scenario() -> tuple[list[int], Dispatcher, int]:
        bad, bad_port = await _executor(drop_second=True)
        good, good_port = await _executor()
        d, relayed = _dispatcher([f"http://127.0.0.1:{bad_port}", f"http://127.0.0.1:{good_port}"])
        d.recheck = asyncio.Event()  # (no supervisor here to check the one suspected)
        server, port = await d.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            codes = []
            for _ in range(6):
                writer.write(b"".join(_post("/v2/models/m/infer", b"{}")))
                codes.append((await _answer(reader))[0])
            writer.close()
            return codes, d, relayed[0]
        finally:
            await d.stop(server)
            await good.shutdown()
            bad.close()

    codes, d, relayed = _run(scenario())
    assert codes == [200] * 6
    assert relayed >= 1 and d.retries >= 1
    assert not d.routes["m"].backends[0].up  # suspected until the supervisor checks it


def test_relayed_requests_wait_their_turn_in_a_queued_policy() -> None:
    """FIFO with one slot: requests that come while it is taken wait in the model's queue
    (relayed all the same) and are answered in turn; past the queue's room, 503."""

    async def scenario() -> tuple[list[int], Dispatcher, int]:
        up, up_port = await _executor(delay_s=0.05)
        d, relayed = _dispatcher(
            [f"http://127.0.0.1:{up_port}"], policy="fifo", slots=1, max_queue=3
        )
        server, port = await d.start("127.0.0.1", 0)
        try:

            async def one() -> int:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"".join(_post("/v2/models/m/infer", b"{}")))
                status = (await _answer(reader))[0]
                writer.close()
                return status

            assert await one() == 200  # opens the pooled connection
            codes = await asyncio.gather(*(one() for _ in range(6)))
            return sorted(codes), d, relayed[0]
        finally:
            await d.stop(server)
            await up.shutdown()

    codes, d, relayed = _run(scenario())
    # one in service and three queued at once; the rest are refused (or queued after)
    assert codes.count(200) >= 4 and set(codes) <= {200, 503}
    assert d.requests[("m", "200")] == 1 + codes.count(200)
    assert d.requests[("m", "503")] == codes.count(503)
    assert relayed >= 4
    assert not d.routes["m"].waiters and d.routes["m"].backends[0].inflight == 0


def test_an_answer_relayed_raw_keeps_its_connection_unless_the_executor_closes_it() -> None:
    """The executor's ``Connection: close``, however spelled, is read as the parsed way
    reads it: that connection is not pooled again."""
    from greenctl.executor.runtime.upstream import UpstreamPool, _Conn

    class Transport:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

    async def scenario() -> list[bool]:
        kept = []
        for extra in (b"", b"Connection: close\r\n", b"connection:Close\r\n"):
            pool = UpstreamPool("http://127.0.0.1:1")
            conn = _Conn()
            conn.connection_made(Transport())  # type: ignore[arg-type]
            got: list[Any] = []

            def answered(*answer: Any, into: list[Any] = got) -> None:
                into.append(answer)

            pool.send_raw(conn, b"POST / HTTP/1.1\r\n\r\n", 5.0, answered, print)
            conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n%b\r\nok" % extra)
            assert got and got[0][0] == 200 and got[0][2] == b"ok"
            kept.append(pool.take_idle() is conn)
        return kept

    assert _run(scenario()) == [True, False, False]
