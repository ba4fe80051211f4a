"""A lean HTTP/1.1 server for the executors' and the dispatcher's inbound side (why lean and
its limits: docs/serving.md).

An :class:`asyncio.BufferedProtocol` per connection parsed by ``httptools`` (keep-alive,
pipelining, chunked bodies, ``Expect: 100-continue``, ``HEAD``); bodies of known length read
straight into their own buffer; a router of ``GET``/``POST`` paths with ``{name}`` segments
over the messages of :mod:`~greenctl.executor.runtime.httpmessage`; handlers that answer from
callbacks (:class:`Direct`) and a shortcut offered each head that comes whole
(:data:`Shortcut`). Past a :class:`Server` limit the client gets 408/431/413/503 and is
closed; malformed requests get 400, handler exceptions a 500, in order.
:meth:`Server.shutdown` drains in-flight requests, then closes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import httptools
from greenctl.executor.runtime.httpmessage import (  # noqa: F401 (the server's messages, as hs.*)
    TOKEN_HEADER,
    Headers,
    Request,
    Response,
    StreamResponse,
    admin_allowed,
    is_loopback,
    json_response,
)

Handler = Callable[["Request"], Awaitable["Response"]]
#: how a :class:`Direct` handler (or a :data:`Shortcut`) answers: a response now, an
#: awaitable of one, or the bytes of a whole keep-alive response
Reply = Callable[["Response | Awaitable[Response] | bytes"], None]
#: ``shortcut(raw, pos, end, n, reply)``: a server's short way for the request whose head is
#: ``raw[pos:end]`` (``n`` bytes came in all): where the next request starts when it takes
#: it (and answers through ``reply``, once), or -1 (the parser reads it)
Shortcut = Callable[[bytearray | bytes, int, int, int, Reply], int]


class Direct:
    """A handler that runs without a task of its own: ``fn(request, reply)`` is called as
    soon as the request is in and answers by calling ``reply`` once, with a
    :class:`Response` (then or later, from a callback) or with an awaitable of one (run as
    a task, the way a plain handler is). For a hot path that mostly answers from callbacks
    (the dispatcher's forwarding): a task per request costs more than its work."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Request, Reply], None]) -> None:
        self.fn = fn


_MAX_PIPELINED = 64  # requests parsed ahead of the one being answered, per connection
_READ_BYTES = 64 * 1024  # the buffer a connection receives heads (and parsed bodies) into
_HEAD_END = b"\r\n\r\n"
#: body buffers a server keeps for reuse (:class:`_BodyBuffers`), at most this many bytes
_SPARE_BYTES = 64 * 1024 * 1024
_SPARE_COUNT = 64
#: a request up to this size whose body comes after its head is gathered for the shortcut
_GATHER_BYTES = 64 * 1024
#: a body up to this size that came whole with its head is read by the parser
_INLINE_BODY = 16 * 1024
#: header names as received -> as stored (lower-cased text), for the names clients send
_NAMES: dict[bytes, str] = {}
_NAMES_MAX = 512
#: dynamic routes' matches a router remembers (cleared when full)
_MATCHED_MAX = 1024


def _internal_error(exc: Exception) -> Response:
    """The 500 a handler's exception is answered with (the traceback goes to stderr)."""
    traceback.print_exception(exc, file=sys.stderr)
    return json_response({"error": f"internal error: {type(exc).__name__}: {exc}"}, status=500)


class _Refusal(Response):
    """The error answer that ends a connection (malformed or oversized request, timeout)."""

    __slots__ = ()

    def __init__(self, status: int, why: str) -> None:
        super().__init__(
            status=status,
            body=json.dumps({"error": why}).encode(),
            headers={"Content-Type": "application/json"},
        )


class Router:
    """``GET``/``POST`` routes by path; ``{name}`` matches one path segment."""

    def __init__(self) -> None:
        self._static: dict[tuple[str, str], Handler | Direct] = {}
        self._dynamic: list[tuple[str, re.Pattern[str], Handler | Direct]] = []
        self._paths: dict[str, set[str]] = collections.defaultdict(set)
        #: (method, path) -> the handler and parameters a dynamic route matched (bounded)
        self._matched: dict[tuple[str, str], tuple[Handler | Direct, dict[str, str]]] = {}

    def add_get(self, path: str, handler: Handler) -> None:
        self._add("GET", path, handler)

    def add_post(self, path: str, handler: Handler | Direct) -> None:
        self._add("POST", path, handler)

    def _add(self, method: str, path: str, handler: Handler | Direct) -> None:
        self._paths[path].add(method)
        self._matched.clear()
        if "{" not in path:
            self._static[(method, path)] = handler
            return
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        self._dynamic.append((method, re.compile(pattern + r"\Z"), handler))

    def resolve(
        self, method: str, path: str
    ) -> tuple[Handler | Direct | None, dict[str, str], set[str]]:
        """The handler for ``method path`` and its path parameters; else the methods allowed
        on that path (empty: no such path)."""
        lookup = "GET" if method == "HEAD" else method
        handler = self._static.get((lookup, path))
        if handler is not None:
            return handler, {}, set()
        hit = self._matched.get((lookup, path))
        if hit is not None:
            return hit[0], dict(hit[1]), set()
        allowed: set[str] = set()
        for m, rx, h in self._dynamic:
            match = rx.match(path)
            if match is None:
                continue
            if m == lookup:
                params = match.groupdict()
                if len(self._matched) >= _MATCHED_MAX:
                    self._matched.clear()
                self._matched[(lookup, path)] = (h, dict(params))
                return h, params, set()
            allowed.add(m)
        for m in ("GET", "POST"):
            if (m, path) in self._static:
                allowed.add(m)
        return None, {}, allowed


class _BodyBuffers:
    """Buffers that bodies of known length are read into, reused once nothing holds them.

    A new ``bytearray`` is zeroed (a pass over 600 KB for an image, 8 % of the front's CPU);
    one a finished request no longer references (no handler, view or array of it: its
    reference count is back to what it was when it was put here) is taken again as it is:
    every byte is received anew before its request is handed on. At most
    :data:`_SPARE_COUNT` buffers and :data:`_SPARE_BYTES` are kept; a body they cannot take
    gets a buffer of its own, freed with its request.
    """

    def __init__(self) -> None:
        self.kept: list[bytearray] = []
        self.bytes = 0
        self.idle_refs = -1

    def _refs(self, i: int) -> int:
        return sys.getrefcount(self.kept[i])

    def take(self, size: int) -> bytearray:
        kept = self.kept
        for i in range(len(kept)):
            if len(kept[i]) == size and self._refs(i) == self.idle_refs:
                return kept[i]
        if len(kept) < _SPARE_COUNT and self.bytes + size <= _SPARE_BYTES:
            kept.append(bytearray(size))  # held by the list alone here
            self.bytes += size
            if self.idle_refs < 0:  # what a kept buffer counts when nothing else holds it
                self.idle_refs = self._refs(len(kept) - 1)
            return kept[-1]
        return bytearray(size)


class _Connection(asyncio.BufferedProtocol):
    """One client connection: parse requests, run handlers one at a time, answer in order.

    Receive state for the timeouts: ``started`` is when the request being received began
    (its first byte; for a new connection, when it opened), None between requests;
    ``head_done`` whether its headers are in; ``last_read`` when a piece of its body last
    came. ``idle_since`` is when the connection last finished a request or a response.

    Receiving (module docstring): the loop reads into :meth:`get_buffer`'s buffer, the
    connection's read buffer, whose bytes go to the parser up to the end of a head; a body of
    known length is then read into a buffer of its own (``_into``, ``_got`` bytes so far) and
    the request completes without the parser, which is replaced for the next one.
    """

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None  # asyncio's or uvloop's transport
        self.remote: str | None = None
        self.pending: collections.deque[tuple[Request | Response, bool, bool]] = collections.deque()
        self.busy = False
        self.closing = False
        self.paused = False
        now = time.monotonic()
        self.started: float | None = now
        self.head_done = False
        self.last_read = now
        self.idle_since = now
        self.write_stalled_since: float | None = None
        #: what a stream waiting for a client that is not reading awaits (see _writable)
        self._drained: asyncio.Future[None] | None = None
        self.closed_at = now
        self._url = b""
        self._headers: Headers = Headers()
        self._body: list[bytes] = []
        self._size = 0
        self._head_size = 0
        self._refusal: tuple[int, str] | None = None
        #: a refusal is queued behind earlier answers: the rest of what comes is dropped
        self.refusing = False
        #: the client shut its sending side: answer what it sent, then close
        self.eof = False
        self._tail = b""  # the last bytes of a head fed so far (its end may straddle reads)
        self._into: bytearray | None = None  # the body being read straight into its buffer
        #: nothing of the next request has gone to the parser (the shortcut may take it)
        self._fresh = True
        #: a request the shortcut takes once its body is in: its bytes so far, how many it
        #: has in all, and where its head ends
        self._gather: bytearray | None = None
        self._gather_to = 0
        self._gather_head = 0
        #: the request being answered by a Direct handler: (keep-alive, a HEAD request)
        self._answering = (True, False)
        self._into_view: memoryview | None = None
        self._got = 0

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) and peer else None
        if not self.server.admit(self):
            self.closing = True
            refusal = json_response(
                {"error": "too many open connections; retry later"},
                status=503,
                headers={"Retry-After": "1"},
            )
            transport.write(refusal.encode(keep_alive=False))  # type: ignore[attr-defined]
            _linger(transport, self.server.loop)
            return
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.pending.clear()
        self.server.connections.discard(self)
        self._into = self._into_view = self._gather = None
        self._wake_stream()

    def eof_received(self) -> bool:
        """The client sends no more (a half-close): its complete requests are still
        answered; the connection closes after the last answer (at once when none is due)."""
        self.eof = True
        if not (self.busy or self.pending):
            self.close()
        return True  # keep our sending side open for the answers

    def pause_writing(self) -> None:
        self.write_stalled_since = time.monotonic()

    def resume_writing(self) -> None:
        self.write_stalled_since = None
        self._wake_stream()
        if not self.busy and not self.closing:
            self._next()

    def _writable(self) -> asyncio.Future[None]:
        """A future done when the client reads again or the connection goes."""
        if self._drained is None:
            self._drained = self.server.loop.create_future()
        return self._drained

    def _wake_stream(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._into_view is not None and not (self.closing or self.refusing):
            return self._into_view[self._got :]  # the rest of a body, straight into place
        return self.server.read_view

    def buffer_updated(self, nbytes: int) -> None:
        if self.closing or self.refusing:
            return
        if self._into_view is not None:
            self.last_read = time.monotonic()
            self._got += nbytes
            if self._got >= len(self._into_view):
                self._body_complete()
            return
        self._received(self.server.read_buffer, nbytes)

    def data_received(self, data: bytes) -> None:
        """Bytes received the plain way (a transport without buffered reads)."""
        if not (self.closing or self.refusing):
            self._received(data, len(data))

    def _received(self, raw: bytes | bytearray, n: int, *, offer: bool = True) -> None:
        """Feed the ``n`` bytes that came (at the start of ``raw``) to the parser; where a
        head ends and a body of known length follows, take the body apart
        (:meth:`_start_body`). A head that came whole is first offered to the server's
        shortcut (unless ``offer`` is false), which may wait for the rest of its body
        (gathered, then offered again)."""
        data = memoryview(raw)
        pos = 0
        if self._gather is not None:
            pos = self._gathered(data, n)
        while pos < n and not (self.closing or self.refusing):
            if self._into_view is not None:  # a body that started in this read
                take = min(n - pos, len(self._into_view) - self._got)
                self._into_view[self._got : self._got + take] = data[pos : pos + take]
                self._got += take
                pos += take
                if self._got >= len(self._into_view):
                    self._body_complete()
                continue
            if self.head_done:  # a body the parser reads (chunked, or over the limit)
                self._feed(data[pos:n])
                return
            end = self._head_end(raw, pos, n)
            if end < 0:
                self._feed(data[pos:n])  # (a new request begun here resets the tail)
                self._tail = (self._tail + bytes(data[max(pos, n - 3) : n]))[-3:]
                return
            if (
                offer
                and self._fresh
                and self.server.shortcut is not None
                and not self.pending
                and end - pos <= self.server.max_header_bytes  # (else the parser's 431)
            ):
                done = self._shortcut(raw, pos, end, n)
                if done > n:  # taken once the rest of its body is in
                    self._gather = bytearray(data[pos:n])
                    self._gather_to, self._gather_head = done - pos, end - pos
                    self.started = self.started or time.monotonic()
                    self.head_done = True  # (the body's timeout applies)
                    self.last_read = time.monotonic()
                    return
                if done >= 0:
                    pos = done
                    continue
            self._feed(data[pos:end])
            self._tail = b""
            pos = end
            if self.head_done and not (self.closing or self.refusing):
                self._start_body(n - pos)

    def _shortcut(self, raw: bytes | bytearray, pos: int, end: int, n: int) -> int:
        """Offer the server's shortcut the request whose head came whole (``raw[pos:end]``)
        on this idle connection: where the next request starts when it took it; where its
        body ends (past ``n``) when it takes it once that is in; -1 when it declines."""
        if self.busy or self.server.stopping or self.write_stalled_since is not None:
            return -1
        self.busy = True
        self._answering = (True, False)
        assert self.server.shortcut is not None
        try:
            done = self.server.shortcut(raw, pos, end, n, self._reply)
        except Exception as exc:  # where its request ends is unknown: answer, and close
            self._send(_internal_error(exc), False, False)
            return n
        if done < 0 or done > n:
            self.busy = False
            return -1 if done < 0 or done - pos > _GATHER_BYTES else done
        self.started = None
        self.head_done = False
        self.idle_since = time.monotonic()
        return done

    def _gathered(self, data: memoryview, n: int) -> int:
        """Add what came to the request being gathered for the shortcut; once it is whole,
        offer it again (the parser reads it when the shortcut now declines). Returns how
        many of the ``n`` bytes it took."""
        gather = self._gather
        assert gather is not None
        take = min(n, self._gather_to - len(gather))
        gather += data[:take]
        self.last_read = time.monotonic()
        if len(gather) < self._gather_to:
            return take
        whole = bytes(gather)
        self._gather = None
        self.head_done = False
        if self._shortcut(whole, 0, self._gather_head, len(whole)) != len(whole):
            self._received(whole, len(whole), offer=False)
        return take

    def _head_end(self, raw: bytes | bytearray, pos: int, n: int) -> int:
        """Where the head being received ends in ``raw[pos:n]`` (past its ``CRLF CRLF``,
        which may start in bytes fed before); -1 when not there."""
        if self._tail:
            joined = self._tail + bytes(raw[pos : min(pos + 3, n)])
            at = joined.find(_HEAD_END)
            if at >= 0:
                return pos + at + 4 - len(self._tail)
        at = raw.find(_HEAD_END, pos, n)
        return at + 4 if at >= 0 else -1

    def _start_body(self, ready: int) -> None:
        """The head is in: read a body of known length into a buffer of its own; anything
        else (no body, chunked, over ``max_body``, already partly parsed, or a small one
        whose ``ready`` bytes are all in this read: one copy either way, and the parser
        goes on with the next request) stays the parser's."""
        headers = self._headers
        length = dict.get(headers, "content-length")
        if (
            self._size
            or length is None
            or not (length.isascii() and length.isdigit() and len(length) <= 18)
            or dict.get(headers, "transfer-encoding") is not None
            or not 0 < int(length) <= self.server.max_body
            or int(length) <= min(ready, _INLINE_BODY)
        ):
            return
        self._into = self.server.body_buffers.take(int(length))
        self._into_view = memoryview(self._into)
        self._got = 0

    def _body_complete(self) -> None:
        """The body read into its buffer is whole: the request is complete. The parser,
        which saw its head only, is replaced by a fresh one for the next request."""
        body = self._into
        assert body is not None
        keep_alive = bool(self.parser.should_keep_alive())
        method = self.parser.get_method().decode("latin-1")
        self._into = self._into_view = None
        self._got = 0
        self.parser = httptools.HttpRequestParser(self)
        self._complete(method, keep_alive, body)

    def _feed(self, data: memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            if self._refusal is not None:
                self._fail(*self._refusal)
            else:
                self._fail(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._fresh = False
        if self.started is None:
            self.started = time.monotonic()
        self.head_done = False
        self._tail = b""
        self._url = b""
        self._headers = Headers()
        self._body = []
        self._size = 0
        self._head_size = 0

    def _count_head(self, n: int) -> None:
        self._head_size += n
        if self._head_size > self.server.max_header_bytes:
            limit = self.server.max_header_bytes
            self._refusal = (431, f"request line and headers exceed the {limit} byte limit")
            raise ValueError(self._refusal[1])  # stops the parser: data_received answers

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        if self._head_size > self.server.max_header_bytes:
            self._count_head(0)  # raises: the 431 refusal
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > self.server.max_header_bytes:
            self._count_head(0)  # raises: the 431 refusal
        key = _NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(_NAMES) < _NAMES_MAX and len(name) <= 64:
                _NAMES[name] = key
        self._headers.add(key, value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.head_done = True
        self.last_read = time.monotonic()
        length = dict.get(self._headers, "content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._refuse_body(f"the declared body of {length} bytes")
        elif dict.get(self._headers, "expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _refuse_body(self, what: str) -> None:
        """Refuse a body over ``max_body`` (413) before reading more of it."""
        limit = self.server.max_body
        self._refusal = (413, f"{what} exceeds the {limit} byte limit")
        raise ValueError(self._refusal[1])  # stops the parser: _feed answers

    def on_body(self, chunk: bytes) -> None:
        self.last_read = time.monotonic()
        self._size += len(chunk)
        if self._size > self.server.max_body:
            self._body = []
            self._refuse_body("the request body")
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        keep_alive = bool(self.parser.should_keep_alive())
        method = self.parser.get_method().decode("latin-1")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._complete(method, keep_alive, body)

    def _complete(self, method: str, keep_alive: bool, body: bytes | bytearray) -> None:
        """A request is in (its body whole): queue it."""
        self._fresh = True
        self.started = None
        self.head_done = False
        self.idle_since = time.monotonic()
        self._body = []
        raw = self._url
        if raw[:1] == b"/" and raw.find(b"?") < 0 and raw.find(b"#") < 0:  # most: a bare path
            path, query = raw.decode("latin-1"), ""
        else:
            url = httptools.parse_url(raw)
            path = (url.path or b"/").decode("latin-1")
            query = (url.query or b"").decode("latin-1")
        item = Request(method, path, query, self._headers, body, self.remote)
        self.pending.append((item, keep_alive, method == "HEAD"))
        if len(self.pending) > _MAX_PIPELINED and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not self.busy and self.write_stalled_since is None:
            self._next()

    # -- answering ------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closing or not self.pending:
            self.busy = False
            if self.eof:
                self.close()
            return
        self.busy = True
        item, keep_alive, head = self.pending.popleft()
        if self.paused and len(self.pending) <= _MAX_PIPELINED // 2:
            self.paused = False
            self.transport.resume_reading()
        if isinstance(item, Response):
            self._send(item, keep_alive, head)
            return
        handler, params, allowed = self.server.router.resolve(item.method, item.path)
        if type(handler) is Direct:
            item.match_info = params
            self._answering = (keep_alive, head)
            try:
                handler.fn(item, self._reply)
            except Exception as exc:
                self._send(_internal_error(exc), keep_alive, head)
            return
        self._spawn(self._run(item, handler, params, allowed, keep_alive, head))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task the server waits for when it shuts down."""
        task = self.server.loop.create_task(coro)
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def _reply(self, answer: Response | Awaitable[Response] | bytes) -> None:
        """A :class:`Direct` handler's (or the shortcut's) answer to the request being
        answered."""
        keep_alive, head = self._answering
        if isinstance(answer, Response):
            self._send(answer, keep_alive, head)
        elif isinstance(answer, bytes):
            self._send_bytes(answer)
        else:
            self._spawn(self._respond(answer, keep_alive, head))

    def _send_bytes(self, data: bytes) -> None:
        """Send a whole keep-alive response given as bytes; then the next answer (or close,
        when the server stops)."""
        if self.closing:
            return
        self.transport.write(data)
        self._sent(not self.server.stopping)

    async def _respond(self, answer: Awaitable[Response], keep_alive: bool, head: bool) -> None:
        try:
            response = await answer
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            response = _internal_error(exc)
        self._send(response, keep_alive, head)

    async def _run(
        self,
        request: Request,
        handler: Handler | Direct | None,
        params: dict[str, str],
        allowed: set[str],
        keep_alive: bool,
        head: bool,
    ) -> None:
        if handler is None:
            if allowed:
                if "GET" in allowed:
                    allowed.add("HEAD")
                response = json_response(
                    {"error": f"method {request.method} not allowed on {request.path}"},
                    status=405,
                    headers={"Allow": ", ".join(sorted(allowed))},
                )
            else:
                response = json_response({"error": f"no such path: {request.path}"}, status=404)
        else:
            request.match_info = params
            try:
                response = await handler(request)  # type: ignore[operator]
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                response = _internal_error(exc)
        self._send(response, keep_alive, head)

    def _send(self, response: Response, keep_alive: bool, head: bool) -> None:
        if self.closing:
            return
        keep_alive = keep_alive and not self.server.stopping
        if isinstance(response, _Refusal):
            self._refuse_now(response)
            return
        if isinstance(response, StreamResponse):  # sent as it comes; then the next answer
            self._spawn(self._stream(response, keep_alive, head))
            return
        self.transport.write(response.encode(keep_alive=keep_alive, head_only=head))
        self._sent(keep_alive)

    def _sent(self, keep_alive: bool) -> None:
        """An answer is written: close, or wait for a client that is not reading, or go
        on with the next request."""
        self.idle_since = time.monotonic()
        if not keep_alive:
            self.close()
            return
        if self.write_stalled_since is not None:  # the client is not reading: wait for it
            self.busy = False
            return
        self._next()

    async def _stream(self, response: StreamResponse, keep_alive: bool, head: bool) -> None:
        """Send a :class:`StreamResponse`: its head, each piece as it comes, the last chunk;
        then the next answer (or close). A source that breaks mid-stream cuts it (closed)."""
        chunks = response.chunks
        try:
            if self.closing:
                return
            self.transport.write(response.head(keep_alive=keep_alive))
            if head:
                return
            try:
                async for piece in chunks:
                    if self.closing:
                        return
                    if piece:
                        self.transport.write(b"%x\r\n%b\r\n" % (len(piece), piece))
                    while self.write_stalled_since is not None and not self.closing:
                        await self._writable()  # the client reads slower than it comes
            except Exception as exc:
                print(f"httpserver: a stream ended early: {exc!r}", file=sys.stderr, flush=True)
                self.close()
                return
            if not self.closing:
                self.transport.write(b"0\r\n\r\n")
        finally:
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                await aclose()
        self.idle_since = time.monotonic()
        if not keep_alive:
            self.close()
        elif not self.closing:
            self._next()

    def _fail(self, status: int, why: str) -> None:
        """Refuse what is being received with ``status`` and close; requests parsed before it
        are answered first (the refusal waits in line behind them)."""
        if self.closing or self.refusing:
            return
        self.refusing = True
        self._into = self._into_view = self._gather = None
        refusal = _Refusal(status, why)
        if self.paused:
            self.paused = False
            self.transport.resume_reading()  # drain (and drop) what the client still sends
        if self.busy or self.pending:
            self.pending.append((refusal, False, False))
            return
        self._refuse_now(refusal)

    def _refuse_now(self, refusal: Response) -> None:
        """Send a refusal, then close without losing it (:func:`_linger`)."""
        self.transport.write(refusal.encode(keep_alive=False))
        self.closing = True
        self.closed_at = time.monotonic()
        self.pending.clear()
        _linger(self.transport, self.server.loop)

    def check(self, now: float) -> None:
        """Enforce the server's timeouts on this connection (called by the sweep)."""
        server = self.server
        stalled = self.write_stalled_since
        if self.closing:
            # still flushing to a client that does not read: give up on it
            if stalled is not None or now - self.closed_at > server.send_timeout_s:
                self.transport.abort()
            return
        if stalled is not None:
            if now - stalled > server.send_timeout_s:
                self.closing = True
                self.transport.abort()
            return
        if self.refusing:  # answering what came before the refusal; the handlers time out
            return
        started = self.started
        if started is not None:
            if self.paused:  # we stopped reading (pipelined backlog): not the client's delay
                return
            if not self.head_done:
                if now - started > server.header_timeout_s:
                    self._fail(
                        408, f"request head not received within {server.header_timeout_s:g} s"
                    )
            elif now - self.last_read > server.body_timeout_s:
                self._fail(408, f"request body stalled for {server.body_timeout_s:g} s")
            elif now - started > server.request_timeout_s:
                self._fail(408, f"request not received within {server.request_timeout_s:g} s")
        elif not self.busy and not self.pending and now - self.idle_since > server.keepalive_s:
            self.close()

    def idle(self) -> bool:
        """Between requests with nothing to answer: what may be closed to admit another."""
        return not (self.closing or self.busy or self.pending or self.started is not None)

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.closed_at = time.monotonic()
            if self.write_stalled_since is not None:
                self.transport.abort()  # close() would wait to flush to a client not reading
            else:
                self.transport.close()


class Server:
    """A listening socket served by :class:`_Connection` protocols.

    The limits (see the module's table) are per server; the defaults suit loopback and LAN
    clients sending tensors of up to ``max_body`` bytes.
    """

    def __init__(
        self,
        router: Router,
        *,
        max_body: int = 64 * 1024 * 1024,
        keepalive_s: float = 75.0,
        header_timeout_s: float = 10.0,
        body_timeout_s: float = 10.0,
        request_timeout_s: float = 60.0,
        send_timeout_s: float = 30.0,
        max_connections: int = 1024,
        max_header_bytes: int = 64 * 1024,
        shortcut: Shortcut | None = None,
    ) -> None:
        self.router = router
        #: offered each request whose head comes whole on an idle connection
        #: (:data:`Shortcut`) before the parser reads it
        self.shortcut = shortcut
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.request_timeout_s = request_timeout_s
        self.send_timeout_s = send_timeout_s
        self.max_connections = max(1, max_connections)
        self.max_header_bytes = max_header_bytes
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        # what every connection receives into (the loop runs one read at a time, and each is
        # parsed or copied out before the next): heads, and bodies the parser reads
        self.read_buffer = bytearray(_READ_BYTES)
        self.read_view = memoryview(self.read_buffer)
        self.body_buffers = _BodyBuffers()
        self.stopping = False
        self.refused = 0
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(
        self, host: str, port: int, *, backlog: int = 2048, sock: socket.socket | None = None
    ) -> int:
        """Listen on ``host:port`` (0: any free port), or serve ``sock``, a socket already
        listening (handed over by a supervisor that keeps it open across restarts); returns
        the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        self.loop = asyncio.get_running_loop()
        self.max_connections = _fit_descriptor_limit(self.max_connections)
        if sock is not None:
            self._server = await self.loop.create_server(
                lambda: _Connection(self), sock=sock, backlog=backlog
            )
        else:
            self._server = await self.loop.create_server(
                lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True
            )
        self._sweeper = self.loop.create_task(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])

    def admit(self, conn: _Connection) -> bool:
        """Whether a new connection may stay open: below ``max_connections``, or after
        closing the connection idle the longest."""
        if len(self.connections) < self.max_connections:
            return True
        open_ = [c for c in self.connections if not c.closing]  # closing ones are on their way
        if len(open_) < self.max_connections:
            return True
        idle = [c for c in open_ if c.idle()]
        if not idle:
            self.refused += 1
            return False
        min(idle, key=lambda c: c.idle_since).close()
        return True

    async def _sweep(self) -> None:
        """Apply the timeouts to every connection, at least once a second."""
        tick = min(
            self.keepalive_s,
            self.header_timeout_s,
            self.body_timeout_s,
            self.request_timeout_s,
            self.send_timeout_s,
        )
        tick = max(0.02, min(1.0, tick / 4))
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for conn in list(self.connections):
                conn.check(now)

    async def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop accepting, let in-flight requests finish (up to ``timeout_s``), close all."""
        self.stopping = True
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            if not conn.busy:
                conn.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.tasks:
                await asyncio.wait(set(self.tasks), timeout=deadline - time.monotonic())
            elif any(c.busy and not c.closing for c in self.connections):
                await asyncio.sleep(0.005)  # a Direct handler's answer is on its way
            else:
                break
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()


def _fit_descriptor_limit(connections: int, *, spare: int = 256) -> int:
    """Raise this process's open-file limit so ``connections`` client sockets fit beside
    ``spare`` other descriptors (upstream connections, logs, the store); when the hard limit
    does not allow it, the number of connections that fit."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return connections
    need = connections + spare
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (OSError, ValueError):
            pass
    if soft == resource.RLIM_INFINITY:
        return connections
    return max(1, min(connections, soft - spare))


#: seconds a refused client may go on sending before its connection is reset
LINGER_S = 2.0


def _linger(transport: Any, loop: asyncio.AbstractEventLoop) -> None:
    """Close after an error answer without losing it: send it and a FIN, then read (and drop)
    what the client still sends until it closes too, for at most :data:`LINGER_S`. Closing at
    once would make the kernel answer its next bytes with a reset, which destroys the answer
    not yet read on the client's side."""
    try:
        transport.write_eof()
    except (OSError, RuntimeError, NotImplementedError):
        transport.close()
        return
    loop.call_later(LINGER_S, _abort, transport)


def _abort(transport: Any) -> None:
    with contextlib.suppress(Exception):  # already gone
        transport.abort()
