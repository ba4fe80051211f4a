"""The optional llama.cpp engine (the llamacpp extra): a random-weight Llama written as GGUF
here is served by llama-cpp-python's server, streamed, and profiled by ``profile llm``.
Skipped where llama-cpp-python is not installed (it builds llama.cpp from source)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from greenctl.profiler import llm_engines
from greenctl.profiler.llm_client import measure
from greenctl.profiler.llm_models import random_llama_gguf

from tests.conftest import free_port

pytest.importorskip("llama_cpp.server")
pytest.importorskip("gguf")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    random_llama_gguf(path, "tiny")
    return path


def test_a_gguf_model_is_served_and_streamed(gguf_file: Path):
    command = llm_engines.engine_command("llama.cpp", gguf_file, port=free_port(), cores=[0])
    running = llm_engines.start(command, timeout_s=120)
    try:
        r = measure(command.endpoint, command.model, prompt_tokens=16, output_tokens=8,
                    concurrency=1, duration_s=2.0)  # fmt: skip
        assert r.requests >= 1 and r.errors == 0
        assert r.ttft_ms["p50"] > 0 and r.output_tokens_per_s > 0
    finally:
        llm_engines.stop(running)


def test_profile_llm_measures_the_llama_cpp_engine(cli, db_path, gguf_file: Path):
    r = cli(
        "profile", "llm", "--engine", "llama.cpp", "--model-dir", gguf_file, "--name", "gg",
        "--family", "ggf", "--quality", "0.5", "--concurrency", "1", "--duration", "1",
        "--prompt-tokens", "16", "--output-tokens", "8", "--json",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)["profiles"]
    assert [row["engine"] for row in rows] == ["llama.cpp"]
    assert rows[0]["ttft_p50_ms"] > 0 and rows[0]["decode_j_per_token"] > 0


def test_concurrent_streams_each_get_every_token(gguf_file: Path):
    """At concurrency 4 each request streams all its tokens (they wait their turn), so the
    profile's row at 4 is a row of whole requests."""
    command = llm_engines.engine_command("llama.cpp", gguf_file, port=free_port(), cores=[0])
    running = llm_engines.start(command, timeout_s=120)
    try:
        alone, four = (
            measure(command.endpoint, command.model, prompt_tokens=16, output_tokens=8,
                    concurrency=c, duration_s=seconds)
            for c, seconds in ((1, 1.5), (4, 3.0))
        )  # fmt: skip
        assert four.requests >= 4 and four.errors == 0
        assert alone.mean_output_tokens > 4  # (a cut stream counts one)
        assert four.mean_output_tokens == pytest.approx(alone.mean_output_tokens)
    finally:
        llm_engines.stop(running)
