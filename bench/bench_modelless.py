"""Model-less requests (issue 19): what the dispatcher's per-request choice of a variant costs,
against plain routing by model name, measured side by side in one run.

Two measurements:

- ``micro``: in one process, the dispatcher's own per-request work on a routing table of three
  variants x two instances with their offers: plain (read the request's parameters, find none,
  take an instance by the fifo policy, release it) against model-less (read and check the
  requirements, choose the variant and instance with the queue-aware latency prediction, take
  and release it, write the variant into the answer). Binary (tritonclient's default) and JSON
  bodies. The difference is the choice's cost; the issue's budget is 50 us per request. The
  offers include a measured serving path (:data:`PATH_MS`), as ``apply`` builds them when
  ``greenctl profile serving`` was run: it is folded into each offer's latency table, so the
  per-request work is the same look-up.
- ``e2e`` (unless ``--micro``): a real dispatcher and two no-op executors (``apply``), the
  same open-loop load of plain and of model-less requests in interleaved slices; the
  dispatcher process's CPU time per request in each arm (user + system, /proc), and the
  difference.

    python bench/bench_modelless.py            # micro + 12 blocks of 1 s slices at 400 req/s
    python bench/bench_modelless.py --micro    # the in-process measurement only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_dispatcher import cpu_s

#: (variant, accuracy, p50/p95/p99 ms, energy J per request)
VARIANTS = (
    ("noop-s", 0.52, (1.0, 1.5, 2.0), 0.05),
    ("noop-m", 0.68, (3.0, 4.0, 5.0), 0.2),
    ("noop-l", 0.79, (6.0, 8.0, 10.0), 0.5),
)
REQUIREMENTS = {"latency_slo_ms": 50, "min_accuracy": 0.6}
#: a measured serving path's overhead samples (ms): 100 points from 0.8 to 1.8 ms
PATH_MS = tuple(0.8 + i / 100 for i in range(100))


def with_parameters(
    body: bytes, headers: dict[str, str], params: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """The request with ``params`` in its top-level parameters (as tritonclient writes them)."""
    headers = dict(headers)
    length = int(headers.get("Inference-Header-Content-Length", len(body)))
    head = json.loads(body[:length])
    head["parameters"] = {**head.get("parameters", {}), **params}
    new = json.dumps(head).encode()
    if "Inference-Header-Content-Length" in headers:
        headers["Inference-Header-Content-Length"] = str(len(new))
    return new + body[length:], headers


def _route() -> Any:
    """A dispatcher and its route of three variants x two instances with offers."""
    from greenctl.data.batching import executor_batching
    from greenctl.executor.runtime.dispatcher import Dispatcher
    from greenctl.planner.core.choice import Offer, queue_latency
    from greenctl.planner.core.latency import BatchService, ServiceTime

    instances = []
    for k, (name, acc, lat, energy) in enumerate(VARIANTS):
        svc = BatchService(
            ((1, ServiceTime.from_percentiles(*lat)),), executor_batching("cpu:1", 1)
        )
        table = queue_latency(svc, overhead_ms=PATH_MS)
        offer = Offer(name, acc, energy, energy * 400 / 3.6e6, None, table)
        for j in range(2):
            instances.append(
                {
                    "id": f"{k}-{j}",
                    "url": f"http://127.0.0.1:{20000 + 2 * k + j}",
                    "slots": 2,
                    "variant": name,
                    "offer": offer.to_dict(),
                }
            )
    disp = Dispatcher(token="t", db=None, max_queue=256, state_dir=Path(tempfile.gettempdir()))
    doc = {"models": {"noop": {"policy": "fifo", "prefer": "carbon", "instances": instances}}}
    disp.set_routes(doc)
    return disp, disp.routes["noop"]


def micro(n: int = 20000) -> dict[str, float]:
    """µs per request of the dispatcher's own work, plain and model-less (module docstring)."""
    import asyncio

    from greenctl.executor.runtime import oip
    from greenctl.executor.runtime.dispatch_modelless import name_variant, requirements_of

    disp, route = _route()
    x = np.ones((1, 3, 32, 32), dtype=np.float32)
    answer, answer_headers = oip.encode_response(
        "noop", [("output", x)], request={"parameters": {"binary_data_output": True}}
    )
    answer_len = answer_headers.get(oip.HEADER_LENGTH)
    out: dict[str, float] = {}
    for binary in (True, False):
        plain, headers = oip.encode_request([("input", x)], binary=binary, binary_outputs=binary)
        ours, ours_headers = with_parameters(plain, headers, REQUIREMENTS)
        hl, ours_hl = headers.get(oip.HEADER_LENGTH), ours_headers.get(oip.HEADER_LENGTH)

        async def plain_arm(body: bytes = plain, hl: str | None = hl) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                assert requirements_of(body, hl) is None
                b = await route.acquire(set())
                route.release(b)
            return time.perf_counter() - t0

        async def ours_arm(body: bytes = ours, hl: str | None = ours_hl) -> float:
            t0 = time.perf_counter()
            for _ in range(n):
                req = requirements_of(body, hl)
                assert req is not None
                b = disp.choose(route, None, req)
                route.release(b)
                name_variant(answer, answer_len, b.variant, "noop", None)
            return time.perf_counter() - t0

        async def both() -> tuple[float, float]:
            best_plain = best_ours = float("inf")
            for _ in range(5):  # alternate, keep the best of each (the least disturbed)
                best_plain = min(best_plain, await plain_arm())
                best_ours = min(best_ours, await ours_arm())
            return best_plain, best_ours

        t_plain, t_ours = asyncio.run(both())
        tag = "" if binary else "_json"
        out[f"plain{tag}_us"] = t_plain / n * 1e6
        out[f"modelless{tag}_us"] = t_ours / n * 1e6
        out[f"body{tag}_bytes"] = float(len(ours))
    return out


