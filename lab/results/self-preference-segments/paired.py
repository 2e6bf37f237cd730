"""Paired comparison of two rows of two headroom or accuracy runs on the same problems: each
row's accuracy, the difference with its standard error, and the problems won and lost.

    python lab/results/self-preference-segments/paired.py A.json 'row label' B.json 'row label'
"""

import json
import math
import sys


def answers(path: str, label: str) -> list[bool]:
    with open(path) as file:
        return [bool(r["correct"]) for r in json.load(file)["per_problem"][label]]


def main(path_a: str, label_a: str, path_b: str, label_b: str) -> None:
    a, b = answers(path_a, label_a), answers(path_b, label_b)
    if len(a) != len(b):
        raise SystemExit(f"{len(a)} problems against {len(b)}: not the same problems")
    n = len(a)
    diffs = [int(y) - int(x) for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / n
    spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else 0.0
    won, lost = diffs.count(1), diffs.count(-1)
    print(
        f"{label_a}: {100 * sum(a) / n:.1f} %  ->  {label_b}: {100 * sum(b) / n:.1f} %  "
        f"({100 * mean:+.1f} ± {100 * spread:.1f}, won {won}, lost {lost}, {n} problems)"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
