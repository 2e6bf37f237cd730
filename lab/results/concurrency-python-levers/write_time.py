"""CPU time the key/value store spends per forward pass: building a pass's cache and writing
each layer's new keys and values (`KVStore.pass_cache` and the cache's `write`), timed around
each call, on the engine as it is and with `stacked-store.diff` applied (apply it, run again,
compare).

    PYTHONPATH=. python lab/results/concurrency-python-levers/write_time.py shipped safe 12 1
    PYTHONPATH=. python lab/results/concurrency-python-levers/write_time.py shipped single 48 8
    PYTHONPATH=. python lab/results/concurrency-python-levers/write_time.py real safe 6 1

Arguments: the members (shipped three or the real pair), the method, how many problems
(chain-of-thought problems of seed 5; the real task's short questions of seed 5), how many at
once. Greedy, 1 torch thread, stop ids ignored, 32 new tokens (24 on the real pair).
"""

import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from core import Ensemble
from core.config import GenerationConfig
from core.kv import KVStore
from lab.bench.setups import load_members

torch.set_num_threads(1)
which, method, n, level = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spent = {"build": [0, 0.0], "write": [0, 0.0]}


def timed(name, function):
    def run(*args):
        start = time.perf_counter()
        try:
            return function(*args)
        finally:
            spent[name][0] += 1
            spent[name][1] += time.perf_counter() - start

    return run


build = timed("build", KVStore.pass_cache)


def pass_cache(store, *args):
    """A pass's cache built, timed; its class's `write` timed from the first pass on."""
    cache = build(store, *args)
    if not hasattr(type(cache).write, "timed"):
        type(cache).write = timed("write", type(cache).write)
        type(cache).write.timed = True
    return cache


KVStore.pass_cache = pass_cache
if which == "real":
    from core.testbed.real.problems import make_real_problems
    from core.testbed.real_models import real_members

    models, problems, tokens = real_members(), make_real_problems(n, seed=5), 24
else:
    from core.testbed import make_problems

    models, problems, tokens = None, make_problems(n, seed=5), 32  # the shipped three
members = load_members(models, ignore_stop=True)
ens = Ensemble(members, method, prefix_reuse=False, max_concurrency=level)
config = GenerationConfig(max_new_tokens=tokens)
start = time.perf_counter()
with ThreadPoolExecutor(level) as pool:
    texts = list(pool.map(lambda p: ens.generate(p.messages, config).text, problems))
total = time.perf_counter() - start
passes = spent["build"][0]
layers = spent["write"][0] / passes
print(f"{which} {method}, {n} problems, {level} at once: {total:.2f} s, {passes} passes, "
      f"{layers:.1f} layer writes per pass")  # fmt: skip
for name, (calls, seconds) in spent.items():
    per_call, per_pass = seconds * 1e6 / calls, seconds * 1e6 / passes
    print(f"  {name}: {calls} calls, {per_call:.1f} us per call, {per_pass:.1f} us per pass, "
          f"{100 * seconds / total:.1f} % of the time")  # fmt: skip
print("  texts:", hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:12])
