"""Cold-start CPU of everyday ``greenctl`` commands, each as a ratio to ``greenctl --help``.

Run: ``python bench/bench_cold.py [--reps N] [--keep DIR] [--baseline REF]``.

Prepares a temporary store the way the README's tour does (the tiny family measured on one
core with few requests, the bundled Clover CISO trace, one saved mix plan), then runs each
command as a fresh process of the installed ``greenctl`` entry point ``--reps`` times and
takes the median user+sys CPU of the child (``resource.getrusage(RUSAGE_CHILDREN)``), so
start-up imports count and the machine's other load mostly does not. Every figure is
printed beside ``--help``'s from the same run, with the load average, and the heavy
modules (pandas, scipy, sqlite_utils, ...) each command loaded. ``--baseline REF`` runs the
same commands on the same store with the code of git commit REF too (its tree extracted
with ``git archive`` and put first on ``PYTHONPATH``), interleaved with the working tree's,
and prints both arms with their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: modules a command should load only when it uses them
HEAVY = (
    "pandas",
    "scipy.optimize",
    "scipy.special",
    "scipy.stats",
    "scipy",
    "sqlite_utils",
    "matplotlib",
    "torch",
    "onnxruntime",
    "ray",
    "highspy",
    "numpy",
)

#: what a run of the entry point reports on stderr's last line: the heavy modules it loaded
_PROBE = (
    "import sys\n"
    "from greenctl.cli.main import main\n"
    "sys.argv = ['greenctl', *sys.argv[1:]]\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    f"print('loaded:', ','.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
)

AT = "2021-03-01T08:00:00Z"
MIX = [
    "plan", "mix", "--model", "tiny", "--rate", "20", "--slo-ms", "100",
    "--budget", "cpu=1", "--region", "CISO", "--at", AT,
]  # fmt: skip


def commands(folder: Path) -> list[tuple[str, list[str]]]:
    """(label, argv after ``greenctl``) of the measured commands; ``--help`` first."""
    plan = str(folder / "plan.json")
    return [
        ("--help", ["--help"]),
        ("plan mix (tiny)", [*MIX, "-o", str(folder / "again.json")]),
        ("profile list", ["profile", "list"]),
        ("status --json", ["status", "--json"]),
        ("plan list", ["plan", "list"]),
        ("plan show 1", ["plan", "show", "1"]),
        ("carbon regions", ["carbon", "regions"]),
        ("carbon show --at", ["carbon", "show", "--region", "CISO", "--at", AT]),
        ("simulate plan.json", ["simulate", plan, "--rate", "30"]),
    ]


def greenctl() -> str:
    """The installed entry point beside this interpreter (the venv's), else the PATH's."""
    here = Path(sys.executable).parent / "greenctl"
    found = str(here) if here.exists() else shutil.which("greenctl")
    if not found:
        sys.exit("greenctl is not installed (pip install -e . in the venv)")
    return found


def run(argv: list[str], env: dict[str, str], *, check: bool = False) -> float:
    """CPU seconds (user + sys) one child process took."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if check and done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def prepare(folder: Path, env: dict[str, str]) -> None:
    """The tour's store: the tiny family on cpu:1, the CISO trace, plan 1 in ``plan.json``."""
    exe = greenctl()
    print("preparing the store (profiles the tiny family briefly) ...", flush=True)
    run([exe, "profile", "--requests", "20", "--warmup", "1"], env, check=True)
    run([exe, "carbon", "import", "bundled:clover-ciso-march"], env, check=True)
    run([exe, *MIX, "-o", str(folder / "plan.json")], env, check=True)


def loaded(argv: list[str], env: dict[str, str]) -> str:
    """The heavy modules a run of ``greenctl argv`` loaded."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, *argv], env=env, capture_output=True, text=True
    )
    last = done.stderr.strip().splitlines()[-1:] or [""]
    return last[0].removeprefix("loaded:").strip() if last[0].startswith("loaded:") else "?"


def baseline_env(ref: str, folder: Path, env: dict[str, str]) -> dict[str, str]:
    """An environment whose ``greenctl`` is the package as of git commit ``ref``."""
    repo = Path(__file__).resolve().parent.parent
    tree = folder / "greenctl"
    tree.mkdir()
    archive = folder / "baseline.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(repo), "archive", ref], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return {**env, "PYTHONPATH": os.pathsep.join([str(tree.parent), env.get("PYTHONPATH", "")])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="runs of each command (median)")
    ap.add_argument("--keep", type=Path, help="prepare the store in DIR and keep it")
    ap.add_argument("--baseline", metavar="REF", help="also run the code of git commit REF")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="greenctl-cold-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GREENCTL_DB": str(folder / "cold.db"), "NO_COLOR": "1"}
    env.pop("PYTHONPROFILEIMPORTTIME", None)
    scratch = Path(tempfile.mkdtemp(prefix="greenctl-cold-baseline-"))
    try:
        if not (folder / "plan.json").exists():
            prepare(folder, env)
        arms = {"now": env}
        if args.baseline:
            label = f"baseline {args.baseline[:12]}"
            arms = {label: baseline_env(args.baseline, scratch, env), **arms}
        measure(commands(folder), arms, args.reps)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def measure(cmds: list[tuple[str, list[str]]], arms: dict[str, dict[str, str]], reps: int) -> None:
    """Run every command of every arm ``reps`` times, interleaved (so drifting load hits
    every command alike), and print each arm's medians, ratios and heavy modules."""
    exe = greenctl()
    samples = {(arm, label): [] for arm in arms for label, _ in cmds}
    for _ in range(reps):
        for label, argv in cmds:
            for arm, arm_env in arms.items():
                samples[arm, label].append(run([exe, *argv], arm_env))
    print(f"load average {os.getloadavg()[0]:.2f} (1 min), {reps} runs each, median CPU s")
    for arm, arm_env in arms.items():
        base = statistics.median(samples[arm, "--help"])
        print(f"\n[{arm}]\n{'command':<22}{'CPU s':>8}{'x --help':>10}  heavy modules loaded")
        for label, argv in cmds:
            cpu = statistics.median(samples[arm, label])
            mods = loaded(argv, arm_env)
            print(f"{label:<22}{cpu:>8.3f}{cpu / base:>10.2f}  {mods or '-'}")
    if len(arms) == 2:
        (old, _), (new, _) = arms.items()
        print(f"\n{'command':<22}{'CPU s, ' + old + ' -> ' + new}  (ratio)")
        for label, _ in cmds:
            a = statistics.median(samples[old, label])
            b = statistics.median(samples[new, label])
            print(f"{label:<22}{a:>7.3f} -> {b:<7.3f} ({b / a:.2f})")


if __name__ == "__main__":
    main()
