"""The dispatcher: one Open Inference Protocol front endpoint per plan, plus the supervisor.

Run as ``python -m greenctl.executor.runtime.dispatcher --state-file PATH --routes FILE``
(``greenctl apply`` starts it detached). It forwards ``/v2/models/{name}/...`` to the model's
instances with the plan's policy through a bounded queue (503 when full), answers model-less
requests with the preferred variant that meets them, retries once on a dead instance,
restarts crashed executors with back-off and its supervisor, and exports energy and carbon
per model. Admin endpoints (``/admin/routes``) answer only loopback clients with the state
file's token. :class:`Dispatcher` composes the ``dispatch_*`` modules (routes, modelless,
admin, forward, energy, supervision). aiohttp is imported where used: ``apply`` and
``export`` import this module only for its settings. See docs/serving.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from greenctl.executor.deploy.partition import MigSlot, gpu_backend, mig_uuid
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.dispatch_admin import table_carbon
from greenctl.executor.runtime.dispatch_energy import (
    ENERGY_SCRAPE_ENV,
    ENERGY_SCRAPE_S,
    energy_scrape_s,
)
from greenctl.executor.runtime.dispatch_forward import VARIANT_HEADER, busy_response
from greenctl.executor.runtime.dispatch_modelless import NoVariant, name_variant, requirements_of
from greenctl.executor.runtime.dispatch_routes import (
    MAX_QUEUE,
    RESTART_WAIT_S,
    Backend,
    ModelRoute,
    QueueFull,
)
from greenctl.executor.runtime.dispatch_supervision import ExecutorSupervision
from greenctl.executor.runtime.llm_front import OpenAIFront
from greenctl.executor.runtime.metrics import (
    LATENCY_BUCKETS_S,
    histogram_lines,
    llm_token_lines,
    model_energy_lines,
)
from greenctl.executor.runtime.procs import (
    proc_start_ticks,
    read_json,
    run_async,
    settle_heap,
    write_json_atomic,
)

__all__ = [
    "ENERGY_SCRAPE_ENV",
    "ENERGY_SCRAPE_S",
    "MAX_QUEUE",
    "RESTART_WAIT_S",
    "TOKEN_HEADER",
    "VARIANT_HEADER",
    "Backend",
    "Dispatcher",
    "ModelRoute",
    "NoVariant",
    "QueueFull",
    "build_parser",
    "busy_response",
    "energy_scrape_s",
    "main",
    "name_variant",
    "requirements_of",
    "table_carbon",
]

TOKEN_HEADER = hs.TOKEN_HEADER


class Dispatcher(OpenAIFront, ExecutorSupervision):
    """The dispatcher process: routing table, forwarding (OIP and OpenAI's), metrics, energy
    and the supervisor."""

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
        super().__init__(
            token=token,
            db=db,
            max_queue=max_queue,
            state_dir=state_dir,
            restart_wait_s=restart_wait_s,
            routes_state=routes_state,
            pair=pair,
            pair_file=pair_file,
        )
        self._supervisor: asyncio.Task[None] | None = None
        self._energy: asyncio.Task[None] | None = None

    def router(self) -> hs.Router:
        """The OIP endpoints, ``/metrics`` and ``/admin/routes``."""
        router = hs.Router()
        oip.add_protocol_routes(
            router, server_meta=self.server_meta, live=self.live, ready=self.ready,
            model_meta=self.model_meta, model_ready=self.model_ready,
            infer=hs.Direct(self.infer_now),
            metrics=self.metrics_page,
        )  # fmt: skip
        self.add_openai_routes(router)
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

        server = hs.Server(self.router(), shortcut=self.relay)
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

    async def metrics_page(self, request: Any) -> Any:
        """``GET /metrics``: requests, latency, queues, retries, rejections and restarts,
        and the executors' energy and carbon summed per model."""
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
        lines += llm_token_lines(self.llm_tokens)
        return hs.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _healthy(self, url: str) -> bool:
        """Whether an instance answers its readiness check: an LLM engine OpenAI's model
        list, an executor the protocol's ready check."""
        engine = any(b.llm and b.url == url for r in self.routes.values() for b in r.backends)
        if not engine:
            return await super()._healthy(url)
        import aiohttp

        try:
            async with self.session.get(
                url + "/v1/models", timeout=aiohttp.ClientTimeout(total=1.0)
            ) as resp:
                return bool(resp.status == 200)
        except Exception:
            return False

    async def executor_env(self, b: Backend) -> dict[str, str]:
        """The environment ``b``'s executor restarts with: the one it was started with and,
        on a MIG slice, the slice's current UUID (its MIG instance may have been re-created
        since the executor started)."""
        env = await super().executor_env(b)
        mig = (b.spawn or {}).get("mig")
        if mig:
            try:
                slot = MigSlot(int(mig["gpu"]), str(mig["profile"]), int(mig["start"]))
                env["CUDA_VISIBLE_DEVICES"] = await asyncio.to_thread(
                    lambda: mig_uuid(gpu_backend(), slot)
                )
            except Exception as exc:
                print(f"supervisor: cannot resolve the MIG instance of {b.id}: {exc}", flush=True)
        return env


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
    p.add_argument("--max-queue", type=int, default=MAX_QUEUE, help="queued requests per model")
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
