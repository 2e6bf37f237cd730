"""Structured output from an ensemble of the shipped tiny models (or with `--real` of the real
pair: SmolLM2-135M-Instruct and Gemma-3-270M base, the `real` extra), three ways over one
engine: the core (`response_format=`), LangChain (`with_structured_output`) and LlamaIndex
(`chat(..., response_format=...)`), measured on held-out problems against each member alone.

    python examples/structured_output.py            # 20 held-out problems, then the three ways
    python examples/structured_output.py --n 50 --method specem
    python examples/structured_output.py --real --n 10   # the real task's tool problems

Runs offline on CPU. The answer's JSON schema is a grammar over the shared text: every member's
next-token distribution is masked to what the schema allows, and the keys, quotes and
punctuation the schema forces are written without a model call, so the answer always parses
and validates. The values are the models' own. The tiny models learned JSON answers in one
place only: the final answer of a tool-use problem that asks for it, after the tool's result
(`{"total": 12}`), so that is what the example asks: the problem, the call it needs and its
result, then the answer in the problem's schema. Whether the value is right is up to the models
(they copy numbers poorly), so the example measures many problems.
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

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from llama_index.core.base.llms.types import ChatMessage, ToolCallBlock  # noqa: E402

from core import Ensemble  # noqa: E402
from core.methods import DEFAULT_METHOD  # noqa: E402
from core.testbed import Problem, call_tool, testbed  # noqa: E402
from core.testbed import tool_followup as followup  # noqa: E402
from langchain_ensemble import ChatEnsemble  # noqa: E402
from llamaindex_ensemble import EnsembleLLM  # noqa: E402

CALL_ID = "call_1"


def conversation(problem: Problem) -> tuple[str, dict, str]:
    """The call the problem needs and its result: (tool name, arguments, result)."""
    name, arguments = problem.expected_call
    return name, arguments, call_tool(name, arguments)


def with_core(engine: Ensemble, problem: Problem) -> dict:
    name, arguments, result = conversation(problem)
    messages = [*problem.messages, *followup(CALL_ID, name, arguments, result)]
    out = engine.generate(messages, response_format=problem.response_format, max_new_tokens=32)
    return json.loads(out.text)


def with_langchain(engine: Ensemble, problem: Problem) -> dict:
    name, arguments, result = conversation(problem)
    messages = [
        HumanMessage(problem.question),
        AIMessage("", tool_calls=[{"name": name, "args": arguments, "id": CALL_ID}]),
        ToolMessage(result, tool_call_id=CALL_ID, name=name),
    ]
    chat = ChatEnsemble.from_ensemble(engine, max_tokens=32)
    return chat.with_structured_output(problem.response_format).invoke(messages)


def with_llamaindex(engine: Ensemble, problem: Problem) -> dict:
    name, arguments, result = conversation(problem)
    call = ToolCallBlock(tool_call_id=CALL_ID, tool_name=name, tool_kwargs=arguments)
    messages = [
        ChatMessage(role="user", content=problem.question),
        ChatMessage(role="assistant", blocks=[call]),
        ChatMessage(role="tool", content=result, additional_kwargs={"tool_call_id": CALL_ID}),
    ]
    llm = EnsembleLLM(ensemble=engine, max_new_tokens=32)
    response = llm.chat(messages, response_format=problem.response_format)
    return json.loads(response.message.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default=DEFAULT_METHOD, help="the ensemble's method")
    parser.add_argument("--n", type=int, default=20, help="held-out problems that ask for JSON")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--real", action="store_true", help="the real pair (the real extra) and the real task"
    )
    args = parser.parse_args()
    bed = testbed(args.real)
    engine = Ensemble.from_pretrained(bed.members(), method=args.method, device="cpu")
    configs = {f"{m.name} alone": Ensemble([m], "single") for m in engine.members}
    label = f"ensemble ({args.method})"
    configs[label] = engine
    pool = bed.problems(10 * args.n, seed=args.seed, form="tool")
    problems = [p for p in pool if p.response_format is not None][: args.n]  # JSON answers
    print(f"{args.n} held-out tool problems that ask for a JSON answer (seed {args.seed}):")
    for name, ensemble in configs.items():
        right = sum(bed.right(json.dumps(with_core(ensemble, p)), p) for p in problems)
        print(f"  {name:28s} {right / len(problems):5.0%} right")
    engine.learn_weights = False  # what it learned stays put: the three ways see the same weights
    problem = problems[0]
    print(f"\n{problem.question}  (answer {problem.answer}; schema {problem.response_format})")
    ways = {"core": with_core, "langchain": with_langchain, "llamaindex": with_llamaindex}
    for way, run in ways.items():
        print(f"  {way:10} {run(engine, problem)!r}")


if __name__ == "__main__":
    main()
