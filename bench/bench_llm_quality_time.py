"""Quality Time on measured LLM tiers: shares of requests per quality tier that follow the
grid's carbon intensity, against the largest tier, the smallest tier meeting the SLOs and a
static share at greenctl's own average quality, over a day of CAISO's signal.

    python bench/bench_llm_quality_time.py [--duration S] [--rate RPS] [--gamma G]

As a user would, in a scratch folder with its own store: three random-weight Llama tiers are
made locally (tiny, small, medium; qualities declared 0.55, 0.75, 0.9: random weights have
no quality of their own), each is measured by ``greenctl profile llm`` on a real
``transformers serve`` pinned to one core (energy modeled: no RAPL here), then ``greenctl
replay llm`` replays a balanced request over 2021-03-01 of CAISO (bundled) at a flat rate.
Replay figures are modeled from the measured profiles. Printed: each policy's quality,
energy, carbon and SLO misses; greenctl's carbon against the static share at the same
quality; and how much of that is timing alone (greenctl's own energy at the day's mean
intensity), Quality Time's effect (the paper: up to 10 % less carbon). The machine's load is
printed: the profiles are measured on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

TIERS = (
    ("llama-tiny", "tiny", 0.55),
    ("llama-small", "small", 0.75),
    ("llama-medium", "medium", 0.9),
)
DAY = ("--region", "CISO", "--from", "2021-03-01T00:00:00Z", "--hours", "24", "--every", "1h",
       "--min-dwell", "0")  # fmt: skip


def greenctl(work: Path, *args: str) -> dict:
    """Run one greenctl command with --json in ``work``'s store; its document."""
    env = {**os.environ, "GREENCTL_DB": str(work / "greenctl.db")}
    exe = Path(sys.executable).with_name("greenctl")
    proc = subprocess.run([str(exe), *args, "--json"], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"greenctl {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def profile_tiers(work: Path, duration: float) -> list[dict]:
    """Make and measure the three tiers; their stored rows."""
    from greenctl.profiler.llm_models import random_llama

    rows = []
    for name, size, quality in TIERS:
        made = random_llama(work / name, size)
        doc = greenctl(
            work, "profile", "llm", "--engine", "transformers", "--model-dir", str(work / name),
            "--name", name, "--family", "llama", "--quality", str(quality), "--cpus", "1",
            "--concurrency", "1,2,4", "--duration", str(duration),
        )  # fmt: skip
        for row in doc["profiles"]:
            rows.append({**row, "params": made["params"]})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per concurrency")
    ap.add_argument("--rate", type=float, default=2.0, help="requests per second, all day")
    ap.add_argument(
        "--gamma", type=float, default=0.3, help="the balanced objective's carbon weight"
    )
    ap.add_argument("--ttft-ms", type=float, default=3000.0)
    ap.add_argument("--tpot-ms", type=float, default=150.0)
    args = ap.parse_args(argv)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="greenctl-qt-") as tmp:
        work = Path(tmp)
        rows = profile_tiers(work, args.duration)
        print(f"Profiles (measured on cpu:1, energy modeled; load {load0:.1f} -> "
              f"{os.getloadavg()[0]:.1f}):")  # fmt: skip
        print(f"{'tier':14} {'params':>10} {'conc':>4} {'TTFT p95':>9} {'TPOT p95':>9} "
              f"{'tok/s':>7} {'J/req':>7}")  # fmt: skip
        for r in rows:
            j = (r["prefill_j_per_token"] or 0) * (r["prompt_tokens"] or 0) + (
                r["decode_j_per_token"] or 0
            ) * (r["output_tokens"] or 0)
            print(f"{r['variant']:14} {r['params']:>10,} {r['concurrency']:>4} "
                  f"{r['ttft_p95_ms']:>9.1f} {r['tpot_p95_ms'] or 0:>9.2f} "
                  f"{r['output_tokens_per_s']:>7.1f} {j:>7.3f}")  # fmt: skip
        greenctl(work, "carbon", "import", "bundled:clover-ciso-march", "--region", "CISO")
        (work / "load.txt").write_text(" ".join([f"{args.rate:g}"] * 86400) + "\n")
        request = {"model": "llama", "rate_rps": args.rate, "ttft_ms": args.ttft_ms,
                   "tpot_ms": args.tpot_ms, "prompt_tokens": 64, "output_tokens": 32,
                   "budget": {"cpu": 8}, "objective": "balanced", "gamma": args.gamma}  # fmt: skip
        (work / "request.json").write_text(json.dumps(request))
        out = greenctl(work, "replay", "llm", "--request", str(work / "request.json"),
                       "--load-trace", str(work / "load.txt"), *DAY)  # fmt: skip
    by = {s["policy"]: s for s in out["summary"]}
    print(f"\nReplay of a day (CAISO 2021-03-01, {args.rate:g} req/s, p95 TTFT "
          f"{args.ttft_ms:g} ms, TPOT {args.tpot_ms:g} ms, balanced gamma {args.gamma:g}; "
          "modeled from the profiles):")  # fmt: skip
    print(f"{'policy':10} {'quality':>8} {'kWh':>8} {'gCO2':>8} {'SLO miss %':>10} {'changes':>8}")
    for name, s in by.items():
        print(f"{name:10} {s['accuracy']:>8.3f} {s['energy_kwh']:>8.3f} {s['carbon_g']:>8.1f} "
              f"{s['violation_pct']:>10.2f} {s['changes']:>8}")  # fmt: skip
    green, static = by["greenctl"], by["static"]
    rows_g = out["intervals"]["greenctl"]
    mean_ci = sum(r["carbon_g_per_kwh"] for r in rows_g) / len(rows_g)
    flat = green["energy_kwh"] * mean_ci
    print(f"\ngreenctl vs static share at the same quality ({green['accuracy']:.3f} vs "
          f"{static['accuracy']:.3f}): {1 - green['carbon_g'] / static['carbon_g']:.1%} less "
          f"carbon, {1 - green['energy_kwh'] / static['energy_kwh']:.1%} less energy")  # fmt: skip
    print(f"timing alone (greenctl's energy at the day's mean {mean_ci:.0f} g/kWh would emit "
          f"{flat:.1f} g): {1 - green['carbon_g'] / flat:.1%} less carbon "
          "(Quality Time: up to 10 %)")  # fmt: skip
    print(f"vs largest tier: {1 - green['carbon_g'] / by['largest']['carbon_g']:.1%} less carbon "
          f"at {by['largest']['accuracy'] - green['accuracy']:.3f} less quality")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
