"""The dispatcher's request path: the Open Inference Protocol front that forwards
``/v2/models/{name}/...`` to the model's executor instances.

A request goes to the instance its model's policy picks
(:meth:`~greenctl.executor.runtime.dispatch_routes.ModelRoute.acquire`), or, when it states
requirements or names a variant, to the one the model-less choice picks
(:func:`~greenctl.executor.runtime.dispatch_modelless.choose_backend`). A request whose
instance dies mid-flight (connection refused, reset or closed) is retried once: on another
instance of the model, or, when it was the only one, on the same instance once it is back.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.dispatch_admin import RoutingTable
from greenctl.executor.runtime.dispatch_modelless import (
    ANY,
    NoVariant,
    choose_backend,
    name_variant,
    requirements_of,
)
from greenctl.executor.runtime.dispatch_relay import parsed_request, plain_answer, plain_request
from greenctl.executor.runtime.dispatch_routes import Backend, ModelRoute, QueueFull
from greenctl.executor.runtime.metrics import LATENCY_BUCKETS_S, bucket_index
from greenctl.executor.runtime.oip import HEADER_LENGTH
from greenctl.executor.runtime.upstream import UpstreamError, UpstreamTimeout, headers_of

#: the request headers passed on to an executor
_FORWARD_HEADERS = (
    "Content-Type",
    HEADER_LENGTH,
    "Content-Encoding",
    "Accept-Encoding",
)
#: each with the key it is stored under in a received request's headers
_FORWARD_KEYS = tuple((h, h.lower()) for h in _FORWARD_HEADERS)
#: the executor's timing headers, as sent on and as the upstream client keys them
_TIMING_KEYS = tuple((h, h.lower()) for h in oip.TIMING_HEADERS)
#: the response header naming the variant that served a request
VARIANT_HEADER = "Greenctl-Variant"


class Forwarding(RoutingTable):
    """The OIP endpoints clients call, and the counters of what they were answered."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.latency_counts: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = collections.defaultdict(float)
        self.retries = 0
        self.rejected = 0

    #: the instance a model-less request goes to (its slot taken)
    choose = staticmethod(choose_backend)

    async def server_meta(self, request: Any) -> Any:
        """``GET /v2``: the server's metadata."""
        return hs.json_response(
            {"name": "greenctl-dispatcher", "version": "1", "extensions": ["binary_tensor_data"]}
        )

    async def live(self, request: Any) -> Any:
        """``GET /v2/health/live``: the process answers."""
        return hs.json_response({"live": True})

    async def ready(self, request: Any) -> Any:
        """``GET /v2/health/ready``: every model has an instance up (503 otherwise)."""
        ok = bool(self.routes) and all(any(b.up for b in r.backends) for r in self.routes.values())
        return hs.json_response({"ready": ok}, status=200 if ok else 503)

    def _route(self, request: Any) -> tuple[ModelRoute | None, str | None, Any]:
        """The route a request names: a model's (variant None), or, for a variant's own
        name, its family's and that variant; else a 404 response."""
        name = request.match_info["name"]
        route = self.routes.get(name)
        if route is not None:
            return route, None, None
        route = self.variant_routes.get(name)
        if route is not None:
            return route, name, None
        known = ", ".join(sorted(self.routes)) or "none"
        if self.variant_routes:
            known += f"; variants: {', '.join(sorted(self.variant_routes))}"
        return (
            None,
            None,
            hs.json_response(
                {"error": f"unknown model '{name}' (this plan serves: {known})"}, status=404
            ),
        )

    def _members(self, route: ModelRoute, variant: str | None) -> list[Backend]:
        """The instances of ``route`` (of its ``variant`` only, when one is named)."""
        if variant is None:
            return route.backends
        return [b for _, group in route.variants.get(variant, ()) for b in group]

    async def model_meta(self, request: Any) -> Any:
        """A model's metadata, from one of its instances that is up (a variant answers
        under its own name, with its family)."""
        route, variant, bad = self._route(request)
        if route is None:
            return bad
        for b in self._members(route, variant):
            if not b.up:
                continue
            with contextlib.suppress(Exception):
                async with self.session.get(b.url + request.path) as resp:
                    body = await resp.read()
                    if variant is not None and resp.status == 200:  # it answers as a model
                        doc = json.loads(body)
                        doc["name"] = variant
                        doc.setdefault("parameters", {})["family"] = route.name
                        return hs.json_response(doc)
                    return hs.Response(
                        status=resp.status, body=body, content_type="application/json"
                    )
        return hs.json_response(
            {"error": f"no ready instance of '{variant or route.name}'"}, status=503
        )

    async def model_ready(self, request: Any) -> Any:
        """Whether a model (or variant) has an instance up (503 when not)."""
        route, variant, bad = self._route(request)
        if route is None:
            return bad
        ok = any(b.up for b in self._members(route, variant))
        return hs.json_response(
            {"name": variant or route.name, "ready": ok}, status=200 if ok else 503
        )

    def infer_now(self, request: Any, reply: hs.Reply) -> None:
        """Forward an inference request without a task (a :class:`~.httpserver.Direct`
        handler): when its model's policy has an instance free now and a pooled connection
        to it is open, the request goes out here and the answer is sent from the upstream
        connection's callback. Anything else (a request that waits in the queue, a
        model-less one, a new connection, a retry) is the same request on :meth:`_forward`.
        """
        t0 = time.perf_counter()
        route, variant, bad = self._route(request)
        if route is None:
            reply(bad)
            return
        headers = _forwarded(request.headers)
        try:
            req = requirements_of(request.body, headers.get(HEADER_LENGTH))
        except InputError as exc:
            reply(self._bad_request(route, exc, t0))
            return
        if req is not None or variant is not None:  # model-less: chosen by what it needs
            reply(self._forward(request, route, variant, req, headers, t0))
            return
        try:
            b = route.take()
        except QueueFull as full:
            reply(self._busy(route, full, t0))
            return
        if b is None:  # it waits in the queue
            reply(self._forward(request, route, None, None, headers, t0))
            return
        conn = b.pool.take_idle()
        if conn is None:  # a new connection to open first
            reply(self._forward(request, route, None, None, headers, t0, held=b))
            return

        def answered(status: int, rh: dict[str, str], data: bytes) -> None:
            route.release(b)
            reply(self._answer(route, None, b, False, status, rh, data, t0))

        def failed(exc: UpstreamError, stale: bool) -> None:
            self._sent_failed(request, route, b, headers, t0, reply, exc, stale)

        b.pool.send(conn, request.path, request.body, headers, self.timeout_s, answered, failed)

    def relay(self, raw: bytes | bytearray, pos: int, end: int, n: int, reply: hs.Reply) -> int:
        """The dispatcher's :data:`~greenctl.executor.runtime.httpserver.Shortcut`: a plain
        request (:func:`~greenctl.executor.runtime.dispatch_relay.plain_request`, its body
        all in, no requirements) goes as the bytes it came as to the instance its model's
        policy picks, now or once it is its turn in the queue; a plain answer comes back
        as its bytes with the variant header added, anything else the parsed way
        (:meth:`_answer`). Where the next request starts, or -1: the parsed way takes the
        request (nothing was changed)."""
        t0 = time.perf_counter()
        head = bytes(raw[pos:end])
        plain = plain_request(head)
        if plain is None:
            return -1
        name, size, tensor_head = plain
        stop = end + size
        route = self.routes.get(name)
        if route is None:
            return -1
        if stop > n:
            return stop  # the rest of its body is still to come
        body = bytes(raw[end:stop])
        try:
            if requirements_of(body, tensor_head) is not None:
                return -1  # model-less
            b = route.take()
        except (InputError, QueueFull):
            return -1  # answered 400 or 503 the parsed way
        whole = bytes(raw[pos:stop])
        if b is not None:
            self._relay_to(b, route, whole, end - pos, t0, reply)
            return stop

        def refused(full: QueueFull) -> None:
            reply(self._busy(route, full, t0))

        waiter = _Queued(lambda b: self._relay_to(b, route, whole, end - pos, t0, reply), refused)
        return stop if route.queue(waiter) else -1  # (else the parsed way waits)

    def _relay_to(
        self, b: Backend, route: ModelRoute, whole: bytes, end: int, t0: float, reply: hs.Reply
    ) -> None:
        """Send a relayed request (``whole``, its head ending at ``end``) to ``b``, whose
        slot it holds, and answer what comes back."""
        conn = b.pool.take_idle()
        if conn is None:  # a new connection to open first
            request = parsed_request(whole[:end], whole[end:])
            headers = _forwarded(request.headers)
            reply(self._forward(request, route, None, None, headers, t0, held=b))
            return

        def answered(status: int, answer: bytes, data: bytes) -> None:
            route.release(b)
            if status == 200 and plain_answer(answer):
                self._count(route.name, "200", t0)
                variant = (
                    b"" if b.variant is None else f"\r\n{VARIANT_HEADER}: {b.variant}".encode()
                )
                reply(b"".join((answer, variant, b"\r\n\r\n", data)))
            else:
                reply(self._answer(route, None, b, False, status, headers_of(answer), data, t0))

        def failed(exc: UpstreamError, stale: bool) -> None:
            request = parsed_request(whole[:end], whole[end:])
            headers = _forwarded(request.headers)
            self._sent_failed(request, route, b, headers, t0, reply, exc, stale)

        b.pool.send_raw(conn, whole, self.timeout_s, answered, failed)

    def _sent_failed(
        self,
        request: Any,
        route: ModelRoute,
        b: Backend,
        headers: dict[str, str],
        t0: float,
        reply: hs.Reply,
        exc: UpstreamError,
        stale: bool,
    ) -> None:
        """A request sent without a task failed on ``b``: the same instance afresh when
        the pooled connection was stale, else once more on another the way
        :meth:`_forward` retries, else a 502."""
        if stale:  # an idle connection the executor closed: the same instance, afresh
            reply(self._forward(request, route, None, None, headers, t0, held=b))
            return
        tried = {b.id}
        again = self._retries(route, b, exc, 0, tried, False)
        route.release(b)
        if again:
            reply(self._forward(request, route, None, None, headers, t0, attempt=1, tried=tried))
        else:
            reply(self._bad_gateway(route, _failure(route, b, exc), t0))

    async def _forward(
        self,
        request: Any,
        route: ModelRoute,
        variant: str | None,
        req: Any,
        headers: dict[str, str],
        t0: float,
        *,
        held: Backend | None = None,
        attempt: int = 0,
        tried: set[str] | None = None,
    ) -> Any:
        """Send a request to an instance and answer what it answers: the first attempt to
        ``held`` when its slot is already taken, else to the one the policy (or, for a
        model-less request, the choice) picks; once more on another when the connection
        fails (``attempt`` 1: one already failed, the instances in ``tried``)."""
        chosen = req is not None or variant is not None  # model-less, or a variant's name
        tried = set() if tried is None else tried
        failed = ""
        while attempt < 2:
            if held is not None:
                b, held = held, None
            else:
                try:
                    if chosen:
                        b = self.choose(route, variant, req or ANY)
                    else:
                        b = await route.acquire(tried)
                except QueueFull as full:
                    return self._busy(route, full, t0)
                except NoVariant as none:
                    if attempt:  # the instance chosen first failed, and no other one meets it
                        return self._bad_gateway(route, f"{failed}; {none}", t0)
                    self._count(route.name, "422", t0)
                    return hs.json_response(none.doc(), status=422)
            try:
                status, rh, data = await b.pool.post(request.path, request.body, headers,
                                                     self.timeout_s)  # fmt: skip
            except UpstreamError as exc:
                tried.add(b.id)
                failed = _failure(route, b, exc)
                if self._retries(route, b, exc, attempt, tried, chosen):
                    attempt += 1
                    continue
                return self._bad_gateway(route, failed, t0)
            finally:
                route.release(b)
            return self._answer(route, variant, b, chosen, status, rh, data, t0)
        raise AssertionError("unreachable")

    def _retries(
        self,
        route: ModelRoute,
        b: Backend,
        exc: UpstreamError,
        attempt: int,
        tried: set[str],
        chosen: bool,
    ) -> bool:
        """The connection to ``b`` failed (it is suspected down): whether the request is
        sent once more. Inference is idempotent: a request whose connection failed
        (refused, reset, closed) is sent once more, to another instance, or, when there is
        none, to this one once it is back; one that timed out is not (it may still run)."""
        self._suspect(b)
        if attempt == 0 and not isinstance(exc, UpstreamTimeout):
            others = [x for x in route.backends if x.up and x.id not in tried]
            if others or (route.coming_back() and not chosen):
                if not others:
                    tried.clear()  # wait in the queue for it (or a sibling) to return
                self.retries += 1
                return True
        return False

    def _answer(
        self,
        route: ModelRoute,
        variant: str | None,
        b: Backend,
        chosen: bool,
        status: int,
        rh: dict[str, str],
        data: bytes,
        t0: float,
    ) -> hs.Response:
        """The client's answer from an executor's: its body and content type, the tensor
        header's length, its timing headers and the variant that served it."""
        out_headers = {"Content-Type": rh.get("content-type", "application/json")}
        head_len = rh.get("inference-header-content-length")
        if chosen and status == 200 and b.variant is not None:
            data, head_len = name_variant(data, head_len, b.variant, route.name, variant)
        if head_len is not None:
            out_headers[HEADER_LENGTH] = head_len
        for name, key in _TIMING_KEYS:  # the executor's own timing, passed on
            if (value := rh.get(key)) is not None:
                out_headers[name] = value
        if b.variant is not None:
            out_headers[VARIANT_HEADER] = b.variant
        self._count(route.name, str(status), t0)
        return hs.Response(status=status, body=data, headers=out_headers)

    def _bad_request(self, route: ModelRoute, exc: InputError, t0: float) -> hs.Response:
        """A 400 for requirements that cannot be read (worded as the executor words it)."""
        self._count(route.name, "400", t0)
        return hs.json_response({"error": str(exc)}, status=400)

    def _bad_gateway(self, route: ModelRoute, why: str, t0: float) -> hs.Response:
        """A 502: the instance failed and the request is not sent again."""
        self._count(route.name, "502", t0)
        return hs.json_response({"error": why}, status=502)

    def _busy(self, route: ModelRoute, full: QueueFull, t0: float) -> hs.Response:
        """A 503 for a request its model cannot take now."""
        self.rejected += 1
        self._count(route.name, "503", t0)
        return busy_response(full, route.name)

    def _count(self, model: str, code: str, t0: float) -> None:
        """Count an answer by model and status code (and an answered one's latency)."""
        self.requests[(model, code)] += 1
        if code == "200":
            counts = self.latency_counts.get(model)
            if counts is None:
                counts = self.latency_counts[model] = [0] * (len(LATENCY_BUCKETS_S) + 1)
            dt = time.perf_counter() - t0
            counts[bucket_index(LATENCY_BUCKETS_S, dt)] += 1
            self.latency_sum[model] += dt

    def _suspect(self, b: Backend) -> None:
        """A connection to ``b`` failed: stop routing to it until the supervisor checks it."""
        b.up = False
        self.recheck.set()
        for route in self.routes.values():
            if b in route.backends:
                route.fail_waiters()


