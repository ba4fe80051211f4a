"""Benchmark of the evaluation core: simulator speed, analytic speed, analytic accuracy.

    python bench/bench_simulator.py [--quick]

1. Simulator: 10^6 requests over 10 heterogeneous instances (fifo central queue, wrr,
   batch), seconds and requests/s, against a textbook event-list simulator (one heap of
   arrival and departure events) measured on the same machine in the same run.
2. Analytic path: calls per second of ``latency_quantile_ms``, ``capacity_at_slo`` and
   ``predict`` (caches cleared, so every call computes).
3. Accuracy: the analytic p95 end-to-end latency against the simulator's over a grid of
   utilisations 10..95 % for c in {1, 2, 4, 8} identical instances, with the max error up
   to 85 % utilisation (target 10 %); then the same for wrr and batch.
4. Trace replay: hours of the Twitter requests-per-second trace through wrr.
5. Peers (``--peers-only`` runs just this): ciw and SimPy (the ``bench`` extra) on the same
   queues as greenctl's simulator, Poisson arrivals and exponential service at M/M/10,
   rho 0.8: one FIFO queue (closed form Erlang C), and round robin over ten one-server
   queues (closed form: each server is E_10/M/1, GI/M/1 with Erlang-10 interarrivals). ciw's
   round robin is a zero-time dispatcher node routing by ``ciw.routing.Cycle``; SimPy's a
   source handing request k to server k mod 10; greenctl's ``wrr_queues`` with equal shares.
   Per arm: CPU per request, the mean wait and its error against the closed form, and the
   peer's CPU per request over greenctl's. A peer not installed is skipped, with how to
   install it.

Times are wall-clock (``perf_counter``) and CPU (``process_time``) of this one process; on
a shared machine CPU time is the steadier figure.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from greenctl.data.plan import Deployment
from greenctl.data.records import Profile, Variant
from greenctl.planner.core import queueing
from greenctl.planner.core.evaluate import predict
from greenctl.planner.core.latency import ServiceTime
from greenctl.planner.core.loads import poisson_arrivals
from greenctl.planner.core.simulator import batch_queue, fifo_queue, stride_assign, wrr_queues

# Ten heterogeneous instances: shifted lognormals fitted to p50/p95/p99 like real CPU
# profiles of ResNet-18..152 (means 12..60 ms).
SERVICES = [
    ServiceTime.from_percentiles(10.0 + 5 * i, 14.0 + 7 * i, 18.0 + 10 * i) for i in range(10)
]
CAPACITY = sum(1000.0 / s.mean_ms for s in SERVICES)


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def naive_event_simulator(arrival_ms: np.ndarray, services: list[ServiceTime], seed: int) -> float:
    """A textbook discrete-event simulator: one heap of (time, event) for arrivals and
    departures, a FIFO list, idle servers picked fastest first. Returns the p95 latency."""
    rng = np.random.default_rng(seed)
    n = arrival_ms.size
    draws = [s.sample(rng, n) for s in services]
    order = sorted(range(len(services)), key=lambda i: services[i].mean_ms)
    events: list[tuple[float, int, int, int]] = [
        (float(a), 0, k, -1) for k, a in enumerate(arrival_ms)
    ]
    heapq.heapify(events)
    idle = set(range(len(services)))
    queue: list[int] = []
    head = 0
    latency = np.empty(n)
    while events:
        t, kind, k, server = heapq.heappop(events)
        if kind == 0:  # arrival
            queue.append(k)
        else:  # departure of request k from server
            latency[k] = t - arrival_ms[k]
            idle.add(server)
        while idle and head < len(queue):
            srv = next(i for i in order if i in idle)
            idle.discard(srv)
            req = queue[head]
            head += 1
            heapq.heappush(events, (t + float(draws[srv][req]), 1, req, srv))
    return float(np.quantile(latency, 0.95))


def bench_simulator(n: int, n_naive: int) -> None:
    print(f"\n== Simulator: {n:,} requests over 10 heterogeneous instances (utilisation 80 %)")
    arrivals = poisson_arrivals(0.8 * CAPACITY, n=n, seed=1) * 1000
    shares = [1000.0 / s.mean_ms / CAPACITY for s in SERVICES]
    rows = []
    run, wall, cpu = timed(lambda: fifo_queue(arrivals, SERVICES, np.random.default_rng(2)))
    fifo_p95 = float(np.quantile(run.latency_ms[n // 100 :], 0.95))
    rows.append(("fifo (central queue, Python loop)", wall, cpu))
    run, wall, cpu = timed(lambda: wrr_queues(arrivals, SERVICES, shares, np.random.default_rng(3)))
    rows.append(("wrr (stride + vectorised Lindley)", wall, cpu))

    def batch_all() -> None:
        assign = stride_assign(shares, n)
        rng = np.random.default_rng(4)
        for i, s in enumerate(SERVICES):  # batches of 8, L(8) ~ 4 x L(1)
            batch_queue(arrivals[assign == i], s.scaled(4.0), 8, rng)

    _, wall, cpu = timed(batch_all)
    rows.append(("batch (b = 8, duty cycle)", wall, cpu))
    naive_arr = arrivals[:n_naive]
    naive_p95, wall_naive, cpu_naive = timed(lambda: naive_event_simulator(naive_arr, SERVICES, 5))
    per_req_naive = cpu_naive / n_naive
    print(f"{'policy':36s} {'wall s':>8s} {'cpu s':>8s} {'req/s (cpu)':>14s} {'vs naive':>9s}")
    for name, wall, cpu in rows:
        print(f"{name:36s} {wall:8.2f} {cpu:8.2f} {n / cpu:14,.0f} {per_req_naive * n / cpu:8.1f}x")
    print(
        f"{'naive event-list DES (baseline)':36s} {wall_naive * n / n_naive:8.2f} "
        f"{cpu_naive * n / n_naive:8.2f} {n_naive / cpu_naive:14,.0f} {1.0:8.1f}x"
        f"   (measured on {n_naive:,}, scaled)"
    )
    ana = queueing.pooled_latency_quantile_ms(0.8 * CAPACITY, SERVICES, 0.95)
    print(
        f"p95: fifo simulator {fifo_p95:.2f} ms, naive DES {naive_p95:.2f} ms "
        f"(first {n_naive:,} requests), analytic pooled M/G/c {ana:.2f} ms"
    )


def _clear_caches() -> None:
    for name in dir(queueing):
        fn = getattr(queueing, name)
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()


def bench_analytic(n_calls: int) -> None:
    print("\n== Analytic path (caches cleared before every call)")
    service = SERVICES[3]
    rates = np.linspace(0.05, 0.95, n_calls) * 4 * 1000 / service.mean_ms

    def per_call(fn: Callable[[float], Any], count: int) -> float:
        t0 = time.process_time()
        for r in rates[:count]:
            _clear_caches()
            fn(float(r))
        return (time.process_time() - t0) / count

    cases = [
        (
            "latency_quantile_ms (M/G/4, p95)",
            lambda r: queueing.latency_quantile_ms(r, service, 4, 0.95),
            n_calls,
        ),
        (
            "mgc_wait_quantile_ms (M/G/4, p95)",
            lambda r: queueing.mgc_wait_quantile_ms(r, service, 4, 0.95),
            n_calls,
        ),
        (
            "pooled_latency_quantile_ms (10 het.)",
            lambda r: queueing.pooled_latency_quantile_ms(r * 4, SERVICES, 0.95),
            max(n_calls // 4, 10),
        ),
        (
            "capacity_at_slo (4 servers, 100 ms)",
            lambda r: queueing.capacity_at_slo(service, servers=4, slo_ms=100.0 + r / 1000),
            max(n_calls // 20, 5),
        ),
        (
            "batch_latency_quantile_ms (b = 8)",
            lambda r: queueing.batch_latency_quantile_ms(r, service.scaled(4.0), 8, 0.95),
            n_calls,
        ),
    ]
    profiles = {
        (f"v{i}", "cpu:4", 1): Profile(
            f"v{i}",
            "cpu:4",
            1,
            throughput_rps=1000 / s.mean_ms,
            latency_p50_ms=s.quantile(0.5),
            latency_p95_ms=s.quantile(0.95),
            latency_p99_ms=s.quantile(0.99),
            power_w=50.0,
            idle_power_w=15.0,
        )
        for i, s in enumerate(SERVICES)
    }
    variants = {f"v{i}": Variant(f"v{i}", "m", accuracy=0.7 + 0.01 * i) for i in range(10)}
    deps = [Deployment("m", f"v{i}", "cpu:4", count=1, quota_rps=10.0) for i in range(10)]
    cases.append(
        (
            "predict (10 deployments, wrr)",
            lambda r: predict(
                deps, profiles, variants, rate_rps=r, policy="wrr", percentile_slo_ms=150.0
            ),
            max(n_calls // 20, 5),
        ),
    )
    cases.append(
        (
            "predict (10 deployments, fifo)",
            lambda r: predict(
                deps, profiles, variants, rate_rps=r * 2, policy="fifo", percentile_slo_ms=150.0
            ),
            max(n_calls // 20, 5),
        ),
    )
    print(f"{'function':40s} {'us/call':>10s} {'calls/s':>12s}")
    for name, fn, count in cases:
        per = per_call(fn, count)
        print(f"{name:40s} {per * 1e6:10.1f} {1 / per:12,.0f}")
    # cached: what a planner's repeated evaluation costs
    queueing.latency_quantile_ms(100.0, service, 4, 0.95)
    t0 = time.process_time()
    for _ in range(100_000):
        queueing.latency_quantile_ms(100.0, service, 4, 0.95)
    per = (time.process_time() - t0) / 100_000
    print(f"{'latency_quantile_ms, cached repeat':40s} {per * 1e6:10.2f} {1 / per:12,.0f}")


def bench_accuracy(n: int) -> float:
    print(f"\n== Analytic p95 vs simulator ({n:,} requests per point, 1 % warm-up dropped)")
    service = ServiceTime.from_percentiles(20.0, 30.0, 40.0)
    print(f"service time: {service.describe()} (scv {service.scv:.3f})")
    utils = [0.10, 0.20, 0.30, 0.40, 0.50, 0.60, 0.70, 0.80, 0.85, 0.90, 0.95]
    header = "util  " + "".join(f"  c={c}: sim    ana    err " for c in (1, 2, 4, 8))
    print(header)
    worst = 0.0
    worst_all = 0.0
    for u in utils:
        line = f"{u:4.0%} "
        for c in (1, 2, 4, 8):
            rate = u * c * 1000 / service.mean_ms
            arr = poisson_arrivals(rate, n=n, seed=int(u * 1000) + c) * 1000
            run = fifo_queue(arr, [service] * c, np.random.default_rng(c * 7 + int(u * 100)))
            sim = float(np.quantile(run.latency_ms[n // 100 :], 0.95))
            ana = queueing.latency_quantile_ms(rate, service, c, 0.95)
            err = (ana - sim) / sim
            worst_all = max(worst_all, abs(err))
            if u <= 0.85 + 1e-9:
                worst = max(worst, abs(err))
            line += f" {sim:7.1f} {ana:6.1f} {err:+6.1%} "
        print(line)
    print(
        f"max |error| up to 85 % utilisation: {worst:.1%} (target 10 %); up to 95 %: "
        f"{worst_all:.1%}"
    )
    return worst


def bench_other_policies(n: int) -> None:
    print(f"\n== Analytic p95 vs simulator, wrr and batch ({n:,} requests per point)")
    service = ServiceTime.from_percentiles(20.0, 30.0, 40.0)
    batch_service = ServiceTime.from_percentiles(60.0, 75.0, 90.0)  # L(8)
    utils = [0.1, 0.3, 0.5, 0.7, 0.85, 0.95]
    print("util " + "".join(f"{name:>26s}" for name in ("wrr, 4 instances", "batch b=8 (1 inst.)")))
    for u in utils:
        line = f"{u:4.0%}"
        rate = u * 4 * 1000 / service.mean_ms
        arr = poisson_arrivals(rate, n=n, seed=int(u * 100)) * 1000
        run = wrr_queues(arr, [service] * 4, [0.25] * 4, np.random.default_rng(11))
        sim = float(np.quantile(run.latency_ms[n // 100 :], 0.95))
        ana_model = queueing.mgc_model(rate / 4, [service], ca2=0.25)
        ana = ana_model.quantile(0.95) if ana_model else math.inf
        line += f"   {sim:6.1f} {ana:6.1f} {(ana - sim) / sim:+6.1%}"
        rate_b = u * 8 * 1000 / batch_service.mean_ms
        arr = poisson_arrivals(rate_b, n=n, seed=int(u * 100) + 1) * 1000
        run = batch_queue(arr, batch_service, 8, np.random.default_rng(12))
        sim = float(np.quantile(run.latency_ms[n // 100 :], 0.95))
        ana = queueing.batch_latency_quantile_ms(rate_b, batch_service, 8, 0.95)
        line += f"   {sim:6.1f} {ana:6.1f} {(ana - sim) / sim:+6.1%}"
        print(line)


def bench_trace(hours: float) -> None:
    from greenctl.data.bundled import path_of
    from greenctl.data.traces import read_rps_trace as read_trace
    from greenctl.planner.core.loads import trace_arrivals

    path = path_of("twitter")
    print(f"\n== Twitter trace replay ({hours:g} h, wrr over the 10 instances)")
    series, wall, cpu = timed(lambda: read_trace(path))
    print(f"read {series.size:,} seconds in {wall:.2f} s wall / {cpu:.2f} s cpu")
    part = series[: int(hours * 3600)]
    # the busiest minute at 90 % of capacity (the mean sits far lower: diurnal swings)
    minutes = part[: part.size // 60 * 60].reshape(-1, 60).mean(axis=1)
    scale = 0.9 * CAPACITY / minutes.max()
    arrivals = trace_arrivals(part, seed=1, scale=scale) * 1000
    shares = [1000.0 / s.mean_ms / CAPACITY for s in SERVICES]
    run, wall, cpu = timed(
        lambda: wrr_queues(arrivals, SERVICES, shares, np.random.default_rng(13))
    )
    p95 = float(np.quantile(run.latency_ms, 0.95))
    print(
        f"{arrivals.size:,} requests (trace x {scale:.2f}): {wall:.2f} s wall / {cpu:.2f} s "
        f"cpu, {arrivals.size / max(cpu, 1e-9):,.0f} req/s; p95 {p95:.1f} ms "
        f"(mean load {arrivals.size / part.size / CAPACITY:.0%} of capacity)"
    )


def _erlang_k_m1_wait_ms(lam: float, mu: float, k: int) -> float:
    """Mean wait of a GI/M/1 queue whose interarrival is Erlang-``k`` with phase rate ``lam``
    (every k-th request of a Poisson stream: round robin over k servers): ``W = sigma /
    (mu (1 - sigma))``, ``sigma`` the root in (0, 1) of ``sigma = (lam / (lam + mu (1 -
    sigma)))^k`` (bisection: the function crosses from above once)."""
    lo, hi = 0.0, 1.0 - 1e-12
    for _ in range(200):
        mid = (lo + hi) / 2
        if (lam / (lam + mu * (1.0 - mid))) ** k - mid > 0:
            lo = mid
        else:
            hi = mid
    sigma = (lo + hi) / 2
    return sigma / (mu * (1.0 - sigma))


def _ciw_mean_wait(lam: float, mu: float, c: int, n: int, round_robin: bool) -> float:
    """ciw: one c-server FIFO node, or a zero-time dispatcher cycling over c one-server nodes."""
    import ciw

    if round_robin:
        network = ciw.create_network(
            arrival_distributions=[ciw.dists.Exponential(lam)] + [None] * c,
            service_distributions=[ciw.dists.Deterministic(0.0)] + [ciw.dists.Exponential(mu)] * c,
            number_of_servers=[float("inf")] + [1] * c,
            routing=ciw.routing.NetworkRouting(
                routers=[ciw.routing.Cycle(list(range(2, c + 2)))] + [ciw.routing.Leave()] * c
            ),
        )
    else:
        network = ciw.create_network(
            arrival_distributions=[ciw.dists.Exponential(lam)],
            service_distributions=[ciw.dists.Exponential(mu)],
            number_of_servers=[c],
        )
    ciw.seed(7)
    sim = ciw.Simulation(network)
    sim.simulate_until_max_customers(n, method="Finish")
    records = [r for r in sim.get_all_records() if r.node > (1 if round_robin else 0)]
    records.sort(key=lambda r: r.arrival_date)
    waits = [r.waiting_time for r in records[len(records) // 100 :]]
    return float(np.mean(waits))


def _simpy_mean_wait(lam: float, mu: float, c: int, n: int, round_robin: bool) -> float:
    """SimPy: a source process, one process per request, Resource(c) or c Resource(1)."""
    import random

    import simpy

    env = simpy.Environment()
    rng = random.Random(7)
    waits: list[float] = []
    pool = [simpy.Resource(env, 1) for _ in range(c)] if round_robin else [simpy.Resource(env, c)]

    def request(server: Any) -> Any:
        t = env.now
        with server.request() as req:
            yield req
            waits.append(env.now - t)
            yield env.timeout(rng.expovariate(mu))

    def source() -> Any:
        for k in range(n):
            yield env.timeout(rng.expovariate(lam))
            env.process(request(pool[k % len(pool)]))

    env.process(source())
    env.run()
    return float(np.mean(waits[n // 100 :]))


def _greenctl_mean_wait(lam: float, mu: float, c: int, n: int, round_robin: bool) -> float:
    """greenctl's simulator: Poisson arrivals, then fifo_queue or wrr_queues (equal shares)."""
    arrivals = poisson_arrivals(lam * 1000.0, n=n, seed=7) * 1000.0  # ms
    services = [ServiceTime.exponential(1.0 / mu)] * c
    # another seed than the arrivals': the same stream would tie each service time to the
    # gap before its request (a long service behind a long gap: waits far below M/M/c's)
    rng = np.random.default_rng(8)
    if round_robin:
        run = wrr_queues(arrivals, services, [1.0 / c] * c, rng)
    else:
        run = fifo_queue(arrivals, services, rng)
    return float(np.mean(run.wait_ms[n // 100 :]))


def bench_peers(n: int, n_peer: int, c: int = 10, rho: float = 0.8) -> None:
    """greenctl's simulator beside ciw and SimPy and the closed forms (module docstring, 5)."""
    mu = 0.1  # per ms: a 10 ms mean service
    lam = rho * c * mu
    erlang = queueing.erlang_c(c, lam / mu) / (c * mu - lam)
    rr = _erlang_k_m1_wait_ms(lam, mu, c)
    print(
        f"\n== Peers: M/M/{c}, rho {rho:g} (10 ms mean service, {lam * 1000:g} req/s); "
        f"greenctl {n:,} requests, ciw and SimPy {n_peer:,}; 1 % warm-up dropped"
    )
    print(
        f"{'queue':13s} {'arm':9s} {'cpu s':>7s} {'us/req':>8s} {'mean wait ms':>13s} "
        f"{'vs closed':>9s} {'us/req / greenctl':>18s}"
    )
    arms: list[tuple[str, Callable[..., float], str]] = [
        ("greenctl", _greenctl_mean_wait, ""),
        ("ciw", _ciw_mean_wait, "ciw"),
        ("SimPy", _simpy_mean_wait, "simpy"),
    ]
    for label, closed, round_robin in (("FIFO", erlang, False), ("round robin", rr, True)):
        form = "Erlang C" if not round_robin else f"E_{c}/M/1 per server, GI/M/1"
        print(f"{label:13s} {'closed':9s} {'':>7s} {'':>8s} {closed:13.3f}   ({form})")
        base = None
        for name, fn, module in arms:
            if module:
                try:
                    __import__(module)
                except ImportError:
                    print(f"{'':13s} {name:9s} skipped: not installed (pip install "
                          f"'greenctl[bench]', or pip install {module})")  # fmt: skip
                    continue
            count = n if not module else n_peer
            wait, _, cpu = timed(lambda fn=fn, k=count, rr=round_robin: fn(lam, mu, c, k, rr))
            per = cpu / count * 1e6
            base = per if base is None else base
            print(
                f"{'':13s} {name:9s} {cpu:7.2f} {per:8.2f} {wait:13.3f} "
                f"{(wait - closed) / closed:+9.1%} {per / base:17.1f}x"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller runs (about 20 s)")
    parser.add_argument("--peers-only", action="store_true", help="only the ciw/SimPy peers")
    args = parser.parse_args(argv)
    n = 200_000 if args.quick else 1_000_000
    n_peer = 20_000 if args.quick else 100_000
    if args.peers_only:
        bench_peers(n, n_peer)
        return 0
    bench_simulator(n, 20_000 if args.quick else 100_000)
    bench_analytic(200 if args.quick else 1000)
    bench_accuracy(50_000 if args.quick else 200_000)
    bench_other_policies(50_000 if args.quick else 200_000)
    bench_trace(1.0 if args.quick else 6.0)
    bench_peers(n, n_peer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
