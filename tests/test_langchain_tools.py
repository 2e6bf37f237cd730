"""ChatEnsemble's tool calling and structured output.

The conversions (every tool kind, tool_choice, calls out as `tool_calls` / `tool_call_chunks`,
history in, structured-output parsers) run against a scripted engine that plays a canned reply
through the core's own tool-call parser, so each one is checked exactly; the end-to-end tests
run the real engine on the shipped models, whose grammar forces the calls and the JSON.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Annotated, Literal

import pytest
from conftest import load_example, needs_trained
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel, Field
from pydantic import v1 as pydantic_v1
from scripted_engine import ScriptedEnsemble, call_text
from typing_extensions import TypedDict

from core.chat import normalize_messages, render_prompt
from core.errors import InvalidConfigError
from core.methods import METHOD_NAMES
from core.testbed import make_problems, model_paths
from langchain_ensemble import ChatEnsemble
from langchain_ensemble.messages import to_core_messages
from langchain_ensemble.tools import tool_specs


# ---- tools of every kind LangChain accepts ---------------------------------------------------
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


class Divide(BaseModel):
    """Divide a by b."""

    a: int = Field(description="dividend")
    b: int = Field(description="divisor")


class Subtract(pydantic_v1.BaseModel):
    """Subtract b from a."""

    a: int
    b: int


class Power(TypedDict):
    """Raise a to the power b."""

    a: Annotated[int, ..., "base"]
    b: Annotated[int, ..., "exponent"]


NEGATE_SCHEMA = {
    "title": "negate",
    "description": "Negate a number.",
    "type": "object",
    "properties": {"x": {"type": "integer"}},
    "required": ["x"],
}
SQUARE_OPENAI = {
    "type": "function",
    "function": {
        "name": "square",
        "description": "Square a number.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}},
    },
}
EVERY_KIND = [add, multiply, Divide, Subtract, Power, NEGATE_SCHEMA, SQUARE_OPENAI]
EVERY_NAME = ["add", "multiply", "Divide", "Subtract", "Power", "negate", "square"]


class Joke(BaseModel):
    """A joke."""

    setup: str
    punchline: str


class JokeV1(pydantic_v1.BaseModel):
    """A joke."""

    setup: str
    punchline: str


class JokeDict(TypedDict):
    """A joke."""

    setup: str
    punchline: str


JOKE = {"setup": "Why?", "punchline": "Because."}


@pytest.fixture
def scripted(tiny_members):
    def build(
        reply: str = "", cut: bool = False, **fields
    ) -> tuple[ChatEnsemble, ScriptedEnsemble]:
        engine = ScriptedEnsemble(tiny_members, reply, cut)
        return ChatEnsemble.from_ensemble(engine, **fields), engine

    return build


# ---- binding: every tool kind, every tool_choice ---------------------------------------------
def test_every_tool_kind_binds_and_reaches_the_engine(scripted):
    chat, engine = scripted()
    chat.bind_tools(EVERY_KIND).invoke("hi")
    tools = engine.last_config.tools
    assert [t.name for t in tools] == EVERY_NAME
    assert tools[0].description == "Add two integers."
    for spec in tools:
        assert spec.parameters["type"] == "object"
    assert set(tools[2].parameters["properties"]) == {"a", "b"}  # pydantic v2
    assert set(tools[3].parameters["properties"]) == {"a", "b"}  # pydantic v1
    assert tools[4].parameters["required"] == ["a", "b"]  # TypedDict
    assert tools[5].parameters["properties"] == {"x": {"type": "integer"}}


@pytest.mark.parametrize(
    ("choice", "engine_choice"),
    [
        (None, "auto"),
        ("auto", "auto"),
        ("none", "none"),
        ("any", "required"),
        ("required", "required"),
        (True, "required"),
        ("multiply", "multiply"),
        ({"type": "function", "function": {"name": "add"}}, "add"),
    ],
)
def test_tool_choice_reaches_the_engine(scripted, choice, engine_choice):
    chat, engine = scripted()
    chat.bind_tools([add, multiply], tool_choice=choice).invoke("hi")
    assert engine.last_config.tool_choice == engine_choice


def test_parallel_calls_strict_and_a_response_format_with_tools(scripted):
    """create_agent's ProviderStrategy binds tools together with a response_format."""
    chat, engine = scripted()
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "Joke", "schema": Joke.model_json_schema()},
    }
    chat.bind_tools([add], parallel_tool_calls=False, strict=True, response_format=fmt).invoke("x")
    config = engine.last_config
    assert config.parallel_tool_calls is False
    assert config.response_format["properties"].keys() == {"setup", "punchline"}
    assert config.tools[0].parameters["additionalProperties"] is False  # strict: OpenAI's rule


