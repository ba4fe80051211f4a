"""Malformed and hostile requests against a real executor daemon and the dispatcher: every
answer is 2xx or 4xx, never 5xx, never a hang.

The executor is the daemon process with the no-op model (input ``[-1, 2, 3]``, batch 2, so at
most 16 rows per request); requests go over raw sockets with timeouts, so a hung server
fails the test instead of stalling the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.procs import python_module_argv, read_json, terminate
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

NOOP = "greenctl.executor.runtime.daemon:noop_loader"
ROW = (2, 3)
BATCH = 2
MAX_ROWS = 8 * BATCH

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def executor(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The port of an executor daemon serving model ``m`` with the no-op model."""
    folder = tmp_path_factory.mktemp("hostile")
    state = folder / "executor.json"
    argv = python_module_argv(
        "greenctl.executor.runtime.daemon",
        "--model", "m", "--variant", "v", "--input-shape", ",".join(map(str, ROW)),
        "--batch", str(BATCH), "--loader", NOOP, "--state-file", str(state),
    )  # fmt: skip
    with open(folder / "executor.log", "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        doc = None
        while time.monotonic() < deadline and proc.poll() is None:
            doc = read_json(state)
            if doc and (doc.get("ready") or doc.get("error")):
                break
            time.sleep(0.05)
        assert doc and doc.get("ready"), (folder / "executor.log").read_text()
        yield int(doc["port"])
    finally:
        terminate(proc.pid)
        proc.poll()


def _exchange(
    port: int, raw: bytes, *, timeout_s: float = 15.0
) -> tuple[int, dict[str, str], bytes]:
    """Send ``raw``, read one response (status, lower-cased headers, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(raw)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            assert chunk, f"connection closed without an answer to {raw[:200]!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = s.recv(65536)
            assert chunk, "connection closed mid-answer"
            body += chunk
        return int(lines[0].split()[1]), headers, body


def _post(
    port: int, body: bytes, headers: dict[str, str] | None = None, *, model: str = "m"
) -> tuple[int, dict[str, str], bytes]:
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: t\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return _exchange(port, head.encode("latin-1") + body)


def _never_5xx(status: int, body: bytes) -> None:
    event(f"HTTP {status}")  # --hypothesis-show-statistics: how many were served
    assert 200 <= status < 500, f"{status}: {body[:300]!r}"
    if status >= 400:
        assert "error" in json.loads(body)


# -- strategies ----------------------------------------------------------------------------
_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.just(1e308),
    st.booleans(),
)
_junk = st.one_of(
    st.none(),
    st.text(max_size=5),
    st.booleans(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_data = st.recursive(
    st.lists(st.one_of(_numbers, _junk), max_size=8),
    lambda inner: st.lists(inner, max_size=3),
    max_leaves=30,
)
_dim = st.one_of(
    st.integers(0, 20),
    st.integers(-3, -1),
    st.booleans(),
    st.just(2**64),
    st.floats(0, 5),
    st.text(max_size=2),
)
_shape = st.one_of(
    st.lists(_dim, max_size=5),
    st.builds(lambda n: [n, *ROW], st.integers(0, MAX_ROWS + 4)),
    st.just(list(ROW)),
    _junk,
)
_dtype = st.one_of(st.sampled_from([*oip.DTYPES, "FP8", "BYTES"]), _junk)
_name = st.one_of(st.just("input"), st.just("input"), st.text(max_size=4), st.integers())


_MUTATIONS = [
    lambda d: d["inputs"][0]["data"].__setitem__(0, 1e400),
    lambda d: d["inputs"][0]["data"].__setitem__(0, None),
    lambda d: d["inputs"][0]["data"].__setitem__(0, "7"),
    lambda d: d["inputs"][0]["data"].append(1),
    lambda d: d["inputs"][0]["shape"].__setitem__(0, True),
    lambda d: d["inputs"][0]["shape"].__setitem__(0, -1),
    lambda d: d["inputs"][0]["shape"].__setitem__(0, 1.0),
    lambda d: d["inputs"][0].__setitem__("name", "x"),
    lambda d: d["inputs"][0].__setitem__("datatype", "FP8"),
    lambda d: d["inputs"][0].pop("shape"),
    lambda d: d["inputs"].append({**d["inputs"][0], "name": "evil"}),
    lambda d: d.__setitem__("outputs", [{"name": "logits"}]),
    lambda d: d.__setitem__("outputs", "output"),
    lambda d: d.__setitem__("id", {"a": 1}),
]


@st.composite
def valid_json_requests(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A well formed request (its rows at most a little over the limit), and now and then
    one thing wrong with it; and whether it must be served."""
    rows = draw(st.integers(1, MAX_ROWS + 2))
    squeeze = draw(st.integers(0, 4)) == 0
    shape = list(ROW) if squeeze else [rows, *ROW]
    dtype = draw(st.sampled_from(["FP32", "FP64", "FP16", "INT32", "INT64", "UINT8", "BOOL"]))
    count = math.prod(shape)
    values = st.booleans() if dtype == "BOOL" else st.integers(0, 100)
    data = draw(st.lists(values, min_size=count, max_size=count))
    doc: dict[str, Any] = {
        "inputs": [{"name": "input", "shape": shape, "datatype": dtype, "data": data}]
    }
    if draw(st.booleans()):
        doc["id"] = draw(st.text(max_size=4))
    if draw(st.booleans()):
        doc["outputs"] = [{"name": "output", "parameters": {"binary_data": draw(st.booleans())}}]
    mutated = draw(st.integers(0, 2)) == 0
    if mutated:
        draw(st.sampled_from(_MUTATIONS))(doc)
    served = not mutated and (squeeze or rows <= MAX_ROWS)
    return json.dumps(doc).encode(), served


@st.composite
def json_requests(draw: st.DrawFn) -> tuple[bytes, bool]:
    """Inference requests, from well formed (a good share must be served) to nonsense."""
    if draw(st.booleans()):
        return draw(valid_json_requests())
    items = []
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(_shape)
        item: dict[str, Any] = {"name": draw(_name), "shape": shape, "datatype": draw(_dtype)}
        if (
            draw(st.booleans())
            and isinstance(shape, list)
            and all(type(d) is int and 0 <= d <= 20 for d in shape)
        ):
            item["data"] = [0.5] * math.prod(shape)  # fills the shape
        else:
            item["data"] = draw(_data)
        if draw(st.integers(0, 4)) == 0:
            item["parameters"] = draw(
                st.one_of(_junk, st.fixed_dictionaries({"binary_data_size": _dim}))
            )
        if draw(st.integers(0, 6)) == 0:
            del item[draw(st.sampled_from(["name", "shape", "datatype", "data"]))]
        items.append(item)
    doc: dict[str, Any] = {"inputs": items}
    if draw(st.booleans()):
        doc["id"] = draw(st.one_of(st.text(max_size=4), _junk, st.integers()))
    if draw(st.integers(0, 3)) == 0:
        doc["outputs"] = draw(
            st.one_of(
                _junk,
                st.lists(
                    st.fixed_dictionaries(
                        {
                            "name": _name,
                            "parameters": st.one_of(_junk, st.just({"binary_data": True})),
                        }
                    ),
                    max_size=2,
                ),
            )
        )
    if draw(st.integers(0, 3)) == 0:
        doc["parameters"] = draw(st.one_of(_junk, st.just({"binary_data_output": True})))
    text = json.dumps(doc)
    mangle = draw(st.integers(0, 9))
    if mangle == 0:
        text = text.replace("0.5", "1e400", 1)
    elif mangle == 1:
        text = text[: draw(st.integers(0, len(text)))]  # cut short
    elif mangle == 2:
        depth = draw(st.integers(1, 50_000))
        text = '{"inputs": ' + "[" * depth + "]" * depth + "}"
    return text.encode(), False


@st.composite
def valid_binary_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str], bool]:
    """A well formed binary request, sometimes with its size, blob or header length off."""
    rows = draw(st.integers(1, MAX_ROWS + 2))
    dtype = draw(st.sampled_from(["float32", "float64", "int8", "uint16", "bool"]))
    x = (np.arange(rows * 6) % 5).astype(dtype).reshape(rows, *ROW)
    body, headers = oip.encode_request(
        [("input", x)], binary=True, binary_outputs=draw(st.booleans())
    )
    head = int(headers[oip.HEADER_LENGTH])
    wrong = draw(st.integers(0, 5))
    if wrong == 0:
        body = body[:-1]
    elif wrong == 1:
        body += b"\0"
    elif wrong == 2:
        headers[oip.HEADER_LENGTH] = str(head + draw(st.sampled_from([-1, 1, 8])))
    served = wrong > 2 and rows <= MAX_ROWS
    return body, headers, served


