"""The dispatcher: one Open Inference Protocol front endpoint per plan, plus the supervisor.

Run as ``python -m greenctl.executor.runtime.dispatcher --state-file PATH --routes FILE`` (``greenctl
apply`` starts it detached). It forwards ``/v2/models/{name}/...`` to that model's executor
instances with the plan's policy:

- ``fifo``: a central FIFO queue per model; a request goes to the next instance with a free
  slot (an instance has ``batch + 1`` slots: it can batch, and never idles waiting for the
  next request's round trip) (Clover);
- ``wrr``: smooth weighted round robin by each instance's quota (InfAdapter): the
  simulator's own :class:`~greenctl.planner.core.policy.SmoothWRR`, skipping instances that are
  down;
- ``batch``: like ``fifo`` but fills the busiest instance's batch first (gpulet's glets).

The queue is bounded: when full the dispatcher answers 503 with ``Retry-After``. A request
whose instance dies mid-flight (connection refused, reset or closed) is retried once: on
another instance of the model, or, when it was the only one, on the same instance once it is
back. While no instance of a model is up but one is being restarted, new requests wait in the
bounded queue for at most ``--restart-wait-s`` (then 503 with ``Retry-After``; at once when
a crash loop's back-off runs past that).

The supervisor loop, in this process, restarts crashed executors with the command line they
were started with (at once, then with a back-off that doubles while it keeps crashing, never
giving up: :func:`~greenctl.executor.runtime.procs.restart_delay`) and records each restart in the
store. Started by :mod:`greenctl.executor.runtime.supervisor` (``--pair``), it serves on the
supervisor's listening socket (``--listen-fd``), keeps its routing table in a file
(``--routes-state``) for the dispatcher that replaces it, and restarts its supervisor when
that dies. The admin endpoints (``/admin/routes``) answer only loopback clients presenting
the token from the state file; ``greenctl apply`` uses them to switch routing atomically.

Energy and carbon (issue 19): every few seconds (``$GREENCTL_ENERGY_SCRAPE_S``, default 2),
off the request path, it reads its executors' ``/metrics`` and exports per model and source
``greenctl_energy_joules_total`` and ``greenctl_carbon_grams_total``, the sums of every
executor process's counter increase (a restarted executor's counter starts from zero again:
counted as Prometheus's ``increase()`` counts a reset), and the grid intensity its routing
table's ``carbon`` says the running plan was made with (``greenctl_grid_intensity_grams_per_
kwh``). It hands that intensity and PUE to each executor process (``POST /admin/carbon``)
that has not been told it, so executors kept by ``replan --apply`` count carbon at the new
plan's intensity without a restart, and restarted ones (started with the old command line)
too. ``GREENCTL_ENERGY_SCRAPE_S=0`` turns the reading off (the Kubernetes export: a Service
spreads the reads over its pods, whose counters Prometheus scrapes and sums itself); the grid
intensity is still exported.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import math
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.metrics import (
    CARBON_TOTAL,
    ENERGY_TOTAL,
    GRID_INTENSITY,
    LATENCY_BUCKETS_S,
    IncreaseSum,
    bucket_index,
    check_carbon,
    histogram_lines,
    label_value,
    model_energy_lines,
    parse_prometheus,
)
from greenctl.executor.runtime.procs import (
    STABLE_S,
    backoff_settings,
    find_processes,
    is_alive,
    proc_start_ticks,
    process_age_s,
    read_json,
    restart_delay,
    run_async,
    settle_heap,
    spawn_detached,
    terminate,
    write_json_atomic,
)
from greenctl.executor.runtime.upstream import UpstreamError, UpstreamPool, UpstreamTimeout
from greenctl.planner.core.choice import (
    PREFERENCES,
    REQUIREMENT_KEYS,
    Offer,
    Requirements,
    check_requirement,
    choose,
    closest,
)
from greenctl.planner.core.policy import POLICIES, SmoothWRR

TOKEN_HEADER = hs.TOKEN_HEADER
_HEADER_LENGTH = "Inference-Header-Content-Length"
_FORWARD_HEADERS = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Content-Encoding",
    "Accept-Encoding",
)


#: how long a request may wait for a model none of whose instances is up (default)
RESTART_WAIT_S = 10.0
#: the response header naming the variant that served a request
VARIANT_HEADER = "Greenctl-Variant"
#: seconds between reads of the executors' energy counters (``$GREENCTL_ENERGY_SCRAPE_S``)
ENERGY_SCRAPE_ENV = "GREENCTL_ENERGY_SCRAPE_S"
ENERGY_SCRAPE_S = 2.0


def energy_scrape_s() -> float:
    """Seconds between reads of the executors' energy counters: ``$GREENCTL_ENERGY_SCRAPE_S``
    when it is a number > 0, 0 when it is 0 (no reads), else :data:`ENERGY_SCRAPE_S`."""
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(ENERGY_SCRAPE_ENV, ""))
        if math.isfinite(value) and value >= 0:
            return value
    return ENERGY_SCRAPE_S


def table_carbon(doc: dict[str, Any]) -> dict[str, float] | None:
    """A routing table's ``carbon`` (``{"carbon_g_per_kwh": G, "pue": P}`` or None), checked.

    Raises:
        ValueError: not an object with an intensity >= 0 and a PUE >= 1 (answered 400).
    """
    carbon = doc.get("carbon")
    if carbon is None:
        return None
    if not isinstance(carbon, dict):
        raise ValueError("'carbon' must be an object {carbon_g_per_kwh, pue} or null")
    try:
        intensity, pue = check_carbon(
            carbon.get("carbon_g_per_kwh"),
            carbon.get("pue", 1.0),
            names=("carbon.carbon_g_per_kwh", "carbon.pue"),
        )
    except InputError as exc:
        raise ValueError(exc.message) from None
    return None if intensity is None else {"carbon_g_per_kwh": intensity, "pue": pue}


class QueueFull(Exception):
    """No instance can take the request now: the model's bounded queue is full, or none of
    its instances is up and none comes back soon enough (``reason`` says which)."""

    def __init__(self, reason: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class NoVariant(Exception):
    """No running variant meets a model-less request: the closest, and what it offers."""

    def __init__(
        self, name: str, req: Requirements, offer: Offer, latency_ms: float | None
    ) -> None:
        self.name, self.req, self.offer, self.latency_ms = name, req, offer, latency_ms
        ms = "unknown" if latency_ms is None else f"{latency_ms:.3g} ms"
        acc = "unknown" if offer.accuracy is None else f"{offer.accuracy:g}"
        path = self.path_ms
        held = "with the requests it holds now" + (
            f" and {path:.3g} ms of measured serving path" if path else ""
        )
        super().__init__(
            f"no running variant of '{name}' meets {req.describe()}: the closest is "
            f"'{offer.variant}', predicted latency {ms} (p95, {held}), accuracy {acc}"
        )

    @property
    def path_ms(self) -> float:
        """How much of the predicted latency is the measured serving path (0: none)."""
        return 0.0 if self.offer.latency is None else self.offer.latency.path_ms

    def doc(self) -> dict[str, Any]:
        """The 422 response's body."""
        return {
            "error": str(self),
            "requirements": {
                k: v
                for k, v in (
                    ("latency_slo_ms", self.req.latency_slo_ms),
                    ("min_accuracy", self.req.min_accuracy),
                )
                if v is not None
            },
            "closest": {
                "variant": self.offer.variant,
                "predicted_latency_ms": self.latency_ms,
                "serving_path_ms": self.path_ms,
                "accuracy": self.offer.accuracy,
                "carbon_g_per_request": self.offer.carbon_g_per_request,
                "energy_j_per_request": self.offer.energy_j_per_request,
            },
        }


