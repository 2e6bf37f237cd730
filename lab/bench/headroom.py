"""The headroom benchmark: how much of what its members could answer an ensemble answers.

Members: the three shipped testbed models and the weak fourth (`model_paths(weak=True)`) on
chain-of-thought problems, or the real pair (`real_members()`) on the real task (`--task real`,
its qa or rag form). For each set of members (every pair of the first three, the three, the
three and the weak one; the real pair is one pair), every method at its default options and at
its best measured options (`BEST`), and every member alone. Per configuration: accuracy; the
set's either-right ceiling (the share of problems at least one of its members answers right
alone); the share of the gap from the set's best single member to that ceiling the
configuration closes; the paired difference to that best member on the same problems (problems
won and lost, with its standard error); time per output token × its drafter and × the fastest
single member, measured side by side (configurations interleaved problem by problem, in a
rotating order); E/T; and the members' weights after warm-up.

Every ensemble runs as `Ensemble(members, method)` gives it: members equally weighted, nothing
learned. Optionally (`warmup`), before anything is measured, every ensemble answers `warmup`
problems of another seed (disjoint from the measured ones) with learning on
(`learn_weights=True`), then learning is frozen; and (`calibrate`) SAFE, SpecEM and rerank on
the three members, on the three with the weak one, and on the real pair get rows of their own
after `Ensemble.calibrate` on the prompts of `calibrate` problems of that other seed (the
shipped testbed's training split; the real task's problems of the measured form), no label
read, the trust frozen. Either way each measured answer depends on its problem alone.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import torch

from core.config import GenerationConfig
from core.errors import InvalidConfigError

from .accuracy import Record, run_one, summarise
from .report import write_results
from .setups import Setup, default_models, ensemble_for, load_members, load_task, parse_setups

METHODS = ("token", "safe", "specem", "rerank")
# Each method's best options, measured on held-out problems of seed 2 (never the measured seed
# 1; `lab/scripts/readme_tables.sh tuning`): the rows "at its best" run with these.
BEST: dict[str, dict[str, Any]] = {
    "token": {"subtoken": "first"},
    "safe": {},  # its defaults are its best
    "specem": {"feedback": False},
    "rerank": {},
}
# What the papers publish, one preset away: measured on the three members next to the defaults.
PUBLISHED: dict[str, dict[str, Any]] = {"safe": {"preset": "paper"}, "specem": {"preset": "paper"}}
SETS = ("pairs", "three", "weak")  # which member sets to run (--sets)
CALIBRATED = " (calibrated)"  # rows measured after Ensemble.calibrate (--calibrate)
CALIBRATED_METHODS = ("safe", "specem", "rerank")


def short(name: str) -> str:
    """A member's name in a table: a testbed model's tokenizer family ("tb-qwen2-spm" ->
    "spm"), another model's family ("smollm2-135m-instruct" -> "smollm2")."""
    return name.rsplit("-", 1)[-1] if name.startswith("tb-") else name.split("-", 1)[0]


def member_sets(names: Sequence[str], which: Sequence[str] = SETS) -> dict[str, list[int]]:
    """Label -> member indices: every pair of the first three (of two members: the pair), the
    three, the three + the fourth (the weak member)."""
    sets: dict[str, list[int]] = {}
    if "pairs" in which:
        for pair in combinations(range(min(3, len(names))), 2):
            sets[" + ".join(short(names[i]) for i in pair)] = list(pair)
    if "three" in which and len(names) >= 3:
        sets[" + ".join(short(n) for n in names[:3])] = [0, 1, 2]
    if "weak" in which and len(names) > 3:
        sets[" + ".join(short(n) for n in names[:4])] = [0, 1, 2, 3]
    return sets


def headroom_setups(
    names: Sequence[str],
    methods: Sequence[str] = METHODS,
    which: Sequence[str] = SETS,
    configs: Sequence[str] = (),
    calibrated: bool = False,
) -> list[Setup]:
    """Every member alone, then per member set every method at its default and best options
    (one row where they are the same; on the three members also as its paper publishes it;
    with `calibrated`, on the three and on the three with the weak member also calibrated),
    then `--config` setups (label=method:members=0+1,...)."""
    setups = [Setup(f"single {names[i]}", "single", {}, [i]) for i in range(len(names))]
    for label, chosen in member_sets(names, which).items():
        for method in methods:
            setups.append(Setup(f"{label}: {method}", method, {}, chosen))
            variants = [BEST.get(method, {})] + [PUBLISHED.get(method, {})] * (len(chosen) == 3)
            for options in filter(None, variants):
                shown = ", ".join(f"{k}={v}" for k, v in options.items())
                setups.append(Setup(f"{label}: {method} ({shown})", method, options, chosen))
            whole = len(chosen) >= 3 or len(names) == 2  # not the shipped testbed's pairs
            if calibrated and whole and method in CALIBRATED_METHODS:
                setups.append(Setup(f"{label}: {method}{CALIBRATED}", method, {}, chosen))
    return setups + parse_setups((), (), len(names), configs, names)


