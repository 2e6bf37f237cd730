"""What one forward pass of a shipped member costs in CPU time: inside 8 concurrent `single`
requests, one request at a time, and as the bare model's own 8-row decode step (with and
without Python objects built between steps, as request threads build theirs).

Forward hooks on the model read the calling thread's CPU time around each pass (a pass runs
on one thread), keyed by its rows and new tokens; only the decode passes (one new token per
row) are compared. Run from the repository root:

    PYTHONPATH=. python lab/results/concurrency-pass-cost/pass_cost.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from core import Ensemble, GenerationConfig
from lab.bench.setups import load_members, load_task


class PassClock:
    """Thread CPU milliseconds of each forward pass, by (rows, new tokens)."""

    def __init__(self, model) -> None:
        self.passes: dict[tuple[int, int], list[float]] = defaultdict(list)
        self._started: dict[int, float] = {}
        self._handles = [
            model.register_forward_pre_hook(self._start, with_kwargs=True),
            model.register_forward_hook(self._stop, with_kwargs=True),
        ]

    def _start(self, _module, _args, kwargs) -> None:
        self._started[id(kwargs["input_ids"])] = time.thread_time()

    def _stop(self, _module, _args, kwargs, _output) -> None:
        ids = kwargs["input_ids"]
        cpu = time.thread_time() - self._started.pop(id(ids))
        self.passes[tuple(ids.shape)].append(cpu * 1e3)

    def take(self, shape: tuple[int, int]) -> list[float]:
        got = self.passes.pop(shape, [])
        self.passes.clear()
        return got

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def engine_passes(ensemble: Ensemble, items, level: int, tokens: int) -> None:
    config = GenerationConfig(max_new_tokens=tokens)
    with ThreadPoolExecutor(level) as pool:
        list(pool.map(lambda m: ensemble.generate(m, config).text, items))


def bare_steps(model, rows: int, past: int, steps: int, garbage_kib: int) -> None:
    """`steps` decode steps of `rows` rows after a `past`-token prefill (DynamicCache), with
    `garbage_kib` KiB of Python objects built and read between steps."""
    from transformers import DynamicCache

    torch.manual_seed(0)
    ids = torch.randint(3, 200, (rows, past))
    kept = []
    with torch.no_grad():
        cache = DynamicCache()
        out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        for _ in range(steps):
            if garbage_kib:
                kept = [bytearray(1024) for _ in range(garbage_kib)]
                sum(block[0] for block in kept)
            token = out.logits[:, -1:].argmax(-1)
            out = model(input_ids=token, cache=cache, use_cache=True)
    del kept


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "passes": len(values),
        "median_ms": statistics.median(values),
        "p10_ms": ordered[len(ordered) // 10],
        "p90_ms": ordered[9 * len(ordered) // 10],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--level", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    members = load_members(None, ignore_stop=True)
    drafter = members[0]
    task = load_task("arithmetic", args.requests, 1, "cot")
    items = [messages for messages, _ in task.items]
    ensemble = Ensemble([drafter], "single", max_concurrency=args.level, prefix_reuse=False)
    load_before = os.getloadavg()[0]
    clock = PassClock(drafter.model)
    engine_passes(ensemble, items[: args.level], args.level, args.tokens)  # warm-up
    past = len(drafter.render(items[0])) + args.tokens // 2
    rows: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.rounds):  # the settings interleaved, round after round
        clock.passes.clear()  # the warm-up's, or the last round's bare prefills
        engine_passes(ensemble, items, args.level, args.tokens)
        rows[f"engine, {args.level} concurrent requests"] += clock.take((args.level, 1))
        engine_passes(ensemble, items[: args.requests // 8], 1, args.tokens)
        rows["engine, one request at a time"] += clock.take((1, 1))
        for garbage in (0, 512, 4096):
            bare_steps(drafter.model, args.level, past, 200, garbage)
            label = f"bare model, {args.level} rows" + (
                f", {garbage} KiB of Python objects built between steps" if garbage else ""
            )
            rows[label] += clock.take((args.level, 1))
        bare_steps(drafter.model, 1, past, 200, 0)
        rows["bare model, 1 row"] += clock.take((1, 1))
    clock.remove()
    result = {
        "model": drafter.name,
        "requests": args.requests,
        "tokens": args.tokens,
        "level": args.level,
        "rounds": args.rounds,
        "past": past,
        "torch": torch.__version__,
        "load_average": [load_before, os.getloadavg()[0]],
        "rows": {label: summary(values) for label, values in rows.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "| passes of | decode passes | CPU ms per pass: median | p10 | p90 |",
        "|---|---|---|---|---|",
    ]
    for label, row in result["rows"].items():
        lines.append(f"| {label} | {row['passes']} | {row['median_ms']:.2f} | "
                     f"{row['p10_ms']:.2f} | {row['p90_ms']:.2f} |")  # fmt: skip
    (args.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
