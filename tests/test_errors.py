"""Every bad input fails at the boundary with an error that names the problem and the fix."""

from __future__ import annotations

import json
import shutil

import pytest
from transformers import BertConfig

from core import (
    ChatTemplateError,
    ContextWindowError,
    Ensemble,
    EnsembleError,
    GenerationConfig,
    InvalidConfigError,
    InvalidMessagesError,
    MissingWeightsError,
    ModelNotFoundError,
    NotCausalLMError,
)
from core.testbed import random_model

HELLO = [{"role": "user", "content": "Hello"}]


def test_missing_model_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="does not exist.*local directory"):
        Ensemble.from_pretrained([str(tmp_path / "nope")], method="single")


def test_directory_without_config(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        Ensemble.from_pretrained([str(tmp_path)], method="single")


def test_directory_without_weights(tiny_dirs, tmp_path):
    shutil.copy(f"{tiny_dirs['tb-gpt2-bpe']}/config.json", tmp_path / "config.json")
    with pytest.raises(MissingWeightsError, match=r"no model weights \(\*\.safetensors\)"):
        Ensemble.from_pretrained([str(tmp_path)], method="single")


def test_non_causal_model(tmp_path):
    BertConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        architectures=["BertForMaskedLM"],
    ).save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(NotCausalLMError, match="'bert' model.*not a causal"):
        Ensemble.from_pretrained([str(tmp_path)], method="single")


def test_empty_messages(tiny_members):
    ens = Ensemble(tiny_members[:1], "single")
    with pytest.raises(InvalidMessagesError, match="messages is empty"):
        ens.generate([])


def test_unknown_role(tiny_members):
    ens = Ensemble(tiny_members[:1], "single")
    with pytest.raises(InvalidMessagesError, match="unknown role 'robot'.*system, user"):
        ens.generate([{"role": "robot", "content": "hi"}])


@pytest.mark.parametrize("bad", [0, -3])
def test_max_new_tokens_must_be_positive(tiny_members, bad):
    ens = Ensemble(tiny_members[:1], "single")
    with pytest.raises(InvalidConfigError, match=r"max_new_tokens must be >= 1 \(an integer\)"):
        ens.generate(HELLO, GenerationConfig(max_new_tokens=bad))
    with pytest.raises(InvalidConfigError, match="max_new_tokens"):
        ens.generate(HELLO, max_new_tokens=bad)


def test_prompt_longer_than_context_window(tmp_path):
    small = random_model("tb-gpt2-bpe", tmp_path / "small", max_positions=32)
    ens = Ensemble.from_pretrained([str(small)], method="single", device="cpu")
    with pytest.raises(ContextWindowError, match="context window is 32.*shorten"):
        ens.generate("apples " * 50)


def test_ensemble_methods_need_two_members(tiny_dirs):
    with pytest.raises(InvalidConfigError, match="at least 2 members.*method='single'"):
        Ensemble.from_pretrained([tiny_dirs["tb-gpt2-bpe"]], method="token")


def test_unknown_method_and_option(tiny_dirs):
    paths = [tiny_dirs["tb-gpt2-bpe"], tiny_dirs["tb-qwen2-spm"]]
    with pytest.raises(InvalidConfigError, match="unknown method 'magic'.*'single'"):
        Ensemble.from_pretrained(paths, method="magic")
    with pytest.raises(InvalidConfigError, match="unknown option.*'colour'.*aggregator"):
        Ensemble.from_pretrained(paths, method="token", colour="red")
    with pytest.raises(InvalidConfigError, match="aggregator='mean' is not supported"):
        Ensemble.from_pretrained(paths, method="token", aggregator="mean", device="cpu")


def test_tokenizer_without_chat_template(tiny_dirs, tmp_path):
    target = tmp_path / "no-template"
    shutil.copytree(tiny_dirs["tb-gpt2-bpe"], target)
    (target / "chat_template.jinja").unlink()
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    ens = Ensemble.from_pretrained([str(target)], method="single", device="cpu")
    with pytest.raises(ChatTemplateError, match="has no chat template.*chat_template.jinja"):
        ens.generate(HELLO)


def test_unknown_generation_setting(tiny_members):
    ens = Ensemble(tiny_members[:1], "single")
    with pytest.raises(InvalidConfigError, match="unknown generation setting.*max_new_tokens"):
        ens.generate(HELLO, max_tokens=5)


def test_every_error_is_an_ensemble_error():
    for error in (ModelNotFoundError, InvalidMessagesError, ContextWindowError, ChatTemplateError):
        assert issubclass(error, EnsembleError)


def test_every_error_class_is_importable_from_core():
    """Users catch what the README names with `from core import ...`."""
    import core
    import core.errors

    classes = {
        name
        for name, value in vars(core.errors).items()
        if isinstance(value, type)
        and issubclass(value, Exception)
        and value.__module__ == "core.errors"
    }
    assert classes <= set(core.__all__), sorted(classes - set(core.__all__))
    assert all(getattr(core, name) is getattr(core.errors, name) for name in classes)
