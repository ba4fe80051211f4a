"""A lean HTTP/1.1 keep-alive client for the dispatcher's hot path (dispatcher -> executor).

The dispatcher forwards every inference request; a general-purpose client costs more CPU per
request than the forwarding itself needs. Executors are ours and always answer with
``Content-Length`` bodies, so a small asyncio protocol with a pool of idle connections per
executor suffices. Anything unexpected (no length, a closed socket, a timeout) is an
:class:`UpstreamError`, which the dispatcher treats as the instance failing.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any
from urllib.parse import urlsplit


class UpstreamError(Exception):
    """The upstream connection failed or answered something we cannot forward."""


class UpstreamTimeout(UpstreamError):
    """The upstream took longer than the request's timeout (it may still be working on it)."""


class _Conn(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: Any = None  # asyncio's or uvloop's transport
        self.buf = bytearray()
        self.fut: asyncio.Future[tuple[int, dict[str, str], bytes]] | None = None
        self.closed = False
        self.got_bytes = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        fut = self.fut
        if fut is None or fut.done():
            self.buf += data
            return
        # a whole answer in one read (the common case) is parsed where it came
        buf = data if not self.buf else self.buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self._keep(buf, data)
            return
        lines = buf[:end].decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            self._fail("malformed status line")
            return
        headers = {
            key.strip().lower(): value.strip()
            for key, _, value in (line.partition(":") for line in lines[1:])
        }
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            self._fail("response without Content-Length")
            return
        total = end + 4 + int(length)
        if len(buf) < total:
            self._keep(buf, data)
            return
        body = bytes(buf[end + 4 : total])
        self.buf = bytearray(buf[total:]) if len(buf) > total else bytearray()
        fut.set_result((status, headers, body))

    def _keep(self, buf: bytes | bytearray, data: bytes) -> None:
        """Hold the incomplete answer ``buf`` (``data`` is what came last) for more bytes."""
        if buf is data:
            self.buf += data
        else:
            self.buf = buf  # type: ignore[assignment]

    def _fail(self, why: str) -> None:
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(UpstreamError(why))
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(UpstreamError(f"connection lost: {exc or 'closed by peer'}"))


class UpstreamPool:
    """Idle keep-alive connections to one executor."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.host_line = f"Host: {self.host}:{self.port}\r\n"
        self.idle: collections.deque[_Conn] = collections.deque()
        #: the event loop the pool serves, taken on its first request (asking asyncio for
        #: the running loop costs a system call: it checks the process id each time)
        self.loop: asyncio.AbstractEventLoop | None = None

    async def _connect(self) -> _Conn:
        loop = self._loop()
        try:
            _, proto = await loop.create_connection(_Conn, self.host, self.port)
        except OSError as exc:
            raise UpstreamError(
                f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}"
            ) from None
        return proto

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``body`` to ``path``; returns (status, lower-cased headers, body)."""
        conn = None
        while self.idle:
            candidate = self.idle.pop()
            if not candidate.closed:
                conn = candidate
                break
        if conn is not None:
            try:
                return await self._send(conn, path, body, headers, timeout_s)
            except UpstreamError:
                if conn.got_bytes:
                    raise
                # a stale idle connection closed under us: one fresh try on this instance
        return await self._send(await self._connect(), path, body, headers, timeout_s)

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None or loop.is_closed():
            loop = self.loop = asyncio.get_running_loop()
        return loop

    async def _send(
        self, conn: _Conn, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, dict[str, str], bytes]:
        loop = self._loop()
        fut: asyncio.Future[tuple[int, dict[str, str], bytes]] = loop.create_future()
        conn.fut = fut
        conn.got_bytes = False
        head = "".join(
            [
                f"POST {path} HTTP/1.1\r\n",
                self.host_line,
                f"Content-Length: {len(body)}\r\n",
                *[f"{k}: {v}\r\n" for k, v in headers.items()],
                "\r\n",
            ]
        ).encode("latin-1")
        assert conn.transport is not None
        _write(conn.transport, head, body)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            status, out_headers, out_body = await fut
        except BaseException:
            conn.close()  # a late answer on this socket would confuse the next request
            raise
        finally:
            timer.cancel()
            conn.fut = None
        if out_headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            self.idle.append(conn)
        return status, out_headers, out_body

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


def _write(transport: Any, head: bytes, body: bytes | bytearray) -> None:
    """Send a request's head and body without joining them (a join copies the whole body: a
    600 KB image per request). A small body is joined (one buffer, one send, cheaper than a
    scatter list); a large one goes as two buffers: ``writelines`` where the transport
    scatters them (uvloop: ``writev``; asyncio from Python 3.12: ``sendmsg``), else two
    ``write`` calls (asyncio before 3.12 joins in ``writelines``). The transport may hold
    ``body`` until it is sent, as its own reference: a pooled body buffer is reused only once
    nothing references it (``httpserver``'s body buffers count references)."""
    if len(body) <= _JOIN_BYTES:
        transport.write(head + body)
    elif _scatters(type(transport)):
        transport.writelines((head, body))
    else:
        transport.write(head)
        transport.write(body)


#: Bodies up to this size are sent joined to their head.
_JOIN_BYTES = 16 * 1024
_SCATTERS: dict[type, bool] = {}


def _scatters(kind: type) -> bool:
    """Whether transports of ``kind`` write a list of buffers without joining them first."""
    got = _SCATTERS.get(kind)
    if got is None:
        joins = getattr(kind, "writelines", None) is asyncio.WriteTransport.writelines
        got = _SCATTERS[kind] = not joins
    return got


def _expire(fut: asyncio.Future[tuple[int, dict[str, str], bytes]]) -> None:
    if not fut.done():
        fut.set_exception(UpstreamTimeout("timed out"))
