"""Interference model candidates on gpulet's reference co-locations, scored alike.

Every candidate predicts a model's co-located latency / solo latency; the score is the share
of held-out co-locations within gpulet's 10.26 % (and the p90 error) under four splits:
random 80/20 (seed 0, what `greenctl interference fit` reports), random 5-fold, 5-fold by
(model, co-runner model) pair, 5-fold by self point (model, batch, partition: never seen
co-located, so only features can predict it). Then what the data itself allows: the in-sample
ceiling and the bimodal "slow mode" outliers no co-runner feature explains. With
``--earlier DIR`` (gpulet's repository at commit 56fac49, data/*_with_interference.csv and
*_solo.csv) the same co-locations measured in an earlier campaign are compared.

Run: python bench/bench_interference.py [--data DIR] [--earlier DIR]
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
from greenctl.data.bundled import path_of, resolve
from greenctl.data.gpulet_import import read_gpulet_dir
from greenctl.planner.core.interference import (
    GPULET_WITHIN,
    build_samples,
    fit_model,
    least_absolute,
)

Fold = tuple[np.ndarray, np.ndarray]


def load(directory: Path):
    """Features (gpulet's 5), factors, point names, and per-row labels of the reference."""
    data = read_gpulet_dir(directory)
    util = {
        (u.model, u.batch, u.partition): (u.l2_util_pct, u.dram_util_pct) for u in data.utilisation
    }
    solo = {(r.model, r.batch, r.partition): r.latency_ms for r in data.solo}
    x, y, _, names, skipped = build_samples(data.colocations, solo, util)
    assert not skipped
    rows = data.colocations
    meta = {
        "model": np.array([c.model for c in rows]),
        "batch": np.array([c.batch for c in rows], dtype=float),
        "partition": np.array([c.partition for c in rows], dtype=float),
        "pair": np.array([f"{c.model}|{c.corunner_model}" for c in rows]),
        "corunner_batch": np.array([c.corunner_batch for c in rows], dtype=float),
    }
    return x, y, names, meta


def rich(x: np.ndarray, meta: dict[str, np.ndarray], per_model: bool) -> np.ndarray:
    """Utilisation with squares and product, log batch, partition (self and co-runner);
    ``per_model``: plus an offset and slopes per self model."""
    lb, pp = np.log2(meta["batch"]), meta["partition"] / 100
    l2s, l2o, ds, do = x[:, 0], x[:, 1], x[:, 2], x[:, 3]
    cols = [l2s, ds, l2s**2, ds**2, l2s * ds, lb, lb**2, pp, pp * lb]
    cols += [l2o, do, l2o**2, do**2, np.log2(meta["corunner_batch"]), 1 - pp, np.ones(len(x))]
    if per_model:
        for m in sorted(set(meta["model"])):
            s = (meta["model"] == m).astype(float)
            cols += [s, s * lb, s * lb**2, s * pp, s * l2s, s * ds, s * pp * lb]
    return np.column_stack(cols)


def linear_candidate(features: np.ndarray, robust: bool) -> Callable:
    def fit(train: np.ndarray, test: np.ndarray, y: np.ndarray, names: list[str]) -> np.ndarray:
        f = least_absolute if robust else (lambda a, b: np.linalg.lstsq(a, b, rcond=None)[0])
        return features[test] @ f(features[train], y[train])

    return fit


def point_candidate(x: np.ndarray, corunner: bool) -> Callable:
    """The shipped model (self term per point + co-runner c2, c4); without ``corunner``
    the co-runner's utilisation is zeroed (its term vanishes)."""
    xs = x if corunner else x * np.array([1, 0, 1, 0, 1])

    def fit(train: np.ndarray, test: np.ndarray, y: np.ndarray, names: list[str]) -> np.ndarray:
        model, _ = fit_model(xs[train], y[train], [names[i] for i in train])
        return np.array([model.raw(*row[:4]) for row in xs[test]])

    return fit


def score(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    err = np.abs(np.maximum(1.0, pred) - y) / y
    return float((err <= GPULET_WITHIN).mean()), float(np.quantile(err, 0.9))


def splits(y: np.ndarray, names: list[str], meta: dict[str, np.ndarray]) -> dict[str, list[Fold]]:
    n = len(y)
    order = np.random.default_rng(0).permutation(n)
    n_test = round(0.2 * n)
    out = {"random 80/20": [(order[n_test:], order[:n_test])]}
    out["random 5-fold"] = [(np.setdiff1d(order, order[f::5]), order[f::5]) for f in range(5)]
    for label, key in (("by pair 5-fold", meta["pair"]), ("by point 5-fold", np.array(names))):
        kinds = np.random.default_rng(0).permutation(sorted(set(key)))
        folds = []
        for f in range(5):
            test = np.isin(key, kinds[f::5])
            folds.append((np.where(~test)[0], np.where(test)[0]))
        out[label] = folds
    return out


def candidates_table(x, y, names, meta) -> None:
    cands = {
        "no model (factor 1)": lambda tr, te, y, n: np.ones(len(te)),
        "gpulet linear, least squares": linear_candidate(x, robust=False),
        "gpulet linear, least abs.": linear_candidate(x, robust=True),
        "rich features, least squares": linear_candidate(rich(x, meta, False), robust=False),
        "rich features, least abs.": linear_candidate(rich(x, meta, False), robust=True),
        "rich + per-model, least abs.": linear_candidate(rich(x, meta, True), robust=True),
        "self point only, least abs.": point_candidate(x, corunner=False),
        "self point + co-runner (shipped)": point_candidate(x, corunner=True),
    }
    folds = splits(y, names, meta)
    print("share of held-out co-locations within 10.26 % / p90 relative error")
    print(f"{'candidate':<34}" + "".join(f"{s:>20}" for s in folds))
    for label, fit in cands.items():
        cells = []
        for fs in folds.values():
            res = [score(fit(tr, te, y, names), y[te]) for tr, te in fs]
            cells.append(
                f"{np.mean([r[0] for r in res]):>10.1%} / {np.mean([r[1] for r in res]):.3f}"
            )
        print(f"{label:<34}" + "".join(f"{c:>20}" for c in cells))
    print("(by point: the point's own term is never fitted, the c1 L2 + c3 DRAM + c5 form is used)")


def noise(x, y, names) -> None:
    """What any model of these measurements can reach."""
    model, _ = fit_model(x, y, names)
    inside = score(np.array([model.raw(*r[:4]) for r in x]), y)
    groups = np.array(names)
    med = np.empty(len(y))
    for p in set(names):
        sel = groups == p
        med[sel] = np.median(y[sel])
    off = np.abs(y - med) / y
    print(
        f"\nin-sample (fitted and scored on all 3,675): {inside[0]:.1%} within 10.26 %, "
        f"p90 {inside[1]:.3f}\neach point's median factor (35 co-runners each) as the "
        f"prediction: {(off <= GPULET_WITHIN).mean():.1%} within; cells off their point's "
        f"median by > 10.26 %: {(off > GPULET_WITHIN).sum()}, by > 30 %: {(off > 0.3).sum()}"
    )
    spread = [(np.ptp(y[groups == p]) / np.median(y[groups == p]), p) for p in set(names)]
    spread.sort(reverse=True)
    print(
        "widest points (max - min factor over their 35 co-runners / median): "
        + ", ".join(f"{p} {s:.2f}" for s, p in spread[:4])
    )


def earlier(directory: Path, current: Path) -> None:
    """The same co-locations measured in gpulet's earlier campaign (resnet50, vgg19)."""

    def read(path: Path, key: int) -> dict[tuple, float]:
        with path.open() as f:
            return {tuple(r[:key]): float(r[key + 3]) for r in csv.reader(f) if r}

    cur = read(current / "interference.csv", 5)
    solo_now = read(current / "inference.csv", 3)
    old: dict[tuple, float] = {}
    solo_old: dict[tuple, float] = {}
    for m in ("resnet50", "vgg19"):
        old.update(read(directory / f"{m}_with_interference.csv", 5))
        solo_old.update(read(directory / f"{m}_solo.csv", 3))
    both = [k for k in old if k in cur]
    lat = np.array([abs(old[k] - cur[k]) / cur[k] for k in both])
    fac = np.array(
        [
            abs(old[k] / solo_old[k[:3]] - cur[k] / solo_now[k[:3]]) / (cur[k] / solo_now[k[:3]])
            for k in both
        ]
    )
    print(
        f"\nearlier campaign, {len(both)} co-locations measured twice: latency within 10.26 % "
        f"of each other {(lat <= GPULET_WITHIN).mean():.1%}; factor (over each campaign's "
        f"solo) within 10.26 %: {(fac <= GPULET_WITHIN).mean():.1%}, median gap {np.median(fac):.1%}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=resolve, default=path_of("gpulet"))
    ap.add_argument("--earlier", type=Path, default=None, help="gpulet's data/ at 56fac49")
    args = ap.parse_args()
    x, y, names, meta = load(args.data)
    print(f"== {len(y)} co-locations, {len(set(names))} self points ==")
    candidates_table(x, y, names, meta)
    noise(x, y, names)
    if args.earlier:
        earlier(args.earlier, args.data)


if __name__ == "__main__":
    main()
