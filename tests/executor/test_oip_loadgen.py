"""OIP tensor encoding (JSON and binary extension) and the load generator's arrivals/traces."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from greenctl.data.bundled import path_of
from greenctl.data.errors import FileFormatError, InputError
from greenctl.executor.runtime import oip
from greenctl.executor.runtime.loadgen import (
    arrival_times,
    check_endpoint,
    model_input,
    read_trace,
    run_load,
)
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    dtype=st.sampled_from(["float32", "float64", "int64", "int32", "uint8", "bool"]),
    binary=st.booleans(),
)
def test_request_round_trip(shape, dtype, binary):
    arr = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    body, headers = oip.encode_request([("x", arr)], binary=binary, request_id="7")
    length = int(headers[oip.HEADER_LENGTH]) if oip.HEADER_LENGTH in headers else None
    doc, tensors = oip.decode_request(body, length)
    assert doc["id"] == "7" and tensors[0][0] == "x"
    assert tensors[0][1].dtype == arr.dtype and np.array_equal(tensors[0][1], arr)


def test_binary_inputs_are_views_of_the_body_not_copies():
    """A 224x224 image is 600 KB: decoding it must not copy it (each copy was CPU per request
    in the executor), and a big-endian FP32 tensor still decodes to native values."""
    arr = np.random.default_rng(1).random((2, 3, 8, 8)).astype(np.float32)
    body, headers = oip.encode_request([("x", arr)], binary=True)
    _, tensors = oip.decode_request(body, int(headers[oip.HEADER_LENGTH]))
    got = tensors[0][1]
    assert np.array_equal(got, arr) and not got.flags.writeable  # a view of the body
    assert np.shares_memory(got, np.frombuffer(body, dtype=np.uint8))


def test_the_load_generator_asks_for_binary_outputs_like_tritonclient(monkeypatch):
    import io
    import json
    import urllib.request

    meta = {"inputs": [{"name": "input", "datatype": "FP32", "shape": [-1, 3]}]}
    monkeypatch.setattr(
        urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(json.dumps(meta).encode())
    )
    body, headers = model_input("http://127.0.0.1:1", "m")
    doc = json.loads(body[: int(headers[oip.HEADER_LENGTH])])
    assert doc["parameters"] == {"binary_data_output": True}


def test_response_binary_when_asked():
    out = np.ones((2, 3), dtype=np.float32)
    request = {"id": "a", "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}
    body, headers = oip.encode_response("m", [("output", out)], request=request)
    assert headers["Content-Type"] == "application/octet-stream"
    decoded = oip.decode_response(body, int(headers[oip.HEADER_LENGTH]))
    assert np.array_equal(decoded["output"], out)
    body, headers = oip.encode_response("m", [("output", out)], request={"id": "b"})
    assert b'"data":[1.0,1.0,1.0,1.0,1.0,1.0]' in body and oip.HEADER_LENGTH not in headers


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "not valid JSON"),
        (b'{"inputs": []}', "non-empty 'inputs'"),
        (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP8", "data": [1, 2]}]}', "FP8"),
        (
            b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}',
            "do not fill",
        ),
    ],
)
def test_bad_requests_name_the_problem(body, message):
    with pytest.raises(InputError, match=message):
        oip.decode_request(body)


def _json_input(**fields):
    item = {"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2], **fields}
    return json.dumps({"inputs": [item]}).encode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        # what gave 500s: a bool is an int to Python, deep nesting, numbers out of range
        (_json_input(shape=[True, 2]), "whole numbers"),
        (b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1e400]}]}',
            "out of range for FP32",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": [1e400]}]}',
            "out of range for INT32",
        ),
        (_json_input(datatype="FP16", data=[1, 70000]), "out of range for FP16"),
        (_json_input(datatype="UINT8", data=[1, 300]), "out of range for UINT8"),
        (_json_input(datatype="INT8", data=[1, 1.5]), "out of range for INT8"),
        (_json_input(data=[1, 10**30]), "not FP32 numbers"),
        (_json_input(data=[1, None]), "not FP32 numbers"),
        (_json_input(data=[1, "2"]), "not FP32 numbers"),
        (_json_input(data=[[1], [2, 3]]), "data"),
        (_json_input(data=5), "must be a list"),
        (
            b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
            "not valid JSON",
        ),
        (_json_input(shape=[2] * 40, data=[]), "at most 32"),
        (_json_input(shape=[0, 2**70], data=[]), "shape"),
        (_json_input(datatype=["FP32"]), "not supported"),
        (_json_input(name=7), "string 'name'"),
        (_json_input(parameters=[1]), "parameters must be an object"),
        (json.dumps({"inputs": [], "id": 1}).encode(), "non-empty"),
        (json.dumps({"inputs": [{}], "id": [1]}).encode(), "'id' must be a string"),
        (_json_input().replace(b"}]}", b'}], "outputs": 5}'), "'outputs' must be a list"),
        (_json_input().replace(b"}]}", b'}], "outputs": [{"name": 1}]}'), "outputs\\[0\\]"),
        (_json_input().replace(b"}]}", b'}], "parameters": []}'), "'parameters' must be"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_malformed_requests_are_input_errors_not_crashes(body, message):
    with pytest.raises(InputError, match=message):
        oip.decode_request(body)


def _binary(size, blob_len, *, header_length=None):
    head = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [2, 3], "datatype": "FP32",
                 "parameters": {"binary_data_size": size}}
            ]
        }
    ).encode()  # fmt: skip
    length = len(head) if header_length is None else header_length
    return head + b"\0" * blob_len, length


@pytest.mark.parametrize(
    ("size", "blob_len", "header_length", "message"),
    [
        (10**9, 24, None, "does not match shape"),  # the blob fits: the size must still match
        (24, 12, None, "12 binary bytes left"),
        (24, 30, None, "6 bytes after the JSON header"),
        (24.0, 24, None, "does not match"),
        (True, 24, None, "does not match"),
        (-24, 24, None, "does not match"),
        ("24", 24, None, "does not match"),
        (24, 24, 0, "not within"),
        (24, 24, 10**6, "not within"),
        (24, 24, 20, "not valid JSON"),
    ],
)
def test_binary_sizes_must_match_the_declared_shape_and_the_bytes(
    size, blob_len, header_length, message
):
    body, length = _binary(size, blob_len, header_length=header_length)
    with pytest.raises(InputError, match=message):
        oip.decode_request(body, length)
    good, length = _binary(24, 24)
    assert oip.decode_request(good, length)[1][0][1].shape == (2, 3)


def test_trailing_binary_bytes_without_binary_inputs_are_refused():
    head = _json_input()
    with pytest.raises(InputError, match="4 bytes after the JSON header"):
        oip.decode_request(head + b"abcd", len(head))


def test_a_tensor_over_the_element_limit_is_refused_before_its_data_is_read():
    body = _json_input(shape=[2000, 3], data="not even a list")
    with pytest.raises(oip.TensorTooLarge, match="6000 elements, over the limit of 100") as info:
        oip.decode_request(body, max_elements=100, limit_hint="send fewer rows")
    assert info.value.shape == [2000, 3] and info.value.hint == "send fewer rows"


def test_json_data_is_converted_to_the_declared_datatype():
    body = _json_input(datatype="INT64", data=[[1], [2.0]], shape=[2, 1])
    arr = oip.decode_request(body)[1][0][1]
    assert arr.dtype == np.int64 and arr.tolist() == [[1], [2]]
    body = _json_input(datatype="BOOL", data=[True, False])
    assert oip.decode_request(body)[1][0][1].tolist() == [True, False]


def test_poisson_arrivals_match_rate():
    times = arrival_times(duration_s=20.0, rate_rps=50.0, seed=1)
    assert 900 < len(times) < 1100
    assert times == sorted(times) and times[0] > 0 and times[-1] < 20.0
    assert times == arrival_times(duration_s=20.0, rate_rps=50.0, seed=1)
    with pytest.raises(InputError):
        arrival_times(duration_s=1.0)


def test_trace_replay_follows_each_second(tmp_path):
    path = tmp_path / "t.txt.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("100 0 300\n")
    trace = read_trace(path)
    assert trace == [100.0, 0.0, 300.0]
    times = arrival_times(duration_s=3.0, trace=trace, scale=0.5, seed=2)
    per_second = np.bincount(np.asarray(times, dtype=int), minlength=3)
    assert per_second[1] == 0 and 25 < per_second[0] < 80 and 110 < per_second[2] < 190


def test_bad_trace_names_line(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_text("1 2\n3 x\n")
    with pytest.raises(FileFormatError, match="line 2"):
        read_trace(path)


def test_reference_twitter_trace():
    trace = read_trace(path_of("twitter"))
    assert len(trace) > 1_000_000 and max(trace) <= 388
    times = arrival_times(duration_s=10.0, trace=trace, scale=0.1, seed=0)
    expected = sum(trace[:10]) * 0.1
    assert abs(len(times) - expected) < 6 * expected**0.5 + 5


# -- refused input (issue 16): exit 2 naming the flag, never a traceback ------------------------
@pytest.mark.parametrize(
    "endpoint",
    ["not a url", "http://", "ftp://host:21", "127.0.0.1:8000", "http://h:99999", "http://h/?q=1"],
)
def test_endpoint_must_be_an_http_base_url(endpoint):
    with pytest.raises(InputError, match="--endpoint") as info:
        check_endpoint(endpoint)
    assert "http://127.0.0.1:8000" in (info.value.hint or "")


def test_good_endpoints_pass():
    assert check_endpoint("http://127.0.0.1:8000") == "http://127.0.0.1:8000"
    assert check_endpoint("https://serve.example/prefix/") == "https://serve.example/prefix/"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_rps": float("nan")}, "--rate"),
        ({"rate_rps": float("inf")}, "--rate"),
        ({"rate_rps": 5.0, "duration_s": float("nan")}, "--duration"),
        ({"rate_rps": 5.0, "scale": float("nan")}, "--scale"),
        ({"rate_rps": 1e9, "duration_s": 1000.0}, "at most"),
    ],
)
def test_run_load_refuses_bad_numbers_before_sending(kwargs, message):
    kwargs = {"duration_s": 1.0, **kwargs}
    with pytest.raises(InputError, match=message):
        run_load("http://127.0.0.1:9", "m", **kwargs)


def test_loadgen_cli_not_a_url_is_exit_2(cli):
    r = cli(
        "loadgen", "--endpoint", "not a url", "--model", "tiny", "--rate", "5", "--duration", "1"
    )
    assert r.exit_code == 2, r.output
    assert "--endpoint 'not a url'" in r.output and "Traceback" not in r.output
    r = cli("loadgen", "--endpoint", "http://127.0.0.1:9", "--model", "a/b", "--rate", "5")
    assert r.exit_code == 2 and "--model 'a/b'" in r.output


def test_binary_trace_is_a_file_format_error(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_bytes(b"\x7fELF\x02\x01\xd0\xff\xfe")
    with pytest.raises(FileFormatError, match=r"trace\.txt"):
        read_trace(path)
    path = tmp_path / "nan.txt"
    path.write_text("1 nan 3\n")
    with pytest.raises(FileFormatError, match="not a rate >= 0"):
        read_trace(path)


def test_an_endpoint_that_is_not_an_inference_server(tmp_path):
    """A web server that answers HTML (or JSON of another shape) is refused in one line."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = {"/v2/models/html": b"<html>hello</html>", "/v2/models/json": b'{"name": "x"}'}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = bodies.get(self.path, b"")
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        for model in ("html", "json"):
            with pytest.raises(InputError, match="Open Inference Protocol"):
                model_input(url, model)
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_reports_how_far_it_fell_behind_its_schedule():
    """A load generator whose event loop is held up sends late; the lag it reports is what
    it added to every latency it measured (so verify can say its figures include it)."""
    import asyncio
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from greenctl.executor.runtime.loadgen import open_session, send_load

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    times = [i * 0.01 for i in range(30)]  # 100 req/s for 0.3 s

    async def load(hold_s: float) -> list[float]:
        lags: list[float] = []

        async def hold() -> None:  # a stall of the client's own loop mid-run
            await asyncio.sleep(0.1)
            time.sleep(hold_s)

        async with open_session(8, 10.0) as session:
            stall = asyncio.create_task(hold())
            lat, _server, codes, _took = await send_load(
                session, url, "m", times, b"{}", {}, lags_ms=lags
            )
            await stall
        assert codes == {"200": 30} and len(lat) == 30
        return lags

    try:
        stalled = asyncio.run(load(0.12))
        smooth = asyncio.run(load(0.0))
    finally:
        server.shutdown()
        server.server_close()
    assert len(stalled) == 30 and len(smooth) == 30
    assert max(stalled) >= 80.0  # the requests due during the 120 ms stall went late
    assert sorted(smooth)[15] < 20.0  # an idle client keeps its schedule


