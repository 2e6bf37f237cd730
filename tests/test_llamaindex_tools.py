"""EnsembleLLM as a LlamaIndex FunctionCallingLLM: chat_with_tools and its variants, tool calls
as ToolCallBlocks and ToolSelections, history with calls and results, structured_predict
through the schema grammar, and FunctionAgent's tool loop.

The conversions run against a scripted engine that plays a canned reply through the core's own
tool-call parser (exact checks); the end-to-end tests run the real engine on the shipped models.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Annotated, Literal

import pytest
from conftest import load_example, needs_trained
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, TextBlock, ToolCallBlock
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field
from scripted_engine import ScriptedEnsemble, call_text

from core import Ensemble
from core.chat import normalize_messages
from core.errors import InvalidConfigError
from core.methods import METHOD_NAMES
from core.testbed import TOOL_FUNCTIONS, make_problems, model_paths
from llamaindex_ensemble import EnsembleLLM


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


ADD = FunctionTool.from_defaults(fn=add)
MULTIPLY = FunctionTool.from_defaults(fn=multiply)
TWO_CALLS = "Computing.\n" + "\n".join(
    [call_text("add", {"a": 1, "b": 2}), call_text("multiply", {"a": 3, "b": 4})]
)


class City(BaseModel):
    name: str
    population: int


CITY = {"name": "Lyon", "population": 500000}
PROMPT = PromptTemplate("Describe the city of {city}.")


@pytest.fixture
def scripted(tiny_members):
    def build(reply="", cut: bool = False, **fields) -> tuple[EnsembleLLM, ScriptedEnsemble]:
        engine = ScriptedEnsemble(tiny_members, reply, cut)
        return EnsembleLLM(ensemble=engine, **fields), engine

    return build


def _blocks(response) -> list:
    return [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]


# ---- chat_with_tools -------------------------------------------------------------------------
def test_metadata_says_function_calling(scripted):
    llm, _ = scripted()
    assert llm.metadata.is_function_calling_model is True


def test_chat_with_tools_gives_tool_call_blocks_and_selections(scripted):
    llm, engine = scripted(TWO_CALLS)
    response = llm.chat_with_tools(
        [ADD, MULTIPLY], user_msg="1+2, 3*4?", allow_parallel_tool_calls=True
    )
    config = engine.last_config
    assert [t.name for t in config.tools] == ["add", "multiply"]
    assert set(config.tools[0].parameters["properties"]) == {"a", "b"}
    assert config.tool_choice == "auto" and config.parallel_tool_calls is True
    assert engine.last_messages == [{"role": "user", "content": "1+2, 3*4?"}]
    assert response.message.content == "Computing."
    assert [(b.tool_name, b.tool_kwargs) for b in _blocks(response)] == [
        ("add", {"a": 1, "b": 2}),
        ("multiply", {"a": 3, "b": 4}),
    ]
    selections = llm.get_tool_calls_from_response(response)
    assert all(isinstance(s, ToolSelection) for s in selections)
    assert [(s.tool_name, s.tool_kwargs) for s in selections] == [
        ("add", {"a": 1, "b": 2}),
        ("multiply", {"a": 3, "b": 4}),
    ]
    assert [s.tool_id for s in selections] == [b.tool_call_id for b in _blocks(response)]
    assert response.raw["finish_reason"] == "tool_calls"


def test_without_parallel_calls_one_call_is_kept(scripted):
    llm, engine = scripted(TWO_CALLS)
    response = llm.chat_with_tools([ADD, MULTIPLY], user_msg="go")
    assert engine.last_config.parallel_tool_calls is False
    assert [b.tool_name for b in _blocks(response)] == ["add"]


@pytest.mark.parametrize(
    ("kwargs", "engine_choice"),
    [
        ({"tool_required": True}, "required"),
        ({"tool_choice": "multiply"}, "multiply"),
        ({"tool_required": True, "tool_choice": "add"}, "add"),
        ({"tool_choice": "none"}, "none"),
    ],
)
def test_tool_required_and_tool_choice_reach_the_engine(scripted, kwargs, engine_choice):
    llm, engine = scripted()
    llm.chat_with_tools([ADD, MULTIPLY], user_msg="go", **kwargs)
    assert engine.last_config.tool_choice == engine_choice


async def test_async_and_streaming_variants_carry_the_calls(scripted):
    llm, _ = scripted(TWO_CALLS)
    response = await llm.achat_with_tools(
        [ADD, MULTIPLY], user_msg="go", allow_parallel_tool_calls=True
    )
    assert [b.tool_name for b in _blocks(response)] == ["add", "multiply"]
    streamed = list(llm.stream_chat_with_tools([ADD, MULTIPLY], user_msg="go"))
    counts = [len(_blocks(r)) for r in streamed]
    assert counts == sorted(counts) and counts[-1] == 2  # calls so far, as text so far
    assert "".join(r.delta or "" for r in streamed) == "Computing."
    gen = await llm.astream_chat_with_tools([ADD, MULTIPLY], user_msg="go")
    last = [r async for r in gen][-1]
    assert [s.tool_kwargs for s in llm.get_tool_calls_from_response(last)] == [
        {"a": 1, "b": 2},
        {"a": 3, "b": 4},
    ]


def test_a_cut_call_is_reported_not_run(scripted):
    cut = call_text("add", {"a": 1, "b": 2})[:-20]
    llm, _ = scripted(cut, cut=True)
    response = llm.chat_with_tools([ADD], user_msg="go", tool_required=True)
    assert _blocks(response) == []
    (invalid,) = response.raw["invalid_tool_calls"]
    assert invalid["name"] == "add" and "cut off" in invalid["error"]
    assert response.raw["finish_reason"] == "length"
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="cut off"):
        llm.get_tool_calls_from_response(response)


def test_history_with_call_blocks_and_tool_results_reaches_the_engine(scripted):
    llm, engine = scripted("It is 3.")
    history = [
        ChatMessage(role="user", content="What is 1 + 2?"),
        ChatMessage(
            role="assistant",
            blocks=[
                TextBlock(text="Adding."),
                ToolCallBlock(tool_call_id="c1", tool_name="add", tool_kwargs={"a": 1, "b": 2}),
            ],
        ),
        ChatMessage(role="tool", content="3", additional_kwargs={"tool_call_id": "c1"}),
    ]
    llm.chat_with_tools([ADD], chat_history=history)
    assert normalize_messages(engine.last_messages) == [  # as the members see them
        {"role": "user", "content": "What is 1 + 2?"},
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "add", "arguments": {"a": 1, "b": 2}},
                }
            ],
        },
        {"role": "tool", "content": "3", "tool_call_id": "c1", "name": "add"},
    ]


def test_bad_tools_choices_and_schemas_fail_at_the_call(scripted):
    llm, engine = scripted()
    with pytest.raises(InvalidConfigError, match="not among the tools"):
        llm.chat_with_tools([ADD], user_msg="go", tool_choice="divide")
    bad = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"not": {}}}},
        },
    }
    with pytest.raises(InvalidConfigError, match="'not'"):
        llm.chat([ChatMessage(role="user", content="go")], tools=[bad])
    with pytest.raises(InvalidConfigError, match="takes no tools"):
        llm.complete("go", tools=[ADD])
    with pytest.raises(InvalidConfigError, match="tool_required"):
        llm.chat([ChatMessage(role="user", content="go")], tools=[ADD], tool_required="yes")
    with pytest.raises(InvalidConfigError, match="response_format"):
        llm.complete("go", response_format={"type": "array", "uniqueItems": True})
    assert engine.requests == []


# ---- structured output -----------------------------------------------------------------------
def test_structured_predict_constrains_to_the_schema(scripted):
    llm, engine = scripted(json.dumps(CITY))
    city = llm.structured_predict(City, PROMPT, city="Lyon")
    assert city == City(**CITY)
    assert engine.last_config.response_format == City.model_json_schema()
    assert engine.last_messages == [{"role": "user", "content": "Describe the city of Lyon."}]
    assert engine.last_config.tools == ()  # the answer itself, not a tool call


async def test_every_structured_predict_variant_ends_with_the_instance(scripted):
    llm, _ = scripted(json.dumps(CITY))
    assert await llm.astructured_predict(City, PROMPT, city="Lyon") == City(**CITY)
    partial = list(llm.stream_structured_predict(City, PROMPT, city="Lyon"))
    assert len(partial) > 1 and partial[-1] == City(**CITY)
    stream = await llm.astream_structured_predict(City, PROMPT, city="Lyon")
    assert [p async for p in stream][-1] == City(**CITY)


def test_a_structured_answer_cut_by_max_tokens_says_so(scripted):
    llm, _ = scripted(json.dumps(CITY)[:15], cut=True)
    with pytest.raises(ValueError, match="max_new_tokens"):
        llm.structured_predict(City, PROMPT, city="Lyon")
    with pytest.raises(ValueError, match="max_new_tokens"):
        list(llm.stream_structured_predict(City, PROMPT, city="Lyon"))


# ---- FunctionAgent ---------------------------------------------------------------------------
def _agent_script(messages: list) -> str:
    """Calls add first; answers with the tool's result once it has it."""
    if messages[-1]["role"] == "tool":
        return f"The answer is {messages[-1]['content']}."
    return call_text("add", {"a": 7, "b": 5})


