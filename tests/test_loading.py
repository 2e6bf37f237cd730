"""Loading members: the transformers 5 qwen2 tokenizer trap and per-member device/dtype."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from core import Ensemble, ModelNotFoundError
from core.loading import load_tokenizer

PROBE = "Tom has 7 apples.\nHe buys 15 more:  7 + 15 = 22."


def test_qwen2_directory_keeps_its_own_tokenizer(tiny_dirs):
    """AutoTokenizer re-wraps tokenizer.json of a qwen2-type directory in Qwen2's pipeline and
    changes the ids; the loader notices (against the raw tokenizer.json) and falls back."""
    path = tiny_dirs["tb-qwen2-spm"]
    raw = Tokenizer.from_file(f"{path}/tokenizer.json").encode(PROBE, add_special_tokens=False).ids
    auto = AutoTokenizer.from_pretrained(path)(PROBE, add_special_tokens=False)["input_ids"]
    ours = load_tokenizer(path)(PROBE, add_special_tokens=False)["input_ids"]
    assert ours == raw
    if auto != raw:  # the trap is live in this transformers version: we must not fall in it
        assert (
            type(load_tokenizer(path)).__name__
            != type(AutoTokenizer.from_pretrained(path)).__name__
        )


def test_members_report_their_shape(tiny_dirs):
    ens = Ensemble.from_pretrained(
        list(tiny_dirs.values()),
        method="token",
        device="cpu",
        dtype=["float32", "bfloat16", "auto"],
    )
    assert [m.name for m in ens.members] == list(tiny_dirs)
    assert [m.dtype for m in ens.members] == [torch.float32, torch.bfloat16, torch.float32]
    assert all(m.context_window >= 2048 for m in ens.members)
    # the HF objects, for inspection: each member's own architecture and its own tokenizer
    assert [m.model.config.model_type for m in ens.members] == ["gpt2", "qwen2", "llama"]
    assert [m.model.dtype for m in ens.members] == [m.dtype for m in ens.members]
    for member, path in zip(ens.members, tiny_dirs.values(), strict=True):
        raw = Tokenizer.from_file(f"{path}/tokenizer.json").encode(PROBE, add_special_tokens=False)
        assert member.tokenizer(PROBE, add_special_tokens=False)["input_ids"] == raw.ids


def test_duplicate_members_get_unique_names(tiny_dirs):
    path = tiny_dirs["tb-gpt2-bpe"]
    ens = Ensemble.from_pretrained([path, path], method="token", device="cpu")
    assert [m.name for m in ens.members] == ["tb-gpt2-bpe", "tb-gpt2-bpe#2"]


def test_a_file_given_for_a_model_names_the_directory_to_pass(tiny_dirs, tmp_path):
    path = tiny_dirs["tb-gpt2-bpe"]
    with pytest.raises(ModelNotFoundError, match="is a file, not a model directory") as caught:
        Ensemble.from_pretrained([f"{path}/model.safetensors"], method="single", device="cpu")
    assert str(caught.value).endswith(f"pass {path!r}.")
    typo = f"{tmp_path}/modle"
    (tmp_path / "model").mkdir()
    with pytest.raises(ModelNotFoundError, match="does not exist") as caught:
        Ensemble.from_pretrained([typo], method="single", device="cpu")
    assert f"did you mean {str(tmp_path / 'model')!r}?" in str(caught.value)