def test_a_lagging_client_is_named_only_when_it_matters():
    from greenctl.executor.runtime.loadgen import client_lag_note

    assert client_lag_note(None, 10.0) is None
    assert client_lag_note(0.8, 5.0) is None  # under 1 ms
    assert client_lag_note(3.0, 40.0) is None  # under a tenth of the p95
    note = client_lag_note(12.0, 40.0)
    assert note is not None and "12.0 ms behind" in note and "client" in note


def test_latency_breakdown_splits_what_the_executor_timed():
    from greenctl.executor.runtime.loadgen import latency_breakdown

    nan = math.nan
    lat = [10.0, 12.0, 30.0, 9.0]
    server = [(2.0, 5.0, 4.0), (3.0, 5.0, 4.0), (20.0, 6.0, 8.0), (nan, nan, nan)]
    b = latency_breakdown(lat, server)
    assert b is not None and b["timed"] == 3  # the untimed answer is left out
    assert b["queue_ms"]["p50"] == 3.0 and b["run_ms"]["p50"] == 5.0
    assert b["outside_ms"]["p50"] == pytest.approx(4.0)  # 10-2-5, 12-3-5, 30-20-6
    assert b["queue_ms"]["p95"] > 15.0  # the slow request waited in the executor's queue
    # a clock skew never makes the time outside negative
    assert latency_breakdown([1.0], [(0.8, 0.5, 1.0)])["outside_ms"]["p50"] == 0.0
    assert latency_breakdown([5.0], [(nan, 1.0, 1.0)]) is None
    assert latency_breakdown([], []) is None
