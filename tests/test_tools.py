"""Tools, tool_choice and response_format as frameworks pass them, and the calls parsed back out
of the committed text, whole or streamed."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.errors import InvalidConfigError
from core.tool_calls import (
    InvalidToolCall,
    ToolCall,
    ToolCallStream,
    format_tool_call,
    format_tool_calls,
    parse_tool_calls,
)
from core.tools import (
    NO_PARAMETERS,
    ToolSpec,
    normalize_response_format,
    normalize_tool_choice,
    normalize_tools,
)

ADD_PARAMETERS = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
OPENAI_ADD = {
    "type": "function",
    "function": {"name": "add", "description": "Add two integers.", "parameters": ADD_PARAMETERS},
}
BARE_TIME = {"name": "get_time", "description": "The time now."}
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


def test_openai_and_bare_tools_normalise_to_specs():
    add, time = normalize_tools([OPENAI_ADD, BARE_TIME])
    assert add == ToolSpec("add", "Add two integers.", ADD_PARAMETERS)
    assert time == ToolSpec("get_time", "The time now.", NO_PARAMETERS)
    assert add.to_openai() == OPENAI_ADD
    assert normalize_tools(None) == () and normalize_tools([]) == ()
    untyped = normalize_tools([{"name": "f", "parameters": {"properties": {}}}])[0]
    assert untyped.parameters["type"] == "object"


@pytest.mark.parametrize(
    "tools,message",
    [
        ({"name": "add"}, "list of tool dicts"),
        (["add"], "tool #0 is a str, not a dict"),
        ([{"description": "no name"}], "tool #0 has the name None"),
        ([{"name": "add two"}], "'add two'.*letters, digits"),
        ([{"name": "x" * 65}], "1 to 64"),
        ([BARE_TIME, {"name": "get_time"}], "two tools are named 'get_time'"),
        ([{"name": "f", "parameters": {"type": "string"}}], "tool 'f'.*object"),
        ([{"name": "f", "parameters": "a, b"}], "tool 'f'.*not a str"),
        (
            [{"name": "f", "parameters": {"type": "object", "properties": {"a": {"not": {}}}}}],
            "parameters of tool 'f' uses the JSON schema keyword 'not'",
        ),
        (
            [{"name": "f", "parameters": {"properties": {"a": {"format": "colour"}}}}],
            "tool 'f'.*format 'colour'",
        ),
    ],
)
def test_bad_tools_are_named_with_the_fix(tools, message):
    with pytest.raises(InvalidConfigError, match=message):
        normalize_tools(tools)


def test_tool_choice_forms():
    tools = normalize_tools([OPENAI_ADD, BARE_TIME])
    for choice, expected in [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("any", "required"),
        (True, "required"),
        ("add", "add"),
        ({"type": "function", "function": {"name": "get_time"}}, "get_time"),
        ({"type": "tool", "name": "add"}, "add"),
        ({"type": "any"}, "required"),
    ]:
        assert normalize_tool_choice(choice, tools) == expected
    assert normalize_tool_choice("auto", ()) == "auto"
    assert normalize_tool_choice("none", ()) == "none"


@pytest.mark.parametrize(
    "choice,tools,message",
    [
        ("multiply", [OPENAI_ADD, BARE_TIME], "'multiply'.*'add', 'get_time'"),
        ("required", [], "no tools were given"),
        ("add", [], "no tools were given"),
        ({"type": "function"}, [OPENAI_ADD], "not understood"),
        (3, [OPENAI_ADD], "tool_choice must be"),
    ],
)
def test_bad_tool_choice_is_named(choice, tools, message):
    with pytest.raises(InvalidConfigError, match=message):
        normalize_tool_choice(choice, normalize_tools(tools))


def test_response_format_forms():
    schema = {"type": "object", "properties": {"joke": {"type": "string"}}}
    assert normalize_response_format(None) is None
    assert normalize_response_format({"type": "text"}) is None
    assert normalize_response_format(schema) == schema
    wrapped = {
        "type": "json_schema",
        "json_schema": {"name": "j", "schema": schema, "strict": True},
    }
    assert normalize_response_format(wrapped) == schema
    assert normalize_response_format({"type": "json_object", "schema": schema}) == schema
    any_object = normalize_response_format({"type": "json_object"})
    assert any_object["type"] == "object" and any_object["additionalProperties"] is True


@pytest.mark.parametrize(
    "fmt,message",
    [
        ("json", "must be a dict"),
        ({"type": "json_schema", "json_schema": {"name": "j"}}, "schema is missing"),
        ({"type": "json_schema"}, "schema is missing"),
        ({"type": "array", "uniqueItems": True}, "response_format uses .*'uniqueItems'"),
    ],
)
def test_bad_response_format_is_named(fmt, message):
    with pytest.raises(InvalidConfigError, match=message):
        normalize_response_format(fmt)


# --------------------------------------------------------------------------------------------


def test_calls_and_content_are_parsed():
    text = "Let me add.\n" + format_tool_calls([("add", {"a": 7, "b": 5}), ("get_time", {})])
    content, calls, invalid = parse_tool_calls(text)
    assert content == "Let me add."
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 7, "b": 5}), ("get_time", {})]
    assert all(CALL_ID.match(c.id) for c in calls) and calls[0].id != calls[1].id
    assert calls[0].to_dict() == {"id": calls[0].id, "name": "add", "arguments": {"a": 7, "b": 5}}
    assert invalid == []
    assert parse_tool_calls("Just text, <b>no</b> call.\n") == (
        "Just text, <b>no</b> call.\n",
        [],
        [],
    )


def test_unicode_arguments_survive():
    _, calls, _ = parse_tool_calls(format_tool_call("greet", {"text": "你好 ☃"}))
    assert calls[0].arguments == {"text": "你好 ☃"}


@pytest.mark.parametrize(
    "body,name,error",
    [
        ('{"name": "add", "arguments": {"a": 7,', "add", "not valid JSON"),
        ('{"arguments": {}}', None, 'no "name"'),
        ('["add"]', None, "JSON object"),
        ('{"name": "add", "arguments": [1, 2]}', "add", '"arguments" must be a JSON object'),
    ],
)
def test_malformed_calls_become_invalid_calls(body, name, error):
    content, calls, invalid = parse_tool_calls(f"ok <tool_call>\n{body}\n</tool_call>")
    assert content == "ok" and calls == []
    (bad,) = invalid
    assert bad.name == name and error in bad.error and bad.arguments == body
    assert CALL_ID.match(bad.id)


def test_lenient_forms_other_families_write():
    _, calls, _ = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>')
    assert calls[0].arguments == {"x": 1}
    _, calls, _ = parse_tool_calls(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    )
    assert calls[0].arguments == {"x": 1}


def test_a_call_cut_by_max_tokens_is_invalid():
    content, calls, invalid = parse_tool_calls('Sure.\n<tool_call>\n{"name": "add", "argu')
    assert content == "Sure." and calls == []
    assert invalid[0].name == "add" and "cut off" in invalid[0].error
    assert "max_tokens" in invalid[0].error


def test_stream_holds_back_what_could_open_a_call():
    stream = ToolCallStream()
    assert stream.feed("The answer <tool") == ("The answer", [])
    assert stream.feed("box> is here  ") == (" <toolbox> is here", [])
    content, calls = stream.feed("\n<tool_call>\n" + '{"name": "f", "arguments": {}}')
    assert (content, calls) == ("", [])
    content, calls = stream.feed("\n</tool_call>\n")
    assert content == "" and [c.name for c in calls] == ["f"]
    assert stream.finish() == ("", [])


PIECES = st.sampled_from(
    [
        "Hello",
        " ",
        "\n",
        "é☃",
        "<tool",
        "<tool_call>",
        "</tool_call>",
        "<tool_call>\n",
        format_tool_call("add", {"a": 1, "b": 2}),
        format_tool_call("get_time", {}),
        '{"name": "x", "arguments": {"s": "<tool_call>"}}',
        "{oops",
    ]
)


def _comparable(found):
    return [(c.name, c.arguments, getattr(c, "error", None)) for c in found]


@settings(max_examples=150, deadline=None)
@given(pieces=st.lists(PIECES, max_size=10), cuts=st.lists(st.integers(0, 400), max_size=8))
def test_streaming_in_random_pieces_equals_parsing_the_whole(pieces, cuts):
    text = "".join(pieces)
    content, calls, invalid = parse_tool_calls(text)
    stream = ToolCallStream()
    streamed, found = "", []
    start = 0
    for cut in sorted({c % (len(text) + 1) for c in cuts}) + [len(text)]:
        part, more = stream.feed(text[start:cut])
        streamed, found, start = streamed + part, found + more, cut
    part, more = stream.finish()
    streamed, found = streamed + part, found + more
    assert streamed == content
    assert _comparable([c for c in found if isinstance(c, ToolCall)]) == _comparable(calls)
    assert _comparable([c for c in found if isinstance(c, InvalidToolCall)]) == _comparable(invalid)


def test_the_closing_tag_inside_an_argument_does_not_end_the_call():
    """A call is one JSON object then the tag: a string holding the tag's text is read whole,
    whether the text comes at once or piece by piece."""
    text = (
        '<tool_call>\n{"name": "note", "arguments": {"text": "</tool_call> is a tag"}}\n'
        "</tool_call>"
    )
    content, calls, invalid = parse_tool_calls(text)
    assert (content, invalid) == ("", [])
    assert [(c.name, c.arguments) for c in calls] == [("note", {"text": "</tool_call> is a tag"})]
    stream, found = ToolCallStream(), []
    for char in text:
        found += stream.feed(char)[1]
    found += stream.finish()[1]
    assert [(c.name, c.arguments) for c in found] == [(c.name, c.arguments) for c in calls]


HOSTILE_ARGUMENTS = {
    "1,000-deep nesting": "[" * 1000 + "]" * 1000,
    "1,000-deep, never closed": "[" * 1000,
    "a 5,000-digit number": "9" * 5000,
    "NaN": "NaN",
    "Infinity": "-Infinity",
    "a float past its range": "1e999",
    "100-deep nesting": "[" * 100 + "]" * 100,
}


@pytest.mark.parametrize("label", HOSTILE_ARGUMENTS)
def test_hostile_arguments_give_an_invalid_call_never_an_exception(label):
    body = '{"name": "add", "arguments": {"a": ' + HOSTILE_ARGUMENTS[label] + "}}"
    text = f"<tool_call>\n{body}\n</tool_call>"
    content, calls, invalid = parse_tool_calls(text)
    assert (content, calls) == ("", [])
    assert len(invalid) == 1 and invalid[0].name == "add" and invalid[0].error
    stream, found = ToolCallStream(), []  # streamed in small pieces, the same
    for i in range(0, len(text), 7):
        found += stream.feed(text[i : i + 7])[1]
    found += stream.finish()[1]
    assert [type(c) for c in found] == [InvalidToolCall]
    # the same inside arguments written as a JSON string
    quoted = format_tool_call("add", {}).replace("{}", json.dumps(HOSTILE_ARGUMENTS[label]))
    assert parse_tool_calls(quoted)[1] == []


def test_a_call_of_a_tool_not_offered_is_invalid():
    text = format_tool_call("add", {"a": 1}) + "\n" + format_tool_call("rm_rf", {"path": "/"})
    _, calls, invalid = parse_tool_calls(text, offered=["add"])
    assert [c.name for c in calls] == ["add"]
    assert [c.name for c in invalid] == ["rm_rf"]
    assert "'rm_rf' was not offered (offered: 'add')" in invalid[0].error
    assert [c.name for c in parse_tool_calls(text)[1]] == ["add", "rm_rf"]  # none given: all


@pytest.mark.parametrize(
    "reply",
    [
        format_tool_call("get_weather", {"city": "Paris"}),
        '<tool_call>\n{"name": "add", "arguments": {"a": NaN, "b": 1}}\n</tool_call>',
        '<tool_call>\n{"name": "add", "arguments": {"a": '
        + "[" * 300
        + "]" * 300
        + "}}\n</tool_call>",
    ],
)
def test_without_grammar_a_bad_call_is_reported_not_raised(tiny_members, reply):
    """`grammar=False`: what a member writes is parsed as it comes; a call of a tool that was
    not offered, or arguments that are not standard JSON, is an invalid call of the output."""
    from scripted import Scripted

    from core import Ensemble

    member = Scripted(tiny_members[0], [reply], "scripted")
    out = Ensemble([member], "single").generate(
        "What is 7 + 5?", tools=[OPENAI_ADD], grammar=False, max_new_tokens=1500
    )
    assert out.tool_calls == [] and len(out.invalid_tool_calls) == 1
    assert out.finish_reason == "stop"
