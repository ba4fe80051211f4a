"""Every HTTP front is strict the same way: the dispatcher, an executor and the geo router,
each a real process on a real socket (:mod:`http_fronts`).

Each answers a complete request even when garbage follows it in the same send, refuses a
declared body over its limit with 413 before reading it, checks a tensor's datatype against
its data and the request's ``parameters`` with one rule (400 naming the input or key), and
opens its admin endpoint only to a loopback client with its token.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.daemon import TOKEN_ENV
from greenctl.executor.runtime.metrics import GRID_INTENSITY, parse_prometheus
from greenctl.executor.runtime.procs import python_module_argv, terminate

pytestmark = pytest.mark.timeout(300)


def _load_fronts():
    path = Path(__file__).with_name("http_fronts.py")
    spec = importlib.util.spec_from_file_location("greenctl_test_http_fronts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


F = _load_fronts()


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory):
    with F.start_fronts(tmp_path_factory.mktemp("strict")) as started:
        yield started


@pytest.fixture(params=F.FRONTS)
def front(request, fronts):
    return fronts[request.param]


def test_a_valid_request_followed_by_garbage_gets_its_answer(front):
    raw = F.request_bytes("POST", "/v2/models/m/infer", F.infer_body()) + b"\x00GARBAGE \r\n\r\n"
    answers, closed = F.raw_exchange(front.port, raw, expect=2)
    assert answers, "no answer to the complete request"
    assert answers[0].status == 200, answers[0].body
    assert (
        answers[0].json()["outputs"][0]["data"] == json.loads(F.infer_body())["inputs"][0]["data"]
    )
    if len(answers) > 1:  # the garbage: 400, then the connection is closed
        assert answers[1].status == 400 and "malformed" in answers[1].json()["error"]
    assert closed or len(answers) == 2
    # two complete requests, then garbage: both answered, in order
    get = F.request_bytes("GET", "/v2/health/live")
    answers, _ = F.raw_exchange(front.port, get + get + b"NOT HTTP\r\n\r\n", expect=3)
    assert [a.status for a in answers[:2]] == [200, 200]
    assert [a.status for a in answers[2:]] in ([], [400])


def test_requests_sent_before_a_half_close_are_answered(front):
    """A client that shuts its sending side after its requests still gets every answer."""
    one = F.request_bytes("POST", "/v2/models/m/infer", F.infer_body())
    answers, closed = F.raw_exchange(front.port, one + one, expect=3, half_close=True)
    assert [a.status for a in answers] == [200, 200] and closed
    # a request cut short by the half-close: those before it answered, then closed
    answers, closed = F.raw_exchange(front.port, one + one[:40], expect=2, half_close=True)
    assert [a.status for a in answers][:1] == [200] and closed


def test_a_declared_body_over_the_limit_is_refused_at_once(front):
    head = F.request_bytes(
        "POST", "/v2/models/m/infer", headers={"Content-Length": str(10**12)}
    )  # no body sent: the answer must not wait for it (the body timeout is 10 s)
    answers, closed = F.raw_exchange(front.port, head, expect=2, timeout_s=5.0)
    assert len(answers) == 1 and answers[0].status == 413, answers
    assert "exceeds the" in answers[0].json()["error"]
    assert closed
    # Expect: 100-continue is answered 413, not 100
    head = F.request_bytes(
        "POST",
        "/v2/models/m/infer",
        headers={"Content-Length": str(10**12), "Expect": "100-continue"},
    )
    answers, _ = F.raw_exchange(front.port, head, timeout_s=5.0)
    assert answers and answers[0].status == 413
    # after a valid request on the same connection: that one is answered first
    raw = F.request_bytes("POST", "/v2/models/m/infer", F.infer_body()) + head
    answers, _ = F.raw_exchange(front.port, raw, expect=2, timeout_s=5.0)
    assert [a.status for a in answers] == [200, 413]


def _tensor(datatype: str, data: object, shape: list[int] | None = None) -> bytes:
    n = len(data) if isinstance(data, list) else 1
    shape = shape if shape is not None else [1, n]
    return json.dumps(
        {"inputs": [{"name": "input", "shape": shape, "datatype": datatype, "data": data}]}
    ).encode()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (_tensor("BOOL", [0.5, 1.0, 0.0, 1.0]), "not BOOL"),
        (_tensor("BOOL", [1, 0, 1, 0]), "not BOOL"),
        (_tensor("INT32", [1, 1.5, 2, 3]), "fractions"),
        (_tensor("UINT8", [1, -1, 2, 3]), "out of range for UINT8"),
        (_tensor("FP32", ["1", "2", "3", "4"]), "not FP32 numbers"),
        (_tensor("FP32", [True, 1.0, 2.0, 3.0]), "true/false"),
        (_tensor("FP32", [1.0, 2.0, 3.0], [1, 4]), "3 values do not fill shape [1, 4]"),
        (_tensor("FP32", [1.0, 2.0, 3.0, 4.0, 5.0], [1, 4]), "5 values do not fill shape"),
        (_tensor("FP32", [1.0, None, 2.0, 3.0]), "not FP32 numbers"),
    ],
)
def test_a_tensor_whose_data_is_not_its_datatype_is_refused_naming_the_input(front, body, says):
    got = F.infer(front.port, body)
    assert got.status == 400, got.body
    error = got.json()["error"]
    assert "inputs[0] 'input'" in error and says in error, error


def test_a_valid_tensor_of_each_datatype_is_served(front):
    for datatype, data in (("BOOL", [True, False, True, True]), ("INT64", [1, 2, 3, 4]),
                           ("FP64", [0.5, 1.5, 2.5, 3.5]), ("UINT8", [0, 255, 1, 2])):  # fmt: skip
        got = F.infer(front.port, _tensor(datatype, data))
        assert got.status == 200, (datatype, got.body)


@pytest.mark.parametrize(
    ("parameters", "says"),
    [
        ({"latency_slo_ms": -1}, "latency_slo_ms"),
        ({"latency_slo_ms": "fast"}, "latency_slo_ms"),
        ({"min_accuracy": 2}, "min_accuracy"),
        ({"latency_slo": 50}, "unknown request parameter 'latency_slo'"),
        ({"greenctl_variant": "v"}, "unknown request parameter"),
    ],
)
def test_parameters_are_checked_by_one_rule_on_every_front(fronts, parameters, says):
    body = F.infer_body(parameters=parameters)
    errors = {}
    for name, front in fronts.items():
        got = F.infer(front.port, body)
        assert got.status == 400, (name, got.body)
        errors[name] = got.json()["error"]
        assert says in errors[name], (name, errors[name])
    assert len(set(errors.values())) == 1, errors  # the same rule, the same words


def test_parameters_greenctl_does_not_read_pass(fronts):
    body = F.infer_body(parameters={"priority": 3, "binary_data_output": False})
    for name, front in fronts.items():
        assert F.infer(front.port, body).status == 200, name


def _grid_intensity(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        flat = parse_prometheus(r.read().decode())
    return next(v for k, v in flat.items() if k.startswith(GRID_INTENSITY))


@pytest.fixture(scope="module")
def energy_executor(tmp_path_factory: pytest.TempPathFactory):
    """An executor counting modeled energy at 400 g/kWh, its token handed over by its
    launcher in the environment (as a supervisor would)."""
    folder = tmp_path_factory.mktemp("energy")
    state = folder / "executor.json"
    argv = python_module_argv(
        "greenctl.executor.runtime.daemon",
        "--model", "m", "--variant", "v", "--input-shape", "4", "--loader", F.NOOP,
        "--state-file", str(state), "--energy-source", "modeled", "--idle-power-w", "0",
        "--energy-j-per-request", "0.5", "--carbon-intensity", "400",
    )  # fmt: skip
    env = {**os.environ, TOKEN_ENV: "launcher-token-1234"}
    with open(folder / "executor.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        doc = F._wait_ready(state, proc, folder / "executor.log")
        yield int(doc["port"]), doc
    finally:
        terminate(proc.pid)
        proc.poll()


def test_the_executor_admin_endpoint_needs_its_token(energy_executor):
    port, doc = energy_executor
    assert doc["token"] == "launcher-token-1234"
    body = json.dumps({"carbon_g_per_kwh": 123.0, "pue": 1.1}).encode()
    for headers in ({}, {hs.TOKEN_HEADER: "wrong"}, {hs.TOKEN_HEADER: ""}):
        answers, _ = F.raw_exchange(port, F.request_bytes("POST", "/admin/carbon", body, headers))
        assert answers and answers[0].status == 403, (headers, answers)
        assert answers[0].json()["error"] == "forbidden"
    assert _grid_intensity(port) == 400.0  # its carbon accounting is unchanged
    headers = {hs.TOKEN_HEADER: doc["token"]}
    answers, _ = F.raw_exchange(port, F.request_bytes("POST", "/admin/carbon", body, headers))
    assert answers[0].status == 200, answers[0].body
    assert _grid_intensity(port) == 123.0


def test_admin_endpoints_need_the_token_on_every_front(front):
    body = b"[1]"  # a bad document: refused 403 without the token, 400 (or 409) with it
    for headers in ({}, {hs.TOKEN_HEADER: "wrong"}, {hs.TOKEN_HEADER: ""}):
        for method in ("GET", "POST") if front.name != "executor" else ("POST",):
            raw = F.request_bytes(method, front.admin_path, body if method == "POST" else b"",
                                  headers)  # fmt: skip
            answers, _ = F.raw_exchange(front.port, raw)
            assert answers and answers[0].status == 403, (front.name, method, headers, answers)
    assert front.token
    raw = F.request_bytes("POST", front.admin_path, body, {hs.TOKEN_HEADER: front.token})
    answers, _ = F.raw_exchange(front.port, raw)
    # the apply's executor counts no energy here: 409 before it reads the document
    assert answers[0].status in ((400, 409) if front.name == "executor" else (400,)), answers


def test_the_executor_token_is_in_its_state_file_only(fronts):
    ex = fronts["executor"]
    assert ex.state_file is not None and ex.state_file.stat().st_mode & 0o077 == 0
    argv = Path(f"/proc/{json.loads(ex.state_file.read_text())['pid']}/cmdline").read_bytes()
    assert ex.token.encode() not in argv


def test_the_admin_rule_refuses_a_client_off_this_machine():
    def request(remote: str | None, token: str) -> SimpleNamespace:
        return SimpleNamespace(remote=remote, headers=hs.Headers({"x-greenctl-token": token}))

    assert hs.admin_allowed(request("127.0.0.1", "t"), "t")
    assert hs.admin_allowed(request("::1", "t"), "t")
    assert not hs.admin_allowed(request("10.0.0.7", "t"), "t")
    assert not hs.admin_allowed(request(None, "t"), "t")
    assert not hs.admin_allowed(request("127.0.0.1", "u"), "t")
