"""A lean HTTP/1.1 server for the executors' and the dispatcher's inbound side.

Every inference request crosses one of these servers twice on its way through a plan (the
dispatcher, then an executor), so the CPU each request costs here is serving overhead paid
on the cores the models run on. A general web framework spends most of a small request in
request objects, middleware and routing machinery; this module keeps only what the Open
Inference Protocol endpoints need:

- an :class:`asyncio.Protocol` per connection, parsed by ``httptools`` (the llhttp parser
  that uvicorn uses): keep-alive, pipelined requests answered in order, chunked request
  bodies, ``Expect: 100-continue``, ``HEAD`` on every ``GET`` route;
- a router of ``GET``/``POST`` paths with ``{name}`` segments (404 and 405 with ``Allow``);
- :class:`Request` and :class:`Response` objects with the few aiohttp-like members the
  handlers use (``match_info``, ``headers``, ``path``, ``remote``, ``read()``, ``json()``);
- limits: a request body over ``max_body`` is refused with 413, a malformed request gets
  400 and the connection is closed, connections idle for ``keepalive_s`` are closed, and a
  handler's exception becomes a 500 JSON error (the traceback goes to stderr);
- :meth:`Server.shutdown` stops accepting, lets in-flight requests finish (bounded), then
  closes every connection.
"""

from __future__ import annotations

import asyncio
import collections
import json
import re
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

import httptools

Handler = Callable[["Request"], Awaitable["Response"]]

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_MAX_PIPELINED = 64  # requests parsed ahead of the one being answered, per connection


class Headers(dict[str, str]):
    """Request headers, looked up case-insensitively (keys are stored lower-cased)."""

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and dict.__contains__(self, key.lower())

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)


class Request:
    """One parsed request: what a handler reads."""

    __slots__ = ("body", "headers", "match_info", "method", "path", "query_string", "remote")

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Headers,
        body: bytes,
        remote: str | None,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.remote = remote
        self.match_info: dict[str, str] = {}

    async def read(self) -> bytes:
        return self.body

    async def json(self) -> Any:
        return json.loads(self.body)