async def test_function_agent_completes_a_tool_loop(scripted):
    llm, engine = scripted(_agent_script)
    agent = FunctionAgent(tools=[ADD], llm=llm)
    handler = agent.run(user_msg="What is 7 + 5?")
    results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    response = await handler
    assert [(r.tool_name, r.tool_kwargs, r.tool_output.content) for r in results] == [
        ("add", {"a": 7, "b": 5}, "12")
    ]
    assert str(response).strip() == "The answer is 12."
    second = normalize_messages(engine.requests[1][0])  # as the members see them
    assert second[-2]["tool_calls"][0]["function"]["name"] == "add"
    assert second[-1]["role"] == "tool" and second[-1]["name"] == "add"


# ---- the real engine, on the shipped models --------------------------------------------------
METHODS = [m for m in METHOD_NAMES if importlib.util.find_spec(f"core.methods.{m}")]
QUESTION = "Tom has 7 apples. He buys 5 more. How many apples does Tom have now?"


class Pair(BaseModel):
    a: Annotated[int, Field(ge=0, le=999)]
    b: Annotated[int, Field(ge=0, le=999)]


class Fruit(BaseModel):
    count: Annotated[int, Field(ge=0, le=999)]
    kind: Literal["apples", "pears"]
    note: Annotated[str, Field(max_length=10)]


