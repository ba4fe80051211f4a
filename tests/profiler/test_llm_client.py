"""The LLM stream timer against a real engine: `transformers serve` (OpenAI-compatible, on
the CPU) serving a tiny Llama with random weights made here, nothing downloaded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from greenctl.data.errors import HardwareError, InputError
from greenctl.profiler.llm_client import Refused, measure

pytest.importorskip("transformers")
pytest.importorskip("fastapi")
pytestmark = pytest.mark.timeout(300)

WORDS = ["<unk>", "<s>", "</s>", *(f"w{i}" for i in range(300))]


def _tiny_llama(folder: Path) -> Path:
    """A 2-layer Llama of about 40k parameters and a word-level tokenizer, saved."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    config = LlamaConfig(
        vocab_size=len(WORDS), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
        bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(endpoint, model) of a running `transformers serve`, stopped after the module."""
    model = str(_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))
    port = _free_port()
    exe = Path(sys.executable).with_name("transformers")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(
        [str(exe), "serve", model, "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{endpoint}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
            assert time.monotonic() < deadline, "transformers serve did not start in 120 s"
            time.sleep(0.5)
        yield endpoint, model
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
        measure(f"http://127.0.0.1:{_free_port()}", "m", duration_s=30.0)
    with pytest.raises(InputError, match="not an http"):
        measure("127.0.0.1:8000", "m")
