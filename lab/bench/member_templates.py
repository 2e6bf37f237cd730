"""Which chat template a base model answers best under, measured on that member ALONE.

A base model (Gemma-3-270M in the real pair) has no chat template, so the real-model testbed
chooses one for it (`core.testbed.real_models`). The template belongs to the member: it is
chosen by the member's own accuracy, alone (never by an ensemble's numbers), on problems of a
tuning seed (never the reporting seed 1). The member is loaded once and answers the same
problems (the real task's qa and rag forms) under each candidate, with the candidate's stop
strings, interleaved problem by problem; greedy, cut replies read by the cut-aware checker.

    python -m lab.bench.member_templates --qa 70 --rag 21 --seed 2 --out lab/results/real-template

Candidates (`CANDIDATES`): the Gemma instruction format its instruction-tuned sibling was trained
on; a plain "Question: ... / Answer:" text, as a base model saw questions in pretraining, which
ends the answer where a base model starts the next question; that text with the answer on its
own line; and that text stopped at the first newline (what a one-line answer needs, but a
member's stop string ends the whole ensemble's response, so it would cut the other member's
multi-line answers).
"""

from __future__ import annotations

import argparse
import copy
import shlex
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch

from core import Ensemble, GenerationConfig, HFMember
from core.testbed import make_real_problems
from core.testbed.real_models import (
    GEMMA_INSTRUCTION_STOP,
    GEMMA_INSTRUCTION_TEMPLATE,
    QA_TEXT_STOP,
    QA_TEXT_TEMPLATE,
    real_members,
)

from .accuracy import Record, run_one, summarise
from .report import write_results
from .setups import Setup

# label -> (chat template, stop strings)
CANDIDATES: dict[str, tuple[str, tuple[str, ...]]] = {
    "gemma instruction format": (GEMMA_INSTRUCTION_TEMPLATE, GEMMA_INSTRUCTION_STOP),
    "question/answer text": (QA_TEXT_TEMPLATE, QA_TEXT_STOP),
    "question/answer text, answer on its own line": (
        QA_TEXT_TEMPLATE.replace("Answer:{% endif %}", "Answer:\n{% endif %}"),
        QA_TEXT_STOP,
    ),
    "question/answer text, stop at the first newline": (QA_TEXT_TEMPLATE, ("\n",)),
}


def twins(member: HFMember, candidates: dict[str, tuple[str, tuple[str, ...]]]) -> dict:
    """One member per candidate, sharing the loaded weights: its own tokenizer copy holding the
    candidate's template, and the candidate's stop strings."""
    out = {}
    for label, (template, stop) in candidates.items():
        tokenizer = copy.copy(member.tokenizer)  # the template is its own attribute
        tokenizer.chat_template = template
        out[label] = HFMember(f"{member.name} [{label}]", member.model, tokenizer, stop)
    return out


def run(
    qa: int, rag: int, seed: int, max_new_tokens: int, out: str, command: str, progress: bool
) -> dict:
    if seed == 1:
        raise SystemExit("seed 1 is the reporting seed: choose a template on a tuning seed (2).")
    problems = make_real_problems(qa, seed, "qa") + make_real_problems(rag, seed, "rag")
    spec = real_members()[1]  # the base model
    member = HFMember.load(spec, device="cpu")
    members = twins(member, CANDIDATES)
    labels = list(members)
    setups = [Setup(label, "single", {}, [i]) for i, label in enumerate(labels)]
    ensembles = {label: Ensemble([m], "single", prefix_reuse=False) for label, m in members.items()}
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    for ensemble in ensembles.values():  # untimed: lazy inits
        ensemble.generate(problems[0].messages, GenerationConfig(max_new_tokens=4))
    from core.testbed import check_real_answer

    records: dict[str, list[Record]] = {label: [] for label in labels}
    finish: dict[str, Counter] = {label: Counter() for label in labels}
    steps = range(len(problems))
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="problems", unit="problem")
    for index in steps:
        problem = problems[index]
        turn = index % len(labels)
        for label in labels[turn:] + labels[:turn]:

            def check(text, cut=False, p=problem):
                return check_real_answer(text, p, cut=cut)

            record, _ = run_one(ensembles[label], problem.messages, config, check)
            records[label].append(record)
            finish[label][record.finish_reason] += 1
    rows = summarise(setups, records, len(labels))
    kinds = sorted({(p.form, p.kind) for p in problems})
    for row, label in zip(rows, labels, strict=True):
        row["by_kind"] = {
            f"{form} {kind}": _share(records[label], problems, form, kind) for form, kind in kinds
        }
        row["finish"] = dict(finish[label])
        row["seconds_per_problem"] = sum(r.seconds for r in records[label]) / len(problems)
    result = {
        "command": command,
        "member": spec.name,
        "seed": seed,
        "problems": {"qa": qa, "rag": rag},
        "max_new_tokens": max_new_tokens,
        "candidates": {k: {"template": t, "stop": list(s)} for k, (t, s) in CANDIDATES.items()},
        "rows": rows,
        "per_problem": {label: [asdict(r) for r in rs] for label, rs in records.items()},
    }
    return write_results(out, result, markdown(rows, kinds, qa, rag, seed, max_new_tokens))


def _share(records, problems, form, kind) -> list[int]:
    picked = [r.correct for r, p in zip(records, problems, strict=True) if (p.form, p.kind) ==
              (form, kind)]  # fmt: skip
    return [sum(picked), len(picked)]


def markdown(rows, kinds, qa: int, rag: int, seed: int, max_new_tokens: int) -> str:
    lines = [
        f"Gemma-3-270M (base) alone, {qa} qa and {rag} rag problems of seed {seed} (a tuning "
        f"seed), greedy, max_new_tokens={max_new_tokens}; the same problems under each template, "
        "interleaved. Right: check_real_answer (a cut reply's last word unread).",
        "",
        "| template | accuracy | " + " | ".join(f"{f} {k}" for f, k in kinds)
        + " | stopped / cut | tokens/problem | s/problem |",
        "|" + "---|" * (len(kinds) + 5),
    ]  # fmt: skip
    for r in rows:
        cells = [r["label"], f"{100 * r['accuracy']:.1f} %"]
        cells += [f"{right}/{n}" for right, n in r["by_kind"].values()]
        cells += [
            f"{r['finish'].get('stop', 0)} / {r['finish'].get('length', 0)}",
            f"{r['tokens_per_problem']:.1f}",
            f"{r['seconds_per_problem']:.2f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--qa", type=int, default=70, help="qa problems")
    parser.add_argument("--rag", type=int, default=21, help="rag problems")
    parser.add_argument("--seed", type=int, default=2, help="a tuning seed (never 1)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--out", default="bench-out/real-template")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m lab.bench.member_templates " + " ".join(map(shlex.quote, argv))
    run(args.qa, args.rag, args.seed, args.max_new_tokens, args.out, command, progress=True)
    print((Path(args.out) / "results.md").read_text())


if __name__ == "__main__":
    main()
