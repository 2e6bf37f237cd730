"""LangChain messages -> engine messages: roles, names, content; templating stays in the core."""

from __future__ import annotations

import pytest
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from core.chat import normalize_messages, render_prompt
from core.errors import InvalidMessagesError
from core.loading import load_tokenizer
from langchain_ensemble.messages import to_core_messages


def test_every_message_type_maps_to_an_engine_role():
    messages = [
        SystemMessage("S"),
        HumanMessage("H", name="alice"),
        AIMessage("A"),
        ToolMessage("42", tool_call_id="call-1", name="calculator"),
        FunctionMessage("7", name="f"),
        ChatMessage(role="developer", content="D"),
        ChatMessage(role="user", content="U"),
    ]
    assert to_core_messages(messages) == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "H", "name": "alice"},
        {"role": "assistant", "content": "A"},
        {"role": "tool", "content": "42", "name": "calculator", "tool_call_id": "call-1"},
        {"role": "tool", "content": "7", "name": "f"},
        {"role": "system", "content": "D"},
        {"role": "user", "content": "U"},
    ]


def test_ai_messages_contribute_their_text_only():
    message = AIMessage(
        [
            {"type": "reasoning", "reasoning": "hidden"},
            {"type": "text", "text": "Four."},
        ]
    )
    assert to_core_messages([message]) == [{"role": "assistant", "content": "Four."}]


def test_text_content_blocks_pass_and_images_fail_with_a_clear_error():
    text = HumanMessage([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert normalize_messages(to_core_messages([text]))[0]["content"] == "ab"
    image = HumanMessage([{"type": "image_url", "image_url": {"url": "data:,"}}])
    with pytest.raises(InvalidMessagesError, match="non-text content part"):
        normalize_messages(to_core_messages([image]))


def test_unknown_message_types_are_rejected_by_name():
    with pytest.raises(InvalidMessagesError, match="RemoveMessage"):
        to_core_messages([RemoveMessage(id="x")])


def test_names_survive_merging_only_when_shared():
    merged = normalize_messages(
        to_core_messages(
            [
                HumanMessage("a", name="bob"),
                HumanMessage("b", name="bob"),
                AIMessage("c", name="x"),
                AIMessage("d", name="y"),
            ]
        )
    )
    assert merged == [
        {"role": "user", "content": "a\n\nb", "name": "bob"},
        {"role": "assistant", "content": "c\n\nd"},
    ]


def test_a_template_that_reads_names_renders_them(tiny_dirs):
    """`name` reaches each member's own template: one that uses it shows it, others ignore it."""
    tokenizer = load_tokenizer(tiny_dirs["tb-qwen2-spm"])
    messages = normalize_messages(to_core_messages([HumanMessage("hi", name="bob")]))
    plain = render_prompt(tokenizer, messages, "spm")
    assert "hi" in plain and "bob" not in plain  # the shipped ChatML template ignores names
    tokenizer.chat_template = (
        "{% for m in messages %}<{{ m.role }}{% if m.name %} name={{ m.name }}{% endif %}>"
        "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    assert render_prompt(tokenizer, messages, "spm") == "<user name=bob>hi\n<assistant>"
