"""Linear interference model: exact recovery, fit on the gpulet reference data."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import InputError
from greenctl.planner.core.interference import InterferenceModel, fit_interference

GPULET = path_of("gpulet")


@dataclass
class Colo:
    model: str
    batch: int
    partition: int
    corunner_model: str
    corunner_batch: int
    latency_ms: float


def test_recovers_known_coefficients_exactly():
    rng = np.random.default_rng(1)
    true = InterferenceModel((0.4, 0.7, 0.3, 0.5, 1.05))
    models = [f"m{i}" for i in range(6)]
    util, solo, colos = {}, {}, []
    for m in models:
        for b in (1, 4, 16):
            for p in (20, 50, 80):
                util[(m, b, p)] = tuple(rng.uniform(5, 80, 2))
                solo[(m, b, p)] = float(rng.uniform(2, 40))
    for m in models:
        for b in (1, 4, 16):
            for p in (20, 50, 80):
                for o in models:
                    for ob in (1, 16):
                        me, ot = util[(m, b, p)], util[(o, ob, 100 - p)]
                        f = true.raw(me[0] / 100, ot[0] / 100, me[1] / 100, ot[1] / 100)
                        colos.append(Colo(m, b, p, o, ob, solo[(m, b, p)] * f))
    fit = fit_interference(colos, solo, util)
    assert np.allclose(fit.model.coefficients, true.coefficients, atol=1e-9)
    assert fit.errors["p90"] < 1e-9 and fit.errors["within_gpulet_10_26pct"] == 1.0
    assert fit.n_test + fit.n_train == fit.n_samples == len(colos)


def test_factor_is_at_least_one():
    m = InterferenceModel((0.0, 0.0, 0.0, 0.0, 0.5))
    assert m.raw(0.1, 0.1, 0.1, 0.1) == 0.5 and m.factor(0.1, 0.1, 0.1, 0.1) == 1.0
    assert InterferenceModel.from_dict({"coefficients": [1, 2, 3, 4, 5], "id": 7}).id == 7
    with pytest.raises(InputError):
        InterferenceModel.from_dict({"coefficients": [1, 2]})


def test_too_few_samples_and_bad_fraction():
    with pytest.raises(InputError, match="only 0 usable"):
        fit_interference([Colo("a", 1, 50, "b", 1, 3.0)], {}, {})
    with pytest.raises(InputError, match="test-fraction"):
        fit_interference([], {}, {}, test_fraction=1.5)


def test_fit_on_gpulet_reference_gives_sensible_error():
    from greenctl.data.gpulet_import import read_gpulet_dir

    data = read_gpulet_dir(GPULET)
    util = {
        (u.model, u.batch, u.partition): (u.l2_util_pct, u.dram_util_pct) for u in data.utilisation
    }
    solo = {(r.model, r.batch, r.partition): r.latency_ms for r in data.solo}
    fit = fit_interference(data.colocations, solo, util, seed=0)
    assert fit.n_samples == 3675 and fit.skipped == 0
    e = fit.errors
    # co-location slows models down on average (measured factor > 1) ...
    assert fit.measured_factor["mean"] > 1.1
    # ... and the model predicts it far better than ignoring interference
    assert e["p50"] < 0.15 and e["mean"] < 0.2
    assert e["p90"] < e["no_model_p90"]
    assert e["within_gpulet_10_26pct"] > e["no_model_within_gpulet_10_26pct"] + 0.2
    # a different split gives a similar error (no lucky seed)
    other = fit_interference(data.colocations, solo, util, seed=7)
    assert abs(other.errors["p50"] - e["p50"]) < 0.05
