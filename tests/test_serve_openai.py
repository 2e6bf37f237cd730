"""`llm-ensembling serve` through the real `openai` SDK (sync and async, streaming, tools,
structured output, completions), on the shipped models: every answer equals what the same
ensemble writes in process for the same request."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Annotated, Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from serve_helpers import calls_of, reference

from core.testbed import TOOL_SPECS, make_problems

PROBLEMS = make_problems(4, seed=11)
TOOL_PROBLEMS = make_problems(2, seed=5, form="tool")


@pytest.fixture
def client(served, bodies):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", http_client=bodies.client())


def test_models_health_and_request_ids(served):
    url, _, ensemble = served
    models = openai.OpenAI(base_url=url + "/v1", api_key="unused").models.list()
    assert [m.id for m in models.data] == ["ensemble"]
    health = httpx.get(url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ready"
    assert health.headers["x-request-id"].startswith("req_")
    echoed = httpx.get(url + "/health", headers={"x-request-id": "trace-42"})
    assert echoed.headers["x-request-id"] == "trace-42"
    odd = httpx.get(url + "/health", headers={"x-request-id": "has spaces"})
    assert odd.headers["x-request-id"].startswith("req_")
    assert httpx.get(url + "/nowhere").headers["x-request-id"]


def test_chat_equals_the_in_process_ensemble(served, client, bodies):
    _, _, ensemble = served
    for problem in PROBLEMS[:2]:
        answer = client.chat.completions.create(
            model="ensemble", messages=problem.messages, max_tokens=64
        )
        expected = reference(ensemble, bodies.last)
        choice = answer.choices[0]
        assert choice.message.content == expected.text
        assert choice.finish_reason == expected.finish_reason
        assert answer.usage.completion_tokens == expected.stats.tokens
        assert answer.usage.prompt_tokens == expected.stats.input_tokens
        details = answer.model_extra["ensemble"]
        assert details["method"] == "safe" and details["members"] == [
            m.name for m in ensemble.members
        ]
        assert details["ensemble_rate"] == pytest.approx(expected.stats.ensemble_rate, abs=1e-6)
        assert details["failed"] == {}


def test_stream_chunks_add_up_to_the_answer_with_usage_last(served, client, bodies):
    _, _, ensemble = served
    stream = client.chat.completions.create(
        model="ensemble",
        messages=PROBLEMS[2].messages,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    expected = reference(ensemble, bodies.last)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == [expected.finish_reason]
    assert finish[0].model_extra["ensemble"]["tokens"] == expected.stats.tokens
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected.stats.tokens
    assert len({c.id for c in chunks}) == 1


def test_raw_sse_ends_with_done(served):
    url = served[0]
    body = {"model": "ensemble", "messages": PROBLEMS[0].messages, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    assert all(line.startswith("data: ") for line in lines)
    assert "usage" not in json.loads(lines[-2][6:])  # no usage chunk unless asked


async def test_async_client_concurrent_requests_equal_their_references(served, bodies):
    url, _, ensemble = served
    client = openai.AsyncOpenAI(
        base_url=url + "/v1", api_key="unused", http_client=bodies.async_client()
    )

    async def streamed(messages) -> str:
        stream = await client.chat.completions.create(
            model="ensemble", messages=messages, max_tokens=48, stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    async def whole(messages) -> str:
        answer = await client.chat.completions.create(
            model="ensemble", messages=messages, max_completion_tokens=48
        )
        return answer.choices[0].message.content

    texts = await asyncio.gather(
        streamed(PROBLEMS[0].messages), whole(PROBLEMS[1].messages), streamed(PROBLEMS[3].messages)
    )
    sent = {json.dumps(b["messages"]): b for b in bodies.sent}
    for text, problem in zip(texts, (PROBLEMS[0], PROBLEMS[1], PROBLEMS[3]), strict=True):
        body = sent[json.dumps(problem.messages)]
        assert text == (await asyncio.to_thread(reference, ensemble, body)).text


def test_forced_tool_calls_and_their_stream(served, client, bodies):
    _, _, ensemble = served
    problem = TOOL_PROBLEMS[0]
    request = {
        "model": "ensemble",
        "messages": problem.messages,
        "tools": problem.tools,
        "tool_choice": "required",
        "max_tokens": 64,
    }
    answer = client.chat.completions.create(**request)
    expected = reference(ensemble, bodies.last)
    assert expected.tool_calls and answer.choices[0].finish_reason == "tool_calls"
    calls = answer.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == calls_of(
        expected
    )
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)

    stream = client.chat.completions.create(**request, stream=True)
    deltas = [d for c in stream if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [d.index for d in deltas] == list(range(len(deltas)))
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == calls_of(
        expected
    )


def test_a_named_tool_and_a_conversation_with_a_tool_result(served, client, bodies):
    _, _, ensemble = served
    problem = TOOL_PROBLEMS[1]
    tools = [TOOL_SPECS["add"], TOOL_SPECS["multiply"]]
    first = client.chat.completions.create(
        model="ensemble",
        messages=problem.messages,
        tools=tools,
        tool_choice={"type": "function", "function": {"name": "multiply"}},
        max_tokens=64,
    )
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "multiply"
    history = [
        {"role": "developer", "content": "Use the tools."},
        *problem.messages,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "45"},
    ]
    second = client.chat.completions.create(
        model="ensemble", messages=history, tools=tools, max_tokens=48
    )
    expected = reference(ensemble, bodies.last)
    assert second.choices[0].message.content == (expected.text or None)
    assert second.choices[0].finish_reason == expected.finish_reason


class Count(BaseModel):
    apples: Annotated[int, Field(ge=0, le=999)]
    unit: Literal["apples", "pears"]


def test_structured_output_parses_and_equals_in_process(served, client, bodies):
    _, _, ensemble = served
    parsed = client.chat.completions.parse(
        model="ensemble", messages=PROBLEMS[0].messages, response_format=Count, max_tokens=48
    )
    result = parsed.choices[0].message.parsed
    assert isinstance(result, Count)
    expected = reference(ensemble, bodies.last)
    assert parsed.choices[0].message.content == expected.text
    assert bodies.last["response_format"]["type"] == "json_schema"

    mode = client.chat.completions.create(
        model="ensemble",
        messages=PROBLEMS[1].messages,
        response_format={"type": "json_object"},
        max_tokens=48,
    )
    expected = reference(ensemble, bodies.last)
    assert mode.choices[0].message.content == expected.text
    assert mode.choices[0].finish_reason == expected.finish_reason
    assert mode.choices[0].message.content.startswith("{")  # any object; the grammar holds it


def test_completions_sync_and_streamed(served, client, bodies):
    _, _, ensemble = served
    prompt = PROBLEMS[3].question
    answer = client.completions.create(model="ensemble", prompt=prompt, max_tokens=40)
    expected = reference(ensemble, bodies.last)
    assert answer.choices[0].text == expected.text
    assert answer.choices[0].finish_reason == expected.finish_reason
    assert answer.object == "text_completion"
    short = client.completions.create(model="ensemble", prompt=prompt)  # OpenAI's default: 16
    assert short.usage.completion_tokens <= 16
    stream = client.completions.create(
        model="ensemble",
        prompt=prompt,
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert chunks[-1].usage.completion_tokens == expected.stats.tokens


def test_sampling_with_a_seed_repeats(served, client):
    def once() -> str:
        answer = client.chat.completions.create(
            model="ensemble", messages=PROBLEMS[0].messages, max_tokens=24, temperature=0.9,
            top_p=0.95, seed=7,
        )  # fmt: skip
        return answer.choices[0].message.content

    assert once() == once()


def test_metrics_count_requests_tokens_and_queue(served, client):
    url = served[0]
    client.chat.completions.create(model="ensemble", messages=PROBLEMS[0].messages, max_tokens=8)
    text = httpx.get(url + "/metrics").text
    lines = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert float(lines['llm_ensembling_requests_total{endpoint="chat",status="200"}']) >= 1
    assert float(lines["llm_ensembling_completion_tokens_total"]) >= 1
    assert float(lines["llm_ensembling_ensemble_rate_count"]) >= 1
    assert "llm_ensembling_queue_depth" in lines and "llm_ensembling_running_requests" in lines
    assert lines["llm_ensembling_ready"] == "1.0"
    assert "llm_ensembling_request_seconds_bucket" in text
    assert "llm_ensembling_time_to_first_token_seconds_bucket" in text


class PassCounter:
    """Counts the drafter's forward passes and slows each a little, so that a request is
    surely mid-way when its client leaves."""

    def __init__(self, member) -> None:
        self.passes = 0
        self._lock = threading.Lock()
        self._handle = member.model.register_forward_pre_hook(self._hook)

    def _hook(self, *_args) -> None:
        with self._lock:
            self.passes += 1
        time.sleep(0.02)

    def remove(self) -> None:
        self._handle.remove()


def _idle(ensemble, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ensemble.admission.running == 0:
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_frees_its_slot_at_the_next_pass(served, stream):
    url, _, ensemble = served
    counter = PassCounter(ensemble.members[0])
    body = {
        "model": "ensemble",
        "messages": PROBLEMS[1].messages,
        "max_tokens": 2000,
        "stream": stream,
        "response_format": {"type": "json_object"},  # keeps writing: a JSON object grows
    }
    try:
        with httpx.Client(timeout=60) as http:
            if stream:
                with http.stream("POST", url + "/v1/chat/completions", json=body) as response:
                    next(response.iter_lines())
            else:
                with pytest.raises(httpx.ReadTimeout):
                    http.post(url + "/v1/chat/completions", json=body, timeout=0.5)
        left = counter.passes
        assert _idle(ensemble)
        assert counter.passes - left <= 2  # the pass running when it left, and one at most
    finally:
        counter.remove()
    after = httpx.post(
        url + "/v1/chat/completions",
        json={"model": "ensemble", "messages": PROBLEMS[1].messages, "max_tokens": 4},
    )
    assert after.status_code == 200


def test_a_call_cut_by_max_tokens_comes_back_partial_as_openais_does(served, client, bodies):
    request = {
        "model": "ensemble",
        "messages": TOOL_PROBLEMS[0].messages,
        "tools": [TOOL_SPECS["add"], TOOL_SPECS["multiply"]],
        "tool_choice": "required",
        "max_tokens": 20,
    }
    answer = client.chat.completions.create(**request)
    expected = reference(served[2], bodies.last)
    cut = expected.invalid_tool_calls[0]
    assert expected.finish_reason == "length" and cut.partial_arguments
    choice = answer.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == (cut.name, cut.partial_arguments)
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    assert answer.model_extra["ensemble"]["invalid_tool_calls"][0]["name"] == cut.name

    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.function.name, d.function.arguments) for d in deltas] == [
        (0, cut.name, cut.partial_arguments)
    ]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_a_stream_interval_sends_fewer_larger_chunks_of_the_same_answer(shipped_members):
    """`--stream-interval 4`: the same text, in chunks of 4 deltas (of one token each here) after
    the first, however fast the client reads; the finish comes with the rest."""
    from serve_helpers import running_server

    from core import Ensemble

    ensemble = Ensemble(list(shipped_members[:1]), "single")
    body = {"model": "ensemble", "messages": PROBLEMS[1].messages, "max_tokens": 40}

    def chunks(interval: int) -> list:
        with running_server(lambda: ensemble, stream_interval=interval) as (url, _):
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
            return list(client.chat.completions.create(**body, stream=True))

    one, four = chunks(1), chunks(4)
    text = ["".join(c.choices[0].delta.content or "" for c in run) for run in (one, four)]
    expected = reference(ensemble, body)
    assert text == [expected.text, expected.text]
    assert expected.stats.tokens > 12
    sent = [c for c in four if c.choices[0].delta.content]
    assert len(sent) <= 1 + -(-expected.stats.tokens // 4)  # the first, then 4 deltas a chunk
    assert four[-1].choices[0].finish_reason == expected.finish_reason


def test_a_stream_interval_that_is_not_a_positive_integer_is_refused():
    from core.errors import InvalidConfigError
    from core.serve.settings import ServeSettings

    for bad in (0, -2, 1.5, True):
        with pytest.raises(InvalidConfigError, match="stream_interval.*positive integer"):
            ServeSettings(stream_interval=bad)
