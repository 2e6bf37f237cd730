"""Accuracy split by where the relevant passage sits in a headroom run's real `rag` prompts.

The real task's retrieval prompts hold the relevant passage and one distractor in a shuffled
order; LlamaIndex's query engine sends the retriever's best passage first. This reads a
`python -m lab bench --headroom --task real --form rag` results file and prints, per row, the
problems answered right where the relevant passage came first and where it came last.

    python lab/results/tuning-rag-order/positions.py RESULTS.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from core.testbed import testbed


def relevant_first(problem) -> bool:
    context = problem.messages[-1]["content"].split("---------------------\n")[1]
    return context.startswith(problem.relevant_passage)


def main(path: str) -> None:
    result = json.loads(Path(path).read_text())
    problems = testbed(True).problems(result["problems"], result["seed"], "rag")
    first = [relevant_first(p) for p in problems]
    print(f"{path}: seed {result['seed']}, relevant passage first in {sum(first)} of {len(first)}")
    for label, rows in result["per_problem"].items():
        right = [r["correct"] for r in rows]
        a = sum(r for r, f in zip(right, first, strict=True) if f)
        b = sum(r for r, f in zip(right, first, strict=True) if not f)
        print(f"  {label}: first {a}/{sum(first)}, last {b}/{len(first) - sum(first)}")


if __name__ == "__main__":
    main(sys.argv[1])
