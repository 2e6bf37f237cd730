"""The default SAFE on the real pair's short questions, with and without
`skip-proposals.patch` applied (the code on the import path decides which), alternating: the
wall time, each member's forward passes, the word decisions and how many weighed more than one
word, and the texts (to compare the two runs).

    PYTHONPATH=<checkout> python lab/results/word-proposal-bound/count_proposals.py 30 texts.json

`ab-log.txt` was written by this measurement with the two internal steps of a word decision
(a member's proposal, the pooled scoring) wrapped to count their passes apart; the public
counts printed here are the same runs' totals.
"""

import collections
import json
import sys
import time

import torch

from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.events import EnsemblePoint
from core.hf_member import HFMember
from core.testbed.real_models import real_members
from lab.bench.speed import QUESTIONS

torch.set_num_threads(1)
n, out_path = int(sys.argv[1]), sys.argv[2]
members = [HFMember.load(m, dtype="float32") for m in real_members()]
ensemble = Ensemble(members, "safe", prefix_reuse=False, max_concurrency=1)
config = GenerationConfig(max_new_tokens=24)
counts: collections.Counter = collections.Counter()
start, texts = time.perf_counter(), []
for question in QUESTIONS[:n]:
    out = ensemble.generate([{"role": "user", "content": question}], config)
    texts.append(out.text)
    counts.update({f"passes {name}": calls for name, calls in out.stats.member_calls.items()})
    points = [e for e in out.events if isinstance(e, EnsemblePoint)]
    counts["word decisions"] += len(points)
    counts["decisions weighing two or more words"] += sum(len(p.top) > 1 for p in points)
print(f"{time.perf_counter() - start:.1f} s")
for key, value in sorted(counts.items()):
    print(key, value)
with open(out_path, "w") as f:
    json.dump(texts, f)
