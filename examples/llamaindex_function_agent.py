"""A LlamaIndex FunctionAgent with two tools, on an ensemble of the shipped tiny models.

    python examples/llamaindex_function_agent.py                  # SAFE, a testbed question
    python examples/llamaindex_function_agent.py --method token --first-tool add
    python examples/llamaindex_function_agent.py --question "Mia has 4 cookies. ..."

Runs offline on CPU. `EnsembleLLM` is a `FunctionCallingLLM`: the agent sends the tools with
every turn (`astream_chat_with_tools`), the ensemble's grammar keeps each call well formed, the
calls come back as `ToolCallBlock`s, and the results go back as `tool` messages until the agent
answers. `--first-tool` forces the first turn to call that tool (`initial_tool_choice`). The
tools' arguments are bounded (0..999, through their `fn_schema`) so the tiny models cannot write
numbers without end; their choices are the models' own, right or wrong.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Annotated

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from llama_index.core.agent.workflow import (  # noqa: E402
    AgentStream,
    FunctionAgent,
    ToolCallResult,
)
from llama_index.core.tools import FunctionTool  # noqa: E402
from pydantic import BaseModel, Field  # noqa: E402

from core.testbed import make_problems, model_paths  # noqa: E402
from llamaindex_ensemble import EnsembleLLM  # noqa: E402


class Pair(BaseModel):
    a: Annotated[int, Field(ge=0, le=999)]
    b: Annotated[int, Field(ge=0, le=999)]


def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


def subtract(a: int, b: int) -> int:
    """Subtract b from a."""
    return a - b


TOOLS = [FunctionTool.from_defaults(fn=fn, fn_schema=Pair) for fn in (add, subtract)]


def make_agent(llm: EnsembleLLM, first_tool: str | None = None) -> FunctionAgent:
    return FunctionAgent(tools=TOOLS, llm=llm, initial_tool_choice=first_tool)


async def solve(agent: FunctionAgent, question: str, echo: bool = True) -> tuple[str, list]:
    """Run the agent on one question: (final answer, [(tool name, kwargs, output), ...])."""
    handler = agent.run(user_msg=question, max_iterations=8)
    calls = []
    async for event in handler.stream_events():
        if isinstance(event, AgentStream) and echo:
            print(event.delta, end="", flush=True)
        elif isinstance(event, ToolCallResult):
            calls.append((event.tool_name, event.tool_kwargs, event.tool_output.content))
            if echo:
                print(f"\n  -> {event.tool_name}({event.tool_kwargs}) = {event.tool_output}")
    response = await handler
    return str(response).strip(), calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--question", default=make_problems(1, seed=3)[0].question)
    parser.add_argument("--first-tool", default="add", help="tool the first turn must call")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    llm = EnsembleLLM(
        models=model_paths(), method=args.method, device=args.device, max_new_tokens=64
    )
    print(f"{llm.metadata.model_name}\nquestion: {args.question}")
    answer, calls = await solve(make_agent(llm, args.first_tool or None), args.question)
    print(f"\nanswer: {answer!r} ({len(calls)} tool calls)")


if __name__ == "__main__":
    asyncio.run(main())