@st.composite
def binary_requests(draw: st.DrawFn) -> tuple[bytes, dict[str, str], bool]:
    """Requests with Triton's binary tensor extension: sizes, blobs and header lengths that
    agree with the shape or do not."""
    if draw(st.booleans()):
        return draw(valid_binary_requests())
    rows = draw(st.integers(0, MAX_ROWS + 2))
    shape = draw(st.one_of(st.just([rows, *ROW]), st.just(list(ROW)), _shape))
    dtype = draw(st.sampled_from(["FP32", "FP32", "FP64", "INT8", "BOOL", "UINT16"]))
    itemsize = np.dtype(oip.DTYPES[dtype]).itemsize
    right = (
        math.prod(shape) * itemsize
        if isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)
        else 24
    )
    size = draw(
        st.one_of(st.just(right), st.just(right), st.integers(-4, right + 8), st.just(10**9), _junk)
    )
    items = [
        {
            "name": draw(_name),
            "shape": shape,
            "datatype": dtype,
            "parameters": {"binary_data_size": size},
        }
    ]
    if draw(st.integers(0, 4)) == 0:
        items.append(
            {
                "name": draw(_name),
                "shape": [1],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 4},
            }
        )
    doc: dict[str, Any] = {"inputs": items}
    if draw(st.booleans()):
        doc["outputs"] = [{"name": draw(_name), "parameters": {"binary_data": draw(st.booleans())}}]
    head = json.dumps(doc).encode()
    fits = right if right <= 1 << 20 else 24  # a declared size is not a blob to build
    blob_len = draw(st.one_of(st.just(fits), st.just(fits), st.integers(0, fits + 16)))
    blob = b"\x01" * blob_len
    length = draw(
        st.one_of(
            st.just(str(len(head))),
            st.just(str(len(head))),
            st.integers(-5, len(head) + blob_len + 5).map(str),
            st.sampled_from(["", "abc", "1_0", "+5", " 7", "\u00b2", str(10**30)]),
        )
    )
    headers = {oip.HEADER_LENGTH: length, "Content-Type": "application/octet-stream"}
    return head + blob, headers, False


