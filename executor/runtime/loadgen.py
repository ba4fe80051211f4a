"""Open-loop load generator for Open Inference Protocol endpoints.

Requests are sent at Poisson arrival times (or at a requests-per-second trace's rate, one
Poisson second at a time) regardless of how fast answers come back (open loop), so a slow
server shows up as latency and errors rather than as a lower offered rate. Latency is measured
from each request's scheduled send time, which avoids coordinated omission.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import ExecutorError, InputError
from greenctl.data.limits import SLO_QUANTILES
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.procs import run_async, settle_heap


@dataclass
class LoadResult:
    """What a load run achieved. Latencies in milliseconds (successful requests only)."""

    endpoint: str
    model: str
    duration_s: float
    offered_rps: float
    sent: int
    ok: int
    errors: int
    rejected_503: int
    achieved_rps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    max_ms: float | None
    #: mean rows of the batches the requests ran in (the executor's ``Greenctl-Batch-Rows``:
    #: how much the dynamic batching gathered); None when the server does not say
    mean_batch_rows: float | None = None
    status_counts: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    #: Per successful request, beside ``latencies_ms``: the executor's own queue and batch run
    #: times from its ``Greenctl-Queue-Ms``/``Greenctl-Infer-Ms`` headers (NaN without them).
    server_queue_ms: list[float] = field(default_factory=list, repr=False)
    server_infer_ms: list[float] = field(default_factory=list, repr=False)
    server_batch_rows: list[float] = field(default_factory=list, repr=False)
    #: How far behind its schedule the client itself ran (ms from a request's scheduled time
    #: until the sender began it; p95 and max): a load generator that cannot keep up adds this
    #: to every latency it measures, so a large lag means the figures measure the client too.
    client_lag_p95_ms: float | None = None
    client_lag_max_ms: float | None = None
    #: Where the time went, over the requests the executors timed (:func:`latency_breakdown`):
    #: ``{"queue_ms" | "run_ms" | "outside_ms": {"p50", "p95", "p99"}, "timed": n}``; None
    #: when no answer carried the executor's timing headers.
    breakdown: dict[str, Any] | None = None

    def to_dict(self, *, with_latencies: bool = False) -> dict[str, Any]:
        doc = asdict(self)
        if not with_latencies:
            for key in ("latencies_ms", "server_queue_ms", "server_infer_ms", "server_batch_rows"):
                doc.pop(key)
        return doc


@dataclass
class RequestOutcome:
    """One request of a load: when it was due and answered (seconds from the start of the
    load), its final status (``200``, ``503``, an exception name) and whether it was sent a
    second time after its connection failed."""

    at_s: float
    done_s: float
    code: str
    retried: bool


def read_trace(path: str | Path) -> list[float]:
    """A requests-per-second trace file, read by the one trace reader
    (:func:`greenctl.data.traces.read_rps_trace`).

    Raises:
        InputError / FileFormatError: a missing or binary file, or a value that is not a
        number >= 0 (naming the line).
    """
    from greenctl.data.traces import read_rps_trace

    return [float(v) for v in read_rps_trace(path)]


def check_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is an ``http://`` or ``https://`` base URL with a host.

    Raises:
        InputError: naming --endpoint and the form it needs.
    """
    hint = "give the server's base URL, for example --endpoint http://127.0.0.1:8000"
    text = str(endpoint).strip()
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # raises ValueError for a port that is not a number 0-65535
    except ValueError as exc:
        raise InputError(f"--endpoint '{endpoint}' is not a valid URL: {exc}", hint=hint) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"--endpoint '{endpoint}' is not an http(s) URL", hint=hint)
    if parts.query or parts.fragment or not text.isprintable() or " " in text:
        raise InputError(
            f"--endpoint '{endpoint}' must be a base URL without spaces, query or fragment",
            hint=hint,
        )
    return text


def check_model_name(model: str) -> str:
    """``model`` if it can be a path segment of the OIP URLs (``/v2/models/NAME``).

    Raises:
        InputError: naming --model.
    """
    if not model or not model.isprintable() or any(c in model for c in "/?#% \\"):
        raise InputError(
            f"--model '{model}' is not a model name",
            hint="use the name the server serves (letters, digits, '.', '_' or '-')",
        )
    return model


