"""The LLM stream timer against a real engine: `transformers serve` (OpenAI-compatible, on
the CPU) serving a tiny Llama with random weights made here, nothing downloaded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from greenctl.data.errors import HardwareError, InputError
from greenctl.profiler import llm_engines
from greenctl.profiler.llm_client import Refused, measure

from tests.conftest import free_port

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> Iterator[tuple[str, str]]:
    """(endpoint, model) of a running `transformers serve`, stopped after the module."""
    command = llm_engines.engine_command("transformers", tiny_llama, port=free_port())
    running = llm_engines.start(command, timeout_s=120)
    try:
        yield command.endpoint, command.model
    finally:
        llm_engines.stop(running)


@pytest.mark.parametrize("chat", [False, True])
def test_streams_are_timed_token_by_token(engine, chat):
    endpoint, model = engine
    r = measure(endpoint, model, prompt_tokens=24, output_tokens=6, concurrency=1,
                duration_s=2.0, chat=chat)  # fmt: skip
    assert r.requests >= 1 and r.errors == 0
    assert 0 < r.ttft_ms["p50"] <= r.ttft_ms["p99"]
    # the server's own count of the prompt: one word-level token per word
    assert r.mean_prompt_tokens is not None and r.mean_prompt_tokens >= 24
    assert 1 <= r.mean_output_tokens <= 6  # a random model may stop early (its EOS)
    if r.tpot_ms:
        assert 0 < r.tpot_ms["p50"] < r.ttft_ms["p99"] + 1000
    assert r.output_tokens_per_s > 0 and r.requests_per_s > 0


def test_two_streams_in_flight_are_both_served(engine):
    endpoint, model = engine
    r = measure(endpoint, model, prompt_tokens=8, output_tokens=4, concurrency=2, duration_s=2.0)
    assert r.concurrency == 2 and r.requests >= 2 and r.errors == 0


def test_a_refusal_or_no_server_stops_at_once(engine):
    endpoint, _model = engine
    with pytest.raises(Refused, match="answered 4"):
        measure(endpoint, "no-such-model", concurrency=3, duration_s=30.0)
    with pytest.raises(HardwareError, match="cannot connect"):
        measure(f"http://127.0.0.1:{free_port()}", "m", duration_s=30.0)
    with pytest.raises(InputError, match="not an http"):
        measure("127.0.0.1:8000", "m")
