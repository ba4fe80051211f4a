"""An HTTP fuzzer against the three fronts: the dispatcher, an executor and the geo router,
real processes started once for the module (:mod:`http_fronts`).

Hypothesis generates connections: one to four requests in one send (methods, paths,
headers, ``Content-Length`` or chunked bodies, JSON inference bodies with wrong types,
shapes, datatypes and parameters, Triton binary-extension bodies and headers), sometimes
followed by garbage, cut short, or a declared body over the limit. Each front must answer
every complete request it was sent, in order, never with a 5xx, and serve a valid inference
after each connection (and its admin endpoint stays closed). ``HYPOTHESIS_PROFILE=deep`` (``just fuzz``) runs ten times the
examples.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from greenctl.executor.runtime import oip
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.timeout(900)

#: ``HYPOTHESIS_PROFILE=deep``: ten times the examples (``just fuzz``)
DEEP = os.environ.get("HYPOTHESIS_PROFILE", "") == "deep"
EXAMPLES = 1500 if DEEP else 150
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _load_fronts():
    path = Path(__file__).with_name("http_fronts.py")
    spec = importlib.util.spec_from_file_location("greenctl_test_http_fronts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


F = _load_fronts()
ROW = F.ROW


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory):
    with F.start_fronts(tmp_path_factory.mktemp("fuzz")) as started:
        yield started


# -- strategies ----------------------------------------------------------------------------
_text = st.text(st.characters(codec="utf-8"), max_size=6)
_junk = st.one_of(
    st.none(), _text, st.booleans(), st.integers(-5, 5), st.lists(st.integers(), max_size=2),
    st.dictionaries(_text, st.integers(), max_size=2),
)  # fmt: skip
_number = st.one_of(
    st.integers(-300, 300),
    st.floats(-1e6, 1e6, allow_nan=False),
    st.sampled_from([0.5, 1e308, -0.0, 2**63, 2**64]),
)
_dtype = st.one_of(st.sampled_from([*oip.DTYPES, "BYTES", "FP8", "fp32"]), _junk)
_shape = st.one_of(
    st.builds(lambda n: [n, ROW], st.integers(0, 20)),
    st.just([ROW]),
    st.lists(st.one_of(st.integers(-2, 6), st.booleans(), st.floats(0, 3)), max_size=4),
    st.just([1, 2**40]),
    _junk,
)


@st.composite
def _input(draw: st.DrawFn) -> dict[str, Any]:
    """One input tensor: often right for the no-op model (``[-1, 4]``), often not."""
    shape = draw(_shape)
    dtype = draw(_dtype)
    item: dict[str, Any] = {"name": draw(st.one_of(st.just("input"), _text, _junk))}
    item["shape"], item["datatype"] = shape, dtype
    n = math.prod(shape) if isinstance(shape, list) and all(type(d) is int for d in shape) else 4
    n = max(0, min(n, 64))
    values = st.booleans() if dtype == "BOOL" and draw(st.booleans()) else _number
    data = draw(st.one_of(st.lists(values, min_size=n, max_size=n), st.lists(
        st.one_of(_number, _junk), max_size=8), _junk))  # fmt: skip
    if draw(st.integers(0, 5)):
        item["data"] = data
    if draw(st.integers(0, 6)) == 0:
        item["parameters"] = draw(
            st.one_of(_junk, st.fixed_dictionaries({"binary_data_size": st.integers(-4, 80)}))
        )
    if draw(st.integers(0, 8)) == 0:
        item.pop(draw(st.sampled_from(["name", "shape", "datatype"])))
    return item


_PARAMETERS = st.one_of(
    _junk,
    st.fixed_dictionaries({"latency_slo_ms": st.one_of(_number, _junk)}),
    st.fixed_dictionaries({"min_accuracy": st.one_of(_number, _junk)}),
    st.fixed_dictionaries({"binary_data_output": st.booleans()}),
    st.dictionaries(st.sampled_from(["slo", "variant", "carbon", "priority", "x"]), _number,
                    max_size=2),
)  # fmt: skip


@st.composite
def _json_body(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A JSON inference body: a valid request with one field changed, or nonsense."""
    if draw(st.booleans()):
        doc: Any = json.loads(F.infer_body(draw(st.integers(1, 3))))
    else:
        doc = {"inputs": draw(st.lists(_input(), max_size=3))}
    if draw(st.integers(0, 3)) == 0:
        doc["parameters"] = draw(_PARAMETERS)
    if draw(st.integers(0, 4)) == 0:
        doc["outputs"] = draw(st.one_of(_junk, st.lists(
            st.fixed_dictionaries({"name": st.one_of(st.just("output"), _text),
                                   "parameters": st.one_of(_junk, st.just({"binary_data": True}))}),
            max_size=2)))  # fmt: skip
    if draw(st.integers(0, 4)) == 0:
        doc["id"] = draw(st.one_of(_text, _junk))
    if draw(st.integers(0, 8)) == 0:
        doc = draw(_junk)
    text = json.dumps(doc).encode()
    cut = draw(st.integers(0, 12))
    if cut == 0:
        text = text[: draw(st.integers(0, len(text)))]
    elif cut == 1:
        text = b'{"inputs": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    elif cut == 2:
        text = draw(st.binary(max_size=40))
    return text, {"Content-Type": draw(st.sampled_from(["application/json", "text/plain", "x"]))}


