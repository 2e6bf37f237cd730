"""How many prompt tokens each member computes per turn of a conversation, with prefix reuse on
(the default) and off, on the shipped models.

A conversation resends its history every turn; with prefix reuse a member computes only the
tokens past the longest prefix a finished request left in its pool. Each turn asks the next
held-out problem after the previous answers; both settings run the same turns, greedy, and must
write the same texts. Counts, not times: the numbers do not depend on the machine.

    python -m lab.bench.prefix_reuse [--turns 5] [--method safe] [--out lab/results/prefix-reuse]
"""

from __future__ import annotations

import argparse
import shlex
import sys

from core import Ensemble, GenerationConfig
from core.testbed import make_problems, model_paths

from .report import write_results


def conversation(ensemble: Ensemble, questions: list[str], config: GenerationConfig) -> list:
    """One turn per question, each after the whole history; per turn: the text, and per member
    its prompt tokens and the prompt tokens it computed."""
    messages, turns = [], []
    for question in questions:
        messages.append({"role": "user", "content": question})
        out = ensemble.generate(messages, config)
        messages.append({"role": "assistant", "content": out.text})
        turns.append(
            {
                "text": out.text,
                "prompt_tokens": dict(out.stats.prompt_tokens),
                "computed": dict(out.stats.prefilled),
            }
        )
    return turns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--method", default="safe")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", default="lab/results/prefix-reuse")
    args = parser.parse_args()
    questions = [p.messages[-1]["content"] for p in make_problems(args.turns, seed=1)]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    runs = {}
    for reuse in (True, False):  # a fresh ensemble each, so neither finds the other's prefixes
        ensemble = Ensemble.from_pretrained(
            model_paths(), args.method, device="cpu", prefix_reuse=reuse
        )
        runs["on" if reuse else "off"] = conversation(ensemble, questions, config)
    same = [a["text"] == b["text"] for a, b in zip(runs["on"], runs["off"], strict=True)]
    names = list(runs["on"][0]["prompt_tokens"])
    lines = [
        "| turn | prompt tokens | computed, prefix reuse on | computed, off | same text |",
        "|---|---|---|---|---|",
    ]
    for turn, (on, off, equal) in enumerate(zip(runs["on"], runs["off"], same, strict=True), 1):
        row = [", ".join(str(t["computed"][name]) for name in names) for t in (on, off)]
        prompt = ", ".join(str(on["prompt_tokens"][name]) for name in names)
        lines.append(f"| {turn} | {prompt} | {row[0]} | {row[1]} | {'yes' if equal else 'NO'} |")
    table = (
        f"A {args.turns}-turn {args.method} conversation on the shipped models ({', '.join(names)}"
        f"; numbers per member in that order), greedy, max_new_tokens={args.max_new_tokens}.\n\n"
        + "\n".join(lines)
        + "\n"
    )
    command = "python " + shlex.join(["-m", "lab.bench.prefix_reuse", *sys.argv[1:]])
    result = {"command": command, "method": args.method, "members": names, "runs": runs}
    write_results(args.out, result, table)
    print(table)


if __name__ == "__main__":
    main()
