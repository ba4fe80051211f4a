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
from collections.abc import Callable
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
        #: what waits for the answer: a future (``post``) or an exchange (``send``)
        self.fut: asyncio.Future[tuple[int, dict[str, str], bytes]] | _Exchange | None = None
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
        head = bytes(buf[:end])
        try:
            status, length = _status_and_length(head)
        except UpstreamError as exc:
            self._fail(str(exc))
            return
        total = end + 4 + length
        if len(buf) < total:
            self._keep(buf, data)
            return
        body = bytes(buf[end + 4 : total])
        self.buf = bytearray(buf[total:]) if len(buf) > total else bytearray()
        if type(fut) is _Exchange and fut.raw:
            fut.set_raw(status, head, body)
        else:
            fut.set_result((status, headers_of(head), body))

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


class _Exchange:
    """One request on a pooled connection whose answer goes to callbacks (no task): what
    :meth:`UpstreamPool.send` parks on the connection in place of a future (it answers
    the same ``done``/``set_result``/``set_exception`` calls)."""

    __slots__ = ("conn", "finished", "on_answer", "on_error", "pool", "raw", "timer")

    def __init__(
        self,
        pool: UpstreamPool,
        conn: _Conn,
        on_answer: Callable[[int, Any, bytes], None],
        on_error: Callable[[UpstreamError, bool], None],
        *,
        raw: bool = False,
    ) -> None:
        self.pool, self.conn = pool, conn
        self.on_answer, self.on_error = on_answer, on_error
        #: the answer goes on as its head's bytes, not parsed into headers
        self.raw = raw
        self.finished = False
        self.timer: asyncio.TimerHandle | None = None

    def done(self) -> bool:
        return self.finished

    def set_result(self, result: tuple[int, dict[str, str], bytes]) -> None:
        self._end()
        self.pool._recycle(self.conn, result[1].get("connection", ""))
        self.on_answer(*result)

    def set_raw(self, status: int, head: bytes, body: bytes) -> None:
        self._end()
        # the executor's Connection header, read as the parsed way reads it
        named = head.lower().find(b"\r\nconnection:") >= 0
        self.pool._recycle(self.conn, headers_of(head).get("connection", "") if named else "")
        self.on_answer(status, head, body)

    def set_exception(self, exc: UpstreamError) -> None:
        self._end()
        self.conn.close()  # a late answer on this socket would confuse the next request
        self.on_error(exc, not self.conn.got_bytes and not isinstance(exc, UpstreamTimeout))

    def _end(self) -> None:
        self.finished = True
        if self.timer is not None:
            self.timer.cancel()
        self.conn.fut = None


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

    def take_idle(self) -> _Conn | None:
        """An idle keep-alive connection still open (taken from the pool), else None."""
        idle = self.idle
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    async def post(
        self, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, dict[str, str], bytes]:
        """POST ``body`` to ``path``; returns (status, lower-cased headers, body)."""
        conn = self.take_idle()
        if conn is not None:
            try:
                return await self._send(conn, path, body, headers, timeout_s)
            except UpstreamError:
                if conn.got_bytes:
                    raise
                # a stale idle connection closed under us: one fresh try on this instance
        return await self._send(await self._connect(), path, body, headers, timeout_s)

    def send(
        self,
        conn: _Conn,
        path: str,
        body: bytes | bytearray,
        headers: dict[str, str],
        timeout_s: float,
        on_answer: Callable[[int, dict[str, str], bytes], None],
        on_error: Callable[[UpstreamError, bool], None],
    ) -> None:
        """POST ``body`` to ``path`` on ``conn`` (from :meth:`take_idle`) without a task:
        ``on_answer(status, lower-cased headers, body)`` is called when the answer is in,
        or ``on_error(error, stale)`` when it fails (``stale``: the connection closed before
        any byte of an answer came, the way an idle one the executor dropped does)."""
        exchange = _Exchange(self, conn, on_answer, on_error)
        self._start(exchange, self._head(path, body, headers), body, timeout_s)

    def send_raw(
        self,
        conn: _Conn,
        request: bytes,
        timeout_s: float,
        on_answer: Callable[[int, bytes, bytes], None],
        on_error: Callable[[UpstreamError, bool], None],
    ) -> None:
        """Send ``request``, a whole request as bytes, on ``conn`` like :meth:`send`;
        ``on_answer(status, head, body)`` gets the answer's head as its bytes (no closing
        blank line), unparsed."""
        exchange = _Exchange(self, conn, on_answer, on_error, raw=True)
        self._start(exchange, request, b"", timeout_s)

    def _start(
        self, exchange: _Exchange, head: bytes, body: bytes | bytearray, timeout_s: float
    ) -> None:
        conn = exchange.conn
        conn.fut = exchange
        conn.got_bytes = False
        _write(conn.transport, head, body)
        exchange.timer = self._loop().call_later(timeout_s, _expire, exchange)

    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self.loop
        if loop is None or loop.is_closed():
            loop = self.loop = asyncio.get_running_loop()
        return loop

    def _head(self, path: str, body: bytes | bytearray, headers: dict[str, str]) -> bytes:
        """A request's head: its line, ``Host``, ``Content-Length`` and ``headers``."""
        return "".join(
            [
                f"POST {path} HTTP/1.1\r\n",
                self.host_line,
                f"Content-Length: {len(body)}\r\n",
                *[f"{k}: {v}\r\n" for k, v in headers.items()],
                "\r\n",
            ]
        ).encode("latin-1")

    def _recycle(self, conn: _Conn, connection: str) -> None:
        """An answer came whole on ``conn``: keep it for the next request (unless the
        executor said it closes it: its ``Connection`` header)."""
        if connection.lower() == "close":
            conn.close()
        else:
            self.idle.append(conn)

    async def _send(
        self, conn: _Conn, path: str, body: bytes, headers: dict[str, str], timeout_s: float
    ) -> tuple[int, dict[str, str], bytes]:
        loop = self._loop()
        fut: asyncio.Future[tuple[int, dict[str, str], bytes]] = loop.create_future()
        conn.fut = fut
        conn.got_bytes = False
        assert conn.transport is not None
        _write(conn.transport, self._head(path, body, headers), body)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            status, out_headers, out_body = await fut
        except BaseException:
            conn.close()  # a late answer on this socket would confuse the next request
            raise
        finally:
            timer.cancel()
            conn.fut = None
        self._recycle(conn, out_headers.get("connection", ""))
        return status, out_headers, out_body

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


def _status_and_length(head: bytes) -> tuple[int, int]:
    """An answer head's status code and ``Content-Length``.

    Raises:
        UpstreamError: no status code in its first line, or no ``Content-Length``.
    """
    eol = head.find(b"\r\n")
    try:
        status = int(head[: eol if eol >= 0 else len(head)].split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise UpstreamError("malformed status line") from None
    at = head.find(b"\r\nContent-Length:")  # as executors write it; else any case
    if at < 0:
        at = head.lower().find(b"\r\ncontent-length:")
    if at >= 0:
        eol = head.find(b"\r\n", at + 17)
        length = head[at + 17 : eol if eol >= 0 else len(head)].strip()
        if length.isdigit():
            return status, int(length)
    raise UpstreamError("response without Content-Length")


def headers_of(head: bytes) -> dict[str, str]:
    """An answer head's headers, by lower-cased name."""
    lines = head.decode("latin-1").split("\r\n")
    return {
        key.strip().lower(): value.strip()
        for key, _, value in (line.partition(":") for line in lines[1:])
    }


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


def _expire(fut: asyncio.Future[Any] | _Exchange) -> None:
    if not fut.done():
        fut.set_exception(UpstreamTimeout("timed out"))
