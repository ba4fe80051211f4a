"""Benchmark the profiler: time per point, per-request latency at 1 and 2 cores, ratios.

    python bench/bench_profile.py [--quick] [--duration S]

For tiny-s/m/l and resnet18 (batch 1) on cpu:1 and cpu:2 it prints the harness's p50
per-request latency, the wall time one point costs (warm-up + measurement + energy meter),
the speed-up cpu:1 -> cpu:2, and the harness overhead against a bare timing loop measured
in the same run on the same slice (baseline). The load average is printed because the
machine may be shared: read the figures with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs, tiny-s and resnet18 only")
    ap.add_argument("--duration", type=float, default=None, help="seconds per point")
    args = ap.parse_args(argv)

    import torch
    from greenctl.profiler.energy import cpu_meter
    from greenctl.profiler.harness import cpu_slice, measure, percentile
    from greenctl.profiler.hw import cpu_info
    from greenctl.profiler.models import builtin_variant, load_model

    info = cpu_info()
    duration = args.duration or (0.5 if args.quick else 2.0)
    names = ["tiny-s", "resnet18"] if args.quick else ["tiny-s", "tiny-m", "tiny-l", "resnet18"]
    cores = [c for c in (1, 2) if c <= len(info.usable_cores)]
    print(
        f"# bench_profile: {info.model_name}, {len(info.usable_cores)} usable cores, "
        f"torch {torch.__version__}, {duration:.1f} s per point, "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    print(
        f"{'variant':10} {'res':6} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>9} "
        f"{'point s':>8} {'bare p50':>9} {'overhead':>9} {'J/req':>9} energy"
    )
    p50s: dict[tuple[str, int], float] = {}
    for name in names:
        loaded = load_model(builtin_variant(name))
        for n in cores:
            with cpu_slice(n):
                t0 = time.perf_counter()
                m = measure(
                    loaded,
                    batch=1,
                    duration_s=duration,
                    warmup=3,
                    meter=cpu_meter(n, total_cores=info.logical_cores, rapl=info.rapl_files),
                )
                point_s = time.perf_counter() - t0
                # baseline: a bare loop of the same forward pass, no harness around it
                x = loaded.example(1)
                bare = []
                end = time.perf_counter() + min(duration, 1.0)
                while time.perf_counter() < end or len(bare) < 3:
                    s = time.perf_counter()
                    with torch.inference_mode():
                        loaded.module(x)
                    bare.append((time.perf_counter() - s) * 1000)
            p = m.to_profile(name, f"cpu:{n}", None)
            bare_p50 = statistics.median(bare)
            p50s[(name, n)] = percentile(m.latencies_ms, 50)
            print(
                f"{name:10} cpu:{n:<2} {p.latency_p50_ms:9.3f} {p.latency_p99_ms:9.3f} "
                f"{p.throughput_rps:9.1f} {point_s:8.2f} {bare_p50:9.3f} "
                f"{p.latency_p50_ms / bare_p50:8.2f}x {p.energy_j:9.4f} {p.energy_method}"
            )
    if len(cores) == 2:
        print("\n# speed-up of p50 from cpu:1 to cpu:2 (>1 means two cores are faster)")
        for name in names:
            print(f"{name:10} {p50s[(name, 1)] / p50s[(name, 2)]:.2f}x")
    print(f"# load average {os.getloadavg()[0]:.2f} at end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
