"""The geo router: a geo plan (eGLB) made real as an Open Inference Protocol front.

``greenctl apply GEO_PLAN --site NAME=URL ...`` starts it (:func:`apply_geo`); it forwards each
request to a site's endpoint (any OIP server, typically a greenctl dispatcher at that site):

- the request's **gateway** is its ``Greenctl-Gateway`` header, else the router's
  ``--gateway`` default (neither: 400 naming the plan's gateways);
- the **slot** is the plan step the clock is in (wrapped over the plan's span when the clock
  lies outside it), or the one ``--at`` names (tests, demos, ``replan``);
- the **site** is chosen with that gateway's allocation fractions for the slot by smooth
  weighted round robin, the project's one implementation
  (:class:`~greenctl.planner.core.policy.SmoothWRR`, the dispatcher's and the simulator's);
- a site that fails its health checks (``/v2/health/ready`` every ``--health-interval-s``;
  two failures in a row, or one failed connection of a request) is **drained**: the WRR
  skips it, which spreads its share over the gateway's other sites in proportion to their
  fractions (to the gateway's other allowed sites evenly when none of them has a fraction),
  until two checks in a row pass;
- a request whose connection to a site failed (refused, reset) is sent once more, to another
  site (inference is idempotent); one that timed out is not.

The fractions come from the plan's own allocation, planned again through the registry of
plan kinds (:func:`routing_table`; a geo plan records per-site totals, not per-step flows,
and its planner is deterministic over its files). ``replan`` of a running geo plan
(:func:`replan_router`) takes eGLB's online step for the new slot from the state stored after
the previous one (:mod:`greenctl.data.loop_state`), writes a decision record and hands the
router the slot's new fractions and the slot through its admin endpoint (``/admin/geo``,
loopback and the token only): no restart. The router is recorded in the store
(:mod:`greenctl.data.deployments`) like the dispatcher, so an interrupted apply's router is
stopped by the next apply, status or down.

Run as ``python -m greenctl.executor.deploy.georouter --supervise ...``, the router runs beside a
small supervisor (this module's :func:`supervise`) that binds the address once, hands the
listening socket to the router and starts a new one on the same socket (same token, table
and slot, which the router keeps in its state folder) when it dies, with the dispatcher's
back-off. Nothing here prints but the daemons' log lines.
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
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from greenctl.data import deployments, loop_state
from greenctl.data.errors import ExecutorError, InputError
from greenctl.executor.deploy.georouter_procs import recover_routers, stop_routers, stop_rows
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.procs import (
    STABLE_S,
    apply_lock,
    backoff_settings,
    is_alive,
    proc_start_ticks,
    python_module_argv,
    read_json,
    restart_delay,
    run_async,
    settle_heap,
    spawn_detached,
    state_dir_for,
    wait_for_state_file,
    write_json_atomic,
)
from greenctl.executor.runtime.upstream import UpstreamError, UpstreamPool, UpstreamTimeout
from greenctl.planner.core.policy import SmoothWRR

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


# -- the routing table --------------------------------------------------------------------
def routing_table(plan: Any, store: Any) -> dict[str, Any]:
    """The router's table for a geo plan: per slot, per gateway, each site's fraction.

    The plan is planned again from its request through the registry of plan kinds (its
    files, read again: a geo plan records per-site totals, not the per-step flows).

    Returns:
        ``{"plan_id", "start", "step_h", "times", "sites", "gateways", "allowed": {gw:
        [sites]}, "slots": [{gw: {site: fraction}}], "overall": {gw: {site: fraction}}}``;
        a gateway without load in a slot is absent from it (the router uses its overall
        fractions then).

    Raises:
        InputError: not a geo plan, or its files are gone or changed shape.
    """
    from greenctl.executor.kinds import get_kind

    if plan.kind != "geo":
        raise InputError(f"plan {plan.id} is a {plan.kind} plan, not a geo plan")
    kind = get_kind("geo")
    assert kind.plan is not None
    _, run = kind.plan(store, dict(plan.request))
    return table_from_run(run, plan_id=plan.id)


def table_from_run(run: Any, *, plan_id: int | None = None) -> dict[str, Any]:
    """:func:`routing_table` from a :class:`~greenctl.planner.geo.solve.GeoRun`."""
    problem = run.problem
    sol = run.solutions[run.plan.extra["algorithm"]]
    slots, overall = sol.gateway_fractions(problem)
    return {
        "plan_id": plan_id,
        "start": problem.times[0],
        "step_h": float(problem.step_h),
        "times": list(problem.times),
        "sites": list(problem.sites),
        "gateways": list(problem.gateways),
        "allowed": allowed_sites(problem),
        "slots": slots,
        "overall": overall,
    }


def allowed_sites(problem: Any) -> dict[str, list[str]]:
    """Each gateway's allowed sites (every site without routes)."""
    if problem.routes is None:
        return {gw: list(problem.sites) for gw in problem.gateways}
    return {
        gw: [s for j, s in enumerate(problem.sites) if problem.routes[g, j]]
        for g, gw in enumerate(problem.gateways)
    }


