"""A LangChain agent (`langchain.agents.create_agent`) with two tools and a structured final
answer, on an ensemble of the shipped tiny models.

    python examples/langchain_agent.py                       # SAFE, a testbed question
    python examples/langchain_agent.py --method specem --question "Mia has 4 cookies. ..."

Runs offline on CPU (needs `pip install "llm-ensembling[langchain]"`, which brings `langchain`).
`ChatEnsemble`'s profile says it supports structured output, so `create_agent` asks for the
`Answer` schema as a `response_format` next to the tools (its ProviderStrategy): each turn the
ensemble's grammar allows either tool calls or the JSON answer, and the agent loops until the
answer comes. The tools' arguments are bounded (0..999) so the tiny models cannot write numbers
without end; their choices are the models' own, right or wrong.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Annotated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from core.testbed import make_problems, model_paths  # noqa: E402
from langchain_ensemble import ChatEnsemble  # noqa: E402

Small = Annotated[int, Field(ge=0, le=999)]


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


def make_agent(method: str, max_tokens: int = 96):
    chat = ChatEnsemble(
        models=[str(p) for p in model_paths()], method=method, max_tokens=max_tokens
    )
    return create_agent(chat, tools=[add, subtract], response_format=Answer)


def run(agent, question: str, recursion_limit: int = 12) -> dict:
    """The agent's final state: its messages and `structured_response` (an `Answer`)."""
    inputs = {"messages": [{"role": "user", "content": question}]}
    return agent.invoke(inputs, {"recursion_limit": recursion_limit})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--question", default=make_problems(1, seed=3)[0].question)
    args = parser.parse_args()
    state = run(make_agent(args.method), args.question)
    print(f"question: {args.question}")
    for message in state["messages"][1:]:
        if isinstance(message, AIMessage) and message.tool_calls:
            for call in message.tool_calls:
                print(f"  call   {call['name']}({call['args']})")
        elif isinstance(message, ToolMessage):
            print(f"  result {message.content}")
        elif isinstance(message, AIMessage):
            print(f"  answer {message.content}")
    print(f"structured_response: {state['structured_response']!r}")


if __name__ == "__main__":
    main()
