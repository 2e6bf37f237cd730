"""The default SAFE's texts and right answers on the shipped testbed's problems of one form and
seed, for comparing two engines' texts problem by problem (the tuning record of this folder).

    python lab/results/tuning-word-pooling/texts.py cot 200 2 OUT.json [weak]
"""

import json
import sys

import torch

from core import Ensemble, GenerationConfig
from core.testbed import model_paths, testbed

torch.set_num_threads(1)
form, n, seed, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bed = testbed(False)
ensemble = Ensemble.from_pretrained(model_paths(weak=len(sys.argv) > 5), method="safe")
texts = []
for i, problem in enumerate(bed.problems(n, seed, form)):
    config = GenerationConfig(max_new_tokens=128, seed=seed + i)
    output = ensemble.generate(problem.messages, config)
    right = bed.right(output.text, problem, output.finish_reason == "length")
    texts.append([output.text, bool(right)])
with open(out, "w") as file:
    json.dump(texts, file)
print(sum(t[1] for t in texts), len(texts))
