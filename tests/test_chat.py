"""Each member renders with its own template; messages are normalised so templates that reject
a system role or repeated roles still get a valid conversation; tools, past calls and results
reach each template natively where it knows them, and as one canonical text form where not."""

from __future__ import annotations

import json
import re

import pytest

from core.chat import (
    RESPONSE_FORMAT_INSTRUCTION,
    TOOLS_INSTRUCTION,
    knows_tool_calls,
    normalize_messages,
    render_prompt,
    response_format_instruction,
    tool_response_text,
    tools_system_block,
)
from core.loading import load_tokenizer
from core.tool_calls import format_tool_call, format_tool_calls
from core.tools import normalize_tools


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


# --------------------------------------------------------------------------- tool use

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
TOOLS = normalize_tools([ADD])  # tools as a request carries them (GenerationConfig checks them)
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


def call(call_id: str, a: int, b: int, arguments_as_json: bool = False) -> dict:
    arguments = {"a": a, "b": b}
    if arguments_as_json:
        arguments = json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


def tool_conversation() -> list[dict]:
    """A question, one turn with two calls, their two results, and a follow-up question."""
    return [
        {"role": "user", "content": "What is 3 + 5, and 4 + 4?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("c1", 3, 5, arguments_as_json=True), call("c2", 4, 4)],
        },
        {"role": "tool", "content": "8", "tool_call_id": "c1", "name": "add"},
        {"role": "tool", "content": "8", "tool_call_id": "c2", "name": "add"},
        {"role": "user", "content": "Are they equal?"},
    ]


# A Hermes-style template as tool-aware families write them (Qwen2.5, Hermes fine-tunes): tools in
# a system turn inside <tools>, calls as <tool_call> JSON, results inside <tool_response> in a
# user turn (consecutive results share it). Written for these tests, in that convention.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system{{ '\n' }}"
    "{% if messages[0].role == 'system' %}{{ messages[0].content + '\n\n' }}{% endif %}"
    "# Tools{{ '\n' }}<tools>{% for tool in tools %}{{ '\n' + tool | tojson }}{% endfor %}"
    "{{ '\n' }}</tools><|im_end|>{{ '\n' }}"
    "{% elif messages[0].role == 'system' %}"
    "<|im_start|>system{{ '\n' + messages[0].content }}<|im_end|>{{ '\n' }}{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{% if loop.first or loop.previtem.role != 'tool' %}<|im_start|>user{% endif %}"
    "{{ '\n<tool_response>\n' + message.content + '\n</tool_response>' }}"
    "{% if loop.last or loop.nextitem.role != 'tool' %}<|im_end|>{{ '\n' }}{% endif %}"
    "{% elif message.role != 'system' %}<|im_start|>{{ message.role }}"
    "{% if message.content %}{{ '\n' + message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    '{{ \'\n<tool_call>\n{"name": "\' + tc.function.name + \'", "arguments": \' }}'
    "{{ tc.function.arguments | tojson + '}\n</tool_call>' }}{% endfor %}"
    "<|im_end|>{{ '\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant{{ '\n' }}{% endif %}"
)


@pytest.fixture
def toks(tiny_dirs):
    return {name: load_tokenizer(path) for name, path in tiny_dirs.items()}


@pytest.fixture
def hermes(tiny_dirs):
    tokenizer = load_tokenizer(tiny_dirs["tb-qwen2-spm"])
    tokenizer.chat_template = HERMES_TEMPLATE
    return tokenizer


