"""The dispatcher's OpenAI front for LLM tiers: ``/v1/chat/completions``, ``/v1/completions``
(streamed or not) and ``/v1/models``, beside the Open Inference Protocol.

A request's ``model`` names a family, whose tiers share requests by the plan's ``llm.shares``
(:class:`~greenctl.planner.core.policy.SmoothWRR` over instances weighted by their tier's
share), or one tier. ``max_ttft_ms`` and ``min_quality`` (checked as model-less requirements
are, :func:`~greenctl.planner.core.choice.check_requirement`) leave only the tiers whose
predicted TTFT (at the plan's percentile) and quality meet them; none: 422 naming the closest.
The engine gets its own model name; its answer comes back naming the tier, streamed chunk by
chunk. Tokens count per tier and phase from the engine's ``usage`` (else the streamed pieces),
energy and carbon from them by the tier's joules per token (labelled ``modeled``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import re
import time
from collections.abc import AsyncIterator
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.dispatch_energy import EnergyAccounting
from greenctl.executor.runtime.dispatch_forward import VARIANT_HEADER, Forwarding
from greenctl.executor.runtime.dispatch_routes import Backend, ModelRoute
from greenctl.executor.runtime.metrics import CARBON_TOTAL, ENERGY_TOTAL, carbon_g
from greenctl.planner.core.choice import check_requirement

#: a request's requirements, each checked as the model-less requirement it mirrors
REQUIREMENTS = {"max_ttft_ms": "latency_slo_ms", "min_quality": "min_accuracy"}
#: the energy source label of figures counted from tokens (an estimate)
MODELED = "modeled"


def openai_error(status: int, message: str, *, param: str | None = None, code: str = "") -> Any:
    """An error in OpenAI's shape (``{"error": {message, type, param, code}}``)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    doc = {"error": {"message": message, "type": kind, "param": param, "code": code or None}}
    return hs.json_response(doc, status=status)


def requirements(body: dict[str, Any]) -> dict[str, float]:
    """The request's ``max_ttft_ms`` and ``min_quality`` that are set, checked.

    Raises:
        InputError: not a number in range (names the field).
    """
    out = {}
    for key, rule in REQUIREMENTS.items():
        if body.get(key) is None:
            continue
        try:
            out[key] = check_requirement(rule, body[key])
        except InputError as exc:
            raise InputError(exc.message.replace(rule, key)) from None
    return out


def tiers_of(route: ModelRoute) -> dict[str, list[Backend]]:
    """The route's LLM instances by tier."""
    out: dict[str, list[Backend]] = {}
    for b in route.backends:
        if b.llm is not None and b.variant is not None:
            out.setdefault(b.variant, []).append(b)
    return out


def meets(figures: dict[str, Any], req: dict[str, float]) -> float:
    """How far a tier is from meeting ``req``: 0 when it meets it, else the relative
    shortfalls added up (infinite where a figure is unknown)."""
    gap = 0.0
    for key, figure in (("max_ttft_ms", "ttft_ms"), ("min_quality", "quality")):
        if key not in req:
            continue
        value, bound = figures.get(figure), req[key]
        if not isinstance(value, int | float):
            return math.inf
        short = value - bound if key == "max_ttft_ms" else bound - value
        gap += max(short, 0.0) / max(bound, 1e-9)
    return gap


class NoTier(Exception):
    """No tier meets a request's requirements (422)."""


def eligible(route: ModelRoute, tier: str | None, req: dict[str, float]) -> set[str]:
    """The tiers that may serve a request naming ``route`` (or its ``tier``).

    Raises:
        NoTier: none meets ``req``: names the closest and its figures.
    """
    tiers = tiers_of(route)
    names = [tier] if tier is not None else sorted(tiers)
    gaps = {t: meets((tiers[t][0].llm or {}), req) for t in names if t in tiers}
    ok = {t for t, gap in gaps.items() if gap == 0.0}
    if ok or not gaps:
        return ok
    near = min(gaps, key=lambda t: (gaps[t], t))
    fig = tiers[near][0].llm or {}
    stated = " and ".join(f"{k}={v:g}" for k, v in req.items())
    raise NoTier(
        f"no tier of '{tier or route.name}' meets {stated}: the closest is '{near}' "
        f"(predicted {fig.get('percentile') or 'p95'} TTFT {_ms(fig.get('ttft_ms'))}, "
        f"quality {fig.get('quality')})"
    )


def _ms(value: Any) -> str:
    return f"{value:.4g} ms" if isinstance(value, int | float) else "unknown"


#: a streamed event's text, not empty (a role or finish event carries none): one piece
_PIECE = re.compile(rb'"(?:content|text)":\s*"(?!")')


