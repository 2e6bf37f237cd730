"""Paired differences of right final answers on the same tool problems: rerank with
`score="pmi"` against rerank's default and against the best member alone, with the grammar and
with the prompt only. Run from the repository root:

    python lab/results/rerank-pmi/paired_tool.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE.parent
# (set, the run holding the default rerank and the members, the run holding rerank "pmi",
#  the best member alone)
SETS = [
    ("shipped three, seed 2 (tuning)", "tool-seed-2", "tool-seed-2", "single tb-qwen2-spm"),
    ("shipped three, seed 1", "tool-seed-1", "tool-seed-1", "single tb-qwen2-spm"),
    ("real pair, seed 1", "../real-tool", "real-tool-seed-1", "single smollm2-135m-instruct"),
]


def per_problem(run: str) -> dict:
    return json.loads((HERE / run / "results.json").read_text())["per_problem"]


def paired(base: list[dict], other: list[dict], key: str = "answer_right") -> str:
    a = {p["problem"]: int(p[key]) for p in base}
    b = {p["problem"]: int(p[key]) for p in other}
    d = [b[k] - a[k] for k in a]
    n, mean = len(d), sum(d) / len(d)
    se = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1) / n)
    won, lost = sum(v > 0 for v in d), sum(v < 0 for v in d)
    return f"{100 * mean:+.1f} ± {100 * se:.1f} (won {won}, lost {lost})"


def main() -> None:
    print("| set | mode | pmi against rerank's default | pmi against the best member |")
    print("|---|---|---|---|")
    for name, base_run, pmi_run, best in SETS:
        base, pmi = per_problem(base_run), per_problem(pmi_run)
        for mode in ("grammar", "prompt only"):
            ours = pmi[f"rerank (pmi) / {mode}"]
            print(f"| {name} | {mode} | {paired(base[f'rerank / {mode}'], ours)} | "
                  f"{paired(base[f'{best} / {mode}'], ours)} |")  # fmt: skip


if __name__ == "__main__":
    main()
