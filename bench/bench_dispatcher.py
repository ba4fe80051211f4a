"""Dispatcher overhead: latency and CPU through the dispatcher vs nginx and vs calling an
executor directly.

Starts a real executor daemon with the no-op model (it returns its input) and a real
dispatcher (both detached processes on loopback, via ``apply_plan``), then sends the same
open-loop Poisson load (aiohttp client, keep-alive connections kept open throughout) at each
of ``--rates`` req/s to the executor directly, through the dispatcher, through a bytes-only
TCP relay (the cost of any extra process hop on this host, with no HTTP parsing or routing
at all) and, when nginx is installed, through nginx (the peer: ``proxy_pass`` to the same
executor, one worker, upstream keep-alive; skipped with a message when it is absent).

The arms take turns in short slices (``--slice`` seconds), each block of slices in a fresh
random order, so that the host's slow drifts and its bursts of stalls fall on every arm
alike. The added latency (an arm minus direct, at p50/p95/p99 of the pooled requests) comes
with a 95 % bootstrap interval over blocks. Against nginx the targets are: the dispatcher's
CPU per request (process CPU time over the requests of its slices) at most 2x nginx's
(master and worker), and its added p50 and p99 at most nginx's + 0.1 ms, read off the
interval of (dispatcher - nginx): meets when all of it lies at or below 0.1 ms, MISSES when
all of it lies above, INCONCLUSIVE otherwise. Without nginx, the verdict is on p99 added
<= 1 ms at 1,000 req/s.

    python bench/bench_dispatcher.py            # 500 and 1,000 req/s, 24 blocks of 1 s slices, wrr and fifo
    python bench/bench_dispatcher.py --quick    # 4 blocks, wrr only
    python bench/bench_dispatcher.py --no-nginx # without the nginx arm

``--upstream`` measures the dispatcher's upstream client alone (``executor/runtime/upstream.py``,
dispatcher -> executor) against another revision's, in one run: both clients in this
process take turns (slices in a fresh random order per block) sending a 602,112-byte body
(a 1x3x224x224 float32 image, in a ``bytearray`` as the dispatcher's front receives it) to a
sink process that reads it and answers 4 KB (1,000 class scores), ``--outstanding`` requests
in flight over keep-alive connections; per request: this process's CPU and the rate.

    python bench/bench_dispatcher.py --upstream                     # against d221ca2, uvloop
    python bench/bench_dispatcher.py --upstream --asyncio --body 64 # stdlib loop, 64-byte bodies
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ARMS = ("direct", "relay", "dispatcher", "nginx")


@dataclass
class Slices:
    """What :func:`drive` measured, per arm."""

    lat: dict[str, list[np.ndarray]]  # each block's latencies (ms)
    bad: dict[str, int]  # requests that failed
    sent: dict[str, int]
    cpu: dict[str, dict[str, float]]  # CPU seconds of each process during the arm's slices


def cpu_of(pids: int | tuple[int, ...]) -> float:
    """CPU seconds used so far by a process, or summed over a group (nginx's master and
    worker); a process gone counts nothing."""
    total = 0.0
    for pid in (pids,) if isinstance(pids, int) else pids:
        with contextlib.suppress(OSError):
            total += cpu_s(pid)
    return total


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relay_main(listen_port: int, target: str) -> int:
    """A bytes-only TCP relay: each client connection gets its own upstream connection and
    bytes are copied both ways, unparsed. What an extra process hop costs at the least."""
    import asyncio

    host, port = target.rsplit(":", 1)

    class Pipe(asyncio.Protocol):
        def __init__(self) -> None:
            self.peer: asyncio.Transport | None = None
            self.transport: asyncio.Transport | None = None
            self.early: list[bytes] = []

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            if self.peer is None:
                self.early.append(data)
            else:
                self.peer.write(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.peer is not None:
                self.peer.close()

    async def serve() -> None:
        loop = asyncio.get_running_loop()

        async def attach(client: Pipe) -> None:
            _, up = await loop.create_connection(Pipe, host, int(port))
            up.peer, client.peer = client.transport, up.transport
            for chunk in client.early:
                up.transport.write(chunk)  # type: ignore[union-attr]

        attaching: set[asyncio.Task[None]] = set()

        def factory() -> Pipe:
            client = Pipe()
            task = loop.create_task(attach(client))
            attaching.add(task)
            task.add_done_callback(attaching.discard)
            return client

        server = await loop.create_server(factory, "127.0.0.1", listen_port, backlog=2048)
        print("relay ready", flush=True)
        async with server:
            await server.serve_forever()

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())
    return 0


#: the upstream client before its head and body were sent unjoined (issue 22)
UPSTREAM_BASELINE = "d221ca2"
#: a 1x3x224x224 float32 tensor in a binary OIP request, as tritonclient sends it
IMAGE_BODY_BYTES = 602_112


def sink_main(listen_port: int, answer_bytes: int) -> int:
    """An executor stand-in for ``--upstream``: reads ``Content-Length`` requests and answers
    each with ``answer_bytes`` bytes, keep-alive; no parsing beyond the length."""
    import asyncio

    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % answer_bytes + b"\0" * answer_bytes

    class Sink(asyncio.Protocol):
        def __init__(self) -> None:
            self.transport: asyncio.Transport | None = None
            self.head = bytearray()
            self.left = -1  # body bytes still to come; -1: reading a head

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport  # type: ignore[assignment]

        def data_received(self, data: bytes) -> None:
            view = memoryview(data)
            while view:
                if self.left < 0:
                    self.head += view
                    end = self.head.find(b"\r\n\r\n")
                    if end < 0:
                        return
                    length = 0
                    for line in bytes(self.head[:end]).split(b"\r\n")[1:]:
                        key, _, value = line.partition(b":")
                        if key.strip().lower() == b"content-length":
                            length = int(value)
                    view = memoryview(bytes(self.head[end + 4 :]))
                    self.head.clear()
                    self.left = length
                take = min(self.left, len(view))
                view = view[take:]
                self.left -= take
                if self.left == 0:
                    self.left = -1
                    assert self.transport is not None
                    self.transport.write(answer)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Sink, "127.0.0.1", listen_port, backlog=2048)
        print("sink ready", flush=True)
        async with server:
            await server.serve_forever()

    try:
        import uvloop

        uvloop.run(serve())
    except ImportError:
        asyncio.run(serve())
    return 0


def import_file(where: str | Path, name: str) -> Any:
    """The Python file ``where`` imported as module ``name``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, where)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_revision_module(rev: str, path: str, name: str) -> Any:
    """``path`` as it is at git revision ``rev``, imported as module ``name`` (a temp file)."""
    text = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent.parent), "show", f"{rev}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    where = Path(tempfile.mkdtemp(prefix="greenctl-bench-rev-")) / f"{name}.py"
    where.write_text(text)
    return import_file(where, name)


