"""Rerank with the second member's log-probs scaled by a factor before each judge's softmax:
can any one scale of the two judges' voices bring the vote to the best member on both real
forms? (Run from this folder: python judge_scale.py.)"""

import gzip
import json
import sys

import numpy as np

sys.path.insert(0, ".")
from rules import right, softmax  # noqa: E402


def make(alpha, agg):
    def rule(scores, own):
        tot = 0
        for j, row in enumerate(scores):
            a = alpha if j == 1 else 1.0
            tot = tot + softmax([a * agg(t) for t in row])
        return tot

    return rule


for f in ("votes-real-rag.json.gz", "votes-real-qa.json.gz"):
    with gzip.open(f) as file:
        data = json.load(file)
    for aggn, agg in (("mean", np.mean), ("min", min), ("sum", sum)):
        print(f, aggn, [(a, right(data, make(a, agg), 2)) for a in (0.5, 1, 1.5, 2, 3, 5, 10)])
