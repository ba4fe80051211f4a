"""Profiles: latency of isolated requests (arriving to an idle instance), and serving paths."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    profiles = db.table("profiles")
    for col in ("isolated_p50_ms", "isolated_p95_ms", "isolated_p99_ms"):
        if col not in profiles.columns_dict:
            profiles.add_column(col, float)
    db.table("serving_profiles").create(
        {
            "id": int,
            "family": str,
            "variant": str,  # the variant whose tensors the no-op model mimics
            "path": str,  # "dispatcher" (client -> dispatcher -> executor) or "direct"
            "stand_in": str,  # "model" (the variant itself, its queue and run subtracted) or "noop"
            "policy": str,
            "rate_rps": float,  # offered load of the measurement
            "input_bytes": int,
            "output_elements": int,
            "p50_ms": float,
            "p95_ms": float,
            "p99_ms": float,
            "quantiles_ms": str,  # JSON: 100 quantiles (0.5 %, 1.5 %, ..., 99.5 %) of the overhead
            "executor_cpu_ms_per_request": float,  # the executor daemon's CPU per request
            "dispatcher_cpu_ms_per_request": float,  # the dispatcher's (dispatcher path only)
            "infer_p50_ms": float,  # median model run inside the served executor (model stand-in)
            "samples": int,
            "hardware": str,
            "hostname": str,
            "source": str,
            "created_at": str,
        },
        pk="id",
    )
    db.table("serving_profiles").create_index(["family", "path", "created_at"])
