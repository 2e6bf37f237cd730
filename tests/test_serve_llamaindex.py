"""`llm-ensembling serve` through LlamaIndex's `OpenAILike(is_chat_model=True,
is_function_calling_model=True)`: chat, streaming, a `FunctionAgent` tool loop and a RAG query
engine, and `complete` through /v1/completions; on the shipped models, each answer equal to the
in-process ensemble's for the request LlamaIndex sent (read from the wire)."""

from __future__ import annotations

import pytest
from conftest import load_example
from llama_index.core.agent.workflow import ToolCallResult
from llama_index.core.base.llms.types import ChatMessage
from llama_index.llms.openai_like import OpenAILike
from serve_helpers import calls_of, reference

from core.testbed import make_problems

PROBLEMS = make_problems(2, seed=31)
RAG = make_problems(3, form="rag")


def _llm(served, bodies, chat: bool = True, **fields) -> OpenAILike:
    return OpenAILike(
        model="ensemble",
        api_base=served[0] + "/v1",
        api_key="unused",
        is_chat_model=chat,
        is_function_calling_model=chat,
        context_window=2048,
        http_client=bodies.client(),
        async_http_client=bodies.async_client(),
        **{"temperature": 0.0, "max_tokens": 64, **fields},
    )


def _messages(problem) -> list[ChatMessage]:
    return [ChatMessage(role=m["role"], content=m["content"]) for m in problem.messages]


def test_chat_and_stream_chat(served, bodies):
    llm = _llm(served, bodies)
    response = llm.chat(_messages(PROBLEMS[0]))
    assert response.message.content == reference(served[2], bodies.last).text
    pieces = list(llm.stream_chat(_messages(PROBLEMS[1])))
    assert pieces[-1].message.content == reference(served[2], bodies.last).text
    assert "".join(p.delta or "" for p in pieces) == pieces[-1].message.content


def test_complete_goes_through_the_completions_endpoint(served, bodies):
    llm = _llm(served, bodies, chat=False)
    response = llm.complete(PROBLEMS[0].question)
    assert "prompt" in bodies.last
    assert response.text == reference(served[2], bodies.last).text
    streamed = list(llm.stream_complete(PROBLEMS[0].question))
    assert streamed[-1].text == response.text


async def test_function_agent_runs_its_tool_loop(served, bodies):
    agent_example = load_example("llamaindex_function_agent")
    tool_problems = make_problems(12, seed=3, form="tool")
    problem = next(p for p in tool_problems if p.expected_call and not p.response_format)
    agent = agent_example.make_agent(_llm(served, bodies), problem)
    handler = agent.run(user_msg=problem.question, max_iterations=8)
    results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    answer = str(await handler).strip()
    expected = [reference(served[2], body) for body in bodies.sent]
    assert [(r.tool_name, r.tool_kwargs) for r in results] == [
        call for output in expected for call in calls_of(output)
    ]
    assert answer == expected[-1].text.strip()
    offered = [spec["function"]["name"] for spec in problem.tools]
    assert [t["function"]["name"] for t in bodies.sent[0]["tools"]] == offered


@pytest.fixture(scope="module")
def rag_example():
    return load_example("llamaindex_rag")


@pytest.mark.parametrize("streaming", [False, True], ids=["query", "streaming"])
def test_a_query_engine_over_a_vector_index(served, bodies, rag_example, streaming):
    problem = RAG[2]
    index = rag_example.build_index(problem.passages, rag_example.embedding_model())
    engine = index.as_query_engine(llm=_llm(served, bodies, max_tokens=80), streaming=streaming)
    response = engine.query(problem.question)
    text = "".join(response.response_gen) if streaming else str(response)
    assert problem.relevant_passage in [n.node.get_content() for n in response.source_nodes]
    assert text == reference(served[2], bodies.last).text
