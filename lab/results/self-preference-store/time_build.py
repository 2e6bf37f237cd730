"""Times building an ensemble with `self_preference="builtin"` twice in one process, over
members loaded from their files, and prints what each build measured or read.

    LLM_ENSEMBLING_CACHE=DIR \
        python lab/results/self-preference-store/time_build.py shipped|real [METHOD]

Run twice with the same (first empty) DIR: the first process measures, then reads; the second
reads in both builds (a new process over the same files).
"""

import json
import sys
import time

import torch

from core import Ensemble, HFMember
from lab.bench.setups import default_models


def main(which: str, method: str = "rerank") -> None:
    torch.set_num_threads(1)
    sources = default_models("real" if which == "real" else "arithmetic")
    members = [HFMember.load(source, device="cpu") for source in sources]
    for build in (1, 2):
        started = time.perf_counter()
        ensemble = Ensemble(members, method, self_preference="builtin")
        seconds = time.perf_counter() - started
        preference = ensemble.summary().get("self_preference")
        print(
            json.dumps(
                {
                    "members": which,
                    "method": method,
                    "build": build,
                    "seconds": round(seconds, 3),
                    "self_preference": preference,
                }
            )
        )


if __name__ == "__main__":
    main(*sys.argv[1:])
