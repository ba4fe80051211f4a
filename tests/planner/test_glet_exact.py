"""The glet planner's shortcuts decide exactly as the plain rules: the duty-cycle search that
skips cycles and tries the shortest first (``Compiled._config``) against a search over every
candidate cycle, and the merge's busy-share test (``glet_load``) never passes over a glet the
full check accepts. Random glets on the gpulet reference profiles with the fitted model."""

from __future__ import annotations

import bisect
import random

import pytest
from greenctl.planner.glet.model import EPS, add_entry, glet_load
from greenctl.planner.glet.solve import Compiled, GletModel, GletProblem, run_elastic

SLO_MS = {"resnet50": 25, "vgg16": 30, "inception": 30, "densenet121": 40, "mobilenet": 20,
          "resnet101": 40, "vgg19": 30}  # fmt: skip
NAMES = list(SLO_MS)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    from greenctl.data.gpulet_import import import_gpulet, load_latency_table, load_utilisation
    from greenctl.data.store import open_store
    from greenctl.executor.control.interference import fit_and_store
    from greenctl.planner.core.interference import InterferenceModel

    path = tmp_path_factory.mktemp("exact") / "g.db"
    with open_store(path) as store:
        import_gpulet(store, "bundled:gpulet")
        fit_and_store(store, source="test")
        from greenctl.data.gpulet_import import get_interference_model

        model = InterferenceModel.from_dict(get_interference_model(store))
        return load_latency_table(store, NAMES), load_utilisation(store), model


def _compiled(inputs, rng: random.Random, n: int, max_gpus: int = 64) -> Compiled:
    latency, util, model = inputs
    models = [
        GletModel(
            f"m{i}",
            float(rng.choice([20, 50, 100, 200, 400, 600])),
            SLO_MS[NAMES[i % len(NAMES)]] * rng.choice([1.0, 1.5]),
            variant=NAMES[i % len(NAMES)],
        )
        for i in range(n)
    ]
    problem = GletProblem(
        models=models,
        latency_ms=latency,
        max_gpus=max_gpus,
        interference=model,
        utilisation=util,
    )
    return Compiled(problem)


def _every_cycle(c: Compiled, j: int, entries: list[tuple[int, float]], w: float | None):
    """The duty-cycle rule searched over every candidate cycle, shortest first."""
    cands: list[float] = []
    for i, r in entries:
        if not c.batches[i][j]:
            return None
        cands.extend(1000.0 * mb / r for mb in c.means[i][j])
    for dc in sorted(cands):
        ks, ls, total = [], [], 0.0
        for i, r in entries:
            k = bisect.bisect_left(c.means[i][j], r * dc / 1000.0 - 1e-7)
            if k >= len(c.means[i][j]):
                return None
            ks.append(k)
            ls.append(c.leffs(i, j, w)[k])
            total += ls[-1]
        if any(total + le > c.slo[i] + EPS for (i, _), le in zip(entries, ls, strict=True)):
            return None
        if total <= dc + EPS:
            return (total, ks, ls)
    return None


def test_the_duty_cycle_search_finds_what_every_cycle_finds(inputs):
    rng = random.Random(5)
    c = _compiled(inputs, rng, 7)
    ws = [None, *sorted({c.w_worst[j] for j in range(c.n_parts)}), c.w_median[0]]
    found = refused = 0
    for _ in range(3000):
        j = rng.randrange(c.n_parts)
        picked = rng.sample(range(c.n), rng.randint(1, 4))
        entries = [(i, rng.uniform(1.0, 400.0)) for i in picked]
        w = rng.choice(ws)
        got = c._config(j, entries, w)
        assert got == _every_cycle(c, j, entries, w), (j, entries, w)
        found += got is not None
        refused += got is None
    assert found > 300 and refused > 300  # both outcomes are exercised


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_merge_passes_over_only_glets_the_full_check_refuses(inputs, seed):
    rng = random.Random(seed)
    c = _compiled(inputs, rng, 30)
    state = run_elastic(c, 64, order="demand_desc")
    assert state is not None and state.used_gpus > 5
    glets = [(gi, li) for gi, gpu in enumerate(state.gpus) for li, g in enumerate(gpu.glets)]
    skipped = accepted = 0
    for _ in range(1500):
        gi, li = rng.choice(glets)
        g = state.gpus[gi].glets[li]
        if not g.entries:
            continue
        i, rate = rng.randrange(c.n), rng.uniform(0.5, 300.0)
        w = state.w_for(gi, li, assume_worst=True)
        cap = c.cap(i, g.j, w)
        ok = state.check_with(gi, li, add_entry(g.entries, i, rate))
        if cap <= 0 or glet_load(c, g, w) + rate / cap > 1 + 1e-6:
            assert not ok, (gi, li, i, rate)
            skipped += 1
        accepted += ok
    assert skipped > 100 and accepted > 20