class _Queued:
    """A relayed request waiting in its model's queue: handed its instance (``set_result``)
    or refused (``set_exception``) the way a waiting future is, without a task."""

    __slots__ = ("finished", "go", "refuse")

    def __init__(self, go: Callable[[Backend], None], refuse: Callable[[QueueFull], None]) -> None:
        self.go, self.refuse = go, refuse
        self.finished = False

    def done(self) -> bool:
        return self.finished

    def set_result(self, b: Backend) -> None:
        self.finished = True
        self.go(b)

    def set_exception(self, exc: QueueFull) -> None:
        self.finished = True
        self.refuse(exc)


def busy_response(full: QueueFull, model: str) -> hs.Response:
    """The 503 a request gets when ``model`` cannot take it now, with ``Retry-After``."""
    return hs.json_response(
        {"error": full.reason or f"model '{model}' is at capacity; retry later"},
        status=503,
        headers={"Retry-After": str(max(1, math.ceil(full.retry_after_s)))},
    )


def _failure(route: ModelRoute, b: Backend, exc: UpstreamError) -> str:
    """What a 502 says of an instance whose connection failed."""
    return f"instance {b.id} of '{route.name}' failed: {exc}"


def _forwarded(got: Any) -> dict[str, str]:
    """The request headers an executor is sent (:data:`_FORWARD_HEADERS` that came)."""
    out = {}
    plain = isinstance(got, hs.Headers)  # stored lower-cased: plain lookups
    for name, key in _FORWARD_KEYS:
        value = dict.get(got, key) if plain else got.get(name)
        if value is not None:
            out[name] = value
    return out