def slot_index(table: dict[str, Any], at: datetime) -> tuple[int, bool]:
    """The slot ``at`` falls in, and whether it was wrapped (``at`` outside the plan's span:
    the slot at the same offset modulo the span, as traces repeat by day or year)."""
    from greenctl.data.carbon_io import parse_time

    start = parse_time(table["start"])
    n = max(1, len(table["slots"]))
    k = math.floor((at - start).total_seconds() / (3600.0 * float(table["step_h"])))
    return k % n, not 0 <= k < n


def gateway_fractions(table: dict[str, Any], slot: int, gateway: str) -> dict[str, float]:
    """The gateway's fractions in ``slot`` (its overall ones when it has no load there)."""
    slots = table["slots"]
    fr = slots[slot].get(gateway) if 0 <= slot < len(slots) else None
    return dict(fr or table["overall"].get(gateway) or {})


def parse_sites(values: list[str] | None) -> dict[str, str]:
    """``NAME=URL`` options as a dict.

    Raises:
        InputError: a value without ``=``, a name given twice, or a URL that is no base URL.
    """
    from greenctl.executor.runtime.loadgen import check_endpoint

    out: dict[str, str] = {}
    for text in values or []:
        name, sep, url = str(text).partition("=")
        name = name.strip()
        if not sep or not name or not url.strip():
            raise InputError(
                f"--site '{text}' is not NAME=URL",
                hint="name a site of the plan and its endpoint: --site west=http://10.0.0.5:8000",
            )
        if name in out:
            raise InputError(f"--site {name} is given twice", hint="give each site once")
        try:
            out[name] = check_endpoint(url.strip()).rstrip("/")
        except InputError as exc:
            raise InputError(f"--site {name}: {exc.message}", hint=exc.hint) from None
    return out


def check_sites(table: dict[str, Any], sites: dict[str, str]) -> None:
    """Every site of the plan has an endpoint and every endpoint names a site of the plan.

    Raises:
        InputError: naming the sites and the fix.
    """
    missing = [s for s in table["sites"] if s not in sites]
    if missing:
        example = " ".join(f"--site {s}=http://HOST:PORT" for s in missing)
        raise InputError(
            f"site{'s' if len(missing) > 1 else ''} {', '.join(missing)} of plan "
            f"{table.get('plan_id')} ha{'ve' if len(missing) > 1 else 's'} no endpoint",
            hint=f"give every site of the plan its OIP endpoint: {example}",
        )
    unknown = [s for s in sites if s not in table["sites"]]
    if unknown:
        raise InputError(
            f"--site {', '.join(unknown)}: not a site of plan {table.get('plan_id')}",
            hint=f"its sites are {', '.join(table['sites'])}",
        )


# -- the router ---------------------------------------------------------------------------
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
        from greenctl.data.carbon_io import parse_time

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


