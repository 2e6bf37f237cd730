"""Seconds `Ensemble.from_pretrained` takes to load one member of the real pair (0: SmolLM2,
1: Gemma), after the imports; run from a checkout's root with that checkout on PYTHONPATH.

    python lab/results/gguf-load/load_one.py 1
"""

import sys
import time

from core import Ensemble
from core.testbed.real_models import real_members

member = real_members()[int(sys.argv[1])]
started = time.perf_counter()
Ensemble.from_pretrained([member], "single")
print(f"{time.perf_counter() - started:.2f}")