def e2e(*, rate: float, slice_s: float, blocks: int) -> dict[str, Any]:
    """Dispatcher CPU per request, plain vs model-less, against real no-op executors."""
    import asyncio
    import random

    tmp = Path(tempfile.mkdtemp(prefix="greenctl-bench-"))
    os.environ["GREENCTL_DB"] = str(tmp / "bench.db")
    os.environ["GREENCTL_STATE_DIR"] = str(tmp / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    from greenctl.data.plan import Deployment, Plan
    from greenctl.data.records import Profile, Variant
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.runtime.loadgen import (
        arrival_times,
        model_input,
        open_session,
        send_load,
    )
    from greenctl.executor.runtime.serving import ServingMeasurement, save_serving

    store = open_store()
    served = VARIANTS[::2]  # one core each: two fit a two-core machine
    for name, acc, (p50, p95, p99), energy in served:
        store.upsert_variant(Variant(name, "noop", acc, source="imported", input_shape="3,32,32"))
        store.add_profiles(
            [Profile(name, "cpu:1", 1, 1000.0 / p50, p50, p95, p99, energy_j=energy)]
        )
    # the serving path measured for the family: the offers' latency includes it
    path = list(PATH_MS)
    save_serving(
        store,
        [
            ServingMeasurement(
                family="noop", variant=served[0][0], path="dispatcher", stand_in="noop",
                policy="fifo", rate_rps=rate, input_bytes=12288, output_elements=3072,
                p50_ms=path[50], p95_ms=path[95], p99_ms=path[99], quantiles_ms=path,
                executor_cpu_ms_per_request=None, dispatcher_cpu_ms_per_request=None,
                samples=len(path),
            )
        ],
    )  # fmt: skip
    plan = Plan(
        kind="mix",
        deployments=[
            Deployment(model="noop", variant=v[0], resource="cpu:1", count=1, quota_rps=rate)
            for v in served
        ],
        request={"carbon_intensity": 400.0},
    )
    try:
        res = apply_plan(
            plan,
            store=store,
            loader="greenctl.executor.runtime.daemon:noop_loader",
            policy="fifo",
            max_queue=4096,
            max_wait_ms=0.0,
        )
        url = res.dispatcher_url or ""
        pid = int(status(store)["dispatcher"]["pid"])
        body, headers = model_input(url, "noop")
        arms = {"plain": (body, headers), "modelless": with_parameters(body, headers, REQUIREMENTS)}
        cpu = dict.fromkeys(arms, 0.0)
        sent = dict.fromkeys(arms, 0)
        ok = dict.fromkeys(arms, 0)
        other: dict[str, dict[str, int]] = {arm: {} for arm in arms}  # non-200 answers
        rng = random.Random(0)

        async def run() -> None:
            session = open_session()
            try:
                warm = arrival_times(duration_s=1.0, rate_rps=rate, seed=99)
                for b, h in arms.values():
                    await send_load(session, url, "noop", warm, b, h)
                for k in range(blocks):
                    order = list(arms)
                    rng.shuffle(order)
                    for arm in order:
                        times = arrival_times(duration_s=slice_s, rate_rps=rate, seed=k)
                        before = cpu_s(pid)
                        _, _, codes, _ = await send_load(session, url, "noop", times, *arms[arm])
                        cpu[arm] += cpu_s(pid) - before
                        sent[arm] += len(times)
                        ok[arm] += codes.get("200", 0)
                        for code, count in codes.items():
                            if code != "200":
                                other[arm][code] = other[arm].get(code, 0) + count
            finally:
                await session.close()

        asyncio.run(run())
    finally:
        with contextlib.suppress(Exception):
            down(store)
        store.close()
    return {
        arm: {
            "sent": sent[arm],
            "ok": ok[arm],
            "other": other[arm],
            "cpu_us": cpu[arm] / max(sent[arm], 1) * 1e6,
        }
        for arm in arms
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--micro", action="store_true", help="the in-process measurement only")
    ap.add_argument("-n", type=int, default=20000, help="requests per micro arm and round")
    ap.add_argument("--rate", type=float, default=400.0, help="e2e offered load, req/s")
    ap.add_argument("--slice", type=float, default=1.0, help="seconds of one e2e arm's turn")
    ap.add_argument("--blocks", type=int, default=12, help="turns of each e2e arm")
    args = ap.parse_args()
    print("# model-less choice vs plain routing, the dispatcher's per-request CPU")
    print(
        f"# {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        f"python {sys.version.split()[0]}"
    )
    m = micro(args.n)
    for tag, what in (("", "binary"), ("_json", "JSON")):
        plain, ours = m[f"plain{tag}_us"], m[f"modelless{tag}_us"]
        print(
            f"micro {what:<6} ({m[f'body{tag}_bytes']:.0f} B): plain {plain:6.2f} us, "
            f"model-less {ours:6.2f} us per request; the choice costs {ours - plain:6.2f} us "
            f"(budget 50 us), ratio {ours / plain:.2f}x"
        )
    if not args.micro:
        got = e2e(rate=args.rate, slice_s=args.slice, blocks=args.blocks)
        for arm, row in got.items():
            print(
                f"e2e   {arm:<10} {row['sent']:>6} sent {row['ok']:>6} ok, dispatcher CPU "
                f"{row['cpu_us']:6.1f} us per request"
                + (f" (other answers: {row['other']})" if row["other"] else "")
            )
        plain, ours = got["plain"]["cpu_us"], got["modelless"]["cpu_us"]
        print(
            f"e2e   the choice adds {ours - plain:+.1f} us of dispatcher CPU per request "
            f"(ratio {ours / plain:.2f}x; /proc counts CPU in 10 ms ticks: about +-10 us at "
            f"these counts)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
