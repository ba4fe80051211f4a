"""One Open Inference Protocol contract for every front greenctl serves, written once with
tritonclient's HTTP client: health, model metadata (tensor names and datatypes), binary and
JSON tensors, requested outputs, refusals of bad tensors (4xx with a message, never 200 with
no outputs) and request ``parameters`` accepted and refused.

The fronts: the local dispatcher of an applied plan, one of its executor daemons directly,
a geo router routing to that dispatcher, and the Ray backend's router (skipped only where
Ray is not installed; CI installs the ``ray`` extra). Real processes and sockets; each front
is started once per module (Ray takes a while).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from greenctl.data.plan import Deployment, Plan
from greenctl.data.records import Profile, Variant

from tests.conftest import free_port

httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402

# real daemons (and a Ray cluster): a hung one must fail the test, not the CI run
pytestmark = pytest.mark.timeout(300)

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
FRONTS = ("dispatcher", "executor", "georouter", "ray")
T0 = "2024-01-01T00:30:00Z"


def _geo_plan(store: Any, folder: Path) -> Plan:
    """A geo plan of one site (``west``) and one gateway (``g1``) that routes all to it."""
    from greenctl.executor.kinds import get_kind

    files = {
        "sites": "time,site,price_usd_per_mwh,carbon_g_per_kwh,wue_l_per_kwh,capacity_mw\n"
        "2024-01-01T00:00:00Z,west,40,300,2,1.0\n2024-01-01T01:00:00Z,west,40,300,2,1.0\n",
        "demand": "time,gateway,load_mw\n2024-01-01T00:00:00Z,g1,0.5\n"
        "2024-01-01T01:00:00Z,g1,0.5\n",
        "routes": "gateway,site\ng1,west\n",
    }
    request: dict[str, Any] = {"algorithm": "eglb"}
    for name, text in files.items():
        (folder / f"{name}.csv").write_text(text)
        request[name] = str(folder / f"{name}.csv")
    plan, _ = get_kind("geo").plan(store, request)
    store.save_plan(plan)
    return plan


def _profile(variant: str) -> Profile:
    """A profile of ``variant`` on one core at the plans' batch of 4."""
    return Profile(variant, "cpu:1", 4, 2000.0, latency_p50_ms=2.0, latency_p95_ms=3.0,
                   latency_p99_ms=4.0, power_w=10.0, energy_j=0.01, source="imported")  # fmt: skip


