"""Benchmark: every method side by side on the same problems, in one run.

Configurations are interleaved problem by problem (in a rotating order), so machine noise hits
them all alike, and every speed number is a ratio measured in this run: time per output token
relative to the drafter alone and to the fastest single model. Caches are reset before every
request, so no configuration profits from a prompt another one left in a cache.

Writes results.json (per configuration and per problem), results.md (the README table) and two
PNG plots (accuracy against time per token; E/T per configuration).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.errors import InvalidConfigError
from core.member import Member

from .report import pyplot, save_figure, write_results
from .setups import (
    Setup,
    default_models,
    ensemble_for,
    load_members,
    load_task,
    weight_bytes,
)


@dataclass
class Record:
    correct: bool | None
    tokens: int
    ensembled_tokens: int
    ensembled_rounds: int
    seconds: float
    first_delta: float | None
    memory_mb: float
    counts: dict[str, int]
    text: str  # the answer itself: two runs of one configuration compare problem by problem
    finish_reason: str = ""  # "stop", "length" (cut by the token limit), "tool_calls"


def _with_served(
    members: list[Member],
    setups: list[Setup],
    urls: list[str],
    models: Sequence[str] | None,
    shape: str | None,
) -> tuple[list[Member], list[Setup]]:
    """The in-process members plus one served copy of each (`--remote URL` per model, in
    order; the server must serve the same model), and every setup twinned onto the copies."""
    from core.remote import Remote, connect

    if shape is not None:
        raise InvalidConfigError(
            "--remote compares served models with the same models loaded "
            "here; it does not combine with --shape."
        )
    if len(urls) != len(members):
        raise InvalidConfigError(
            f"--remote was given {len(urls)} URLs for {len(members)} models; pass one server "
            "URL per model, in the order of --model (the shipped models by default)."
        )
    served = [
        connect(Remote(url, tokenizer=str(source), name=f"{member.name} (served)"))
        for url, model, member in zip(urls, models or [], members, strict=True)
        for source in [getattr(model, "path", model)]  # a Local's path, or the path itself
    ]
    return members + served, setups + served_twins(setups, len(members))


def run_one(
    ensemble: Ensemble, messages: list[dict], config: GenerationConfig, check
) -> tuple[Record, str]:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    out = ensemble.generate(messages, config)
    seconds = time.perf_counter() - start
    active = ensemble.active_members
    if torch.cuda.is_available():
        memory = torch.cuda.max_memory_allocated() / 2**20
    else:  # weights plus the caches as they stand at the end (they only grow within a request)
        memory = (sum(map(weight_bytes, active)) + out.stats.cache_bytes) / 2**20
    record = Record(
        correct=None if check is None else bool(check(out.text, cut=out.finish_reason == "length")),
        tokens=out.stats.tokens,
        ensembled_tokens=out.stats.ensembled_tokens,
        ensembled_rounds=out.stats.ensembled_rounds,
        seconds=seconds,
        first_delta=out.stats.first_delta_seconds,
        memory_mb=memory,
        counts=dict(out.stats.counts),
        text=out.text,
        finish_reason=out.finish_reason,
    )
    return record, out.text


def summarise(setups: list[Setup], records: dict[str, list[Record]], n_members: int) -> list[dict]:
    rows = []
    for setup in setups:
        rs = records[setup.label]
        tokens = sum(r.tokens for r in rs)
        seconds = sum(r.seconds for r in rs)
        firsts = [r.first_delta for r in rs if r.first_delta is not None]
        scored = [r.correct for r in rs if r.correct is not None]
        counts: dict[str, int] = {}
        for r in rs:
            for key, value in r.counts.items():
                counts[key] = counts.get(key, 0) + value
        rows.append(
            {
                "label": setup.label,
                "method": setup.method,
                "options": setup.options,
                "generation": setup.generation,
                "members": setup.members,
                "problems": len(rs),
                "accuracy": sum(scored) / len(scored) if scored else None,
                "ensemble_rate": sum(r.ensembled_tokens for r in rs) / tokens if tokens else 0.0,
                "ensembled_rounds": sum(r.ensembled_rounds for r in rs),
                "tokens": tokens,
                "tokens_per_problem": tokens / len(rs) if rs else 0.0,
                "ms_per_token": 1000 * seconds / tokens if tokens else None,
                "first_delta_ms": 1000 * sum(firsts) / len(firsts) if firsts else None,
                "peak_memory_mb": max((r.memory_mb for r in rs), default=0.0),
                "counts": counts,
                "drafter": setup.drafter(n_members),
            }
        )
    singles = {r["drafter"]: r for r in rows if r["method"] == "single"}  # by member index
    by_label = {r["label"]: r for r in rows}
    fastest = min((r["ms_per_token"] for r in singles.values() if r["ms_per_token"]), default=None)
    for row in rows:
        alone = singles.get(row["drafter"])
        per_token = row["ms_per_token"]
        row["ratio_to_drafter"] = (
            per_token / alone["ms_per_token"]
            if per_token and alone and alone["ms_per_token"]
            else None
        )
        row["ratio_to_fastest_single"] = per_token / fastest if per_token and fastest else None
    for setup in setups:
        if setup.served_twin_of:
            row, local = by_label[setup.label], by_label[setup.served_twin_of]
            row["ratio_to_in_process"] = (
                row["ms_per_token"] / local["ms_per_token"]
                if row["ms_per_token"] and local["ms_per_token"]
                else None
            )
    return rows


def served_twins(setups: list[Setup], n_local: int) -> list[Setup]:
    """`--remote`: every setup again, on the served copies of its members (indices shifted
    past the in-process ones), so both run on the same problems, interleaved, in one run."""
    return [
        replace(
            s,
            label=f"{s.label} (served)",
            members=[n_local + i for i in s.chosen(n_local)],
            served_twin_of=s.label,
        )
        for s in setups
    ]


def details(row: dict) -> str:
    """What a method did, in a few words: skip reasons (SAFE, gated GaC), SpecEM's rounds and
    the share of verified rounds each member won."""
    counts, tokens = row["counts"], max(row["tokens"], 1)
    if any(key.startswith("skip_") for key in counts):
        skips = [
            f"{name} {100 * counts.get(f'skip_{name}', 0) / tokens:.0f} %"
            for name in ("mismatch", "consensus", "gate")
        ]
        return "skips: " + ", ".join(skips)
    if "rounds" in counts:
        rounds = counts["rounds"]
        wins = sorted(
            ((k.removeprefix("won/"), v) for k, v in counts.items() if k.startswith("won/")),
            key=lambda kv: -kv[1],
        )
        verified = sum(v for _, v in wins)  # wins count verified rounds only
        won = ", ".join(f"{name} {100 * v / max(verified, 1):.0f} %" for name, v in wins)
        return (
            f"{rounds / max(row['problems'], 1):.1f} rounds/problem, verified "
            f"{100 * row['ensembled_rounds'] / max(rounds, 1):.0f} %; won: {won}"
        )
    return ""


def markdown_table(rows: list[dict], with_accuracy: bool) -> str:
    head = ["configuration"]
    head += ["accuracy"] if with_accuracy else []
    head += ["E/T", "tokens/problem", "ms/token", "× drafter", "× fastest single"]
    served = any("ratio_to_in_process" in r for r in rows)
    head += ["× in-process"] if served else []
    head += ["first delta ms", "peak MB", "details"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(value, pattern: str) -> str:
        return "–" if value is None else pattern.format(value)

    for r in rows:
        cells = [r["label"]]
        cells += [fmt(r["accuracy"] and 100 * r["accuracy"], "{:.1f} %")] if with_accuracy else []
        cells += [
            fmt(100 * r["ensemble_rate"], "{:.1f} %"),
            fmt(r["tokens_per_problem"], "{:.1f}"),
            fmt(r["ms_per_token"], "{:.2f}"),
            fmt(r["ratio_to_drafter"], "{:.2f}"),
            fmt(r["ratio_to_fastest_single"], "{:.2f}"),
            *([fmt(r.get("ratio_to_in_process"), "{:.2f}")] if served else []),
            fmt(r["first_delta_ms"], "{:.0f}"),
            fmt(r["peak_memory_mb"], "{:.1f}"),
            details(r),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], out: Path, with_accuracy: bool) -> list[Path]:
    plt = pyplot()
    paths = []
    if with_accuracy:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in rows:
            if r["ms_per_token"] is not None and r["accuracy"] is not None:
                ax.scatter(r["ms_per_token"], 100 * r["accuracy"])
                ax.annotate(r["label"], (r["ms_per_token"], 100 * r["accuracy"]), fontsize=8)
        ax.set_xlabel("wall time per output token (ms)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title("accuracy against speed")
        paths.append(save_figure(fig, out / "accuracy_vs_time.png"))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.barh([r["label"] for r in rows], [100 * r["ensemble_rate"] for r in rows])
    ax.set_xlabel("ensembled tokens / output tokens (E/T, %)")
    ax.invert_yaxis()
    paths.append(save_figure(fig, out / "ensemble_rate.png"))
    return paths


def run(
    *,
    setups_from: Callable[[list[str]], list[Setup]],
    models: Sequence[str] | None,
    task: str = "arithmetic",
    form: str | None = None,
    n: int = 200,
    seed: int = 1,
    max_new_tokens: int = 160,
    out: str | Path = "bench-out",
    device: str = "cpu",
    dtype: str = "auto",
    shape: str | None = None,
    threads: int | None = None,
    temperature: float = 0.0,
    ignore_stop: bool = False,
    remote: Sequence[str] = (),
    progress: bool = True,
    command: str = "",
) -> dict:
    out = Path(out)
    task_data = load_task(task, n, seed, form)  # bad input fails before any model loads
    if threads:
        torch.set_num_threads(threads)
    if shape is None:
        models = models or default_models(task)
    members = load_members(models, device, dtype, shape)
    names = [m.name for m in members]
    setups = setups_from(names)
    if remote:
        members, setups = _with_served(members, setups, list(remote), models, shape)
    if ignore_stop:  # speed runs of a fixed length: random weights may stop at any time
        for member in members:  # (served copies included)
            member.stop_ids = frozenset()
    ensembles = {s.label: ensemble_for(members, s) for s in setups}
    with_accuracy = shape is None
    out.mkdir(parents=True, exist_ok=True)
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=temperature)
    warm = task_data.items[0][0]
    for ensemble in ensembles.values():  # one untimed request each: lazy inits, allocator
        ensemble.generate(warm, GenerationConfig(max_new_tokens=8))
    records: dict[str, list[Record]] = {s.label: [] for s in setups}
    samples: list[dict] = []
    items = task_data.items
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="problems", unit="problem")
    for index, (messages, check) in enumerate(items):
        order = setups[index % len(setups) :] + setups[: index % len(setups)]
        sample = {"problem": index}
        for setup in order:
            # one seed per problem: sampled rows (and methods that sample inside a greedy
            # request, e.g. SpecEM's preset="paper" drafts) are reproducible
            seeded = setup.config(replace(config, seed=seed + index))
            record, text = run_one(
                ensembles[setup.label], messages, seeded, check if with_accuracy else None
            )
            records[setup.label].append(record)
            if index < 3:
                sample[setup.label] = text
        if index < 3:
            samples.append(sample)
        if bar is not None:
            bar.update(1)
            if with_accuracy:
                bar.set_postfix(
                    {
                        s.label[
                            :14
                        ]: f"{100 * sum(r.correct for r in records[s.label]) / (index + 1):.0f}"
                        for s in setups[:6]
                    }
                )
    if bar is not None:
        bar.close()
    rows = summarise(setups, records, len(members))
    result = {
        "command": command,
        "task": task_data.name,
        "problems": len(items),
        "max_new_tokens": max_new_tokens,
        "device": str(members[0].device),
        "dtype": str(members[0].dtype),
        "shape": shape,
        "temperature": temperature,
        "ignore_stop": ignore_stop,
        "members": names,
        "remote": list(remote),
        "rows": rows,
        "per_problem": {label: [asdict(r) for r in rs] for label, rs in records.items()},
        "samples": samples,
    }
    result = write_results(out, result, markdown_table(rows, with_accuracy))
    result["plots"] = [str(p) for p in plot(rows, out, with_accuracy)]
    return result
