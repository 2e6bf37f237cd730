"""A LangChain agent (`langchain.agents.create_agent`) on an ensemble of the shipped tiny models,
or with `--real` of the real pair (SmolLM2-135M-Instruct and Gemma-3-270M base, the `real`
extra), measured on held-out tool-use problems against each member alone.

    python examples/langchain_agent.py              # 20 held-out problems, then one trace
    python examples/langchain_agent.py --n 50 --trace 3
    python examples/langchain_agent.py --method specem
    python examples/langchain_agent.py --real --n 14  # the real task's tool problems

Runs offline on CPU (needs `pip install "llm-ensembling[langchain]"`, which brings `langchain`).
Each problem offers its own tools (the testbed's `add`, `subtract`, `multiply`, `calculator`,
`get_price`, `get_stock`, bound as LangChain tools: exactly what the tiny models were trained
on) and, where it asks for one, a JSON answer schema, which `create_agent` sends as a
`response_format` next to the tools (`ChatEnsemble`'s profile says it supports structured
output). The ensemble's grammar allows tool calls or the JSON answer each turn; the agent loops
until the answer comes. Right tool: the first call is the one the question needs (or no call
where none of the offered tools fits); right arguments: that call's arguments too; right
answer: the agent's final answer. One question's answer is luck either way (these models copy
numbers poorly), so the example measures many.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout

from langchain.agents import create_agent  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402

from core import Ensemble  # noqa: E402
from core.methods import DEFAULT_METHOD  # noqa: E402
from core.testbed import TOOL_FUNCTIONS, Problem, Testbed, testbed  # noqa: E402
from langchain_ensemble import ChatEnsemble  # noqa: E402

TOOLS = {name: tool(fn) for name, fn in TOOL_FUNCTIONS.items()}
TINY = testbed()


def make_agent(chat: ChatEnsemble, problem: Problem):
    """An agent with the problem's tools and, where it asks for JSON, its answer schema."""
    tools = [TOOLS[spec["function"]["name"]] for spec in problem.tools]
    return create_agent(chat, tools=tools, response_format=problem.response_format)


def run(agent, problem: Problem, recursion_limit: int = 8) -> dict:
    """The agent's final state: its messages (and `structured_response` where JSON was asked)."""
    inputs = {"messages": list(problem.messages)}
    return agent.invoke(inputs, {"recursion_limit": recursion_limit})


def grade(state: dict, problem: Problem, bed: Testbed = TINY) -> tuple[bool, bool, bool]:
    """(right tool, right arguments, right answer) for one finished run, by the checkers of the
    problem's testbed (a real final answer cut by the token limit keeps its last word unread)."""
    messages = state["messages"][len(problem.messages) :]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    first = calls[0] if calls else None
    if problem.expected_call is None:
        tool_right = args_right = first is None
    else:
        tool_right = first is not None and first["name"] == problem.expected_call[0]
        args_right = first is not None and bed.right_call(first["name"], first["args"], problem)
    last = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    cut = last is not None and last.response_metadata.get("finish_reason") == "length"
    if problem.response_format is not None:
        answer = json.dumps(state.get("structured_response"))
    else:
        answer = last.content if last is not None else ""
    return tool_right, args_right, bed.right(str(answer), problem, cut)


def show(state: dict, problem: Problem) -> None:
    print(f"question: {problem.question}  (answer {problem.answer})")
    for message in state["messages"][len(problem.messages) :]:
        if isinstance(message, AIMessage) and message.tool_calls:
            for call in message.tool_calls:
                print(f"  call   {call['name']}({call['args']})")
        elif isinstance(message, ToolMessage):
            print(f"  result {message.content}")
        elif isinstance(message, AIMessage):
            print(f"  answer {message.content}")
    if "structured_response" in state:
        print(f"  structured_response: {state['structured_response']!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default=DEFAULT_METHOD, help="the ensemble's method")
    parser.add_argument("--n", type=int, default=20, help="held-out tool problems")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--trace", type=int, default=1, help="problems whose trace is printed")
    parser.add_argument(
        "--real", action="store_true", help="the real pair (the real extra) and the real task"
    )
    args = parser.parse_args()
    bed = testbed(args.real)
    ensemble = Ensemble.from_pretrained(bed.members(), method=args.method, device="cpu")
    configs = {f"{m.name} alone": ChatEnsemble.from_ensemble(Ensemble([m], "single"),
                                                             max_tokens=96)
               for m in ensemble.members}  # fmt: skip
    label = f"ensemble ({args.method})"
    configs[label] = ChatEnsemble.from_ensemble(ensemble, max_tokens=96)
    problems = bed.problems(args.n, seed=args.seed, form="tool")
    totals = {name: [0, 0, 0] for name in configs}
    for i, problem in enumerate(problems):
        for name, chat in configs.items():
            state = run(make_agent(chat, problem), problem)
            for k, right in enumerate(grade(state, problem, bed)):
                totals[name][k] += right
            if i < args.trace and name == label:
                show(state, problem)
    print(f"\n{args.n} held-out tool problems (seed {args.seed}), through create_agent:")
    print(f"  {'configuration':28s} right tool  right arguments  right answer")
    for name, (tools, arguments, answers) in totals.items():
        n = len(problems)
        print(f"  {name:28s} {tools / n:9.0%} {arguments / n:16.0%} {answers / n:13.0%}")


if __name__ == "__main__":
    main()
