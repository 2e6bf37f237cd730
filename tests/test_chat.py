"""Each member renders with its own template; messages are normalised so templates that reject
a system role or repeated roles still get a valid conversation."""

from __future__ import annotations

import pytest

from core.chat import normalize_messages, render_prompt
from core.loading import load_tokenizer


def test_consecutive_same_roles_are_merged():
    messages = normalize_messages(
        [
            {"role": "system", "content": "S1"},
            {"role": "system", "content": "S2"},
            {"role": "human", "content": "H1"},
            {"role": "user", "content": [{"type": "text", "text": "H2"}]},
            {"role": "ai", "content": "A1"},
            {"role": "assistant", "content": "A2"},
        ]
    )
    assert messages == [
        {"role": "system", "content": "S1\n\nS2"},
        {"role": "user", "content": "H1\n\nH2"},
        {"role": "assistant", "content": "A1\n\nA2"},
    ]


def test_a_plain_string_is_one_user_message():
    assert normalize_messages("hi") == [{"role": "user", "content": "hi"}]


def test_each_family_renders_its_own_template(tiny_dirs):
    messages = [{"role": "user", "content": "Tom has 7 apples."}]
    prompts = {
        name: render_prompt(load_tokenizer(path), messages, name)
        for name, path in tiny_dirs.items()
    }
    assert prompts["tb-gpt2-bpe"].endswith("<|assistant|>\n")
    assert prompts["tb-qwen2-spm"].endswith("<|im_start|>assistant\n")
    assert prompts["tb-llama-word"].endswith("<start_of_turn>model\n")
    assert all("Tom has 7 apples." in p for p in prompts.values())


def test_system_is_folded_where_the_template_rejects_it(tiny_dirs):
    messages = normalize_messages(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "A1"},
            {"role": "tool", "content": "Observation: 12"},
        ]
    )
    word = render_prompt(load_tokenizer(tiny_dirs["tb-llama-word"]), messages, "word")
    assert "Be brief.\n\nQ1" in word and "<start_of_turn>system" not in word
    assert "Observation: 12" in word
    chatml = render_prompt(load_tokenizer(tiny_dirs["tb-qwen2-spm"]), messages, "spm")
    assert "<|im_start|>system\nBe brief.<|im_end|>" in chatml


def test_conversation_may_end_with_an_assistant_turn(tiny_dirs):
    messages = normalize_messages(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}]
    )
    for name, path in tiny_dirs.items():
        prompt = render_prompt(load_tokenizer(path), messages, name)
        assert "A" in prompt


@pytest.mark.parametrize("content", [None, 42, [{"type": "image_url", "image_url": "x"}]])
def test_non_text_content_is_rejected(content):
    from core import InvalidMessagesError

    with pytest.raises(InvalidMessagesError, match="message 0"):
        normalize_messages([{"role": "user", "content": content}])
