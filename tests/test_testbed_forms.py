"""The rag and react forms are exactly what LlamaIndex sends a chat LLM (real classes); the tool
form's specs are exactly what LangChain writes for the tool functions."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core import Document, VectorStoreIndex  # noqa: E402
from llama_index.core.agent.react.formatter import ReActChatFormatter  # noqa: E402
from llama_index.core.agent.workflow import ReActAgent  # noqa: E402
from llama_index.core.base.llms.types import (  # noqa: E402
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    LLMMetadata,
)
from llama_index.core.embeddings import BaseEmbedding  # noqa: E402
from llama_index.core.llms import CustomLLM  # noqa: E402
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402

from core.testbed import (  # noqa: E402
    CALCULATOR_DESCRIPTION,
    CALCULATOR_NAME,
    REACT_SYSTEM_HEADER,
    TOOL_FUNCTIONS,
    TOOL_SPECS,
    calculator,
    make_problems,
    react_steps,
)
from core.testbed.task import (  # noqa: E402
    CALCULATOR_TOOL_DESC,
    FOODS,
    NAMES,
    RAG_CONTEXT_SEPARATOR,
    RAG_SYSTEM_PROMPT,
    RAG_TOP_K,
    RAG_USER_TEMPLATE,
    THINGS,
)

WORDS = sorted(NAMES) + list(FOODS + THINGS)


class ScriptedLLM(CustomLLM):
    """A chat LLM that records the messages it is sent and answers from a script."""

    script: list[str] = []
    seen: list[list[dict[str, str]]] = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(context_window=2048, num_output=256, is_chat_model=True)

    def _next(self, messages) -> str:
        self.seen.append([{"role": m.role.value, "content": m.content} for m in messages])
        return self.script[len(self.seen) - 1]

    @llm_chat_callback()
    def chat(self, messages, **kwargs: Any) -> ChatResponse:
        return ChatResponse(message=ChatMessage(role="assistant", content=self._next(messages)))

    @llm_chat_callback()
    def stream_chat(self, messages, **kwargs: Any):
        text = self._next(messages)

        def gen():
            yield ChatResponse(message=ChatMessage(role="assistant", content=text), delta=text)

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        raise AssertionError("a chat model is never sent a completion prompt here")

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any):
        raise AssertionError("a chat model is never sent a completion prompt here")


def calculator_tool() -> FunctionTool:
    return FunctionTool.from_defaults(
        fn=calculator, name=CALCULATOR_NAME, description=CALCULATOR_DESCRIPTION
    )


def test_tool_description_matches_llamaindex():
    from llama_index.core.agent.react.formatter import get_react_tool_descriptions

    assert get_react_tool_descriptions([calculator_tool()]) == [CALCULATOR_TOOL_DESC]


@pytest.mark.parametrize("streaming", [False, True])
def test_react_messages_match_the_real_agent(streaming):
    for problem in make_problems(3, seed=7, form="react"):
        steps = react_steps(problem)
        llm = ScriptedLLM(script=[target for _, target in steps], seen=[])
        agent = ReActAgent(
            tools=[calculator_tool()],
            llm=llm,
            formatter=ReActChatFormatter.from_defaults(system_header=REACT_SYSTEM_HEADER),
            streaming=streaming,
        )

        async def run(agent=agent, problem=problem):
            return await agent.run(user_msg=problem.question)

        response = asyncio.run(run())
        assert llm.seen == [messages for messages, _ in steps]
        assert str(response) == str(problem.answer)  # the agent strips "Answer:"


class KeywordEmbedding(BaseEmbedding):
    """Bag of task words: a passage about the query's person and object ranks first."""

    def _vec(self, text: str) -> list[float]:
        words = set(re.findall(r"\w+", text))
        return [float(w in words) for w in WORDS] + [1e-3]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._vec(text)

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return self._vec(query)


def test_rag_messages_match_the_default_query_engine():
    for problem in make_problems(5, seed=7, form="rag"):
        llm = ScriptedLLM(script=[problem.solution], seen=[])
        index = VectorStoreIndex.from_documents(
            [Document(text=t) for t in problem.passages], embed_model=KeywordEmbedding()
        )
        response = index.as_query_engine(llm=llm).query(problem.question)
        (sent,) = llm.seen
        context = sent[1]["content"].split("---------------------\n")[1].removesuffix("\n")
        retrieved = context.split(RAG_CONTEXT_SEPARATOR)
        assert len(retrieved) == RAG_TOP_K and retrieved[0] == problem.relevant_passage
        expected = [
            {"role": "system", "content": RAG_SYSTEM_PROMPT},
            {
                "role": "user",
                "content": RAG_USER_TEMPLATE.format(
                    context_str=context, query_str=problem.question
                ),
            },
        ]
        assert sent == expected
        assert problem.messages[0] == expected[0]
        assert problem.messages[1]["content"].startswith(expected[1]["content"].split("---")[0])
        assert str(response) == problem.solution


def test_tool_specs_are_what_langchain_writes_for_the_tool_functions():
    """A user who binds the testbed's tool functions through LangChain sends the models exactly
    the tool specs the tool form trained them on."""
    function_calling = pytest.importorskip("langchain_core.utils.function_calling")
    for name, function in TOOL_FUNCTIONS.items():
        assert function_calling.convert_to_openai_tool(function) == TOOL_SPECS[name]
    problem = next(p for p in make_problems(20, seed=3, form="tool") if p.expected_call)
    assert problem.tools == [
        function_calling.convert_to_openai_tool(TOOL_FUNCTIONS[t["function"]["name"]])
        for t in problem.tools
    ]
