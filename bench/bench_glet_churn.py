"""How often `greenctl replan` changes a glet plan, before and after the headroom rule (issue 18).

Ten gpulet reference models (bench_glet's SLOs, rates 100-300 req/s), replanned every round
through the library twin of `greenctl replan --plan ID --rate MODEL=RPS ...` (no apply: a
proposed plan becomes the running one, as if applied; `--min-dwell 0`, so the rule alone
decides). Scenarios, seeded:

- noise: each model's rate is its base rate x U(0.7, 1.3), independently every round;
- walk: each model's rate is the previous round's x U(0.7, 1.3), as in bench_glet's replan
  timing (kept within 10 req/s and twice the base rate);
- step up: base rates for 5 rounds (+-5 % noise), then doubled: the first doubled round must
  change the plan;
- step down: twice the base rates for 5 rounds, then the base rates: GPUs are given back.

Rules, side by side on the same rates:

- before: a change when the GPU count changes or more than `--threshold` (0.05) of the glets
  move, new layouts packed at the rates themselves;
- after: a running layout that cannot carry the new rates is replaced (as before); otherwise
  a change only when it saves at least one GPU and more than `--threshold` of them while
  carrying the rates + the replan headroom (`GLET_REPLAN_HEADROOM`); every new layout is
  packed with that headroom.

Printed per scenario and rule: changes, of which forced (the running layout could not carry
the round's rates), glets started or stopped, GPU-rounds (the sum over rounds of the GPUs the
running plan takes: what the headroom costs) and the most GPUs. Everything is modeled by the
planner (duty-cycle rule, interference model); no GPU is used.

Run: python bench/bench_glet_churn.py [--rounds 40] [--seeds 3] [--headroom 0.3]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_glet import DATA, ORDER, SLO_MS
from greenctl.data.gpulet_import import import_gpulet
from greenctl.data.plan import Plan
from greenctl.data.store import open_store

Rates = dict[str, float]


def _old_triggers(running: Plan, new: Plan, threshold: float) -> tuple[list[str], str]:
    """The rule before: the GPU count changes or more than ``threshold`` of the glets move."""
    from greenctl.planner.glet.moves import layout_moves

    out = []
    if running.predicted.get("gpus") != new.predicted.get("gpus"):
        out.append("GPUs change")
    moved, total = layout_moves(running.extra.get("gpus") or [], new.extra.get("gpus") or [])
    if total and moved / total > threshold:
        out.append(f"{moved} of {total} glets move")
    return out, "not worth"


def scenario_rates(name: str, base: Rates, rounds: int, rng: random.Random) -> list[Rates]:
    out: list[Rates] = []
    rates = dict(base)
    for t in range(rounds):
        if name == "noise":
            rates = {m: r * rng.uniform(0.7, 1.3) for m, r in base.items()}
        elif name == "walk":
            rates = {  # within 10 req/s and 2x the base, so 16 GPUs always do
                m: min(2 * base[m], max(10.0, r * rng.uniform(0.7, 1.3))) for m, r in rates.items()
            }
        else:
            scale = (1.0 if t < 5 else 2.0) if name == "step up" else (2.0 if t < 5 else 1.0)
            rates = {m: r * scale * rng.uniform(0.95, 1.05) for m, r in base.items()}
        out.append(rates)
    return out


def run_rounds(
    store: Any, plan_id: int, series: list[Rates], *, threshold: float
) -> dict[str, Any]:
    """Replan every round at its rates; a proposed plan becomes the running one."""
    from greenctl.executor.control import replan

    changes = forced = moved = gpu_rounds = most = 0
    at: list[int] = []
    for t, rates in enumerate(series):
        running = store.get_plan(plan_id)
        d = replan.replan_once(
            store, plan=str(plan_id), min_dwell_s=0, rates=rates, threshold=threshold
        )
        carries = d["old_objective"] is not None  # the running layout scored at these rates
        if d["action"] == "propose":
            from greenctl.planner.glet.moves import layout_moves

            new = store.get_plan(int(d["new_plan_id"]))
            moved += layout_moves(running.extra["gpus"], new.extra["gpus"])[0]
            changes += 1
            forced += not carries
            at.append(t)
            plan_id = new.id
        gpus = int(store.get_plan(plan_id).predicted["gpus"])
        gpu_rounds += gpus
        most = max(most, gpus)
    return {
        "changes": changes,
        "forced": forced,
        "moved": moved,
        "gpu_rounds": gpu_rounds,
        "most": most,
        "at": at,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--seeds", type=int, default=3, help="rate series per scenario")
    ap.add_argument("--threshold", type=float, default=0.05, help="replan --threshold")
    ap.add_argument("--headroom", type=float, default=None, help="after: replan_headroom")
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args(argv)

    from greenctl.executor import kinds
    from greenctl.executor.control.interference import fit_and_store

    glet = kinds.get_kind("glet")
    headroom = kinds.GLET_REPLAN_HEADROOM if args.headroom is None else args.headroom
    before = replace(glet, triggers=_old_triggers)
    rules: dict[str, tuple[Any, float]] = {"before": (before, 0.0), "after": (glet, headroom)}
    scenarios = ("noise", "walk", "step up", "step down")
    print(
        f"glet replan churn: 10 models, {args.rounds} rounds, {args.seeds} seeds per scenario, "
        f"--threshold {args.threshold:g}; after: headroom {headroom:g}"
    )
    print(
        f"{'scenario':<10} {'rule':<7} {'changes':>8} {'forced':>7} {'glets moved':>12} "
        f"{'GPU-rounds':>11} {'most GPUs':>10}  rounds changed (first 6, per seed)"
    )
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(Path(tmp) / "churn.db")
        import_gpulet(store, args.data)
        fit_and_store(store, source="bench")
        for scen in scenarios:
            totals: dict[str, dict[str, Any]] = {}
            for rule, (kind, h) in rules.items():
                kinds.register(kind)
                try:
                    agg: dict[str, Any] = {"first": []}
                    for seed in range(args.seeds):
                        rng = random.Random(1000 * seed + 7)
                        base = {m: float(rng.choice([100, 200, 300])) for m in ORDER}
                        series = scenario_rates(scen, base, args.rounds, rng)
                        k = 2.0 if scen == "step down" else 1.0  # planned for the start
                        request = {
                            "models": [
                                {"name": m, "rate_rps": k * r, "slo_ms": SLO_MS[m]}
                                for m, r in base.items()
                            ],
                            "replan_headroom": h,
                            "max_gpus": 16,
                        }
                        plan, _ = kind.plan(store, request)
                        plan_id = store.save_plan(plan)
                        got = run_rounds(store, plan_id, series, threshold=args.threshold)
                        for k, v in got.items():
                            if k == "at":
                                agg["first"].append(v)
                            elif k == "most":
                                agg[k] = max(agg.get(k, 0), v)
                            else:
                                agg[k] = agg.get(k, 0) + v
                    totals[rule] = agg
                finally:
                    kinds.register(glet)
                n = args.seeds
                first = "; ".join(",".join(map(str, f[:6])) or "-" for f in agg["first"])
                print(
                    f"{scen:<10} {rule:<7} {agg['changes'] / n:8.1f} {agg['forced'] / n:7.1f} "
                    f"{agg['moved'] / n:12.1f} {agg['gpu_rounds'] / n:11.1f} "
                    f"{agg['most']:10d}  {first}"
                )
            if scen.startswith("step") and any(5 not in f for f in totals["after"]["first"]):
                ok = False
                print(f"  !! after: the {scen} did not change the plan at once")
        store.close()
    print(
        "(per seed averages; changes out of "
        f"{args.rounds} rounds; GPU-rounds: what the running plans took, summed over rounds)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
