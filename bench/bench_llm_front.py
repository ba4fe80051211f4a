"""What the dispatcher's OpenAI front adds to an LLM tier's streams: TTFT, TPOT and tokens/s
through the dispatcher against the same engine reached directly, in one run.

It makes the tiny random Llama (nothing downloaded), stores one synthetic profile row of one
tier, applies a one-tier llm plan in a scratch store (a real ``transformers serve`` pinned to
one core, behind the dispatcher), then measures with greenctl's stream timer
(:func:`greenctl.profiler.llm_client.measure`) in slices that alternate between the engine
and the dispatcher (the machine is shared: alternation spreads its load over both), and
prints each side's medians over the slices and their ratios, with ``uptime``'s load.

    python bench/bench_llm_front.py                # 6 slices of 4 s per side, concurrency 1
    python bench/bench_llm_front.py --quick        # 2 slices of 3 s
    python bench/bench_llm_front.py --concurrency 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path


def _uptime() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slices", type=int, default=6)
    p.add_argument("--slice-s", type=float, default=4.0)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.slices, args.slice_s = 2, 3.0
    with tempfile.TemporaryDirectory(prefix="bench-llm-front-") as tmp:
        os.environ["GREENCTL_STATE_DIR"] = str(Path(tmp) / "state")
        return _run(Path(tmp), args)


def _run(tmp: Path, args: argparse.Namespace) -> int:
    from greenctl.data import deployments
    from greenctl.data.llm_profiles import LLMProfile, add_llm_profiles, llm_variant
    from greenctl.data.plan import Plan
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.profiler.llm_client import measure
    from greenctl.profiler.llm_models import random_llama

    folder = tmp / "tiny"
    random_llama(folder, "tiny")
    store = open_store(tmp / "g.db")
    row = LLMProfile(variant="tiny", resource="cpu:1", engine="transformers", concurrency=1,
                     run_id="bench", ttft_p95_ms=100.0, prefill_j_per_token=0.01,
                     decode_j_per_token=0.05, source="synthetic")  # fmt: skip
    add_llm_profiles(store, llm_variant("tiny", "tinyllm", 0.5), [row])
    plan = Plan.from_dict({
        "schema": "greenctl.plan/v1",
        "kind": "llm",
        "request": {"model": "tinyllm", "rate_rps": 1.0, "carbon_intensity": 300.0},
        "deployments": [{"model": "tinyllm", "variant": "tiny", "resource": "cpu:1",
                         "count": 1, "batch": 2, "quota_rps": 1.0}],
        "llm": {"shares": {"tiny": 1.0},
                "engines": {"tiny": {"engine": "transformers", "model": str(folder)}},
                "tiers": [{"variant": "tiny", "quality": 0.5, "share": 1.0,
                           "ttft_p95_ms": 100.0}]},
        "predicted": {"rate_rps": 1.0},
    })  # fmt: skip
    try:
        front = apply_plan(plan, store=store).dispatcher_url
        (inst,) = deployments.ready_instances(store)
        engine = f"http://127.0.0.1:{inst['port']}"
        sides = {"engine": (engine, str(folder.resolve())), "dispatcher": (front, "tinyllm")}
        got: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
        for i in range(args.slices):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                url, model = sides[side]
                r = measure(url, str(model), prompt_tokens=args.prompt_tokens,
                            output_tokens=args.output_tokens, concurrency=args.concurrency,
                            duration_s=args.slice_s)  # fmt: skip
                got[side].append({"ttft_p50": r.ttft_ms["p50"], "ttft_p95": r.ttft_ms["p95"],
                                  "tpot_p50": r.tpot_ms["p50"],
                                  "tok_s": r.output_tokens_per_s, "n": r.requests})  # fmt: skip
        out = {}
        for side, rows in got.items():
            out[side] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        ratio = {
            k: out["dispatcher"][k] / out["engine"][k] for k in out["engine"] if out["engine"][k]
        }
        print(f"load (1/5/15 min): {_uptime()}")
        print(f"{'':<11}{'TTFT p50':>10}{'TTFT p95':>10}{'TPOT p50':>10}{'tok/s':>8}{'req':>6}")
        for side, m in out.items():
            print(f"{side:<11}{m['ttft_p50']:>10.1f}{m['ttft_p95']:>10.1f}{m['tpot_p50']:>10.2f}"
                  f"{m['tok_s']:>8.1f}{m['n']:>6.0f}")  # fmt: skip
        print(f"{'ratio':<11}{ratio['ttft_p50']:>10.3f}{ratio['ttft_p95']:>10.3f}"
              f"{ratio['tpot_p50']:>10.3f}{ratio['tok_s']:>8.3f}")  # fmt: skip
        print(json.dumps({"medians": out, "dispatcher_over_engine": ratio}))
    finally:
        down(store)
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
