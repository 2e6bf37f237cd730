"""Replays answer-vote rules on the scores `answers_and_scores.py` wrote: how many problems each
rule answers right (the first K members; duplicate answers counted once).

    python lab/results/tuning-rerank-vote/rules.py votes-real-rag.json.gz [K]
    python lab/results/tuning-rerank-vote/rules.py votes-real-rag.json.gz 2 --scales

`--scales`: the second member's log-probs scaled by a factor before its softmax (mean, min and
sum of an answer's token log-probs), for the balance of two judges' voices (results.md).
"""

import gzip
import json
import sys

import numpy as np


def softmax(x) -> np.ndarray:
    x = np.array(x, dtype=float)
    e = np.exp(x - x.max())
    return e / e.sum()


# Each rule: scores[judge][answer] (token log-probs) and each judge's own answer -> totals.
def mean_softmax(scores, own):
    return sum(softmax([np.mean(t) for t in row]) for row in scores)


def min_softmax(scores, own):
    return sum(softmax([min(t) for t in row]) for row in scores)


def sum_softmax(scores, own):
    return sum(softmax([sum(t) for t in row]) for row in scores)


def sum_mixture(scores, own):
    return np.logaddexp.reduce([[sum(t) for t in row] for row in scores], axis=0)


def _cross(scores, own, score):
    """Only the other judges, each relative to its own answer."""
    totals = np.zeros(len(scores[0]))
    for j, row in enumerate(scores):
        for c, tokens in enumerate(row):
            if c != own[j]:
                totals[c] += score(tokens) - score(row[own[j]])
    return totals


def cross_mean(scores, own):
    return _cross(scores, own, np.mean)


def cross_min(scores, own):
    return _cross(scores, own, min)


def cross_sum(scores, own):
    return _cross(scores, own, sum)


RULES = [mean_softmax, min_softmax, sum_softmax, sum_mixture, cross_mean, cross_min, cross_sum]


def strip_shared(scores):
    """Per judge, the leading tokens every answer shares (equal values) left out."""
    out = []
    for row in scores:
        k = 0
        while all(len(t) > k + 1 for t in row) and np.ptp([t[k] for t in row]) < 1e-3:
            k += 1
        out.append([t[k:] for t in row])
    return out


def right(data, rule, members, stripped=False) -> int:
    count = 0
    for problem in data:
        answers = problem["answers"][:members]
        first = {}
        for i, answer in enumerate(answers):
            first.setdefault(answer[0], i)
        keep = sorted(set(first.values()))
        if len(keep) == 1:
            count += answers[0][2]
            continue
        distinct = [answers[i] for i in keep]
        column = {a[0]: c for c, a in enumerate(distinct)}
        scores = [[problem["scores"][j][i] for i in keep] for j in range(len(answers))]
        scores = strip_shared(scores) if stripped else scores
        own = [column[answers[j][0]] for j in range(len(answers))]
        count += distinct[int(np.argmax(rule(scores, own)))][2]
    return count


def scaled(scale: float, score):
    """Each judge's softmax over the answers' scores, the second judge's scores times `scale`."""

    def rule(scores, own):
        return sum(
            softmax([(scale if j == 1 else 1.0) * score(t) for t in row])
            for j, row in enumerate(scores)
        )

    return rule


SCALES = (0.5, 1, 1.5, 2, 3, 5, 10)


def main(path: str, members: int | None, scales: bool = False) -> None:
    with gzip.open(path) if path.endswith(".gz") else open(path) as file:
        data = json.load(file)
    alone = [
        sum(p["answers"][i][2] for p in data) for i in range(len(data[0]["answers"][:members]))
    ]
    ceiling = sum(any(a[2] for a in p["answers"][:members]) for p in data)
    print(f"members alone {alone}, ceiling {ceiling}, of {len(data)}")
    if scales:
        for name, score in (("mean", np.mean), ("min", min), ("sum", sum)):
            counts = [right(data, scaled(scale, score), members) for scale in SCALES]
            print(
                f"{name:5s}", "  ".join(f"x{a}: {c}" for a, c in zip(SCALES, counts, strict=True))
            )
        return
    for rule in RULES:
        plain, stripped = right(data, rule, members), right(data, rule, members, stripped=True)
        print(f"{rule.__name__:14s} {plain:4d}   shared first tokens left out: {stripped}")


if __name__ == "__main__":
    members = int(sys.argv[2]) if len(sys.argv) > 2 else None
    main(sys.argv[1], members, "--scales" in sys.argv[3:])