def test_tools_per_call(scripted):
    chat, engine = scripted()
    chat.invoke("hi", tools=[add], tool_choice="add")
    assert [t.name for t in engine.last_config.tools] == ["add"]
    assert engine.last_config.tool_choice == "add"


# ---- calls out -------------------------------------------------------------------------------
TWO_CALLS = (
    "Let me compute.\n"
    + call_text("add", {"a": 1, "b": 2})
    + "\n"
    + call_text("multiply", {"a": 3, "b": 4})
)


def test_invoke_gives_tool_calls_content_and_finish_reason(scripted):
    chat, _ = scripted(TWO_CALLS)
    message = chat.bind_tools([add, multiply]).invoke("hi")
    assert message.content == "Let me compute."
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        ("add", {"a": 1, "b": 2}),
        ("multiply", {"a": 3, "b": 4}),
    ]
    assert all(c["id"].startswith("call_") and c["type"] == "tool_call" for c in message.tool_calls)
    assert message.invalid_tool_calls == []
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert [b["type"] for b in message.content_blocks] == ["text", "tool_call", "tool_call"]
    assert message.usage_metadata["output_tokens"] > 0


def test_streamed_calls_carry_indices_and_add_up_to_the_invoked_message(scripted):
    chat, _ = scripted(TWO_CALLS)
    bound = chat.bind_tools([add, multiply])
    chunks = list(bound.stream("hi"))
    streamed = [c for chunk in chunks for c in chunk.tool_call_chunks]
    assert [c["index"] for c in streamed] == [0, 1]
    assert [c["name"] for c in streamed] == ["add", "multiply"]
    total = sum(chunks[1:], chunks[0])
    invoked = bound.invoke("hi")
    strip = [{k: v for k, v in c.items() if k != "id"} for c in invoked.tool_calls]
    assert [{k: v for k, v in c.items() if k != "id"} for c in total.tool_calls] == strip
    assert total.content == invoked.content
    assert total.response_metadata["finish_reason"] == "tool_calls"