def run(
    *,
    models: Sequence[Any] | None = None,
    task: str = "arithmetic",
    form: str | None = None,
    n: int = 200,
    seed: int = 1,
    warmup: int = 0,
    warmup_seed: int = 2,
    calibrate: int = 0,
    methods: Sequence[str] = METHODS,
    which: Sequence[str] = SETS,
    configs: Sequence[str] = (),
    max_new_tokens: int = 128,
    out: str | Path = "bench-out/headroom",
    device: str = "cpu",
    dtype: str = "auto",
    threads: int | None = None,
    progress: bool = True,
    command: str = "",
) -> dict:
    from core.testbed import model_paths

    source = task
    task = load_task(source, n, seed, form)
    warm_task = load_task(source, warmup, warmup_seed, form) if warmup else None
    if threads:
        torch.set_num_threads(threads)
    if not models:
        models = default_models(source) if source == "real" else model_paths(weak=True)
    if len(models) < 2:
        raise InvalidConfigError("--headroom compares ensembles: give at least two --model.")
    members = load_members(list(models), device, dtype)
    names = [m.name for m in members]
    setups = headroom_setups(names, methods, which, configs, calibrated=calibrate > 0)
    weights, drafters, calibration, preferences = {}, {}, {}, {}
    ensembles = {}
    for setup in setups:  # self_preference="builtin" measures while the ensemble is built
        started = time.perf_counter()
        ensembles[setup.label] = ensemble_for(members, setup)
        if ensembles[setup.label].summary()["self_preference"]:
            calibration[setup.label] = time.perf_counter() - started
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    prompts = _calibration_prompts(source, form, calibrate, warmup_seed)
    bar = _bar(progress, len(setups) * (warmup + 1), "warm-up")
    for setup in setups:
        ensemble = ensembles[setup.label]
        if setup.label.endswith(CALIBRATED):  # label-free trust, measured once and frozen
            started = time.perf_counter()
            ensemble.calibrate(prompts)
            calibration[setup.label] = time.perf_counter() - started
        elif warm_task and len(ensemble.members) > 1:
            ensemble.learn_weights = True  # the warm-up learns the member weights...
            for messages, _ in warm_task.items:
                ensemble.generate(messages, setup.config(config))
                _tick(bar)
            ensemble.learn_weights = False  # ...then they stay: each answer its problem's
        preferences[setup.label] = ensemble.summary()["self_preference"]
        moved = len(set(ensemble.member_weights.values())) > 1
        weights[setup.label] = ensemble.member_weights if moved else None
        # one untimed request (lazy inits, allocator); the drafter is the first member started
        first = ensemble.generate(task.items[0][0], GenerationConfig(max_new_tokens=8))
        drafters[setup.label] = names.index(next(iter(first.stats.prompt_tokens)))
        _tick(bar)
    _close(bar)
    records: dict[str, list[Record]] = {s.label: [] for s in setups}
    bar = _bar(progress, len(task.items), "problems")
    for index, (messages, check) in enumerate(task.items):
        for setup in setups[index % len(setups) :] + setups[: index % len(setups)]:
            seeded = setup.config(replace(config, seed=seed + index))
            record, _ = run_one(ensembles[setup.label], messages, seeded, check)
            records[setup.label].append(record)
        _tick(bar)
    _close(bar)
    rows = summarise(setups, records, len(members))
    _headroom_columns(rows, setups, records, names, weights, drafters)
    for row in rows:
        row["calibration_seconds"] = calibration.get(row["label"])
        row["self_preference"] = preferences.get(row["label"])
    result = {
        "command": command,
        "task": task.name,
        "problems": len(task.items),
        "seed": seed,
        "warmup": {"problems": warmup, "seed": warmup_seed},
        "calibration": {
            "problems": calibrate,
            "seed": warmup_seed,
            "split": task.name if source == "real" else "train",
        },
        "max_new_tokens": max_new_tokens,
        "members": names,
        "dtype": str(getattr(members[0], "dtype", "")).removeprefix("torch."),
        "rows": rows,
        "per_problem": {label: [asdict(r) for r in rs] for label, rs in records.items()},
    }
    return write_results(out, result, markdown(rows, names, warmup, warmup_seed, calibrate))


def _calibration_prompts(source: str, form: str | None, n: int, seed: int) -> list:
    """`Ensemble.calibrate`'s prompts, no measured problem and no label used: n problems of
    `seed`, the real task's of the measured form (`source="real"`), else the shipped
    testbed's chain-of-thought training problems."""
    if not n:
        return []
    if source == "real":
        return [messages for messages, _ in load_task(source, n, seed, form).items]
    from core.testbed import make_problems

    return [p.messages for p in make_problems(n, seed=seed, split="train")]


