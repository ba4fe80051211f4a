"""The dispatcher's upstream client sends a request's head and body without joining them
(greenctl.executor.runtime.upstream, issue 22): the bytes on the wire, keep-alive reuse, and that a
pooled body buffer is never overwritten while the transport still has to send it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from greenctl.executor.runtime import upstream as up


def loops() -> list[str]:
    names = ["asyncio"]
    try:
        import uvloop  # noqa: F401
    except ImportError:
        pass
    else:
        names.append("uvloop")
    return names


def run_on(loop_name: str, main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(main())
    return asyncio.run(main())


class Sink(asyncio.Protocol):
    """An executor stand-in: parses ``Content-Length`` requests, records each one's head and
    body, answers ``200`` with the body's length; ``gate`` (when set) holds reading back."""

    def __init__(self, got: list[tuple[bytes, bytes]], conns: list[Sink], gate: asyncio.Event | None,
                 early: bool = False) -> None:  # fmt: skip
        self.got = got
        self.buf = bytearray()
        self.gate = gate
        self.early = early  # answer on the head, before reading the body (as a 413 does)
        self.answered = False
        conns.append(self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: Any = transport
        self.held = False

    async def _resume(self) -> None:
        assert self.gate is not None
        await self.gate.wait()
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.gate is not None and not self.gate.is_set() and not self.held:
            self.held = True  # stop reading after the first piece until the gate opens
            self.transport.pause_reading()
            asyncio.get_running_loop().create_task(self._resume())
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[: end + 4])
            length = 0
            for line in head.decode("latin-1").split("\r\n")[1:]:
                key, _, value = line.partition(":")
                if key.strip().lower() == "content-length":
                    length = int(value)
            if self.early and not self.answered:
                self._answer(length)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            self.got.append((head, body))
            if not self.early:
                self._answer(length)

    def _answer(self, length: int) -> None:
        self.answered = True
        answer = str(length).encode()
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(answer), answer)
        )


async def serve(gate: asyncio.Event | None = None, early: bool = False) -> tuple[Any, list[tuple[bytes, bytes]], list[Sink]]:  # fmt: skip
    got: list[tuple[bytes, bytes]] = []
    conns: list[Sink] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Sink(got, conns, gate, early), "127.0.0.1", 0)
    return server, got, conns


@pytest.mark.parametrize("loop_name", loops())
def test_head_and_body_arrive_as_sent_over_one_kept_alive_connection(loop_name):
    small = b"x" * 100
    large = bytearray(range(256)) * (2 * 1024 * 1024 // 256)  # 2 MiB, as a pooled body is
    large_bytes = bytes(reversed(large))

    async def main() -> list[tuple[int, dict[str, str], bytes]]:
        server, got, conns = await serve()
        port = server.sockets[0].getsockname()[1]
        pool = up.UpstreamPool(f"http://127.0.0.1:{port}")
        try:
            answers = []
            for body in (small, large, large_bytes, small):
                answers.append(
                    await pool.post("/v2/models/m/infer", body, {"X-Test": "1"}, timeout_s=10)
                )
            assert len(conns) == 1  # keep-alive: every request on the first connection
            assert [b for _, b in got] == [small, bytes(large), large_bytes, small]
            for head, body in got:
                assert (
                    head
                    == (
                        f"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                        f"Content-Length: {len(body)}\r\nX-Test: 1\r\n\r\n"
                    ).encode()
                )
            return answers
        finally:
            pool.close()
            server.close()

    answers = run_on(loop_name, main)
    assert [(s, b) for s, _, b in answers] == [
        (200, b"100"),
        (200, str(len(large)).encode()),
        (200, str(len(large_bytes)).encode()),
        (200, b"100"),
    ]


class Recorder:
    """A transport that records what it is given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def write(self, data: Any) -> None:
        self.calls.append(("write", data))

    def writelines(self, data: Any) -> None:
        self.calls.append(("writelines", list(data)))


class Joining(Recorder):
    """A transport whose ``writelines`` is asyncio's own joining one (Python < 3.12)."""

    writelines = asyncio.WriteTransport.writelines  # type: ignore[assignment]


def test_a_large_body_is_handed_to_the_transport_itself_not_a_joined_copy():
    head = b"POST / HTTP/1.1\r\n\r\n"
    body = bytearray(600 * 1024)
    scatter = Recorder()
    up._write(scatter, head, body)
    assert scatter.calls == [("writelines", [head, body])]
    assert scatter.calls[0][1][1] is body
    joining = Joining()
    up._write(joining, head, body)  # two writes: the second is the body object itself
    assert [c[0] for c in joining.calls] == ["write", "write"]
    assert joining.calls[0][1] == head and joining.calls[1][1] is body
    small = Recorder()
    up._write(small, head, b"tiny")  # a small body: one buffer, one send
    assert small.calls == [("write", head + b"tiny")]


@pytest.mark.parametrize("loop_name", loops())
def test_a_pooled_body_is_not_reused_while_the_transport_still_holds_it(loop_name):
    """The executor front reuses a body buffer once its reference count is back to what the
    pool alone holds. Here the upstream answers on the head (as a 413 would) and reads the
    body only later, so ``post`` returns while most of the body is still unsent: the transport
    must then either hold the body (a reference) or have copied it, so that overwriting the
    buffer, as its reuse would, cannot change what goes out."""
    size = 16 * 1024 * 1024  # well over what the socket buffers take before the peer reads
    original = bytes(range(256)) * (size // 256)

    async def main() -> None:
        gate = asyncio.Event()
        server, got, _ = await serve(gate, early=True)
        port = server.sockets[0].getsockname()[1]
        pool = up.UpstreamPool(f"http://127.0.0.1:{port}")
        body = bytearray(original)
        idle = sys.getrefcount(body)
        try:
            status, _, answer = await pool.post("/infer", body, {}, timeout_s=30)
            assert status == 200 and answer == str(size).encode()
            assert not got  # answered, the body not read yet
            if sys.getrefcount(body) <= idle:  # nothing holds it: the pool would reuse it
                body[:] = b"\xff" * size
            gate.set()
            for _ in range(3000):
                if got:
                    break
                await asyncio.sleep(0.01)
            assert got and got[0][1] == original
        finally:
            pool.close()
            server.close()

    run_on(loop_name, main)
