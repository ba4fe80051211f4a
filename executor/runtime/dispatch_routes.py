"""The dispatcher's routing table: the executor instances it forwards to, and per model the
policy (:data:`~greenctl.planner.core.policy.POLICIES`) that picks among them:

- ``fifo``: a central FIFO queue; the next instance with a free slot takes a request (an
  instance has ``batch + 1`` slots, so it never idles waiting for a round trip) (Clover);
- ``wrr``: the simulator's smooth weighted round robin by quota
  (:class:`~greenctl.planner.core.policy.SmoothWRR`), skipping instances down (InfAdapter);
- ``batch``: like ``fifo`` but fills the busiest instance's batch first (gpulet's glets).

Queues are bounded (full: :class:`QueueFull`, 503 with ``Retry-After``). While no instance is
up but one restarts, requests wait ``restart_wait_s`` at most (not at all past a back-off).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections.abc import Set as AbstractSet
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime.procs import is_alive, process_age_s
from greenctl.executor.runtime.upstream import UpstreamPool
from greenctl.planner.core.choice import PREFERENCES, Offer
from greenctl.planner.core.policy import POLICIES, SmoothWRR

#: how long a request may wait for a model none of whose instances is up (default)
RESTART_WAIT_S = 10.0


#: no instance excluded
_NONE: frozenset[str] = frozenset()

#: requests a model's queue holds before new ones are answered 503 (``--max-queue``)
MAX_QUEUE = 256


class QueueFull(Exception):
    """No instance can take the request now: the model's bounded queue is full, or none of
    its instances is up and none comes back soon enough (``reason`` says which)."""

    def __init__(self, reason: str = "", retry_after_s: float = 1.0) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


def offer_of(variant: str | None, doc: dict[str, Any] | None) -> Offer | None:
    """An instance's offer to model-less requests (None: it serves no named variant).

    Raises:
        ValueError: a malformed offer (the admin endpoint answers 400).
    """
    if variant is None or doc is None:
        return None
    return Offer.from_dict(variant, doc)


class Backend:
    """One executor instance as the dispatcher sees it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id: str = spec["id"]
        self.url: str = spec["url"]
        self.variant: str | None = spec.get("variant")
        self.offer_doc: dict[str, Any] | None = spec.get("offer")
        self.offer = offer_of(self.variant, self.offer_doc)
        self.pool = UpstreamPool(self.url)
        self.weight = float(spec.get("weight") or 1.0)
        self.slots = max(1, int(spec.get("slots") or 1))
        self.pid: int | None = spec.get("pid")
        self.pid_start: str | None = spec.get("pid_start")
        self.spawn: dict[str, Any] | None = spec.get("spawn")
        #: an LLM engine's tier figures and model name (:mod:`~greenctl.executor.runtime.llm_front`)
        self.llm: dict[str, Any] | None = spec.get("llm") or (self.spawn or {}).get("llm")
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
        self.llm = spec.get("llm") or (self.spawn or {}).get("llm")
        self.variant = spec.get("variant", self.variant)
        self.offer_doc = spec.get("offer", self.offer_doc)
        self.offer = offer_of(self.variant, self.offer_doc)
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
        if self.llm is not None:
            doc["llm"] = self.llm
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

    def pick_wrr(self, exclude: AbstractSet[str]) -> Backend | None:
        """The next instance by weighted round robin among those up and not in ``exclude``
        (its slot not taken), or None."""
        return self._pick_wrr(exclude)

    def _pick_wrr(self, exclude: AbstractSet[str]) -> Backend | None:
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

    async def acquire(self, exclude: AbstractSet[str]) -> Backend:
        """A backend for one request (its slot taken); waits in the FIFO queue if needed.

        Raises:
            QueueFull: the bounded queue is full, or no instance is up and none comes back
                within ``restart_wait_s``.
        """
        b = self.take(exclude)
        if b is None:
            return await self._wait(exclude)
        return b

    def take(self, exclude: AbstractSet[str] = _NONE) -> Backend | None:
        """A backend for one request now (its slot taken), or None when the request must
        wait in the queue (:meth:`acquire` waits).

        Raises:
            QueueFull: the bounded queue is full, or no instance is up and none will be.
        """
        if self.policy == "wrr":
            held, room, up = 0, self.max_queue, 0
            for x in self.backends:  # (one pass: this runs on every request)
                held += x.inflight
                if x.up:
                    room += x.slots
                    up += 1
            if held >= room:
                raise QueueFull(f"model '{self.name}' is at capacity; retry later")
            if up == len(self.backends) and not exclude:  # the common case: any of them
                k = self.wrr.pick()
                b = None if k is None else self.backends[k]
            else:
                b = self._pick_wrr(exclude)
            if b is None and not self.any_up():  # wait for one to come back
                return None
            if b is None:
                b = self._pick_wrr(_NONE)
            if b is None:
                raise QueueFull(self.down_reason())
            b.inflight += 1
            return b
        if not self.waiters:
            b = self._best_free(exclude)
            if b is not None:
                b.inflight += 1
                return b
        return None

    def _best_free(self, exclude: AbstractSet[str]) -> Backend | None:
        """Of the instances up with a free slot (not in ``exclude``), the one a queued policy
        sends to: the busiest batch first (``batch``), else the least loaded for its slots
        (``fifo``); the first of equals; None when none has a slot. One pass: this runs on
        every request."""
        best, key = None, (0.0, 0.0)
        batch = self.policy == "batch"
        for x in self.backends:
            if x.up and x.inflight < x.slots and x.id not in exclude:
                # the busiest batch first (batch), else the least loaded for its slots
                k = (-x.inflight, x.slots) if batch else (x.inflight / x.slots, 0.0)
                if best is None or k < key:
                    best, key = x, k
        return best

    def queue(self, waiter: Any) -> bool:
        """Queue ``waiter`` (a future, or what answers ``done``, ``set_result`` and
        ``set_exception`` like one) for the next free slot, when an instance is up and the
        queue has room; False otherwise (the request waits the general way,
        :meth:`acquire`)."""
        if len(self.waiters) >= self.max_queue or not self.any_up():
            return False
        self.waiters.append(waiter)
        return True

    async def _wait(self, exclude: AbstractSet[str]) -> Backend:
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
                b = self._pick_wrr(_NONE)
                if b is None:
                    return
            else:
                b = self._best_free(_NONE)
                if b is None:
                    return
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