async def _serve(args: argparse.Namespace) -> int:
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
    p = argparse.ArgumentParser(
        prog="python -m greenctl.executor.deploy.georouter", description=__doc__
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
    args = build_parser().parse_args(argv)
    if args.supervise:
        return supervise(args)
    settle_heap()
    return int(run_async(_serve(args)))


# -- lifecycle: apply, status, replan, down ----------------------------------------------
def router_dir(store: Any) -> Path:
    """The geo router's folder in the store's state folder."""
    path = state_dir_for(store.path) / "georouter"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def _running(folder: Path) -> dict[str, Any] | None:
    sup = read_json(folder / "supervisor.json")
    if sup and sup.get("ready") and is_alive(sup.get("pid"), sup.get("pid_start")):
        return sup
    return None


def _admin(url: str, token: str, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        url + "/admin/geo",
        data=None if doc is None else json.dumps(doc).encode(),
        headers={TOKEN_HEADER: token, "Content-Type": "application/json"},
        method="GET" if doc is None else "POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=5.0) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ExecutorError(f"the geo router at {url} did not answer: {exc}") from None


def _url(host: str, port: int) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    return f"http://{shown}:{port}"


def apply_geo(
    plan: Any,
    *,
    store: Any,
    sites: dict[str, str],
    gateway: str | None = None,
    at: str | None = None,
    host: str = "127.0.0.1",
    port: int | None = None,
    health_interval_s: float = HEALTH_INTERVAL_S,
    dry_run: bool = False,
    ready_timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Route a geo plan: start the geo router (or hand the running one the new table).

    The router is journaled in the store before its supervisor starts
    (:mod:`greenctl.data.deployments`) and committed once it serves, under the apply lock,
    so an interrupted apply's router is stopped by the next ``apply``, ``status`` or
    ``down`` (:func:`recover_routers`).

    Args:
        plan: a geo plan (saved to the store when it has no id).
        sites: each site's OIP endpoint; every site of the plan needs one.
        gateway: the gateway of requests without a ``Greenctl-Gateway`` header.
        at: pin the slot to this time (tests, demos); None: the clock.
        host / port: the router's address (loopback, any free port by default).

    Raises:
        InputError: not a geo plan, a site without an endpoint, an unknown gateway or time.
        ExecutorError: the router did not start. LockedError: an apply runs.
    """
    from greenctl.data.carbon_io import normalise_time

    if plan.kind != "geo":
        raise InputError(f"--site routes a geo plan; this is a {plan.kind} plan")
    if not math.isfinite(health_interval_s) or not 0.05 <= health_interval_s <= 60:
        raise InputError("--health-interval-s must be 0.05-60 seconds")
    if at is not None:
        try:
            at = normalise_time(at)
        except ValueError as exc:
            raise InputError(f"--at: {exc}") from None
    table = routing_table(plan, store)
    check_sites(table, sites)  # before anything starts
    if gateway is not None and gateway not in table["gateways"]:
        raise InputError(
            f"--gateway {gateway} is not a gateway of the plan",
            hint=f"its gateways are {', '.join(table['gateways'])}",
        )
    folder = router_dir(store)
    with apply_lock(state_dir_for(store.path)):
        recover_routers(store)  # the routers an interrupted apply left
        row = deployments.running_router(store)
        running = _running(folder) if row is not None else None
        record = read_json(folder / "router.json") or {}
        same = (
            running is not None
            and record.get("sites") == sites
            and record.get("gateway") == gateway
            and running.get("host") == host
            and port in (None, 0, running.get("port"))
        )
        action = "update" if same else ("restart" if running else "start")
        if dry_run:
            return {"action": action, "plan_id": plan.id, "sites": sites, "dry_run": True}
        if plan.id is None:
            store.save_plan(plan, source="apply")
            table["plan_id"] = plan.id
        if same and running is not None and row is not None:
            url = _url(host, int(running["port"]))
            _admin(url, str(record["token"]), {"table": table, "at": at})
            with store.transaction():
                deployments.set_router_process(store, row["id"], plan_id=plan.id)
        else:
            stop_router(store)  # the running one, or one a killed supervisor left
            url = _start_router(
                store, folder, plan=plan, table=table, at=at, sites=sites, gateway=gateway,
                host=host, port=port, health_interval_s=health_interval_s,
                ready_timeout_s=ready_timeout_s,
            )  # fmt: skip
            record = read_json(folder / "router.json") or {}
        record["plan_id"] = record["applied_id"] = plan.id
        write_json_atomic(folder / "router.json", record)
    slot, wrapped = slot_index(table, _when(at))
    return {
        "action": action,
        "plan_id": plan.id,
        "router_url": url,
        "sites": sites,
        "gateways": table["gateways"],
        "default_gateway": gateway,
        "slot": slot,
        "slot_time": table["times"][slot],
        "slot_wrapped": wrapped,
        "at": at,
    }


def _start_router(
    store: Any,
    folder: Path,
    *,
    plan: Any,
    table: dict[str, Any],
    at: str | None,
    sites: dict[str, str],
    gateway: str | None,
    host: str,
    port: int | None,
    health_interval_s: float,
    ready_timeout_s: float,
) -> str:
    """Journal a router, start its supervisor, wait until the router serves, commit it;
    its URL. A failure (or a signal) stops what was started and forgets the row."""
    token = secrets.token_hex(16)
    record = {
        "sites": sites,
        "gateway": gateway,
        "token": token,
        "health_interval_s": health_interval_s,
        "plan_id": plan.id,
    }
    write_json_atomic(folder / "router.json", record)
    write_json_atomic(folder / "table.json", {"table": table, "at": at})
    for name in ("supervisor.json", "state.json"):
        with contextlib.suppress(FileNotFoundError):
            (folder / name).unlink()
    with store.transaction():
        rid = deployments.journal_router(
            store,
            {"plan_id": plan.id, "host": host, "port": int(port or 0), "state_dir": str(folder)},
        )
    try:
        argv = python_module_argv(
            "greenctl.executor.deploy.georouter",
            "--supervise", "--state-dir", str(folder), "--host", host, "--port", str(port or 0),
            "--db", str(Path(store.path).resolve()),
        )  # fmt: skip
        log = folder / "georouter.log"
        proc = spawn_detached(argv, env={}, log_file=log)
        with store.transaction():
            deployments.set_router_process(
                store, rid, supervisor_pid=proc.pid, supervisor_pid_start=proc_start_ticks(proc.pid)
            )
        sup = wait_for_state_file(
            folder / "supervisor.json",
            proc=proc,
            timeout_s=ready_timeout_s,
            what="the geo router's supervisor",
            log_file=log,
        )
        wait_for_state_file(
            folder / "state.json",
            proc=None,
            pid=sup.get("router_pid"),
            timeout_s=ready_timeout_s,
            what="the geo router",
            log_file=log,
        )
        with store.transaction():
            deployments.set_router_process(
                store,
                rid,
                port=int(sup["port"]),
                router_pid=sup.get("router_pid"),
                router_pid_start=sup.get("router_pid_start"),
            )
            deployments.commit_router(store, rid, plan_id=plan.id)
    except BaseException:
        mine = [r for r in deployments.routers_in(store, [deployments.STARTING]) if r["id"] == rid]
        stop_rows(mine or [{"state_dir": str(folder)}])
        with store.transaction():
            deployments.forget_router(store, rid)
        raise
    return _url(host, int(sup["port"]))


def _when(at: str | None) -> datetime:
    from greenctl.data.carbon_io import parse_time

    return parse_time(at) if at else datetime.now(UTC)


def router_status(store: Any) -> dict[str, Any] | None:
    """The running geo router's view (None when none was applied, or it was taken down):
    per gateway and site the share served against the share planned, each site's health,
    the slot."""
    row = deployments.running_router(store)
    if row is None:
        return None
    folder = Path(row["state_dir"])
    record = read_json(folder / "router.json") or {}
    running = _running(folder)
    if running is None:
        sup = read_json(folder / "supervisor.json") or {}
        orphan = is_alive(sup.get("router_pid"), sup.get("router_pid_start"))
        why = (
            "its supervisor is gone (the router still serves, unsupervised); apply the plan "
            "again to restart both"
            if orphan
            else "neither the router nor its supervisor runs; apply the plan again"
        )
        return {"state": "down", "plan_id": row.get("plan_id"), "why": why}
    url = _url(str(running["host"]), int(running["port"]))
    try:
        doc = _admin(url, str(record["token"]))
    except (ExecutorError, KeyError) as exc:
        return {"state": "down", "url": url, "plan_id": row.get("plan_id"), "why": str(exc)}
    healthy = all(s["healthy"] for s in doc["sites"].values())
    doc.update(
        state="serving" if healthy else "degraded", url=url, restarts=running.get("restarts", 0)
    )
    return doc


def running_plan_id(store: Any) -> int | None:
    """The plan the geo router routes (None: no router runs)."""
    row = deployments.running_router(store)
    if row is None or _running(Path(row["state_dir"])) is None:
        return None
    pid = row.get("plan_id")
    return int(pid) if isinstance(pid, int) else None


def replan_router(store: Any, *, plan: Any, at: str | None = None) -> dict[str, Any]:
    """One replanning round of the running geo plan: eGLB's online step for the new slot
    (dual mirror descent, or MPC when the plan was made with it) from the state stored
    after the previous slot, on the newest rows of the plan's sites and demand files; the
    router gets the slot's new fractions and slot through its admin endpoint (no restart).
    A decision record is written, as for every replan (``replan --history`` lists it).

    ``at`` None: the slot after the router's pinned one, or the clock's. A plan of an
    offline algorithm has no online step: it is planned again over its files and the router
    gets the whole new table (a plan with variants steps online like any other).

    Returns:
        The decision record plus ``plan_id``, ``new_plan_id``, ``slot``, ``slot_time``,
        ``changed``, ``action`` (``update-router``), ``router_url`` and ``online`` (the
        step: ``warm``, ``steps``, ``decide_s``).

    Raises:
        InputError: no geo router runs this plan, or a bad ``at``. LockedError: another
        replan runs. Any error of the step, after a ``failed`` decision is recorded.
    """
    from greenctl.data.carbon_io import normalise_time, parse_time
    from greenctl.data.records import utcnow_iso
    from greenctl.executor.control import replan

    row = deployments.running_router(store)
    folder = Path(row["state_dir"]) if row is not None else router_dir(store)
    running = _running(folder) if row is not None else None
    record = read_json(folder / "router.json") or {}
    if running is None or record.get("plan_id") != plan.id:
        raise InputError(
            f"no geo router routes plan {plan.id}",
            hint=f"apply it first: greenctl apply {plan.id} --site NAME=URL ...",
        )
    if at is not None:
        try:
            at = normalise_time(at)
        except ValueError as exc:
            raise InputError(f"--at: {exc}") from None
    lineage = f"plan:{record.get('applied_id') or plan.id}"
    url = _url(str(running["host"]), int(running["port"]))
    with replan.replan_lock(store):
        current = _admin(url, str(record["token"]))
        kept = read_json(folder / "table.json") or {}
        table = kept.get("table") or {}
        if at is None and current.get("at"):  # pinned: the next slot
            nxt = parse_time(current["at"]) + timedelta(hours=float(table.get("step_h") or 1.0))
            at = nxt.isoformat().replace("+00:00", "Z")
        slot, _ = slot_index(table, _when(at))
        decision: dict[str, Any] = {
            "time": utcnow_iso(),
            "at": at or utcnow_iso(),
            "lineage": lineage,
            "region": None,
            "signal_g_per_kwh": None,
            "reference_g_per_kwh": None,
            "signal_change": None,
            "forecaster": None,
            "forecast_rps": None,
            "running_plan_id": plan.id,
            "new_plan_id": None,
            "old_objective": _objective(plan),
            "new_objective": None,
            "improvement": None,
            "action": "failed",
            "applied": 0,
            "reason": "",
        }
        try:
            t0 = time.perf_counter()
            step = _online_step(store, plan, lineage=lineage, slot=slot)
            decide_s = time.perf_counter() - t0
            new_id = plan.id
            if step is not None:
                push: dict[str, Any] = {"slots": {str(slot): step["fractions"]}, "at": at}
                slots = table.get("slots") or []
                was = slots[slot] if slot < len(slots) else {}
                changed = not _same_fractions(was, step["fractions"])
                reason = (
                    f"eGLB online step ({step['algorithm']}, "
                    + ("from the stored state of the slot before" if step["warm"] and
                       step["steps"] == 1 else f"{step['steps']} step(s) from the stored state"
                       if step["warm"] else "state rebuilt from slot 0: none stored")
                    + f") for slot {slot} ({step['slot_time']})"
                )  # fmt: skip
                decision["signal_g_per_kwh"] = step["carbon_g_per_kwh"]
            else:  # an offline plan: the whole horizon again
                from greenctl.executor.kinds import get_kind

                kind = get_kind("geo")
                assert kind.plan is not None
                new, run = kind.plan(store, dict(plan.request))
                new_table = table_from_run(run, plan_id=plan.id)
                changed = new_table["slots"] != table.get("slots")
                if changed:
                    new_id = store.save_plan(new, source="replan")
                    new_table["plan_id"] = new_id
                    record["plan_id"] = new_id
                    write_json_atomic(folder / "router.json", record)
                    with store.transaction():
                        deployments.set_router_process(store, row["id"], plan_id=new_id)
                    decision["new_objective"] = _objective(new)
                push = {"table": new_table, "at": at}
                reason = (
                    f"algorithm {plan.request.get('algorithm')} has no online step: planned "
                    f"again over its files ({'new fractions' if changed else 'unchanged'})"
                )
            doc = _admin(url, str(record["token"]), push)
            if step is not None:  # the router took it: the state the next step starts from
                with store.transaction():
                    loop_state.add_geo_step(store, step["row"])
            decision.update(
                new_plan_id=new_id,
                action="apply",
                applied=1,
                reason=f"{reason}: the geo router at {url} routes slot {doc['slot']} "
                f"({doc['slot_time']}) with the new fractions, no restart"
                + ("" if changed else " (the same as before)"),
            )
        except BaseException as exc:
            msg = getattr(exc, "message", None) or str(exc) or type(exc).__name__
            decision["reason"] = f"{type(exc).__name__}: {msg}; the router's table is unchanged"
            replan.record_decision(store, decision)
            raise
        out = replan.record_decision(store, decision)
    out.update(
        plan_id=plan.id,
        new_plan_id=new_id,
        changed=changed,
        slot=doc["slot"],
        slot_time=doc["slot_time"],
        router_url=url,
        decision_id=out["id"],
        action="update-router",
        online=None
        if step is None
        else {"warm": step["warm"], "steps": step["steps"], "decide_s": decide_s},
    )
    return out


def _objective(plan: Any) -> float | None:
    value = plan.predicted.get("objective")
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _online_step(store: Any, plan: Any, *, lineage: str, slot: int) -> dict[str, Any] | None:
    """eGLB's online step of a routed plan for ``slot``, from the state stored for its
    lineage (:mod:`greenctl.data.loop_state`), on the files' newest rows; ``row`` is what to
    store once the router took the fractions. None: the plan's algorithm has no online step.
    A plan made with ``--variants`` steps the same way (its state also carries the accuracy
    banked so far and the site LP's basis); ``variant_mw`` is then the slot's load per site
    and variant (reference MW)."""
    import numpy as np
    from greenctl.executor.kinds import geo_inputs
    from greenctl.planner.geo import solve as geo

    algorithm = plan.request.get("algorithm")
    if algorithm not in geo.ONLINE_ALGORITHMS:
        return None
    problem, options, variants = geo_inputs(store, dict(plan.request))
    opts = geo.check_options(**options, variants=variants)
    last = loop_state.last_geo_step(store, lineage)
    state = None
    if last is not None and last.get("algorithm") == algorithm:
        state = geo.OnlineState.from_dict(last["state"], n_sites=len(problem.sites))
    step = geo.online_replan(problem, algorithm, opts, slot=slot, state=state)
    y = step.site_load_mw  # power: the intensity is weighted by the energy drawn
    carbon = problem.carbon_g_per_kwh[slot]
    intensity = float((carbon * y).sum() / y.sum()) if y.sum() > 0 else None
    variant_mw = None
    if variants is not None and step.variant_load is not None:
        variant_mw = {
            site: {
                name: float(step.variant_load[j, m])
                for m, name in enumerate(variants.names)
                if step.variant_load[j, m] > 1e-12
            }
            for j, site in enumerate(problem.sites)
            if step.variant_load[j].sum() > 1e-12
        }
    return {
        "row": {
            "lineage": lineage,
            "plan_id": plan.id,
            "algorithm": algorithm,
            "slot": slot,
            "slot_time": problem.times[slot],
            "state": step.state.to_dict(),
            "fractions": step.fractions,
        },
        "algorithm": algorithm,
        "fractions": step.fractions,
        "warm": step.warm,
        "steps": step.steps,
        "slot_time": problem.times[slot],
        "carbon_g_per_kwh": None if intensity is None or not np.isfinite(intensity) else intensity,
        "variant_mw": variant_mw,
    }


def replan_if_routed(
    store: Any, *, plan: str | int, at: str | None = None
) -> dict[str, Any] | None:
    """``replan --plan`` of the plan the geo router routes (its id, or the id it was applied
    as): :func:`replan_router`; None when no geo router routes it (replan as any plan)."""
    text = str(plan)
    if not (text.isascii() and text.isdecimal() and len(text) <= 18):
        return None
    row = deployments.running_router(store)
    if row is None:
        return None
    folder = Path(row["state_dir"])
    record = read_json(folder / "router.json") or {}
    if _running(folder) is None or int(text) not in (
        record.get("plan_id"),
        record.get("applied_id"),
    ):
        return None
    return replan_router(store, plan=store.get_plan(int(record["plan_id"])), at=at)


def _same_fractions(a: Any, b: Any, tol: float = 1e-9) -> bool:
    """Whether two slots' fractions (gateway -> site -> share) agree within ``tol``: a step
    and the whole-horizon solve agree to about 1e-9, which is no change to route by."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return False
        return all(_same_fractions(a[k], b[k], tol) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) <= tol
    return bool(a == b)


def stop_router(store: Any) -> int:
    """Stop every geo router of the store with its supervisor
    (:func:`~greenctl.executor.deploy.georouter_procs.stop_routers`); the number of processes
    that were running."""
    return len(stop_routers(store))


if __name__ == "__main__":
    sys.exit(main())
