"""gpulet's linear interference model.

The slowdown of a model on one MPS partition while another partition of the same GPU is
busy is modelled from both runs' solo L2 and DRAM utilisation (fractions 0..1)::

    factor = c1 L2_self + c2 L2_other + c3 DRAM_self + c4 DRAM_other + c5

``fit_interference`` learns c1..c5 with numpy least squares from co-location measurements
(latency beside a co-runner / solo latency) and reports the error distribution of the
predicted latency on a held-out part. Planning uses ``InterferenceModel.factor``, clipped
below at 1 (a co-runner never speeds a model up).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from greenctl.data.errors import InputError

FEATURES = ["l2_self", "l2_other", "dram_self", "dram_other", "intercept"]
GPULET_WITHIN = 0.1026  # gpulet: 90 % of cases within 10.26 % error


class _Colocation(Protocol):
    model: str
    batch: int
    partition: int
    corunner_model: str
    corunner_batch: int
    latency_ms: float


@dataclass(frozen=True)
class InterferenceModel:
    """Fitted coefficients ``[c1, c2, c3, c4, c5]`` (utilisations as fractions)."""

    coefficients: tuple[float, float, float, float, float]
    id: int | None = None

    def raw(self, l2_self: float, l2_other: float, dram_self: float, dram_other: float) -> float:
        """The linear prediction (utilisations as fractions 0..1), not clipped."""
        c1, c2, c3, c4, c5 = self.coefficients
        return c1 * l2_self + c2 * l2_other + c3 * dram_self + c4 * dram_other + c5

    def factor(self, l2_self: float, l2_other: float, dram_self: float, dram_other: float) -> float:
        """Latency multiplier beside a co-runner, at least 1."""
        return max(1.0, self.raw(l2_self, l2_other, dram_self, dram_other))

    def self_term(self, l2_self: float, dram_self: float) -> float:
        """The part of the linear prediction that depends on the model itself (plus c5)."""
        c1, _, c3, _, c5 = self.coefficients
        return c1 * l2_self + c3 * dram_self + c5

    def other_term(self, l2_other: float, dram_other: float) -> float:
        """The part that depends on the co-runner."""
        _, c2, _, c4, _ = self.coefficients
        return c2 * l2_other + c4 * dram_other

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> InterferenceModel:
        coef = [float(c) for c in doc["coefficients"]]
        if len(coef) != 5:
            raise InputError(f"an interference model needs 5 coefficients, got {len(coef)}")
        return cls((coef[0], coef[1], coef[2], coef[3], coef[4]), id=doc.get("id"))


@dataclass
class FitResult:
    """A fitted model and its held-out error distribution (relative latency error)."""

    model: InterferenceModel
    n_samples: int
    n_train: int
    n_test: int
    skipped: int
    errors: dict[str, float] = field(default_factory=dict)
    measured_factor: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "coefficients": list(self.model.coefficients),
            "features": FEATURES,
            "n_samples": self.n_samples,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "skipped": self.skipped,
            "errors": self.errors,
            "measured_factor": self.measured_factor,
        }


def build_samples(
    colocations: Iterable[_Colocation],
    solo_latency_ms: Mapping[tuple[str, int, int], float],
    utilisation: Mapping[tuple[str, int, int], tuple[float, float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Design matrix X (n x 5), measured factors y, solo latencies, and the skipped count.

    ``utilisation`` maps ``(model, batch, partition) -> (l2_pct, dram_pct)``; the co-runner
    runs on ``100 - partition``. Rows without a solo latency or utilisation are skipped.
    """
    xs: list[list[float]] = []
    ys: list[float] = []
    solo: list[float] = []
    skipped = 0
    for c in colocations:
        base = solo_latency_ms.get((c.model, c.batch, c.partition))
        me = utilisation.get((c.model, c.batch, c.partition))
        other = utilisation.get((c.corunner_model, c.corunner_batch, 100 - c.partition))
        if not base or me is None or other is None or c.latency_ms <= 0:
            skipped += 1
            continue
        xs.append([me[0] / 100, other[0] / 100, me[1] / 100, other[1] / 100, 1.0])
        ys.append(c.latency_ms / base)
        solo.append(base)
    return np.array(xs, dtype=float), np.array(ys, dtype=float), np.array(solo), skipped


def fit_interference(
    colocations: Iterable[_Colocation],
    solo_latency_ms: Mapping[tuple[str, int, int], float],
    utilisation: Mapping[tuple[str, int, int], tuple[float, float]],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> FitResult:
    """Fit the linear interference model by least squares and measure held-out error.

    ``colocations`` are latencies (ms) of a model beside a co-runner; ``solo_latency_ms`` and
    ``utilisation`` map ``(model, batch, partition)`` to the solo latency and
    ``(l2_pct, dram_pct)``. ``test_fraction`` of the samples (split by ``seed``) is held out.

    Returns:
        The model fitted on the rest, and the held-out ``|predicted - measured| / measured``.
    Raises:
        InputError: too few usable samples or a bad ``test_fraction``.
    """
    if not 0 < test_fraction < 1:
        raise InputError(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    x, y, solo, skipped = build_samples(colocations, solo_latency_ms, utilisation)
    n = len(y)
    if n < 10:
        raise InputError(
            f"only {n} usable co-location measurements (need at least 10; {skipped} lacked a "
            "solo profile or utilisation)",
            hint="import them first: `greenctl gpulet import DIR`",
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    n_test = max(1, round(n * test_fraction))
    test, train = order[:n_test], order[n_test:]
    coef, *_ = np.linalg.lstsq(x[train], y[train], rcond=None)
    model = InterferenceModel(
        (float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]), float(coef[4]))
    )
    pred = np.maximum(1.0, x[test] @ coef) * solo[test]
    meas = y[test] * solo[test]
    err = np.abs(pred - meas) / meas
    errors = {
        "mean": float(err.mean()),
        "p50": float(np.quantile(err, 0.5)),
        "p90": float(np.quantile(err, 0.9)),
        "p95": float(np.quantile(err, 0.95)),
        "max": float(err.max()),
        "within_5pct": float((err <= 0.05).mean()),
        "within_10pct": float((err <= 0.10).mean()),
        "within_gpulet_10_26pct": float((err <= GPULET_WITHIN).mean()),
        "train_rmse_factor": float(np.sqrt(np.mean((x[train] @ coef - y[train]) ** 2))),
    }
    # Baseline on the same held-out part: ignore interference (factor 1).
    base_err = np.abs(solo[test] - meas) / meas
    errors["no_model_p90"] = float(np.quantile(base_err, 0.9))
    errors["no_model_within_gpulet_10_26pct"] = float((base_err <= GPULET_WITHIN).mean())
    measured = {
        "mean": float(y.mean()),
        "p50": float(np.quantile(y, 0.5)),
        "p90": float(np.quantile(y, 0.9)),
        "max": float(y.max()),
    }
    return FitResult(
        model=model,
        n_samples=n,
        n_train=len(train),
        n_test=len(test),
        skipped=skipped,
        errors=errors,
        measured_factor=measured,
    )
