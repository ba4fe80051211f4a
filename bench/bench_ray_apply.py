"""Time a Ray apply against a local apply of the same plan (issue 10).

Starts a throw-away single-node Ray cluster on loopback, applies a tiny-family plan with
`--backend ray` semantics (fresh and then a scaled version), applies the same plans locally
(executor daemons + dispatcher), and prints wall times side by side with their ratio.

    python bench/bench_ray_apply.py [--replicas 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=2)
    args = ap.parse_args()
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.executor.deploy.ray_backend import apply_ray, down_ray

    ray_bin = shutil.which("ray")
    if ray_bin is None:
        raise SystemExit("install the ray extra first: pip install 'greenctl[ray]'")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    os.environ.update({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    port = _free_port()
    t0 = time.perf_counter()
    subprocess.run(
        [ray_bin, "start", "--head", "--port", str(port), "--num-cpus", str(2 * args.replicas + 2),
         "--include-dashboard", "false", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
         "--object-store-memory", str(80 * 1024 * 1024)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    cluster_s = time.perf_counter() - t0
    plans = [
        Plan(kind="mix", request={"policy": "wrr"}, id=n,
             deployments=[Deployment("tiny", "tiny-s", "cpu:1", count=c, batch=4, quota_rps=20.0)])
        for n, c in ((1, 1), (2, args.replicas))
    ]  # fmt: skip
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp, open_store(Path(tmp) / "bench.db") as store:
            http_port = _free_port()
            for plan in plans:
                t = time.perf_counter()
                apply_ray(plan, store=store, address=f"127.0.0.1:{port}", http_port=http_port)
                ray_s = time.perf_counter() - t
                t = time.perf_counter()
                apply_plan(plan, store=store, policy="wrr")
                local_s = time.perf_counter() - t
                rows.append(
                    (f"plan {plan.id}: tiny-s x{plan.deployments[0].count}", ray_s, local_s)
                )
            down(store)
            down_ray(store=store)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([ray_bin, "stop", "--force"], env=env, capture_output=True)
    print(f"Ray head start: {cluster_s:.1f} s (not counted below)")
    print(f"{'apply':<24} {'ray s':>8} {'local s':>8} {'ray/local':>10}")
    for name, ray_s, local_s in rows:
        print(f"{name:<24} {ray_s:8.2f} {local_s:8.2f} {ray_s / local_s:10.1f}x")


if __name__ == "__main__":
    main()
