"""Each member's self-preference as SpecEM's votes show it: SpecEM at its defaults answers the
built-in calibration prompts (64 tokens), and in every round with more than one candidate each
judge's mean token log-prob of its own segment is compared with its mean over the others'
(the mean absolute difference, as `Ensemble.calibrate` measures it over whole answers).

    python lab/results/self-preference-segments/segment_margins.py real|shipped|weak
("weak": the shipped three and tb-gpt2-early)
"""

import statistics
import sys

import torch

import core.methods.specem as specem
from core.calibration import CALIBRATION_PROMPTS, reduced
from core.ensemble import Ensemble
from core.events import SegmentCandidates
from lab.bench.setups import default_models, load_members

judged = []  # per verifying call, in order: (judge, the candidates, its mean token log-probs)
member_shares = specem.member_shares


def recording_member_shares(member, texts, ends, *args, **kwargs):
    values = member.score(texts, base=args[2], ends=ends)  # args: score, raw_prompt, base, ...
    judged.append((member.name, list(texts), [reduced(v, "logprob") for v in values]))
    return member_shares(member, texts, ends, *args, **kwargs)


def main(which: str) -> None:
    torch.set_num_threads(1)
    specem.member_shares = recording_member_shares
    models = default_models("real" if which == "real" else "arithmetic")
    if which == "weak":
        models.append(models[0].replace("tb-gpt2-bpe", "tb-gpt2-early"))
    members = load_members(models)
    ensemble = Ensemble(members, "specem")
    margins = {m.name: [] for m in members}
    for prompt in CALIBRATION_PROMPTS:
        start = len(judged)
        out = ensemble.generate([{"role": "user", "content": prompt}], max_new_tokens=64)
        calls = iter(judged[start:])
        for event in out.events:  # each round with two or more texts: one call per member
            if not isinstance(event, SegmentCandidates) or len(set(event.candidates.values())) < 2:
                continue
            for _ in members:
                judge, texts, scores = next(calls)
                mine = event.candidates.get(judge)
                if mine in texts:
                    own = texts.index(mine)
                    others = [s for c, s in enumerate(scores) if c != own]
                    margins[judge].append(abs(scores[own] - sum(others) / len(others)))
    means = {name: statistics.mean(m) for name, m in margins.items()}
    least = min(means.values())
    for name, m in margins.items():
        print(
            f"{name}: {len(m)} rounds, mean |margin| {means[name]:.3f}, "
            f"median {statistics.median(m):.3f}, temperature {means[name] / least:.3f}"
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
