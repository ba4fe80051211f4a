"""The executor front's CPU per request for a 600 KB binary tensor, against a baseline revision.

An executor on a GPU serves every request through one event loop (receive the body, parse the
JSON header, slice the binary tensor, enqueue, encode the answer): at 0.5 ms of CPU per
request that one core caps the instance at 2,000 req/s whatever the GPU could do (issue 22,
plan 2 on the H200). This bench measures that CPU on this machine, no GPU needed: two executor
daemons with the no-op model (``greenctl.executor.runtime.daemon:noop_loader``, answering 1,000 zeros
per row as a classifier does), on ``cpu:1`` at batch 8, one running this tree's code and one
running ``--baseline`` (a git revision, exported to a scratch folder); a closed-loop client in
its own process (``--outstanding`` requests in flight over keep-alive connections, binary
tensors in and out as tritonclient sends them: a 1x3x224x224 float32 image, 602 KB) drives one
of them at a time, in slices that alternate in a fresh random order per block. Per request:
the daemon's user + system CPU from ``/proc`` over the requests it answered in the slice: the
whole process (the front, the batcher, the runner thread's batch assembly and no-op run), and
its main thread alone, the event loop: the front (receive, parse, decode, enqueue, encode,
send) and the batcher's coroutine, what limits an accelerator instance's rate.

    python bench/bench_executor_front.py                  # 8 blocks of 3 s slices
    python bench/bench_executor_front.py --quick          # 3 blocks of 2 s
    python bench/bench_executor_front.py --baseline REV   # another revision as the baseline
    python bench/bench_executor_front.py --input-shape 4 --output-elements 0 --batch 1
        # a tiny echo (the dispatcher bench's no-op executor): the batcher's own cost
    python bench/bench_executor_front.py --input-shape 4 --output-elements 0 --batch 1 --service-ms 0.5
        # ... with a model slow enough to keep the worker thread
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing as mp
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
#: the tree before the front's copies were taken out (issue 22)
DEFAULT_BASELINE = "9bab8ac"
PACKAGES = ("cli", "data", "executor", "planner", "profiler")


def cpu_s(pid: int, thread: int | None = None) -> float:
    """User + system CPU seconds a process (all its threads), or one of its threads, has
    used so far."""
    where = f"/proc/{pid}/task/{thread}/stat" if thread else f"/proc/{pid}/stat"
    fields = Path(where).read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def export_revision(rev: str, into: Path) -> Path:
    """``rev``'s code as an importable ``greenctl`` package under ``into`` (for PYTHONPATH)."""
    pkg = into / "greenctl"
    pkg.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, *PACKAGES],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(pkg)], input=archive, check=True)
    (pkg / "__init__.py").write_text("")  # a regular package wins over the editable install
    return into


def start_executor(name: str, workdir: Path, pythonpath: Path | None, batch: int,
                   shape: str = "3,224,224", outputs: int = 1000, service_ms: float = 0.0) -> tuple[subprocess.Popen, str]:  # fmt: skip
    state = workdir / f"{name}.json"
    state.unlink(missing_ok=True)
    env = dict(
        os.environ,
        GREENCTL_NOOP_OUTPUT_ELEMENTS=str(outputs),
        GREENCTL_NOOP_SERVICE_MS=str(service_ms),
    )
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    variant = {"name": "front-bench", "family": "front", "input_shape": shape}
    log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenctl.executor.runtime.daemon", "--model", "front", "--variant",
         "front-bench", "--resource", "cpu:1", "--batch", str(batch), "--port", "0",
         "--state-file", str(state), "--loader", "greenctl.executor.runtime.daemon:noop_loader",
         "--variant-json", json.dumps(variant), "--energy-source", "modeled"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if state.exists():
            with contextlib.suppress(json.JSONDecodeError):
                doc = json.loads(state.read_text())
                if doc.get("error"):
                    raise RuntimeError(f"{name} executor failed: {doc['error']}")
                if doc.get("ready"):
                    return proc, doc["url"]
        if proc.poll() is not None:
            raise RuntimeError(f"{name} executor exited {proc.returncode}; see {log.name}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{name} executor not ready within 120 s")


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def client_main(conn: Any, urls: dict[str, str], outstanding: int) -> None:
    """Closed-loop client: for each ``(arm, seconds)`` received, keep ``outstanding``
    requests in flight to that arm's executor and answer ``(ok, bad, latencies)``."""
    import asyncio

    import aiohttp
    from greenctl.executor.runtime import loadgen

    body, headers = loadgen.model_input(next(iter(urls.values())), "front")
    conn.send(len(body))

    async def worker(session: Any, target: str, seconds: float) -> tuple[int, int, list[float]]:
        ok = bad = 0
        lat: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            async with session.post(target, data=body, headers=headers) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                    lat.append((time.monotonic() - t0) * 1000.0)
                else:
                    bad += 1
        return ok, bad, lat

    async def main() -> None:
        sessions = {
            arm: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=outstanding))
            for arm in urls
        }
        try:
            while True:
                msg = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
                if msg is None:
                    return
                arm, seconds = msg
                got = await asyncio.gather(
                    *(
                        worker(sessions[arm], f"{urls[arm]}/v2/models/front/infer", seconds)
                        for _ in range(outstanding)
                    )
                )
                ok = sum(g[0] for g in got)
                bad = sum(g[1] for g in got)
                lat = [x for g in got for x in g[2]]
                conn.send((ok, bad, lat))
        finally:
            for s in sessions.values():
                await s.close()

    asyncio.run(main())


