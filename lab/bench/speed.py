"""Benchmark: each method's time per output token against its drafter alone, measured side by
side, and where a token of each goes (`python -m lab.bench.speed`).

Every prompt runs under every configuration, the configurations in an order that rotates from
prompt to prompt, and the whole set `--rounds` times: machine noise (other processes) hits every
configuration alike, and each round gives one ratio per configuration (its time per output
token over the drafter's, both from that round). The table reports the minimum and the median
over rounds. The drafter is SAFE's drafter and SpecEM's first member: the first member (with
all members trusted alike).

Then each configuration runs the prompts once more with its steps timed (`phases`): exclusive
wall and CPU milliseconds per output token per phase (drafting, each verifier pass split into
the model's body and its output head, heal's branch passes, alignment, the ensemble step,
rollback and re-sync, the Python between passes), and forward passes per output token.

Prompts: the testbed's chain-of-thought problems (default), `--prompts questions` (short
questions with one-word or one-number answers, `QUESTIONS`), or a JSONL file of {"prompt": ...}
lines. Every text is kept in results.json, so `--compare old/results.json` says whether a change
moved any answer.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from core.config import GenerationConfig
from core.errors import EnsembleError, InvalidConfigError
from core.member import Member

from .phases import PhaseClock, instrumented
from .report import write_results
from .setups import Setup, ensemble_for, jsonl_rows, load_members, parse_setups

# Short questions with a one-word or one-number answer (the real pair's prompts).
QUESTIONS = (
    "What is 17 + 25? Answer with the number only.",
    "What is 9 times 7? Answer with the number only.",
    "What is 100 minus 37? Answer with the number only.",
    "What is 144 divided by 12? Answer with the number only.",
    "What is 15 + 27 + 8? Answer with the number only.",
    "What is half of 86? Answer with the number only.",
    "What is 12 squared? Answer with the number only.",
    "How many centimeters are in 3 meters? Answer with the number only.",
    "How many minutes are in 2 hours? Answer with the number only.",
    "How many grams are in 5 kilograms? Answer with the number only.",
    "How many days are in a week? Answer with the number only.",
    "How many seconds are in 4 minutes? Answer with the number only.",
    "How many legs does a spider have? Answer with the number only.",
    "How many continents are there? Answer with the number only.",
    "What is the capital of France? Answer in one word.",
    "What is the capital of Japan? Answer in one word.",
    "What is the capital of Italy? Answer in one word.",
    "What is the largest planet in the solar system? Answer in one word.",
    "What color is the sky on a clear day? Answer in one word.",
    "What is the chemical symbol for gold? Answer with the symbol only.",
    "What is the chemical symbol for water? Answer with the formula only.",
    "Who wrote Romeo and Juliet? Answer with the name only.",
    "What is the boiling point of water in degrees Celsius? Answer with the number only.",
    "What is the freezing point of water in degrees Fahrenheit? Answer with the number only.",
    "What is the opposite of hot? Answer in one word.",
    "What animal says moo? Answer in one word.",
    "Which month comes after March? Answer in one word.",
    "What is the plural of mouse? Answer in one word.",
    "How many sides does a hexagon have? Answer with the number only.",
    "What language is spoken in Brazil? Answer in one word.",
)

REFERENCE = "drafter alone"
DEFAULT_CONFIGS = (
    f"{REFERENCE}=single:member=0",
    "safe (default)=safe",
    "safe (paper preset)=safe:preset=paper",
    "specem (default)=specem",
)


def load_prompts(prompts: str, n: int, seed: int) -> tuple[str, list[list[dict]]]:
    """The prompts by name (`arithmetic`: the testbed's chain-of-thought problems of `seed`;
    `questions`: QUESTIONS) or from a JSONL file of {"prompt": ...} lines; at most `n`."""
    if prompts == "arithmetic":
        from core.testbed import make_problems

        problems = make_problems(n, seed=seed, form="cot", split="test")
        return f"arithmetic-cot seed {seed}", [p.messages for p in problems]
    if prompts == "questions":
        return "short questions", [[{"role": "user", "content": q}] for q in QUESTIONS[:n]]
    path = Path(prompts)
    if not path.is_file():
        raise InvalidConfigError(
            f"--prompts {prompts!r} is neither 'arithmetic', 'questions' nor a JSONL file of "
            '{"prompt": ...} lines.'
        )
    items = []
    for where, row in jsonl_rows(path, '{"prompt": ...}'):
        if not isinstance(row.get("prompt"), str):
            raise InvalidConfigError(f'{where} needs a "prompt" string.')
        items.append([{"role": "user", "content": row["prompt"]}])
    return path.stem, items[:n]


@dataclass
class Timed:
    """One request of one configuration."""

    label: str
    round: int
    prompt: int
    seconds: float
    cpu: float
    tokens: int
    ensembled: int
    text: str


@dataclass
class Breakdown:
    """One configuration's phases over every prompt, with its steps timed."""

    label: str
    tokens: int
    seconds: float
    wall: dict[str, float] = field(default_factory=dict)  # phase -> seconds
    cpu: dict[str, float] = field(default_factory=dict)
    passes: dict[str, int] = field(default_factory=dict)  # asker -> forward passes
    member_passes: dict[str, dict[str, int]] = field(default_factory=dict)  # member: asker: n