def upstream_bench(args: argparse.Namespace) -> int:
    """The upstream client of this tree against ``args.baseline``'s, in one run."""
    import asyncio
    import random
    import time

    from greenctl.executor.runtime import upstream as current

    rev = subprocess.run(
        ["git", "-C", str(Path(__file__).resolve().parent.parent), "rev-parse", "--short",
         args.baseline], check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    baseline = load_revision_module(rev, "executor/runtime/upstream.py", "_upstream_baseline")
    clients = {f"baseline {rev}": baseline.UpstreamPool, "this tree": current.UpstreamPool}  # type: ignore[attr-defined]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sink = subprocess.Popen(
        [sys.executable, __file__, "--sink-serve", str(port), str(args.answer)],
        stdout=subprocess.PIPE,
    )
    assert sink.stdout is not None
    sink.stdout.readline()  # "sink ready"
    body = bytearray(b"\x01" * args.body)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": "60"}
    url = f"http://127.0.0.1:{port}"
    cpu = dict.fromkeys(clients, 0.0)
    done = dict.fromkeys(clients, 0)
    wall = dict.fromkeys(clients, 0.0)
    per_block: dict[str, list[float]] = {arm: [] for arm in clients}
    loads = [os.getloadavg()[0]]

    async def run() -> None:
        pools = {arm: make(url) for arm, make in clients.items()}

        async def worker(pool: object, end: float) -> int:
            n = 0
            while time.perf_counter() < end:
                status, _, _ = await pool.post("/v2/models/m/infer", body, headers, 10.0)  # type: ignore[attr-defined]
                assert status == 200
                n += 1
            return n

        async def slice_of(arm: str, seconds: float) -> tuple[int, float, float]:
            c0, t0 = time.process_time(), time.perf_counter()
            end = t0 + seconds
            n = sum(
                await asyncio.gather(*(worker(pools[arm], end) for _ in range(args.outstanding)))
            )
            return n, time.process_time() - c0, time.perf_counter() - t0

        for arm in clients:  # warm up: connections, allocator
            await slice_of(arm, 0.5)
        rng = random.Random(1)
        for _ in range(args.blocks):
            order = list(clients)
            rng.shuffle(order)
            for arm in order:
                n, used, took = await slice_of(arm, args.slice)
                cpu[arm] += used
                done[arm] += n
                wall[arm] += took
                per_block[arm].append(1e6 * used / max(n, 1))
            loads.append(os.getloadavg()[0])
        for pool in pools.values():
            pool.close()  # type: ignore[attr-defined]

    loop_name = "asyncio"
    try:
        if args.asyncio:
            raise ImportError
        import uvloop

        uvloop.run(run())
        loop_name = f"uvloop {uvloop.__version__}"
    except ImportError:
        asyncio.run(run())
    finally:
        sink.terminate()
        sink.wait()
    print(
        f"# upstream client (dispatcher -> executor), {loop_name}, python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs, load average {min(loads):.2f}-{max(loads):.2f} during the run"
    )
    print(
        f"# body {args.body:,} bytes (bytearray), answer {args.answer:,} bytes, "
        f"{args.outstanding} in flight, {args.blocks} blocks of {args.slice:g} s per arm"
    )
    print(f"{'arm':<18} {'CPU us/req':>10} {'blocks':>15} {'req/s':>8} {'requests':>9}")
    for arm in clients:
        blocks = np.asarray(per_block[arm])
        print(
            f"{arm:<18} {1e6 * cpu[arm] / max(done[arm], 1):>10.1f} "
            f"{blocks.min():>7.1f}-{blocks.max():<7.1f} {done[arm] / wall[arm]:>8.0f} {done[arm]:>9}"
        )
    base, cur = list(clients)
    ratios = np.asarray(per_block[cur]) / np.asarray(per_block[base])
    total = (cpu[cur] / max(done[cur], 1)) / (cpu[base] / max(done[base], 1))
    print(
        f"this tree / baseline, CPU per request: {total:.3f} "
        f"(per block: median {np.median(ratios):.3f}, min {ratios.min():.3f}, max {ratios.max():.3f})"
    )
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_relay(direct_url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    target = direct_url.split("//", 1)[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--relay-serve", str(port), target], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # "relay ready"
    return proc, f"http://127.0.0.1:{port}"


#: nginx as the peer reverse proxy: one worker, HTTP/1.1 keep-alive to the executor, logs
#: and temp files in its own directory (``{dir}``); what a user would put in front of the
#: executors instead of the dispatcher
NGINX_CONF = """\
{user}daemon off;
master_process on;
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    client_max_body_size 64m;
    keepalive_requests 1000000;
    upstream executor {{
        server {target};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port} backlog=2048;
        location / {{
            proxy_pass http://executor;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def start_nginx(direct_url: str) -> tuple[subprocess.Popen[bytes], str, tuple[int, ...]] | None:
    """nginx proxying to ``direct_url`` (config :data:`NGINX_CONF`): the process, its URL and
    its pids (master and worker); None, after saying why, when nginx is not installed or
    does not start."""
    import shutil
    import time

    exe = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if exe is None:
        print("# nginx arm skipped: nginx is not installed (Debian: apt-get install nginx)")
        return None
    where = Path(tempfile.mkdtemp(prefix="greenctl-bench-nginx-"))
    port = free_port()
    conf = where / "nginx.conf"
    conf.write_text(
        NGINX_CONF.format(
            user="user root;\n" if os.geteuid() == 0 else "",  # workers write its temp dir
            dir=where,
            target=direct_url.split("//", 1)[1],
            port=port,
        )
    )
    proc = subprocess.Popen(
        [exe, "-p", str(where), "-c", str(conf), "-e", str(where / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if children:
                return proc, f"http://127.0.0.1:{port}", (proc.pid, *map(int, children))
        time.sleep(0.05)
    proc.kill()
    _, err = proc.communicate()
    log = (where / "error.log").read_text() if (where / "error.log").exists() else ""
    print(f"# nginx arm skipped: nginx did not start: {(err.decode() + log).strip()[-300:]}")
    return None


def drive(
    urls: dict[str, str],
    *,
    rate: float,
    slice_s: float,
    blocks: int,
    pids: dict[str, int] | dict[str, int | tuple[int, ...]],
    seed: int = 0,
) -> Slices:
    """Interleaved slices over kept-open sessions: per arm, each block's latencies (ms), the
    failed and sent counts, and each process's (or group's) CPU seconds spent in that arm's
    slices."""
    import random

    from greenctl.executor.runtime.loadgen import (
        arrival_times,
        model_input,
        open_session,
        send_load,
    )
    from greenctl.executor.runtime.procs import run_async, settle_heap

    body, headers = model_input(urls["direct"], "noop")
    rng = random.Random(seed)
    lat: dict[str, list[np.ndarray]] = {arm: [] for arm in urls}
    bad = dict.fromkeys(urls, 0)
    sent = dict.fromkeys(urls, 0)
    cpu = {arm: dict.fromkeys(pids, 0.0) for arm in urls}

    async def run() -> None:
        sessions = {arm: open_session() for arm in urls}
        try:
            for arm, url in urls.items():  # warm up: open as many connections as the load needs
                times = arrival_times(duration_s=1.0, rate_rps=rate, seed=99)
                await send_load(sessions[arm], url, "noop", times, body, headers)
            for k in range(blocks):
                order = list(urls)
                rng.shuffle(order)
                for arm in order:
                    times = arrival_times(duration_s=slice_s, rate_rps=rate, seed=seed + k)
                    before = {name: cpu_of(pid) for name, pid in pids.items()}
                    got, _server, codes, _took = await send_load(
                        sessions[arm], urls[arm], "noop", times, body, headers
                    )
                    for name, pid in pids.items():
                        cpu[arm][name] += cpu_of(pid) - before[name]
                    lat[arm].append(np.asarray(got))
                    sent[arm] += len(times)
                    bad[arm] += len(times) - codes.get("200", 0)
        finally:
            for session in sessions.values():
                await session.close()

    settle_heap()
    run_async(run())
    return Slices(lat, bad, sent, cpu)


def added_interval(
    minus: list[np.ndarray], plus: list[np.ndarray], *, draws: int = 1000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled p50/p95/p99 of ``plus`` minus those of ``minus``, and the 2.5 % and 97.5 %
    bounds of that difference over bootstrap resamples of blocks (block i of both arms
    together: they ran side by side in time)."""
    qs = [50, 95, 99]
    point = np.percentile(np.concatenate(plus), qs) - np.percentile(np.concatenate(minus), qs)
    rng = np.random.default_rng(seed)
    n = len(plus)
    diffs = np.empty((draws, 3))
    for d in range(draws):
        pick = rng.integers(0, n, n)
        a = np.concatenate([minus[i] for i in pick])
        b = np.concatenate([plus[i] for i in pick])
        diffs[d] = np.percentile(b, qs) - np.percentile(a, qs)
    lo, hi = np.percentile(diffs, [2.5, 97.5], axis=0)
    return point, lo, hi


def verdict(lo: float, hi: float, target: float, what: str) -> str:
    """Whether a 95 % interval lies within ``target``: meets, MISSES or INCONCLUSIVE."""
    if hi <= target:
        return f"meets {what}"
    if lo > target:
        return f"MISSES {what}"
    return f"INCONCLUSIVE on {what} (the interval straddles it)"


def report(label: str, got: Slices, slice_s: float) -> None:
    """The table rows of one policy at one rate: each arm's latency, the added latency of
    the dispatcher (and nginx), and CPU per request, with the verdicts on the targets."""
    lat, bad, sent, cpu = got.lat, got.bad, got.sent, got.cpu
    pooled = {arm: np.percentile(np.concatenate(v), [50, 95, 99]) for arm, v in lat.items()}

    def row(arm: str, values: np.ndarray, note: str = "") -> None:
        print(
            f"{label:<12} {arm:<11} {'':>9} {'':>7} "
            + " ".join(f"{v:>8.3f}" for v in values)
            + (f"   {note}" if note else "")
        )

    for arm in (a for a in ARMS if a in lat):
        p50, p95, p99 = pooled[arm]
        print(
            f"{label:<12} {arm:<11} {sent[arm]:>9} {bad[arm]:>7} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f}"
        )
    queues = pooled["direct"][0] > 5.0  # a no-op answers in well under 1 ms unless the box queues
    added, lo, hi = added_interval(lat["direct"], lat["dispatcher"])
    row(
        "added",
        added,
        f"dispatcher - direct (p99 {lo[2]:.2f}..{hi[2]:.2f}); p99 ratio "
        f"{pooled['dispatcher'][2] / pooled['direct'][2]:.2f}x"
        + ("" if "nginx" in lat else f"; {verdict(lo[2], hi[2], 1.0, 'the <= 1 ms p99 target')}"),
    )
    floor, flo, fhi = added_interval(lat["direct"], lat["relay"], seed=1)
    row("relay hop", floor, f"a bytes-only extra hop (p99 {flo[2]:.2f}..{fhi[2]:.2f})")
    per = {"dispatcher": cpu["dispatcher"]["dispatcher"] / max(sent["dispatcher"], 1)}
    per["relay"] = cpu["relay"]["relay"] / max(sent["relay"], 1)
    executor = cpu["dispatcher"]["executor"] / max(sent["dispatcher"], 1)
    if "nginx" in lat:
        per["nginx"] = cpu["nginx"]["nginx"] / max(sent["nginx"], 1)
        nadded, _, _ = added_interval(lat["direct"], lat["nginx"], seed=3)
        row("nginx added", nadded, "nginx - direct")
        over, olo, ohi = added_interval(lat["nginx"], lat["dispatcher"], seed=2)
        row(
            "over nginx",
            over,
            f"dispatcher - nginx: p50 {olo[0]:.2f}..{ohi[0]:.2f}, p99 {olo[2]:.2f}..{ohi[2]:.2f}",
        )
        if queues:
            print(f"{label:<12} INCONCLUSIVE: the direct arm itself queues (too few idle cores)")
        else:
            print(f"{label:<12} p50: {verdict(olo[0], ohi[0], 0.1, 'nginx + 0.1 ms')}")
            print(f"{label:<12} p99: {verdict(olo[2], ohi[2], 0.1, 'nginx + 0.1 ms')}")
    cpu_line = (
        f"{label:<12} CPU per request: dispatcher {per['dispatcher'] * 1e6:.0f} us, "
        f"relay {per['relay'] * 1e6:.0f} us"
    )
    if "nginx" in per:
        ratio = per["dispatcher"] / max(per["nginx"], 1e-9)
        cpu_line += (
            f", nginx {per['nginx'] * 1e6:.0f} us; dispatcher/nginx {ratio:.2f}x "
            f"({'meets' if ratio <= 2.0 else 'MISSES'} <= 2x)"
        )
    print(cpu_line + f"; executor {executor * 1e6:.0f} us (the dispatcher's requests)")
    print(f"{label:<12} {len(lat['direct'])} blocks of {slice_s:g} s slices per arm")


def measure(args: argparse.Namespace) -> list[tuple[str, Slices]]:
    """Apply the no-op plan under each policy and drive every arm at each rate."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down, status

    store = open_store()
    rates = [float(r) for r in args.rates.split(",")]
    rows = []
    try:
        for policy in args.policies.split(","):
            deployment = Deployment(
                model="noop", variant="noop", resource="cpu:1", count=1, batch=1,
                quota_rps=max(rates),
            )  # fmt: skip
            res = apply_plan(
                Plan(kind="mix", deployments=[deployment]),
                store=store,
                loader="greenctl.executor.runtime.daemon:noop_loader",
                policy=policy,
                max_queue=4096,
                max_wait_ms=0.0,
            )
            st = status(store)
            direct = st["instances"][0]["url"]
            pids: dict[str, int | tuple[int, ...]] = {
                "executor": st["instances"][0]["pid"],
                "dispatcher": st["dispatcher"]["pid"],
            }
            relay_proc, relay = start_relay(direct)
            pids["relay"] = relay_proc.pid
            urls = {"direct": direct, "relay": relay, "dispatcher": res.dispatcher_url or ""}
            nginx = None if args.no_nginx else start_nginx(direct)
            if nginx is not None:
                urls["nginx"], pids["nginx"] = nginx[1], nginx[2]
            try:
                for rate in rates:
                    got = drive(urls, rate=rate, slice_s=args.slice, blocks=args.blocks, pids=pids)
                    rows.append((f"{policy} {rate:.0f}/s", got))
            finally:
                for proc in (relay_proc, *(() if nginx is None else (nginx[0],))):
                    proc.terminate()
                    proc.wait()
                down(store)
    finally:
        with contextlib.suppress(Exception):
            down(store)
    return rows


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--relay-serve":
        return relay_main(int(sys.argv[2]), sys.argv[3])
    if len(sys.argv) == 4 and sys.argv[1] == "--sink-serve":
        return sink_main(int(sys.argv[2]), int(sys.argv[3]))
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rates", default="500,1000", help="offered loads, req/s (comma-separated)")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of one arm's turn")
    ap.add_argument("--blocks", type=int, default=24, help="turns of every arm (random order)")
    ap.add_argument("--policies", default="wrr,fifo", help="dispatch policies to measure")
    ap.add_argument("--quick", action="store_true", help="4 blocks, wrr only")
    ap.add_argument("--no-nginx", action="store_true", help="leave out the nginx arm")
    up = ap.add_argument_group("--upstream: the upstream client alone, against a revision")
    up.add_argument("--upstream", action="store_true", help="measure the upstream client only")
    up.add_argument("--baseline", default=UPSTREAM_BASELINE, help="git revision to compare with")
    up.add_argument("--body", type=int, default=IMAGE_BODY_BYTES, help="request body bytes")
    up.add_argument("--answer", type=int, default=4096, help="answer body bytes")
    up.add_argument("--outstanding", type=int, default=4, help="requests in flight")
    up.add_argument("--asyncio", action="store_true", help="the stdlib loop, not uvloop")
    args = ap.parse_args()
    if args.upstream:
        if args.slice == 1.0 and args.blocks == 24 and not args.quick:
            args.slice, args.blocks = 2.0, 8
        if args.quick:
            args.slice, args.blocks = 1.0, 4
        return upstream_bench(args)
    if args.quick:
        args.blocks, args.policies = 4, "wrr"

    tmp = Path(tempfile.mkdtemp(prefix="greenctl-bench-"))
    os.environ["GREENCTL_DB"] = str(tmp / "bench.db")
    os.environ["GREENCTL_STATE_DIR"] = str(tmp / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    print(
        f"# dispatcher overhead, no-op model, open-loop Poisson at {args.rates} req/s on loopback"
    )
    loads = [os.getloadavg()[0]]
    rows = measure(args)
    loads.append(os.getloadavg()[0])
    print(
        f"# {os.cpu_count()} CPUs, load average {loads[0]:.2f} before, {loads[1]:.2f} after; "
        f"python {sys.version.split()[0]}"
    )
    print()
    print(
        f"{'policy rate':<12} {'arm':<11} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    )
    for label, got in rows:
        report(label, got, args.slice)
    return 0


if __name__ == "__main__":
    sys.exit(main())
