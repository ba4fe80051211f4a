"""Core tables: hardware, variants, profiles, plans, runs."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("hardware").create(
        {
            "id": int,
            "host": str,
            "kind": str,
            "model_name": str,
            "device_index": int,
            "memory_mb": float,
            "compute_share": float,
            "cores": int,
            "mig_profile": str,
            "uuid": str,
            "parent_uuid": str,
            "driver_version": str,
            "cuda_version": str,
            "rapl_readable": int,
        },
        pk="id",
        not_null={"host", "kind", "model_name"},
    )
    db.table("variants").create(
        {
            "name": str,
            "family": str,
            "accuracy": float,
            "accuracy_metric": str,
            "accuracy_source": str,
            "params": int,
            "memory_mb": float,
            "load_time_s": float,
            "source": str,
            "input_shape": str,
        },
        pk="name",
        not_null={"family"},
    )
    db.table("profiles").create(
        {
            "id": int,
            "variant": str,
            "resource": str,
            "batch": int,
            "throughput_rps": float,
            "latency_p50_ms": float,
            "latency_p95_ms": float,
            "latency_p99_ms": float,
            "hardware": str,
            "hardware_id": int,
            "power_w": float,
            "idle_power_w": float,
            "energy_j": float,
            "energy_method": str,
            "memory_mb": float,
            "samples": int,
            "duration_s": float,
            "cost_per_hour": float,
            "capacity_rps": float,
            "capacity_slo_ms": float,
            "torch_version": str,
            "source": str,
            "created_at": str,
        },
        pk="id",
        not_null={"variant", "resource", "batch", "throughput_rps", "created_at"},
        foreign_keys=[("variant", "variants", "name"), ("hardware_id", "hardware", "id")],
    )
    db.table("profiles").create_index(["variant", "resource", "batch"])
    db.table("plans").create(
        {
            "id": int,
            "kind": str,
            "created_at": str,
            "schema": str,
            "objective": float,
            "source": str,
            "document": str,
        },
        pk="id",
        not_null={"kind", "created_at", "document"},
    )
    db.table("runs").create(
        {
            "id": int,
            "plan_id": int,
            "kind": str,
            "started_at": str,
            "finished_at": str,
            "predicted": str,
            "measured": str,
            "notes": str,
        },
        pk="id",
        foreign_keys=[("plan_id", "plans", "id")],
    )
