"""Dispatcher overhead: latency through the dispatcher vs calling an executor directly.

Starts a real executor daemon with the no-op model (it returns its input) and a real
dispatcher (both detached processes on loopback, via ``apply_plan``), then sends the same
open-loop Poisson load (aiohttp client, keep-alive connections) at ``--rate`` req/s to the
executor directly and through the dispatcher, alternating rounds so machine noise hits both
arms alike. Prints p50/p95/p99 side by side and the added latency (target: p99 added
<= 1 ms at 1,000 req/s).

    python bench/bench_dispatcher.py            # 1,000 req/s, 3 rounds x 8 s per arm, wrr and fifo
    python bench/bench_dispatcher.py --quick    # 1 round x 3 s, wrr only
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
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
            run_load(direct, "noop", duration_s=1.0, rate_rps=args.rate / 4, seed=99)  # warm up
            run_load(front, "noop", duration_s=1.0, rate_rps=args.rate / 4, seed=99)
            lat: dict[str, list[float]] = {"direct": [], "dispatcher": []}
            bad: dict[str, int] = {"direct": 0, "dispatcher": 0}
            sent: dict[str, int] = {"direct": 0, "dispatcher": 0}
            for r in range(args.rounds):
                order = [("direct", direct), ("dispatcher", front)]
                if r % 2:
                    order.reverse()
                for arm, url in order:
                    before = {k: cpu_s(p) for k, p in pids.items()}
                    out = run_load(
                        url, "noop", duration_s=args.duration, rate_rps=args.rate, seed=r
                    )
                    if arm == "dispatcher":
                        cpu["dispatcher"] += cpu_s(pids["dispatcher"]) - before["dispatcher"]
                        cpu["executor"] += cpu_s(pids["executor"]) - before["executor"]
                    lat[arm] += out.latencies_ms
                    bad[arm] += out.sent - out.ok
                    sent[arm] += out.sent
                    time.sleep(0.5)
            q = {arm: np.percentile(np.asarray(v), [50, 95, 99]) for arm, v in lat.items()}
            rows.append(
                (policy, q, bad, sent, {k: v / max(sent["dispatcher"], 1) for k, v in cpu.items()})
            )
            down(store)
    finally:
        with contextlib.suppress(Exception):
            down(store)
    print()
    print(
        f"{'policy':<7} {'arm':<11} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    )
    for policy, q, bad, sent, cpu_per in rows:
        for arm in ("direct", "dispatcher"):
            p50, p95, p99 = q[arm]
            print(
                f"{policy:<7} {arm:<11} {sent[arm]:>9} {bad[arm]:>7} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f}"
            )
        added = q["dispatcher"] - q["direct"]
        ratio = q["dispatcher"][2] / q["direct"][2]
        if q["direct"][0] > 5.0:  # a no-op answers in well under 1 ms unless the box queues
            verdict = "INCONCLUSIVE (the direct arm itself queues: too few idle cores) for"
        else:
            verdict = "meets" if added[2] <= 1.0 else "MISSES"
        print(
            f"{policy:<7} {'added':<11} {'':>9} {'':>7} {added[0]:>8.3f} {added[1]:>8.3f} {added[2]:>8.3f}"
            f"   p99 ratio {ratio:.2f}x; {verdict} the <= 1 ms p99 target"
        )
        print(
            f"{policy:<7} CPU per request: dispatcher {cpu_per['dispatcher'] * 1e6:.0f} us, "
            f"executor {cpu_per['executor'] * 1e6:.0f} us (same requests)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
