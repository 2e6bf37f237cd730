"""Benchmark: what constrained decoding costs per output token, for every method
(`python -m lab bench --grammar-cost`).

Each problem runs twice per configuration, without a grammar and with one, side by side in one
run (configurations and the two variants in a rotating order, prefix reuse off). The grammar is
the language of a request with tools and `tool_choice="none"`: any text without a `<tool_call>`
tag. It allows every text the models write, and the tools do not reach the prompt, so both runs
write the same text (counted) and the ratio of their time per output token is the grammar's own
cost: the matchers kept in step with each member's ids and the masks applied to every row.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.member import Member
from core.testbed import TOOL_SPECS

from .concurrency import ForwardClock
from .report import write_results
from .setups import Setup, ensemble_for

GOAL = 1.15  # time per output token with the grammar, times without
TOOL = TOOL_SPECS["add"]
VARIANTS = ("plain", "grammar")


def configs(max_new_tokens: int) -> dict[str, GenerationConfig]:
    plain = GenerationConfig(max_new_tokens=max_new_tokens)
    grammar = GenerationConfig(max_new_tokens=max_new_tokens, tools=[TOOL], tool_choice="none")
    return {"plain": plain, "grammar": grammar}


@dataclass
class Run:
    label: str
    variant: str
    problem: int
    seconds: float
    forward: float  # seconds inside the models' forward passes
    tokens: int
    forced: int  # tokens the grammar forced (committed without a model call)
    text: str


def run_one(
    ensemble: Ensemble,
    messages: list[dict],
    config: GenerationConfig,
    clock: ForwardClock,
    label: str,
    variant: str,
    problem: int,
) -> Run:
    forward = clock.total()
    start = time.perf_counter()
    out = ensemble.generate(messages, config)
    seconds = time.perf_counter() - start
    forced = out.stats.counts.get("grammar_forced_tokens", 0)
    return Run(label, variant, problem, seconds, clock.total() - forward, out.stats.tokens,
               forced, out.text)  # fmt: skip


def summarise(setups: Sequence[Setup], runs: Sequence[Run]) -> list[dict]:
    rows = []
    for setup in setups:
        per = {}
        for variant in VARIANTS:
            mine = [r for r in runs if r.label == setup.label and r.variant == variant]
            tokens = sum(r.tokens for r in mine)
            per[variant] = {
                "ms_per_token": 1000 * sum(r.seconds for r in mine) / tokens if tokens else None,
                "forward_ms_per_token": (
                    1000 * sum(r.forward for r in mine) / tokens if tokens else None
                ),
                "tokens": tokens,
                "texts": {r.problem: r.text for r in mine},
                "forced": sum(r.forced for r in mine),
            }
        plain, grammar = per["plain"], per["grammar"]
        same = sum(grammar["texts"][p] == t for p, t in plain["texts"].items())
        ratio = (
            grammar["ms_per_token"] / plain["ms_per_token"]
            if plain["ms_per_token"] and grammar["ms_per_token"]
            else None
        )
        rows.append(
            {
                "label": setup.label,
                "method": setup.method,
                "problems": len(plain["texts"]),
                "tokens_per_problem": plain["tokens"] / max(len(plain["texts"]), 1),
                "ms_per_token": plain["ms_per_token"],
                "ms_per_token_grammar": grammar["ms_per_token"],
                "ratio": ratio,
                "goal_met": ratio is not None and ratio <= GOAL,
                "forward_ms_per_token": plain["forward_ms_per_token"],
                "forward_ms_per_token_grammar": grammar["forward_ms_per_token"],
                "same_text": same,
                "differences": [p for p, t in plain["texts"].items() if grammar["texts"][p] != t],
                "grammar_forced_tokens": grammar["forced"],
            }
        )
    return rows


def markdown(result: dict) -> str:
    lines = []
    lines += [
        f"{result['problems']} problems ({result['task']}), greedy, max_new_tokens="
        f"{result['max_new_tokens']}, torch threads {result['torch_threads']}; grammar: tools "
        'with tool_choice="none" (any text without a tool call); load average '
        f"{result['load_before'][0]:.2f} before, {result['load_after'][0]:.2f} after.",
        "",
        "| configuration | ms/token | with grammar | × | goal <= 1.15 | same text "
        "| forward ms/token | with grammar | tokens/problem |",
        "|" + "---|" * 9,
    ]

    def fmt(value, pattern: str) -> str:
        return "–" if value is None else pattern.format(value)

    for r in result["rows"]:
        lines.append(
            f"| {r['label']} | {fmt(r['ms_per_token'], '{:.2f}')} | "
            f"{fmt(r['ms_per_token_grammar'], '{:.2f}')} | {fmt(r['ratio'], '{:.2f}')} | "
            f"{'met' if r['goal_met'] else 'missed'} | {r['same_text']}/{r['problems']} | "
            f"{fmt(r['forward_ms_per_token'], '{:.2f}')} | "
            f"{fmt(r['forward_ms_per_token_grammar'], '{:.2f}')} | "
            f"{r['tokens_per_problem']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def run(
    *,
    members: Sequence[Member],
    setups: Sequence[Setup],
    items: Sequence[list[dict]],
    task: str,
    max_new_tokens: int = 128,
    out: str | Path = "bench-out/grammar",
    progress: bool = True,
    command: str = "",
) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    variants = configs(max_new_tokens)
    ensembles = {s.label: ensemble_for(members, s, prefix_reuse=False) for s in setups}
    clock = ForwardClock(members)
    load_before = os.getloadavg()
    runs: list[Run] = []
    try:
        for label, ensemble in ensembles.items():  # untimed: grammar compilation, lazy inits
            for variant, config in variants.items():
                run_one(ensemble, items[0], config, clock, label, variant, -1)
        pairs = [(s, v) for s in setups for v in VARIANTS]
        steps = range(len(items))
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc="problems", unit="problem")
        for index in steps:
            turn = index % len(pairs)
            for setup, variant in pairs[turn:] + pairs[:turn]:
                runs.append(
                    run_one(
                        ensembles[setup.label],
                        items[index],
                        variants[variant],
                        clock,
                        setup.label,
                        variant,
                        index,
                    )  # fmt: skip
                )
    finally:
        clock.remove()
    rows = summarise(setups, runs)
    result = {
        "command": command,
        "task": task,
        "problems": len(items),
        "max_new_tokens": max_new_tokens,
        "members": [m.name for m in members],
        "torch_threads": torch.get_num_threads(),
        "load_before": list(load_before),
        "load_after": list(os.getloadavg()),
        "goal": GOAL,
        "rows": rows,
        "runs": [asdict(r) for r in runs],
    }
    result = write_results(out, result, markdown(result))
    return result
