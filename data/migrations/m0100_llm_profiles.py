"""LLM profiles: one row per (variant, resource, concurrency) of a ``greenctl profile llm`` run."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("llm_profiles").create(
        {
            "id": int,
            "run_id": str,
            "variant": str,
            "resource": str,
            "engine": str,
            "concurrency": int,
            "prompt_tokens": float,
            "output_tokens": float,
            "requests": int,
            "errors": int,
            "duration_s": float,
            "ttft_p50_ms": float,
            "ttft_p95_ms": float,
            "ttft_p99_ms": float,
            "tpot_p50_ms": float,
            "tpot_p95_ms": float,
            "tpot_p99_ms": float,
            "output_tokens_per_s": float,
            "requests_per_s": float,
            "power_w": float,
            "idle_power_w": float,
            "prefill_j_per_token": float,
            "decode_j_per_token": float,
            "energy_method": str,
            "hardware": str,
            "cost_per_hour": float,
            "workload": str,
            "source": str,
            "created_at": str,
        },
        pk="id",
        not_null={"run_id", "variant", "resource", "engine", "concurrency", "created_at"},
        foreign_keys=[("variant", "variants", "name")],
    )
    db.table("llm_profiles").create_index(["variant", "resource", "concurrency"])
