"""Reproduce the papers' headline figures: each paper's benches, one run.

    python bench/reproduce.py [--only NAME] [--out DIR] [--list]

Runs, one after another, the benches that ``docs/reproductions.md`` quotes (Clover, gpulet,
eGLB, InfAdapter, INFaaS, Quality Time), each with a time limit (quick modes where a full run is long),
and writes each bench's whole output to ``DIR/<name>.txt`` (default ``bench/results/reproduce-<date>``)
with the machine's load before and after it. It prints one line per bench (exit code, wall
time, load) and exits 1 when a bench fails or runs past its limit. The whole run is sized for
about 15 minutes on 2 cores; ``--only`` runs the benches whose name contains a word.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Bench:
    """One bench of the table: the paper it reproduces, its command, its time limit (s)."""

    name: str
    paper: str
    argv: tuple[str, ...]
    limit_s: float


BENCHES = (
    Bench("clover", "Clover", ("bench_clover.py", "--no-h200"), 240),
    Bench("clover-mig-solvers", "Clover", ("bench_mig.py", "--quick"), 180),
    Bench("gpulet-interference", "gpulet", ("bench_interference.py",), 120),
    Bench("gpulet-glet", "gpulet", ("bench_glet.py",), 240),
    Bench("eglb", "eGLB", ("bench_geo.py", "--quick", "--no-pulp"), 120),
    Bench("infadapter-bursty", "InfAdapter", ("bench_infadapter_bursty.py",), 300),
    Bench("infaas-loadchange", "INFaaS", ("bench_infaas_loadchange.py",), 120),
    Bench("infaas-variants", "INFaaS", ("bench_variants.py", "--duration", "1"), 120),
    Bench("quality-time", "Quality Time", ("bench_llm_quality_time.py", "--duration", "3"), 240),
)


def load() -> str:
    """The 1-minute load average, as the benches print it."""
    return f"{os.getloadavg()[0]:.1f}"


def run(bench: Bench, out_dir: Path) -> tuple[int, float]:
    """Run one bench with its limit; its output (and the load around it) into its file.
    Returns (exit code, 124 past the limit; wall seconds)."""
    path = out_dir / f"{bench.name}.txt"
    before, t0 = load(), time.perf_counter()
    cmd = [sys.executable, str(HERE / bench.argv[0]), *bench.argv[1:]]
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=bench.limit_s, cwd=HERE.parent
        )
        code, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = 124
        text = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        text += f"\n(stopped after its limit of {bench.limit_s:g} s)\n"
    wall = time.perf_counter() - t0
    head = f"# {bench.paper}: python bench/{' '.join(bench.argv)}\n"
    tail = f"\n# exit {code}, {wall:.1f} s wall, load {before} -> {load()}\n"
    path.write_text(head + text + tail)
    return code, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run the benches whose name contains this")
    ap.add_argument("--out", type=Path, default=None, help="folder for the outputs")
    ap.add_argument("--list", action="store_true", help="list the benches and stop")
    args = ap.parse_args()
    chosen = [b for b in BENCHES if args.only is None or args.only in b.name]
    if args.list or not chosen:
        for b in BENCHES:
            print(f"{b.name:22} {b.paper:12} python bench/{' '.join(b.argv)}")
        return 0 if args.list else 2
    out_dir = args.out or HERE / "results" / f"reproduce-{dt.date.today().isoformat()}"
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"reproducing {len(chosen)} benches into {out_dir} (load {load()}, {os.cpu_count()} CPUs)"
    )
    failed, total = [], 0.0
    for bench in chosen:
        code, wall = run(bench, out_dir)
        total += wall
        state = "ok" if code == 0 else ("past its limit" if code == 124 else f"exit {code}")
        print(f"  {bench.paper:12} {bench.name:22} {wall:7.1f} s  load {load():>5}  {state}")
        if code != 0:
            failed.append(bench.name)
    print(f"{total:.0f} s in all; outputs in {out_dir}")
    if failed:
        print(f"failed: {', '.join(failed)} (see their files)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
