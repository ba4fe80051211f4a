"""The geo router daemon and the supervisor that keeps one serving on its socket.

:class:`GeoRouter` is an Open Inference Protocol front that forwards each request to a site:
its gateway (``Greenctl-Gateway`` header, else ``--gateway``), the plan slot the clock (or
``--at``) is in, and that slot's fractions through
:class:`~greenctl.planner.core.policy.SmoothWRR`, the project's one weighted round robin.
Sites failing health checks are drained until two checks pass; a failed connection is
retried once on another site, a timeout is not. :func:`supervise` hands the same socket to
each new router, with the dispatcher's back-off. Both run as ``python -m
greenctl.executor.deploy.georouter``; nothing prints but the daemons' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import math
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from greenctl.data.carbon_io import parse_time
from greenctl.executor.deploy.georouter_table import gateway_fractions, slot_index
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.procs import (
    STABLE_S,
    backoff_settings,
    proc_start_ticks,
    python_module_argv,
    read_json,
    restart_delay,
    run_async,
    settle_heap,
    write_json_atomic,
)
from greenctl.executor.runtime.upstream import UpstreamError, UpstreamPool, UpstreamTimeout
from greenctl.planner.core.policy import SmoothWRR

DESCRIPTION = "The greenctl geo router (or, with --supervise, its supervisor)."
GATEWAY_HEADER = oip.GATEWAY_HEADER
SITE_HEADER = "Greenctl-Site"
TOKEN_HEADER = hs.TOKEN_HEADER
_FORWARD_HEADERS = (
    "Content-Type",
    "Inference-Header-Content-Length",
    "Content-Encoding",
    "Accept-Encoding",
)
_HEADER_LENGTH = "Inference-Header-Content-Length"
#: checks in a row that drain a site / bring it back
FAILS_TO_DRAIN = 2
PASSES_TO_RECOVER = 2
HEALTH_INTERVAL_S = 0.5


class Site:
    """One site's endpoint as the router sees it."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url
        self.pool = UpstreamPool(url)
        self.healthy = True
        self.fails = 0
        self.passes = 0
        self.drained_at: float | None = None  # wall clock
        self.drains = 0
        self.last_error: str | None = None

    def drain(self, why: str) -> None:
        if self.healthy:
            self.healthy = False
            self.drained_at = time.time()
            self.drains += 1
            self.passes = 0
            self.pool.close()
            print(f"georouter: site {self.name} drained: {why}", flush=True)
        self.last_error = why

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "drained_at": self.drained_at,
            "drains": self.drains,
            "last_error": self.last_error,
        }