@st.composite
def _binary_body(draw: st.DrawFn) -> tuple[bytes, dict[str, str]]:
    """A Triton binary-extension body whose sizes and header length agree, or do not."""
    rows = draw(st.integers(0, 4))
    dtype = draw(st.sampled_from(["float32", "float64", "int8", "bool", "uint16"]))
    x = (np.arange(rows * ROW) % 3).astype(dtype).reshape(rows, ROW)
    body, headers = oip.encode_request(
        [("input", x)], binary=True, binary_outputs=draw(st.booleans())
    )
    wrong = draw(st.integers(0, 6))
    if wrong == 0:
        body = body[:-1]
    elif wrong == 1:
        body += b"\x00" * draw(st.integers(1, 9))
    elif wrong == 2:
        headers[oip.HEADER_LENGTH] = draw(st.one_of(
            st.integers(-3, len(body) + 3).map(str),
            st.sampled_from(["", "x", "+1", " 5", "1e3", str(10**30), "\u00b2"])))  # fmt: skip
    elif wrong == 3:
        headers.pop(oip.HEADER_LENGTH)
    return body, headers


_INFER = st.sampled_from(["/v2/models/m/infer", "/v2/models/m/versions/1/infer"])
_PATHS = st.one_of(
    _INFER,
    _INFER,
    _INFER,
    st.sampled_from([
        "/v2", "/v2/health/live", "/v2/health/ready", "/v2/models/m", "/v2/models/m/ready",
        "/v2/models/m/infer", "/v2/models/m/versions/1/infer", "/v2/models/v/infer",
        "/v2/models/nope/infer", "/metrics", "/admin/routes", "/admin/carbon", "/admin/geo",
        "/", "/v2/models//infer", "/v2/models/m/infer?x=1", "/v2/models/%2e%2e/infer",
        "/v2/models/m/infer/", "/" + "a" * 300,
    ]),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=20).map(
        lambda t: "/" + t),
)  # fmt: skip
_METHODS = st.sampled_from(["POST"] * 6 + ["GET", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"])
_HEADERS = st.dictionaries(
    st.sampled_from([
        "Greenctl-Gateway", "X-Greenctl-Token", "Accept-Encoding", "Content-Encoding",
        "Greenctl-Variant", "X-Junk", "Accept", "User-Agent",
    ]),
    st.one_of(st.sampled_from(["g1", "g9", "", "gzip", "identity", "m", "v"]),
              st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)),
    max_size=3,
)  # fmt: skip


@dataclass
class Sent:
    """One request of a connection: its bytes, method and whether the server then closes."""

    raw: bytes
    method: str
    closes: bool


@st.composite
def _request(draw: st.DrawFn) -> Sent:
    method = draw(_METHODS)
    path = draw(_PATHS)
    headers = draw(_HEADERS)
    body = b""
    if method in ("POST", "PUT", "PATCH") or draw(st.integers(0, 5)) == 0:
        body, more = draw(st.one_of(_json_body(), _binary_body()))
        headers.update(more)
    closes = draw(st.integers(0, 9)) == 0
    if closes:
        headers["Connection"] = "close"
    if draw(st.integers(0, 9)) == 0:
        headers["Expect"] = "100-continue"
    if body and draw(st.integers(0, 5)) == 0:  # chunked
        size = draw(st.integers(1, max(1, len(body))))
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        framed = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
        headers["Transfer-Encoding"] = "chunked"
        head = F.request_bytes(method, path, b"", headers)
        # the whole header line only: "Inference-Header-Content-Length: 0" stays whole
        head = head.replace(b"\r\nContent-Length: 0\r\n", b"\r\n")
        return Sent(head + framed, method, closes)
    headers["Content-Length"] = str(len(body))
    return Sent(F.request_bytes(method, path, body, headers), method, closes)


_TAILS = st.one_of(
    st.just(b""),
    st.just(b""),
    st.binary(min_size=1, max_size=30).map(lambda b: b"\x00" + b),
    st.sampled_from([b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"\r\n\r\n\r\n",
                     b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
                     b"GET /v2 HTTP/1.1\r\nHost: t\r\nX: \x01\r\n\r\n",
                     b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n",
                     b"POST /v2/models/m/infer HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"]),
)  # fmt: skip


@st.composite
def connections(draw: st.DrawFn) -> tuple[list[Sent], bytes, bool]:
    """Requests sent in one go, the bytes after them (garbage, or the start of a request
    cut short), and whether our side then shuts writing (the server sees the cut)."""
    sent = draw(st.lists(_request(), min_size=1, max_size=4))
    tail = draw(_TAILS)
    if not tail and draw(st.integers(0, 4)) == 0:
        cut = draw(_request())
        tail = cut.raw[: draw(st.integers(1, max(1, len(cut.raw) - 1)))]
    return sent, tail, bool(tail) and draw(st.booleans())


# -- reading answers -----------------------------------------------------------------------
def _complete(sent: list[Sent]) -> list[Sent]:
    """The requests the server must answer: up to the first that asks it to close."""
    out = []
    for s in sent:
        out.append(s)
        if s.closes:
            break
    return out


def _read_answers(sock: socket.socket, expect: list[str], wait_close: bool) -> list[int]:
    """The statuses answered, in order, until each expected request (its method: HEAD
    answers carry no body) has its answer and, with ``wait_close``, the server closed."""
    data = b""
    statuses: list[int] = []
    closed = False
    while True:
        while b"\r\n\r\n" in data:
            head, _, rest = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            if status == 100:
                data = rest
                continue
            length = 0
            is_head = len(statuses) < len(expect) and expect[len(statuses)] == "HEAD"
            for line in lines[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length" and not is_head:
                    length = int(v.strip())
            if len(rest) < length:
                break
            statuses.append(status)
            data = rest[length:]
        if closed or (len(statuses) >= len(expect) and not wait_close):
            return statuses
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            closed = True
        data += chunk


def _exchange(port: int, conn: tuple[list[Sent], bytes, bool]) -> None:
    """Send one generated connection; check every complete request got a 2xx-4xx answer."""
    sent, tail, shut = conn
    complete = _complete(sent)
    with socket.create_connection(("127.0.0.1", port), timeout=8.0) as sock:
        sock.sendall(b"".join(s.raw for s in sent) + tail)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        statuses = _read_answers(sock, [s.method for s in complete], shut)
    for status in statuses:
        event(f"HTTP {status}")
        assert status < 500, (status, conn)
    assert len(statuses) >= len(complete), (statuses, [s.raw[:160] for s in complete], tail[:60])


def _still_serves(port: int) -> None:
    got = F.infer(port)
    assert got.status == 200, got.body


def _fuzz(front: str):
    @FUZZ
    @given(conn=connections())
    def run(fronts, conn):
        _exchange(fronts[front].port, conn)
        _still_serves(fronts[front].port)

    return run


test_fuzz_the_dispatcher = _fuzz("dispatcher")
test_fuzz_an_executor = _fuzz("executor")
test_fuzz_the_geo_router = _fuzz("georouter")


@pytest.mark.parametrize("front", F.FRONTS)
def test_every_front_still_serves_and_answers_admin_only_with_its_token(fronts, front):
    """After the fuzzing: a valid inference is served and admin is still closed."""
    port = fronts[front].port
    _still_serves(port)
    raw = F.request_bytes("GET" if front != "executor" else "POST", fronts[front].admin_path)
    answers, _ = F.raw_exchange(port, raw)
    assert answers and answers[0].status == 403
