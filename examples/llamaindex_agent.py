"""A LlamaIndex ReActAgent with a calculator tool, thinking with an ensemble of the shipped models.

The agent is configured exactly as the testbed's `react` form was trained: the compact ReAct
header `REACT_SYSTEM_HEADER`, one `calculator` tool with its name, description and
`{"expression": ...}` argument, observations as user turns (the formatter's default). The agent
calls `astream_chat`, which runs the ensemble on a worker thread; its stream shows the deltas,
the tool calls and their results.

With `--real`, the real pair (SmolLM2-135M-Instruct and Gemma-3-270M base, the `real` extra)
answers a calculator question of the real task's tool form with LlamaIndex's own ReAct header
(the real models were never trained on the compact one): small real models rarely keep to the
ReAct format, which this shows as it is.

    python examples/llamaindex_agent.py                      # a held-out problem, method safe
    python examples/llamaindex_agent.py --method single --problem 4
    python examples/llamaindex_agent.py --question "Mia has 4 cookies. She buys 3 more. ..."
    python examples/llamaindex_agent.py --real"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from llama_index.core.agent.react import ReActChatFormatter  # noqa: E402
from llama_index.core.agent.workflow import AgentStream, ReActAgent, ToolCallResult  # noqa: E402
from llama_index.core.tools import FunctionTool  # noqa: E402

from core.testbed import (  # noqa: E402
    CALCULATOR_DESCRIPTION,
    CALCULATOR_NAME,
    REACT_SYSTEM_HEADER,
    calculator,
    testbed,
)
from llamaindex_ensemble import EnsembleLLM  # noqa: E402


def make_agent(llm: EnsembleLLM, compact: bool = True) -> ReActAgent:
    """`compact`: the ReAct header the tiny models were trained on; otherwise LlamaIndex's."""
    tool = FunctionTool.from_defaults(
        fn=calculator, name=CALCULATOR_NAME, description=CALCULATOR_DESCRIPTION
    )
    if compact:
        formatter = ReActChatFormatter.from_defaults(system_header=REACT_SYSTEM_HEADER)
    else:
        formatter = ReActChatFormatter.from_defaults()
    return ReActAgent(tools=[tool], llm=llm, formatter=formatter)


def real_question(index: int):
    """The `index`-th calculator question of the real task's tool form (seed 1)."""
    problems = testbed(real=True).problems(7 * (index + 1), 1, "tool")
    return [p for p in problems if p.kind == "calculator"][index]


async def solve(agent: ReActAgent, question: str, echo: bool = True) -> tuple[str, list]:
    """Run the agent on one question: (final answer, [(tool kwargs, tool output), ...])."""
    handler = agent.run(user_msg=question)
    calls = []
    async for event in handler.stream_events():
        if isinstance(event, AgentStream) and echo:
            print(event.delta, end="", flush=True)
        elif isinstance(event, ToolCallResult):
            calls.append((event.tool_kwargs, event.tool_output.content))
            if echo:
                print(f"\n  -> {event.tool_name}({event.tool_kwargs}) = {event.tool_output}")
    response = await handler
    return str(response).strip(), calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--problem", type=int, default=0, help="which held-out problem to ask")
    parser.add_argument("--question", help="ask this instead of a testbed problem")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--real", action="store_true", help="the real pair (the real extra), a real question"
    )
    args = parser.parse_args()
    bed = testbed(args.real)
    llm = EnsembleLLM(models=bed.members(), method=args.method, device=args.device)
    if args.real:
        problem = real_question(args.problem)
    else:
        problem = bed.problems(args.problem + 1, 1, "react")[args.problem]
    question = args.question or problem.question
    print(f"{llm.metadata.model_name}\nquestion: {question}")
    answer, calls = await solve(make_agent(llm, compact=not args.real), question)
    print(f"\nanswer: {answer} ({len(calls)} tool calls)")
    if not args.question:
        print(f"expected {problem.answer}: {'right' if bed.right(answer, problem) else 'wrong'}")


if __name__ == "__main__":
    asyncio.run(main())