def arrival_times(
    *,
    duration_s: float,
    rate_rps: float | None = None,
    trace: list[float] | None = None,
    scale: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Poisson send times (seconds from start) for a fixed rate or a per-second trace."""
    import numpy as np

    rng = random.Random(seed)
    times: list[float] = []
    if trace is not None:
        seconds = min(len(trace), int(np.ceil(duration_s)))
        for s in range(seconds):
            rate = trace[s] * scale
            if rate <= 0:
                continue
            t = float(s)
            end = min(s + 1.0, duration_s)
            while True:
                t += rng.expovariate(rate)
                if t >= end:
                    break
                times.append(t)
        return times
    if rate_rps is None or rate_rps <= 0:
        raise InputError("the load needs --rate > 0 or a --trace")
    t = 0.0
    while True:
        t += rng.expovariate(rate_rps)
        if t >= duration_s:
            return times
        times.append(t)


def model_input(
    endpoint: str, model: str, *, binary: bool = True, timeout_s: float = 5.0
) -> tuple[bytes, dict[str, str]]:
    """A one-row request body for ``model``, shaped from the endpoint's model metadata.

    ``binary`` uses the binary tensor extension (what tritonclient sends by default);
    otherwise tensors travel as JSON numbers.

    Raises:
        InputError: the endpoint does not answer or does not serve ``model``.
    """
    import numpy as np

    url = f"{check_endpoint(endpoint).rstrip('/')}/v2/models/{check_model_name(model)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            meta = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise InputError(f"{url} answered {exc.code}: is '{model}' served there?") from None
    except (urllib.error.URLError, OSError) as exc:
        # nothing answers: a runtime failure (exit 1), as when a served endpoint goes down
        raise ExecutorError(
            f"cannot reach {url}: {getattr(exc, 'reason', exc)}",
            hint="is a dispatcher running there? `greenctl status` shows its URL",
        ) from None
    except ValueError:  # not JSON (or not UTF-8): not an inference server
        meta = None
    try:
        spec = meta["inputs"][0]
        shape = [1 if int(d) < 0 else int(d) for d in spec["shape"]]
        dtype = oip.DTYPES.get(spec["datatype"], "float32")
        if not shape or not all(1 <= d <= 2**24 for d in shape) or math.prod(shape) > 2**28:
            raise ValueError("shape")
    except (KeyError, IndexError, TypeError, ValueError):
        raise InputError(
            f"{url} did not answer with Open Inference Protocol model metadata "
            "(inputs with a name, shape and datatype)",
            hint="point --endpoint at greenctl's dispatcher or executor, or another OIP v2 server",
        ) from None
    arr = np.random.default_rng(0).random(shape).astype(dtype)
    # binary outputs too, as tritonclient asks for them when no output is named
    return oip.encode_request([(spec["name"], arr)], binary=binary, binary_outputs=binary)


def open_session(connections: int = 256, timeout_s: float = 30.0) -> Any:
    """An aiohttp client session with keep-alive connections, as the load generator uses
    (call inside a running event loop; close it when done)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=connections, keepalive_timeout=30)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    )