#: a request with no requirement (one naming a variant)
_ANY = Requirements()
#: words of a request parameter that greenctl would read: an unknown one is refused (a typo
#: must not pass silently as a request without requirements)
_OURS = ("slo", "latency", "accuracy", "carbon", "energy", "cost", "variant", "greenctl")
_OURS_BYTES = tuple(w.encode() for w in _OURS)
#: above this size a request's JSON is not parsed whole to find its parameters: each
#: parameters object is, read from at most ``_WINDOW`` bytes
_PARSE_LIMIT = 8192
_WINDOW = 2048


def _offer(variant: str | None, doc: dict[str, Any] | None) -> Offer | None:
    if variant is None or doc is None:
        return None
    return Offer.from_dict(variant, doc)  # a ValueError: the admin endpoint answers 400


def requirements_of(body: bytes, header_length: str | None) -> Requirements | None:
    """A request's requirements (``latency_slo_ms``, ``min_accuracy`` in its
    ``parameters``), None when it states none (it routes by its model's policy).

    Only the JSON part is read, and only when it names a greenctl-looking word at all; a
    large JSON body (tensor data inline) is not parsed whole: each ``"parameters"`` object
    in it (of at most 2 KiB) is, and those holding greenctl-looking keys count.

    Raises:
        InputError: a requirement that is not a number in range, or an unknown key that
            looks like greenctl's (names it).
    """
    head = body
    if header_length is not None:
        with contextlib.suppress(ValueError):
            head = body[: int(header_length)]
    params: list[Any] = []
    if len(head) <= _PARSE_LIMIT:
        if b'"parameters"' not in head or not any(w in head for w in _OURS_BYTES):
            return None
        try:
            doc = json.loads(head)
        except (ValueError, RecursionError):
            return None  # the executor answers a malformed request
        params = [doc.get("parameters")] if isinstance(doc, dict) else []
    else:  # one pass over the body, then only the parameters objects
        decoder = json.JSONDecoder()
        at = head.find(b'"parameters"')
        while at >= 0:
            window = head[at + 12 : at + 12 + _WINDOW]
            if any(w in window for w in _OURS_BYTES):
                text = window.decode("utf-8", errors="replace").lstrip()
                with contextlib.suppress(ValueError, RecursionError):
                    params.append(decoder.raw_decode(text.removeprefix(":").lstrip())[0])
            at = head.find(b'"parameters"', at + 12)
    found: dict[str, float] = {}
    for p in params:
        if not isinstance(p, dict):
            continue
        for key, value in p.items():
            low = str(key).lower()
            if key in REQUIREMENT_KEYS:
                found[key] = check_requirement(key, value)
            elif any(w in low for w in _OURS):
                raise InputError(
                    f"unknown request parameter {key!r}: greenctl reads latency_slo_ms "
                    "(ms, > 0) and min_accuracy (a fraction, 0 to 1)"
                    + (
                        "; to pick a variant, name it: POST /v2/models/{variant}/infer"
                        if "variant" in low
                        else ""
                    )
                )
    if not found:
        return None
    return Requirements(found.get("latency_slo_ms"), found.get("min_accuracy"))


def _name_variant(
    data: bytes, head_len: str | None, variant: str, family: str, named: str | None
) -> tuple[bytes, str | None]:
    """An executor's answer with the variant that served it in its ``parameters`` and, for
    a request that named the variant, as its ``model_name`` (the executor answers with its
    family's name). Our executors write no top-level ``parameters``."""
    if not data.startswith(b"{") or data.startswith(b"{}"):
        return data, head_len
    grown = len(data)
    lead = b'{"parameters":{"variant":' + json.dumps(variant).encode() + b"},"
    skip = 1
    prefix = b'{"model_name":' + json.dumps(family).encode()
    if named is not None and data.startswith(prefix):
        lead += b'"model_name":' + json.dumps(named).encode()
        skip = len(prefix)
    data = b"".join((lead, memoryview(data)[skip:]))  # one copy of the (binary) answer
    if head_len is not None:
        with contextlib.suppress(ValueError):
            head_len = str(int(head_len) + len(data) - grown)
    return data, head_len


