"""GPU serving against its own profile: served throughput, CPU per request and batch time.

Run on a machine with an NVIDIA GPU (the CPU-only development VM has none):

    python bench/bench_gpu_serving.py                       # resnet50 at batch 8 and 1, both arms
    python bench/bench_gpu_serving.py --variant resnet18 --batch 32 --duration 6 --json out.json

For each batch size and each arm, in one run on the same GPU:

- ``pipeline``: greenctl's GPU runner (``greenctl.profiler.runner.CudaRunner``: CUDA graphs
  per batch size, pinned buffers, copies on a stream, blocking events, the next batch
  assembled while one runs);
- ``eager``: the executor as it was before that runner (``GREENCTL_GPU_PIPELINE=0``: the
  eager module, pageable copies, ``torch.cuda.synchronize`` after every batch), the baseline.

Each arm: (1) the profile greenctl stores for that point (``harness.measure`` in a child
process with the arm's setting, as ``greenctl profile --gpus`` runs it); (2) a real executor
daemon (``python -m greenctl.executor.runtime.daemon``) on the GPU at that batch; (3) saturation: closed
loop clients in several processes (4 x batch requests outstanding, binary tensors over
keep-alive HTTP, as tritonclient sends them) for ``--duration`` seconds: served throughput,
the executor's CPU seconds per request (utime + stime of the whole process from /proc), its
batch time (``Greenctl-Infer-Ms``: copy in, model, copy out) and the rows per batch; (4) an
open-loop Poisson load at half the lower of the profiled and the served throughput (``greenctl loadgen``'s client):
end-to-end p50/p95. The executor's warm-up (its state file's ``warmup``: runs, seconds, when
the batch time settled) is printed too.

Issue 22's targets (on an H100): served throughput >= 90 % of the profile's at the plan's
batch, <= 0.5 ms of executor CPU per request, served batch p50 within 20 % of the profile's.

``--assembly`` measures the eager runner's batch assembly alone, this tree's
(``EagerRunner``: the rows copied into a reused staging buffer, pinned for a CUDA model)
against a baseline revision's (``np.concatenate`` into a new array per batch), in one
process, in interleaved blocks: batches of several read-only 1x3x224x224 float32 request
views (as the executor decodes them) through the no-op model (numpy, 1,000 outputs per row),
or with ``--variant`` through a built-in torch model on ``--device`` (on a GPU: the eager
path, ``GREENCTL_GPU_PIPELINE=0``). Per batch and per request: the thread's CPU and the rate.

    python bench/bench_gpu_serving.py --assembly                         # CPU, no-op model
    python bench/bench_gpu_serving.py --assembly --variant resnet18 --device cuda:0
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

ARMS = ("pipeline", "eager")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def arm_env(arm: str) -> dict[str, str]:
    env = dict(os.environ)
    env["GREENCTL_GPU_PIPELINE"] = "1" if arm == "pipeline" else "0"
    return env


# -- (1) the profile of the point, in a child with the arm's setting ---------------------------
def profile_main(variant: str, batch: int, duration_s: float, device: str) -> int:
    from greenctl.profiler.harness import measure
    from greenctl.profiler.models import builtin_variant, load_model

    loaded = load_model(builtin_variant(variant), device=device)
    m = measure(loaded, batch=batch, duration_s=duration_s, isolated=0)
    lat = np.asarray(m.latencies_ms)
    busy = lat.sum() / 1000.0
    print(
        json.dumps(
            {
                "p50_ms": float(np.percentile(lat, 50)),
                "p95_ms": float(np.percentile(lat, 95)),
                "throughput_rps": m.requests / busy if busy > 0 else 0.0,
                "batches": len(lat),
            }
        )
    )
    return 0


def profile_point(arm: str, variant: str, batch: int, duration_s: float, device: str) -> dict[str, Any]:  # fmt: skip
    out = subprocess.run(
        [sys.executable, __file__, "--_profile", "--variant", variant, "--batch", str(batch),
         "--profile-duration", str(duration_s), "--device", device],
        env=arm_env(arm), capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"profiling {variant} b{batch} ({arm}) failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# -- (2) the executor daemon ---------------------------------------------------------------------
def start_executor(arm: str, variant: str, batch: int, max_wait_ms: float, workdir: Path,
                   device: str) -> tuple[subprocess.Popen, dict[str, Any]]:  # fmt: skip
    from greenctl.profiler.models import builtin_variant

    v = builtin_variant(variant)
    state = workdir / f"exec-{arm}-{batch}.json"
    log = open(workdir / f"exec-{arm}-{batch}.log", "w")  # noqa: SIM115 (closed with the process)
    proc = subprocess.Popen(
        [sys.executable, "-m", "greenctl.executor.runtime.daemon", "--model", v.family, "--variant",
         v.name, "--resource", "gpu:bench" if device.startswith("cuda") else "cpu:1", "--batch", str(batch), "--max-wait-ms",
         str(max_wait_ms), "--port", "0", "--state-file", str(state), "--variant-json",
         json.dumps(asdict(v))],
        env=arm_env(arm), stdout=log, stderr=subprocess.STDOUT, cwd=workdir,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if state.exists():
            with contextlib.suppress(json.JSONDecodeError):
                doc = json.loads(state.read_text())
                if doc.get("error"):
                    raise RuntimeError(f"executor failed: {doc['error']}")
                if doc.get("ready"):
                    return proc, doc
        if proc.poll() is not None:
            raise RuntimeError(f"executor exited {proc.returncode}; see {log.name}")
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("executor not ready within 300 s")


def stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def scrape_busy_s(url: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("greenctl_busy_seconds_total"):
                return float(line.rsplit(" ", 1)[1])
    return math.nan


# -- (3) closed-loop saturation, clients in several processes ------------------------------------
def client_proc(url: str, model: str, concurrency: int, start_at: float, duration_s: float,
                q: Any) -> None:  # fmt: skip
    from greenctl.executor.runtime import loadgen, oip

    body, headers = loadgen.model_input(url, model)

    async def run() -> dict[str, Any]:
        import aiohttp

        infer: list[float] = []
        rows: list[float] = []
        lat: list[float] = []
        ok = 0
        bad = 0
        end = start_at + duration_s
        target = f"{url}/v2/models/{model}/infer"
        conn = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=conn) as session:
            while time.time() < start_at:
                await asyncio.sleep(0.001)

            async def worker() -> None:
                nonlocal ok, bad
                while True:
                    t0 = time.time()
                    if t0 >= end:
                        return
                    async with session.post(target, data=body, headers=headers) as resp:
                        await resp.read()
                        t1 = time.time()
                        if resp.status == 200 and t1 <= end:
                            ok += 1
                            lat.append((t1 - t0) * 1000.0)
                            infer.append(float(resp.headers.get(oip.INFER_MS_HEADER, "nan")))
                            rows.append(float(resp.headers.get(oip.BATCH_ROWS_HEADER, "nan")))
                        elif resp.status != 200:
                            bad += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"ok": ok, "bad": bad, "lat": lat, "infer": infer, "rows": rows}

    q.put(asyncio.run(run()))


def saturate(url: str, model: str, pid: int, *, outstanding: int, procs: int,
             duration_s: float, spy: str | None = None) -> dict[str, Any]:  # fmt: skip
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    per = max(1, math.ceil(outstanding / procs))
    start_at = time.time() + 3.0  # every client connected and waiting
    workers = [
        ctx.Process(target=client_proc, args=(url, model, per, start_at, duration_s, q))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    while time.time() < start_at:
        time.sleep(0.001)
    cpu0, busy0, t0 = cpu_s(pid), scrape_busy_s(url), time.time()
    spying = None
    if spy:  # where the executor's CPU goes (py-spy, when installed): raw stacks per thread
        import shutil

        exe = shutil.which("py-spy")
        if exe:
            spying = subprocess.Popen(
                [exe, "record", "-p", str(pid), "-d", str(max(1, int(duration_s) - 1)),
                 "-r", "250", "-f", "raw", "-o", spy, "--nonblocking", "--threads"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
    time.sleep(duration_s)
    if spying is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            spying.wait(20)
    cpu1, busy1, t1 = cpu_s(pid), scrape_busy_s(url), time.time()
    parts = [q.get(timeout=60) for _ in workers]
    for w in workers:
        w.join(10)
    ok = sum(p["ok"] for p in parts)
    infer = np.asarray([x for p in parts for x in p["infer"] if math.isfinite(x)])
    rows = np.asarray([x for p in parts for x in p["rows"] if math.isfinite(x)])
    lat = np.asarray([x for p in parts for x in p["lat"]])
    # the scrapes cost the executor a little CPU too; two over the whole window
    return {
        "served_rps": ok / duration_s,
        "errors": sum(p["bad"] for p in parts),
        "cpu_ms_per_request": (cpu1 - cpu0) * 1000.0 / max(ok, 1),
        "gpu_busy_fraction": (busy1 - busy0) / max(t1 - t0, 1e-9),
        "batch_ms_p50": float(np.percentile(infer, 50)) if infer.size else math.nan,
        "batch_ms_p95": float(np.percentile(infer, 95)) if infer.size else math.nan,
        "rows_mean": float(rows.mean()) if rows.size else math.nan,
        "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else math.nan,
        "outstanding": per * procs,
    }


# -- one arm ------------------------------------------------------------------------------------
def run_arm(arm: str, variant: str, batch: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:  # fmt: skip
    from greenctl.executor.runtime.loadgen import run_load

    prof = profile_point(arm, variant, batch, args.profile_duration, args.device)
    proc, state = start_executor(arm, variant, batch, args.max_wait_ms, workdir, args.device)
    url = state["url"]
    try:
        spy = None
        if args.py_spy:
            Path(args.py_spy).mkdir(parents=True, exist_ok=True)
            spy = str(Path(args.py_spy) / f"spy-{arm}-b{batch}.txt")
        sat = saturate(
            url, variant, proc.pid, outstanding=max(8, 4 * batch), procs=args.client_procs,
            duration_s=args.duration, spy=spy,
        )  # fmt: skip
        # half of what this arm can do (the lower of its profile and what it served)
        rate = max(1.0, 0.5 * min(prof["throughput_rps"], sat["served_rps"] or math.inf))
        cpu0 = cpu_s(proc.pid)
        open_loop = run_load(url, variant, duration_s=args.duration, rate_rps=rate, seed=1)
        cpu1 = cpu_s(proc.pid)
    finally:
        stop(proc)
    return {
        "arm": arm,
        "variant": variant,
        "batch": batch,
        "profile": prof,
        "warmup": state.get("warmup"),
        "saturation": sat,
        "open_loop": {
            "rate_rps": rate,
            "achieved_rps": open_loop.achieved_rps,
            "p50_ms": open_loop.p50_ms,
            "p95_ms": open_loop.p95_ms,
            "errors": open_loop.errors,
            "rows_mean": open_loop.mean_batch_rows,
            # where the open-loop time went: executor queue, batch run, outside (loadgen)
            "breakdown": open_loop.breakdown,
            "cpu_ms_per_request": (cpu1 - cpu0) * 1000.0 / max(open_loop.ok, 1),
        },
        "ratios": {
            "served_over_profiled_rps": sat["served_rps"] / prof["throughput_rps"],
            "batch_p50_over_profile_p50": sat["batch_ms_p50"] / prof["p50_ms"],
        },
    }


# -- batch assembly alone: this tree's eager runner against a baseline revision's ----------------
#: the runner before batches were assembled in staging buffers (issue 22)
ASSEMBLY_BASELINE = "d221ca2"


def assembly_bench(args: argparse.Namespace) -> int:
    import random

    from bench_dispatcher import import_file, load_revision_module
    from greenctl.profiler import runner as current

    if Path(args.baseline).is_file():  # a copy of the baseline's runner.py (no git checkout)
        rev = args.baseline
        base = import_file(rev, "_runner_baseline")
    else:
        rev = subprocess.run(
            ["git", "-C", str(Path(__file__).resolve().parent.parent), "rev-parse", "--short",
             args.baseline], check=True, capture_output=True, text=True,
        ).stdout.strip()  # fmt: skip
        base = load_revision_module(rev, "profiler/runner.py", "_runner_baseline")
    if args.variant_given:
        from greenctl.profiler.models import builtin_variant, load_model

        loaded = load_model(builtin_variant(args.variant), device=args.device)
        what = f"{args.variant} on {args.device} (torch, eager)"
    else:
        from greenctl.executor.runtime.daemon import NoopModel

        loaded = NoopModel((3, 224, 224), 0.0, 1000)
        what = "no-op model (numpy, 1,000 outputs per row)"
    shape = tuple(int(d) for d in loaded.input_shape)
    rng = np.random.default_rng(0)
    sizes = [int(x) for x in args.assembly_rows.split(",")]
    bodies = [
        rng.standard_normal((1, *shape)).astype("float32").tobytes() for _ in range(max(sizes))
    ]
    views = [np.frombuffer(b, dtype="float32").reshape(1, *shape) for b in bodies]
    runners = {
        f"baseline {rev}": base.EagerRunner(loaded),
        "this tree": current.EagerRunner(loaded),
    }
    # the same answers from both (and a warm-up)
    for k in sizes:
        outs = [r.wait(r.submit(views[:k]))[0] for r in runners.values()]
        if not all(np.array_equal(outs[0], o) for o in outs[1:]):
            print(f"the arms answer differently at {k} rows", file=sys.stderr)
            return 1
    cpu = dict.fromkeys(runners, 0.0)
    wall = dict.fromkeys(runners, 0.0)
    batches = dict.fromkeys(runners, 0)
    requests = dict.fromkeys(runners, 0)
    per_block: dict[str, list[float]] = {arm: [] for arm in runners}
    loads = [os.getloadavg()[0]]
    order_rng = random.Random(1)
    for _ in range(args.blocks):
        order = list(runners)
        order_rng.shuffle(order)
        for arm in order:
            r = runners[arm]
            c0, t0 = time.thread_time(), time.perf_counter()
            n = reqs = 0
            while time.perf_counter() - t0 < args.assembly_slice:
                for k in sizes:
                    r.wait(r.submit(views[:k]))
                    n += 1
                    reqs += k
            used = time.thread_time() - c0
            cpu[arm] += used
            wall[arm] += time.perf_counter() - t0
            batches[arm] += n
            requests[arm] += reqs
            per_block[arm].append(1e6 * used / max(reqs, 1))
        loads.append(os.getloadavg()[0])
    print(
        f"# batch assembly + run, {what}; batches of {sizes} read-only request rows "
        f"({math.prod(shape) * 4:,} bytes each); {args.blocks} blocks of {args.assembly_slice:g} s per arm"
    )
    print(
        f"# {os.cpu_count()} CPUs, load average {min(loads):.2f}-{max(loads):.2f} during the run; "
        f"python {sys.version.split()[0]}"
    )
    print(f"{'arm':<18} {'CPU us/batch':>12} {'CPU us/req':>10} {'blocks us/req':>15} {'req/s':>8}")
    for arm in runners:
        blocks = np.asarray(per_block[arm])
        print(
            f"{arm:<18} {1e6 * cpu[arm] / max(batches[arm], 1):>12.1f} "
            f"{1e6 * cpu[arm] / max(requests[arm], 1):>10.1f} "
            f"{blocks.min():>7.1f}-{blocks.max():<7.1f} {requests[arm] / wall[arm]:>8.0f}"
        )
    b_arm, c_arm = list(runners)
    ratios = np.asarray(per_block[c_arm]) / np.asarray(per_block[b_arm])
    total = (cpu[c_arm] / requests[c_arm]) / (cpu[b_arm] / requests[b_arm])
    print(
        f"this tree / baseline, CPU per request: {total:.3f} (per block: median "
        f"{np.median(ratios):.3f}, min {ratios.min():.3f}, max {ratios.max():.3f})"
    )
    return 0


def fmt(x: Any, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def print_table(rows: list[dict[str, Any]], device: str) -> None:
    print(f"\n== GPU serving vs profile on {device}")
    head = (
        f"{'arm':<9} {'batch':>5} {'prof p50':>9} {'prof rps':>9} {'served':>9} {'ratio':>6} "
        f"{'CPU ms/req':>10} {'batch p50':>9} {'ratio':>6} {'rows':>5} {'GPU busy':>8} "
        f"{'open p50':>8} {'open p95':>8} {'warm s':>6} {'settled':>7}"
    )
    print(head)
    for r in rows:
        s, p, o, w = r["saturation"], r["profile"], r["open_loop"], r.get("warmup") or {}
        print(
            f"{r['arm']:<9} {r['batch']:>5} {fmt(p['p50_ms']):>9} {fmt(p['throughput_rps'], '.0f'):>9} "
            f"{fmt(s['served_rps'], '.0f'):>9} {fmt(r['ratios']['served_over_profiled_rps']):>6} "
            f"{fmt(s['cpu_ms_per_request'], '.3f'):>10} {fmt(s['batch_ms_p50']):>9} "
            f"{fmt(r['ratios']['batch_p50_over_profile_p50']):>6} {fmt(s['rows_mean'], '.1f'):>5} "
            f"{fmt(s['gpu_busy_fraction']):>8} {fmt(o['p50_ms']):>8} {fmt(o['p95_ms']):>8} "
            f"{fmt(w.get('seconds')):>6} {fmt(w.get('settled_after_s')):>7}"
        )
    print(
        "targets (issue 22): served/profiled rps >= 0.90, CPU <= 0.5 ms per request, "
        "batch p50 / profile p50 within 1.20"
    )
    for r in rows:
        b = r["open_loop"].get("breakdown")
        if b:
            parts = ", ".join(
                f"{k.removesuffix('_ms')} {b[k]['p50']:.2f} / {b[k]['p95']:.2f}"
                for k in ("queue_ms", "run_ms", "outside_ms")
            )
            print(f"{r['arm']} b{r['batch']} open loop p50 / p95 ms: {parts}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--variant", default="resnet50")
    ap.add_argument("--batch", type=int, action="append", help="batch sizes (default 8 and 1)")
    ap.add_argument("--duration", type=float, default=6.0, help="seconds of each load")
    ap.add_argument("--profile-duration", type=float, default=2.0)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--json", metavar="FILE", help="write every figure here")
    ap.add_argument(
        "--py-spy", metavar="DIR", help="record the executor's stacks during saturation here"
    )
    ap.add_argument(
        "--device", default="cuda:0", help="cuda:0; cpu only to smoke-test this script itself"
    )
    ap.add_argument("--_profile", action="store_true", help=argparse.SUPPRESS)
    asm = ap.add_argument_group("--assembly: the eager runner's batch assembly alone")
    asm.add_argument("--assembly", action="store_true", help="measure batch assembly only")
    asm.add_argument(
        "--baseline",
        default=ASSEMBLY_BASELINE,
        help="git revision to compare with, or a copy of its profiler/runner.py",
    )
    asm.add_argument("--assembly-rows", default="2,3,4,2,4,3", help="requests per batch, cycled")
    asm.add_argument("--assembly-slice", type=float, default=1.0, help="seconds per slice")
    asm.add_argument("--blocks", type=int, default=12, help="blocks of one slice per arm")
    args = ap.parse_args()
    if args.assembly:
        args.variant_given = "--variant" in sys.argv
        return assembly_bench(args)
    batches = args.batch or [8, 1]
    if args._profile:
        return profile_main(args.variant, batches[0], args.profile_duration, args.device)
    import torch

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            print("no CUDA GPU here: this benchmark needs one", file=sys.stderr)
            return 2
        device = f"{torch.cuda.get_device_name(0)} (torch {torch.__version__})"
    else:
        device = f"CPU smoke test (torch {torch.__version__}): not a GPU figure"
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="greenctl-gpu-bench-") as tmp:
        for b in batches:
            for arm in args.arms.split(","):
                t0 = time.time()
                try:
                    rows.append(run_arm(arm, args.variant, b, args, Path(tmp)))
                except Exception as exc:  # report and go on: one device window, many figures
                    print(f"{arm} b{b}: FAILED {type(exc).__name__}: {exc}", flush=True)
                    for log in Path(tmp).glob(f"exec-{arm}-{b}.log"):
                        print(log.read_text()[-3000:], flush=True)
                    continue
                print(f"{arm} b{b}: done in {time.time() - t0:.0f} s: "
                      f"{json.dumps(rows[-1]['ratios'])}", flush=True)  # fmt: skip
                if args.json:
                    Path(args.json).write_text(
                        json.dumps({"device": device, "rows": rows}, indent=1)
                    )
    print_table(rows, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