@pytest.fixture(scope="module")
def local_fronts(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[str, str, str]]]:
    """A plan of one no-op executor applied on the local backend, and a geo router in front
    of its dispatcher: ``{front: (url, model, its variant)}``."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.apply import apply_plan, down, status
    from greenctl.executor.deploy.georouter import apply_geo, stop_router

    root = tmp_path_factory.mktemp("oip")
    saved = {k: os.environ.get(k) for k in ("GREENCTL_STATE_DIR", "GREENCTL_NOOP_SERVICE_MS")}
    os.environ.pop("GREENCTL_STATE_DIR", None)  # each store: its own <db>.run
    os.environ["GREENCTL_NOOP_SERVICE_MS"] = "0"
    site, router = open_store(root / "site.db"), open_store(root / "router.db")
    try:
        # profiled, so that a request's requirements can be met (model-less routing)
        site.upsert_variant(Variant("v", "m", accuracy=0.8, input_shape="4"))
        site.add_profiles([_profile("v")])
        plan = Plan(
            kind="mix",
            deployments=[Deployment(model="m", variant="v", resource="cpu:1", count=1, batch=4)],
        )
        disp = apply_plan(plan, store=site, loader=NOOP).dispatcher_url or ""
        (inst,) = status(site)["instances"]
        geo = apply_geo(
            _geo_plan(router, root), store=router, sites={"west": disp}, gateway="g1", at=T0
        )
        yield {
            "dispatcher": (disp, "m", "v"),
            "executor": (inst["url"], "m", "v"),
            "georouter": (geo["router_url"], "m", "v"),
        }
    finally:
        with contextlib.suppress(Exception):
            stop_router(router)
        with contextlib.suppress(Exception):
            down(site, wait=True)
        site.close()
        router.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def ray_front(
    tmp_path_factory: pytest.TempPathFactory, ray_cluster_of: Callable[..., Any]
) -> Iterator[tuple[str, str, str]]:
    """A local Ray cluster (one head, loopback, no token) with the built-in ``tiny-s``
    applied on it by ``apply_ray``: ``(router url, model, its variant)``."""
    from greenctl.data.store import open_store
    from greenctl.executor.deploy.ray_backend import apply_ray, down_ray
    from greenctl.profiler.models import builtin_variant

    with ray_cluster_of(2) as address:
        store = open_store(tmp_path_factory.mktemp("oip-ray") / "ray.db")
        try:
            store.upsert_variant(builtin_variant("tiny-s"))
            store.add_profiles([_profile("tiny-s")])  # (model-less routing needs one)
            plan = Plan(
                kind="mix",
                request={"policy": "wrr"},
                deployments=[
                    Deployment("tiny", "tiny-s", "cpu:1", count=1, batch=4, quota_rps=10.0)
                ],
            )
            store.save_plan(plan)
            applied = apply_ray(plan, store=store, address=address, http_port=free_port())
            yield applied.url, "tiny", "tiny-s"
        finally:
            with contextlib.suppress(Exception):
                down_ray(store=store, address=address)
            store.close()


@pytest.fixture(params=FRONTS)
def front(request: pytest.FixtureRequest) -> Iterator[tuple[Any, str]]:
    """A tritonclient HTTP client of one front, and the model it serves (the client's
    ``greenctl_url``: the front's URL; ``greenctl_variant``: the model's variant)."""
    if request.param == "ray":
        url, model, variant = request.getfixturevalue("ray_front")
    else:
        url, model, variant = request.getfixturevalue("local_fronts")[request.param]
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    client.greenctl_url, client.greenctl_variant = url, variant
    try:
        yield client, model
    finally:
        client.close()


def _input_shape(client: Any, model: str) -> list[int]:
    """The model's input shape without its batch dimension, from its metadata."""
    shape = client.get_model_metadata(model)["inputs"][0]["shape"]
    assert shape[0] == -1, shape
    return list(shape[1:])


def _rows(client: Any, model: str, rows: int = 2) -> np.ndarray:
    return (
        np.linspace(0.0, 1.0, rows * int(np.prod(_input_shape(client, model))))
        .astype(np.float32)
        .reshape(rows, *_input_shape(client, model))
    )


def _refused(call: Callable[[], Any]) -> tuple[int, str]:
    """The HTTP status and message of a call the server must refuse."""
    with pytest.raises(InferenceServerException) as info:
        call()
    status = info.value.status()
    assert status is not None, info.value
    return int(status), str(info.value.message())


def test_health_and_model_ready(front):
    client, model = front
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready(model)
    assert not client.is_model_ready("no-such-model")


def test_metadata_names_one_fp32_input_and_output(front):
    client, model = front
    meta = client.get_model_metadata(model)
    assert meta["name"] == model
    (inp,) = meta["inputs"]
    (out,) = meta["outputs"]
    assert (inp["name"], inp["datatype"]) == ("input", "FP32")
    assert (out["name"], out["datatype"]) == ("output", "FP32")
    assert inp["shape"][0] == -1 and all(d > 0 for d in inp["shape"][1:])


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_binary_and_json_tensors(front, binary):
    client, model = front
    x = _rows(client, model)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("output", binary_data=binary)
    result = client.infer(model, [inp], outputs=[out], request_id="r-1")
    got = result.as_numpy("output")
    assert got is not None and got.dtype == np.float32 and got.shape[0] == 2
    assert result.get_response()["id"] == "r-1"
    (meta,) = result.get_response()["outputs"]
    assert (meta["name"], meta["datatype"]) == ("output", "FP32")
    # no outputs named: every output comes back
    plain = client.infer(model, [inp])
    assert plain.as_numpy("output") is not None


def test_a_variant_answers_under_its_own_name(front):
    """A variant is served under its own name too: ready, the same tensors, inference."""
    client, model = front
    variant = client.greenctl_variant
    assert client.is_model_ready(variant)
    meta, family = client.get_model_metadata(variant), client.get_model_metadata(model)
    assert (meta["inputs"], meta["outputs"]) == (family["inputs"], family["outputs"])
    x = _rows(client, model, rows=1)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer(variant, [inp]).as_numpy("output").shape[0] == 1