class _Exchange:
    """One request's answer on its way back: the tier named in it, tokens counted."""

    def __init__(self, tier: str, asked_usage: bool, served: str | None = None) -> None:
        self.tier = tier
        self.asked_usage = asked_usage  # the client asked for usage itself
        self.usage: dict[str, Any] = {}
        self.pieces = 0
        # an event's model as the engine writes it, and as the client reads it: swapped as
        # bytes (no JSON parsed per token)
        name = json.dumps(served).encode() if served else None
        self._swap = [(b'"model":' + s + name, b'"model":' + s + json.dumps(tier).encode())
                      for s in (b"", b" ")] if name else []  # fmt: skip

    def answer(self, doc: Any) -> Any:
        """A whole answer (or one streamed event's JSON), its tokens noted; None: an event
        only greenctl asked for (usage), not passed on."""
        if not isinstance(doc, dict):
            return doc
        if isinstance(doc.get("usage"), dict):
            self.usage = doc["usage"]
        choices = doc.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict) and (c.get("text") or (c.get("delta") or {}).get("content")):
                    self.pieces += 1
        if "model" in doc:
            doc["model"] = self.tier
        if not self.asked_usage and "usage" in doc:
            if not choices:
                return None
            del doc["usage"]
        return doc

    def event(self, raw: bytes) -> bytes | None:
        """One server-sent event rewritten (None: dropped). An event of tokens without
        ``usage`` has only its model swapped; the others are parsed."""
        if b'"usage"' not in raw:
            for old, new in self._swap:
                if old in raw:
                    self.pieces += len(_PIECE.findall(raw))
                    return raw.replace(old, new)
        lines = raw.split(b"\n")
        out = []
        for line in lines:
            if line.startswith(b"data:") and line[5:].strip() not in (b"", b"[DONE]"):
                try:
                    doc = json.loads(line[5:])
                except ValueError:
                    out.append(line)
                    continue
                doc = self.answer(doc)
                if doc is None:
                    return None
                line = b"data: " + json.dumps(doc, separators=(",", ":")).encode()
            out.append(line)
        return b"\n".join(out)

    def tokens(self) -> tuple[int, int]:
        """(prompt, output) tokens: the engine's usage, else the pieces that came."""
        prompt = self.usage.get("prompt_tokens")
        output = self.usage.get("completion_tokens")
        return (
            int(prompt) if isinstance(prompt, int) else 0,
            int(output) if isinstance(output, int) else self.pieces,
        )