class GeoRouter:
    """The router's state: sites, table, slot, one WRR per (slot, gateway), counters."""

    def __init__(
        self,
        *,
        table: dict[str, Any],
        sites: dict[str, str],
        gateway: str | None = None,
        at: str | None = None,
        token: str = "",
        state_dir: Path | None = None,
        timeout_s: float = 60.0,
        health_interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.sites = {name: Site(name, url) for name, url in sites.items()}
        self.default_gateway = gateway
        self.token = token
        self.state_dir = state_dir
        self.timeout_s = timeout_s
        self.health_interval_s = health_interval_s
        self.table: dict[str, Any] = {}
        self.at: datetime | None = None
        self.wrr: dict[tuple[int, str], tuple[list[str], list[float], SmoothWRR]] = {}
        self.served: collections.Counter[tuple[str, str]] = collections.Counter()
        #: per (gateway, site): the sum of its planned fraction over the requests routed
        self.planned: collections.defaultdict[tuple[str, str], float] = collections.defaultdict(
            float
        )
        self.failed: collections.Counter[str] = collections.Counter()
        self.retries = 0
        self.started = time.time()
        self.set_table(table, at)

    # table and slot
    def set_table(self, table: dict[str, Any], at: str | None = None) -> None:
        """Take a new table (and slot time; None: follow the clock) without a restart."""
        for key in ("start", "step_h", "slots", "overall", "gateways", "allowed"):
            if key not in table:
                raise KeyError(key)
        when = parse_time(at) if at else None
        self.table, self.at, self.wrr = table, when, {}
        if self.state_dir is not None:
            write_json_atomic(
                self.state_dir / "table.json", {"table": table, "at": at, "updated": time.time()}
            )

    def now(self) -> datetime:
        return self.at or datetime.now(UTC)

    def slot(self) -> tuple[int, bool]:
        return slot_index(self.table, self.now())

    def _wrr(self, slot: int, gateway: str) -> tuple[list[str], list[float], SmoothWRR] | None:
        key = (slot, gateway)
        got = self.wrr.get(key)
        if got is None:
            fr = gateway_fractions(self.table, slot, gateway)
            names = [s for s in sorted(fr) if fr[s] > 0 and s in self.sites]
            if not names:
                return None
            weights = [fr[s] for s in names]
            got = self.wrr[key] = (names, weights, SmoothWRR(weights))
        return got

    def pick(self, gateway: str, tried: set[str]) -> tuple[str | None, int]:
        """The site for the next request of ``gateway`` (None: no healthy site) and the slot."""
        slot, _ = self.slot()
        got = self._wrr(slot, gateway)
        if got is not None:
            names, weights, wrr = got
            if not tried:  # a retry is the same request: planned once
                total = math.fsum(weights)
                for s, w in zip(names, weights, strict=True):
                    self.planned[(gateway, s)] += w / total
            among = {i for i, s in enumerate(names) if self.sites[s].healthy and s not in tried}
            i = wrr.pick(among) if among else None
            if i is not None:
                return names[i], slot
        # none of its fractioned sites can: the gateway's other allowed sites, evenly
        spare = [
            s
            for s in self.table["allowed"].get(gateway, [])
            if s in self.sites and self.sites[s].healthy and s not in tried
        ]
        if not spare:
            return None, slot
        key = (-1 - slot, gateway)
        if key not in self.wrr:
            names = list(self.table["allowed"].get(gateway, []))
            self.wrr[key] = (names, [1.0] * len(names), SmoothWRR([1.0] * len(names)))
        names, _, wrr = self.wrr[key]
        i = wrr.pick({names.index(s) for s in spare})
        return (names[i] if i is not None else None), slot

    # HTTP
    def router(self) -> hs.Router:
        r = hs.Router()
        oip.add_protocol_routes(
            r,
            server_meta=self.server_meta,
            live=self.live,
            ready=self.ready,
            model_meta=self.forward_get,
            model_ready=self.forward_get,
            infer=self.infer,
            metrics=self.metrics_page,
        )
        r.add_get("/admin/geo", self.admin_get)
        r.add_post("/admin/geo", self.admin_set)
        return r

    async def server_meta(self, request: Any) -> Any:
        return hs.json_response({"name": "greenctl-georouter", "version": "1", "extensions": []})

    async def live(self, request: Any) -> Any:
        return hs.json_response({"live": True})

    async def ready(self, request: Any) -> Any:
        ok = any(s.healthy for s in self.sites.values())
        return hs.json_response({"ready": ok}, status=200 if ok else 503)

    def _gateway(self, request: Any) -> tuple[str | None, Any]:
        gw = request.headers.get(GATEWAY_HEADER) or self.default_gateway
        if not gw:
            return None, hs.json_response(
                {
                    "error": f"no gateway: send a {GATEWAY_HEADER} header (one of "
                    f"{', '.join(self.table['gateways'])}) or start the router with --gateway"
                },
                status=400,
            )
        if gw not in self.table["gateways"]:
            return None, hs.json_response(
                {
                    "error": f"unknown gateway '{gw}': the plan's gateways are "
                    f"{', '.join(self.table['gateways'])}"
                },
                status=400,
            )
        return gw, None

    async def infer(self, request: Any) -> Any:
        gw, bad = self._gateway(request)
        if gw is None:
            return bad
        body = await request.read()
        headers = {h: request.headers[h] for h in _FORWARD_HEADERS if h in request.headers}
        tried: set[str] = set()
        for attempt in (0, 1):
            name, _ = self.pick(gw, tried)
            if name is None:
                self.failed[gw] += 1
                return hs.json_response(
                    {"error": f"no healthy site for gateway '{gw}'"},
                    status=503,
                    headers={"Retry-After": "1"},
                )
            site = self.sites[name]
            try:
                status, rh, data = await site.pool.post(request.path, body, headers, self.timeout_s)
            except UpstreamError as exc:
                tried.add(name)
                if not isinstance(exc, UpstreamTimeout):
                    site.drain(f"request failed: {exc}")
                    if attempt == 0:  # idempotent: once more, on another site
                        self.retries += 1
                        continue
                self.failed[gw] += 1
                return hs.json_response({"error": f"site {name} failed: {exc}"}, status=502)
            out = {"Content-Type": rh.get("content-type", "application/json"), SITE_HEADER: name}
            if "inference-header-content-length" in rh:
                out[_HEADER_LENGTH] = rh["inference-header-content-length"]
            for h in oip.TIMING_HEADERS:
                if (value := rh.get(h.lower())) is not None:
                    out[h] = value
            if status == 200:
                self.served[(gw, name)] += 1
            else:
                self.failed[gw] += 1
            return hs.Response(status=status, body=data, headers=out)
        raise AssertionError("unreachable")

    async def forward_get(self, request: Any) -> Any:
        """Model metadata and readiness: asked of a healthy site (the sites serve the same
        models)."""
        for site in self.sites.values():
            if not site.healthy:
                continue
            got = await asyncio.to_thread(_http_get, site.url + request.path, 2.0)
            if got is not None:
                status, ctype, data = got
                return hs.Response(status=status, body=data, content_type=ctype)
        return hs.json_response({"error": "no healthy site"}, status=503)

    async def metrics_page(self, request: Any) -> Any:
        lines = ["# TYPE greenctl_georouter_requests_total counter"]
        for (gw, site), n in sorted(self.served.items()):
            lines.append(f'greenctl_georouter_requests_total{{gateway="{gw}",site="{site}"}} {n}')
        lines.append("# TYPE greenctl_georouter_failed_total counter")
        for gw, n in sorted(self.failed.items()):
            lines.append(f'greenctl_georouter_failed_total{{gateway="{gw}"}} {n}')
        lines += ["# TYPE greenctl_georouter_retries_total counter"]
        lines.append(f"greenctl_georouter_retries_total {self.retries}")
        return hs.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def status_doc(self) -> dict[str, Any]:
        """Per gateway and site: served and planned counts and shares, and each site's health."""
        slot, wrapped = self.slot()
        gateways: dict[str, Any] = {}
        for gw in self.table["gateways"]:
            served = {s: self.served.get((gw, s), 0) for s in self.table["sites"]}
            n = sum(served.values())
            planned_n = math.fsum(self.planned.get((gw, s), 0.0) for s in self.table["sites"])
            now = gateway_fractions(self.table, slot, gw)
            rows = {}
            for s in self.table["sites"]:
                p = self.planned.get((gw, s), 0.0)
                if not served[s] and not p and not now.get(s):
                    continue
                rows[s] = {
                    "served": served[s],
                    "served_share": served[s] / n if n else None,
                    "planned_share": p / planned_n if planned_n else None,
                    "slot_fraction": now.get(s, 0.0),
                }
            gateways[gw] = {"served": n, "failed": self.failed.get(gw, 0), "sites": rows}
        return {
            "plan_id": self.table.get("plan_id"),
            "slot": slot,
            "slot_time": self.table["times"][slot] if self.table["times"] else None,
            "slot_wrapped": wrapped,
            "at": None if self.at is None else self.at.isoformat().replace("+00:00", "Z"),
            "default_gateway": self.default_gateway,
            "retries": self.retries,
            "sites": {name: s.to_dict() for name, s in self.sites.items()},
            "gateways": gateways,
        }

    def _admin_ok(self, request: Any) -> bool:
        return hs.admin_allowed(request, self.token)

    async def admin_get(self, request: Any) -> Any:
        if not self._admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        return hs.json_response(self.status_doc())

    async def admin_set(self, request: Any) -> Any:
        if not self._admin_ok(request):
            return hs.json_response({"error": "forbidden"}, status=403)
        try:
            doc = await request.json()
            table = doc.get("table") or self.table
            for slot, fractions in (doc.get("slots") or {}).items():  # one online step's
                table["slots"][int(slot)] = dict(fractions)
            self.set_table(table, doc.get("at"))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return hs.json_response({"error": f"bad table: {exc}"}, status=400)
        return hs.json_response(self.status_doc())

    # health checks
    async def health_loop(self) -> None:
        while True:
            await asyncio.gather(*(self._check(s) for s in self.sites.values()))
            await asyncio.sleep(self.health_interval_s)

    async def _check(self, site: Site) -> None:
        got = await asyncio.to_thread(_http_get, site.url + "/v2/health/ready", 1.0)
        if got is not None and got[0] == 200:
            site.fails = 0
            site.passes += 1
            if not site.healthy and site.passes >= PASSES_TO_RECOVER:
                site.healthy = True
                site.last_error = None
                print(f"georouter: site {site.name} recovered", flush=True)
        else:
            site.passes = 0
            site.fails += 1
            if site.fails >= FAILS_TO_DRAIN:
                site.drain("health check failed" if got is None else f"health check {got[0]}")


def _http_get(url: str, timeout_s: float) -> tuple[int, str, bytes] | None:
    """(status, content type, body) of a GET; None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None


async def serve(args: argparse.Namespace) -> int:
    """Run one router on the address (or listening socket) ``args`` name until SIGTERM."""
    state_dir = Path(args.state_dir)
    record = read_json(state_dir / "router.json") or {}
    kept = read_json(state_dir / "table.json") or {}
    state_file = state_dir / "state.json"

    def report(doc: dict[str, Any]) -> None:
        doc.update(pid=os.getpid(), pid_start=proc_start_ticks(os.getpid()))
        write_json_atomic(state_file, doc)

    router = GeoRouter(
        table=kept["table"],
        sites=record["sites"],
        gateway=record.get("gateway"),
        at=kept.get("at"),
        token=str(record["token"]),
        state_dir=state_dir,
        health_interval_s=float(record.get("health_interval_s") or HEALTH_INTERVAL_S),
    )
    server = hs.Server(router.router())
    sock = socket.socket(fileno=os.dup(args.listen_fd)) if args.listen_fd is not None else None
    try:
        port = await server.start(args.host, args.port, sock=sock)
    except OSError as exc:
        report({"error": f"cannot bind {args.host}:{args.port}: {exc.strerror or exc}"})
        return 4
    health = asyncio.get_running_loop().create_task(router.health_loop())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    report({"ready": True, "host": args.host, "port": port})
    print(f"georouter ready at {args.host}:{port}", flush=True)
    await stop.wait()
    health.cancel()
    await server.shutdown()
    return 0


def supervise(args: argparse.Namespace) -> int:
    """Bind the address once and keep a router serving on it (restarting a dead one on the
    same socket, with the dispatcher's back-off) until SIGTERM."""
    state_dir = Path(args.state_dir)
    sup_file = state_dir / "supervisor.json"
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as exc:
        write_json_atomic(sup_file, {"error": f"cannot bind {args.host}:{args.port}: {exc}"})
        return 4
    sock.listen(2048)
    port = int(sock.getsockname()[1])
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    base, cap = backoff_settings()
    failures = 0
    restarts = 0
    while not stopping:
        argv = python_module_argv(
            "greenctl.executor.deploy.georouter",
            "--state-dir", str(state_dir), "--host", args.host, "--port", str(port),
            "--listen-fd", str(sock.fileno()), *(["--db", args.db] if args.db else []),
        )  # fmt: skip
        child = subprocess.Popen(argv, pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL)
        started = time.monotonic()
        write_json_atomic(
            sup_file,
            {
                "ready": True,
                "pid": os.getpid(),
                "pid_start": proc_start_ticks(os.getpid()),
                "router_pid": child.pid,
                "router_pid_start": proc_start_ticks(child.pid),
                "host": args.host,
                "port": port,
                "restarts": restarts,
            },
        )
        child.wait()
        if stopping:
            break
        failures = failures + 1 if time.monotonic() - started < STABLE_S else 1
        restarts += 1
        print(f"georouter supervisor: router exited ({child.returncode}); restarting", flush=True)
        delay = restart_delay(failures, base=base, cap=cap)
        end = time.monotonic() + delay
        while not stopping and time.monotonic() < end:
            time.sleep(0.05)
    sock.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The router's (and its supervisor's) command line."""
    p = argparse.ArgumentParser(
        prog="python -m greenctl.executor.deploy.georouter", description=DESCRIPTION
    )
    p.add_argument("--state-dir", required=True, help="the router's folder (record and table)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback)")
    p.add_argument("--port", type=int, default=0, help="port (0: any free port)")
    p.add_argument("--listen-fd", type=int, default=None, help="serve this listening socket")
    p.add_argument("--supervise", action="store_true", help="run the supervisor, not a router")
    p.add_argument(
        "--db", default=None, help="the store it belongs to (`down` finds a stray one by it)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the router, or with ``--supervise`` its supervisor."""
    args = build_parser().parse_args(argv)
    if args.supervise:
        return supervise(args)
    settle_heap()
    return int(run_async(serve(args)))
