"""Concurrent requests on the shipped members, with the batcher's pass size capped and its
leader's patience changed: whether two smaller batches, one computing while the other's request
threads run their Python, beat one batch of every request (the engine as it is).

    PYTHONPATH=. python lab/results/concurrency-python-levers/batch_shape.py single 8 2
    PYTHONPATH=. python lab/results/concurrency-python-levers/batch_shape.py safe 8 1

Arguments: the method, how many requests at once, rounds. 64 chain-of-thought problems of
seed 5, 32 new tokens, stop ids ignored, greedy, 1 torch thread; every variant in every round,
tokens per second of the whole set.
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

import core.batching
from core import Ensemble
from core.config import GenerationConfig
from core.testbed import make_problems
from core.testbed.models import model_paths

torch.set_num_threads(1)
method, level, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
VARIANTS = {  # label: (rows per pass at most, patience, patience floor)
    "as it is (32 rows, patience 2)": (32, 2.0, 0.0005),
    "4 rows per pass": (4, 2.0, 0.0005),
    "no patience (the leader runs whoever is queued)": (32, 0.0, 0.0),
    "4 rows, no patience": (4, 0.0, 0.0),
}
ens = Ensemble.from_pretrained([str(p) for p in model_paths()], method=method,
                               prefix_reuse=False, max_concurrency=level)  # fmt: skip
for member in ens.members:
    member.stop_ids = frozenset()
config = GenerationConfig(max_new_tokens=32)
prompts = [p.messages for p in make_problems(64, seed=5)]
for prompt in prompts[:3]:
    ens.generate(prompt, config)
reference = None
for round_ in range(rounds):
    for label, (rows, patience, floor) in VARIANTS.items():
        core.batching._MAX_ROWS, core.batching._PATIENCE = rows, patience
        core.batching._PATIENCE_FLOOR = floor
        start = time.perf_counter()
        with ThreadPoolExecutor(level) as pool:
            outs = list(pool.map(lambda p: ens.generate(p, config), prompts))
        seconds = time.perf_counter() - start
        texts = [o.text for o in outs]
        reference = reference or texts
        same = sum(a == b for a, b in zip(texts, reference, strict=True))
        tokens = sum(o.stats.tokens for o in outs)
        print(f"round {round_ + 1}, {method}, {level} at once, {label}: "
              f"{tokens / seconds:.0f} tokens/s, same texts {same}/{len(texts)}")  # fmt: skip
