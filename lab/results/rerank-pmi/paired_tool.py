"""Paired differences of right final answers on the same tool problems: rerank with
`score="pmi"` against rerank's default and against the best member alone, with the grammar and
with the prompt only. Run from the repository root:

    PYTHONPATH=. python lab/results/rerank-pmi/paired_tool.py
"""

from __future__ import annotations

import json
from pathlib import Path

from lab.bench.headroom import paired as paired_counts

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
    """`other` against `base` on the same problems (the headroom table's paired difference)."""
    order = [p["problem"] for p in base]
    right = {p["problem"]: bool(p[key]) for p in other}
    got = paired_counts([right[k] for k in order], [bool(p[key]) for p in base])
    return (f"{100 * got['difference']:+.1f} ± {100 * got['standard_error']:.1f} "
            f"(won {got['won']}, lost {got['lost']})")  # fmt: skip


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
