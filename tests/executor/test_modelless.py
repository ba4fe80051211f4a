"""Model-less requests (issue 19, INFaaS): a request states its latency SLO and accuracy floor,
the dispatcher picks the running variant that meets them (preferring the plan's objective),
answers 422 naming the closest when none does, and routes a variant's own name to it.

Real executors (the no-op model) and a real dispatcher on loopback, one apply for the module.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from greenctl.data.errors import InputError
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile
from greenctl.executor.runtime import oip
from greenctl.planner.core.choice import (
    Offer,
    QueueLatency,
    Requirements,
    choose,
    closest,
    queue_latency,
)

# real daemons: a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(120)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
#: (variant, p50/p95/p99 ms, energy J per request): the more accurate is the slower and
#: the more energy-hungry (built-in accuracies: tiny-s 0.52, tiny-l 0.79). Two variants on
#: one core each: CI machines may have two cores.
FIGURES = {
    "tiny-s": ((1.0, 1.5, 2.0), 0.05),
    "tiny-l": ((6.0, 8.0, 10.0), 0.5),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """A mix plan of tiny-s and tiny-l (one instance each, cpu:1) applied once."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down
    from greenctl.profiler.models import builtin_variant

    tmp = tmp_path_factory.mktemp("modelless")
    keys = ("GREENCTL_DB", "GREENCTL_STATE_DIR", "GREENCTL_NOOP_SERVICE_MS")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ["GREENCTL_DB"] = str(tmp / "greenctl.db")
    os.environ["GREENCTL_STATE_DIR"] = str(tmp / "state")
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    store = open_store(tmp / "greenctl.db")
    try:
        for name, ((p50, p95, p99), energy) in FIGURES.items():
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
        plan = Plan(
            kind="mix",
            deployments=[
                Deployment(model="tiny", variant=v, resource="cpu:1", count=1, quota_rps=10.0)
                for v in FIGURES
            ],
            request={"carbon_intensity": 400.0},
        )
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