# -- the fuzz tests ------------------------------------------------------------------------
@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=json_requests())
def test_fuzzed_json_requests_get_2xx_or_4xx(executor, request):
    body, served = request
    status, rh, answer = _post(executor, body)
    _never_5xx(status, answer)
    if served:
        assert status == 200, answer
        length = rh.get(oip.HEADER_LENGTH.lower())
        out = oip.decode_response(answer, int(length) if length else None)["output"]
        sent = json.loads(body)["inputs"][0]
        assert list(out.shape) == sent["shape"]  # the no-op model answers its input
        assert np.array_equal(out.reshape(-1), np.asarray(sent["data"], np.float32))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(request=binary_requests())
def test_fuzzed_binary_requests_get_2xx_or_4xx(executor, request):
    body, headers, served = request
    status, rh, answer = _post(executor, body, headers)
    _never_5xx(status, answer)
    if served:
        assert status == 200, answer
        length = rh.get(oip.HEADER_LENGTH.lower())
        out = oip.decode_response(answer, int(length) if length else None)["output"]
        _, sent = oip.decode_request(body, int(headers[oip.HEADER_LENGTH]))
        assert np.array_equal(out, sent[0][1].astype(np.float32))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    line=st.one_of(
        st.binary(max_size=60),
        st.sampled_from([b"GET /v2 HTTP/1.1", b"POST /v2/models/m/infer HTTP/1.1", b"GET * HTTP/1.1",
                         b"GET http://[::1 HTTP/1.1", b"PRI * HTTP/2.0", b"GET /v2 HTTP/9.9"]),
    ),
    headers=st.lists(
        st.one_of(
            st.binary(max_size=40),
            st.sampled_from([b"Content-Length: -1", b"Content-Length: 99999999999999999999",
                             b"Content-Length: 5", b"Transfer-Encoding: chunked",
                             b"Transfer-Encoding: gzip", b"Content-Length: 1\r\nContent-Length: 2",
                             b"Connection: upgrade\r\nUpgrade: h2c", b"Expect: 100-continue",
                             b"Inference-Header-Content-Length: 3"]),
        ),
        max_size=4,
    ),
    body=st.binary(max_size=40),
)  # fmt: skip
def test_fuzzed_http_gets_an_answer_or_a_close_never_5xx_or_a_hang(line, headers, body):
    """Raw request bytes against the executor's routes on a server with short timeouts: it
    answers 2xx/4xx or closes, within its timeouts."""
    raw = line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body

    async def scenario() -> bytes:
        router = hs.Router()

        async def ok(request: hs.Request) -> hs.Response:
            await request.read()
            return hs.json_response({"ok": True})

        oip.add_protocol_routes(
            router, server_meta=ok, live=ok, ready=ok, model_meta=ok, model_ready=ok, infer=ok,
            metrics=ok,
        )  # fmt: skip
        server = hs.Server(
            router, header_timeout_s=0.3, body_timeout_s=0.3, request_timeout_s=1, keepalive_s=0.5
        )
        port = await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(raw)
        try:
            got = await asyncio.wait_for(reader.read(), 5)  # the server closes within ~1.5 s
        except ConnectionResetError:
            got = b""
        writer.close()
        await server.shutdown()
        return got

    got = asyncio.run(scenario())
    for status in (int(m.split(b" ")[1]) for m in got.split(b"\r\n") if m.startswith(b"HTTP/1.1 ")):
        assert 100 <= status < 500, got[:300]


