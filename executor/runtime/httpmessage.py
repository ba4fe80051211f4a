"""HTTP messages as greenctl's servers hand them to handlers and take them back: a
request's :class:`Headers` and :class:`Request`, a whole :class:`Response` or a streamed
:class:`StreamResponse`, JSON answers, and the admin endpoints' loopback-and-token check.
The server that parses and sends them: :mod:`greenctl.executor.runtime.httpserver`.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

_REASONS = {s.value: s.phrase for s in HTTPStatus}
#: each known status's line and the start of the Content-Length header
_STATUS_LINES = {k: f"HTTP/1.1 {k} {v}\r\nContent-Length: " for k, v in _REASONS.items()}


class Headers(dict[str, str]):
    """Request headers, looked up case-insensitively (keys are stored lower-cased)."""

    def __getitem__(self, key: str) -> str:
        return dict.__getitem__(self, key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and dict.__contains__(self, key.lower())

    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        return dict.get(self, key.lower(), default)

    def add(self, key: str, text: str) -> None:
        """Take a received header (``key`` lower-cased); a repeated one is joined to the
        earlier with a comma, as HTTP reads repeated fields."""
        old = dict.get(self, key)
        dict.__setitem__(self, key, text if old is None else f"{old}, {text}")


class Request:
    """One parsed request: what a handler reads."""

    __slots__ = ("body", "headers", "match_info", "method", "path", "query_string", "remote")

    def __init__(
        self,
        method: str,
        path: str,
        query_string: str,
        headers: Headers,
        body: bytes | bytearray,
        remote: str | None,
    ) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.body = body
        self.remote = remote
        self.match_info: dict[str, str] = {}

    async def read(self) -> bytes | bytearray:
        """The body: ``bytes``, or the ``bytearray`` a body of known length was received
        into (read-only by convention: handlers take views of it, never write it)."""
        return self.body

    async def json(self) -> Any:
        """The body as JSON.

        Raises:
            ValueError: not JSON, or nested too deeply to parse (what handlers answer 400 to).
        """
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("the JSON body is nested too deeply") from None


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
        status = self.status
        first = _STATUS_LINES.get(status)
        if first is None:
            first = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Length: "
        head = "".join(
            [
                first,
                str(len(self.body)),
                "\r\n",
                *[f"{k}: {v}\r\n" for k, v in self.headers.items()],
                "\r\n" if keep_alive else "Connection: close\r\n\r\n",
            ]
        ).encode("latin-1")
        return head if head_only else head + self.body


class StreamResponse(Response):
    """A response whose body comes piece by piece (``chunks``, an async iterator of bytes:
    server-sent events), each sent as it arrives with chunked transfer encoding; the
    iterator is closed when the stream ends, however it ends. While a stream runs its
    connection answers nothing else (pipelined requests wait, in order); a client that goes
    away ends it."""

    __slots__ = ("chunks",)

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        status: int = 200,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status=status, headers=headers)
        self.chunks = chunks

    def head(self, *, keep_alive: bool) -> bytes:
        """The status line and headers."""
        lines = [f"HTTP/1.1 {self.status} {_REASONS.get(self.status, 'Unknown')}"]
        lines += ["Transfer-Encoding: chunked", *[f"{k}: {v}" for k, v in self.headers.items()]]
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


#: The header an admin request carries its daemon's token in (dispatcher, executor, geo router).
TOKEN_HEADER = "X-Greenctl-Token"


def is_loopback(request: Any) -> bool:
    """Whether ``request`` comes from this machine (admin endpoints answer nobody else)."""
    remote = request.remote or ""
    return remote in ("127.0.0.1", "::1") or remote.startswith("127.")


def admin_allowed(request: Any, token: str) -> bool:
    """An admin request: from loopback, with the daemon's token (compared in constant time)."""
    return is_loopback(request) and hmac.compare_digest(
        request.headers.get(TOKEN_HEADER, ""), token
    )


def json_response(
    doc: Any, *, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    out = Response(status=status, body=json.dumps(doc).encode(), headers=headers)
    out.headers.setdefault("Content-Type", "application/json")
    return out