class Backend:
    """One executor instance as the dispatcher sees it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id: str = spec["id"]
        self.url: str = spec["url"]
        self.variant: str | None = spec.get("variant")
        self.offer_doc: dict[str, Any] | None = spec.get("offer")
        self.offer = _offer(self.variant, self.offer_doc)
        self.pool = UpstreamPool(self.url)
        self.weight = float(spec.get("weight") or 1.0)
        self.slots = max(1, int(spec.get("slots") or 1))
        self.pid: int | None = spec.get("pid")
        self.pid_start: str | None = spec.get("pid_start")
        self.spawn: dict[str, Any] | None = spec.get("spawn")
        self.inflight = 0
        self.up = True
        self.restarting = False
        self.restarts = int(spec.get("restarts") or 0)
        #: deaths in a row, each soon after it became ready: sets the back-off
        self.failures = int(spec.get("failures") or 0)
        #: when it became ready (monotonic); for a process found running, when it started
        self.started_at = time.monotonic() - (process_age_s(self.pid) or 0.0)
        self.retry_at: float | None = None  # monotonic time of the next restart (backing off)
        self.last_error: str | None = None

    def update(self, spec: dict[str, Any]) -> None:
        """Take a new routing table's view of this instance, keeping what the dispatcher
        knows better: a process it restarted (or is restarting) stays the one it routes to."""
        self.weight = float(spec.get("weight") or 1.0)
        self.slots = max(1, int(spec.get("slots") or 1))
        self.spawn = spec.get("spawn")
        self.variant = spec.get("variant", self.variant)
        self.offer_doc = spec.get("offer", self.offer_doc)
        self.offer = _offer(self.variant, self.offer_doc)
        pid = spec.get("pid")
        if pid != self.pid and not self.restarting and is_alive(pid, spec.get("pid_start")):
            self.pid, self.pid_start, self.url = pid, spec.get("pid_start"), spec["url"]
            self.pool.close()
            self.pool = UpstreamPool(self.url)
            self.up = True

    @property
    def recoverable(self) -> bool:
        """Whether the supervisor restarts it when it dies (it knows how it was started)."""
        return self.spawn is not None

    def retry_in_s(self) -> float | None:
        """Seconds until the next restart attempt while backing off, else None."""
        if self.retry_at is None:
            return None
        return max(0.0, self.retry_at - time.monotonic())

    def to_dict(self, *, runtime: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "id": self.id,
            "url": self.url,
            "weight": self.weight,
            "slots": self.slots,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "spawn": self.spawn,
            "restarts": self.restarts,
            "failures": self.failures,
        }
        if self.variant is not None:
            doc["variant"] = self.variant
        if self.offer_doc is not None:
            doc["offer"] = self.offer_doc
        if runtime:
            retry = self.retry_in_s()
            doc.update(
                up=self.up,
                inflight=self.inflight,
                restarting=self.restarting,
                retry_in_s=None if retry is None else round(retry, 3),
                last_error=self.last_error,
            )
        return doc


class ModelRoute:
    """The instances of one model and the policy that picks among them."""

    def __init__(
        self,
        name: str,
        spec: dict[str, Any],
        *,
        max_queue: int,
        restart_wait_s: float = RESTART_WAIT_S,
        known: dict[str, Backend] | None = None,
    ) -> None:
        self.name = name
        self.policy = spec.get("policy", "fifo")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}")
        self.max_queue = int(spec.get("max_queue") or max_queue)
        self.restart_wait_s = restart_wait_s
        self.backends = []
        for b_spec in spec.get("instances", []):
            b = (known or {}).get(b_spec["id"])
            if b is None:
                b = Backend(b_spec)
            else:  # the same instance in a new table: keep what we know of it
                b.update(b_spec)
            self.backends.append(b)
        try:
            self.wrr = SmoothWRR([b.weight for b in self.backends])
        except InputError as exc:  # the admin endpoint answers 400 for a ValueError
            raise ValueError(f"model {name!r}: {exc}") from exc
        # model-less requests: the plan's preference and, in its order, each variant's offer
        # with its instances (per variant too, for requests that name a variant)
        self.prefer: str | None = spec.get("prefer")
        if self.prefer is not None and self.prefer not in PREFERENCES:
            raise ValueError(f"model {name!r}: unknown preference {self.prefer!r}")
        groups: dict[Offer, list[Backend]] = {}
        for b in self.backends:
            if b.variant is not None:
                groups.setdefault(b.offer or Offer(b.variant), []).append(b)
        ranked = sorted(
            groups.items(), key=lambda g: (g[0].rank(self.prefer or "cost"), g[0].variant)
        )
        self.candidates: list[tuple[Offer, list[Backend]]] = ranked
        self.variants: dict[str, list[tuple[Offer, list[Backend]]]] = {}
        for offer, members in ranked:
            self.variants.setdefault(offer.variant, []).append((offer, members))
        self.waiters: collections.deque[asyncio.Future[Backend]] = collections.deque()
        #: waiters that wait for an instance to come back, with their deadline timers
        self.deadlines: dict[asyncio.Future[Backend], asyncio.TimerHandle] = {}
        self.closing = False  # the dispatcher stops: nothing will be restarted

    def to_dict(self, *, runtime: bool = True) -> dict[str, Any]:
        doc: dict[str, Any] = {"policy": self.policy, "max_queue": self.max_queue}
        if self.prefer is not None:
            doc["prefer"] = self.prefer
        if runtime:
            doc["queued"] = len(self.waiters)
        doc["instances"] = [b.to_dict(runtime=runtime) for b in self.backends]
        return doc

    def _free(self, exclude: set[str]) -> list[Backend]:
        return [b for b in self.backends if b.up and b.id not in exclude and b.inflight < b.slots]

    def _pick_wrr(self, exclude: set[str]) -> Backend | None:
        live = {k for k, b in enumerate(self.backends) if b.up and b.id not in exclude}
        k = self.wrr.pick(live)
        return None if k is None else self.backends[k]

    def any_up(self) -> bool:
        return any(b.up for b in self.backends)

    def coming_back(self) -> list[Backend]:
        """Instances that are down but will be restarted (none while the dispatcher stops)."""
        if self.closing:
            return []
        return [b for b in self.backends if not b.up and b.recoverable]

    def eta_s(self) -> float:
        """Seconds until the soonest restart attempt of an instance that is down (0 when
        one is under way)."""
        waits = [b.retry_in_s() or 0.0 for b in self.coming_back()]
        return min(waits) if waits else math.inf

    def down_reason(self) -> str:
        """Why no instance is up, for a 503's message."""
        back = self.coming_back()
        if not back:
            return f"no instance of model '{self.name}' is up"
        looping = [b for b in back if b.failures >= 2]
        if looping and all(b.retry_in_s() for b in back):
            b = min(looping, key=lambda x: x.retry_in_s() or 0.0)
            return (
                f"no instance of model '{self.name}' is up: instance {b.id} is crash-looping "
                f"({b.failures} failures in a row), next restart in {b.retry_in_s() or 0:.0f} s"
            )
        return f"no instance of model '{self.name}' is up: restarting {back[0].id}"

    async def acquire(self, exclude: set[str]) -> Backend:
        """A backend for one request (its slot taken); waits in the FIFO queue if needed.

        Raises:
            QueueFull: the bounded queue is full, or no instance is up and none comes back
                within ``restart_wait_s``.
        """
        if self.policy == "wrr":
            if (
                sum(b.inflight for b in self.backends)
                >= sum(b.slots for b in self.backends if b.up) + self.max_queue
            ):
                raise QueueFull(f"model '{self.name}' is at capacity; retry later")
            b = self._pick_wrr(exclude)
            if b is None and not self.any_up():  # wait for one to come back
                return await self._wait(exclude)
            if b is None:
                b = self._pick_wrr(set())
            if b is None:
                raise QueueFull(self.down_reason())
            b.inflight += 1
            return b
        if not self.waiters:
            free = self._free(exclude)
            if free:
                if self.policy == "batch":
                    b = max(free, key=lambda x: (x.inflight, -x.slots))
                else:
                    b = min(free, key=lambda x: x.inflight / x.slots)
                b.inflight += 1
                return b
        return await self._wait(exclude)

    async def _wait(self, exclude: set[str]) -> Backend:
        if len(self.waiters) >= self.max_queue:
            raise QueueFull(f"model '{self.name}' is at capacity; retry later")
        up = self.any_up()
        if not up:
            if not self.coming_back():
                raise QueueFull(self.down_reason())
            eta = self.eta_s()
            if eta > self.restart_wait_s:  # a crash loop backing off: do not hold the client
                raise QueueFull(self.down_reason(), retry_after_s=eta)
        fut: asyncio.Future[Backend] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        if not up:
            self._set_deadline(fut)
        try:
            b = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise
        finally:
            timer = self.deadlines.pop(fut, None)
            if timer is not None:
                timer.cancel()
        if b.id in exclude and any(x.up and x.id not in exclude for x in self.backends):
            # handed the instance that just failed us while another is up: take that one
            self.release(b)
            return await self.acquire(exclude)
        return b

    def _set_deadline(self, fut: asyncio.Future[Backend]) -> None:
        if fut not in self.deadlines and not fut.done():
            loop = asyncio.get_running_loop()
            self.deadlines[fut] = loop.call_later(self.restart_wait_s, self._expire, fut)

    def _expire(self, fut: asyncio.Future[Backend]) -> None:
        """A request waited ``restart_wait_s`` for an instance to come back: 503."""
        self.deadlines.pop(fut, None)
        if fut.done():
            return
        with contextlib.suppress(ValueError):
            self.waiters.remove(fut)
        eta = self.eta_s()
        fut.set_exception(
            QueueFull(
                f"{self.down_reason()} (waited {self.restart_wait_s:.0f} s)",
                retry_after_s=eta if math.isfinite(eta) else 1.0,
            )
        )

    def release(self, b: Backend) -> None:
        b.inflight = max(0, b.inflight - 1)
        self.wake()

    def wake(self) -> None:
        """Hand free slots to queued requests, first come first served."""
        while self.waiters:
            if self.policy == "wrr":  # waiters only wait for an instance to come back
                b = self._pick_wrr(set())
                if b is None:
                    return
            else:
                free = self._free(set())
                if not free:
                    return
                if self.policy == "batch":
                    b = max(free, key=lambda x: (x.inflight, -x.slots))
                else:
                    b = min(free, key=lambda x: x.inflight / x.slots)
            fut = self.waiters.popleft()
            if fut.done():
                continue
            b.inflight += 1
            fut.set_result(b)

    def fail_waiters(self) -> None:
        """No instance left up: queued requests wait (a bounded time) for one that is being
        restarted, or get 503 at once when none will be (or not soon enough)."""
        if self.any_up() or not self.waiters:
            return
        eta = self.eta_s()
        if self.coming_back() and eta <= self.restart_wait_s:
            for fut in self.waiters:
                self._set_deadline(fut)
            return
        reason = self.down_reason()
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(
                    QueueFull(reason, retry_after_s=eta if math.isfinite(eta) else 1.0)
                )


