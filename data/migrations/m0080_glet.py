"""gpulet tables: L2/DRAM utilisation, co-location measurements, interference models."""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    # Solo L2 and DRAM utilisation of a model at (batch, partition), the inputs of the
    # linear interference model. `partition` is the MPS active-thread percentage.
    db.table("utilisations").create(
        {
            "model": str,
            "batch": int,
            "partition": int,
            "resource": str,
            "dram_util_pct": float,
            "l2_util_pct": float,
            "flag": int,
            "source": str,
        },
        pk=("model", "batch", "partition"),
        not_null={"model", "batch", "partition", "dram_util_pct", "l2_util_pct"},
    )
    # One co-location measurement: `model` at `batch` on a `partition` % MPS share while
    # `corunner_model` at `corunner_batch` runs on the rest of the GPU (100 - partition %).
    db.table("colocations").create(
        {
            "model": str,
            "batch": int,
            "partition": int,
            "corunner_model": str,
            "corunner_batch": int,
            "corunner_partition": int,
            "throughput_rps": float,
            "latency_ms": float,
            "source": str,
        },
        pk=("model", "batch", "partition", "corunner_model", "corunner_batch"),
        not_null={"model", "batch", "partition", "corunner_model", "corunner_batch"},
    )
    # A fitted interference model: factor = c1 L2_self + c2 L2_other + c3 DRAM_self
    # + c4 DRAM_other + c5 (utilisations as fractions 0..1).
    db.table("interference_models").create(
        {
            "id": int,
            "created_at": str,
            "kind": str,
            "coefficients": str,  # JSON list [c1, c2, c3, c4, c5]
            "features": str,  # JSON list of feature names
            "n_train": int,
            "n_test": int,
            "errors": str,  # JSON: held-out error distribution
            "source": str,
        },
        pk="id",
        not_null={"created_at", "coefficients"},
    )
