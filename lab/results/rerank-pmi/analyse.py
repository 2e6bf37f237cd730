"""Rerank's pick on each problem of `score_both_ways.py`'s data, by each vote: each member's
softmax over the two answers of its mean token log-prob ("logprob", the default), of its least
likely token ("min"), or of mean log-prob after the request minus lam times mean log-prob after
an empty turn ("pmi" is lam = 1), equal weights, ties to the first member (as rerank breaks
them). Prints each member's accuracy, the ceiling and each vote's accuracy.

    python lab/results/rerank-pmi/analyse.py lab/results/rerank-pmi/tuning-seed-2/rag.json
"""

import json
import sys

import torch

with open(sys.argv[1]) as f:
    rows = json.load(f)


def accuracy(pick) -> float:
    return 100 * sum(r["right"][pick(r)] for r in rows) / len(rows)


def vote(score):
    def pick(r) -> int:
        if r["texts"][0] == r["texts"][1]:
            return 0
        total = torch.zeros(2, dtype=torch.float64)
        for m in range(len(r["cond"])):
            values = torch.tensor([score(r, m, c) for c in range(2)], dtype=torch.float64)
            total += torch.softmax(values, 0) / len(r["cond"])
        return 0 if total[0] >= total[1] else 1

    return pick


def mean(x) -> float:
    return sum(x) / len(x) if x else -1e30


print(f"member 0 {accuracy(lambda r: 0):.1f}  member 1 {accuracy(lambda r: 1):.1f}  ceiling "
      f"{100 * sum(any(r['right']) for r in rows) / len(rows):.1f}")  # fmt: skip
print(f"logprob {accuracy(vote(lambda r, m, c: mean(r['cond'][m][c]))):.1f}")
print(f"min {accuracy(vote(lambda r, m, c: min(r['cond'][m][c]))):.1f}")
for lam in (0.5, 1.0, 1.5):
    gain = vote(lambda r, m, c, lam=lam: mean(r["cond"][m][c]) - lam * mean(r["uncond"][m][c]))
    print(f"pmi, lam {lam} {accuracy(gain):.1f}")
