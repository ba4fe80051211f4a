"""Geo router overhead: latency through the geo router vs calling a site directly.

Starts a real site (a greenctl dispatcher and one executor with the no-op model, via
``apply_plan``) and a real geo router (``apply_geo``) over a three-site, three-gateway geo plan
whose sites are all that one endpoint (so both arms reach the same process), then sends the
same open-loop Poisson load (aiohttp client, keep-alive connections kept open) at ``--rate``
req/s to the site directly and through the router (gateway g3, the one split over all three
sites). The arms take turns in ``--slice`` second slices, each block in a fresh random order,
and the added latency (router minus direct, p50/p95/p99 of the pooled requests) comes with a
95 % bootstrap interval over blocks (``bench_dispatcher``'s method and code). Afterwards it
prints each gateway's share per site against the plan, from the router's own counters.

    python bench/bench_geo_router.py            # 500 req/s, 16 blocks of 1 s slices
    python bench/bench_geo_router.py --quick    # 4 blocks
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "executor"))

from bench_dispatcher import added_interval, drive


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rate", type=float, default=500.0, help="offered load, req/s")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of one arm's turn")
    ap.add_argument("--blocks", type=int, default=16, help="turns of every arm (random order)")
    ap.add_argument("--quick", action="store_true", help="4 blocks")
    args = ap.parse_args()
    if args.quick:
        args.blocks = 4

    tmp = Path(tempfile.mkdtemp(prefix="greenctl-bench-geo-"))
    os.environ["GREENCTL_DB"] = str(tmp / "bench.db")
    os.environ.pop("GREENCTL_STATE_DIR", None)
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.deploy.georouter import (
        apply_geo,
        gateway_fractions,
        router_dir,
        router_status,
        routing_table,
        stop_router,
    )
    from greenctl.executor.runtime.procs import read_json
    from test_georouter import SITES, T0, geo_plan

    site_store = open_store(tmp / "site.db")
    store = open_store(tmp / "router.db")
    print(f"# geo router overhead, no-op model, open-loop Poisson at {args.rate:.0f} req/s")
    print(
        f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"python {sys.version.split()[0]}"
    )
    try:
        site = apply_plan(
            Plan(
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
            ),
            store=site_store,
            loader="greenctl.executor.runtime.daemon:noop_loader",
            max_queue=4096,
            max_wait_ms=0.0,
        )
        direct = site.dispatcher_url or ""
        plan = geo_plan(store, tmp)
        routed = apply_geo(plan, store=store, sites=dict.fromkeys(SITES, direct), gateway="g3",
                           at=T0)  # fmt: skip
        sup = read_json(router_dir(store) / "supervisor.json") or {}
        pids = {"site": status(site_store)["dispatcher"]["pid"], "router": sup["router_pid"]}
        urls = {"direct": direct, "router": routed["router_url"]}
        got = drive(urls, rate=args.rate, slice_s=args.slice, blocks=args.blocks, pids=pids)
        shares = router_status(store)
        table = routing_table(plan, store)
    finally:
        with contextlib.suppress(Exception):
            stop_router(store)
        with contextlib.suppress(Exception):
            down(site_store)
    print()
    print(f"{'arm':<8} {'requests':>9} {'failed':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}")
    pooled = {arm: np.percentile(np.concatenate(v), [50, 95, 99]) for arm, v in got.lat.items()}
    for arm in urls:
        p50, p95, p99 = pooled[arm]
        print(f"{arm:<8} {got.sent[arm]:>9} {got.bad[arm]:>7} {p50:>8.3f} {p95:>8.3f} {p99:>8.3f}")
    added, lo, hi = added_interval(got.lat["direct"], got.lat["router"])
    print(
        f"{'added':<8} {'':>9} {'':>7} {added[0]:>8.3f} {added[1]:>8.3f} {added[2]:>8.3f}"
        f"   router minus direct (p99 ratio {pooled['router'][2] / pooled['direct'][2]:.2f}x)"
    )
    print(
        f"{'  95% CI':<8} {'':>9} {'':>7} "
        + " ".join(f"{f'{a:.2f}..{b:.2f}':>8}" for a, b in zip(lo, hi, strict=True))
        + f"   bootstrap over {len(got.lat['direct'])} blocks of {args.slice:g} s slices"
    )
    n = max(got.sent["router"], 1)
    print(
        f"CPU per request: router {got.cpu['router']['router'] / n * 1e6:.0f} us, "
        f"site dispatcher {got.cpu['router']['site'] / n * 1e6:.0f} us (same requests)"
    )
    if shares is not None:
        print("\ngateway g3 (every routed request), share served vs planned (slot 0):")
        planned = gateway_fractions(table, 0, "g3")
        for s, row in shares["gateways"]["g3"]["sites"].items():
            want = planned.get(s, 0.0)
            print(
                f"  {s:<8} served {row['served']:>6}  {100 * (row['served_share'] or 0):6.2f} % "
                f"planned {100 * want:6.2f} %  off {100 * ((row['served_share'] or 0) - want):+.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
