"""prompt | ChatEnsemble | StrOutputParser on the shipped tiny models (or with `--real` on the
real pair: SmolLM2-135M-Instruct and Gemma-3-270M base, the `real` extra): the answer streams
in, and what the ensemble does (ensemble points, segment winners, weights) prints as it happens.

    python examples/langchain_chain.py                     # SAFE, a testbed question
    python examples/langchain_chain.py --method specem --question "Tom has 3 pens. ..."
    python examples/langchain_chain.py --real              # a question of the real task
    python examples/langchain_chain.py --model ollama:qwen2.5:0.5b --model ollama:llama3.2:1b \
        --question "What is the capital of Australia?"   # your own members

Runs offline on CPU. `astream_events(version="v2")` gives the chain's text and the ensemble's
custom events (`on_custom_event`, named `ensemble.<event>`) in one stream, in order.
"""

from __future__ import annotations

import argparse
import asyncio
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from langchain_core.output_parsers import StrOutputParser  # noqa: E402
from langchain_core.prompts import ChatPromptTemplate  # noqa: E402

from core.testbed import testbed  # noqa: E402
from langchain_ensemble import ChatEnsemble  # noqa: E402

# The events worth watching; draft and skip events (one per position) are left out.
EVENTS = ["ensemble_point", "segment_selected", "weights_updated", "member_failed"]


def describe(name: str, data: dict) -> str:
    """One short line per ensemble event."""
    event = name.removeprefix("ensemble.")
    if event == "ensemble_point":
        change = f"{data['drafted']!r} -> {data['chosen']!r}"
        kept = "kept" if data["drafted"] == data["chosen"] else "replaced"
        return f"ensembled at token {data['position']}: {change} ({kept})"
    if event == "segment_selected":
        return f"round {data['round']}: {data['winner']} wins with {data['text']!r}"
    if event == "weights_updated":
        weights = ", ".join(f"{k}={v:.2f}" for k, v in data["weights"].items())
        return f"round {data['round']}: weights {weights}"
    return f"{event}: {data}"


async def main(args: argparse.Namespace) -> None:
    bed = testbed(args.real)
    question = args.question or bed.problems(1, seed=3)[0].question  # seed 3: a tuning seed
    chat = ChatEnsemble(
        models=args.model or bed.members(),
        method=args.method,
        max_tokens=args.max_tokens,
        ensemble_events=EVENTS,
    )
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Solve the problem step by step."), ("human", "{question}")]
    )
    chain = prompt | chat | StrOutputParser()
    print(f"{chat.model_name}\nQ: {question}\nA:")
    mid_line = False  # events go on lines of their own, between pieces of the answer
    async for event in chain.astream_events({"question": question}, version="v2"):
        if event["event"] == "on_parser_stream":
            print(event["data"]["chunk"], end="", flush=True)
            mid_line = True
        elif event["event"] == "on_custom_event":
            print("\n" * mid_line + f"  [{describe(event['name'], event['data'])}]", flush=True)
            mid_line = False
        elif event["event"] == "on_chat_model_end":
            output = event["data"]["output"]
            summary = output.response_metadata["ensemble"]
            print(
                f"\n\n{summary['tokens']} tokens, ensembled at {summary['ensembled_tokens']} "
                f"(E/T {summary['ensemble_rate']:.2f}); usage {output.usage_metadata}"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", default="safe", help="safe | specem | token | single")
    parser.add_argument("--question", default=None, help="default: a question of the testbed")
    parser.add_argument(
        "--real", action="store_true", help="the real pair (the real extra), a real question"
    )
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="a member of your own instead of the testbed's (repeat for each): a directory, a "
        ".gguf file, ollama:NAME (a model Ollama pulled) or a hub id",
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    asyncio.run(main(parser.parse_args()))