class Dispatcher:
    """The dispatcher process: routing table, forwarding, metrics and the supervisor."""

    def __init__(
        self,
        *,
        token: str,
        db: str | None,
        max_queue: int,
        state_dir: Path,
        restart_wait_s: float = RESTART_WAIT_S,
        routes_state: Path | None = None,
        pair: dict[str, Any] | None = None,
        pair_file: str | None = None,
    ) -> None:
        self.token = token
        self.db = db
        self.max_queue = max_queue
        self.state_dir = state_dir
        self.restart_wait_s = restart_wait_s
        #: where the routing table is kept for the dispatcher that replaces this one
        self.routes_state = routes_state
        #: the supervisor pair this dispatcher belongs to (None: run alone)
        self.pair = pair
        self.pair_file = pair_file
        self.routes: dict[str, ModelRoute] = {}
        #: variant name -> the route of its family
        self.variant_routes: dict[str, ModelRoute] = {}
        self.generation: Any = None
        self.session: Any = None
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.latency_counts: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = collections.defaultdict(float)
        self.retries = 0
        self.rejected = 0
        self.restarts = 0
        self.children: list[subprocess.Popen[bytes]] = []
        self.restart_tasks: dict[Backend, asyncio.Task[None]] = {}
        self.timeout_s = 60.0
        self.closing = False
        self.listen_fd: int | None = None
        # the supervisor: its process, and how often it died soon after starting
        self.supervisor_pid: int | None = None
        self.supervisor_ticks: str | None = None
        self.supervisor_proc: subprocess.Popen[bytes] | None = None
        self.supervisor_started = time.monotonic()
        self.supervisor_failures = 0
        self.supervisor_retry_at = 0.0
        self.backoff = backoff_settings()
        self._supervisor: asyncio.Task[None] | None = None
        #: the grid intensity and PUE of the running plan (the routing table's ``carbon``)
        self.carbon: dict[str, float] | None = None
        #: executors' energy and carbon counters summed per model (see :meth:`scrape_energy`)
        self.energy = IncreaseSum()
        #: per instance, the process and ``carbon`` it was last told (``/admin/carbon``)
        self.carbon_told: dict[str, tuple[Any, dict[str, float]]] = {}
        self.started_ticks = proc_start_ticks(os.getpid())
        #: whether this dispatcher replaced one (restarted on its predecessor's table): only
        #: then did someone else count the energy its executors reported before it started
        self.succeeds = False
        self.energy_interval_s = energy_scrape_s()
        self._energy: asyncio.Task[None] | None = None

    def stopping(self) -> bool:
        """Whether this dispatcher stops, or its pair is being stopped (``down``): then
        nothing is restarted any more."""
        if self.closing:
            return True
        stop_file = (self.pair or {}).get("stop_file")
        return bool(stop_file) and os.path.exists(str(stop_file))

    # -- routing table ------------------------------------------------------------------
    def set_routes(self, doc: dict[str, Any]) -> None:
        """Replace the routing table; in-flight requests finish on their old instances.

        An instance that stays (same id) keeps its state (a restart under way, its
        back-off); restarts of instances the new table drops are called off.
        """
        known = {b.id: b for r in self.routes.values() for b in r.backends}
        carbon = table_carbon(doc) if "carbon" in doc else self.carbon
        new = {
            name: ModelRoute(
                name,
                spec,
                max_queue=self.max_queue,
                restart_wait_s=self.restart_wait_s,
                known=known,
            )
            for name, spec in (doc.get("models") or {}).items()
        }
        old = self.routes
        self.routes = new
        self.carbon = carbon  # a table without it (an older apply's) keeps the one in force
        # a variant's own name routes to its instances (a family's name wins a clash)
        self.variant_routes = {}
        for route in new.values():
            for variant in route.variants:
                if variant not in new:
                    self.variant_routes.setdefault(variant, route)
        self.generation = doc.get("generation")
        kept = {b for r in new.values() for b in r.backends}
        for b, task in list(self.restart_tasks.items()):
            if b not in kept:
                task.cancel()  # it stops what it started
        for name, route in old.items():  # move queued requests to the new table
            target = new.get(name)
            while route.waiters:
                fut = route.waiters.popleft()
                timer = route.deadlines.pop(fut, None)
                if timer is not None:
                    timer.cancel()
                if fut.done():
                    continue
                if target is None:
                    fut.set_exception(QueueFull(f"model '{name}' is no longer served"))
                else:
                    target.waiters.append(fut)
        for route in new.values():
            route.wake()
            route.fail_waiters()
        self.persist_routes()

    def routes_doc(self, *, runtime: bool = True) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "models": {name: r.to_dict(runtime=runtime) for name, r in self.routes.items()},
            "carbon": self.carbon,
        }

    def persist_routes(self) -> None:
        """Keep the routing table (with the processes restarts started) for a dispatcher
        that replaces this one."""
        if self.routes_state is None:
            return
        try:
            write_json_atomic(self.routes_state, self.routes_doc(runtime=False))
        except OSError as exc:
            print(f"dispatcher: cannot keep the routing table: {exc}", flush=True)

    # -- HTTP -----------------------------------------------------------------------------
    def router(self) -> hs.Router:
        router = hs.Router()
        oip.add_protocol_routes(
            router, server_meta=self.server_meta, live=self.live, ready=self.ready,
            model_meta=self.model_meta, model_ready=self.model_ready, infer=self.infer,
            metrics=self.metrics_page,
        )  # fmt: skip
        router.add_get("/admin/routes", self.admin_get)
        router.add_post("/admin/routes", self.admin_set)
        return router

    async def start(
        self, host: str, port: int, *, sock: socket.socket | None = None
    ) -> tuple[hs.Server, int]:
        """Listen on ``host:port`` (or serve ``sock``, a listening socket handed over by the
        supervisor) and start the supervisor loop; returns the server and its port.

        Raises:
            OSError: the address cannot be bound (nothing is left running).
        """
        import aiohttp

        server = hs.Server(self.router())
        bound = await server.start(host, port, sock=sock)
        # cold paths only (metadata, health checks); inference uses the lean upstream pools
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            auto_decompress=False,
        )
        self._supervisor = asyncio.get_running_loop().create_task(self.supervise())
        self._energy = asyncio.get_running_loop().create_task(self.energy_loop())
        return server, bound

    async def stop(self, server: hs.Server) -> None:
        """Stop serving (in-flight requests finish), the supervisor and pending restarts."""
        self.closing = True
        for route in self.routes.values():
            route.closing = True
        await server.shutdown()
        for task in (self._supervisor, self._energy):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        # restarts still waiting for readiness would leave executors nobody knows about
        for task in list(self.restart_tasks.values()):
            task.cancel()
        await asyncio.gather(*self.restart_tasks.values(), return_exceptions=True)
        if self.session is not None:
            await self.session.close()
        for route in self.routes.values():
            for b in route.backends:
                b.pool.close()

    async def server_meta(self, request: Any) -> Any:
        return hs.json_response(
            {"name": "greenctl-dispatcher", "version": "1", "extensions": ["binary_tensor_data"]}
        )

    async def live(self, request: Any) -> Any:
        return hs.json_response({"live": True})

    async def ready(self, request: Any) -> Any:
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
        if variant is None:
            return route.backends
        return [b for _, group in route.variants.get(variant, ()) for b in group]

    async def model_meta(self, request: Any) -> Any:
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
        route, variant, bad = self._route(request)
        if route is None:
            return bad
        ok = any(b.up for b in self._members(route, variant))
        return hs.json_response(
            {"name": variant or route.name, "ready": ok}, status=200 if ok else 503
        )

    def choose(self, route: ModelRoute, variant: str | None, req: Requirements) -> Backend:
        """The instance a model-less request (or one naming ``variant``) goes to, its slot
        taken: among the variants that meet ``req``, the plan's preferred, and of its
        instances the one predicted fastest (:func:`~greenctl.planner.core.choice.choose`).
        It goes straight to that instance's queue, past the model's central queue.

        Raises:
            NoVariant: no instance that is up meets ``req`` (names the closest).
            QueueFull: none is up, or the chosen one holds ``max_queue`` requests beyond its
                slots.
        """
        cands = route.candidates if variant is None else route.variants.get(variant, [])
        got = choose(cands, req)
        if got is None:
            near = closest(cands, req)
            if near is None:
                if variant is None:
                    raise QueueFull(route.down_reason())
                raise QueueFull(f"no instance of variant '{variant}' is up")
            raise NoVariant(route.name if variant is None else variant, req, *near)
        b = got[1]
        assert isinstance(b, Backend)
        if b.inflight >= b.slots + route.max_queue:
            raise QueueFull(f"variant '{b.variant}' of '{route.name}' is at capacity; retry later")
        b.inflight += 1
        return b

    async def infer(self, request: Any) -> Any:
        t0 = time.perf_counter()
        route, variant, bad = self._route(request)
        if route is None:
            return bad
        body = await request.read()
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        try:
            req = requirements_of(body, headers.get(_HEADER_LENGTH))
        except InputError as exc:
            self._count(route.name, "400", t0)
            return hs.json_response({"error": exc.message}, status=400)
        chosen = req is not None or variant is not None  # model-less, or a variant's name
        tried: set[str] = set()
        failed = ""
        for attempt in (0, 1):
            try:
                if chosen:
                    b = self.choose(route, variant, req or _ANY)
                else:
                    b = await route.acquire(tried)
            except QueueFull as full:
                self.rejected += 1
                self._count(route.name, "503", t0)
                return hs.json_response(
                    {"error": full.reason or f"model '{route.name}' is at capacity; retry later"},
                    status=503,
                    headers={"Retry-After": str(max(1, math.ceil(full.retry_after_s)))},
                )
            except NoVariant as none:
                if attempt:  # the instance chosen first failed, and no other one meets it
                    self._count(route.name, "502", t0)
                    return hs.json_response({"error": f"{failed}; {none}"}, status=502)
                self._count(route.name, "422", t0)
                return hs.json_response(none.doc(), status=422)
            try:
                status, rh, data = await b.pool.post(request.path, body, headers, self.timeout_s)
            except UpstreamError as exc:
                tried.add(b.id)
                self._suspect(b)
                failed = f"instance {b.id} of '{route.name}' failed: {exc}"
                # inference is idempotent: a request whose connection failed (refused, reset,
                # closed) is sent once more, to another instance, or, when there is none, to
                # this one once it is back; one that timed out is not (it may still run)
                if attempt == 0 and not isinstance(exc, UpstreamTimeout):
                    others = [x for x in route.backends if x.up and x.id not in tried]
                    if others or (route.coming_back() and not chosen):
                        if not others:
                            tried.clear()  # wait in the queue for it (or a sibling) to return
                        self.retries += 1
                        continue
                self._count(route.name, "502", t0)
                return hs.json_response({"error": failed}, status=502)
            finally:
                route.release(b)
            out_headers = {"Content-Type": rh.get("content-type", "application/json")}
            head_len = rh.get("inference-header-content-length")
            if chosen and status == 200 and b.variant is not None:
                data, head_len = _name_variant(data, head_len, b.variant, route.name, variant)
            if head_len is not None:
                out_headers[_HEADER_LENGTH] = head_len
            for name in oip.TIMING_HEADERS:  # the executor's own timing, passed on
                if (value := rh.get(name.lower())) is not None:
                    out_headers[name] = value
            if b.variant is not None:
                out_headers[VARIANT_HEADER] = b.variant
            self._count(route.name, str(status), t0)
            return hs.Response(status=status, body=data, headers=out_headers)
        raise AssertionError("unreachable")

    def _count(self, model: str, code: str, t0: float) -> None:
        self.requests[(model, code)] += 1
        if code == "200":
            counts = self.latency_counts.setdefault(model, [0] * (len(LATENCY_BUCKETS_S) + 1))
            dt = time.perf_counter() - t0
            counts[bucket_index(LATENCY_BUCKETS_S, dt)] += 1
            self.latency_sum[model] += dt

    def _suspect(self, b: Backend) -> None:
        """A connection to ``b`` failed: stop routing to it until the supervisor checks it."""
        b.up = False
        for route in self.routes.values():
            if b in route.backends:
                route.fail_waiters()

    async def metrics_page(self, request: Any) -> Any:
        lines = [
            "# HELP greenctl_dispatcher_requests_total Requests by model and status code.",
            "# TYPE greenctl_dispatcher_requests_total counter",
        ]
        for (model, code), n in sorted(self.requests.items()):
            lines.append(f'greenctl_dispatcher_requests_total{{model="{model}",code="{code}"}} {n}')
        for model, counts in sorted(self.latency_counts.items()):
            lines += histogram_lines(
                "greenctl_dispatcher_latency_seconds",
                "End-to-end latency through the dispatcher.",
                f'model="{model}"',
                LATENCY_BUCKETS_S,
                counts,
                self.latency_sum[model],
            )
        lines += [
            "# TYPE greenctl_dispatcher_queue_length gauge",
            *[
                f'greenctl_dispatcher_queue_length{{model="{m}"}} {len(r.waiters)}'
                for m, r in self.routes.items()
            ],
            "# TYPE greenctl_dispatcher_retries_total counter",
            f"greenctl_dispatcher_retries_total {self.retries}",
            "# TYPE greenctl_dispatcher_rejected_total counter",
            f"greenctl_dispatcher_rejected_total {self.rejected}",
            "# TYPE greenctl_dispatcher_restarts_total counter",
            f"greenctl_dispatcher_restarts_total {self.restarts}",
        ]
        intensity = None if self.carbon is None else self.carbon["carbon_g_per_kwh"]
        lines += model_energy_lines(self.energy.totals, intensity)
        return hs.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _admin_ok(self, request: Any) -> bool:
        return hs.admin_allowed(request, self.token)

    async def admin_get(self, request: Any) -> Any:
        if not self._admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        return hs.json_response(self.routes_doc())

    async def admin_set(self, request: Any) -> Any:
        if not self._admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        try:
            doc = await request.json()
            self.set_routes(doc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not an object
            return hs.json_response({"error": f"bad routing table: {exc}"}, status=400)
        return hs.json_response(self.routes_doc())

    # -- energy and carbon --------------------------------------------------------------
    async def energy_loop(self) -> None:
        """Read the executors' energy counters every :attr:`energy_interval_s` seconds (0:
        never)."""
        while self.energy_interval_s > 0:
            await asyncio.sleep(self.energy_interval_s)
            try:
                await self.scrape_energy()
            except Exception as exc:  # a bad round must not end the loop
                print(f"dispatcher: reading executors' energy failed: {exc!r}", flush=True)

    @staticmethod
    def _process(b: Backend) -> tuple[Any, ...]:
        """What tells one process of an instance from the next (a restart changes it)."""
        return (b.pid, b.pid_start, b.url)

    def _predates(self, b: Backend) -> bool:
        """Whether ``b``'s process started before this dispatcher replaced another: the
        dispatcher it replaced counted that process's energy until now. A first dispatcher
        counts its executors from zero (their counters predate it, but nobody summed them)."""
        if not self.succeeds:
            return False
        ticks = b.pid_start or (proc_start_ticks(b.pid) if b.pid else None)
        try:
            return int(ticks or "") < int(self.started_ticks or "")
        except ValueError:
            return False

    async def scrape_energy(self) -> None:
        """One round: each instance's energy and carbon counters added (by increase) to its
        model's totals, and each process that exports energy told the plan's ``carbon``."""
        import aiohttp

        if self.session is None:
            return
        # each process as it was when read (a restart may replace it while we wait)
        members = [
            (route.name, b, self._process(b))
            for route in self.routes.values()
            for b in route.backends
            if b.up and not b.restarting
        ]
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.energy_interval_s))

        async def get(b: Backend) -> str | None:
            try:
                async with self.session.get(b.url + "/metrics", timeout=timeout) as resp:
                    return (await resp.text()) if resp.status == 200 else None
            except Exception:
                return None

        texts = await asyncio.gather(*(get(b) for _, b, _ in members))
        tell = []
        for (model, b, proc), text in zip(members, texts, strict=True):
            if not text or proc != self._process(b):
                continue
            baseline = self._predates(b)
            counts_energy = False
            intensity = None
            for key, value in parse_prometheus(text).items():
                name = key.partition("{")[0]
                if name == GRID_INTENSITY:
                    intensity = value
                if name not in (ENERGY_TOTAL, CARBON_TOTAL):
                    continue
                counts_energy = True
                source = label_value(key, "source") or "unknown"
                self.energy.observe(
                    (b.id, proc, key), value, (name, model, source), baseline=baseline
                )
            carbon = self.carbon
            told = self.carbon_told.get(b.id) == (proc, carbon)
            if carbon is not None and intensity != carbon["carbon_g_per_kwh"]:
                told = False  # a process started with an older command line, or told by hand
            if counts_energy and carbon is not None and not told:
                tell.append((b, proc, carbon))
        current = {(b.id, self._process(b)) for r in self.routes.values() for b in r.backends}
        self.energy.keep(lambda series: isinstance(series, tuple) and series[:2] in current)
        if tell:
            await asyncio.gather(*(self._tell_carbon(b, proc, c) for b, proc, c in tell))

    async def _tell_carbon(self, b: Backend, proc: Any, carbon: dict[str, float]) -> None:
        """Hand an executor process the grid intensity and PUE to count carbon with."""
        import aiohttp

        try:
            async with self.session.post(
                b.url + "/admin/carbon",
                json=carbon,
                timeout=aiohttp.ClientTimeout(total=max(1.0, self.energy_interval_s)),
            ) as resp:
                # 404/405: an executor from before this endpoint; 409: it counts no energy
                if resp.status in (200, 404, 405, 409):
                    self.carbon_told[b.id] = (proc, carbon)
        except Exception:
            pass  # told in the next round

    # -- supervisor ---------------------------------------------------------------------
    async def supervise(self, interval_s: float = 0.1) -> None:
        """Restart crashed executors (backing off while they keep crashing), bring
        suspected-but-alive ones back after a health check, and restart the supervisor of
        this dispatcher's pair when it dies."""
        while True:
            await asyncio.sleep(interval_s)
            for child in list(self.children):  # reap executors we restarted
                if child.poll() is not None:
                    self.children.remove(child)
            if self.stopping():
                continue
            if self.pair is not None:
                await self._watch_supervisor()
            for route in list(self.routes.values()):
                for b in list(route.backends):
                    if b.restarting:
                        continue
                    if not is_alive(b.pid, b.pid_start):
                        if b.recoverable:
                            self._schedule_restart(route, b)
                    elif not b.up and await self._healthy(b.url):
                        b.up = True
                        route.wake()
                    elif b.failures and time.monotonic() - b.started_at >= STABLE_S:
                        b.failures = 0  # up a while: the crash loop is over

    def _schedule_restart(self, route: ModelRoute, b: Backend) -> None:
        now = time.monotonic()
        if now - b.started_at >= STABLE_S:
            b.failures = 0  # it ran a while: not a crash loop
        base, cap = self.backoff
        delay = restart_delay(b.failures, base=base, cap=cap)
        b.failures += 1
        b.up = False
        b.restarting = True
        b.retry_at = now + delay if delay else None
        if delay:
            print(
                f"supervisor: {b.id} failed {b.failures} times in a row; "
                f"restarting it in {delay:.1f} s",
                flush=True,
            )
        route.fail_waiters()
        task = asyncio.get_running_loop().create_task(self._restart(route, b, delay))
        self.restart_tasks[b] = task

        def forget(_: asyncio.Task[None]) -> None:
            if self.restart_tasks.get(b) is task:
                del self.restart_tasks[b]

        task.add_done_callback(forget)

    async def _healthy(self, url: str) -> bool:
        import aiohttp

        try:
            async with self.session.get(
                url + "/v2/health/ready", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                return resp.status == 200
        except Exception:
            return False

    async def _restart(self, route: ModelRoute, b: Backend, delay: float = 0.0) -> None:
        assert b.spawn is not None
        if delay:
            await asyncio.sleep(delay)
        b.retry_at = None
        if self.stopping():
            return  # stays down (restarting=True keeps the loop off it)
        old_pid = b.pid
        state_file = Path(b.spawn["state_file"])
        # a restart a killed dispatcher left under way: adopt that process, do not start a
        # second one on the same cores
        found = [
            p for p in await asyncio.to_thread(find_processes, str(state_file)) if p[0] != old_pid
        ]
        proc: subprocess.Popen[bytes] | None = None
        if found:
            pid, ticks = found[0]
            print(f"supervisor: adopting {b.id}'s restart under way (pid {pid})", flush=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                state_file.unlink()
            env = dict(b.spawn.get("env") or {})
            mig = b.spawn.get("mig")
            if mig:  # its MIG instance may have been re-created (new UUID) since it started
                try:
                    from greenctl.executor.deploy.partition import MigSlot, gpu_backend, mig_uuid

                    slot = MigSlot(int(mig["gpu"]), str(mig["profile"]), int(mig["start"]))
                    env["CUDA_VISIBLE_DEVICES"] = await asyncio.to_thread(
                        lambda: mig_uuid(gpu_backend(), slot)
                    )
                except Exception as exc:
                    print(
                        f"supervisor: cannot resolve the MIG instance of {b.id}: {exc}", flush=True
                    )
            try:
                proc = spawn_detached(b.spawn["argv"], env=env, log_file=b.spawn["log_file"])
            except OSError as exc:
                print(f"supervisor: cannot restart {b.id}: {exc}", flush=True)
                b.last_error = str(exc)
                b.started_at = time.monotonic()
                b.restarting = False
                return
            self.children.append(proc)
            pid, ticks = proc.pid, proc_start_ticks(proc.pid)
        # recorded before it is ready: whoever stops this plan finds it
        b.pid, b.pid_start, b.started_at = pid, ticks, time.monotonic()
        self.persist_routes()
        deadline = time.monotonic() + float(b.spawn.get("ready_timeout_s") or 120)
        doc = None
        try:
            await asyncio.to_thread(self._record_process, b)
            while time.monotonic() < deadline and not self.stopping():
                doc = read_json(state_file)
                if doc and doc.get("pid") == pid and (doc.get("ready") or doc.get("error")):
                    break
                if not is_alive(pid, ticks):
                    break
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:  # stopping, or its route was dropped: do not orphan it
            await asyncio.to_thread(terminate, pid, ticks)
            if proc is not None:
                proc.poll()
            raise
        if not doc or not doc.get("ready") or doc.get("pid") != pid:
            b.last_error = (doc or {}).get("error") or "exited before it was ready"
            print(f"supervisor: restart of {b.id} failed: {b.last_error}", flush=True)
            if is_alive(pid, ticks):  # not ready in time: stop it, the loop tries again
                await asyncio.to_thread(terminate, pid, ticks)
            b.restarting = False  # the loop sees it dead and tries again, backing off
            return
        b.url = doc["url"]
        b.pool.close()
        b.pool = UpstreamPool(b.url)
        b.started_at = time.monotonic()  # its time up counts from here
        b.restarts += 1
        b.last_error = None
        self.restarts += 1
        b.up = True
        b.restarting = False
        route.wake()
        self.persist_routes()
        print(f"supervisor: restarted {b.id} (pid {old_pid} -> {b.pid}, {b.url})", flush=True)
        await asyncio.to_thread(self._record_restart, b, old_pid, int(doc["port"]))

    def _record_process(self, b: Backend) -> None:
        if not self.db:
            return
        from greenctl.data import deployments
        from greenctl.data.store import open_store

        try:
            with open_store(self.db) as store, store.transaction():
                deployments.set_instance_process(store, b.id, pid=b.pid, pid_start=b.pid_start)
        except Exception as exc:  # the store is a record, not a dependency of serving
            print(f"supervisor: could not record the new process of {b.id}: {exc}", flush=True)

    def _record_restart(self, b: Backend, old_pid: int | None, port: int) -> None:
        if not self.db:
            return
        from greenctl.data import deployments
        from greenctl.data.store import open_store

        try:
            with open_store(self.db) as store, store.transaction():
                deployments.record_restart(
                    store,
                    b.id,
                    old_pid=old_pid,
                    new_pid=b.pid,
                    pid_start=b.pid_start,
                    port=port,
                    restarts=b.restarts,
                )
        except Exception as exc:  # the store is a record, not a dependency of serving
            print(f"supervisor: could not record the restart of {b.id}: {exc}", flush=True)

    # -- the pair's supervisor -----------------------------------------------------------
    async def _watch_supervisor(self) -> None:
        """Start a new supervisor when this dispatcher's dies (it adopts this process)."""
        if self.supervisor_proc is not None and self.supervisor_proc.poll() is not None:
            self.supervisor_proc = None  # reaped
        if is_alive(self.supervisor_pid, self.supervisor_ticks):
            return
        now = time.monotonic()
        if now < self.supervisor_retry_at:
            return
        if now - self.supervisor_started >= STABLE_S:
            self.supervisor_failures = 0
        base, cap = self.backoff
        self.supervisor_failures += 1
        self.supervisor_retry_at = now + restart_delay(self.supervisor_failures, base=base, cap=cap)
        assert self.pair is not None and self.pair_file is not None and self.db
        from greenctl.executor.runtime.supervisor import supervisor_argv

        me = os.getpid()
        extra = ["--adopt-pid", str(me), "--adopt-ticks", str(proc_start_ticks(me) or "")]
        fds: tuple[int, ...] = ()
        if self.listen_fd is not None:
            extra += ["--listen-fd", str(self.listen_fd)]
            fds = (self.listen_fd,)
        try:
            proc = spawn_detached(
                supervisor_argv(self.pair_file, self.db, *extra),
                env={"GREENCTL_DB": self.db},
                log_file=self.pair["supervisor_log_file"],
                pass_fds=fds,
            )
        except OSError as exc:
            print(f"dispatcher: cannot start a supervisor: {exc}", flush=True)
            return
        old = self.supervisor_pid
        self.supervisor_proc = proc
        self.supervisor_pid, self.supervisor_ticks = proc.pid, proc_start_ticks(proc.pid)
        self.supervisor_started = now
        print(f"dispatcher: supervisor pid {old} is gone; started pid {proc.pid}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m greenctl.executor.runtime.dispatcher", description=__doc__
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    p.add_argument("--state-file", required=True, help="where to write pid/port/token when ready")
    p.add_argument("--routes", default=None, help="JSON file with the initial routing table")
    p.add_argument(
        "--routes-state",
        default=None,
        help="file keeping the routing table: read at start when it exists, rewritten on "
        "every change (a dispatcher that replaces this one starts from it)",
    )
    p.add_argument("--db", default=None, help="greenctl store (records supervisor restarts)")
    p.add_argument("--max-queue", type=int, default=256, help="queued requests per model")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per-request upstream timeout")
    p.add_argument(
        "--restart-wait-s",
        type=float,
        default=RESTART_WAIT_S,
        help="longest wait of a request for a model none of whose instances is up",
    )
    p.add_argument(
        "--listen-fd", type=int, default=None, help="serve this inherited listening socket"
    )
    p.add_argument("--pair", default=None, help="the supervisor pair's file (supervised mode)")
    p.add_argument("--supervisor-pid", type=int, default=None, help="the pair's supervisor")
    p.add_argument("--supervisor-ticks", default=None, help="its start time (ticks since boot)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_file = Path(args.state_file)
    pair = read_json(args.pair) if args.pair else None
    token = str((pair or {}).get("token") or secrets.token_hex(16))
    disp = Dispatcher(
        token=token,
        db=args.db,
        max_queue=args.max_queue,
        state_dir=state_file.parent,
        restart_wait_s=args.restart_wait_s,
        routes_state=Path(args.routes_state) if args.routes_state else None,
        pair=pair,
        pair_file=args.pair if pair is not None else None,
    )
    disp.timeout_s = args.timeout_s
    disp.supervisor_pid = args.supervisor_pid
    disp.supervisor_ticks = args.supervisor_ticks or None
    kept = read_json(args.routes_state) if args.routes_state else None
    if kept is not None:  # a dispatcher restarted: the table its predecessor served
        disp.succeeds = True
        disp.set_routes(kept)
    elif args.routes:
        disp.set_routes(json.loads(Path(args.routes).read_text()))
    settle_heap()
    return int(run_async(_serve(disp, args, state_file)))


async def _serve(disp: Dispatcher, args: argparse.Namespace, state_file: Path) -> int:
    def report(doc: dict[str, Any]) -> None:
        doc.update(pid=os.getpid(), pid_start=proc_start_ticks(os.getpid()))
        write_json_atomic(state_file, doc)

    sock = None
    if args.listen_fd is not None:
        # a duplicate: the inherited descriptor stays open to hand to a new supervisor
        disp.listen_fd = args.listen_fd
        sock = socket.socket(fileno=os.dup(args.listen_fd))
    try:
        server, port = await disp.start(args.host, args.port, sock=sock)
    except OSError as exc:
        report({"error": f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}"})
        return 4
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    report(
        {
            "ready": True,
            "host": args.host,
            "port": port,
            "url": f"http://{args.host}:{port}",
            "token": disp.token,
        }
    )
    print(f"dispatcher ready at {args.host}:{port}", flush=True)
    await stop.wait()
    await disp.stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
