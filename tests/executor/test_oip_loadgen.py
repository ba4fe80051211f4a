"""OIP tensor encoding (JSON and binary extension) and the load generator's arrivals/traces."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.executor import oip
from greenctl.executor.loadgen import arrival_times, read_trace
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


def test_reference_twitter_trace(reference):
    trace = read_trace(reference / "twitter" / "requests_per_second.txt.gz")
    assert len(trace) > 1_000_000 and max(trace) <= 388
    times = arrival_times(duration_s=10.0, trace=trace, scale=0.1, seed=0)
    expected = sum(trace[:10]) * 0.1
    assert abs(len(times) - expected) < 6 * expected**0.5 + 5