def _headroom_columns(rows, setups, records, names, weights, drafters) -> None:
    """Ceiling, gap closed, × drafter (the member that drafted), weights, per row."""
    right = {
        s.chosen(len(names))[0]: [bool(r.correct) for r in records[s.label]]
        for s in setups
        if s.method == "single"
    }
    alone = {s.chosen(len(names))[0]: row for s, row in zip(setups, rows, strict=True)
             if s.method == "single"}  # fmt: skip
    for setup, row in zip(setups, rows, strict=True):
        chosen = setup.chosen(len(names))
        per_problem = list(zip(*(right[i] for i in chosen if i in right), strict=True))
        ceiling = sum(any(p) for p in per_problem) / len(per_problem) if per_problem else None
        best = max((alone[i]["accuracy"] for i in chosen if i in alone), default=None)
        row["ceiling"], row["best_single"] = ceiling, best
        gap = None if ceiling is None or best is None else ceiling - best
        row["gap_closed"] = (row["accuracy"] - best) / gap if gap else None
        best_member = max((i for i in chosen if i in alone), key=lambda i: alone[i]["accuracy"])
        mine_right = [bool(r.correct) for r in records[setup.label]]
        row["vs_best"] = paired(mine_right, right[best_member])
        drafter = chosen[0] if setup.method == "single" else drafters[setup.label]
        row["drafter"] = names[drafter]
        mine, its = row["ms_per_token"], alone.get(drafter, {}).get("ms_per_token")
        row["ratio_to_drafter"] = mine / its if mine and its else None
        row["weights"] = weights[setup.label]


def paired(mine: Sequence[bool], theirs: Sequence[bool]) -> dict[str, float | int]:
    """The paired difference of two rows on the same problems: the problems one gets right and
    the other wrong (won, lost), the difference in accuracy and its standard error
    (sqrt(won + lost - (won - lost)² / n) / n, as McNemar's test reads the discordant pairs):
    rows differ beyond their noise where the difference is about twice its standard error."""
    n = len(mine)
    won = sum(a and not b for a, b in zip(mine, theirs, strict=True))
    lost = sum(b and not a for a, b in zip(mine, theirs, strict=True))
    diff = (won - lost) / n if n else 0.0
    se = max(won + lost - n * diff * diff, 0.0) ** 0.5 / n if n else 0.0
    return {"won": won, "lost": lost, "difference": diff, "standard_error": se}


def markdown(
    rows: list[dict], names: Sequence[str], warmup: int, warmup_seed: int, calibrate: int = 0
) -> str:
    learned = [f"{warmup} warm-up problems"] * bool(warmup) + [f"calibrated on {calibrate}"] * bool(
        calibrate
    )
    weights = f"weights ({', '.join(learned)}; seed {warmup_seed})" if learned else "weights"
    head = [
        "configuration", "accuracy", "ceiling", "gap closed", "vs best member (paired)",
        "× drafter", "× fastest single", "E/T", weights,
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def pct(value) -> str:
        return "–" if value is None else f"{100 * value:.1f} %"

    def ratio(value) -> str:
        return "–" if value is None else f"{value:.2f}"

    for r in rows:
        weights = r["weights"]
        shown = ", ".join(f"{short(k)} {v:.2f}" for k, v in weights.items()) if weights else "equal"
        shown = "–" if r["method"] == "single" else shown
        if r.get("self_preference"):  # SpecEM's and rerank's calibrated self-preference
            margins = r["self_preference"]["margins"].items()
            shown += "; self-preference " + ", ".join(f"{short(k)} {v:.2f}" for k, v in margins)
        if r.get("calibration_seconds") is not None:
            shown += f" ({r['calibration_seconds']:.0f} s to calibrate)"
        gap = "–" if r["method"] == "single" else pct(r["gap_closed"])
        vs = r["vs_best"]
        versus = (
            "–"
            if r["method"] == "single"
            else (
                f"{100 * vs['difference']:+.1f} ± {100 * vs['standard_error']:.1f} "
                f"(+{vs['won']} −{vs['lost']})"
            )
        )
        cells = [
            r["label"], pct(r["accuracy"]), "–" if r["method"] == "single" else pct(r["ceiling"]),
            gap, versus, f"{ratio(r['ratio_to_drafter'])} ({short(r['drafter'])})",
            ratio(r["ratio_to_fastest_single"]), pct(r["ensemble_rate"]), shown,
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _bar(progress: bool, total: int, desc: str):
    if not progress:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="request" if desc == "warm-up" else "problem")


def _tick(bar) -> None:
    if bar is not None:
        bar.update(1)


def _close(bar) -> None:
    if bar is not None:
        bar.close()