def _run(ensemble, messages, config) -> tuple[float, float, object]:
    cpu, start = time.process_time(), time.perf_counter()
    out = ensemble.generate(messages, config)
    return time.perf_counter() - start, time.process_time() - cpu, out


def timed_rounds(
    ensembles: dict, prompts: Sequence, configs: dict, rounds: int, bar=None
) -> list[Timed]:
    """Every prompt under every configuration (its ensemble and its request settings,
    `configs[label]`), in a rotating order, `rounds` times."""
    labels = list(ensembles)
    runs: list[Timed] = []
    for r in range(rounds):
        for i, messages in enumerate(prompts):
            turn = (r * len(prompts) + i) % len(labels)
            for label in labels[turn:] + labels[:turn]:
                seconds, cpu, out = _run(ensembles[label], messages, configs[label])
                stats = out.stats
                runs.append(Timed(label, r, i, seconds, cpu, stats.tokens,
                                  stats.ensembled_tokens, out.text))  # fmt: skip
                if bar is not None:
                    bar.update(1)
    return runs


def breakdown(label: str, ensemble, prompts: Sequence, config, models) -> Breakdown:
    """The configuration's phases over every prompt (one pass, steps timed)."""
    clock = PhaseClock()
    passes: Counter[str] = Counter()
    tokens, seconds = 0, 0.0
    with instrumented(clock, models):
        for messages in prompts:
            clock.enter("facade")
            start = time.perf_counter()
            try:
                out = ensemble.generate(messages, config)
            finally:
                clock.leave()
            seconds += time.perf_counter() - start
            tokens += out.stats.tokens
    for phase in clock.wall:
        if phase.endswith(" · body"):
            passes[phase.removesuffix(" · body")] = clock.calls.get(phase, 0)
    order = {name: i for i, name in enumerate(models)}  # the members' order, drafter first

    def place(item):
        (member, asker), _ = item
        return order.get(member, len(order)), member, asker

    by_member: dict[str, dict[str, int]] = {}
    for (member, asker), count in sorted(clock.passes.items(), key=place):
        by_member.setdefault(member, {})[asker] = count
    return Breakdown(
        label, tokens, seconds, dict(clock.wall), dict(clock.cpu), dict(passes), by_member
    )


