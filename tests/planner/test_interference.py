"""Interference model: exact recovery, held-out accuracy on gpulet's reference data, and
the planner evaluating the very model that was fitted."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import InputError
from greenctl.planner.core.interference import (
    InterferenceModel,
    build_samples,
    fit_interference,
    fit_model,
)

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
    assert np.allclose(fit.model.linear, true.coefficients, atol=1e-7)
    assert fit.model.n_points == len(solo)  # every (model, batch, partition) has its term
    assert fit.errors["p90"] < 1e-7 and fit.errors["within_gpulet_10_26pct"] == 1.0
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


def _reference():
    from greenctl.data.gpulet_import import read_gpulet_dir

    data = read_gpulet_dir(GPULET)
    util = {
        (u.model, u.batch, u.partition): (u.l2_util_pct, u.dram_util_pct) for u in data.utilisation
    }
    solo = {(r.model, r.batch, r.partition): r.latency_ms for r in data.solo}
    return data, solo, util


def test_fit_on_gpulet_reference_reaches_gpulets_accuracy():
    data, solo, util = _reference()
    fit = fit_interference(data.colocations, solo, util, seed=0)
    assert fit.n_samples == 3675 and fit.skipped == 0 and fit.n_test == 735
    e = fit.errors
    # co-location slows models down on average (measured factor > 1) ...
    assert fit.measured_factor["mean"] > 1.1
    # ... and 91.6 % of held-out co-locations fall within gpulet's 10.26 % (gpulet: 90 %),
    # where gpulet's five-coefficient form reaches 56 % and ignoring interference 28 %
    assert e["within_gpulet_10_26pct"] >= 0.905
    assert e["linear_within_gpulet_10_26pct"] < 0.6 and e["no_model_within_gpulet_10_26pct"] < 0.3
    assert e["p90"] < 0.1026 < e["linear_p90"] < e["no_model_p90"]
    # other splits give the same figure (no lucky seed)
    for seed in (1, 2, 3):
        other = fit_interference(data.colocations, solo, util, seed=seed)
        assert other.errors["within_gpulet_10_26pct"] >= 0.905


def test_held_out_by_model_pair():
    """Whole (model, co-runner model) pairs held out: a known model beside a co-runner model
    it was never measured with is predicted as well."""
    data, solo, util = _reference()
    x, y, _, names, _ = build_samples(data.colocations, solo, util)
    pairs = np.array([f"{c.model}|{c.corunner_model}" for c in data.colocations])
    kinds = sorted(set(pairs))
    shares = []
    for fold in range(5):
        test = np.isin(pairs, kinds[fold::5])
        model, _ = fit_model(
            x[~test], y[~test], [n for n, t in zip(names, test, strict=True) if not t]
        )
        pred = np.array([model.factor(*row[:4]) for row in x[test]])
        shares.append(float((np.abs(pred - y[test]) / y[test] <= 0.1026).mean()))
    assert min(shares) > 0.85 and np.mean(shares) >= 0.905


def test_planner_evaluates_the_fitted_model(gpulet):
    """plan glet's latency factors are the stored model's own self and co-runner terms, and a
    plan's record of the model (its coefficients) rebuilds the same model."""
    from greenctl.data.gpulet_import import (
        get_interference_model,
        load_latency_table,
        load_utilisation,
    )
    from greenctl.planner.glet.solve import Compiled, GletModel, GletProblem

    stored = get_interference_model(gpulet)
    assert len(stored["features"]) == len(stored["coefficients"]) > 5
    imodel = InterferenceModel.from_dict(stored)
    record = InterferenceModel.from_dict(
        {"id": stored["id"], "coefficients": stored["coefficients"]}
    )
    assert record == imodel and imodel.n_points == 105
    util = load_utilisation(gpulet)
    names = ["resnet50", "vgg19", "mobilenet"]
    c = Compiled(
        GletProblem(
            models=[GletModel(n, 100.0, 40.0) for n in names],
            latency_ms=load_latency_table(gpulet, names),
            interference=imodel,
            utilisation=util,
        )
    )
    assert c.interference_on
    own = 0
    for i, name in enumerate(names):
        for j, part in enumerate(c.units):
            for k, b in enumerate(c.batches[i][j]):
                l2, dram = util[(name, b, part)]
                assert c.base[i][j][k] == imodel.self_term(l2 / 100, dram / 100)
                c1, _, c3, _, c5 = imodel.linear
                own += c.base[i][j][k] != c1 * l2 / 100 + c3 * dram / 100 + c5
            seen = [util[(name, b, part)] for b in c.batches[i][j]]
            assert c.w_other[i][j] == max(imodel.other_term(u / 100, d / 100) for u, d in seen)
    assert own >= 60  # resnet50's and vgg19's measured points use their own fitted terms
