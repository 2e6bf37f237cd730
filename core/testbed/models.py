"""The testbed members: which architecture sits on which tokenizer, their shapes, and
`random_model` for structural tests and benchmarks (same tokenizer and template, random weights).

`MEMBERS` are the three shipped members; `WEAK` is a fourth, deliberately weak one (an early
checkpoint of tb-gpt2-bpe's own training run) for measuring what a weak member costs."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

MODELS_DIR = Path(__file__).parent / "models"
MAX_POSITIONS = 2048
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
)


@dataclass(frozen=True)
class MemberSpec:
    """One shipped model: architecture, tokenizer and the config keys that differ from defaults."""

    name: str
    model_type: str  # gpt2 | qwen2 | llama
    tokenizer: str  # bpe | spm | word
    shape: dict = field(default_factory=dict)  # canonical keys, see CANONICAL_KEYS


MEMBERS = {
    "tb-gpt2-bpe": MemberSpec(
        "tb-gpt2-bpe",
        "gpt2",
        "bpe",
        dict(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512),
    ),
    "tb-qwen2-spm": MemberSpec(
        "tb-qwen2-spm",
        "qwen2",
        "spm",
        dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),
    ),
    "tb-llama-word": MemberSpec(
        "tb-llama-word",
        "llama",
        "word",
        dict(hidden_size=96, num_layers=3, num_heads=3, num_kv_heads=1, intermediate_size=256),
    ),
}
# An early checkpoint of tb-gpt2-bpe: its shape, tokenizer and template, its training run
# stopped early (lab.testbed.build.WEAK_RECIPE).
WEAK = MemberSpec("tb-gpt2-early", "gpt2", "bpe", dict(MEMBERS["tb-gpt2-bpe"].shape))
WEAK_SOURCE = "tb-gpt2-bpe"  # the member whose run it is an early checkpoint of
TINY = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)

# caller's name -> the architecture's config key
CANONICAL_KEYS = {
    "gpt2": dict(
        hidden_size="n_embd",
        num_layers="n_layer",
        num_heads="n_head",
        intermediate_size="n_inner",
        max_positions="n_positions",
    ),
    "llama": dict(
        hidden_size="hidden_size",
        num_layers="num_hidden_layers",
        num_heads="num_attention_heads",
        num_kv_heads="num_key_value_heads",
        intermediate_size="intermediate_size",
        max_positions="max_position_embeddings",
    ),
}
CANONICAL_KEYS["qwen2"] = CANONICAL_KEYS["llama"]
NO_DROPOUT = {
    "gpt2": dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
    "llama": dict(attention_dropout=0.0),
    "qwen2": dict(attention_dropout=0.0, use_sliding_window=False),
}


# Document-level end tokens that generation should also stop at (besides the end of turn).
EXTRA_EOS = {"bpe": "<|endoftext|>", "spm": "</s>", "word": "<eos>"}


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a saved testbed tokenizer as exactly what was saved (no family-specific rewrapping)."""
    return PreTrainedTokenizerFast.from_pretrained(str(path))


def eos_token_ids(name: str, tok: PreTrainedTokenizerFast) -> list[int]:
    """Ids generation stops at: the end-of-turn token (tokenizer.eos_token) and the document end."""
    return [tok.eos_token_id, tok.convert_tokens_to_ids(EXTRA_EOS[name])]


def make_config(model_type: str, tok, **overrides) -> PretrainedConfig:
    """A config for `model_type` sized by `overrides` (canonical or native keys)."""
    keys = CANONICAL_KEYS[model_type]
    native = {}
    for key, value in overrides.items():
        if key == "num_kv_heads" and model_type == "gpt2":
            heads = overrides.get("num_heads", overrides.get("n_head"))
            if heads is not None and value != heads:
                raise ValueError(
                    "gpt2 has no grouped-query attention: num_kv_heads must equal num_heads"
                )
            continue
        native[keys.get(key, key)] = value
    native.setdefault(keys["max_positions"], MAX_POSITIONS)
    native.setdefault("vocab_size", len(tok))  # more rows than tokens: a padded vocabulary
    if native["vocab_size"] < len(tok):
        raise ValueError(f"vocab_size must be at least the tokenizer's {len(tok)} tokens")
    return AutoConfig.for_model(
        model_type,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=True,
        **NO_DROPOUT[model_type],
        **native,
    )


def generation_config(spec: MemberSpec, tok) -> GenerationConfig:
    """Greedy, stopping at the end of turn or the document end."""
    return GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos_token_ids(spec.tokenizer, tok),
        pad_token_id=tok.pad_token_id,
        do_sample=False,
        max_new_tokens=256,
    )


def save_tokenizer_files(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy(src / f, dst / f)


def random_model(
    name: str,
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: str | torch.dtype | None = None,
    **config_overrides,
) -> Path:
    """Save a random-init model with the architecture, tokenizer and template of shipped `name`.

    Tiny by default (2 layers, hidden 32); any config key can be overridden, by canonical name
    (hidden_size, num_layers, num_heads, num_kv_heads, intermediate_size, max_positions) or by the
    architecture's own key; `vocab_size` above the tokenizer's size pads the embedding, as many
    real models do. `dtype` (e.g. "bfloat16") sets the saved weights' dtype.
    """
    if name not in MEMBERS:
        raise ValueError(f"unknown testbed model {name!r}; choose one of {sorted(MEMBERS)}")
    spec, src, out = MEMBERS[name], MODELS_DIR / name, Path(out_dir)
    tok = load_tokenizer(src)
    shape = dict(TINY)
    if spec.model_type == "gpt2":
        shape.pop("num_kv_heads")
    shape.update(config_overrides)
    config = make_config(spec.model_type, tok, **shape)
    torch.manual_seed(seed)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    model = AutoModelForCausalLM.from_config(
        config, **({"dtype": dtype} if dtype is not None else {})
    )
    model.generation_config = generation_config(spec, tok)
    model.save_pretrained(out)
    save_tokenizer_files(src, out)
    return out


# The best model first (methods use the first member as the drafter by default), then one per
# remaining tokenizer family: bpe, spm, word.
MODEL_ORDER = ("tb-gpt2-bpe", "tb-qwen2-spm", "tb-llama-word")
# A deliberately weak fourth member (an early checkpoint of tb-gpt2-bpe's run, <= 15 % on cot),
# for measuring what a weak member costs an ensemble.
WEAK_MODEL = WEAK.name


def model_paths(weak: bool = False) -> list[Path]:
    """The shipped models' directories, in a fixed order (the best model first); `weak=True`
    adds the weak member last."""
    names = (*MODEL_ORDER, WEAK_MODEL) if weak else MODEL_ORDER
    return [MODELS_DIR / name for name in names]
