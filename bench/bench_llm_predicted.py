"""An llm plan's prediction against what its served plan does: p95 TTFT and TPOT predicted by
``greenctl plan llm`` beside those measured through the dispatcher at the planned rate.

In a scratch store it makes the tiny random Llama (nothing downloaded), profiles it with
``greenctl profile llm`` (a real ``transformers serve`` on one core), plans it with ``greenctl
plan llm`` at ``--rate``, applies the plan, and sends Poisson arrivals at the planned rate
through the dispatcher's OpenAI front (streamed completions of the profiled lengths, greenctl's
stream timer per request), then prints predicted and measured p50/p95 with ``uptime``'s load.
The same open loop goes to the engine directly (what the profile saw) and through the
dispatcher, in slices that alternate; ``slice p95`` is the median of the slices' p95 (a stall
of the shared machine moves one slice, not the figure). A busy machine moves every figure.

    python bench/bench_llm_predicted.py                 # 10 req/s, 6 slices of 5 s per side
    python bench/bench_llm_predicted.py --rate 20 --slices 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _greenctl(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "greenctl.cli.main", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout


async def _open_loop(url: str, body: dict[str, Any], rate: float, duration_s: float) -> Any:
    """Poisson arrivals at ``rate`` for ``duration_s``; the timings and errors."""
    import aiohttp
    from greenctl.profiler.llm_client import stream_one

    rng = random.Random(7)
    timings, errors, tasks = [], 0, []

    async def one(session: Any) -> None:
        nonlocal errors
        try:
            timings.append(await stream_one(session, url, body))
        except Exception:
            errors += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        t0 = time.perf_counter()
        at = 0.0
        while at < duration_s:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(one(session)))
            at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
    return timings, errors, len(tasks) / duration_s


def _q(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--slices", type=int, default=6, help="slices per side, alternating")
    p.add_argument("--slice-s", type=float, default=5.0)
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--output-tokens", type=int, default=8)
    args = p.parse_args()
    from greenctl.data import deployments
    from greenctl.data.plan import load_plan_file
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.profiler.llm_client import request_body
    from greenctl.profiler.llm_models import random_llama

    with tempfile.TemporaryDirectory(prefix="bench-llm-predicted-") as tmp:
        os.environ["GREENCTL_DB"] = str(Path(tmp) / "g.db")
        os.environ["GREENCTL_STATE_DIR"] = str(Path(tmp) / "state")
        folder = Path(tmp) / "tiny"
        random_llama(folder, "tiny")
        tokens = ["--prompt-tokens", str(args.prompt_tokens)]
        tokens += ["--output-tokens", str(args.output_tokens)]
        _greenctl("profile", "llm", "--engine", "transformers", "--model-dir", str(folder),
                  "--name", "tiny", "--family", "tinyllm", "--quality", "0.5", "--cpus", "1",
                  *tokens, "--concurrency", "1,2,4", "--duration", "5")  # fmt: skip
        plan_file = Path(tmp) / "plan.json"
        _greenctl("plan", "llm", "--model", "tinyllm", "--rate", f"{args.rate:g}",
                  "--ttft-ms", "1000", "--tpot-ms", "100", "--budget", "cpu=1",
                  "--carbon-intensity", "300", *tokens, "-o", str(plan_file))  # fmt: skip
        plan = load_plan_file(plan_file)
        store = open_store(os.environ["GREENCTL_DB"])
        measured: dict[str, tuple[list[Any], int, list[float]]] = {}
        try:
            url = apply_plan(plan, store=store).dispatcher_url
            (inst,) = deployments.ready_instances(store)
            sides = {
                "engine": (f"http://127.0.0.1:{inst['port']}", str(folder.resolve())),
                "dispatcher": (url, "tinyllm"),
            }
            measured = {side: ([], 0, []) for side in sides}
            for i in range(args.slices):  # alternating: a stall of the machine hits one slice
                for side in list(sides) if i % 2 == 0 else list(reversed(sides)):
                    base, model = sides[side]
                    body = request_body(model, args.prompt_tokens, args.output_tokens)
                    got, errors, _ = asyncio.run(
                        _open_loop(f"{base}/v1/completions", body, args.rate, args.slice_s)
                    )
                    timings, errs, p95s = measured[side]
                    timings += got
                    p95s.append(_q([t.ttft_s * 1000 for t in got], 0.95))
                    measured[side] = (timings, errs + errors, p95s)
        finally:
            down(store)
            store.close()
    pred = plan.predicted
    load = Path("/proc/loadavg").read_text().split()[:3]
    print(f"load (1/5/15 min): {' '.join(load)}; {args.rate:g} req/s planned")
    head = ["TTFT p50", "TTFT p95", "slice p95", "TPOT p50", "TPOT p95", "requests"]
    print(f"{'':<11}" + "".join(f"{h:>10}" for h in head))
    print(
        f"{'predicted':<11}{'':>10}{pred['ttft_p95_ms']:>10.1f}{'':>20}{pred['tpot_p95_ms']:>10.2f}"
    )
    doc: dict[str, Any] = {"predicted": {k: pred[k] for k in ("ttft_p95_ms", "tpot_p95_ms")}}
    for side, (timings, errors, p95s) in measured.items():
        ttft = [t.ttft_s * 1000 for t in timings]
        tpot = [t.tpot_s * 1000 for t in timings if t.tpot_s is not None]
        row = [_q(ttft, 0.5), _q(ttft, 0.95), statistics.median(p95s), _q(tpot, 0.5),
               _q(tpot, 0.95)]  # fmt: skip
        print(f"{side:<11}" + "".join(f"{v:>10.1f}" for v in row) + f"{len(timings):>10}")
        doc[side] = {"ttft_p50_ms": row[0], "ttft_p95_ms": row[1],
                     "median_slice_ttft_p95_ms": row[2], "tpot_p95_ms": row[4],
                     "requests": len(timings), "errors": errors}  # fmt: skip
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