BOUNDED = [FunctionTool.from_defaults(fn=fn, fn_schema=Pair) for fn in (add, multiply)]


# a held-out tool problem with plain-text answers (the example leaves JSON ones out)
TOOL_PROBLEM = next(
    p for p in make_problems(12, seed=3, form="tool") if p.expected_call and not p.response_format
)


def _shipped(method: str) -> EnsembleLLM:
    return EnsembleLLM(models=model_paths(), method=method, device="cpu", max_new_tokens=96)


@needs_trained
@pytest.mark.parametrize("method", METHODS)
def test_tool_required_forces_a_valid_call(method):
    llm = _shipped(method)
    response = llm.chat_with_tools(BOUNDED, user_msg=QUESTION, tool_required=True)
    (selection,) = llm.get_tool_calls_from_response(response)  # parallel off: one call
    assert selection.tool_name in {"add", "multiply"}
    Pair.model_validate(selection.tool_kwargs)
    assert response.raw["finish_reason"] == "tool_calls"
    streamed = list(llm.stream_chat_with_tools(BOUNDED, user_msg=QUESTION, tool_required=True))
    (again,) = llm.get_tool_calls_from_response(streamed[-1])
    assert (again.tool_name, again.tool_kwargs) == (selection.tool_name, selection.tool_kwargs)


@needs_trained
@pytest.mark.parametrize("method", METHODS)
async def test_structured_predict_returns_a_valid_instance(method):
    llm = _shipped(method)
    prompt = PromptTemplate("{question} Answer as JSON.")
    fruit = llm.structured_predict(Fruit, prompt, question=QUESTION)
    assert isinstance(fruit, Fruit)
    assert await llm.astructured_predict(Fruit, prompt, question=QUESTION) == fruit
    assert list(llm.stream_structured_predict(Fruit, prompt, question=QUESTION))[-1] == fruit


@needs_trained
@pytest.mark.parametrize("method", METHODS)
async def test_the_function_agent_example_completes_a_tool_loop(method):
    agent_example = load_example("llamaindex_function_agent")
    problem = TOOL_PROBLEM
    agent = agent_example.make_agent(_shipped(method), problem)
    answer, calls, _ = await agent_example.solve(agent, problem.question, echo=False)
    offered = {spec["function"]["name"] for spec in problem.tools}
    for name, kwargs, output in calls:  # each call ran the offered tool on its own arguments
        assert name in offered
        assert output == str(TOOL_FUNCTIONS[name](**kwargs))
    assert isinstance(answer, str)
    assert len(agent_example.grade(answer, calls, problem)) == 3


@needs_trained
def test_the_structured_output_example_gives_one_answer_three_ways():
    example = load_example("structured_output")
    engine = Ensemble.from_pretrained(model_paths(), device="cpu")
    problem = next(p for p in make_problems(12, seed=3, form="tool") if p.response_format)
    results = [
        run(engine, problem)
        for run in (example.with_core, example.with_langchain, example.with_llamaindex)
    ]
    assert set(results[0]) == set(problem.response_format["required"])
    assert results[0] == results[1] == results[2]  # the same prompt and grammar everywhere
