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


def random_llama_gguf(path: str | Path, size: str = "tiny", *, seed: int = 0) -> dict[str, Any]:
    """Write a random-weight Llama of ``size`` as one GGUF file (llama.cpp's format, f32),
    with a sentencepiece vocabulary of the same words (``▁w0``, ...); its description.

    Raises:
        InputError: an unknown size, or the ``gguf`` package missing (the llamacpp extra).
    """
    if size not in LLM_SIZES:
        raise InputError(f"unknown model size {size!r}", hint=f"one of {', '.join(LLM_SIZES)}")
    try:
        import gguf
    except ImportError:
        raise InputError(
            "writing a GGUF model needs the gguf package", hint="pip install 'greenctl[llamacpp]'"
        ) from None
    import numpy as np

    shape = LLM_SIZES[size]
    hidden, layers, heads, mlp = shape["hidden"], shape["layers"], shape["heads"], shape["mlp"]
    # sentencepiece merges pieces pairwise from single characters: the characters and "▁w"
    # are in the vocabulary so every word's merge path is, and bytes for any other text
    pieces = ["\u2581", "w", *"0123456789", "\u2581w"]
    words = [f"\u2581w{i}" for i in range(shape["vocab"])]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = [*SPECIAL, *byte_tokens, *pieces, *words]
    types = [2, 3, 3, *([6] * 256), *([1] * (len(pieces) + len(words)))]
    scores = [0.0] * (3 + 256) + [float(len(t)) for t in (*pieces, *words)]
    rng = np.random.default_rng(seed)

    def weight(*dims: int) -> np.ndarray:
        return (rng.standard_normal(dims) * 0.02).astype(np.float32)

    out = Path(path)
    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_context_length(MAX_CONTEXT)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(mlp)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)  # unknown, control, byte, normal
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    params = 0
    tensors = {"token_embd.weight": weight(len(tokens), hidden)}
    for b in range(layers):
        tensors |= {
            f"blk.{b}.attn_norm.weight": np.ones(hidden, np.float32),
            f"blk.{b}.attn_q.weight": weight(hidden, hidden),
            f"blk.{b}.attn_k.weight": weight(hidden, hidden),
            f"blk.{b}.attn_v.weight": weight(hidden, hidden),
            f"blk.{b}.attn_output.weight": weight(hidden, hidden),
            f"blk.{b}.ffn_norm.weight": np.ones(hidden, np.float32),
            f"blk.{b}.ffn_gate.weight": weight(mlp, hidden),
            f"blk.{b}.ffn_up.weight": weight(mlp, hidden),
            f"blk.{b}.ffn_down.weight": weight(hidden, mlp),
        }
    tensors |= {"output_norm.weight": np.ones(hidden, np.float32)}
    tensors |= {"output.weight": weight(len(tokens), hidden)}
    for name, array in tensors.items():
        writer.add_tensor(name, array)
        params += int(array.size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"size": size, "params": params, "file": str(out)}


def prompt_words(n: int) -> str:
    """A prompt of ``n`` words the models' tokenizers read as ``n`` tokens."""
    return " ".join(f"w{i % 300}" for i in range(max(n, 0)))
