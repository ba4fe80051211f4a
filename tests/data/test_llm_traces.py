"""LLM traces: both public schemas read (gzip too), bad files named by line and column, and
the synthetic generator's rate, burstiness and token distributions as promised."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.llm_traces import read_llm_trace, synthetic_llm_trace, write_llm_trace

AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    "2023-11-16 18:15:46.6805900,374,44\n"
    "2023-11-16 18:15:50.9951690,396,109\n"
    "2023-11-16 18:15:47.1000000,879,8\n"
)
BURST = (
    "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    "5,ChatGPT,472,18,490,Conversation log\n"
    "45,ChatGPT,1087,0,1087,Conversation log\n"
    "118,GPT-4,417,276,693,Conversation log\n"
    "130,ChatGPT,1360,11,1371,API log\n"
)


def test_the_azure_schema_is_read_in_time_order_with_seven_digit_fractions(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(AZURE)
    trace = read_llm_trace(path)
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 0.41941, 4.314579])
    assert trace.prompt_tokens.tolist() == [374, 879, 396]
    assert trace.output_tokens.tolist() == [44, 8, 109]
    assert trace.summary()["requests"] == 3


def test_the_burstgpt_schema_filters_by_model_and_log_type(tmp_path):
    path = tmp_path / "burst.csv.gz"
    path.write_bytes(gzip.compress(BURST.encode()))  # gzip found by its magic bytes
    every = read_llm_trace(path)
    assert every.arrival_s.tolist() == [0.0, 40.0, 113.0, 125.0]
    chat = read_llm_trace(path, model="ChatGPT", log_type="Conversation log")
    assert chat.prompt_tokens.tolist() == [472, 1087] and chat.output_tokens.tolist() == [18, 0]
    with pytest.raises(InputError, match="no requests matching the filter"):
        read_llm_trace(path, model="Claude")
    per_second = every.per_second()
    assert per_second.sum() == 4 and per_second[125] == 1


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a,b,c\n1,2,3\n", "line 1: columns a, b, c are neither schema's"),
        (AZURE.replace("374", "3.5"), "line 2, column 'ContextTokens': 3.5 is not a whole"),
        (AZURE.replace("2023-11-16 18:15:50", "yesterday"), "line 3, column 'TIMESTAMP'"),
        (BURST.replace("118,", "-1,"), "line 4, column 'Timestamp': -1 is not a time"),
        (BURST.replace("472", "99999999999"), "column 'Request tokens'"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n", "no requests"),
        (BURST.replace(",18,", ",,"), "line 2, column 'Response tokens': an empty cell is not"),
    ],
)
def test_a_bad_file_is_refused_naming_line_and_column(tmp_path, text, says):
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=None) as err:
        read_llm_trace(path)
    assert says in str(err.value) and str(path) in str(err.value), err.value


def test_unreadable_files_are_refused(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_llm_trace(tmp_path / "nope.csv")
    (tmp_path / "bin.csv").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(FileFormatError, match="not UTF-8 CSV text"):
        read_llm_trace(tmp_path / "bin.csv")
    (tmp_path / "bad.gz").write_bytes(b"\x1f\x8b\x08garbage")
    with pytest.raises(FileFormatError, match="not a valid gzip file"):
        read_llm_trace(tmp_path / "bad.gz")
    (tmp_path / "azure.csv").write_text(AZURE)
    with pytest.raises(InputError, match="no Model or Log Type column"):
        read_llm_trace(tmp_path / "azure.csv", model="x")


@pytest.mark.parametrize("burstiness", [1.0, 2.5])
def test_the_generator_keeps_its_rate_burstiness_and_token_laws(burstiness):
    trace = synthetic_llm_trace(50, 2000, burstiness=burstiness, seed=7)
    assert trace.rate_rps() == pytest.approx(50, rel=0.05)
    gaps = np.diff(trace.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness, rel=0.08)
    assert trace.arrival_s[0] == 0 and np.all(gaps >= 0) and trace.arrival_s[-1] < 2000
    # a power law above the minimum: P(X > x) = (min / x)^(s - 1), cut at the maximum
    for tokens, low, s, high in ((trace.prompt_tokens, 32, 2.0, 4096),
                                 (trace.output_tokens, 16, 2.5, 1024)):  # fmt: skip
        assert tokens.min() >= low and tokens.max() <= high
        for x in (2 * low, 8 * low):
            assert np.mean(tokens >= x) == pytest.approx((low / x) ** (s - 1), rel=0.1, abs=0.005)
    again = synthetic_llm_trace(50, 2000, burstiness=burstiness, seed=7)
    assert np.array_equal(again.arrival_s, trace.arrival_s)  # seeded: the same trace


def test_a_written_trace_reads_back_unchanged(tmp_path):
    trace = synthetic_llm_trace(5, 60, seed=1)
    back = read_llm_trace(write_llm_trace(trace, tmp_path / "t.csv"))
    assert np.array_equal(back.arrival_s, trace.arrival_s)
    assert np.array_equal(back.prompt_tokens, trace.prompt_tokens)
    assert np.array_equal(back.output_tokens, trace.output_tokens)


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"rate_rps": 0}, "rate_rps must be > 0"),
        ({"duration_s": 0}, "duration_s must be > 0"),
        ({"burstiness": float("nan")}, "burstiness must be a finite number"),
        ({"prompt_zipf": 1.0}, "prompt_zipf must be a number > 1"),
        ({"output_min": 0}, "output_min must be >= 1"),
    ],
)
def test_the_generator_refuses_values_outside_their_bounds(kwargs, says):
    args = {"rate_rps": 5, "duration_s": 10, **kwargs}
    with pytest.raises(InputError, match=says):
        synthetic_llm_trace(**args)
