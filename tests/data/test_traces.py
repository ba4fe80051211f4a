"""data.traces: the one reader of requests-per-second traces (simulate, loadgen, forecast)."""

from __future__ import annotations

import gzip

import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.traces import read_rps_trace


def test_every_form_of_a_trace_reads_alike(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_text("# seconds 0-4\n1 2,3\n4\t5\n")
    csv = tmp_path / "b.csv"
    csv.write_text("time,rate_rps\n0,1\n1,2\n2,3\n3,4\n4,5\n")
    zipped = tmp_path / "c.txt"  # gzip found by its magic bytes, whatever the name
    zipped.write_bytes(gzip.compress(b"1 2 3 4 5\n"))
    for p in (plain, csv, zipped):
        assert read_rps_trace(p).tolist() == [1, 2, 3, 4, 5], p


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b"1 2\n3 x 4\n", r"line 2: 'x' is not a number"),
        (b"1 nan\n", r"line 1: 'nan' is not a rate >= 0"),
        (b"1\n-2\n", r"line 2: '-2' is not a rate >= 0"),
        (b"time,rate_rps\n0,1\n1,inf\n", r"line 3, column 'rate_rps'"),
        (b"# nothing\n", "has no values"),
        (b"1 2\n\xff\xfe\x00", "line 2: not a text file"),
        (b"\x1f\x8bnot gzip", "not a valid gzip file"),
    ],
)
def test_bad_traces_name_the_line(tmp_path, content, match):
    p = tmp_path / "t.txt"
    p.write_bytes(content)
    with pytest.raises(FileFormatError, match=match):
        read_rps_trace(p)


def test_missing_or_a_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_rps_trace(tmp_path / "none.txt")
    with pytest.raises(InputError, match="cannot read"):
        read_rps_trace(tmp_path)