def summarise(labels: Sequence[str], runs: Sequence[Timed]) -> list[dict]:
    """Per configuration: ms per output token (min and median over rounds), its ratio to the
    drafter's in each round (min, median), CPU ms per token, tokens per prompt, E/T."""
    rounds = sorted({t.round for t in runs})

    def per_token(label: str, r: int, what: str = "seconds") -> float:
        mine = [t for t in runs if t.label == label and t.round == r]
        return 1000 * sum(getattr(t, what) for t in mine) / max(1, sum(t.tokens for t in mine))

    rows = []
    for label in labels:
        wall = [per_token(label, r) for r in rounds]
        cpu = [per_token(label, r, "cpu") for r in rounds]
        ratio = [per_token(label, r) / per_token(REFERENCE, r) for r in rounds]
        cpu_ratio = [per_token(label, r, "cpu") / per_token(REFERENCE, r, "cpu") for r in rounds]
        mine = [t for t in runs if t.label == label and t.round == 0]
        tokens = sum(t.tokens for t in mine)
        rows.append({
            "label": label,
            "ms_per_token_min": min(wall),
            "ms_per_token_median": statistics.median(wall),
            "x_drafter_min": min(ratio),
            "x_drafter_median": statistics.median(ratio),
            "x_drafter_rounds": ratio,
            "cpu_ms_per_token_median": statistics.median(cpu),
            "cpu_x_drafter_median": statistics.median(cpu_ratio),
            "tokens_per_prompt": tokens / max(1, len(mine)),
            "ensemble_rate": sum(t.ensembled for t in mine) / max(1, tokens),
        })  # fmt: skip
    return rows


def same_texts(runs: Sequence[Timed], previous: dict) -> dict[str, list[int]]:
    """Per configuration found in both runs: (prompts with the same text, prompts compared)."""
    before = previous.get("texts", {})
    now = texts(runs)
    found = {}
    for label, mine in now.items():
        if label in before:
            pairs = list(zip(before[label], mine, strict=False))
            found[label] = [sum(a == b for a, b in pairs), len(pairs)]
    return found


def texts(runs: Sequence[Timed]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for t in sorted((t for t in runs if t.round == 0), key=lambda t: t.prompt):
        out.setdefault(t.label, []).append(t.text)
    return out


def markdown(result: dict) -> str:
    lines = [
        f"{result['prompts']} ({result['n']} prompts), greedy, max_new_tokens="
        f"{result['max_new_tokens']}, members {', '.join(result['members'])}; {result['rounds']} "
        "rounds, every prompt under every configuration in a rotating order; other processes "
        f"were running (load average {result['load_before']:.2f} before, "
        f"{result['load_after']:.2f} after).",
        "",
        "| configuration | ms/token (min, median) | × drafter (min, median) | CPU × drafter "
        "(median) | tokens/prompt | E/T |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['label']} | {r['ms_per_token_min']:.1f}, {r['ms_per_token_median']:.1f} | "
            f"{r['x_drafter_min']:.2f}, {r['x_drafter_median']:.2f} | "
            f"{r['cpu_x_drafter_median']:.2f} | {r['tokens_per_prompt']:.1f} | "
            f"{100 * r['ensemble_rate']:.1f} % |"
        )
    for b in result["breakdowns"]:
        lines += ["", *breakdown_table(b)]
    if result.get("same_texts"):
        lines += ["", "Texts against the compared run: " + ", ".join(
            f"{label} {same}/{n} the same" for label, (same, n) in result["same_texts"].items()
        ) + "."]  # fmt: skip
    return "\n".join(lines) + "\n"


def breakdown_table(b: dict) -> list[str]:
    tokens = max(1, b["tokens"])
    total = sum(b["wall"].values())
    lines = [
        f"{b['label']}: {b['tokens']} output tokens, {1000 * b['seconds'] / tokens:.1f} ms/token "
        "with its steps timed; forward passes per output token: "
        + ", ".join(f"{k} {v / tokens:.2f}" for k, v in sorted(b["passes"].items())),
        "",
        "forward passes per output token by member (and the step that asked): "
        + "; ".join(
            f"{member} {sum(asked.values()) / tokens:.2f} ("
            + ", ".join(f"{k} {v / tokens:.2f}" for k, v in asked.items())
            + ")"
            for member, asked in b.get("member_passes", {}).items()
        ),
        "",
        "| phase | wall ms/token | share | CPU ms/token |",
        "|---|---|---|---|",
    ]
    for phase in sorted(b["wall"], key=b["wall"].get, reverse=True):
        wall = b["wall"][phase]
        lines.append(
            f"| {phase} | {1000 * wall / tokens:.2f} | {100 * wall / total:.1f} % | "
            f"{1000 * b['cpu'].get(phase, 0.0) / tokens:.2f} |"
        )
    return lines


def run(
    *,
    members: Sequence[Member],
    setups: Sequence[Setup],
    prompts: Sequence[list[dict]],
    prompt_set: str,
    max_new_tokens: int,
    rounds: int,
    out: str | Path,
    compare: dict | None = None,
    command: str = "",
    progress: bool = True,
) -> dict:
    plain = GenerationConfig(max_new_tokens=max_new_tokens)
    configs = {s.label: s.config(plain) for s in setups}
    ensembles = {s.label: ensemble_for(members, s, max_concurrency=1) for s in setups}
    if REFERENCE not in ensembles:
        raise InvalidConfigError(f"the configurations need one labelled {REFERENCE!r}.")
    for label, ensemble in ensembles.items():  # untimed: lazy tables, first-pass allocations
        ensemble.generate(prompts[0], configs[label])
    load_before = _load()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=rounds * len(prompts) * len(ensembles), desc="requests")
    runs = timed_rounds(ensembles, prompts, configs, rounds, bar)
    if bar is not None:
        bar.close()
    models = {m.name: m.model for m in members if getattr(m, "model", None) is not None}
    parts = [breakdown(label, e, prompts, configs[label], models) for label, e in ensembles.items()]
    result = {
        "command": command,
        "prompts": prompt_set,
        "n": len(prompts),
        "max_new_tokens": max_new_tokens,
        "members": [m.name for m in members],
        "rounds": rounds,
        "configurations": {
            s.label: {"method": s.method, **s.options, **s.generation} for s in setups
        },
        "load_before": load_before,
        "load_after": _load(),
        "rows": summarise(list(ensembles), runs),
        "breakdowns": [vars(b) for b in parts],
        "texts": texts(runs),
        "requests": [{k: v for k, v in vars(t).items() if k != "text"} for t in runs],
    }
    if compare is not None:
        result["same_texts"] = same_texts(runs, compare)
    return write_results(out, result, markdown(result))