# -- the named cases -----------------------------------------------------------------------
def _infer_json(port: int, doc: Any) -> tuple[int, dict[str, Any]]:
    status, _, body = _post(port, json.dumps(doc).encode())
    return status, json.loads(body)


def _input(rows: int, name: str = "input") -> dict[str, Any]:
    return {"name": name, "shape": [rows, *ROW], "datatype": "FP32", "data": [0.0] * (rows * 6)}


def test_rows_per_request_are_capped_with_a_message_naming_the_limit(executor):
    assert _infer_json(executor, {"inputs": [_input(MAX_ROWS)]})[0] == 200
    status, doc = _infer_json(executor, {"inputs": [_input(MAX_ROWS + 1)]})
    assert status == 400
    assert (
        f"{MAX_ROWS + 1} rows in one request are over this executor's limit of {MAX_ROWS}"
        in doc["error"]
    )
    assert "--max-rows" in doc["error"]
    # a big tensor is refused before its data is even read
    x = np.zeros((2000, *ROW), np.float32)
    body, headers = oip.encode_request([("input", x)], binary=True)
    status, _, answer = _post(executor, body, headers)
    assert status == 400 and "2000 rows" in json.loads(answer)["error"]
    status, _, meta = _exchange(executor, b"GET /v2/models/m HTTP/1.1\r\nHost: t\r\n\r\n")
    assert json.loads(meta)["parameters"]["max_rows_per_request"] == MAX_ROWS