def test_an_unknown_output_is_an_error(front):
    client, model = front
    x = _rows(client, model)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    wrong = httpclient.InferRequestedOutput("output0")
    status, message = _refused(lambda: client.infer(model, [inp], outputs=[wrong]))
    assert status == 400 and "output0" in message and "'output'" in message


def test_an_unknown_model_is_404(front):
    client, model = front
    x = _rows(client, model)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    status, message = _refused(lambda: client.infer("no-such-model", [inp]))
    assert status == 404 and "no-such-model" in message


def _bad_name(x: np.ndarray) -> Any:
    inp = httpclient.InferInput("input0", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return inp


def _bad_datatype(x: np.ndarray) -> Any:
    inp = httpclient.InferInput("input", list(x.shape), "BYTES")
    inp.set_data_from_numpy(x.astype(str).astype(object), binary_data=False)
    return inp


def _data_not_its_datatype(x: np.ndarray) -> Any:
    # tritonclient checks the data against the declared datatype itself: a client that does
    # not (curl, another library) is what the test stands for, so the declared datatype is
    # changed after the data are set
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    inp._datatype = "BOOL"
    return inp


def _bad_inner_shape(x: np.ndarray) -> Any:
    wide = np.zeros((x.shape[0], *x.shape[1:-1], x.shape[-1] + 1), dtype=np.float32)
    inp = httpclient.InferInput("input", list(wide.shape), "FP32")
    inp.set_data_from_numpy(wide)
    return inp


def _shape_data_mismatch(x: np.ndarray) -> Any:
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=False)
    inp.set_shape([x.shape[0] + 1, *x.shape[1:]])
    return inp


BAD_INPUTS = {
    "unknown name": (_bad_name, "input0"),
    "unsupported datatype": (_bad_datatype, "BYTES"),
    "data not of its datatype": (_data_not_its_datatype, "BOOL"),
    "inner shape": (_bad_inner_shape, "shape"),
    "shape not filled": (_shape_data_mismatch, "shape"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_input_is_refused_with_a_message(front, case):
    client, model = front
    make, named = BAD_INPUTS[case]
    status, message = _refused(lambda: client.infer(model, [make(_rows(client, model))]))
    assert 400 <= status < 500 and named in message, (status, message)
    assert client.is_server_ready()  # still serving


ACCEPTED = {
    "a latency SLO": {"latency_slo_ms": 60000},
    "a key greenctl does not read": {"trace": "abc"},
}
REFUSED = {
    "a negative SLO": ({"latency_slo_ms": -1}, "latency_slo_ms"),
    "an accuracy over 1": ({"min_accuracy": 2}, "min_accuracy"),
    "an unknown greenctl key": ({"max_latency_ms": 3}, "max_latency_ms"),
}


@pytest.mark.parametrize("case", list(ACCEPTED))
def test_parameters_accepted(front, case):
    client, model = front
    x = _rows(client, model, rows=1)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer(model, [inp], parameters=ACCEPTED[case])
    assert result.as_numpy("output").shape[0] == 1


@pytest.mark.parametrize("case", list(REFUSED))
def test_parameters_refused(front, case):
    client, model = front
    params, named = REFUSED[case]
    x = _rows(client, model, rows=1)
    inp = httpclient.InferInput("input", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    status, message = _refused(lambda: client.infer(model, [inp], parameters=params))
    assert status == 400 and named in message, (status, message)


def test_the_contract_is_json_everywhere(front):
    """Every refusal above is an OIP error object: ``{"error": "..."}`` (what tritonclient
    reads its message from), not an HTML page or an empty body."""
    client, model = front
    x = _rows(client, model, rows=1)
    body = json.dumps(
        {"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32", "data": []}]}
    )
    req = urllib.request.Request(
        f"{client.greenctl_url}/v2/models/{model}/infer",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(req, timeout=30)
    assert 400 <= info.value.code < 500
    doc = json.loads(info.value.read())
    assert isinstance(doc.get("error"), str) and doc["error"]