def test_tool_use_is_kept_and_results_are_never_merged():
    messages = normalize_messages(tool_conversation())
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    calls = messages[1]["tool_calls"]
    assert messages[1]["content"] == ""
    assert [c["function"]["arguments"] for c in calls] == [{"a": 3, "b": 5}, {"a": 4, "b": 4}]
    assert [c["id"] for c in calls] == ["c1", "c2"]
    assert messages[2] == {"role": "tool", "content": "8", "tool_call_id": "c1", "name": "add"}
    assert messages[3]["tool_call_id"] == "c2"
    merged = normalize_messages(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "tool_calls": [call("c1", 1, 2)]},
            {"role": "assistant", "content": "c", "tool_calls": [call("c2", 3, 4)]},
        ]
    )
    assert merged[1]["content"] == "b\n\nc"
    assert [c["id"] for c in merged[1]["tool_calls"]] == ["c1", "c2"]


@pytest.mark.parametrize(
    ("tool_calls", "problem"),
    [
        ("add(1, 2)", "tool_calls of type str"),
        ([{"type": "function", "function": {"arguments": {}}}], "no function name"),
        ([{"type": "code", "function": {"name": "add"}}], "only 'function' calls"),
        ([{"function": {"name": "add", "arguments": "{a: 1"}}], "not valid JSON"),
        ([{"function": {"name": "add", "arguments": "[1, 2]"}}], "must be a JSON object"),
        ([{"function": {"name": "add", "arguments": {"a": object()}}}], "not JSON data"),
        ([{"id": 7, "function": {"name": "add"}}], "string id"),
    ],
)
def test_malformed_tool_calls_are_rejected_by_message(tool_calls, problem):
    from core import InvalidMessagesError

    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": tool_calls},
    ]
    with pytest.raises(InvalidMessagesError, match=f"message 1.*{re.escape(problem)}"):
        normalize_messages(messages)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "bad \ud800 text"},
        {"role": "user", "content": [{"type": "text", "text": "\udfff"}]},
        {"role": "assistant", "content": "", "tool_calls": [call("c", 1, 2) | {"id": "c"}]},
    ],
)
def test_text_without_a_utf8_form_is_rejected_clearly(message):
    from core import InvalidMessagesError

    if "tool_calls" in message:
        message["tool_calls"][0]["function"]["arguments"] = {"a": "\ud800"}
    with pytest.raises(InvalidMessagesError, match="message 0.*cannot be encoded as UTF-8"):
        normalize_messages([message])


def test_templates_that_ignore_tools_get_them_as_a_system_block(toks):
    """The three testbed templates render `tools` not at all: each member reads the same block
    (the specs' JSON and the call instruction) where its template takes a system message."""
    messages = normalize_messages([{"role": "user", "content": "What is 3 + 5?"}])
    block = tools_system_block(TOOLS)
    assert json.dumps(ADD["function"]) in block and TOOLS_INSTRUCTION in block
    assert format_tool_call("tool_name", {"argument": "value"}) in TOOLS_INSTRUCTION
    prompts = {name: render_prompt(tok, messages, name, tools=TOOLS) for name, tok in toks.items()}
    assert f"<|system|>\n{block}<|end|>\n<|user|>\nWhat is 3 + 5?" in prompts["tb-gpt2-bpe"]
    assert f"<|im_start|>system\n{block}<|im_end|>" in prompts["tb-qwen2-spm"]
    assert f"<start_of_turn>user\n{block}\n\nWhat is 3 + 5?" in prompts["tb-llama-word"]
    for name, tok in toks.items():
        assert not knows_tool_calls(tok)
        assert render_prompt(tok, messages, name) == tok.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )


def test_a_users_system_message_comes_first(toks):
    messages = normalize_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"}]
    )
    prompt = render_prompt(toks["tb-llama-word"], messages, "word", tools=TOOLS)
    assert f"<start_of_turn>user\nBe brief.\n\n{tools_system_block(TOOLS)}\n\nQ" in prompt


def test_response_format_adds_one_instruction_for_every_member(toks):
    messages = normalize_messages([{"role": "user", "content": "Q"}])
    instruction = response_format_instruction(SCHEMA)
    assert instruction == f"{RESPONSE_FORMAT_INSTRUCTION}\n{json.dumps(SCHEMA)}"
    for name, tok in toks.items():
        prompt = render_prompt(tok, messages, name, response_format=SCHEMA)
        assert instruction in prompt and TOOLS_INSTRUCTION not in prompt
        both = render_prompt(tok, messages, name, tools=TOOLS, response_format=SCHEMA)
        assert f"{tools_system_block(TOOLS)}\n\n{instruction}" in both


