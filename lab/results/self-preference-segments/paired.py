"""Paired comparison of two rows of two headroom or accuracy runs on the same problems: each
row's accuracy, the difference with its standard error, and the problems won and lost (the
headroom table's own `lab.bench.headroom.paired`).

    python lab/results/self-preference-segments/paired.py A.json 'row label' B.json 'row label'
"""

import json
import sys

from lab.bench.headroom import paired


def answers(path: str, label: str) -> list[bool]:
    with open(path) as file:
        return [bool(r["correct"]) for r in json.load(file)["per_problem"][label]]


def main(path_a: str, label_a: str, path_b: str, label_b: str) -> None:
    a, b = answers(path_a, label_a), answers(path_b, label_b)
    if len(a) != len(b):
        raise SystemExit(f"{len(a)} problems against {len(b)}: not the same problems")
    n, vs = len(a), paired(b, a)
    print(
        f"{label_a}: {100 * sum(a) / n:.1f} %  ->  {label_b}: {100 * sum(b) / n:.1f} %  "
        f"({100 * vs['difference']:+.1f} ± {100 * vs['standard_error']:.1f}, won {vs['won']}, "
        f"lost {vs['lost']}, {n} problems)"
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