def _real_pair() -> list:
    """SmolLM2-135M-Instruct drafting, Gemma-3-270M verifying, as the real testbed gives them."""
    from core.testbed.real_models import real_members

    return real_members()


def _load() -> float:
    import os

    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m lab.bench.speed", description=__doc__)
    p.add_argument("--model", action="append", default=None, help="member (default: shipped)")
    p.add_argument("--real", action="store_true", help="the real pair (the `real` extra)")
    p.add_argument("--prompts", default="arithmetic", help="arithmetic | questions | FILE.jsonl")
    p.add_argument("--n", type=int, default=60)
    p.add_argument("--seed", type=int, default=7, help="arithmetic: the problems' seed")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--config", action="append", default=None, help="label=method:key=value,...")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="the members' dtype (auto: float32 on a CPU)")
    p.add_argument("--compare", default=None, help="an earlier results.json: same texts?")
    p.add_argument("--out", default="bench-out/speed")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        prompt_set, prompts = load_prompts(args.prompts, args.n, args.seed)
        members = load_members(_real_pair() if args.real else args.model, args.device, args.dtype)
        names = [m.name for m in members]
        setups = parse_setups((), (), len(members), args.config or DEFAULT_CONFIGS, names)
        compare = json.loads(Path(args.compare).read_text()) if args.compare else None
        command = "python -m lab.bench.speed " + " ".join(shlex.quote(a) for a in argv)
        run(members=members, setups=setups, prompts=prompts, prompt_set=prompt_set,
            max_new_tokens=args.max_new_tokens, rounds=args.rounds, out=args.out,
            compare=compare, command=command)  # fmt: skip
    except EnsembleError as error:
        sys.exit(f"error: {error}")
    print(Path(args.out) / "results.md")
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
