"""The dispatcher: one Open Inference Protocol front endpoint per plan, plus the supervisor.

Run as ``python -m greenctl.executor.dispatcher --state-file PATH --routes FILE`` (``greenctl
apply`` starts it detached). It forwards ``/v2/models/{name}/...`` to that model's executor
instances with the plan's policy:

- ``fifo``: a central FIFO queue per model; a request goes to the next instance with a free
  slot (an instance has ``batch + 1`` slots: it can batch, and never idles waiting for the
  next request's round trip) (Clover);
- ``wrr``: smooth weighted round robin by each instance's quota (InfAdapter): the
  simulator's own :class:`~greenctl.planner.policy.SmoothWRR`, skipping instances that are
  down;
- ``batch``: like ``fifo`` but fills the busiest instance's batch first (gpulet's glets).

The queue is bounded: when full the dispatcher answers 503 with ``Retry-After``. A request
whose instance dies mid-flight is retried once on another instance. The supervisor loop, in
this process, restarts crashed executors with the command line they were started with and
records each restart in the store. The admin endpoints (``/admin/routes``) answer only
loopback clients presenting the token from the state file; ``greenctl apply`` uses them to
switch routing atomically.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import hmac
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError
from greenctl.executor import httpserver as hs
from greenctl.executor import oip
from greenctl.executor.metrics import LATENCY_BUCKETS_S, bucket_index, histogram_lines
from greenctl.executor.procs import (
    is_alive,
    proc_start_ticks,
    read_json,
    run_async,
    settle_heap,
    spawn_detached,
    terminate,
    write_json_atomic,
)
from greenctl.executor.upstream import UpstreamError, UpstreamPool
from greenctl.planner.policy import POLICIES, SmoothWRR

TOKEN_HEADER = "X-Greenctl-Token"
_HEADER_LENGTH = "Inference-Header-Content-Length"
_FORWARD_HEADERS = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Content-Encoding",
    "Accept-Encoding",
)


class QueueFull(Exception):
    """The model's bounded queue is full."""