async def send_load(
    session: Any,
    endpoint: str,
    model: str,
    times: list[float],
    body: bytes,
    headers: dict[str, str],
    *,
    retry_connection_errors: bool = False,
    outcomes: list[RequestOutcome] | None = None,
    lags_ms: list[float] | None = None,
) -> tuple[list[float], list[tuple[float, float, float]], dict[str, int], float]:
    """Send one request at each of ``times`` (seconds from now) over ``session``; returns
    the successful requests' latencies (ms) and what the server said of each (queue ms,
    run ms, batch rows; NaN where it did not), the status counts and the seconds it took.

    ``retry_connection_errors``: a request whose connection failed (refused, reset, closed
    before the answer) is sent once more, on a new connection (the kept-alive ones may be as
    dead as the one that failed), as a client of an idempotent inference service does
    (latency still counts from its first scheduled time). ``outcomes``: each request's
    :class:`RequestOutcome` is appended there. ``lags_ms``: how late (ms) the sender began
    each request after its scheduled time is appended there (the client's own backlog).
    """
    import aiohttp

    fresh: Any = None  # the session retries go through: a new connection each

    url = f"{endpoint.rstrip('/')}/v2/models/{model}/infer"
    latencies: list[float] = []
    server: list[tuple[float, float, float]] = []
    codes: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    # perf_counter, not loop.time(): uvloop's clock is cached per loop pass at 1 ms
    # resolution, which rounded every latency to whole milliseconds (even below zero)
    clock = time.perf_counter
    start = clock() + 0.05

    async def one(at: float) -> None:
        # from the scheduled time (no coordinated omission), or from the actual send
        # when the millisecond timer woke the sender a little early
        now = clock()
        if lags_ms is not None:
            lags_ms.append(max(now - at, 0.0) * 1000.0)
        at = min(at, now)
        retried = False
        timing = (math.nan, math.nan, math.nan)
        nonlocal fresh
        for attempt in (0, 1):
            if attempt and fresh is None:
                fresh = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(force_close=True), timeout=session.timeout
                )
            try:
                async with (fresh if attempt else session).post(
                    url, data=body, headers=headers
                ) as resp:
                    await resp.read()
                    code = str(resp.status)
                    timing = (
                        _header_float(resp.headers, oip.QUEUE_MS_HEADER),
                        _header_float(resp.headers, oip.INFER_MS_HEADER),
                        _header_float(resp.headers, oip.BATCH_ROWS_HEADER),
                    )
            except TimeoutError:
                code = "timeout"
            except aiohttp.ClientConnectionError as exc:
                code = type(exc).__name__
                if retry_connection_errors and attempt == 0:
                    retried = True
                    continue
            except aiohttp.ClientError as exc:
                code = type(exc).__name__
            break
        codes[code] = codes.get(code, 0) + 1
        if code == "200":
            latencies.append((clock() - at) * 1000.0)
            server.append(timing)
        if outcomes is not None:
            outcomes.append(RequestOutcome(at - start, clock() - start, code, retried))

    pending: set[asyncio.Task[None]] = set()  # only those in flight: gathering every task
    for t in times:  # ever sent at the end would stall the last answers by milliseconds
        at = start + t
        delay = at - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        task = loop.create_task(one(at))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    if fresh is not None:
        await fresh.close()
    return latencies, server, codes, clock() - start


async def _run(
    endpoint: str,
    model: str,
    times: list[float],
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    connections: int,
    lags_ms: list[float],
) -> tuple[list[float], list[tuple[float, float, float]], dict[str, int], float]:
    async with open_session(connections, timeout_s) as session:
        return await send_load(session, endpoint, model, times, body, headers, lags_ms=lags_ms)


def _header_float(headers: Any, name: str) -> float:
    try:
        return float(headers.get(name, "nan"))
    except ValueError:
        return math.nan


def latency_breakdown(
    latencies_ms: list[float], server: list[tuple[float, float, float]]
) -> dict[str, Any] | None:
    """Each successful request's latency split in three, as the executor timed it: its wait
    in the executor's batch queue (``Greenctl-Queue-Ms``), its batch's run
    (``Greenctl-Infer-Ms``: copy in, model, copy out) and everything outside the two
    (``outside_ms``: the client, the network hops, the dispatcher and the executor's own
    receive, decode and encode); p50, p95 and p99 of each over the requests whose answer
    carried both headers (``timed``). Percentiles of the parts do not add up to the
    latency's. None when no answer was timed (a server that is not a greenctl executor)."""
    import numpy as np

    rows = [
        (lat, q, r)
        for lat, (q, r, _) in zip(latencies_ms, server, strict=True)
        if math.isfinite(q) and math.isfinite(r)
    ]
    if not rows:
        return None
    arr = np.asarray(rows, dtype=float)
    parts = {
        "queue_ms": arr[:, 1],
        "run_ms": arr[:, 2],
        "outside_ms": np.clip(arr[:, 0] - arr[:, 1] - arr[:, 2], 0.0, None),
    }
    out: dict[str, Any] = {
        name: dict(
            zip(
                SLO_QUANTILES,
                (float(x) for x in np.quantile(v, list(SLO_QUANTILES.values()))),
                strict=True,
            )
        )
        for name, v in parts.items()
    }
    out["timed"] = len(rows)
    return out


