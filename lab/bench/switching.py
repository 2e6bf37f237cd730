"""Benchmark: does batching need a shorter thread switch interval? (`python -m
lab.bench.switching`)

Concurrent requests are threads under one interpreter lock. The library leaves Python's thread
switch interval as the application set it (5 ms by default); a shorter one (0.5 ms) hands the
lock between threads more often. This measures both on the same loaded ensemble, in one run:
blocks of the same requests at `--level` concurrent requests, the interval alternating from
block to block (and blocks one at a time as the reference), `--rounds` times, so machine noise
hits both alike; tokens/s per block, minimum and median over rounds.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from core.config import GenerationConfig

from .report import write_results
from .setups import Setup, ensemble_for, load_members, load_task

SHORT = 0.0005  # seconds: the shorter switch interval measured against the default


def block(ensemble, items: Sequence, config, level: int, interval: float) -> float:
    """Output tokens/s of the items' requests on `level` threads, at this switch interval."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        start = time.perf_counter()
        with ThreadPoolExecutor(level) as pool:
            outs = list(pool.map(lambda m: ensemble.generate(m, config), items))
        return sum(o.stats.tokens for o in outs) / (time.perf_counter() - start)
    finally:
        sys.setswitchinterval(saved)


def run(methods: Sequence[str], n: int, level: int, rounds: int, max_new_tokens: int, out: str,
        command: str) -> dict:  # fmt: skip
    members = load_members(None, ignore_stop=True)
    items = [messages for messages, _ in load_task("arithmetic", n, seed=1).items]
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    default = sys.getswitchinterval()
    modes = {
        "one at a time": (1, default),
        f"{level} at once, {1000 * default:g} ms": (level, default),
        f"{level} at once, {1000 * SHORT:g} ms": (level, SHORT),
    }
    rows = []
    for method in methods:
        ensemble = ensemble_for(members, Setup(method, method), max_concurrency=level)
        block(ensemble, items, config, level, default)  # untimed: lazy tables, thread start-up
        speeds: dict[str, list[float]] = {mode: [] for mode in modes}
        for r in range(rounds):
            order = list(modes)[r % len(modes) :] + list(modes)[: r % len(modes)]
            for mode in order:
                threads, interval = modes[mode]
                speeds[mode].append(block(ensemble, items, config, threads, interval))
        for mode, values in speeds.items():
            rows.append({"method": method, "mode": mode, "tokens_per_s": values,
                         "min": min(values), "median": statistics.median(values)})  # fmt: skip
    result = {"command": command, "n": n, "level": level, "rounds": rounds,
              "max_new_tokens": max_new_tokens, "rows": rows}  # fmt: skip
    lines = [
        f"{n} short chain-of-thought prompts, {max_new_tokens} new tokens (stops ignored), the "
        f"shipped members, {rounds} rounds; blocks in a rotating order; other processes were "
        "running.",
        "",
        "| method | requests, switch interval | tokens/s (min, median) |",
        "|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['method']} | {row['mode']} | {row['min']:.0f}, {row['median']:.0f} |")
    return write_results(out, result, "\n".join(lines) + "\n")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m lab.bench.switching", description=__doc__)
    p.add_argument("--methods", default="single,token,safe,specem,rerank")
    p.add_argument("--n", type=int, default=16)
    p.add_argument("--level", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--out", default="bench-out/switching")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    command = "python -m lab.bench.switching " + " ".join(shlex.quote(a) for a in argv)
    run([m for m in args.methods.split(",") if m], args.n, args.level, args.rounds,
        args.max_new_tokens, args.out, command)  # fmt: skip
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
