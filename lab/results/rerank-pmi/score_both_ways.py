"""Each real member's greedy answer to the real task's problems, and every member's token
log-probs of every answer after the request and after an empty user turn: what rerank's votes
read, by log-probs and by score="pmi". The tuning seed's data (`tuning-seed-2/`) came from

    PYTHONPATH=<checkout> python lab/results/rerank-pmi/score_both_ways.py rag 40 2 rag.json
    PYTHONPATH=<checkout> python lab/results/rerank-pmi/score_both_ways.py qa 40 2 qa.json
"""

import json
import sys

import torch

from core.config import GenerationConfig
from core.hf_member import HFMember
from core.methods.pmi import EMPTY_REQUEST
from core.sampling import Sampler
from core.testbed.real_models import real_members
from lab.bench.setups import load_task

torch.set_num_threads(2)
form, n, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
members = [HFMember.load(m, dtype="float32") for m in real_members()]
greedy = Sampler(GenerationConfig())
rows = []
for messages, right in load_task("real", n, seed, form).items:
    answers = []
    for member in members:
        view = member.spawn()
        view.start(messages)
        draft = view.draft(48, greedy)
        answers.append((view.text, draft.stopped))
    texts, ends = [a[0] for a in answers], [a[1] for a in answers]
    cond, prior = [], []
    for member in members:
        view = member.spawn()
        view.start(messages)
        cond.append([t.double().tolist() for t in view.score(texts, ends=ends)])
        empty = member.spawn()
        empty.start(EMPTY_REQUEST)
        prior.append([t.double().tolist() for t in empty.score(texts, ends=ends)])
    right_ones = [right(t, cut=not e) for t, e in zip(texts, ends, strict=True)]
    rows.append({"texts": texts, "ends": ends, "right": right_ones, "cond": cond, "uncond": prior})
    print(len(rows), right_ones, flush=True)
with open(out, "w") as f:
    json.dump(rows, f)