def _infer(
    url: str, name: str, parameters: dict | None = None, *, binary: bool = False
) -> tuple[int, dict, dict[str, str]]:
    x = np.ones((1, 3, 32, 32), dtype=np.float32)
    body, headers = oip.encode_request([("input", x)], binary=binary, binary_outputs=binary)
    if parameters is not None:
        length = int(headers.get(oip.HEADER_LENGTH, len(body)))
        head = json.loads(body[:length])
        head["parameters"] = {**head.get("parameters", {}), **parameters}
        new_head = json.dumps(head).encode()
        body = new_head + body[length:]
        if binary:
            headers[oip.HEADER_LENGTH] = str(len(new_head))
    req = urllib.request.Request(
        f"{url}/v2/models/{name}/infer", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw, code, hdrs = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, code, hdrs = exc.read(), exc.code, dict(exc.headers)
    length = hdrs.get(oip.HEADER_LENGTH)
    doc = json.loads(raw[: int(length)] if length else raw)
    return code, doc, hdrs


def test_loose_slo_gets_the_lowest_carbon_variant(served):
    for binary in (False, True):
        code, doc, headers = _infer(served, "tiny", {"latency_slo_ms": 1000}, binary=binary)
        assert code == 200, doc
        assert doc["parameters"]["variant"] == "tiny-s"
        assert headers["Greenctl-Variant"] == "tiny-s"
        assert doc["outputs"][0]["shape"] == [1, 3, 32, 32]  # the answer itself is intact


def test_accuracy_floor_picks_the_variant_that_meets_it(served):
    code, doc, _ = _infer(served, "tiny", {"min_accuracy": 0.75, "latency_slo_ms": 50})
    assert code == 200 and doc["parameters"]["variant"] == "tiny-l"
    # both meet 0.5: the lower-carbon one
    code, doc, _ = _infer(served, "tiny", {"min_accuracy": 0.5})
    assert code == 200 and doc["parameters"]["variant"] == "tiny-s"


def test_impossible_requirements_answer_422_naming_the_closest(served):
    code, doc, _ = _infer(served, "tiny", {"min_accuracy": 0.9})
    assert code == 422
    assert doc["closest"]["variant"] == "tiny-l" and doc["closest"]["accuracy"] == 0.79
    assert "tiny-l" in doc["error"] and doc["requirements"] == {"min_accuracy": 0.9}
    code, doc, _ = _infer(served, "tiny", {"latency_slo_ms": 0.5})
    assert code == 422 and doc["closest"]["variant"] == "tiny-s"
    # the profile's p95 with an empty queue: the one service model's figure
    assert doc["closest"]["predicted_latency_ms"] == pytest.approx(1.5)
    # closest by relative shortfall: tiny-s misses the floor by 31 %, tiny-l the SLO by 300 %
    code, doc, _ = _infer(served, "tiny", {"latency_slo_ms": 2, "min_accuracy": 0.75})
    assert code == 422 and doc["closest"]["variant"] == "tiny-s"


@pytest.mark.parametrize(
    ("parameters", "named"),
    [
        ({"latency_slo_ms": -5}, "latency_slo_ms"),
        ({"latency_slo_ms": "fast"}, "latency_slo_ms"),
        ({"latency_slo_ms": True}, "latency_slo_ms"),
        ({"min_accuracy": 76}, "min_accuracy"),
        ({"min_accuracy": None}, "min_accuracy"),
        ({"max_latency_ms": 20}, "max_latency_ms"),
        ({"variant": "tiny-l"}, "/v2/models/{variant}/infer"),
    ],
)
def test_bad_requirements_answer_400_naming_the_parameter(served, parameters, named):
    code, doc, _ = _infer(served, "tiny", parameters)
    assert code == 400 and named in doc["error"], doc


def test_requests_without_requirements_route_as_before(served):
    seen = set()
    for _ in range(6):
        code, doc, headers = _infer(served, "tiny", {"sequence_tag": "x"})  # not greenctl's
        assert code == 200 and "parameters" not in doc
        seen.add(headers["Greenctl-Variant"])
    assert seen <= set(FIGURES)


def test_a_variants_name_routes_to_it_and_answers_as_a_model(served):
    for _ in range(4):
        code, doc, headers = _infer(served, "tiny-l")
        assert code == 200 and headers["Greenctl-Variant"] == "tiny-l"
        assert doc["model_name"] == "tiny-l" and doc["parameters"]["variant"] == "tiny-l"
    # with requirements, only that variant is considered
    code, doc, _ = _infer(served, "tiny-s", {"min_accuracy": 0.75})
    assert code == 422 and doc["closest"]["variant"] == "tiny-s"
    with urllib.request.urlopen(f"{served}/v2/models/tiny-l", timeout=5) as resp:
        meta = json.loads(resp.read())
    assert meta["name"] == "tiny-l" and meta["parameters"]["family"] == "tiny"
    with urllib.request.urlopen(f"{served}/v2/models/tiny-l/ready", timeout=5) as resp:
        assert json.loads(resp.read()) == {"name": "tiny-l", "ready": True}
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{served}/v2/models/tiny-x", timeout=5)
    assert err.value.code == 404 and "tiny-l" in err.value.read().decode()


def test_tritonclient_sends_requirements_in_its_parameters(served):
    httpclient = pytest.importorskip("tritonclient.http")
    client = httpclient.InferenceServerClient(url=served.removeprefix("http://"))
    try:
        x = np.ones((1, 3, 32, 32), dtype=np.float32)
        for binary in (True, False):
            inp = httpclient.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=binary)
            out = httpclient.InferRequestedOutput("output", binary_data=binary)
            result = client.infer(
                "tiny",
                [inp],
                outputs=[out],
                parameters={"latency_slo_ms": 100, "min_accuracy": 0.6},
            )
            assert result.get_response()["parameters"]["variant"] == "tiny-l"
            assert np.array_equal(result.as_numpy("output"), x)
        with pytest.raises(Exception, match="min_accuracy"):
            client.infer("tiny", [inp], parameters={"min_accuracy": 2})
    finally:
        client.close()


# -- the choice itself, in-process ------------------------------------------------------------
class _Inst:
    def __init__(self, name: str, inflight: int = 0, up: bool = True) -> None:
        self.name, self.inflight, self.up = name, inflight, up


def test_queue_latency_follows_the_batch_service_model():
    from greenctl.data.batching import executor_batching
    from greenctl.planner.core.latency import BatchService, ServiceTime

    svc = BatchService(
        ((1, ServiceTime.deterministic(2.0)), (4, ServiceTime.deterministic(5.0))),
        executor_batching("cpu:1", 4, max_wait_ms=1.0),
    )
    table = queue_latency(svc)
    assert table.at(0) == pytest.approx(2.0 + 1.0)  # alone: one row, plus the batching wait
    assert table.at(3) == pytest.approx(5.0 + 1.0)  # fourth row of the first batch
    assert table.at(4) == pytest.approx(5.0 + 2.0 + 1.0)  # one full batch ahead
    assert QueueLatency.from_dict(table.to_dict()) == table