class Backend:
    """One executor instance as the dispatcher sees it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.id: str = spec["id"]
        self.url: str = spec["url"]
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
        self.restart_times: collections.deque[float] = collections.deque(maxlen=5)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "weight": self.weight,
            "slots": self.slots,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "spawn": self.spawn,
            "up": self.up,
            "inflight": self.inflight,
            "restarts": self.restarts,
        }


class ModelRoute:
    """The instances of one model and the policy that picks among them."""

    def __init__(self, name: str, spec: dict[str, Any], *, max_queue: int) -> None:
        self.name = name
        self.policy = spec.get("policy", "fifo")
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}")
        self.max_queue = int(spec.get("max_queue") or max_queue)
        self.backends = [Backend(b) for b in spec.get("instances", [])]
        try:
            self.wrr = SmoothWRR([b.weight for b in self.backends])
        except InputError as exc:  # the admin endpoint answers 400 for a ValueError
            raise ValueError(f"model {name!r}: {exc}") from exc
        self.waiters: collections.deque[asyncio.Future[Backend]] = collections.deque()

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "max_queue": self.max_queue,
            "queued": len(self.waiters),
            "instances": [b.to_dict() for b in self.backends],
        }

    def _free(self, exclude: set[str]) -> list[Backend]:
        return [b for b in self.backends if b.up and b.id not in exclude and b.inflight < b.slots]

    def _pick_wrr(self, exclude: set[str]) -> Backend | None:
        live = {k for k, b in enumerate(self.backends) if b.up and b.id not in exclude}
        k = self.wrr.pick(live)
        return None if k is None else self.backends[k]

    async def acquire(self, exclude: set[str]) -> Backend:
        """A backend for one request (its slot taken); waits in the FIFO queue if needed.

        Raises:
            QueueFull: the bounded queue is full, or no instance is up.
        """
        if self.policy == "wrr":
            if (
                sum(b.inflight for b in self.backends)
                >= sum(b.slots for b in self.backends if b.up) + self.max_queue
            ):
                raise QueueFull
            b = self._pick_wrr(exclude)
            if b is None:
                raise QueueFull
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
        if len(self.waiters) >= self.max_queue or not any(b.up for b in self.backends):
            raise QueueFull
        fut: asyncio.Future[Backend] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            b = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            raise
        if b.id in exclude:  # handed the instance that just failed us: take the next one
            self.release(b)
            return await self.acquire(exclude)
        return b

    def release(self, b: Backend) -> None:
        b.inflight = max(0, b.inflight - 1)
        self.wake()

    def wake(self) -> None:
        """Hand free slots to queued requests, first come first served."""
        if self.policy == "wrr":
            return
        while self.waiters:
            free = self._free(set())
            if not free:
                return
            fut = self.waiters.popleft()
            if fut.done():
                continue
            if self.policy == "batch":
                b = max(free, key=lambda x: (x.inflight, -x.slots))
            else:
                b = min(free, key=lambda x: x.inflight / x.slots)
            b.inflight += 1
            fut.set_result(b)

    def fail_waiters(self) -> None:
        """No instance left: queued requests get 503 instead of waiting forever."""
        if any(b.up for b in self.backends):
            return
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_exception(QueueFull())


class Dispatcher:
    """The dispatcher process: routing table, forwarding, metrics and the supervisor."""

    def __init__(self, *, token: str, db: str | None, max_queue: int, state_dir: Path) -> None:
        self.token = token
        self.db = db
        self.max_queue = max_queue
        self.state_dir = state_dir
        self.routes: dict[str, ModelRoute] = {}
        self.generation: Any = None
        self.session: Any = None
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        self.latency_counts: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = collections.defaultdict(float)
        self.retries = 0
        self.rejected = 0
        self.restarts = 0
        self.children: list[subprocess.Popen[bytes]] = []
        self.restart_tasks: set[asyncio.Task[None]] = set()
        self.timeout_s = 60.0
        self._supervisor: asyncio.Task[None] | None = None

    # -- routing table ------------------------------------------------------------------
    def set_routes(self, doc: dict[str, Any]) -> None:
        """Replace the routing table; in-flight requests finish on their old instances."""
        new = {
            name: ModelRoute(name, spec, max_queue=self.max_queue)
            for name, spec in (doc.get("models") or {}).items()
        }
        old = self.routes
        self.routes = new
        self.generation = doc.get("generation")
        for name, route in old.items():  # move queued requests to the new table
            target = new.get(name)
            while route.waiters:
                fut = route.waiters.popleft()
                if fut.done():
                    continue
                if target is None:
                    fut.set_exception(QueueFull())
                else:
                    target.waiters.append(fut)
        for route in new.values():
            route.wake()
            route.fail_waiters()

    def routes_doc(self) -> dict[str, Any]:
        return {
            "generation": self.generation,
            "models": {name: r.to_dict() for name, r in self.routes.items()},
        }

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

    async def start(self, host: str, port: int) -> tuple[hs.Server, int]:
        """Listen on ``host:port`` and start the supervisor; returns the server and its port.

        Raises:
            OSError: the address cannot be bound (nothing is left running).
        """
        import aiohttp

        server = hs.Server(self.router())
        bound = await server.start(host, port)
        # cold paths only (metadata, health checks); inference uses the lean upstream pools
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30),
            timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            auto_decompress=False,
        )
        self._supervisor = asyncio.get_running_loop().create_task(self.supervise())
        return server, bound

    async def stop(self, server: hs.Server) -> None:
        """Stop serving (in-flight requests finish), the supervisor and pending restarts."""
        await server.shutdown()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        # restarts still waiting for readiness would leave executors nobody knows about
        for task in list(self.restart_tasks):
            task.cancel()
        await asyncio.gather(*self.restart_tasks, return_exceptions=True)
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

    def _route(self, request: Any) -> tuple[ModelRoute | None, Any]:
        name = request.match_info["name"]
        route = self.routes.get(name)
        if route is None:
            known = ", ".join(sorted(self.routes)) or "none"
            return None, hs.json_response(
                {"error": f"unknown model '{name}' (this plan serves: {known})"}, status=404
            )
        return route, None

    async def model_meta(self, request: Any) -> Any:
        route, bad = self._route(request)
        if route is None:
            return bad
        for b in route.backends:
            if not b.up:
                continue
            with contextlib.suppress(Exception):
                async with self.session.get(b.url + request.path) as resp:
                    body = await resp.read()
                    return hs.Response(
                        status=resp.status, body=body, content_type="application/json"
                    )
        return hs.json_response({"error": f"no ready instance of '{route.name}'"}, status=503)

    async def model_ready(self, request: Any) -> Any:
        route, bad = self._route(request)
        if route is None:
            return bad
        ok = any(b.up for b in route.backends)
        return hs.json_response({"name": route.name, "ready": ok}, status=200 if ok else 503)

    async def infer(self, request: Any) -> Any:
        t0 = time.perf_counter()
        route, bad = self._route(request)
        if route is None:
            return bad
        body = await request.read()
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        tried: set[str] = set()
        for attempt in (0, 1):
            try:
                b = await route.acquire(tried)
            except QueueFull:
                self.rejected += 1
                self._count(route.name, "503", t0)
                return hs.json_response(
                    {"error": f"model '{route.name}' is at capacity; retry later"},
                    status=503,
                    headers={"Retry-After": "1"},
                )
            try:
                status, rh, data = await b.pool.post(request.path, body, headers, self.timeout_s)
            except UpstreamError as exc:
                tried.add(b.id)
                self._suspect(b)
                if attempt == 0 and any(x.up and x.id not in tried for x in route.backends):
                    self.retries += 1
                    continue
                self._count(route.name, "502", t0)
                return hs.json_response(
                    {"error": f"instance {b.id} of '{route.name}' failed: {exc}"}, status=502
                )
            finally:
                route.release(b)
            out_headers = {"Content-Type": rh.get("content-type", "application/json")}
            if "inference-header-content-length" in rh:
                out_headers[_HEADER_LENGTH] = rh["inference-header-content-length"]
            for name in oip.TIMING_HEADERS:  # the executor's own timing, passed on
                if (value := rh.get(name.lower())) is not None:
                    out_headers[name] = value
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
        return hs.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def _admin_ok(self, request: Any) -> bool:
        remote = request.remote or ""
        if remote not in ("127.0.0.1", "::1") and not remote.startswith("127."):
            return False
        return hmac.compare_digest(request.headers.get(TOKEN_HEADER, ""), self.token)

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

    # -- supervisor ---------------------------------------------------------------------
    async def supervise(self, interval_s: float = 0.2) -> None:
        """Restart crashed executors; bring suspected-but-alive ones back after a health check."""
        while True:
            await asyncio.sleep(interval_s)
            for child in list(self.children):  # reap executors we restarted
                if child.poll() is not None:
                    self.children.remove(child)
            for route in list(self.routes.values()):
                for b in list(route.backends):
                    if b.restarting:
                        continue
                    if not is_alive(b.pid, b.pid_start):
                        if b.spawn:
                            b.restarting = True
                            b.up = False
                            route.fail_waiters()
                            task = asyncio.get_running_loop().create_task(self._restart(route, b))
                            self.restart_tasks.add(task)
                            task.add_done_callback(self.restart_tasks.discard)
                    elif not b.up and await self._healthy(b.url):
                        b.up = True
                        route.wake()

    async def _healthy(self, url: str) -> bool:
        import aiohttp

        try:
            async with self.session.get(
                url + "/v2/health/ready", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                return resp.status == 200
        except Exception:
            return False

    async def _restart(self, route: ModelRoute, b: Backend) -> None:
        assert b.spawn is not None
        now = time.monotonic()
        if len(b.restart_times) == b.restart_times.maxlen and now - b.restart_times[0] < 60:
            print(f"supervisor: {b.id} crashed 5 times within a minute; not restarting", flush=True)
            return  # stays down (restarting=True keeps the loop off it)
        b.restart_times.append(now)
        old_pid = b.pid
        state_file = Path(b.spawn["state_file"])
        with contextlib.suppress(FileNotFoundError):
            state_file.unlink()
        env = dict(b.spawn.get("env") or {})
        mig = b.spawn.get("mig")
        if mig:  # its MIG instance may have been re-created (new UUID) since it started
            try:
                from greenctl.executor.partition import MigSlot, gpu_backend, mig_uuid

                slot = MigSlot(int(mig["gpu"]), str(mig["profile"]), int(mig["start"]))
                env["CUDA_VISIBLE_DEVICES"] = await asyncio.to_thread(
                    lambda: mig_uuid(gpu_backend(), slot)
                )
            except Exception as exc:
                print(f"supervisor: cannot resolve the MIG instance of {b.id}: {exc}", flush=True)
        try:
            proc = spawn_detached(b.spawn["argv"], env=env, log_file=b.spawn["log_file"])
        except OSError as exc:
            print(f"supervisor: cannot restart {b.id}: {exc}", flush=True)
            b.restarting = False
            return
        self.children.append(proc)
        deadline = time.monotonic() + float(b.spawn.get("ready_timeout_s") or 120)
        doc = None
        try:
            while time.monotonic() < deadline:
                doc = read_json(state_file)
                if doc and (doc.get("ready") or doc.get("error")):
                    break
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:  # the dispatcher is stopping: do not orphan it
            await asyncio.to_thread(terminate, proc.pid)
            proc.poll()
            raise
        if not doc or not doc.get("ready"):
            print(f"supervisor: restart of {b.id} failed: {(doc or {}).get('error')}", flush=True)
            b.pid, b.pid_start = proc.pid, None
            b.restarting = False  # the loop will see it dead and try again (bounded above)
            return
        b.pid, b.pid_start, b.url = doc["pid"], doc.get("pid_start"), doc["url"]
        b.pool.close()
        b.pool = UpstreamPool(b.url)
        b.restarts += 1
        self.restarts += 1
        b.up = True
        b.restarting = False
        route.wake()
        print(f"supervisor: restarted {b.id} (pid {old_pid} -> {b.pid}, {b.url})", flush=True)
        await asyncio.to_thread(self._record_restart, b, old_pid, int(doc["port"]))

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m greenctl.executor.dispatcher", description=__doc__)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    p.add_argument("--state-file", required=True, help="where to write pid/port/token when ready")
    p.add_argument("--routes", default=None, help="JSON file with the initial routing table")
    p.add_argument("--db", default=None, help="greenctl store (records supervisor restarts)")
    p.add_argument("--max-queue", type=int, default=256, help="queued requests per model")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per-request upstream timeout")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    state_file = Path(args.state_file)
    token = secrets.token_hex(16)
    disp = Dispatcher(
        token=token, db=args.db, max_queue=args.max_queue, state_dir=state_file.parent
    )
    disp.timeout_s = args.timeout_s
    if args.routes:
        disp.set_routes(json.loads(Path(args.routes).read_text()))
    settle_heap()
    return int(run_async(_serve(disp, args, state_file)))


async def _serve(disp: Dispatcher, args: argparse.Namespace, state_file: Path) -> int:
    def report(doc: dict[str, Any]) -> None:
        doc.update(pid=os.getpid(), pid_start=proc_start_ticks(os.getpid()))
        write_json_atomic(state_file, doc)

    try:
        server, port = await disp.start(args.host, args.port)
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
