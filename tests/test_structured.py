"""Tool calls and schema-valid output through the engine's public API, for every method: random
JSON schemas give outputs that validate on the three shipped tokenizers; tool_choice none /
auto / required / named behave as specified; a streamed call equals the invoked one; a call cut
by max_new_tokens is reported, never a crash; forced text costs no model call; remote members
keep to the grammar; bad tools, choices and schemas fail at the call."""

from __future__ import annotations

import json

import jsonschema
import pytest
from conftest import needs_trained
from hypothesis import HealthCheck, given, settings
from json_schemas import objects, schemas

from core import Ensemble, GenerationConfig, InvalidConfigError
from core.events import GrammarForced, ToolCallEvent
from core.json_schema import closed_schema
from core.tool_calls import InvalidToolCall, ToolCall

pytestmark = needs_trained
METHODS = ["single", "token", "safe", "specem"]
QUESTION = "Tom has 7 apples. He buys 5 more. How many apples does Tom have now?"


def _tool(name: str, properties: dict, required=None, description: str = "") -> dict:
    parameters = {"type": "object", "properties": properties, "required": required or []}
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": parameters}}  # fmt: skip


ADD = _tool("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}, ["a", "b"], "Add.")
NOW = _tool("current_time", {}, description="The time now.")
LOOKUP = _tool(
    "lookup_price",
    {"item": {"type": "string", "enum": ["apple", "pear"]}, "count": {"type": "integer",
     "minimum": 1, "maximum": 9}},
    ["item"],
)  # fmt: skip
TOOLS = [ADD, NOW, LOOKUP]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def ensembles(shipped_members):
    built = {m: Ensemble(list(shipped_members), m) for m in METHODS}
    for i, member in enumerate(shipped_members):
        built[f"single:{member.name}"] = Ensemble(list(shipped_members), "single", member=i)
    return built


def _valid_call(call: ToolCall) -> None:
    jsonschema.validate(call.arguments, closed_schema(SCHEMAS[call.name]))


# --- random schemas ----------------------------------------------------------------------------

# Finite languages only: every response ends within the budget, so validity can be asserted.
BOUNDED = objects(schemas(bounded=True, max_leaves=5))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schema=BOUNDED)
def test_every_method_gives_schema_valid_output_on_every_tokenizer(ensembles, schema):
    config = GenerationConfig(max_new_tokens=700, response_format=schema)
    for label, ens in ensembles.items():
        out = ens.generate(QUESTION, config)
        assert out.finish_reason == "stop", (label, out.text)
        jsonschema.validate(json.loads(out.text), closed_schema(schema))
        assert not out.tool_calls


# Both values start with a byte that some shipped tokenizers write as a token of its own: the
# grammar allows only part of a character there, so no string candidate exists for any member.
SPLIT_CHARACTERS = {"type": "object", "properties": {"a": {"enum": ["\u0080", "\u00c0"]}},
                    "required": ["a"]}  # fmt: skip


@pytest.mark.parametrize(
    ("method", "options"),
    [
        ("single", {}),
        ("token", {}),
        ("token", {"mean": "geometric"}),
        ("safe", {}),
        ("safe", {"preset": "paper"}),
        ("safe", {"sharpen": "geometric", "heal": False}),
        ("specem", {}),
        ("rerank", {}),
    ],
)
def test_a_character_only_some_tokenizers_split_is_written_whole(shipped_members, method, options):
    ens = Ensemble(list(shipped_members), method, **options)
    out = ens.generate(QUESTION, max_new_tokens=60, response_format=SPLIT_CHARACTERS)
    assert out.finish_reason == "stop", out.text
    assert json.loads(out.text)["a"] in ("\u0080", "\u00c0")


@pytest.mark.parametrize("method", METHODS)
def test_json_object_mode_gives_an_object(ensembles, method):
    out = ensembles[method].generate(
        QUESTION, max_new_tokens=300, response_format={"type": "json_object"}
    )
    assert out.finish_reason in ("stop", "length")
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)


# --- tool_choice ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_required_gives_valid_calls_and_nothing_else(ensembles, method):
    out = ensembles[method].generate(QUESTION, max_new_tokens=200, tools=TOOLS,
                                     tool_choice="required")  # fmt: skip
    assert out.finish_reason == "tool_calls" and out.tool_calls and not out.invalid_tool_calls
    assert out.text == ""
    for call in out.tool_calls:
        _valid_call(call)
    events = [e for e in out.events if isinstance(e, ToolCallEvent)]
    assert [(e.id, e.tool, e.arguments) for e in events] == [
        (c.id, c.name, c.arguments) for c in out.tool_calls
    ]


@pytest.mark.parametrize("method", METHODS)
def test_a_named_choice_calls_that_tool_once_without_parallel_calls(ensembles, method):
    out = ensembles[method].generate(
        QUESTION, max_new_tokens=200, tools=TOOLS, tool_choice="lookup_price",
        parallel_tool_calls=False,
    )  # fmt: skip
    assert [c.name for c in out.tool_calls] == ["lookup_price"]
    _valid_call(out.tool_calls[0])
    assert out.finish_reason == "tool_calls"


