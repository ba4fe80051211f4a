"""Synthetic LLM profile rows (source "synthetic") for the llm planner's, kind's and
command's tests: three tiers of one family on a serialising engine whose TTFT climbs with
the streams in flight, as `transformers serve` without continuous batching measures."""

from __future__ import annotations

import json

from greenctl.data.llm_profiles import LLMProfile, add_llm_profiles, llm_variant

#: name -> (quality, TTFT at 1 stream ms, TPOT at 1 stream ms, J per output token)
TIERS = {
    "llm-large": (0.9, 300.0, 40.0, 0.8),
    "llm-medium": (0.75, 120.0, 18.0, 0.3),
    "llm-small": (0.55, 50.0, 8.0, 0.1),
}
CONCURRENCIES = (1, 2, 4)
PROMPT, OUTPUT = 64, 16


def tier_rows(
    name: str,
    *,
    resource: str = "cpu:1",
    serial: float = 0.5,
    run_id: str | None = None,
    concurrencies: tuple[int, ...] = CONCURRENCIES,
    energy: bool = True,
) -> list[LLMProfile]:
    """One profile run of tier ``name``: TTFT x (1 + serial (c - 1)), TPOT x (1 + 0.1 (c - 1))."""
    _, ttft1, tpot1, j_tok = TIERS[name]
    rows = []
    for c in concurrencies:
        ttft = ttft1 * (1 + serial * (c - 1))
        tpot = tpot1 * (1 + 0.1 * (c - 1))
        rps = c / ((ttft + (OUTPUT - 1) * tpot) / 1000)
        rows.append(
            LLMProfile(
                variant=name,
                resource=resource,
                engine="transformers",
                concurrency=c,
                run_id=run_id or f"run-{name}",
                prompt_tokens=PROMPT,
                output_tokens=OUTPUT,
                requests=100,
                ttft_p50_ms=ttft,
                ttft_p95_ms=ttft * 1.4,
                ttft_p99_ms=ttft * 1.7,
                tpot_p50_ms=tpot,
                tpot_p95_ms=tpot * 1.3,
                tpot_p99_ms=tpot * 1.5,
                output_tokens_per_s=rps * OUTPUT,
                requests_per_s=rps,
                power_w=12.0 + 4.0 * c if energy else None,
                idle_power_w=8.0 if energy else None,
                prefill_j_per_token=j_tok / 10 if energy else None,
                decode_j_per_token=j_tok if energy else None,
                energy_method="modeled",
                workload=json.dumps(
                    {
                        "engine": "transformers",
                        "model": f"/models/{name}",
                        "endpoint": None,
                        "prompt_tokens": PROMPT,
                        "output_tokens": OUTPUT,
                        "chat": False,
                    }
                ),
                source="synthetic",
            )
        )
    return rows


def quality(name: str) -> float:
    return TIERS[name][0]


def add_family(store, family: str = "llm", tiers: tuple[str, ...] = tuple(TIERS), **kw) -> None:
    """Store the tiers of ``family`` (their variants and one run each)."""
    for name in tiers:
        add_llm_profiles(store, llm_variant(name, family, quality(name)), tier_rows(name, **kw))