def test_past_calls_and_results_as_text_where_the_template_knows_no_tool_calls(toks):
    """Calls become their canonical text; consecutive results stay apart, each in its own
    <tool_response> block of one user turn (so Gemma's alternation holds)."""
    messages = normalize_messages(tool_conversation())
    calls = format_tool_calls([("add", {"a": 3, "b": 5}), ("add", {"a": 4, "b": 4})])
    results = f"{tool_response_text('8')}\n{tool_response_text('8')}"
    assert results == "<tool_response>\n8\n</tool_response>\n<tool_response>\n8\n</tool_response>"
    turns = {
        "tb-gpt2-bpe": (f"<|assistant|>\n{calls}<|end|>", f"<|user|>\n{results}\n\nAre"),
        "tb-qwen2-spm": (f"assistant\n{calls}<|im_end|>", f"<|im_start|>user\n{results}\n\nAre"),
        "tb-llama-word": (f"model\n{calls}<end_of_turn>", f"<start_of_turn>user\n{results}\n\nAre"),
    }
    for name, tok in toks.items():
        prompt = render_prompt(tok, messages, name, tools=TOOLS)
        assert turns[name][0] in prompt and turns[name][1] in prompt, prompt
        assert "<|im_start|>tool" not in prompt  # ChatML would take the role, but not the calls


def test_a_tool_aware_template_renders_tools_and_history_natively(hermes):
    messages = normalize_messages(tool_conversation())
    assert knows_tool_calls(hermes)
    prompt = render_prompt(hermes, messages, "hermes", tools=TOOLS)
    assert prompt.startswith(
        f"<|im_start|>system\n{TOOLS_INSTRUCTION}\n\n# Tools\n<tools>\n{json.dumps(ADD)}\n</tools>"
    )
    assert "You can use these tools:" not in prompt  # no second, injected list
    calls = format_tool_calls([("add", {"a": 3, "b": 5}), ("add", {"a": 4, "b": 4})])
    assert f"<|im_start|>assistant\n{calls}<|im_end|>" in prompt  # the template's own rendering
    results = f"{tool_response_text('8')}\n{tool_response_text('8')}"
    assert f"<|im_start|>user\n{results}<|im_end|>\n<|im_start|>user\nAre" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")


def test_a_tool_aware_template_without_tools_in_the_request(hermes):
    """History alone (no tools bound) still goes natively; no instruction is added."""
    messages = normalize_messages(tool_conversation())
    prompt = render_prompt(hermes, messages, "hermes")
    assert TOOLS_INSTRUCTION not in prompt and "<tools>" not in prompt
    assert prompt.startswith("<|im_start|>user\nWhat is 3 + 5")
    assert "<tool_call>\n" in prompt and "<|im_start|>user\n<tool_response>" in prompt


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"tools": ADD}, "tools must be a list of tool dicts, not a dict"),
        ({"tools": [{"type": "function", "function": {"description": "x"}}]}, "tool #0"),
        ({"tools": [{"type": "function", "function": {"name": "f\ud800"}}]}, "letters, digits"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]},
            "cannot be encoded as UTF-8",
        ),
        ({"response_format": "json"}, "must be a dict, not a str"),
    ],
)
def test_bad_tools_or_response_format_are_rejected_before_rendering(options, problem):
    """Tools and schemas are checked once, where a request is configured; prompts are rendered
    from what that check gives (`ToolSpec`s and a schema)."""
    from core import GenerationConfig, InvalidConfigError

    with pytest.raises(InvalidConfigError, match=re.escape(problem)):
        GenerationConfig(**options)
