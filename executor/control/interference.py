"""Fit gpulet's interference model on the store's co-location measurements and store it: the
one sequence ``greenctl interference fit``, the tests and the benches run (planner fits, data
stores; this layer joins them)."""

from __future__ import annotations

from typing import Any

from greenctl.data.gpulet_import import (
    load_colocations,
    load_solo_latency,
    load_utilisation,
    save_interference_model,
)
from greenctl.data.store import Store
from greenctl.planner.core.interference import MODEL_KIND, feature_names, fit_interference


def fit_and_store(
    store: Store, *, test_fraction: float = 0.2, seed: int = 0, source: str | None = None
) -> tuple[int, Any]:
    """Fit the interference model on the imported co-locations (holding ``test_fraction``
    out, split with ``seed``) and store it, every number named; returns its id and the fit
    (:class:`~greenctl.planner.core.interference.FitResult`)."""
    result = fit_interference(
        load_colocations(store),
        load_solo_latency(store),
        load_utilisation(store),
        test_fraction=test_fraction,
        seed=seed,
    )
    model_id = save_interference_model(
        store,
        coefficients=list(result.model.coefficients),
        features=feature_names(result.model, result.points),
        n_train=result.n_train,
        n_test=result.n_test,
        errors={**result.errors, "measured_factor": result.measured_factor},
        source=source or f"colocations (test fraction {test_fraction}, seed {seed})",
        kind=MODEL_KIND,
    )
    return model_id, result
