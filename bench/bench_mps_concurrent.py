"""Emulated MIG slices measured together: does one slice's stored energy hold when all run?

Run on a machine with an NVIDIA GPU whose MIG geometry greenctl knows (H100, H200, A100):

    python bench/bench_mps_concurrent.py                                  # efficientnet-b7, 1g x 7
    python bench/bench_mps_concurrent.py --variant resnet50 --slices 1 --json out.json

``greenctl profile --gpus --emulate-mig`` measures each emulated slice alone, as an MPS client
at the slice's active-thread percentage (:func:`greenctl.data.mig_geometry.mps_percentage`),
and charges it the slice's share of the card's idle power and all the power above idle
(``nvml-attributed``, :func:`greenctl.profiler.energy.attributed_energy_j`): alone, the slice
caused all of it. Before that rule it was charged the slice's share of the whole card's
energy, which left most of the slice's dynamic power out. This bench, which settled the rule,
runs, in one process tree on the same GPU, three arms for each variant:

1. ``whole``: one client on the whole GPU, without MPS;
2. ``solo``: one MPS client at the slice's percentage (what ``--emulate-mig`` stores);
3. ``together``: as many MPS clients at that percentage as the card has such slices, started
   together: the card's power while every slice is busy, and each client's throughput beside
   its solo throughput (interference: MPS splits SMs, not memory bandwidth or L2).

Each arm loads its models, settles the card's idle power with the models loaded, then runs
closed loops (batch after batch, the host waiting on each) for ``--duration`` seconds, timed
by the NVML energy counter. It starts its own MPS control daemon for arms 2 and 3 and stops it
afterwards (:func:`greenctl.profiler.mps.mps_session`); it changes no GPU setting.

Printed per variant: the card's power in each arm, and one slice's power and energy per
request three ways: by the old rule (solo card power x share), as greenctl stores it (the
rule above, from the solo arm) and as measured together (card power / clients).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def child(args: argparse.Namespace) -> int:
    """One client: load, warm up, say ready, wait for the go time, run closed loops."""
    import torch
    from greenctl.profiler.models import builtin_variant, load_model

    loaded = load_model(builtin_variant(args.variant), device=args.device)
    x = loaded.example(args.batch)
    for _ in range(args.warmup):
        loaded.run(x)
    Path(args.ready).write_text("ready")
    go = Path(args.go)
    while not go.exists():
        time.sleep(0.005)
    start_at = float(go.read_text())
    while time.time() < start_at:
        time.sleep(0.001)
    end_at = start_at + args.duration
    lat: list[float] = []
    t = time.perf_counter()
    while time.time() < end_at:
        loaded.run(x)
        t2 = time.perf_counter()
        lat.append((t2 - t) * 1000.0)
        t = t2
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    Path(args.out).write_text(
        json.dumps({"batches": len(lat), "batch_ms_p50": statistics.median(lat) if lat else None})
    )
    return 0


def run_arm(
    variant: str,
    batch: int,
    clients: int,
    pct: int | None,
    client_env: dict[str, str],
    duration: float,
    backend: Any,
    warmup: int,
    device: str,
) -> dict[str, Any]:
    """``clients`` children at ``pct`` (None: no MPS); the card's energy over their window."""
    from greenctl.profiler.energy import NvmlEnergyMeter

    work = Path(tempfile.mkdtemp(prefix="greenctl-mps-bench-"))
    go = work / "go"
    procs = []
    for i in range(clients):
        env = {**os.environ, **client_env}
        env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
        if pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        cmd = [sys.executable, __file__, "--_child", "--variant", variant, "--batch", str(batch),
               "--duration", str(duration), "--warmup", str(warmup), "--device", device, "--ready",
               str(work / f"ready{i}"), "--go", str(go), "--out", str(work / f"out{i}.json")]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env))
    deadline = time.time() + 300
    while not all((work / f"ready{i}").exists() for i in range(clients)):
        if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
            for p in procs:
                p.kill()
            raise SystemExit(f"{variant}: a client failed before it was ready")
        time.sleep(0.05)
    meter = NvmlEnergyMeter(backend, 0)
    idle = meter.settle_idle(max_s=6.0)
    start_at = time.time() + 0.5
    go.write_text(repr(start_at))
    time.sleep(max(start_at - time.time(), 0))
    meter.start()
    time.sleep(duration)
    reading = meter.stop(requests=1)
    for p in procs:
        p.wait(timeout=120)
    outs = [json.loads((work / f"out{i}.json").read_text()) for i in range(clients)]
    rps = [o["batches"] * batch / duration for o in outs]
    return {
        "clients": clients,
        "mps_percentage": pct,
        "card_power_w": reading.power_w,
        "card_idle_w": idle,
        "rps_per_client": rps,
        "rps_total": sum(rps),
        "batch_ms_p50": [o["batch_ms_p50"] for o in outs],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--variant", action="append", help="built-in variants (default efficientnet-b7)"
    )
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--slices", type=int, default=1, help="compute slices of the emulated slice")
    ap.add_argument("--clients", type=int, help="clients together (default: the card's count)")
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--device", default="cuda:0", help=argparse.SUPPRESS)  # cpu: a dry run
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        args.variant = args.variant[0]
        return child(args)

    from greenctl.data.mig_geometry import find_gpu, mps_percentage
    from greenctl.profiler.device import get_backend
    from greenctl.profiler.energy import attributed_energy_j
    from greenctl.profiler.mps import mps_session

    backend = get_backend()
    if backend is None:
        raise SystemExit("no NVIDIA GPU: this bench needs one")
    gpu = backend.gpus()[0]
    geo = find_gpu(gpu.name)
    if geo is None:
        raise SystemExit(f"greenctl knows no MIG geometry for {gpu.name}")
    pct = mps_percentage(geo, args.slices)
    share = pct / 100.0
    clients = args.clients or geo.compute_slices // args.slices
    print(f"{gpu.name} (driver {backend.driver_version()}): {args.slices}g slice = MPS {pct} %, "
          f"{clients} clients together; batch {args.batch}, {args.duration:g} s per arm")  # fmt: skip
    results: dict[str, Any] = {"gpu": gpu.name, "driver": backend.driver_version(), "pct": pct,
                               "clients": clients, "batch": args.batch, "variants": {}}  # fmt: skip
    notes: list[str] = []
    for variant in args.variant or ["efficientnet-b7"]:

        def run(
            n: int, p: int | None, env: dict[str, str], variant: str = variant
        ) -> dict[str, Any]:
            return run_arm(
                variant, args.batch, n, p, env, args.duration, backend, args.warmup, args.device
            )

        whole = run(1, None, {})
        with mps_session(existing_pipe=None, gpu_uuids=[gpu.uuid], notes=notes) as daemon:
            solo = run(1, pct, daemon.client_env())
            together = run(clients, pct, daemon.client_env())
        idle = solo["card_idle_w"] or 0.0
        old_w = solo["card_power_w"] * share
        stored_w = attributed_energy_j(solo["card_power_w"], idle, 1.0, share)  # W over 1 s
        measured_w = together["card_power_w"] / clients
        solo_rps = solo["rps_total"]
        each_rps = together["rps_total"] / clients
        row = {
            "whole": whole, "solo": solo, "together": together,
            "slice_power_w": {"old_rule": old_w, "stored": stored_w, "together": measured_w},
            "slice_j_per_request": {
                "old_rule": old_w / solo_rps, "stored": stored_w / solo_rps,
                "together": measured_w / each_rps,
            },
            "together_rps_over_solo": each_rps / solo_rps,
            "slices_rps_over_whole": together["rps_total"] / whole["rps_total"],
        }  # fmt: skip
        results["variants"][variant] = row
        print(f"\n{variant}")
        for name, arm in (("whole", whole), ("solo", solo), ("together", together)):
            print(f"  {name:9s} clients {arm['clients']}: card {arm['card_power_w']:6.1f} W "
                  f"(idle {arm['card_idle_w'] or 0:5.1f} W), {arm['rps_total']:8.1f} req/s, "
                  f"batch p50 {statistics.median(arm['batch_ms_p50']):.2f} ms")  # fmt: skip
        print(f"  one slice: power by the old rule {old_w:.1f} W, stored {stored_w:.1f} W, "
              f"measured together {measured_w:.1f} W (together / stored "
              f"{measured_w / stored_w:.2f}, / old rule {measured_w / old_w:.2f})")  # fmt: skip
        j = row["slice_j_per_request"]
        print(f"  one slice: J per request by the old rule {j['old_rule']:.3f}, stored "
              f"{j['stored']:.3f}, together {j['together']:.3f} (together / stored "
              f"{j['together'] / j['stored']:.2f})")  # fmt: skip
        print(f"  throughput per slice together / solo {row['together_rps_over_solo']:.2f}; "
              f"{clients} slices / whole GPU {row['slices_rps_over_whole']:.2f}")  # fmt: skip
    for n in notes:
        print("note:", n)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
