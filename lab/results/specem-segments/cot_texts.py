"""Each configuration's text and verdict on the shipped members' chain-of-thought problems of a
seed (greedy, 128 new tokens, 1 torch thread), written to a JSON file.

    PYTHONPATH=. python lab/results/specem-segments/cot_texts.py 200 2 OUT.json \
      '{"specem": ["specem", {}], "specem L4": ["specem", {"segment_tokens": 4}]}' [4]

The last argument: which of the loaded members, by index (0 tb-gpt2-bpe, 1 tb-qwen2-spm,
2 tb-llama-word, 3 the weak tb-gpt2-early), e.g. 0,2; a single number n: the first n (3, the
shipped three, by default).
"""

import json
import sys

import torch

from core import Ensemble
from core.config import GenerationConfig
from lab.bench.setups import load_members, load_task

torch.set_num_threads(1)
n, seed, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
configs = json.loads(sys.argv[4])  # label -> [method, options]
chosen = sys.argv[5] if len(sys.argv) > 5 else "3"
loaded = load_members(None)
indices = [int(i) for i in chosen.split(",")] if "," in chosen else range(int(chosen))
members = [loaded[i] for i in indices]
task = load_task("arithmetic", n, seed)
config = GenerationConfig(max_new_tokens=128)
results = {}
for label, (method, options) in configs.items():
    ens = Ensemble(members, method, **options)
    rows = []
    for messages, check in task.items:
        text = ens.generate(messages, config).text
        rows.append({"text": text, "right": bool(check(text))})
    results[label] = rows
    print(label, sum(r["right"] for r in rows), "/", n, flush=True)
with open(out, "w") as file:
    json.dump(results, file)
