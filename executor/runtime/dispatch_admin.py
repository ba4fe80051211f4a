"""The dispatcher's routing table and its administration.

:class:`RoutingTable` holds what every piece of the dispatcher works on: the models it
serves with their instances (:mod:`~greenctl.executor.runtime.dispatch_routes`), the grid
intensity and PUE the running plan was made with, and the settings the pieces share. It is
replaced atomically (in-flight requests finish on their old instances, queued ones move to
the new table) and kept in a file for a dispatcher that replaces this one. The admin
endpoints (``/admin/routes``) answer only loopback clients presenting the token from the
state file; ``greenctl apply`` uses them to switch routing.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.dispatch_routes import (
    RESTART_WAIT_S,
    Backend,
    ModelRoute,
    QueueFull,
)
from greenctl.executor.runtime.metrics import check_carbon
from greenctl.executor.runtime.procs import write_json_atomic


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


class RoutingTable:
    """The routing table, the settings every piece of the dispatcher shares, and the
    ``/admin/routes`` endpoints that replace the table."""

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
        #: the grid intensity and PUE of the running plan (the routing table's ``carbon``)
        self.carbon: dict[str, float] | None = None
        #: the HTTP client of the cold paths (metadata, health checks, energy reads)
        self.session: Any = None
        self.timeout_s = 60.0
        self.closing = False
        #: restarts under way, per instance (a table that drops the instance calls it off)
        self.restart_tasks: dict[Backend, asyncio.Task[None]] = {}
        #: set when the supervision loop should look at once: an instance is suspected, a
        #: watched process exited, or the table changed
        self.recheck = asyncio.Event()

    def stopping(self) -> bool:
        """Whether this dispatcher stops, or its pair is being stopped (``down``): then
        nothing is restarted any more."""
        if self.closing:
            return True
        stop_file = (self.pair or {}).get("stop_file")
        return bool(stop_file) and os.path.exists(str(stop_file))

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
        self.carbon = carbon  # a table without one keeps the intensity in force
        # a variant's own name routes to its instances (a family's name wins a clash)
        self.variant_routes = {}
        for route in new.values():
            for variant in route.variants:
                if variant not in new:
                    self.variant_routes.setdefault(variant, route)
        self.generation = doc.get("generation")
        self.recheck.set()  # watch the new table's processes
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
        """The routing table as a document (``runtime``: with each instance's state)."""
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

    def admin_ok(self, request: Any) -> bool:
        """Whether an admin request comes from loopback with this dispatcher's token."""
        return hs.admin_allowed(request, self.token)

    async def admin_get(self, request: Any) -> Any:
        """``GET /admin/routes``: the routing table with each instance's state."""
        if not self.admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        return hs.json_response(self.routes_doc())

    async def admin_set(self, request: Any) -> Any:
        """``POST /admin/routes``: replace the routing table (400 for a malformed one)."""
        if not self.admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        try:
            doc = await request.json()
            self.set_routes(doc)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not an object
            return hs.json_response({"error": f"bad routing table: {exc}"}, status=400)
        return hs.json_response(self.routes_doc())
