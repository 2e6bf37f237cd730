"""Replays SpecEM's and rerank's vote with and without a calibrated self-preference on the
answers and scores of `../tuning-rerank-vote/answers_and_scores.py` (each member's own answer,
every member's token log-probs of every answer): how many problems each rule answers right.

Each judge's margin is its score of its own answer less its mean score of the other distinct
answers, in the vote's score (mean token log-prob, or the least likely token's), on the first
CALIBRATION problems of the tuning file where the answers differ (no label read). A rule then
either takes an offset off each judge's own answer before its softmax, or softmaxes each
judge's scores at a temperature. Taken: the temperature of each judge's mean absolute margin
over the least among the judges (`Ensemble.calibrate`'s self-preference).

    python lab/results/self-preference/rules.py TUNING.json.gz [REPORTED.json.gz] [K]
"""

import gzip
import json
import statistics
import sys

import numpy as np

CALIBRATION = 12  # prompts, as the README's calibrated rows use


def reduce(tokens, score):
    return min(tokens) if score == "min" else float(np.mean(tokens))


def margins(problems, k, score, statistic=statistics.mean):
    found = [[] for _ in range(k)]
    for problem in problems:
        texts = [a[0] for a in problem["answers"][:k]]
        if len(set(texts)) < 2:
            continue
        for j in range(k):
            own = reduce(problem["scores"][j][j], score)
            others = {texts[a]: reduce(problem["scores"][j][a], score) for a in range(k)}
            others.pop(texts[j])
            found[j].append(own - np.mean(list(others.values())))
    return [statistic(m) if m else 0.0 for m in found]


def right(problems, k, score, offsets, temperatures):
    count = 0
    for problem in problems:
        texts = [a[0] for a in problem["answers"][:k]]
        totals = np.zeros(k)
        for j in range(k):
            values = np.array([reduce(problem["scores"][j][a], score) for a in range(k)])
            values -= np.array([offsets[j] if texts[a] == texts[j] else 0.0 for a in range(k)])
            e = np.exp((values - values.max()) / temperatures[j])
            totals += e / e.sum()
        # a text written by several members has one column: its best-placed copy counts
        chosen = max(range(k), key=lambda a: (round(totals[a], 12), -a))
        count += bool(problem["answers"][chosen][2])
    return count


def read(path):
    with gzip.open(path, "rt") as file:
        return json.load(file)


def main(paths, k):
    files = [(p, read(p)) for p in paths]
    tuning = files[0][1]
    k = k or len(tuning[0]["answers"])
    calibration = tuning[:CALIBRATION]
    for path, problems in files:
        alone = [sum(bool(p["answers"][j][2]) for p in problems) for j in range(k)]
        ceiling = sum(any(a[2] for a in p["answers"][:k]) for p in problems)
        print(f"{path}: {len(problems)} problems, members alone {alone}, ceiling {ceiling}")
    for score in ("logprob", "min"):
        mean = margins(calibration, k, score)
        median = margins(calibration, k, score, statistics.median)
        spread = margins(calibration, k, score, lambda m: float(np.mean(np.abs(m))))
        print(
            f"\n{score}: margins on {CALIBRATION} tuning prompts, mean "
            f"{[round(float(m), 2) for m in mean]}, median "
            f"{[round(float(m), 2) for m in median]}, mean |margin| "
            f"{[round(float(m), 2) for m in spread]}"
        )
        least = min(spread)
        rules = {
            "no correction (the vote before)": ([0.0] * k, [1.0] * k),
            "offset: excess over the least, mean": ([m - min(mean) for m in mean], [1.0] * k),
            "offset: the whole mean": (mean, [1.0] * k),
            "offset: excess over the least, median": ([m - min(median) for m in median], [1] * k),
            "temperature: mean |margin|": ([0.0] * k, spread),
            "temperature: mean |margin| / least (taken)": ([0.0] * k, [m / least for m in spread]),
        }
        for label, (offsets, temperatures) in rules.items():
            counts = [right(problems, k, score, offsets, temperatures) for _, problems in files]
            print(f"  {label:44s} " + "  ".join(f"{c:4d}" for c in counts))


if __name__ == "__main__":
    args = sys.argv[1:]
    k = int(args.pop()) if args and args[-1].isdigit() else 0
    main(args, k)
