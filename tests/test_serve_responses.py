"""`POST /v1/responses` through the real `openai` SDK (`client.responses.create`, `.stream`,
`.parse`) and LangChain's `ChatOpenAI(use_responses_api=True)`, on the shipped models: every
answer equals what the same ensemble writes in process for the request the client sent; the
typed events come in OpenAI's order with consecutive sequence numbers; a response cut by
max_output_tokens is `incomplete`, with the call it was writing partial (an invalid tool call
to LangChain)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import httpx
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from serve_helpers import responses_reference

from core.testbed import TOOL_SPECS, make_problems

PROBLEMS = make_problems(3, seed=31)
TOOL_PROBLEM = make_problems(1, seed=5, form="tool")[0]
TOOLS = [{"type": "function", **TOOL_SPECS[name]["function"]} for name in ("add", "multiply")]


@pytest.fixture
def client(served, bodies):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", http_client=bodies.client())


def _calls(response) -> list[tuple[str, dict]]:
    return [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"]


def test_create_equals_in_process(served, client, bodies):
    ensemble = served[2]
    answer = client.responses.create(
        model="ensemble",
        instructions="Answer with the number.",
        input=PROBLEMS[0].question,
        max_output_tokens=48,
    )
    expected = responses_reference(ensemble, bodies.last)
    assert answer.object == "response" and answer.id.startswith("resp_")
    assert answer.output_text == expected.text
    assert answer.status == ("incomplete" if expected.finish_reason == "length" else "completed")
    assert answer.usage.output_tokens == expected.stats.tokens
    assert answer.usage.input_tokens == expected.stats.input_tokens
    assert answer.model_extra["ensemble"]["method"] == "safe"
    assert answer.output[0].type == "message" and answer.output[0].role == "assistant"


def test_stream_sends_the_typed_events_in_order(served, client, bodies):
    ensemble = served[2]
    with client.responses.stream(
        model="ensemble", input=PROBLEMS[1].messages, max_output_tokens=48
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    expected = responses_reference(ensemble, bodies.last)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected.text == final.output_text
    assert final.usage.output_tokens == expected.stats.tokens


def test_tool_calls_then_their_outputs(served, client, bodies):
    ensemble = served[2]
    first = client.responses.create(
        model="ensemble",
        input=TOOL_PROBLEM.messages,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=64,
    )
    expected = responses_reference(ensemble, bodies.last)
    assert expected.tool_calls and first.status == "completed"
    assert _calls(first) == [(c.name, c.arguments) for c in expected.tool_calls]
    call = next(i for i in first.output if i.type == "function_call")
    assert call.call_id.startswith("call_") and call.status == "completed"

    history = [
        *TOOL_PROBLEM.messages,
        *[i.model_dump(exclude_none=True) for i in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "12"},
    ]
    with client.responses.stream(
        model="ensemble", input=history, tools=TOOLS, max_output_tokens=48
    ) as stream:
        final = stream.get_final_response()
    expected = responses_reference(ensemble, bodies.last)
    assert final.output_text == expected.text and _calls(final) == [
        (c.name, c.arguments) for c in expected.tool_calls
    ]


def test_a_streamed_call_comes_with_its_argument_events(served, client, bodies):
    with client.responses.stream(
        model="ensemble",
        input=TOOL_PROBLEM.messages,
        tools=TOOLS,
        tool_choice={"type": "function", "name": "add"},
        max_output_tokens=64,
    ) as stream:
        events = list(stream)
    expected = responses_reference(served[2], bodies.last)
    kinds = [e.type for e in events]
    i = kinds.index("response.output_item.added")
    assert kinds[i : i + 4] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    done = events[i + 2]
    assert (done.name, json.loads(done.arguments)) == (
        expected.tool_calls[0].name,
        expected.tool_calls[0].arguments,
    )


class Count(BaseModel):
    apples: Annotated[int, Field(ge=0, le=999)]
    unit: Literal["apples", "pears"]


def test_parse_with_a_text_format(served, client, bodies):
    parsed = client.responses.parse(
        model="ensemble", input=PROBLEMS[2].messages, text_format=Count, max_output_tokens=48
    )
    assert isinstance(parsed.output_parsed, Count)
    assert bodies.last["text"]["format"]["type"] == "json_schema"
    assert parsed.output_text == responses_reference(served[2], bodies.last).text


def test_a_call_cut_by_max_output_tokens_is_incomplete(served, client, bodies):
    answer = client.responses.create(
        model="ensemble",
        input=TOOL_PROBLEM.messages,
        tools=TOOLS,
        tool_choice="required",
        max_output_tokens=20,
    )
    expected = responses_reference(served[2], bodies.last)
    assert expected.finish_reason == "length" and expected.invalid_tool_calls
    assert answer.status == "incomplete"
    assert answer.incomplete_details.reason == "max_output_tokens"
    call = answer.output[-1]
    assert call.type == "function_call" and call.status == "incomplete"
    cut = expected.invalid_tool_calls[0]
    assert (call.name, call.arguments) == (cut.name, cut.partial_arguments)
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.arguments)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        (
            {"input": [{"type": "function_call_output", "call_id": "call_x", "output": "1"}]},
            "input[0].call_id",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"store": True}, "store"),
    ],
    ids=["previous_response_id", "unknown call_id", "an image", "a built-in tool", "store"],
)
def test_what_a_stateless_text_server_refuses(served, body, param):
    sent = {"model": "ensemble", "input": "hi", **body}
    answer = httpx.post(served[0] + "/v1/responses", json=sent)
    assert answer.status_code in (400, 422)
    assert answer.json()["error"]["param"] == param


def _chat(served, bodies, **fields) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=served[0] + "/v1",
        api_key="unused",
        model="ensemble",
        use_responses_api=True,
        http_client=bodies.client(),
        **{"temperature": 0, "max_tokens": 48, **fields},
    )


def test_chat_openai_on_the_responses_api(served, bodies):
    ensemble = served[2]
    message = _chat(served, bodies).invoke(PROBLEMS[0].messages)
    assert "input" in bodies.last and "messages" not in bodies.last
    expected = responses_reference(ensemble, bodies.last)
    assert message.text == expected.text
    assert message.usage_metadata["output_tokens"] == expected.stats.tokens

    chunks = list(_chat(served, bodies).stream(PROBLEMS[1].messages))
    whole = sum(chunks[1:], chunks[0])
    assert whole.text == responses_reference(ensemble, bodies.last).text


class add_numbers(BaseModel):  # noqa: N801 (a tool's name)
    """Add two whole numbers."""

    a: Annotated[int, Field(ge=0, le=999)]
    b: Annotated[int, Field(ge=0, le=999)]


def test_chat_openai_tools_and_structured_output_on_the_responses_api(served, bodies):
    ensemble = served[2]
    bound = _chat(served, bodies, max_tokens=64).bind_tools([add_numbers], tool_choice="any")
    message = bound.invoke(TOOL_PROBLEM.messages)
    expected = responses_reference(ensemble, bodies.last)
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [
        (c.name, c.arguments) for c in expected.tool_calls
    ]
    result = _chat(served, bodies).with_structured_output(Count).invoke(PROBLEMS[2].messages)
    assert bodies.last["text"]["format"]["type"] == "json_schema"
    assert result == Count.model_validate_json(responses_reference(ensemble, bodies.last).text)

    cut = _chat(served, bodies, max_tokens=20).bind_tools([add_numbers], tool_choice="any")
    message = cut.invoke(TOOL_PROBLEM.messages)
    assert not message.tool_calls and message.invalid_tool_calls
    assert message.invalid_tool_calls[0]["name"] == "add_numbers"
