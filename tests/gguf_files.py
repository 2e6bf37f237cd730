"""Tiny GGUF files for the loading tests, written with the `gguf` package in a second: a
one-layer Llama with random weights on a byte-level BPE vocabulary and a ChatML template in its
metadata (the shape of SmolLM2's file, a few thousand times smaller), and damaged copies of it
(truncated, its magic flipped, another architecture, an unreadable quantization type)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_MERGES = ("Ġ t", "h e", "Ġt he", "Ġ a", "i s", "Ġ is", "a n", "Ġ an", "e r", "o n")
_DIM, _FFN, _HEADS, _KV_HEADS = 16, 32, 2, 1


def _alphabet() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return list(bytes_to_unicode().values())


def write_tiny_gguf(
    path: Path,
    *,
    architecture: str = "llama",
    chat_template: str | None = CHATML,
    quantized: bool = True,
    add_bos: bool | None = None,
    seed: int = 0,
) -> Path:
    """A small valid GGUF model file; `quantized` stores one weight as Q8_0 (the rest F32);
    `add_bos` sets the tokenizer's add-BOS flag (its BOS is `<|im_start|>`)."""
    import gguf

    tokens = _alphabet() + [m.replace(" ", "") for m in _MERGES] + list(SPECIAL)
    types = [1] * (len(tokens) - len(SPECIAL)) + [3] * len(SPECIAL)  # 3: control
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.add_context_length(512)
    writer.add_embedding_length(_DIM)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_FFN)
    writer.add_head_count(_HEADS)
    writer.add_head_count_kv(_KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(list(_MERGES))
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    head = _DIM // _HEADS
    writer.add_tensor("token_embd.weight", weight(len(tokens), _DIM))
    writer.add_tensor("output_norm.weight", np.ones(_DIM, dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(_DIM, dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", weight(_DIM, _DIM))
    writer.add_tensor("blk.0.attn_k.weight", weight(_KV_HEADS * head, _DIM))
    writer.add_tensor("blk.0.attn_v.weight", weight(_KV_HEADS * head, _DIM))
    writer.add_tensor("blk.0.attn_output.weight", weight(_DIM, _DIM))
    writer.add_tensor("blk.0.ffn_norm.weight", np.ones(_DIM, dtype=np.float32))
    writer.add_tensor("blk.0.ffn_gate.weight", weight(_FFN, _DIM))
    writer.add_tensor("blk.0.ffn_up.weight", weight(_FFN, _DIM))
    down = weight(_DIM, _FFN)
    if quantized:
        q8 = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor("blk.0.ffn_down.weight", gguf.quants.quantize(down, q8), raw_dtype=q8)
    else:
        writer.add_tensor("blk.0.ffn_down.weight", down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def damaged_copy(source: Path, target: Path, how: str) -> Path:
    """`source` damaged as a download or a converter damages files:
    "truncated" (cut in half), "magic" (its first bytes byte-swapped), "text" (not GGUF at
    all), "empty", "unknown-type" (a tensor stored as a ggml type id no reader knows),
    "unreadable-type" (a type the gguf package knows but cannot dequantize, Q8_1)."""
    data = bytearray(source.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "magic":
        data[:4] = b"FUGG"
    elif how == "text":
        data = bytearray(b"<html>404: not found</html>\n")
    elif how == "empty":
        data = bytearray()
    elif how in ("unknown-type", "unreadable-type"):
        name = b"blk.0.ffn_down.weight"
        at = data.index(name) + len(name)
        (dims,) = struct.unpack_from("<I", data, at)
        struct.pack_into("<I", data, at + 4 + 8 * dims, 99 if how == "unknown-type" else 9)
    else:
        raise ValueError(how)
    target.write_bytes(bytes(data))
    return target