def test_inputs_and_outputs_the_model_does_not_have_are_refused(executor):
    status, doc = _infer_json(executor, {"inputs": [_input(1), _input(1, "evil")]})
    assert status == 400 and "has no input 'evil'; its one input is 'input'" in doc["error"]
    status, doc = _infer_json(executor, {"inputs": [_input(1, "x")]})
    assert status == 400 and "no input 'x'" in doc["error"]
    status, doc = _infer_json(executor, {"inputs": [_input(1), _input(1)]})
    assert status == 400 and "given 2 times" in doc["error"]
    status, doc = _infer_json(executor, {"inputs": [_input(1)], "outputs": [{"name": "logits"}]})
    assert status == 400 and "no output 'logits'" in doc["error"]
    status, doc = _infer_json(executor, {"inputs": [_input(0)]})
    assert status == 400 and "no rows" in doc["error"]


def test_the_issues_500s_are_now_400s(executor):
    x = [0.5] * 6
    cases = [
        b'{"inputs": [{"name": "input", "shape": [true, 2, 3], "datatype": "FP32", "data": %s}]}'
        % json.dumps(x).encode(),
        b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"inputs": [{"name": "input", "shape": [1, 2, 3], "datatype": "FP32", '
        b'"data": [1e400, 1, 1, 1, 1, 1]}]}',
        b'{"inputs": [{"name": "input", "shape": [1, 2, 3], "datatype": "FP32", '
        b'"parameters": {"binary_data_size": 1e400}}]}',
    ]
    for body in cases:
        status, _, answer = _post(executor, body)
        assert status == 400, answer
    blob = np.zeros((1, *ROW), np.float32).tobytes()
    head = json.dumps(
        {"inputs": [{"name": "input", "shape": [1, *ROW], "datatype": "FP32",
                     "parameters": {"binary_data_size": 10**9}}]}
    ).encode()  # fmt: skip
    status, _, answer = _post(executor, head + blob, {oip.HEADER_LENGTH: str(len(head))})
    assert status == 400 and b"does not match shape" in answer


def test_the_dispatcher_answers_malformed_requests_with_4xx(run_store, loaders):
    """The dispatcher forwards bodies as bytes: the executor's 400s pass through (not 502),
    and its own HTTP front refuses malformed HTTP with 400 and bad admin documents too."""
    from greenctl.data.plan import Deployment, Plan
    from greenctl.executor.deploy.apply import apply_plan

    plan = Plan(
        kind="mix",
        deployments=[Deployment(model="m", variant="v", resource="cpu:1", count=1, batch=2)],
    )
    result = apply_plan(plan, store=run_store, loader=loaders["noop"])
    port = int((result.dispatcher_url or "").rsplit(":", 1)[1])
    x = np.zeros((1, 4), np.float32)
    body, headers = oip.encode_request([("input", x)], binary=True)
    assert _post(port, body, headers)[0] == 200
    bad = [
        (b'{"inputs": [{"name": "input", "shape": [true, 4], "datatype": "FP32", "data": [1,2,3,4]}]}', {}),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {}),
        (body, {oip.HEADER_LENGTH: "-3"}),
        (body, {oip.HEADER_LENGTH: "nope"}),
    ]  # fmt: skip
    for raw, extra in bad:
        status, _, answer = _post(port, raw, {**headers, **extra} if extra else {})
        assert status == 400, answer
    assert _post(port, body, headers, model="nope")[0] == 404
    status, _, answer = _exchange(port, b"THIS IS NOT HTTP\r\n\r\n")
    assert status == 400
    states = Path(os.environ["GREENCTL_STATE_DIR"]).glob("dispatcher-*.json")
    token = next(t for f in states if (t := (read_json(f) or {}).get("token")))
    for doc in (b"[1]", b'{"models": [1]}', b"[" * 100_000):
        head = (
            f"POST /admin/routes HTTP/1.1\r\nHost: t\r\nContent-Length: {len(doc)}\r\n"
            f"X-Greenctl-Token: {token}\r\n\r\n"
        ).encode()
        status, _, answer = _exchange(port, head + doc)
        assert status == 400, answer
    assert _post(port, body, headers)[0] == 200  # still serving the plan it had
