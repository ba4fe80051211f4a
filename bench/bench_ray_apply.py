"""Ray Serve against local daemons on one plan, in one run: apply time, sequential latency
and concurrent throughput through each backend's Open Inference Protocol endpoint.

Starts a throw-away single-node Ray cluster on loopback, applies a tiny-family plan with
``apply_ray`` (one replica, then a scaled version) and the same plans locally (executor
daemons + dispatcher), and after each apply sends the same requests to both endpoints: one
client in sequence (p50, p99), then ``--clients`` keep-alive clients back to back (req/s),
in interleaved rounds of both arms.
Prints each figure side by side with its ratio to the local backend, and the load average.

    python bench/bench_ray_apply.py [--replicas 2] [--requests 300] [--seconds 6] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _body(rows: int = 1) -> bytes:
    """One OIP JSON request of ``rows`` rows of the tiny family's 3x32x32 input."""
    shape = [rows, 3, 32, 32]
    doc = {"inputs": [{"name": "input", "shape": shape, "datatype": "FP32",
                       "data": [0.5] * (rows * 3 * 32 * 32)}]}  # fmt: skip
    return json.dumps(doc).encode()


class Client:
    """One keep-alive connection posting the same request to a model's infer path."""

    def __init__(self, url: str, model: str, body: bytes) -> None:
        parts = urlsplit(url)
        self.conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
        self.path = f"/v2/models/{model}/infer"
        self.body = body

    def post(self) -> None:
        self.conn.request(
            "POST", self.path, body=self.body, headers={"Content-Type": "application/json"}
        )
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{self.path}: HTTP {resp.status}: {data[:200]!r}")

    def close(self) -> None:
        self.conn.close()


def sequential_ms(url: str, model: str, requests: int) -> list[float]:
    """Milliseconds of each of ``requests`` requests sent one after the other (after a
    warm-up)."""
    client = Client(url, model, _body())
    try:
        for _ in range(20):
            client.post()
        times = []
        for _ in range(requests):
            t = time.perf_counter()
            client.post()
            times.append(1000.0 * (time.perf_counter() - t))
    finally:
        client.close()
    return times


def concurrent_rps(url: str, model: str, clients: int, seconds: float) -> float:
    """Requests per second answered to ``clients`` keep-alive clients sending back to back."""
    done = [0] * clients
    errors: list[BaseException] = []
    stop = threading.Event()

    def loop(i: int) -> None:
        client = Client(url, model, _body())
        try:
            while not stop.is_set():
                client.post()
                done[i] += 1
        except BaseException as exc:  # reported after the run
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(min(1.0, seconds / 4))  # warm-up: connections open, batches forming
    start, t0 = sum(done), time.perf_counter()
    time.sleep(seconds)
    answered, elapsed = sum(done) - start, time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} client(s) failed: {errors[0]}")
    return answered / elapsed


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _measure(urls: dict[str, str], args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Each endpoint's sequential p50 and p99 and concurrent req/s, measured in
    ``args.rounds`` interleaved rounds (the host's load drifts: each arm gets its share of
    it); the latencies pooled, the req/s the median of the rounds'."""
    times: dict[str, list[float]] = {arm: [] for arm in urls}
    rps: dict[str, list[float]] = {arm: [] for arm in urls}
    for _ in range(args.rounds):
        for arm, url in urls.items():
            times[arm] += sequential_ms(url, "tiny", max(args.requests // args.rounds, 10))
            rps[arm].append(concurrent_rps(url, "tiny", args.clients, args.seconds / args.rounds))
    out = {}
    for arm in urls:
        cuts = statistics.quantiles(times[arm], n=100)
        out[arm] = {"p50": cuts[49], "p99": cuts[98], "rps": statistics.median(rps[arm])}
    return out


def _start_head(ray_bin: str, port: int, cpus: int, env: dict[str, str]) -> int:
    """Start a Ray head in a session of its own; the session id (its processes' group)."""
    proc = subprocess.Popen(
        [ray_bin, "start", "--head", "--port", str(port), "--num-cpus", str(cpus),
         "--include-dashboard", "false", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
         "--ray-client-server-port", str(_free_port()), "--dashboard-port", str(_free_port()),
         "--dashboard-agent-listen-port", str(_free_port()),
         "--object-store-memory", str(80 * 1024 * 1024)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    _, err = proc.communicate(timeout=180)
    if proc.returncode != 0:
        _stop_session(proc.pid)
        raise SystemExit(f"ray start failed: {err.decode(errors='replace')[-2000:]}")
    return proc.pid


def _stop_session(sid: int) -> None:
    """Kill the processes of session ``sid`` (`ray stop` would stop every Ray cluster on the
    machine)."""
    from greenctl.executor.runtime.procs import kill_session

    kill_session(sid)


def _print(cluster_s: float, rows: list[tuple[str, str, float, float, str]]) -> None:
    print(f"Ray head start: {cluster_s:.1f} s (not counted below)")
    print(f"{'plan':<16} {'figure':<22} {'ray':>9} {'local':>9} {'ray/local':>10}  load 1/5/15")
    for name, figure, ray_v, local_v, load in rows:
        ratio = ray_v / local_v if local_v else float("nan")
        print(f"{name:<16} {figure:<22} {ray_v:9.2f} {local_v:9.2f} {ratio:9.2f}x  {load}")
    print(
        "target: sequential p50 ray/local <= 3x; concurrent req/s ray/local >= 0.33x "
        "(local daemons measured in the same run)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--replicas", type=int, default=2, help="replicas of the scaled plan")
    ap.add_argument("--requests", type=int, default=300, help="sequential requests per arm")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument("--seconds", type=float, default=6.0, help="concurrent run per arm")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of both arms")
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
    session = _start_head(ray_bin, port, 2 * args.replicas + 2, env)
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
                name = f"tiny-s x{plan.deployments[0].count}"
                t = time.perf_counter()
                ray_url = apply_ray(
                    plan, store=store, address=f"127.0.0.1:{port}", http_port=http_port
                ).url
                ray_s, load = time.perf_counter() - t, _load()
                t = time.perf_counter()
                local_url = apply_plan(plan, store=store, policy="wrr").dispatcher_url
                local_s = time.perf_counter() - t
                assert local_url is not None
                rows.append((name, "apply s", ray_s, local_s, load))
                measured = _measure({"ray": ray_url, "local": local_url}, args)
                ray_m, local_m = measured["ray"], measured["local"]
                load = _load()
                rows.append((name, "sequential p50 ms", ray_m["p50"], local_m["p50"], load))
                rows.append((name, "sequential p99 ms", ray_m["p99"], local_m["p99"], load))
                rows.append(
                    (name, f"req/s, {args.clients} clients", ray_m["rps"], local_m["rps"], load)
                )
            down(store)
            down_ray(store=store)
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _stop_session(session)
    _print(cluster_s, rows)


if __name__ == "__main__":
    main()
