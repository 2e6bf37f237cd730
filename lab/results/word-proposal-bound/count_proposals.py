"""The default SAFE on the real pair's short questions, its word decisions counted: Gemma's
proposals and their forward passes, the decisions that weighed more than one word, and the
wall time. Run from a checkout with and without `skip-proposals.patch` applied (the code on the
import path decides which), alternating:

    PYTHONPATH=<checkout> python lab/results/word-proposal-bound/count_proposals.py 30 texts.json
"""

import collections
import json
import sys
import time

import torch

import core.methods.safe.words as words
from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.hf_member import HFMember
from core.testbed.real_models import real_members
from lab.bench.speed import QUESTIONS

torch.set_num_threads(1)
n, out_path = int(sys.argv[1]), sys.argv[2]
members = [HFMember.load(m, dtype="float32") for m in real_members()]
stats = collections.Counter()
propose, pool = words._propose, words.WordDecision._pool


def counted_propose(member, base, limit, sampler):
    before = member.state.calls
    proposal = propose(member, base, limit, sampler)
    stats[f"propose calls {member.name}"] += member.state.calls - before
    stats[f"proposals {member.name}"] += 1
    return proposal


def counted_pool(request, ms, base, candidates, names):
    stats["pools"] += 1
    before = [m.state.calls for m in ms]
    result = pool(request, ms, base, candidates, names)
    for m, c in zip(ms, before, strict=True):
        stats[f"score calls {m.name}"] += m.state.calls - c
    return result


words._propose = counted_propose
words.WordDecision._pool = staticmethod(counted_pool)
ensemble = Ensemble(members, "safe", prefix_reuse=False, max_concurrency=1)
config = GenerationConfig(max_new_tokens=24)
start, texts = time.perf_counter(), []
for question in QUESTIONS[:n]:
    texts.append(ensemble.generate([{"role": "user", "content": question}], config).text)
print(time.perf_counter() - start, "s")
for key, value in sorted(stats.items()):
    print(key, value)
with open(out_path, "w") as f:
    json.dump(texts, f)
