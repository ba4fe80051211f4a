"""Streamed answers for the dispatcher's OpenAI front: a :class:`StreamResponse` whose body
comes piece by piece (server-sent events), sent with chunked transfer encoding as each piece
arrives, by a :class:`StreamingServer` (the lean server of
:mod:`~greenctl.executor.runtime.httpserver`, whose connections also send these).

While a stream runs its connection answers nothing else (pipelined requests wait, in order);
a client that goes away ends the stream, which closes its source (the engine's answer).
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from http import HTTPStatus
from typing import Any

from greenctl.executor.runtime import httpserver as hs


class StreamResponse(hs.Response):
    """A response whose body is ``chunks``, sent as they come (``Transfer-Encoding:
    chunked``); the iterator is closed when the stream ends, however it ends."""

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
        reason = (
            HTTPStatus(self.status).phrase if self.status in HTTPStatus._value2member_map_ else ""
        )
        lines = [f"HTTP/1.1 {self.status} {reason}", "Transfer-Encoding: chunked"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        if not keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _StreamingConnection(hs._Connection):
    """A connection that also sends :class:`StreamResponse` answers."""

    def _send(self, response: hs.Response, keep_alive: bool, head: bool) -> None:
        if not isinstance(response, StreamResponse):
            super()._send(response, keep_alive, head)
            return
        keep_alive = keep_alive and not self.server.stopping
        task = self.server.loop.create_task(self._pump(response, keep_alive, head))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    async def _pump(self, response: StreamResponse, keep_alive: bool, head: bool) -> None:
        """Send the head, then each piece as it comes, then the last chunk; then the next
        answer (or close)."""
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
                        await asyncio.sleep(0.005)  # the client reads slower than tokens come
            except Exception as exc:  # the source broke mid-stream: the client sees it cut
                print(f"dispatcher: a stream ended early: {exc!r}", flush=True)
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


class StreamingServer(hs.Server):
    """The lean server, its connections able to send :class:`StreamResponse` answers."""

    async def start(
        self, host: str, port: int, *, backlog: int = 2048, sock: socket.socket | None = None
    ) -> int:
        """As :meth:`httpserver.Server.start`, with streaming connections."""
        self.loop = asyncio.get_running_loop()
        self.max_connections = hs._fit_descriptor_limit(self.max_connections)
        factory: Any = lambda: _StreamingConnection(self)  # noqa: E731
        if sock is not None:
            self._server = await self.loop.create_server(factory, sock=sock, backlog=backlog)
        else:
            self._server = await self.loop.create_server(
                factory, host, port, backlog=backlog, reuse_address=True
            )
        self._sweeper = self.loop.create_task(self._sweep())
        return int(self._server.sockets[0].getsockname()[1])
