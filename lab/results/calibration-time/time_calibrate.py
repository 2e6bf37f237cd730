"""Times `Ensemble.calibrate()` on the built-in prompts and prints what it measured, so two
engines can be compared side by side (the same weights and self-preference, and the time).

    python lab/results/calibration-time/time_calibrate.py shipped|real [METHOD]
"""

import json
import sys
import time

import torch

from core.ensemble import Ensemble


def members(which: str) -> list:
    if which == "real":
        from core.testbed.real_models import real_members

        return real_members()
    from core.testbed import model_paths

    return [str(p) for p in model_paths()]


def main(which: str, method: str = "specem") -> None:
    torch.set_num_threads(1)
    ensemble = Ensemble.from_pretrained(members(which), method=method)
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
