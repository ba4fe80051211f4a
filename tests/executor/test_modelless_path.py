"""Model-less requests with a measured serving path (issue 19): the choice counts the client,
dispatcher and executor hops that ``predict`` adds to every request, so a request whose SLO
the model alone would meet but the served request would miss goes to another variant, or is
refused naming the closest.

The in-process checks need no daemons; the end-to-end one applies a plan of real no-op
executors behind a real dispatcher.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.serving import QUANTILE_POINTS, ServingMeasurement, save_serving
from greenctl.planner.core.choice import QueueLatency, Requirements, choose, queue_latency

pytestmark = pytest.mark.timeout(120)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
#: (variant, p50/p95/p99 ms, energy J per request, measured serving path overhead in ms):
#: tiny-s is the faster and greener, but its requests take a slow serving path; tiny-l's
#: path is short.
FIGURES = {
    "tiny-s": ((1.0, 1.5, 2.0), 0.05, 10.0),
    "tiny-l": ((6.0, 8.0, 10.0), 0.5, 0.5),
}


def _path_row(variant: str, overhead_ms: float) -> ServingMeasurement:
    """A `greenctl profile serving` run of ``variant``: ``overhead_ms`` to ``overhead_ms``
    + 0.99 ms outside the model."""
    q = [overhead_ms + i / 100 for i in range(QUANTILE_POINTS)]
    return ServingMeasurement(
        family="tiny",
        variant=variant,
        path="dispatcher",
        stand_in="noop",
        policy="fifo",
        rate_rps=10.0,
        input_bytes=12288,
        output_elements=3072,
        p50_ms=q[50],
        p95_ms=q[95],
        p99_ms=q[99],
        quantiles_ms=q,
        executor_cpu_ms_per_request=None,
        dispatcher_cpu_ms_per_request=None,
        samples=100,
        created_at="2026-11-26T00:00:00Z",
    )


def _fill(store, *, paths: bool = True) -> Plan:
    from greenctl.profiler.models import builtin_variant

    for name, ((p50, p95, p99), energy, _) in FIGURES.items():
        store.upsert_variant(builtin_variant(name))
        store.add_profiles(
            [
                Profile(
                    variant=name,
                    resource="cpu:1",
                    batch=1,
                    throughput_rps=1000.0 / p50,
                    latency_p50_ms=p50,
                    latency_p95_ms=p95,
                    latency_p99_ms=p99,
                    energy_j=energy,
                    cost_per_hour=0.1,
                    source="imported",
                )
            ]
        )
    if paths:
        save_serving(store, [_path_row(name, fig[2]) for name, fig in FIGURES.items()])
    return Plan(
        kind="mix",
        deployments=[
            Deployment(model="tiny", variant=v, resource="cpu:1", count=1, quota_rps=10.0)
            for v in FIGURES
        ],
        request={"carbon_intensity": 400.0},
    )


# -- in-process -------------------------------------------------------------------------------
class _Inst:
    def __init__(self, inflight: int = 0) -> None:
        self.inflight, self.up = inflight, True


def test_the_table_adds_the_path_as_predict_does():
    """Each row is the quantile of the run plus the path, convolved by the core's
    with_overhead (not the two quantiles added); a queue ahead adds whole runs only."""
    from greenctl.data.batching import executor_batching
    from greenctl.planner.core.latency import BatchService, ServiceTime
    from greenctl.planner.core.queueing import mgc_model, with_overhead

    run = ServiceTime.from_percentiles(1.0, 1.5, 2.0)
    svc = BatchService(((1, run),), executor_batching("cpu:1", 1))
    overhead = [2.0 + i / 100 for i in range(100)]
    bare, served = queue_latency(svc), queue_latency(svc, overhead_ms=overhead)
    expected = with_overhead(mgc_model(0.0, [run]), overhead).quantile(0.95)
    assert served.at(0) == pytest.approx(expected)
    assert bare.at(0) < served.at(0) < bare.at(0) + max(overhead)
    assert served.path_ms == pytest.approx(served.at(0) - bare.at(0))
    assert served.at(3) - served.at(0) == pytest.approx(bare.at(3) - bare.at(0))
    assert QueueLatency.from_dict(served.to_dict()) == served
    assert queue_latency(svc, overhead_ms=[]) == bare  # nothing measured: the model alone
    assert "path_ms" not in bare.to_dict()  # tables without a path read as before
    with pytest.raises(ValueError):
        QueueLatency.from_dict({**served.to_dict(), "path_ms": -1})


def test_offers_carry_the_measured_path_and_the_choice_reroutes(store):
    """A request whose SLO lies between tiny-s's model-only latency and its latency with the
    serving path goes to tiny-l (whose path is short), or is refused when neither meets it."""
    from greenctl.executor.runtime.offers import instance_offers

    plan = _fill(store, paths=False)
    keys = {(v, "cpu:1", 1) for v in FIGURES}
    bare = instance_offers(store, plan, keys)
    save_serving(store, [_path_row(name, fig[2]) for name, fig in FIGURES.items()])
    served = instance_offers(store, plan, keys)
    s, l_ = ("tiny-s", "cpu:1", 1), ("tiny-l", "cpu:1", 1)
    for key in (s, l_):
        b, o = bare[key].latency, served[key].latency
        assert b is not None and o is not None and b.path_ms == 0.0
        assert o.at(0) == pytest.approx(b.at(0) + o.path_ms)
    assert served[s].latency.path_ms > 10.0 and served[l_].latency.path_ms < 1.5
    assert served[s].carbon_g_per_request == bare[s].carbon_g_per_request  # only latency
    # none: path=None keeps the model-only table (a backend whose path was not measured)
    assert instance_offers(store, plan, keys, serving_path=None)[s] == bare[s]

    model_only_s, with_path_s = bare[s].latency.at(0), served[s].latency.at(0)
    slo = 10.0
    assert model_only_s <= slo < with_path_s  # tiny-s alone meets it; tiny-s served does not
    assert served[l_].latency.at(0) <= slo  # tiny-l served does
    order = sorted(served.values(), key=lambda o: o.rank("carbon"))
    assert order[0].variant == "tiny-s"
    old = choose([(bare[(o.variant, "cpu:1", 1)], [_Inst()]) for o in order], Requirements(slo))
    assert old is not None and old[0].variant == "tiny-s"  # before: routed to a miss
    got = choose([(o, [_Inst()]) for o in order], Requirements(slo))
    assert got is not None and got[0].variant == "tiny-l"
    # an SLO both meet by the model alone but neither once the path is added: refused
    tight = max(bare[l_].latency.at(0), model_only_s) + 0.1
    assert tight < min(o.latency.at(0) for o in served.values())
    assert choose([(o, [_Inst()]) for o in order], Requirements(tight)) is None


# -- end to end -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The plan of tiny-s and tiny-l with their serving paths measured, applied once."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down

    tmp = tmp_path_factory.mktemp("modelless-path")
    keys = ("GREENCTL_DB", "GREENCTL_STATE_DIR", "GREENCTL_NOOP_SERVICE_MS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["GREENCTL_DB"] = str(tmp / "greenctl.db")
    os.environ["GREENCTL_STATE_DIR"] = str(tmp / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    store = open_store(tmp / "greenctl.db")
    try:
        plan = _fill(store)
        url = apply_plan(plan, store=store, loader=NOOP, policy="fifo").dispatcher_url or ""
        yield url
    finally:
        down(store, wait=True)
        store.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _infer(url: str, name: str, parameters: dict) -> tuple[int, dict]:
    x = np.ones((1, 3, 32, 32), dtype=np.float32)
    body, headers = oip.encode_request([("input", x)])
    head = json.loads(body)
    head["parameters"] = parameters
    req = urllib.request.Request(
        f"{url}/v2/models/{name}/infer",
        data=json.dumps(head).encode(),
        headers=headers,
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_dispatcher_counts_the_serving_path(served):
    # tiny-s: 1.5 ms p95 alone, about 12 ms served; tiny-l: 8 ms alone, about 9 ms served
    code, doc = _infer(served, "tiny", {"latency_slo_ms": 10})
    assert code == 200 and doc["parameters"]["variant"] == "tiny-l", doc
    code, doc = _infer(served, "tiny", {"latency_slo_ms": 100})
    assert code == 200 and doc["parameters"]["variant"] == "tiny-s", doc  # greenest meets it
    code, doc = _infer(served, "tiny", {"latency_slo_ms": 8.2})
    assert code == 422, doc  # tiny-l alone would meet it (8 ms), not once served
    assert doc["closest"]["variant"] == "tiny-l"
    assert doc["closest"]["predicted_latency_ms"] > 8.5
    assert 0.5 < doc["closest"]["serving_path_ms"] < 1.5
    assert "ms of measured serving path" in doc["error"]


def test_a_head_read_once_as_stating_nothing_is_not_read_again(monkeypatch):
    """A client sends the same JSON head with every tensor of a shape: once read as stating
    no requirement it is not searched again; a head that states one is read every time;
    the memory of heads is bounded."""
    from greenctl.executor.runtime import dispatch_modelless as m

    m._PLAIN_HEADS.clear()
    head = b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32"}],"parameters":{"binary_data_output":true}}'
    assert m.requirements_of(head + b"\x00" * 4, str(len(head))) is None
    asks = m.requirements_of(b'{"inputs":[],"parameters":{"latency_slo_ms":50}}', None)
    assert asks is not None and asks.latency_slo_ms == 50

    class Unreadable:
        def search(self, *_: object) -> None:
            raise AssertionError("searched again")

    monkeypatch.setattr(m, "_OURS_RX", Unreadable())
    assert m.requirements_of(head + b"\x01" * 4, str(len(head))) is None
    monkeypatch.undo()
    for k in range(3 * m._PLAIN_HEADS_MAX):
        m.requirements_of(b'{"inputs":[],"parameters":{"k":%d}}' % k, None)
    assert len(m._PLAIN_HEADS) <= m._PLAIN_HEADS_MAX
