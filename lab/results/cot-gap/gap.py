"""Where a chain-of-thought ensemble's missing gap sits: the problems split by how many of the
three shipped members answer right alone, and whether the members that answer wrong agree on
one wrong number.

The gap is the problems the best member (tb-gpt2-bpe, SAFE's drafter) gets wrong and another
member gets right. Averaging members can only be expected to win those where more members
back the right number than any one wrong number; a problem where one member alone is right and
the other two write the same wrong number goes against every vote. The split also counts the
problems the drafter gets right that the ensemble loses.

    python lab/results/cot-gap/gap.py MEMBERS.json LABEL [ENSEMBLE.json [LABEL]]

MEMBERS.json: a `python -m lab bench` results file with the three members alone (and, unless
ENSEMBLE.json is given, the row LABEL). ENSEMBLE.json: a results file holding row LABEL, or a
list of [text, right] pairs in problem order (`../tuning-word-pooling/texts.py`).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from core.testbed import extract_answer

MEMBERS = ("single tb-gpt2-bpe", "single tb-qwen2-spm", "single tb-llama-word")


def rows(path: str, label: str | None) -> list[tuple[str, bool]]:
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        return [(text, bool(right)) for text, right in data]
    return [(r["text"], bool(r["correct"])) for r in data["per_problem"][label]]


OUTSIDE = "right where no member is right alone"


def split(members: list[list[tuple[str, bool]]], ensemble: list[tuple[str, bool]]) -> dict:
    """Problems (and those the ensemble gets right) by kind: in the gap, the drafter's own,
    and outside both."""
    held, right = Counter(), Counter()
    for i, (_, ok) in enumerate(ensemble):
        alone = [m[i][1] for m in members]
        wrong = [extract_answer(m[i][0]) for m in members if not m[i][1]]
        if alone[0]:
            kind = "drafter: alone right" if sum(alone) == 1 else "drafter: right with others"
        elif not any(alone):
            kind = OUTSIDE
        elif sum(alone) == 2:
            kind = "gap: two members right"
        elif wrong[0] is not None and wrong[0] == wrong[1]:
            kind = "gap: one member right, the other two on the same wrong number"
        else:
            kind = "gap: one member right, the other two on different numbers"
        held[kind] += 1
        right[kind] += ok
    return {"held": held, "right": right}


def main(argv: list[str]) -> None:
    members_path, label = argv[0], argv[1]
    ensemble_path = argv[2] if len(argv) > 2 else members_path
    ensemble_label = argv[3] if len(argv) > 3 else label
    members = [rows(members_path, name) for name in MEMBERS]
    result = split(members, rows(ensemble_path, ensemble_label))
    held, right = result["held"], result["right"]
    gap = [k for k in held if k.startswith("gap")]
    won, total = sum(right[k] for k in gap), sum(held[k] for k in gap)
    print(f"{label}: {sum(right.values())} right, {won} of the {total} problems in the gap")
    for kind in sorted(held):
        if kind == OUTSIDE:
            print(f"  {kind}: {right[kind]}")
        else:
            print(f"  {kind}: {right[kind]} of {held[kind]}")


if __name__ == "__main__":
    main(sys.argv[1:])