def run_load(
    endpoint: str,
    model: str,
    *,
    duration_s: float,
    rate_rps: float | None = None,
    trace: list[float] | None = None,
    scale: float = 1.0,
    seed: int = 0,
    timeout_s: float = 30.0,
    connections: int = 256,
    binary: bool = True,
    gateway: str | None = None,
) -> LoadResult:
    """Send an open-loop load to ``endpoint`` (an OIP server's URL) for ``model``; measure it.

    The load is a Poisson ``rate_rps``, or ``trace`` (requests per second, one value a second)
    times ``scale``, seeded by ``seed`` so runs are comparable, for ``duration_s``.
    ``connections`` caps concurrent keep-alive connections; ``binary`` sends tensors with the
    binary extension (else JSON numbers); ``gateway`` sends every request as that gateway (a
    geo router's ``Greenctl-Gateway``); ``timeout_s`` is per request.

    Raises:
        InputError: bad rate/trace, or the endpoint does not serve the model.
    """
    import numpy as np
    from greenctl.planner.core.loads import check_arrivals

    check_endpoint(endpoint)
    check_model_name(model)
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise InputError(f"--duration must be a number of seconds > 0, got {duration_s}")
    if not (math.isfinite(scale) and scale > 0):
        raise InputError(f"--scale must be a number > 0, got {scale}")
    if rate_rps is not None and not (math.isfinite(rate_rps) and rate_rps > 0):
        raise InputError(f"--rate must be a number of requests per second > 0, got {rate_rps}")
    if trace is not None and not all(math.isfinite(v) and v >= 0 for v in trace):
        raise InputError("a trace holds requests per second: numbers >= 0")
    if trace is not None:
        expected = sum(trace[: math.ceil(duration_s)]) * scale
    else:
        expected = (rate_rps or 0.0) * duration_s
    check_arrivals(expected, "the load", hint="lower --rate (or --scale) or --duration")
    times = arrival_times(
        duration_s=duration_s, rate_rps=rate_rps, trace=trace, scale=scale, seed=seed
    )
    body, headers = model_input(endpoint, model, binary=binary)
    if gateway is not None:
        headers = {**headers, oip.GATEWAY_HEADER: gateway}
    settle_heap()  # a full collection mid-run would stall sending and show up as latency
    lags: list[float] = []
    latencies, server, codes, elapsed = run_async(
        _run(endpoint, model, times, body, headers, timeout_s, connections, lags)
    )
    lat = np.asarray(latencies) if latencies else None
    ok = codes.get("200", 0)
    sent = len(times)
    span = max(duration_s, 1e-9)
    return LoadResult(
        endpoint=endpoint,
        model=model,
        duration_s=round(elapsed, 3),
        offered_rps=round(sent / span, 3),
        sent=sent,
        ok=ok,
        errors=sent - ok - codes.get("503", 0),
        rejected_503=codes.get("503", 0),
        achieved_rps=round(ok / max(elapsed, 1e-9), 3),
        p50_ms=None if lat is None else float(np.percentile(lat, 50)),
        p95_ms=None if lat is None else float(np.percentile(lat, 95)),
        p99_ms=None if lat is None else float(np.percentile(lat, 99)),
        mean_ms=None if lat is None else float(lat.mean()),
        max_ms=None if lat is None else float(lat.max()),
        status_counts=codes,
        latencies_ms=latencies,
        mean_batch_rows=_finite_mean([r for _, _, r in server]),
        server_queue_ms=[q for q, _, _ in server],
        server_infer_ms=[i for _, i, _ in server],
        server_batch_rows=[r for _, _, r in server],
        client_lag_p95_ms=float(np.percentile(lags, 95)) if lags else None,
        client_lag_max_ms=max(lags) if lags else None,
        breakdown=latency_breakdown(latencies, server),
    )


def client_lag_note(lag_p95_ms: float | None, p95_ms: float | None) -> str | None:
    """What a user must know when the load generator fell behind its own schedule: its p95
    lag is over 1 ms and over a tenth of the measured p95, so the measured latencies are
    partly the client's (None otherwise)."""
    if lag_p95_ms is None or p95_ms is None or lag_p95_ms <= max(1.0, 0.1 * p95_ms):
        return None
    return (
        f"the load generator ran {lag_p95_ms:.1f} ms behind its schedule at p95: the measured "
        "latencies include the client's own delay (verify at a lower rate, or load from "
        "another machine with `greenctl loadgen`)"
    )


def _finite_mean(values: list[float]) -> float | None:
    finite = [v for v in values if math.isfinite(v)]
    return round(sum(finite) / len(finite), 3) if finite else None