def test_the_queue_moves_a_request_to_the_next_variant():
    fast = Offer("s", 0.5, 1.0, 1e-4, None, QueueLatency((2.0,), 2.0))
    slow = Offer("l", 0.8, 5.0, 5e-4, None, QueueLatency((8.0,), 8.0))
    busy, idle = _Inst("s0", inflight=10), _Inst("l0")
    got = choose([(fast, [busy]), (slow, [idle])], Requirements(latency_slo_ms=12))
    assert got is not None and got[1] is idle  # s0's queue: 22 ms predicted
    busy.inflight = 2
    got = choose([(fast, [busy]), (slow, [idle])], Requirements(latency_slo_ms=12))
    assert got is not None and got[1] is busy
    assert choose([(fast, [_Inst("x", up=False)])], Requirements(latency_slo_ms=50)) is None
    near = closest([(fast, [busy]), (slow, [idle])], Requirements(latency_slo_ms=1))
    assert near is not None and near[0] is fast and near[1] == pytest.approx(6.0)


def test_preference_follows_the_plans_objective():
    from greenctl.executor.kinds import get_kind

    green = Offer("green", 0.7, 1.0, 1e-4, 2e-6)
    cheap = Offer("cheap", 0.7, 3.0, 3e-4, 1e-6)
    assert min([green, cheap], key=lambda o: o.rank("carbon")) is green
    assert min([green, cheap], key=lambda o: o.rank("cost")) is cheap
    mix = get_kind("mix")
    assert mix.carbon_aware(Plan(kind="mix", deployments=[], request={"objective": "carbon"}))
    assert not mix.carbon_aware(Plan(kind="mix", deployments=[], request={"objective": "cost"}))
    assert get_kind("mig").carbon_aware(Plan(kind="mig", deployments=[]))
    assert not get_kind("glet").carbon_aware(Plan(kind="glet", deployments=[]))


def test_requirements_are_read_from_the_top_level_parameters_only_when_stated():
    from greenctl.executor.runtime.dispatcher import requirements_of

    x = np.zeros((64, 3, 32, 32), dtype=np.float32)  # a large JSON body (tensor data inline)
    body, _ = oip.encode_request([("input", x)])
    assert len(body) > 8192 and requirements_of(body, None) is None
    head = json.loads(body)
    head["parameters"] = {"latency_slo_ms": 20, "min_accuracy": 0.5}
    req = requirements_of(json.dumps(head).encode(), None)
    assert req == Requirements(20.0, 0.5)
    with pytest.raises(InputError, match="latency_slo_ms"):
        requirements_of(b'{"inputs": [], "parameters": {"latency_slo_ms": 0}}', None)
    assert requirements_of(b'{"inputs": [], "parameters": {"note": "slow"}}', None) is None


def test_the_bench_arm_runs(tmp_path: Path):
    """The per-request choice costs are measured by bench/bench_modelless.py (a smoke run)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "bench" / "bench_modelless.py"
    spec = importlib.util.spec_from_file_location("bench_modelless", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = mod.micro(n=200)
    assert out["modelless_us"] > 0 and out["plain_us"] > 0


def test_a_replacing_dispatcher_and_a_resync_keep_the_offers():
    """The routing table a dispatcher keeps for its successor holds the variants, offers and
    preference; a table rebuilt from the store's rows takes them from the running one."""
    from greenctl.executor.runtime.dispatcher import Dispatcher
    from greenctl.executor.runtime.offers import carry_offers

    offer = Offer("s", 0.5, 1.0, 1e-4, None, QueueLatency((2.0,), 2.0)).to_dict()
    inst = {"id": "1-0", "url": "http://127.0.0.1:1", "variant": "s", "offer": offer}
    doc = {"models": {"m": {"policy": "fifo", "prefer": "cost", "instances": [inst]}}}

    def served(table: dict) -> Dispatcher:
        d = Dispatcher(token="t", db=None, max_queue=8, state_dir=Path("."))
        d.set_routes(table)
        return d

    kept = served(doc).routes_doc(runtime=False)
    again = served(kept)
    route = again.routes["m"]
    assert route.prefer == "cost" and again.variant_routes == {"s": route}
    assert route.candidates[0][0] == Offer.from_dict("s", offer)
    bare = {"models": {"m": {"policy": "fifo", "instances": [{**inst, "offer": None}]}}}
    del bare["models"]["m"]["instances"][0]["offer"]
    merged = carry_offers(kept, bare)
    assert merged["models"]["m"]["prefer"] == "cost"
    assert merged["models"]["m"]["instances"][0]["offer"] == offer