async def test_async_stream_gives_the_same_calls(scripted):
    chat, _ = scripted(TWO_CALLS)
    bound = chat.bind_tools([add, multiply])
    chunks = [chunk async for chunk in bound.astream("hi")]
    total = sum(chunks[1:], chunks[0])
    assert [c["args"] for c in total.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    invoked = await bound.ainvoke("hi")
    assert [c["name"] for c in invoked.tool_calls] == ["add", "multiply"]


def test_a_call_cut_by_max_tokens_is_an_invalid_tool_call(scripted):
    cut = call_text("add", {"a": 1, "b": 2})[:-20]  # the region never closes
    chat, _ = scripted("Sure.\n" + cut, cut=True)
    bound = chat.bind_tools([add])
    for message in (bound.invoke("hi"), _added(bound.stream("hi"))):
        assert message.tool_calls == []
        (invalid,) = message.invalid_tool_calls
        assert invalid["name"] == "add"
        assert invalid["args"].startswith("<tool_call>")  # the text as the model wrote it
        assert message.content == "Sure."
        assert message.response_metadata["finish_reason"] == "length"


def _added(chunks):
    chunks = list(chunks)
    return sum(chunks[1:], chunks[0])


# ---- history in ------------------------------------------------------------------------------
def test_history_with_calls_and_results_reaches_the_engine(scripted):
    chat, engine = scripted("Done.")
    history = [
        HumanMessage("What is 1 + 2?"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 1, "b": 2}, "id": "c1"}]),
        ToolMessage("3", tool_call_id="c1"),  # no name: taken from the call it answers
        AIMessage(
            [
                {"type": "text", "text": "And 3 * 4:"},
                {"type": "tool_use", "id": "c2", "name": "multiply", "input": {"a": 3, "b": 4}},
            ]
        ),
        ToolMessage([{"type": "text", "text": "bad input"}], tool_call_id="c2", status="error"),
    ]
    chat.bind_tools([add, multiply]).invoke(history)
    sent = normalize_messages(engine.last_messages)  # as the members see them
    assert sent[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
            }
        ],
    }
    assert sent[2] == {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"}
    assert sent[3]["content"] == "And 3 * 4:"
    assert sent[3]["tool_calls"][0]["function"] == {
        "name": "multiply",
        "arguments": {"a": 3, "b": 4},
    }
    assert sent[4]["tool_call_id"] == "c2" and sent[4]["name"] == "multiply"


# ---- bad input fails at the call -------------------------------------------------------------
def test_bad_tools_choices_and_formats_fail_at_bind_time(scripted):
    chat, engine = scripted()
    bad_schema = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integr"}}},
        },
    }
    with pytest.raises(InvalidConfigError, match="'f'"):
        chat.bind_tools([bad_schema])
    with pytest.raises(InvalidConfigError, match="'divide'.*not among the tools"):
        chat.bind_tools([add], tool_choice="divide")
    with pytest.raises(InvalidConfigError, match="tool #0"):
        chat.bind_tools([42])
    with pytest.raises(InvalidConfigError, match="response_format"):
        chat.bind_tools([add], response_format={"type": "array", "uniqueItems": True})
    with pytest.raises(InvalidConfigError, match="tool_choice"):
        chat.invoke("hi", tool_choice="required")  # no tools to call
    with pytest.raises(InvalidConfigError, match="unknown argument"):
        chat.invoke("hi", tool_mode="any")
    with pytest.raises(InvalidConfigError, match="strict"):
        chat.invoke("hi", tools=[add], strict="yes")
    assert engine.requests == []  # nothing reached the engine


# ---- structured output -----------------------------------------------------------------------
class OptionsRecorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.options: list = []

    def on_chat_model_start(self, serialized, messages, *, options=None, **kwargs) -> None:
        self.options.append(options)


@pytest.mark.parametrize("schema", [Joke, JokeV1, JokeDict, Joke.model_json_schema()])
@pytest.mark.parametrize("method", ["json_schema", "json_mode", "function_calling"])
def test_structured_output_parses_every_schema_kind_and_method(scripted, schema, method):
    name = schema.__name__ if isinstance(schema, type) else schema["title"]
    reply = call_text(name, JOKE) if method == "function_calling" else json.dumps(JOKE)
    chat, engine = scripted(reply)
    recorder = OptionsRecorder()
    structured = chat.with_structured_output(schema, method=method)
    result = structured.invoke("Tell me a joke.", config={"callbacks": [recorder]})
    if isinstance(schema, type) and issubclass(schema, (BaseModel, pydantic_v1.BaseModel)):
        assert isinstance(result, schema) and result.setup == "Why?"
    else:
        assert result == JOKE
    traced = recorder.options[0]["ls_structured_output_format"]
    assert traced["kwargs"] == {"method": method}
    config = engine.last_config
    if method == "function_calling":
        assert config.tool_choice == name and config.parallel_tool_calls is False
    else:
        assert set(config.response_format["properties"]) == {"setup", "punchline"}
    *_, last = structured.stream("Tell me a joke.")
    assert last == result


