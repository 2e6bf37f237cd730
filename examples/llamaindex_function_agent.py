"""A LlamaIndex FunctionAgent on an ensemble of the shipped tiny models, or with `--real` of the
real pair (SmolLM2-135M-Instruct and Gemma-3-270M base, the `real` extra), measured on held-out
tool-use problems against each member alone.

    python examples/llamaindex_function_agent.py              # 20 held-out problems, one trace
    python examples/llamaindex_function_agent.py --n 50 --method specem
    python examples/llamaindex_function_agent.py --real --n 14  # the real task's tool problems

Runs offline on CPU. `EnsembleLLM` is a `FunctionCallingLLM`: the agent sends the tools with
every turn (`astream_chat_with_tools`), the ensemble's grammar keeps each call well formed, the
calls come back as `ToolCallBlock`s, and the results go back as `tool` messages until the agent
answers. Each problem offers its own tools (the testbed's, as `FunctionTool`s with the
descriptions the tiny models were trained on); problems that ask for a JSON answer are left out
(a FunctionAgent's structured output is a separate call the models were not trained for).
Right tool: the first call is the one the question needs (or no call where none of the offered
tools fits); right arguments: that call's arguments too; right answer: the agent's final
answer. One question's answer is luck either way (these models copy numbers poorly), so the
example measures many.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from llama_index.core.agent.workflow import (  # noqa: E402
    AgentStream,
    FunctionAgent,
    ToolCallResult,
)
from llama_index.core.tools import FunctionTool  # noqa: E402

from core import Ensemble  # noqa: E402
from core.methods import DEFAULT_METHOD  # noqa: E402
from core.testbed import TOOL_FUNCTIONS, TOOL_SPECS, Problem, Testbed, testbed  # noqa: E402
from llamaindex_ensemble import EnsembleLLM  # noqa: E402

TOOLS = {
    name: FunctionTool.from_defaults(
        fn=fn, name=name, description=TOOL_SPECS[name]["function"]["description"]
    )
    for name, fn in TOOL_FUNCTIONS.items()
}
TINY = testbed()


def make_agent(llm: EnsembleLLM, problem: Problem) -> FunctionAgent:
    tools = [TOOLS[spec["function"]["name"]] for spec in problem.tools]
    return FunctionAgent(tools=tools, llm=llm)


async def solve(agent: FunctionAgent, question: str, echo: bool = False) -> tuple[str, list, bool]:
    """Run the agent on one question: (final answer, [(tool name, kwargs, output), ...], whether
    the final answer stopped at the token limit)."""
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
    cut = (getattr(response, "raw", None) or {}).get("finish_reason") == "length"
    return str(response).strip(), calls, cut


def grade(
    answer: str, calls: list, problem: Problem, bed: Testbed = TINY, cut: bool = False
) -> tuple[bool, bool, bool]:
    """(right tool, right arguments, right answer) for one finished run, by the checkers of the
    problem's testbed (`cut`: the final answer stopped at the token limit)."""
    first = calls[0] if calls else None
    if problem.expected_call is None:
        tool_right = args_right = first is None
    else:
        tool_right = first is not None and first[0] == problem.expected_call[0]
        args_right = first is not None and bed.right_call(first[0], first[1], problem)
    return tool_right, args_right, bed.right(answer, problem, cut)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default=DEFAULT_METHOD, help="the ensemble's method")
    parser.add_argument("--n", type=int, default=20, help="held-out tool problems")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", type=int, default=1, help="problems whose trace is printed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--real", action="store_true", help="the real pair (the real extra) and the real task"
    )
    args = parser.parse_args()
    bed = testbed(args.real)
    ensemble = Ensemble.from_pretrained(bed.members(), method=args.method, device=args.device)
    configs = {
        f"{member.name} alone": EnsembleLLM(
            ensemble=Ensemble([member], "single"), max_new_tokens=64
        )
        for member in ensemble.members
    }
    label = f"ensemble ({args.method})"
    configs[label] = EnsembleLLM(ensemble=ensemble, max_new_tokens=64)
    problems = [
        p for p in bed.problems(args.n, seed=args.seed, form="tool") if p.response_format is None
    ]
    totals = {name: [0, 0, 0] for name in configs}
    for i, problem in enumerate(problems):
        for name, llm in configs.items():
            echo = i < args.trace and name == label
            if echo:
                print(f"question: {problem.question}  (answer {problem.answer})")
            answer, calls, cut = await solve(make_agent(llm, problem), problem.question, echo)
            if echo:
                print(f"\nanswer: {answer!r}\n")
            for k, right in enumerate(grade(answer, calls, problem, bed, cut)):
                totals[name][k] += right
    n = len(problems)
    print(f"{n} held-out tool problems (of {args.n}, seed {args.seed}; JSON ones left out):")
    print(f"  {'configuration':28s} right tool  right arguments  right answer")
    for name, (tools, arguments, answers) in totals.items():
        print(f"  {name:28s} {tools / n:9.0%} {arguments / n:16.0%} {answers / n:13.0%}")


if __name__ == "__main__":
    asyncio.run(main())
