"""Times `Ensemble.calibrate()` on the built-in prompts and prints what it measured, so two
engines can be compared side by side (the same weights and self-preference, and the time).

    python lab/results/calibration-time/time_calibrate.py shipped|real [METHOD]
"""

import json
import sys
import time

import torch

from core.ensemble import Ensemble
from lab.bench.setups import default_models


def main(which: str, method: str = "specem") -> None:
    torch.set_num_threads(1)
    sources = default_models("real" if which == "real" else "arithmetic")
    ensemble = Ensemble.from_pretrained(sources, method=method)
    started, cpu = time.perf_counter(), time.process_time()
    weights = ensemble.calibrate()
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    summary = ensemble.summary()
    print(
        json.dumps(
            {
                "members": which,
                "method": method,
                "seconds": round(seconds, 2),
                "cpu_seconds": round(cpu, 2),
                "weights": weights,
                "self_preference": summary.get("self_preference"),
            }
        )
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