def test_structured_output_include_raw_and_json_mode_without_a_schema(scripted):
    chat, engine = scripted(json.dumps(JOKE))
    out = chat.with_structured_output(Joke, include_raw=True).invoke("joke")
    assert isinstance(out["raw"], AIMessage) and out["parsed"] == Joke(**JOKE)
    assert out["parsing_error"] is None
    assert chat.with_structured_output(None, method="json_mode").invoke("joke") == JOKE
    assert engine.last_config.response_format == {"type": "object", "additionalProperties": True}
    broken, _ = scripted('{"setup": "Why?"')
    out = broken.with_structured_output(Joke, include_raw=True).invoke("joke")
    assert out["parsed"] is None and out["parsing_error"] is not None


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_a_structured_answer_cut_by_max_tokens_says_so(scripted, method):
    """A JSON parser would read the truncated answer as a partial object."""
    whole = call_text("Joke", JOKE) if method == "function_calling" else json.dumps(JOKE)
    chat, _ = scripted(whole[:-12], cut=True)
    structured = chat.with_structured_output(JokeDict, method=method)
    with pytest.raises(OutputParserException, match="max_tokens"):
        structured.invoke("joke")
    with pytest.raises(OutputParserException, match="max_tokens"):
        list(structured.stream("joke"))
    out = chat.with_structured_output(JokeDict, method=method, include_raw=True).invoke("joke")
    assert out["parsed"] is None and "max_tokens" in str(out["parsing_error"])


def test_structured_output_rejects_bad_arguments_at_the_call(scripted):
    chat, _ = scripted()
    with pytest.raises(InvalidConfigError, match="method"):
        chat.with_structured_output(Joke, method="xml")
    with pytest.raises(InvalidConfigError, match="needs a schema"):
        chat.with_structured_output(None)
    with pytest.raises(InvalidConfigError, match="unknown argument"):
        chat.with_structured_output(Joke, mode="json")
    with pytest.raises(InvalidConfigError, match="response_format"):
        chat.with_structured_output({"type": "object", "properties": {"a": {"not": {}}}})


def test_profile_says_tools_and_structured_output_work(scripted):
    chat, _ = scripted()
    profile = chat.profile
    for key in ("tool_calling", "tool_choice", "tool_call_streaming", "structured_output"):
        assert profile[key] is True


# ---- the real engine, on the shipped models --------------------------------------------------
METHODS = [m for m in METHOD_NAMES if importlib.util.find_spec(f"core.methods.{m}")]
SHIPPED = [str(p) for p in model_paths()]
QUESTION = "Tom has 7 apples. He buys 5 more. How many apples does Tom have now?"
Small = Annotated[int, Field(ge=0, le=999)]


class add_numbers(BaseModel):  # noqa: N801 (a tool's name)
    """Add two whole numbers."""

    a: Small
    b: Small


class weather(BaseModel):  # noqa: N801
    """The weather in a city."""

    city: Literal["Paris", "Lyon"]


class Count(BaseModel):
    """How many apples, in words and digits."""

    apples: Small
    unit: Literal["apples", "pears"]


BOUNDED = {"add_numbers": add_numbers, "weather": weather}


def _shipped(method: str, **fields) -> ChatEnsemble:
    return ChatEnsemble(models=SHIPPED, method=method, device="cpu", **{"max_tokens": 96, **fields})


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_forced_calls_follow_their_schema_and_stream_as_invoked(method):
    bound = _shipped(method).bind_tools([add_numbers, weather], tool_choice="any")
    invoked = bound.invoke(QUESTION)
    assert invoked.tool_calls and invoked.response_metadata["finish_reason"] == "tool_calls"
    for call in invoked.tool_calls:
        BOUNDED[call["name"]].model_validate(call["args"])  # raises if the args break the schema
    streamed = _added(bound.stream(QUESTION))
    calls = [(c["name"], c["args"]) for c in invoked.tool_calls]
    assert [(c["name"], c["args"]) for c in streamed.tool_calls] == calls
    assert streamed.content == invoked.content
    named = _shipped(method).bind_tools([add_numbers, weather], tool_choice="weather")
    assert {c["name"] for c in named.invoke(QUESTION).tool_calls} == {"weather"}


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_a_real_call_cut_by_max_tokens_is_invalid_not_a_crash(method):
    # 16 tokens: the forced `<tool_call>\n{"name": "add", "arguments": {"` and no more (forced
    # text counts against the limit like any other)
    message = _shipped(method, max_tokens=16).bind_tools([add], tool_choice="add").invoke(QUESTION)
    assert message.tool_calls == []
    assert [c["name"] for c in message.invalid_tool_calls] == ["add"]
    assert message.response_metadata["finish_reason"] == "length"


