"""Small Llama models with random weights, made on this machine: LLM tiers to profile, plan
and serve without downloading anything from a model hub.

Each size is a transformers ``LlamaForCausalLM`` with a word-level tokenizer of its own
(words ``w0``, ``w1``, ...), saved as a folder any OpenAI-compatible engine that reads
transformers checkpoints can serve. Weights are random: the text is noise, the compute is
a real transformer's, so latency and energy scale as a trained model of that shape would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from greenctl.data.errors import InputError

#: shapes by name: hidden size, layers, attention heads, MLP width, vocabulary (words)
LLM_SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden": 32, "layers": 2, "heads": 4, "mlp": 64, "vocab": 300},
    "small": {"hidden": 256, "layers": 4, "heads": 8, "mlp": 768, "vocab": 2000},
    "medium": {"hidden": 512, "layers": 8, "heads": 8, "mlp": 1536, "vocab": 8000},
    "large": {"hidden": 2048, "layers": 16, "heads": 16, "mlp": 5632, "vocab": 32000},
}
#: the longest context the models are made for (prompt plus output tokens)
MAX_CONTEXT = 2048
SPECIAL = ["<unk>", "<s>", "</s>"]


def random_llama(folder: str | Path, size: str = "tiny", *, seed: int = 0) -> dict[str, Any]:
    """Write a random-weight Llama of ``size`` (:data:`LLM_SIZES`) to ``folder``; returns
    its description (size, parameters, folder).

    Raises:
        InputError: an unknown size.
    """
    if size not in LLM_SIZES:
        raise InputError(f"unknown model size {size!r}", hint=f"one of {', '.join(LLM_SIZES)}")
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a library does not draw on the user's terminal

    shape = LLM_SIZES[size]
    words = [*SPECIAL, *(f"w{i}" for i in range(shape["vocab"]))]
    tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=shape["hidden"],
        intermediate_size=shape["mlp"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        num_key_value_heads=shape["heads"],
        max_position_embeddings=MAX_CONTEXT,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    out = Path(folder)
    model.save_pretrained(out)
    fast.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    return {"size": size, "params": int(params), "folder": str(out)}


def prompt_words(n: int) -> str:
    """A prompt of ``n`` words the models' tokenizers read as ``n`` tokens."""
    return " ".join(f"w{i % 300}" for i in range(max(n, 0)))
