"""Benchmark generated variants: eager torch against ONNX Runtime fp32 and int8, one run.

    python bench/bench_variants.py [--model cnn|resnet18] [--duration S] [--samples N]

Runs ``greenctl variants generate`` (as a user would, in a scratch folder with its own store)
on a small CNN (3x32x32, 10 classes) or ResNet-18 (3x224x224, random weights, seeded) and
prints per variant: accuracy, file size, p50 latency and throughput at batch 1 and 8 on
cpu:1, J/request (modeled on CPUs), and each figure's ratio to NAME-torch measured in the
same run. The weights are not trained, so the evaluation labels are the fp32 model's own
answers: "accuracy" is top-1 agreement with the fp32 model (1.0 for an exact engine, the
int8 loss otherwise). The load average is printed: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MODULE = """
import torch

SHAPE = {shape}


def build():
    torch.manual_seed(0)
    if {resnet}:
        from greenctl.profiler.models import build_builtin
        return build_builtin("resnet18")
    n = torch.nn
    return n.Sequential(
        n.Conv2d(3, 32, 3, padding=1), n.ReLU(), n.MaxPool2d(2),
        n.Conv2d(32, 64, 3, padding=1), n.ReLU(), n.MaxPool2d(2),
        n.Conv2d(64, 64, 3, padding=1), n.ReLU(), n.MaxPool2d(2),
        n.Flatten(), n.Linear(64 * 4 * 4, 128), n.ReLU(), n.Linear(128, 10),
    )


def evaluate():
    x = torch.rand({samples}, *SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = build().eval()(x).argmax(1)
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("cnn", "resnet18"), default="cnn")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per point")
    ap.add_argument("--samples", type=int, default=256, help="evaluation samples")
    args = ap.parse_args(argv)
    resnet = args.model == "resnet18"
    shape = (3, 224, 224) if resnet else (3, 32, 32)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-variants-") as tmp:
        work = Path(tmp)
        (work / "benchmodel.py").write_text(
            MODULE.format(shape=shape, resnet=resnet, samples=args.samples)
        )
        cmd = [
            sys.executable, "-m", "greenctl.cli.main", "variants", "generate",
            "--model-path", "benchmodel:build", "--eval", "benchmodel:evaluate",
            "--input-shape", ",".join(map(str, shape)), "--name", f"my{args.model}",
            "--batch", "1,8", "--duration", str(args.duration), "--db", str(work / "g.db"),
            "--json",
        ]  # fmt: skip
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stderr, file=sys.stderr)
            return done.returncode
        doc = json.loads(done.stdout)
    print(
        f"# bench_variants: {args.model} {shape}, cpu:1, {args.duration:g} s per point, "
        f"{args.samples} eval samples; load average {load0:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end ({os.cpu_count()} CPUs)"
    )
    _table(doc, f"my{args.model}-torch")
    for s in doc["skipped"]:
        print(f"skipped {s['variant']}: {s['reason']}")
    return 0


def _table(doc: dict, base: str) -> None:
    """One row per variant; ``x`` columns are ratios to the torch variant's figure."""
    prof = {(p["variant"], p["batch"]): p for p in doc["profiles"]}
    print(
        f"{'variant':<16}{'acc':>7}{'size MB':>9}{'p50 b1 ms':>11}{'x':>6}{'req/s b1':>10}"
        f"{'x':>6}{'p50 b8 ms':>11}{'x':>6}{'req/s b8':>10}{'x':>6}{'J/req b8':>10}"
    )
    for v in doc["variants"]:
        name = v["name"]
        row = [f"{name:<16}{v['accuracy']:>7.3f}"]
        size = (v["size_bytes"] or v["memory_mb"] * 2**20) / 2**20
        row.append(f"{size:>9.2f}")
        for b in (1, 8):
            p, t = prof[(name, b)], prof[(base, b)]
            row.append(f"{p['latency_p50_ms']:>11.3f}")
            row.append(f"{p['latency_p50_ms'] / t['latency_p50_ms']:>6.2f}")
            row.append(f"{p['throughput_rps']:>10.0f}")
            row.append(f"{p['throughput_rps'] / t['throughput_rps']:>6.2f}")
        row.append(f"{prof[(name, 8)]['energy_j'] or float('nan'):>10.4f}")
        print("".join(row))


if __name__ == "__main__":
    raise SystemExit(main())