HISTORY = [
    HumanMessage(QUESTION),
    AIMessage("", tool_calls=[{"name": "add_numbers", "args": {"a": 7, "b": 5}, "id": "c1"}]),
    ToolMessage("31337", tool_call_id="c1"),
]


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_history_with_calls_and_results_renders_for_every_member(method):
    chat = _shipped(method, max_tokens=8)
    assert isinstance(chat.bind_tools([add_numbers]).invoke(HISTORY), AIMessage)
    tools = tool_specs([add_numbers])
    messages = normalize_messages(to_core_messages(HISTORY))
    prompts = [render_prompt(m.tokenizer, messages, m.name, tools) for m in chat.ensemble.members]
    assert len(set(prompts)) == len(prompts)  # each member its own template
    for prompt in prompts:
        assert "31337" in prompt and '"a": 7' in prompt and "add_numbers" in prompt


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_structured_output_is_valid_for_every_method(method):
    chat = _shipped(method)
    for how in ("json_schema", "function_calling", "json_mode"):
        assert isinstance(chat.with_structured_output(Count, method=how).invoke(QUESTION), Count)
    as_dict = chat.with_structured_output(Count.model_json_schema()).invoke(QUESTION)
    Count.model_validate(as_dict)


# a held-out tool problem that asks for a JSON answer (calculator, then {"count": ...})
JSON_PROBLEM = next(p for p in make_problems(12, seed=3, form="tool") if p.response_format)


def test_create_agent_sends_tools_with_the_response_format(scripted):
    """create_agent picks its ProviderStrategy (the profile says structured output works): the
    response_format reaches the engine together with the problem's tools, every turn."""
    agent_example = load_example("langchain_agent")
    problem = JSON_PROBLEM
    name, arguments = problem.expected_call
    key = next(iter(problem.response_format["properties"]))

    def script(messages: list) -> str:
        if messages[-1]["role"] == "tool":
            return json.dumps({key: int(messages[-1]["content"])})
        return call_text(name, arguments)

    chat, engine = scripted(script)
    state = agent_example.run(agent_example.make_agent(chat, problem), problem)
    result = int(agent_example.TOOLS[name].invoke(arguments))
    assert state["structured_response"] == {key: result}
    offered = [spec["function"]["name"] for spec in problem.tools]
    for _, config in engine.requests:
        assert [t.name for t in config.tools] == offered
        assert config.response_format == problem.response_format
    assert engine.requests[1][0][-1] == {
        "role": "tool",
        "content": str(result),
        "tool_call_id": engine.requests[1][0][-2]["tool_calls"][0]["id"],
        "name": name,
    }
    assert agent_example.grade(state, problem) == (True, True, True)


@needs_trained
def test_the_agent_example_runs_to_a_structured_response():
    agent_example = load_example("langchain_agent")
    problem = JSON_PROBLEM
    chat = ChatEnsemble(models=model_paths(), device="cpu", max_tokens=96)
    state = agent_example.run(agent_example.make_agent(chat, problem), problem)
    assert set(state["structured_response"]) == set(problem.response_format["properties"])
    assert any(isinstance(m, ToolMessage) for m in state["messages"])  # it used a tool
    assert len(agent_example.grade(state, problem)) == 3
