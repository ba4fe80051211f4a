"""Executor state: running instances, the dispatcher, MIG checkpoints, apply history, restarts."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    db.table("executor_instances").create(
        {
            "id": str,  # "<apply id>-<n>", stable while the instance is kept across applies
            "apply_id": int,
            "plan_id": int,
            "model": str,
            "variant": str,
            "resource": str,
            "batch": int,
            "quota_rps": float,
            "key": str,  # identity used to diff plans against what runs
            "cores": str,  # JSON list of CPU cores (cpu resources)
            "device": str,  # CUDA_VISIBLE_DEVICES value (GPU resources)
            "spawn": str,  # JSON: argv, env, state_file, log_file (the supervisor reuses it)
            "host": str,
            "port": int,
            "pid": int,
            "pid_start": str,  # process start time (ticks), guards against pid reuse
            "state": str,  # ready | stopped | failed
            "restarts": int,
            "started_at": str,
            "stopped_at": str,
        },
        pk="id",
        not_null={"model", "variant", "resource", "state"},
    )
    db.table("executor_instances").create_index(["state"])
    db.table("executor_dispatcher").create(
        {
            "id": int,
            "apply_id": int,
            "plan_id": int,
            "host": str,
            "port": int,
            "pid": int,
            "pid_start": str,
            "state_file": str,
            "log_file": str,
            "state": str,  # running | stopped
            "started_at": str,
            "stopped_at": str,
        },
        pk="id",
    )
    db.table("executor_apply_history").create(
        {
            "id": int,
            "plan_id": int,
            "started_at": str,
            "finished_at": str,
            "status": str,  # applied | unchanged | failed | dry-run
            "actions": str,  # JSON list of actions taken (or planned)
            "undone": str,  # JSON list of actions undone after a failure
            "error": str,
        },
        pk="id",
    )
    db.table("executor_restarts").create(
        {
            "id": int,
            "instance_id": str,
            "at": str,
            "reason": str,
            "old_pid": int,
            "new_pid": int,
            "new_port": int,
        },
        pk="id",
    )
    db.table("executor_mig_checkpoints").create(
        {
            "id": int,
            "apply_id": int,
            "created_at": str,
            "gpu_index": int,
            "gpu_uuid": str,
            "layout": str,  # JSON list of {profile, start, slices}
            "restored_at": str,
        },
        pk="id",
    )
    db.table("executor_services").create(
        {
            "name": str,  # e.g. "mps-control"
            "pid": int,
            "info": str,  # JSON
            "started_at": str,
            "state": str,
        },
        pk="name",
    )
