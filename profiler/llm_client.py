"""Black-box timing of an OpenAI-compatible LLM server through streaming requests.

Each request asks ``/v1/completions`` (or ``/v1/chat/completions``) to stream ``max_tokens``
tokens for a prompt of about ``prompt_tokens`` words, and records the time to the first
token (TTFT), the time per output token after it (TPOT: the span from the first token to the
last over the tokens between) and the token counts the server reports (``usage``, asked for
with ``stream_options.include_usage``; else the streamed chunks counted). :func:`measure`
keeps ``concurrency`` requests in flight for a while (a closed loop, as engines' benchmarks
do) and summarises them. Any server that speaks the protocol (vLLM, TGI, Ollama, llama.cpp,
``transformers serve``) can be measured, with nothing known of its engine.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Any

from greenctl.data.errors import HardwareError, InputError
from greenctl.data.llm_profiles import percentiles

#: the word a prompt repeats: one token in every common tokenizer
PROMPT_WORD = "hello"


class Refused(HardwareError):
    """The server refused the request itself (a 4xx status): sending it again cannot help."""


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request: seconds to the first token, per token after it, tokens."""

    ttft_s: float
    tpot_s: float | None  # None: one token or none after the first
    prompt_tokens: int | None  # as the server reports (usage); None: it did not say
    output_tokens: int
    end_s: float  # when the last byte came, seconds from the request's start


@dataclass(frozen=True)
class ConcurrencyResult:
    """What ``concurrency`` requests in flight achieved (times in ms, rates per second)."""

    concurrency: int
    requests: int
    errors: int
    ttft_ms: dict[str, float]
    tpot_ms: dict[str, float]
    output_tokens_per_s: float
    requests_per_s: float
    mean_prompt_tokens: float | None
    mean_output_tokens: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_body(
    model: str,
    prompt_tokens: int,
    output_tokens: int,
    *,
    chat: bool = False,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    """The streaming request: a prompt of ``prompt_tokens`` words, ``output_tokens`` asked
    for; ``ignore_eos`` (vLLM's, refused by strict servers) makes every answer as long."""
    prompt = " ".join([PROMPT_WORD] * prompt_tokens)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": output_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if ignore_eos:
        body["ignore_eos"] = True
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


async def stream_one(session: Any, url: str, body: dict[str, Any]) -> StreamTiming:
    """Send one streaming request and time its server-sent events.

    Raises:
        HardwareError: the server answered with an error status, or streamed no token.
    """
    start = time.perf_counter()
    first: float | None = None
    last = start
    chunks = 0
    usage: dict[str, Any] = {}
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            text = (await resp.text())[:200]
            error = Refused if 400 <= resp.status < 500 else HardwareError
            raise error(f"{url} answered {resp.status}: {text}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            event = json.loads(data)
            usage = event.get("usage") or usage
            if _has_text(event):
                now = time.perf_counter()
                first = now if first is None else first
                last = now
                chunks += 1
    if first is None:
        raise HardwareError(f"{url} streamed no token")
    output = int(usage.get("completion_tokens") or chunks)
    tpot = (last - first) / (output - 1) if output > 1 else None
    prompt = usage.get("prompt_tokens")
    return StreamTiming(first - start, tpot, None if prompt is None else int(prompt), output,
                        time.perf_counter() - start)  # fmt: skip


def _has_text(event: dict[str, Any]) -> bool:
    """Whether a streamed event carries generated text (a completion's or a chat delta's)."""
    for choice in event.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            return True
    return False


async def _closed_loop(url: str, body: dict[str, Any], concurrency: int, duration_s: float,
                       timeout_s: float) -> tuple[list[StreamTiming], int, float]:  # fmt: skip
    """``concurrency`` workers, each sending its next request when its last one ends, until
    ``duration_s`` has passed; the timings, the errors and the wall seconds."""
    import aiohttp

    timings: list[StreamTiming] = []
    errors = 0
    deadline = time.perf_counter() + duration_s
    fatal: list[HardwareError] = []  # a refusal or no server: every worker stops

    async def worker(session: Any) -> None:
        nonlocal errors
        while time.perf_counter() < deadline and not fatal:
            try:
                timings.append(await stream_one(session, url, body))
            except Refused as exc:
                fatal.append(exc)
            except aiohttp.ClientConnectorError as exc:
                fatal.append(HardwareError(f"cannot connect to {url}: {exc.os_error}",
                                           hint="start the server, or check --endpoint"))  # fmt: skip
            except (TimeoutError, HardwareError, aiohttp.ClientError, ValueError):
                errors += 1

    t0 = time.perf_counter()
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    if fatal:
        raise fatal[0]
    return timings, errors, time.perf_counter() - t0


def measure(
    endpoint: str,
    model: str,
    *,
    prompt_tokens: int = 64,
    output_tokens: int = 32,
    concurrency: int = 1,
    duration_s: float = 10.0,
    chat: bool = False,
    ignore_eos: bool = False,
    timeout_s: float = 120.0,
) -> ConcurrencyResult:
    """TTFT, TPOT and throughput of ``endpoint`` with ``concurrency`` streams in flight.

    Raises:
        InputError: an endpoint that is not an http(s) URL.
        HardwareError: no request succeeded (the server is down), or the server refused the
            request (:class:`Refused`: an unknown model, a field it does not take).
    """
    if not endpoint.startswith(("http://", "https://")):
        raise InputError(f"--endpoint {endpoint!r} is not an http(s) URL",
                         hint="for example --endpoint http://127.0.0.1:8000")  # fmt: skip
    path = "/v1/chat/completions" if chat else "/v1/completions"
    url = endpoint.rstrip("/").removesuffix("/v1") + path
    body = request_body(model, prompt_tokens, output_tokens, chat=chat, ignore_eos=ignore_eos)
    timings, errors, wall = asyncio.run(_closed_loop(url, body, concurrency, duration_s, timeout_s))
    if not timings:
        raise HardwareError(f"no request to {url} succeeded ({errors} failed)",
                            hint="check that the server runs and serves this model")  # fmt: skip
    return summarise(timings, errors=errors, concurrency=concurrency, wall_s=wall)


def summarise(
    timings: list[StreamTiming], *, errors: int, concurrency: int, wall_s: float
) -> ConcurrencyResult:
    """The percentiles (:func:`~greenctl.data.llm_profiles.percentiles`, in ms) and rates
    of a set of timed streams."""
    prompts = [t.prompt_tokens for t in timings if t.prompt_tokens is not None]
    tokens = sum(t.output_tokens for t in timings)
    return ConcurrencyResult(
        concurrency=concurrency,
        requests=len(timings),
        errors=errors,
        ttft_ms=percentiles([t.ttft_s for t in timings], scale=1000.0),
        tpot_ms=percentiles([t.tpot_s for t in timings if t.tpot_s is not None], scale=1000.0),
        output_tokens_per_s=tokens / wall_s,
        requests_per_s=len(timings) / wall_s,
        mean_prompt_tokens=sum(prompts) / len(prompts) if prompts else None,
        mean_output_tokens=tokens / len(timings),
    )
