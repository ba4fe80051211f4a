"""gpulet's interference model with a per-point self term.

A model's latency on one MPS partition beside a co-runner, relative to its solo latency, is
``factor = s(point) + c2 L2_other + c4 DRAM_other``. ``s(point)`` is fitted per measured solo
point (model, batch, partition), looked up by its solo L2 and DRAM utilisation (0..1); a point
never measured beside a co-runner uses gpulet's ``c1 L2_self + c3 DRAM_self + c5``. Fitted by
least absolute deviations (the data hold bimodal outliers); planning uses ``self_term`` +
``other_term``, clipped below at 1. Why the point dominates: docs/interference.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import numpy as np
from greenctl.data.errors import InputError

FEATURES = ["l2_self", "l2_other", "dram_self", "dram_other", "intercept"]
GPULET_WITHIN = 0.1026  # gpulet: 90 % of cases within 10.26 % error
SPLIT = "random by measurement"
MODEL_KIND = "self-point+linear-l2-dram"  # how a fitted model is labelled in the store
_KEY_DIGITS = 6  # utilisation fractions are matched to this many decimals


class _Colocation(Protocol):
    model: str
    batch: int
    partition: int
    corunner_model: str
    corunner_batch: int
    latency_ms: float


def _key(l2: float, dram: float) -> tuple[float, float]:
    return (round(float(l2), _KEY_DIGITS), round(float(dram), _KEY_DIGITS))


@dataclass(frozen=True)
class InterferenceModel:
    """``coefficients``: ``[c1, c2, c3, c4, c5]`` (gpulet's linear form), then one
    ``(l2_self, dram_self, s)`` triple per measured point (utilisations as fractions)."""

    coefficients: tuple[float, ...]
    id: int | None = None

    def __post_init__(self) -> None:
        n = len(self.coefficients)
        if n < 5 or (n - 5) % 3:
            raise InputError(
                f"an interference model needs 5 coefficients plus (L2, DRAM, term) triples, "
                f"got {n} numbers",
                hint="refit it: `greenctl interference fit`",
            )

    @property
    def linear(self) -> tuple[float, float, float, float, float]:
        """gpulet's c1..c5."""
        c = self.coefficients
        return (c[0], c[1], c[2], c[3], c[4])

    @cached_property
    def _points(self) -> dict[tuple[float, float], float]:
        c = self.coefficients
        return {_key(c[i], c[i + 1]): c[i + 2] for i in range(5, len(c), 3)}

    @property
    def n_points(self) -> int:
        """Measured points with their own self term."""
        return (len(self.coefficients) - 5) // 3

    def self_term(self, l2_self: float, dram_self: float) -> float:
        """The part of the prediction that depends on the model itself: the fitted term of the
        measured point with this solo utilisation, else ``c1 L2 + c3 DRAM + c5``."""
        hit = self._points.get(_key(l2_self, dram_self))
        if hit is not None:
            return hit
        c1, _, c3, _, c5 = self.linear
        return c1 * l2_self + c3 * dram_self + c5

    def other_term(self, l2_other: float, dram_other: float) -> float:
        """The part that depends on the co-runner."""
        _, c2, _, c4, _ = self.linear
        return c2 * l2_other + c4 * dram_other

    def raw(self, l2_self: float, l2_other: float, dram_self: float, dram_other: float) -> float:
        """The prediction (utilisations as fractions 0..1), not clipped."""
        return self.self_term(l2_self, dram_self) + self.other_term(l2_other, dram_other)

    def factor(self, l2_self: float, l2_other: float, dram_self: float, dram_other: float) -> float:
        """Latency multiplier beside a co-runner, at least 1."""
        return max(1.0, self.raw(l2_self, l2_other, dram_self, dram_other))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> InterferenceModel:
        """From a stored model or a plan's record (``coefficients``, optional ``id``)."""
        try:
            coef = tuple(float(c) for c in doc["coefficients"])
        except (TypeError, ValueError, KeyError):
            raise InputError(
                "an interference model's coefficients must be a list of numbers",
                hint="refit it: `greenctl interference fit`",
            ) from None
        if not all(np.isfinite(coef)):
            raise InputError("an interference model's coefficients must be finite numbers")
        return cls(coef, id=doc.get("id"))


def feature_names(model: InterferenceModel, points: Sequence[str]) -> list[str]:
    """Names of every number of ``model.coefficients``; ``points`` names its measured points."""
    names = list(FEATURES)
    for p in points:
        names += [f"{p} l2_self", f"{p} dram_self", f"{p} self_term"]
    return names[: len(model.coefficients)]


@dataclass(frozen=True)
class PointTerm:
    """One measured point's fitted self term and its lookup key (solo utilisation, 0..1)."""

    point: str
    model: str
    batch: int | None
    partition: int | None
    l2_self: float
    dram_self: float
    term: float


def model_terms(doc: Mapping[str, Any]) -> tuple[tuple[float, ...], list[PointTerm]]:
    """gpulet's ``c1..c5`` and the per-point self terms of a fitted model's document, as
    ``interference fit`` returns it (``self_terms``) or as the store keeps it (one flat
    ``coefficients`` list named by ``features``). A point named ``MODEL:bB:pP`` is split
    into its model, batch and partition; another name keeps them None."""
    coef = [float(c) for c in doc.get("coefficients") or []]
    linear = tuple(coef[:5])
    if doc.get("self_terms") is not None:
        rows = [
            (str(t.get("point")), float(t["l2_self"]), float(t["dram_self"]), float(t["term"]))
            for t in doc["self_terms"]
        ]
    else:
        names = list(doc.get("features") or [])
        rows = []
        for n, i in enumerate(range(5, len(coef) - 2, 3)):
            name = names[i] if i < len(names) else f"point {n + 1} l2_self"
            rows.append((name.removesuffix(" l2_self"), coef[i], coef[i + 1], coef[i + 2]))
    out = []
    for name, l2, dram, term in rows:
        model, b, p = [*name.rsplit(":", 2), "", ""][:3]
        whole = b[1:].isdigit() and p[1:].isdigit() and b[:1] == "b" and p[:1] == "p"
        out.append(
            PointTerm(
                name,
                model if whole else name,
                int(b[1:]) if whole else None,
                int(p[1:]) if whole else None,
                l2,
                dram,
                term,
            )
        )
    return linear, out


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
    #: names of the measured points with their own self term, in the model's order
    points: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        triples = self.model.coefficients[5:]
        return {
            "kind": MODEL_KIND,
            "coefficients": list(self.model.linear),
            "features": FEATURES,
            "self_terms": [
                {"point": p, "l2_self": l2, "dram_self": dram, "term": s}
                for p, l2, dram, s in zip(
                    self.points, triples[0::3], triples[1::3], triples[2::3], strict=True
                )
            ],
            "split": SPLIT,
            "n_samples": self.n_samples,
            "n_train": self.n_train,
            "n_test": self.n_test,
            "skipped": self.skipped,
            "errors": self.errors,
            "measured_factor": self.measured_factor,
        }


def point_name(model: str, batch: int, partition: int) -> str:
    """How a measured solo point is named in a fitted model."""
    return f"{model}:b{batch}:p{partition}"


def build_samples(
    colocations: Iterable[_Colocation],
    solo_latency_ms: Mapping[tuple[str, int, int], float],
    utilisation: Mapping[tuple[str, int, int], tuple[float, float]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], int]:
    """Design matrix X (n x 5, gpulet's features), measured factors y, solo latencies, each
    row's self point name, and the skipped count.

    ``utilisation`` maps ``(model, batch, partition) -> (l2_pct, dram_pct)``; the co-runner
    runs on ``100 - partition``. Rows without a solo latency or utilisation are skipped.
    """
    xs: list[list[float]] = []
    ys: list[float] = []
    solo: list[float] = []
    names: list[str] = []
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
        names.append(point_name(c.model, c.batch, c.partition))
    x = np.array(xs, dtype=float).reshape(-1, 5)
    return x, np.array(ys, dtype=float), np.array(solo), names, skipped


def least_absolute(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> np.ndarray:
    """Coefficients minimising sum |y - x c| (iteratively reweighted least squares): the
    median's robustness, so a few measurements in a slow mode do not drag the fit."""
    w = np.ones(len(y))
    for _ in range(iterations + 1):
        xw = x * w[:, None]  # weighted normal equations: small (columns x columns)
        coef = np.linalg.lstsq(xw.T @ x, xw.T @ y, rcond=None)[0]
        w = 1.0 / np.maximum(np.abs(y - x @ coef), 1e-3)
    return coef


def grouped_least_absolute(
    groups: np.ndarray, z: np.ndarray, y: np.ndarray, iterations: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """``(s, c)`` minimising sum |y - s[group] - z c| by reweighted least squares; each
    step solves the group offsets in closed form (weighted means), so it stays O(rows)."""
    k = int(groups.max()) + 1
    w = np.ones(len(y))

    def centred(v: np.ndarray) -> np.ndarray:
        return v - (np.bincount(groups, w * v, k) / np.bincount(groups, w, k))[groups]

    for _ in range(iterations + 1):
        zc = np.column_stack([centred(z[:, j]) for j in range(z.shape[1])])
        sw = np.sqrt(w)
        c = np.linalg.lstsq(zc * sw[:, None], centred(y) * sw, rcond=None)[0]
        rest = y - z @ c
        s = np.bincount(groups, w * rest, k) / np.bincount(groups, w, k)
        w = 1.0 / np.maximum(np.abs(rest - s[groups]), 1e-3)
    return s, c


def fit_model(
    x: np.ndarray, y: np.ndarray, names: Sequence[str]
) -> tuple[InterferenceModel, list[str]]:
    """Fit the self terms of the points in ``names`` with the co-runner's c2, c4 jointly
    (least absolute deviations), then c1, c3, c5 on the points' terms (the form for a point
    never measured beside a co-runner). Returns the model and its points' names."""
    points = sorted(set(names))
    col = {p: i for i, p in enumerate(points)}
    terms, (c2, c4) = grouped_least_absolute(np.array([col[p] for p in names]), x[:, [1, 3]], y)
    first = {p: i for i, p in reversed(list(enumerate(names)))}
    own = np.array([[x[first[p], 0], x[first[p], 2], 1.0] for p in points]).reshape(-1, 3)
    c1, c3, c5 = least_absolute(own, terms) if len(points) >= 3 else (0.0, 0.0, float(terms.mean()))
    flat = [float(c1), float(c2), float(c3), float(c4), float(c5)]
    for (l2, dram, _), s in zip(own, terms, strict=True):
        flat += [float(l2), float(dram), float(s)]
    return InterferenceModel(tuple(flat)), points


def fit_interference(
    colocations: Iterable[_Colocation],
    solo_latency_ms: Mapping[tuple[str, int, int], float],
    utilisation: Mapping[tuple[str, int, int], tuple[float, float]],
    *,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> FitResult:
    """Fit the model (:func:`fit_model`) and measure its held-out error.

    ``colocations`` are latencies (ms) of a model beside a co-runner; ``solo_latency_ms`` and
    ``utilisation`` map ``(model, batch, partition)`` to the solo latency and
    ``(l2_pct, dram_pct)``. ``test_fraction`` of the measurements (split by ``seed``) is held
    out; gpulet's five-coefficient least-squares form is scored on the same split.

    Returns:
        The model fitted on the rest, and the held-out ``|predicted - measured| / measured``.
    Raises:
        InputError: too few usable samples or a bad ``test_fraction``.
    """
    if not 0 < test_fraction < 1:
        raise InputError(f"--test-fraction must be between 0 and 1, got {test_fraction}")
    x, y, _solo, names, skipped = build_samples(colocations, solo_latency_ms, utilisation)
    n = len(y)
    if n < 10:
        raise InputError(
            f"only {n} usable co-location measurements (need at least 10; {skipped} lacked a "
            "solo profile or utilisation)",
            hint="import them first: `greenctl gpulet import DIR`",
        )
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(1, round(n * test_fraction))
    test, train = order[:n_test], order[n_test:]
    model, points = fit_model(x[train], y[train], [names[i] for i in train])
    pred = np.array([model.factor(*x[i, :4]) for i in test])
    errors = _error_stats(pred, y[test])
    linear, *_ = np.linalg.lstsq(x[train], y[train], rcond=None)
    gpulet = _error_stats(np.maximum(1.0, x[test] @ linear), y[test])
    errors["linear_within_gpulet_10_26pct"] = gpulet["within_gpulet_10_26pct"]
    errors["linear_p90"] = gpulet["p90"]
    errors["train_rmse_factor"] = float(
        np.sqrt(np.mean([(model.raw(*x[i, :4]) - y[i]) ** 2 for i in train]))
    )
    # Baseline on the same held-out part: ignore interference (factor 1).
    none = _error_stats(np.ones(len(test)), y[test])
    errors["no_model_p90"] = none["p90"]
    errors["no_model_within_gpulet_10_26pct"] = none["within_gpulet_10_26pct"]
    measured = {
        "mean": float(y.mean()),
        "p50": float(np.quantile(y, 0.5)),
        "p90": float(np.quantile(y, 0.9)),
        "max": float(y.max()),
    }
    return FitResult(model, n, len(train), len(test), skipped, errors, measured, points)


def _error_stats(factor: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Relative latency error of predicted factors (the solo latency cancels out)."""
    err = np.abs(factor - measured) / measured
    return {
        "mean": float(err.mean()),
        "p50": float(np.quantile(err, 0.5)),
        "p90": float(np.quantile(err, 0.9)),
        "p95": float(np.quantile(err, 0.95)),
        "max": float(err.max()),
        "within_5pct": float((err <= 0.05).mean()),
        "within_10pct": float((err <= 0.10).mean()),
        "within_gpulet_10_26pct": float((err <= GPULET_WITHIN).mean()),
    }