@pytest.mark.parametrize("method", METHODS)
def test_a_tool_without_parameters_is_called_with_nothing(ensembles, method):
    out = ensembles[method].generate(QUESTION, max_new_tokens=80, tools=TOOLS,
                                     tool_choice="current_time")  # fmt: skip
    assert [(c.name, c.arguments) for c in out.tool_calls][:1] == [("current_time", {})]


@pytest.mark.parametrize("method", METHODS)
def test_none_never_calls(ensembles, method):
    out = ensembles[method].generate(QUESTION, max_new_tokens=60, tools=TOOLS,
                                     tool_choice="none")  # fmt: skip
    assert not out.tool_calls and not out.invalid_tool_calls
    assert "<tool_call>" not in out.text and out.finish_reason in ("stop", "length")


@pytest.mark.parametrize("method", METHODS)
def test_auto_answers_in_text_or_with_valid_calls(ensembles, method):
    out = ensembles[method].generate(QUESTION, max_new_tokens=200, tools=TOOLS)
    assert "<tool_call>" not in out.text
    for call in out.tool_calls:
        _valid_call(call)
    assert out.finish_reason == ("tool_calls" if out.tool_calls else out.finish_reason)


@pytest.mark.parametrize("method", METHODS)
def test_a_streamed_call_equals_the_invoked_one(ensembles, method):
    config = GenerationConfig(max_new_tokens=200, tools=TOOLS, tool_choice="required")
    out = ensembles[method].generate(QUESTION, config)
    deltas = list(ensembles[method].stream(QUESTION, config))
    streamed = [c for d in deltas for c in d.tool_calls]
    assert [(c.name, c.arguments) for c in streamed] == [
        (c.name, c.arguments) for c in out.tool_calls
    ]
    assert "".join(d.text for d in deltas) == out.text
    assert deltas[-1].finish_reason == "tool_calls"


@pytest.mark.parametrize("method", METHODS)
def test_a_call_cut_by_max_new_tokens_is_reported_not_raised(ensembles, method):
    out = ensembles[method].generate(QUESTION, max_new_tokens=12, tools=TOOLS,
                                     tool_choice="add")  # fmt: skip
    assert out.finish_reason == "length" and not out.tool_calls
    [cut] = out.invalid_tool_calls
    assert isinstance(cut, InvalidToolCall) and "max_tokens" in cut.error
    assert cut.name == "add"  # the forced name was already written


def test_forced_text_is_committed_without_a_model_call(ensembles):
    ens = ensembles["single"]
    config = GenerationConfig(max_new_tokens=200, tools=TOOLS, tool_choice="lookup_price")
    out = ens.generate(QUESTION, config)
    forced = [e for e in out.events if isinstance(e, GrammarForced)]
    # all of it up to its last space: the model writes a space with what follows it
    head = '<tool_call>\n{"name": "lookup_price", "arguments": {"item":'
    assert forced and forced[0].position == 0 and forced[0].text == head
    tokens = out.stats.counts["grammar_forced_tokens"]
    calls = out.stats.member_calls[ens.members[0].name]
    assert calls < out.stats.tokens - tokens + 2  # no forward pass for the forced tokens


def test_the_grammar_changes_nothing_it_does_not_need_to(ensembles):
    """A JSON answer the model writes by itself comes out the same with the grammar on."""
    free = ensembles["single"].generate('Reply with JSON: {"answer": 12}', max_new_tokens=30)
    schema = {"type": "object"}
    constrained = ensembles["single"].generate(
        'Reply with JSON: {"answer": 12}', max_new_tokens=30, response_format=schema
    )
    assert constrained.finish_reason in ("stop", "length")
    if free.text.startswith("{") and free.finish_reason == "stop":
        try:
            json.loads(free.text)
        except ValueError:
            return
        assert constrained.text == free.text


# --- bad input at the call ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings_, message",
    [
        (dict(tools=[_tool("t", {"x": {"type": "frobnicate"}})]), "tool 't'"),
        (dict(tools=[ADD], tool_choice="subtract"), "'subtract'.*not among the tools"),
        (dict(tool_choice="required"), "no tools were given"),
        (dict(response_format={"type": "object", "not": {"required": ["a"]}}), "'not'"),
        (dict(response_format={"type": "string", "format": "color"}), "format 'color'"),
        (dict(tools=[ADD, ADD]), "unique"),
        (dict(tools=[{"type": "function", "function": {"name": "a b"}}]), "1 to 64"),
        (dict(response_format="json"), "must be a dict"),
    ],
)
def test_bad_tools_and_schemas_fail_at_the_call(ensembles, settings_, message):
    with pytest.raises(InvalidConfigError, match=message):
        GenerationConfig(**settings_)
    with pytest.raises(InvalidConfigError, match=message):
        ensembles["safe"].generate(QUESTION, **settings_)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("limit", [1, 5, 40])
def test_forced_text_counts_against_max_new_tokens(ensembles, method, limit):
    """Text the grammar forces is output like any other: a 600-character constant is cut at the
    token limit, never written whole past it."""
    const = "x" * 300 + " y" * 150
    schema = {"type": "object", "properties": {"a": {"const": const}}, "required": ["a"]}
    out = ensembles[method].generate(QUESTION, max_new_tokens=limit, response_format=schema)
    assert out.finish_reason == "length" and out.stats.tokens <= limit
    assert json.dumps({"a": const}).startswith(out.text) and len(out.text) < len(const)
