"""`llm-ensembling serve` through LangChain's `ChatOpenAI(base_url=...)`: invoke, stream with
usage, bind_tools, with_structured_output, and a `create_agent` loop with tools and a response
format, on the shipped models. Each answer equals the in-process ensemble's for the request
ChatOpenAI sent (read from the wire)."""

from __future__ import annotations

from typing import Annotated, Literal

from langchain.agents import create_agent
from langchain.agents.structured_output import ProviderStrategy
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from serve_helpers import calls_of, reference

from core.testbed import make_problems

PROBLEMS = make_problems(3, seed=21)
Small = Annotated[int, Field(ge=0, le=999)]


def _chat(served, bodies, **fields) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=served[0] + "/v1",
        api_key="unused",
        model="ensemble",
        http_client=bodies.client(),
        http_async_client=bodies.async_client(),
        **{"temperature": 0, "max_tokens": 64, **fields},
    )


def _calls(message: AIMessage) -> list[tuple[str, dict]]:
    return [(c["name"], c["args"]) for c in message.tool_calls]


def test_invoke_equals_in_process(served, bodies):
    message = _chat(served, bodies).invoke(PROBLEMS[0].messages)
    expected = reference(served[2], bodies.last)
    assert message.content == expected.text
    assert message.response_metadata["finish_reason"] == expected.finish_reason
    assert message.usage_metadata["output_tokens"] == expected.stats.tokens
    assert message.usage_metadata["input_tokens"] == expected.stats.input_tokens


def test_stream_with_usage(served, bodies):
    chunks = list(_chat(served, bodies, stream_usage=True).stream(PROBLEMS[1].messages))
    expected = reference(served[2], bodies.last)
    whole = sum(chunks[1:], chunks[0])
    assert len(chunks) > 2 and whole.content == expected.text
    assert whole.usage_metadata["output_tokens"] == expected.stats.tokens
    assert bodies.last["stream_options"] == {"include_usage": True}


class add_numbers(BaseModel):  # noqa: N801 (a tool's name)
    """Add two whole numbers."""

    a: Small
    b: Small


class weather(BaseModel):  # noqa: N801
    """The weather in a city."""

    city: Literal["Paris", "Lyon"]


async def test_bind_tools_invoke_and_async_stream(served, bodies):
    bound = _chat(served, bodies).bind_tools([add_numbers, weather], tool_choice="any")
    message = bound.invoke(PROBLEMS[2].messages)
    expected = reference(served[2], bodies.last)
    assert expected.tool_calls and _calls(message) == calls_of(expected)
    assert message.response_metadata["finish_reason"] == "tool_calls"
    chunks = [c async for c in bound.astream(PROBLEMS[2].messages)]
    streamed = sum(chunks[1:], chunks[0])
    assert _calls(streamed) == calls_of(expected)
    assert all(isinstance(c["index"], int) for c in streamed.tool_call_chunks)


class Count(BaseModel):
    """How many apples."""

    apples: Small
    unit: Literal["apples", "pears"]


def test_with_structured_output_default_json_schema(served, bodies):
    result = _chat(served, bodies).with_structured_output(Count).invoke(PROBLEMS[0].messages)
    assert bodies.last["response_format"]["type"] == "json_schema"
    expected = reference(served[2], bodies.last)
    assert result == Count.model_validate_json(expected.text)


@tool
def add(a: Small, b: Small) -> int:
    """Add two whole numbers."""
    return a + b


@tool
def subtract(a: Small, b: Small) -> int:
    """Subtract b from a."""
    return a - b


class Answer(BaseModel):
    """The final answer to the question."""

    value: int = Field(ge=-999, le=9999, description="the number asked for")
    confident: bool = Field(description="whether the tool results support the value")


def test_create_agent_with_tools_and_a_response_format(served, bodies):
    """ChatOpenAI knows no profile for this model, so the agent is told that the server
    enforces a response_format (ProviderStrategy): each turn is tool calls or the answer."""
    agent = create_agent(_chat(served, bodies, max_tokens=96), tools=[add, subtract],
                         response_format=ProviderStrategy(Answer))  # fmt: skip
    question = make_problems(1, seed=3)[0].question
    state = agent.invoke({"messages": [{"role": "user", "content": question}]},
                         {"recursion_limit": 12})  # fmt: skip
    assert isinstance(state["structured_response"], Answer)
    assert any(isinstance(m, ToolMessage) for m in state["messages"])  # it used a tool
    replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
    assert len(replies) == len(bodies.sent)
    for reply, body in zip(replies, bodies.sent, strict=True):
        assert [t["function"]["name"] for t in body["tools"]] == ["add", "subtract"]
        assert body["response_format"]["type"] == "json_schema"
        expected = reference(served[2], body)
        assert reply.content == expected.text and _calls(reply) == calls_of(expected)


def test_a_call_cut_by_max_tokens_is_an_invalid_tool_call(served, bodies):
    bound = _chat(served, bodies, max_tokens=26).bind_tools([add_numbers], tool_choice="any")
    message = bound.invoke(make_problems(1, seed=5, form="tool")[0].messages)
    assert message.response_metadata["finish_reason"] == "length"
    assert not message.tool_calls
    [invalid] = message.invalid_tool_calls
    assert invalid["name"] == "add_numbers" and invalid["args"].startswith("{")
