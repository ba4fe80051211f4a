"""Dispatcher overhead: latency through the dispatcher vs calling an executor directly.

Starts a real executor daemon with the no-op model (it returns its input) and a real
dispatcher (both detached processes on loopback, via ``apply_plan``), then sends the same
open-loop Poisson load (aiohttp client, keep-alive connections) at ``--rate`` req/s to the
executor directly, through the dispatcher, and through a bytes-only TCP relay (a third arm:
the cost of any extra process hop on this host, with no HTTP parsing or routing at all),
alternating rounds so machine noise hits every arm alike. Prints p50/p95/p99 side by side and
the added latency over the direct arm (target: p99 added <= 1 ms at 1,000 req/s) and over the
relay.

    python bench/bench_dispatcher.py            # 1,000 req/s, 3 rounds x 8 s per arm, wrr and fifo
    python bench/bench_dispatcher.py --quick    # 1 round x 3 s, wrr only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ARMS = ("direct", "relay", "dispatcher")


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


def start_relay(direct_url: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = direct_url.split("//", 1)[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--relay-serve", str(port), target], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # "relay ready"
    return proc, f"http://127.0.0.1:{port}"


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--relay-serve":
        return relay_main(int(sys.argv[2]), sys.argv[3])
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rate", type=float, default=1000.0, help="offered load, req/s")
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per round and arm")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds per arm")
    ap.add_argument("--policies", default="wrr,fifo", help="dispatch policies to measure")
    ap.add_argument("--quick", action="store_true", help="1 round of 3 s, wrr only")
    args = ap.parse_args()
    if args.quick:
        args.duration, args.rounds, args.policies = 3.0, 1, "wrr"

    tmp = Path(tempfile.mkdtemp(prefix="greenctl-bench-"))
    os.environ["GREENCTL_DB"] = str(tmp / "bench.db")
    os.environ["GREENCTL_STATE_DIR"] = str(tmp / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.apply import apply_plan, down, status
    from greenctl.executor.loadgen import run_load

    store = open_store()
    print(
        f"# dispatcher overhead, no-op model, open-loop Poisson at {args.rate:.0f} req/s on loopback"
    )
    print(
        f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; python {sys.version.split()[0]}"
    )
    rows = []
    try:
        for policy in args.policies.split(","):
            plan = Plan(
                kind="mix",
                deployments=[
                    Deployment(
                        model="noop",
                        variant="noop",
                        resource="cpu:1",
                        count=1,
                        batch=1,
                        quota_rps=args.rate,
                    )
                ],
            )
            res = apply_plan(
                plan,
                store=store,
                loader="greenctl.executor.daemon:noop_loader",
                policy=policy,
                max_queue=4096,
                max_wait_ms=0.0,
            )
            front = res.dispatcher_url or ""
            st = status(store)
            direct = st["instances"][0]["url"]
            pids = {"executor": st["instances"][0]["pid"], "dispatcher": st["dispatcher"]["pid"]}
            cpu = {"executor": 0.0, "dispatcher": 0.0}
            relay_proc, relay = start_relay(direct)
            pids["relay"] = relay_proc.pid
            cpu["relay"] = 0.0
            urls = {"direct": direct, "relay": relay, "dispatcher": front}
            for url in urls.values():  # warm up, opening as many connections as the load needs
                run_load(url, "noop", duration_s=1.0, rate_rps=args.rate, seed=99)
            lat: dict[str, list[float]] = {arm: [] for arm in ARMS}
            bad: dict[str, int] = dict.fromkeys(ARMS, 0)
            sent: dict[str, int] = dict.fromkeys(ARMS, 0)
            round_p99: dict[str, list[float]] = {arm: [] for arm in ARMS}
            for r in range(args.rounds):
                order = list(ARMS[r % 3 :] + ARMS[: r % 3])  # each arm leads in turn
                for arm in order:
                    url = urls[arm]
                    before = {k: cpu_s(p) for k, p in pids.items()}
                    out = run_load(
                        url, "noop", duration_s=args.duration, rate_rps=args.rate, seed=r
                    )
                    if arm == "dispatcher":
                        cpu["dispatcher"] += cpu_s(pids["dispatcher"]) - before["dispatcher"]
                        cpu["executor"] += cpu_s(pids["executor"]) - before["executor"]
                    if arm == "relay":
                        cpu["relay"] += cpu_s(pids["relay"]) - before["relay"]
                    lat[arm] += out.latencies_ms
                    round_p99[arm].append(float(np.percentile(out.latencies_ms, 99)))
                    bad[arm] += out.sent - out.ok
                    sent[arm] += out.sent
                    time.sleep(0.5)
            q = {arm: np.percentile(np.asarray(v), [50, 95, 99]) for arm, v in lat.items()}
            per = {
                k: v / max(sent["relay" if k == "relay" else "dispatcher"], 1)
                for k, v in cpu.items()
            }
            rows.append((policy, q, bad, sent, per, round_p99))
            relay_proc.terminate()
            relay_proc.wait()
            down(store)
    finally:
        with contextlib.suppress(Exception):
            down(store)
    print()
    print(
        f"{'policy':<7} {'arm':<11} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    )
    for policy, q, bad, sent, cpu_per, round_p99 in rows:
        for arm in ARMS:
            p50, p95, p99 = q[arm]
            print(
                f"{policy:<7} {arm:<11} {sent[arm]:>9} {bad[arm]:>7} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f}"
            )
        added = q["dispatcher"] - q["direct"]
        ratio = q["dispatcher"][2] / q["direct"][2]
        direct_p99 = round_p99["direct"]
        noise = max(direct_p99) - min(direct_p99) if len(direct_p99) > 1 else 0.0
        if q["direct"][0] > 5.0:  # a no-op answers in well under 1 ms unless the box queues
            verdict = "INCONCLUSIVE (the direct arm itself queues: too few idle cores) for"
        elif noise > 1.0:
            verdict = (
                f"INCONCLUSIVE (host noise: the direct arm's p99 moved {min(direct_p99):.1f}-"
                f"{max(direct_p99):.1f} ms between rounds, more than the target) for"
            )
        elif len(direct_p99) < 2:
            verdict = "INCONCLUSIVE (one round cannot tell host noise from overhead) for"
        else:
            verdict = "meets" if added[2] <= 1.0 else "MISSES"
        print(
            f"{policy:<7} {'added':<11} {'':>9} {'':>7} {added[0]:>8.3f} {added[1]:>8.3f} {added[2]:>8.3f}"
            f"   p99 ratio {ratio:.2f}x; {verdict} the <= 1 ms p99 target"
        )
        floor = q["relay"] - q["direct"]
        over = q["dispatcher"] - q["relay"]
        print(
            f"{policy:<7} {'relay hop':<11} {'':>9} {'':>7} {floor[0]:>8.3f} {floor[1]:>8.3f} {floor[2]:>8.3f}"
            "   what a bytes-only extra hop adds on this host"
        )
        print(
            f"{policy:<7} {'over relay':<11} {'':>9} {'':>7} {over[0]:>8.3f} {over[1]:>8.3f} {over[2]:>8.3f}"
            "   the dispatcher's own part (parsing, routing, policy)"
        )
        print(
            f"{policy:<7} CPU per request: dispatcher {cpu_per['dispatcher'] * 1e6:.0f} us, "
            f"executor {cpu_per['executor'] * 1e6:.0f} us (same requests); "
            f"relay {cpu_per['relay'] * 1e6:.0f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