class Response:
    """A whole response: status, headers and body (always sent with ``Content-Length``)."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        text: str | None = None,
        content_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.status = status
        self.headers = dict(headers) if headers else {}
        if text is not None:
            body = text.encode()
            self.headers.setdefault(
                "Content-Type", f"{content_type or 'text/plain'}; charset=utf-8"
            )
        elif content_type is not None:
            self.headers["Content-Type"] = content_type
        self.body = body

    def encode(self, *, keep_alive: bool, head_only: bool = False) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}"]
        lines.append(f"Content-Length: {len(self.body)}")
        lines.extend(f"{k}: {v}" for k, v in self.headers.items())
        if not keep_alive:
            lines.append("Connection: close")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def json_response(
    doc: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    out = Response(status=status, body=json.dumps(doc).encode(), headers=headers)
    out.headers.setdefault("Content-Type", "application/json")
    return out


class Router:
    """``GET``/``POST`` routes by path; ``{name}`` matches one path segment."""

    def __init__(self) -> None:
        self._static: dict[tuple[str, str], Handler] = {}
        self._dynamic: list[tuple[str, re.Pattern[str], Handler]] = []
        self._paths: dict[str, set[str]] = collections.defaultdict(set)

    def add_get(self, path: str, handler: Handler) -> None:
        self._add("GET", path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self._add("POST", path, handler)

    def _add(self, method: str, path: str, handler: Handler) -> None:
        self._paths[path].add(method)
        if "{" not in path:
            self._static[(method, path)] = handler
            return
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(path))
        self._dynamic.append((method, re.compile(pattern + r"\Z"), handler))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], set[str]]:
        """The handler for ``method path`` and its path parameters; else the methods allowed
        on that path (empty: no such path)."""
        lookup = "GET" if method == "HEAD" else method
        handler = self._static.get((lookup, path))
        if handler is not None:
            return handler, {}, set()
        allowed: set[str] = set()
        for m, rx, h in self._dynamic:
            match = rx.match(path)
            if match is None:
                continue
            if m == lookup:
                return h, match.groupdict(), set()
            allowed.add(m)
        for m in ("GET", "POST"):
            if (m, path) in self._static:
                allowed.add(m)
        return None, {}, allowed


class _Connection(asyncio.Protocol):
    """One client connection: parse requests, run handlers one at a time, answer in order."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None  # asyncio's or uvloop's transport
        self.remote: str | None = None
        self.pending: collections.deque[tuple[Request | Response, bool, bool]] = collections.deque()
        self.busy = False
        self.closing = False
        self.paused = False
        self.last_active = time.monotonic()
        self._url = b""
        self._headers: Headers = Headers()
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) and peer else None
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.pending.clear()
        self.server.connections.discard(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        if self.closing:
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    # -- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = Headers()
        self._body = []
        self._size = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = dict.get(self._headers, key)
        dict.__setitem__(self._headers, key, text if old is None else f"{old}, {text}")

    def on_headers_complete(self) -> None:
        length = dict.get(self._headers, "content-length")
        if length is not None and length.isdigit() and int(length) > self.server.max_body:
            self._too_large = True
        elif dict.get(self._headers, "expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self._too_large:
            return
        self._size += len(chunk)
        if self._size > self.server.max_body:
            self._too_large = True
            self._body = []
            return
        self._body.append(chunk)

    def on_message_complete(self) -> None:
        keep_alive = bool(self.parser.should_keep_alive())
        method = self.parser.get_method().decode("latin-1")
        if self._too_large:
            limit = self.server.max_body
            item: Request | Response = json_response(
                {"error": f"request body exceeds the {limit} byte limit"}, status=413
            )
            keep_alive = False  # the rest of an oversized body may still be in flight
        else:
            url = httptools.parse_url(self._url)
            path = (url.path or b"/").decode("latin-1")
            query = (url.query or b"").decode("latin-1")
            body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
            item = Request(method, path, query, self._headers, body, self.remote)
        self.pending.append((item, keep_alive, method == "HEAD"))
        if len(self.pending) > _MAX_PIPELINED and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not self.busy:
            self._next()

    # -- answering ------------------------------------------------------------------------
    def _next(self) -> None:
        if self.closing or not self.pending:
            self.busy = False
            return
        self.busy = True
        item, keep_alive, head = self.pending.popleft()
        if self.paused and len(self.pending) <= _MAX_PIPELINED // 2:
            self.paused = False
            self.transport.resume_reading()
        if isinstance(item, Response):
            self._send(item, keep_alive, head)
            return
        task = self.server.loop.create_task(self._run(item, keep_alive, head))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _run(self, request: Request, keep_alive: bool, head: bool) -> None:
        handler, params, allowed = self.server.router.resolve(request.method, request.path)
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
                response = await handler(request)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                response = json_response(
                    {"error": f"internal error: {type(exc).__name__}: {exc}"}, status=500
                )
        self._send(response, keep_alive, head)

    def _send(self, response: Response, keep_alive: bool, head: bool) -> None:
        if self.closing:
            return
        keep_alive = keep_alive and not self.server.stopping
        self.transport.write(response.encode(keep_alive=keep_alive, head_only=head))
        self.last_active = time.monotonic()
        if not keep_alive:
            self.close()
            return
        self._next()

    def _fail(self, status: int, why: str) -> None:
        if self.busy:  # answer what is in flight first would reorder; just drop the connection
            self.close()
            return
        self.transport.write(json_response({"error": why}, status=status).encode(keep_alive=False))
        self.close()

    def close(self) -> None:
        if not self.closing:
            self.closing = True
            self.transport.close()


class Server:
    """A listening socket served by :class:`_Connection` protocols."""

    def __init__(
        self,
        router: Router,
        *,
        max_body: int = 64 * 1024 * 1024,
        keepalive_s: float = 75.0,
    ) -> None:
        self.router = router
        self.max_body = max_body
        self.keepalive_s = keepalive_s
        self.connections: set[_Connection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, *, backlog: int = 2048) -> int:
        """Listen on ``host:port`` (0: any free port); returns the bound port.

        Raises:
            OSError: the address cannot be bound.
        """
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, backlog=backlog, reuse_address=True
        )
        self._sweeper = self.loop.create_task(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])

    async def _sweep(self) -> None:
        """Close keep-alive connections idle for longer than ``keepalive_s``."""
        while True:
            await asyncio.sleep(min(self.keepalive_s, 10.0))
            now = time.monotonic()
            for conn in list(self.connections):
                if not conn.busy and now - conn.last_active > self.keepalive_s:
                    conn.close()

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
        if self.tasks:
            await asyncio.wait(set(self.tasks), timeout=timeout_s)
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