class OpenAIFront(Forwarding, EnergyAccounting):
    """The OpenAI endpoints, and the token, energy and carbon counts of what they served."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: tokens served per (tier, phase): phase ``prefill`` (prompt) or ``decode`` (output)
        self.llm_tokens: collections.Counter[tuple[str, str]] = collections.Counter()

    def add_openai_routes(self, router: hs.Router) -> None:
        router.add_get("/v1/models", self.openai_models)
        router.add_post("/v1/chat/completions", self.openai_infer)
        router.add_post("/v1/completions", self.openai_infer)

    async def openai_models(self, request: Any) -> Any:
        """``GET /v1/models``: the families with LLM tiers, and each tier."""
        names = []
        for name, route in sorted(self.routes.items()):
            tiers = tiers_of(route)
            if tiers:
                names += [name, *sorted(tiers)]
        data = [{"id": n, "object": "model", "created": 0, "owned_by": "greenctl"} for n in names]
        return hs.json_response({"object": "list", "data": data})

    def _llm_route(self, name: Any) -> tuple[ModelRoute | None, str | None]:
        """The route a request's ``model`` names, and the tier when it names one."""
        if not isinstance(name, str):
            return None, None
        route = self.routes.get(name)
        if route is not None and tiers_of(route):
            return route, None
        route = self.variant_routes.get(name)
        if route is not None and name in tiers_of(route):
            return route, name
        return None, None

    async def openai_infer(self, request: Any) -> Any:
        """``POST /v1/chat/completions`` or ``/v1/completions``: to the engine of the tier
        the plan's shares pick among those meeting the request; retried once on another
        instance when the connection fails before an answer."""
        t0 = time.perf_counter()
        try:
            body = json.loads(await request.read())
        except (ValueError, RecursionError):
            return openai_error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return openai_error(400, "the request body must be a JSON object")
        route, tier = self._llm_route(body.get("model"))
        if route is None:
            served = [m["id"] for m in json.loads((await self.openai_models(request)).body)["data"]]
            return openai_error(
                404,
                f"unknown model {body.get('model')!r} (this plan serves: "
                f"{', '.join(served) or 'none'})",
                param="model",
                code="model_not_found",
            )
        try:
            req = requirements(body)
            ok = eligible(route, tier, req)
        except InputError as exc:
            self._count(route.name, "400", t0)
            param = next((k for k in REQUIREMENTS if k in exc.message), None)
            return openai_error(400, exc.message, param=param)
        except NoTier as none:
            self._count(route.name, "422", t0)
            return openai_error(422, str(none), code="no_tier_meets_requirements")
        for key in REQUIREMENTS:
            body.pop(key, None)  # greenctl's, not the engine's
        stream = bool(body.get("stream"))
        asked = bool((body.get("stream_options") or {}).get("include_usage"))
        if stream:
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        exclude = {b.id for b in route.backends if b.llm is None or b.variant not in ok}
        for attempt in (0, 1):
            b = route.pick_wrr(exclude)
            if b is None or b.inflight >= b.slots + route.max_queue:
                self.rejected += 1
                self._count(route.name, "503", t0)
                why = route.down_reason() if b is None else f"'{b.variant}' is at capacity"
                return openai_error(503, why, code="unavailable")
            b.inflight += 1
            llm = b.llm or {}
            body["model"] = llm.get("served_model") or body.get("model")
            try:
                resp = await self.session.post(
                    b.url + request.path,
                    data=json.dumps(body).encode(),
                    headers={"Content-Type": "application/json"},
                    timeout=_timeout(self.timeout_s),
                )
            except Exception as exc:  # refused, reset: no answer came
                route.release(b)
                exclude.add(b.id)
                self._suspect(b)
                if attempt == 0 and any(x.up and x.id not in exclude for x in route.backends):
                    self.retries += 1
                    continue
                self._count(route.name, "502", t0)
                return openai_error(502, f"instance {b.id} of '{route.name}' failed: {exc}")
            ex = _Exchange(str(b.variant), asked or not stream, llm.get("served_model"))
            self._count(route.name, str(resp.status), t0)
            headers = {VARIANT_HEADER: str(b.variant)}
            if stream and resp.status == 200:
                headers["Content-Type"] = resp.headers.get("Content-Type", "text/event-stream")
                headers["Cache-Control"] = "no-cache"
                return hs.StreamResponse(self._relay(route, b, resp, ex), headers=headers)
            try:
                data = await resp.read()
            finally:
                resp.release()
                route.release(b)
            if resp.status == 200:
                with contextlib.suppress(ValueError):
                    data = json.dumps(ex.answer(json.loads(data))).encode()
                self._served(route.name, b, ex)
            headers["Content-Type"] = resp.headers.get("Content-Type", "application/json")
            return hs.Response(status=resp.status, body=data, headers=headers)
        raise AssertionError("unreachable")

    async def _relay(
        self, route: ModelRoute, b: Backend, resp: Any, ex: _Exchange
    ) -> AsyncIterator[bytes]:
        """The engine's events, each rewritten as it comes; counted when it ends."""
        tail = b""
        done = False
        try:
            async for piece in resp.content.iter_any():
                tail += piece.replace(b"\r\n", b"\n")
                outs: list[bytes] = []  # the events of one read go out as one chunk
                while (i := tail.find(b"\n\n")) >= 0:
                    event, tail = tail[:i], tail[i + 2 :]
                    out = ex.event(event)
                    if out is not None:
                        outs += (out, b"\n\n")
                if outs:
                    yield b"".join(outs)
            if tail.strip() and (out := ex.event(tail.rstrip(b"\n"))) is not None:
                yield out + b"\n\n"
            done = True
        finally:
            if done:
                resp.release()
            else:  # the client left (or the engine broke): the engine's answer is dropped
                resp.close()
            route.release(b)
            self._served(route.name, b, ex)

    def _served(self, model: str, b: Backend, ex: _Exchange) -> None:
        """Count an answer's tokens per phase, and their energy and carbon (modeled)."""
        prompt, output = ex.tokens()
        tier = ex.tier
        self.llm_tokens[(tier, "prefill")] += prompt
        self.llm_tokens[(tier, "decode")] += output
        llm = b.llm or {}
        pre, dec = llm.get("prefill_j_per_token"), llm.get("decode_j_per_token")
        if not isinstance(dec, int | float):
            return  # no figure: no energy series (never a silent zero)
        joules = prompt * float(pre or 0.0) + output * float(dec)
        totals = self.energy.totals
        key = (ENERGY_TOTAL, model, MODELED)
        totals[key] = totals.get(key, 0.0) + joules
        if self.carbon is not None:
            grams = carbon_g(joules, self.carbon["carbon_g_per_kwh"], self.carbon.get("pue", 1.0))
            key = (CARBON_TOTAL, model, MODELED)
            totals[key] = totals.get(key, 0.0) + grams


def _timeout(read_s: float) -> Any:
    """No bound on a whole answer (a long generation streams on), ``read_s`` between bytes."""
    import aiohttp

    return aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=read_s)
