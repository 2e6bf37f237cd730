"""SAFE's README table: every configuration side by side on the same held-out problems, in ONE run.

For a pair of testbed models it measures, interleaved problem by problem in a rotating order
(so machine noise hits every configuration alike; caches are reset before every request):
each model alone, every-token UniTE and GaC (arithmetic and geometric aggregation), and SAFE
with each model drafting, for UniTE and GaC, each sharpening variant and none, `heal` off and
on. Speed is wall time per output token relative to the drafter alone, measured in this run.

    python bench/safe_table.py --n 200 --out bench/results
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from core import Ensemble, GenerationConfig, HFMember  # noqa: E402
from core.methods.safe import Safe  # noqa: E402
from core.testbed import MODEL_ORDER, check_answer, make_problems, model_paths  # noqa: E402

SHARPEN = (("heuristic", "heur"), ("geometric", "geo"), (None, "none"))


def setups(names: list[str]) -> list[tuple[str, str, list[int], dict]]:
    """(label, method, member indices, options); SAFE members are listed drafter first."""
    out = [(f"single {names[i]}", "single", [i], {}) for i in range(2)]
    for aggregator in ("unite", "gac"):
        for aggregation in ("arithmetic", "geometric"):
            label = f"token {aggregator} {aggregation[:5]}"
            out.append(
                (label, "token", [0, 1], dict(aggregator=aggregator, aggregation=aggregation))
            )
    for drafter in (0, 1):
        order = [drafter, 1 - drafter]
        for aggregator in ("unite", "gac"):
            for sharpen, short in SHARPEN:
                for heal in (False, True):
                    label = f"safe[{names[drafter]}] {aggregator} {short}{' heal' if heal else ''}"
                    options = dict(aggregator=aggregator, sharpen=sharpen, heal=heal)
                    out.append((label, "safe", order, options))
        for aggregator in ("unite", "gac"):  # heal at OOV-like positions only (the issue's)
            label = f"safe[{names[drafter]}] {aggregator} heur heal-oov"
            out.append((label, "safe-oov", order, dict(aggregator=aggregator, heal=True)))
        for heal in (False, True):  # the paper's lookahead ablation: fewer verifier passes
            label = f"safe[{names[drafter]}] unite heur{' heal' if heal else ''} n=8"
            out.append((label, "safe", order, dict(heal=heal, lookahead=8)))
    return out


class OOVOnlyHeal(Safe):
    """Ablation: `heal` scores only positions that are OOV-like for a verifier (the issue's
    definition), not those where a verifier's next token ends inside the drafted one."""

    heal_spans = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pair", default="tb-gpt2-bpe,tb-qwen2-spm")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dirs", default="", help="model directories instead of the shipped")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = args.pair.split(",")
    paths = dict(zip(MODEL_ORDER, model_paths(), strict=True))
    dirs = args.dirs.split(",") if args.dirs else [paths[n] for n in names]
    members = [HFMember.load(d, device="cpu") for d in dirs]
    short = [n.split("-")[-1] for n in names]  # bpe, spm, word
    plan = setups(short)
    ensembles = {}
    for label, method, idx, options in plan:
        chosen = [members[i] for i in idx]
        ensembles[label] = Ensemble(chosen, method.removesuffix("-oov"), **options)
        if method == "safe-oov":
            ensembles[label].method = OOVOnlyHeal(chosen, **options)
    problems = make_problems(args.n, seed=args.seed, split="test")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    records: dict[str, list[dict]] = {label: [] for label, *_ in plan}
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    for k, problem in enumerate(problems):
        rotation = k % len(plan)
        for label, *_ in plan[rotation:] + plan[:rotation]:
            ens = ensembles[label]
            for member in members:
                member.reset()
            t = time.perf_counter()
            result = ens.generate(problem.messages, config)
            seconds = time.perf_counter() - t
            records[label].append(
                dict(
                    correct=check_answer(result.text, problem),
                    tokens=result.stats.tokens,
                    ensembled=result.stats.ensembled,
                    seconds=seconds,
                    counts=dict(result.stats.counts),
                    sharpened=sum(
                        1 for e in result.events if getattr(e, "sharpened", False) is True
                    ),
                    text=result.text,
                )
            )
        if (k + 1) % 10 == 0:
            print(f"{k + 1}/{len(problems)} problems, {time.time() - started:.0f}s", flush=True)
            (out_dir / "safe-records.json").write_text(json.dumps(records))
    (out_dir / "safe-records.json").write_text(json.dumps(records))
    table = render(plan, records, short, args)
    (out_dir / "safe-table.md").write_text(table)
    print(table)


def _per_token(rs: list[dict]) -> float:
    return sum(r["seconds"] for r in rs) / max(sum(r["tokens"] for r in rs), 1)


def render(plan, records, short, args) -> str:
    n = len(next(iter(records.values())))
    alone = {i: _per_token(records[f"single {short[i]}"]) for i in range(2)}
    lines = [
        f"SAFE on {n} held-out testbed problems (cot, seed {args.seed}), members "
        f"{short[0]} + {short[1]}, greedy, max_new_tokens {args.max_new_tokens}, CPU, "
        f"{args.threads} thread; all rows measured in one interleaved run.",
        "",
        "| configuration | accuracy | E/T | skips mismatch / consensus / gate | sharpened | "
        f"time/token vs {short[0]} alone | vs {short[1]} alone |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, method, idx, _ in plan:
        rs = records[label]
        acc = sum(r["correct"] for r in rs) / len(rs)
        tokens = sum(r["tokens"] for r in rs)
        et = sum(r["ensembled"] for r in rs) / max(tokens, 1)
        counts: dict[str, int] = {}
        for r in rs:
            for key, value in r["counts"].items():
                counts[key] = counts.get(key, 0) + value
        skips = "/".join(
            str(counts.get(k, 0)) for k in ("skip_mismatch", "skip_consensus", "skip_gate")
        )
        safe = method.startswith("safe")
        skips = skips if safe else "-"
        sharpened = str(sum(r["sharpened"] for r in rs)) if safe else "-"
        ratios = [_per_token(rs) / alone[i] for i in range(2)]
        if method.startswith("safe"):  # the reference is this configuration's drafter
            ratios = [f"**{r:.2f}**" if i == idx[0] else "" for i, r in enumerate(ratios)]
        else:
            ratios = [f"{r:.2f}" for r in ratios]
        cells = [label, f"{acc:.1%}", f"{et:.1%}", skips, sharpened, *ratios]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    command = (
        f"python bench/safe_table.py --n {n} --seed {args.seed} --pair {args.pair} "
        f"--max-new-tokens {args.max_new_tokens} --threads {args.threads}"
    )
    lines.append(f"Command: `{command}`")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
