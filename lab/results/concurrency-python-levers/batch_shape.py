"""Concurrent requests on the shipped members, with the batcher's pass size capped and its
leader's patience changed (`batch-shape.diff` reads both from the environment): whether two
smaller batches, one computing while the other's request threads run their Python, beat one
batch of every request (the engine as it is).

    git apply lab/results/concurrency-python-levers/batch-shape.diff
    PYTHONPATH=. python lab/results/concurrency-python-levers/batch_shape.py single 8 2
    PYTHONPATH=. python lab/results/concurrency-python-levers/batch_shape.py safe 8 1

Arguments: the method, how many requests at once, rounds. 64 chain-of-thought problems of
seed 5, 32 new tokens, stop ids ignored, greedy, 1 torch thread; every variant in every round,
each in its own process (after 3 untimed requests), tokens per second of the whole set.
"""

import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

VARIANTS = {  # label: the batcher's settings (rows per pass at most, patience, its floor)
    "as it is (32 rows, patience 2)": {},
    "4 rows per pass": {"LAB_MAX_ROWS": "4"},
    "no patience (the leader runs whoever is queued)": {
        "LAB_PATIENCE": "0",
        "LAB_PATIENCE_FLOOR": "0",
    },
    "4 rows, no patience": {"LAB_MAX_ROWS": "4", "LAB_PATIENCE": "0", "LAB_PATIENCE_FLOOR": "0"},
}


def measure(method: str, level: int) -> None:
    """One variant, in this process: tokens/s and a digest of the texts."""
    import torch

    from core import Ensemble
    from core.config import GenerationConfig
    from core.testbed import make_problems
    from lab.bench.setups import load_members

    torch.set_num_threads(1)
    members = load_members(None, ignore_stop=True)  # the shipped three
    ens = Ensemble(members, method, prefix_reuse=False, max_concurrency=level)
    config = GenerationConfig(max_new_tokens=32)
    prompts = [p.messages for p in make_problems(64, seed=5)]
    for prompt in prompts[:3]:
        ens.generate(prompt, config)
    start = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        outs = list(pool.map(lambda p: ens.generate(p, config), prompts))
    seconds = time.perf_counter() - start
    digest = hashlib.sha256("\x00".join(o.text for o in outs).encode()).hexdigest()[:12]
    print(sum(o.stats.tokens for o in outs) / seconds, digest)


def main() -> None:
    method, level, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for round_ in range(rounds):
        for label, settings in VARIANTS.items():
            out = subprocess.run([sys.executable, __file__, "--measure", method, str(level)],
                                 env={**os.environ, **settings}, capture_output=True, text=True,
                                 check=True)  # fmt: skip
            speed, digest = out.stdout.split()[-2:]
            print(f"round {round_ + 1}, {method}, {level} at once, {label}: "
                  f"{float(speed):.0f} tokens/s, texts {digest}")  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "--measure":
        measure(sys.argv[2], int(sys.argv[3]))
    else:
        main()