def _interval(values: np.ndarray, draws: int = 4000) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of ``values``."""
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(values, size=(draws, values.size)), axis=1)
    return float(np.quantile(medians, 0.025)), float(np.quantile(medians, 0.975))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git revision to compare with")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of one slice per arm")
    ap.add_argument("--slice", type=float, default=3.0, help="seconds per slice")
    ap.add_argument("--outstanding", type=int, default=4, help="requests in flight")
    ap.add_argument("--batch", type=int, default=8, help="the executors' largest batch")
    ap.add_argument("--input-shape", default="3,224,224", help="the no-op model's row shape")
    ap.add_argument(
        "--output-elements", type=int, default=1000, help="elements per output row (0: echo)"
    )
    ap.add_argument(
        "--service-ms", type=float, default=0.0,
        help="the no-op model sleeps this long per batch (a model on the worker thread)",
    )  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="3 blocks of 2 s slices")
    ap.add_argument("--json", default=None, help="write the figures here too")
    args = ap.parse_args()
    if args.quick:
        args.blocks, args.slice = 3, 2.0
    rev = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", args.baseline],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    tmp = Path(tempfile.mkdtemp(prefix="greenctl-front-bench-"))
    procs: dict[str, subprocess.Popen] = {}
    client = None
    try:
        base_tree = export_revision(rev, tmp / "baseline")
        urls = {}
        for arm, path in (("baseline", base_tree), ("current", None)):
            procs[arm], urls[arm] = start_executor(
                arm, tmp, path, args.batch, args.input_shape, args.output_elements, args.service_ms
            )
        ctx = mp.get_context("spawn")
        ours, theirs = ctx.Pipe()
        client = ctx.Process(target=client_main, args=(theirs, urls, args.outstanding))
        client.start()
        body_bytes = ours.recv()
        for arm in urls:  # warm both up (connections, allocator, caches)
            ours.send((arm, 1.0))
            ours.recv()
        cpu = {arm: 0.0 for arm in urls}
        loop_cpu = {arm: 0.0 for arm in urls}
        loop_block: dict[str, list[float]] = {arm: [] for arm in urls}
        done = {arm: 0 for arm in urls}
        failed = {arm: 0 for arm in urls}
        lat: dict[str, list[float]] = {arm: [] for arm in urls}
        per_block: dict[str, list[float]] = {arm: [] for arm in urls}
        rng = random.Random(1)
        loads = [os.getloadavg()[0]]
        for _ in range(args.blocks):
            order = list(urls)
            rng.shuffle(order)
            for arm in order:
                pid = procs[arm].pid
                before, before_loop = cpu_s(pid), cpu_s(pid, pid)
                ours.send((arm, args.slice))
                ok, bad, got = ours.recv()
                used = cpu_s(pid) - before
                used_loop = cpu_s(pid, pid) - before_loop
                cpu[arm] += used
                loop_cpu[arm] += used_loop
                loop_block[arm].append(1e6 * used_loop / max(ok, 1))
                done[arm] += ok
                failed[arm] += bad
                lat[arm].extend(got)
                per_block[arm].append(1e6 * used / max(ok, 1))
            loads.append(os.getloadavg()[0])
        ours.send(None)
        client.join(10)
    finally:
        if client is not None and client.is_alive():
            client.kill()
        for p in procs.values():
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        print(f"# uptime: {Path('/proc/loadavg').read_text().strip()}")
    print(
        f"# {os.cpu_count()} CPUs, load average {min(loads):.2f}-{max(loads):.2f} during the "
        f"run; python {sys.version.split()[0]}; body {body_bytes:,} bytes; batch {args.batch}, "
        f"{args.outstanding} in flight, {args.blocks} blocks of {args.slice:g} s per arm"
    )
    rows = {}
    for arm in ("baseline", "current"):
        us = 1e6 * cpu[arm] / max(done[arm], 1)
        blocks = np.asarray(per_block[arm])
        rows[arm] = {
            "cpu_us_per_request": us,
            "loop_cpu_us_per_request": 1e6 * loop_cpu[arm] / max(done[arm], 1),
            "block_us_min": float(blocks.min()),
            "block_us_max": float(blocks.max()),
            "requests": done[arm],
            "errors": failed[arm],
            "rps": done[arm] / (args.blocks * args.slice),
            "p50_ms": float(np.percentile(lat[arm], 50)) if lat[arm] else math.nan,
        }
    ratios = np.asarray(per_block["current"]) / np.asarray(per_block["baseline"])
    loop_ratios = np.asarray(loop_block["current"]) / np.asarray(loop_block["baseline"])
    name = {"baseline": f"baseline {rev}", "current": "this tree"}
    print(
        f"{'arm':<18} {'CPU us/req':>10} {'blocks':>15} {'loop us/req':>11} {'req/s':>7} "
        f"{'p50 ms':>7} {'errors':>6}"
    )
    for arm, r in rows.items():
        print(
            f"{name[arm]:<18} {r['cpu_us_per_request']:>10.0f} "
            f"{r['block_us_min']:>7.0f}-{r['block_us_max']:<7.0f} "
            f"{r['loop_cpu_us_per_request']:>11.0f} {r['rps']:>7.0f} "
            f"{r['p50_ms']:>7.2f} {r['errors']:>6}"
        )
    for what, key, per in (
        ("whole process", "cpu_us_per_request", ratios),
        ("event loop thread", "loop_cpu_us_per_request", loop_ratios),
    ):
        total = rows["current"][key] / rows["baseline"][key]
        lo, hi = _interval(per)
        print(
            f"this tree / baseline, {what}: {total:.3f} (per block: median {np.median(per):.3f}, "
            f"95 % interval of the median {lo:.3f}-{hi:.3f})"
        )  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "baseline": rev,
                    "rows": rows,
                    "ratios": ratios.tolist(),
                    "loop_ratios": loop_ratios.tolist(),
                },
                indent=1,
            )
        )
    return 0 if all(r["errors"] == 0 for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
