"""Benchmark: many requests at once on one loaded ensemble, against the same requests one at a
time (`python -m lab bench --concurrency 1,2,4,8,16`), and against what the bare models reach.

The problems are cut into chunks; every chunk runs at every concurrency level, for every
configuration, levels and configurations in a rotating order, so machine noise hits them alike.
A level of c runs the chunk's requests on c threads, each taking the next request when its own
is done (no request waits for a slot: `max_concurrency` is the highest level). Level 1 is the
same requests one at a time, and every ratio is to it, from the same run. Prefix reuse is off,
so every level does the same work: what is measured is what concurrent requests gain from
sharing forward passes.

The bound: the same requests through each member's bare model (`AutoModelForCausalLM` with a
`DynamicCache`, greedy): a prefill and `max_new_tokens - 1` decode steps, one request at a time
and in batches of each level (left-padded, as `generate` batches), timed in the same rotation.
A configuration's bound at a level is its members' bare time one at a time over their bare time
in batches; the engine's "of bound" is its own speed-up over that. `--prompt-tokens N` pads the
testbed's RAG prompts with more retrieved passages to about N tokens (a real RAG query's length).

Besides throughput and latency, each level records why it is what it is: how many requests'
passes the batcher of each model ran together (`Batcher.batches` and `.rows`), the share of the
wall time spent inside the models' forward passes (the rest is Python around them, which threads
cannot overlap: one interpreter lock), and the CPU cores the process used. And whether every
request wrote exactly the text it wrote alone; where not, the first differing token and the
drafter's log-prob gap between the two choices there.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.chat import normalize_messages
from core.config import GenerationConfig
from core.ensemble import Ensemble
from core.errors import InvalidConfigError
from core.hf_member import HFMember
from core.member import Member

from .report import pyplot, save_figure, write_results
from .setups import Setup, ensemble_for

GOAL_LEVEL = 8  # the level the goals below are stated at
GOAL_OF_BOUND = 0.85  # speed-up at GOAL_LEVEL over one at a time, as a share of the bare bound
GOAL_P50 = 1.2  # p50 latency at GOAL_LEVEL, times the bare models' time for a batch of that size


def positive_counts(text: str) -> list[int]:
    """Comma-separated counts, distinct and sorted; [] when one is not a positive integer."""
    try:
        counts = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        return []
    return counts if counts and counts[0] >= 1 else []


def parse_levels(text: str) -> list[int]:
    """`--concurrency 1,2,4,8,16`: distinct positive levels, 1 among them (the reference)."""
    levels = positive_counts(text)
    if 1 not in levels:
        raise InvalidConfigError(
            f"--concurrency {text!r}: give comma-separated request counts including 1 (the "
            "one-at-a-time reference), e.g. --concurrency 1,2,4,8,16."
        )
    return levels


class ForwardClock:
    """Seconds spent inside each model's forward passes (hooks on the models). A model runs one
    pass at a time (its batcher serialises them), so one start time per model suffices."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.seconds: dict[str, float] = {}
        self._handles = []
        self._started: dict[int, float] = {}
        for member in members:
            model = getattr(member, "model", None)
            if model is None or member.name in self.seconds:
                continue
            self.seconds[member.name] = 0.0
            self._handles.append(model.register_forward_pre_hook(self._start))
            self._handles.append(model.register_forward_hook(self._stop(member.name)))

    def _start(self, module, _args) -> None:
        self._started[id(module)] = time.perf_counter()

    def _stop(self, name: str):
        def stop(module, _args, _output) -> None:
            self.seconds[name] += time.perf_counter() - self._started.pop(id(module))

        return stop

    def total(self) -> float:
        return sum(self.seconds.values())

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Block:
    """One chunk of problems at one level for one configuration."""

    label: str
    level: int
    chunk: int
    wall: float
    cpu: float  # process CPU seconds (all threads)
    forward: float  # seconds inside the models' forward passes
    tokens: int
    batches: dict[str, int] = field(default_factory=dict)  # per model: passes run
    rows: dict[str, int] = field(default_factory=dict)  # per model: requests' passes served


@dataclass
class Sample:
    label: str
    level: int
    problem: int
    seconds: float
    tokens: int
    text: str
    finish_reason: str


def pad_context(messages: list[dict], tokens: int, member: Member, seed: int) -> list[dict]:
    """A testbed RAG prompt with more retrieved passages (other people's things, which do not
    change the answer) until `member` renders it in at least `tokens` tokens."""
    import random

    from core.testbed.task import FOODS, NAMES, THINGS

    marker = "---------------------\n"
    user = next((i for i, m in enumerate(messages) if marker in str(m.get("content", ""))), None)
    if user is None:
        raise InvalidConfigError(
            "--prompt-tokens pads the retrieved context of RAG prompts; add --form rag."
        )
    rng = random.Random(f"pad/{seed}")
    head, rest = messages[user]["content"].split(marker, 1)
    passages: list[str] = []
    padded = messages
    while len(member.render(normalize_messages(padded))) < tokens:
        passages += [f"{rng.choice(sorted(NAMES))} has {rng.randint(1, 9)} "
                     f"{rng.choice(FOODS + THINGS)}." for _ in range(4)]  # fmt: skip
        content = head + marker + "\n\n".join(passages) + "\n\n" + rest
        padded = [*messages[:user], {**messages[user], "content": content}, *messages[user + 1 :]]
    return padded


def bare_seconds(model, prompts: Sequence[list[int]], level: int, steps: int) -> float:
    """Seconds the bare model takes for `prompts` in batches of `level`: per batch a prefill
    (left-padded, as `generate` batches) and `steps` greedy decode steps on a DynamicCache."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    total = 0.0
    for at in range(0, len(prompts), level):
        batch = prompts[at : at + level]
        width = max(map(len, batch))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        start = time.perf_counter()
        with torch.no_grad():
            cache = DynamicCache()
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache,
                        use_cache=True, logits_to_keep=1)  # fmt: skip
            for _ in range(steps):
                token = out.logits[:, -1:].argmax(-1)
                mask = torch.cat([mask, mask.new_ones(len(batch), 1)], 1)
                positions = positions[:, -1:] + 1
                out = model(input_ids=token, attention_mask=mask, position_ids=positions,
                            cache=cache, use_cache=True)  # fmt: skip
            out.logits[:, -1].argmax(-1).tolist()  # waits for the device
        total += time.perf_counter() - start
    return total


@dataclass
class BareBlock:
    """One chunk of problems at one level through one bare model."""

    model: str
    level: int
    chunk: int
    wall: float
    batches: int


def _batchers(members: Sequence[Member]) -> dict[str, object]:
    return {m.name: m.batcher for m in members if isinstance(m, HFMember)}


def _cpu_seconds() -> float:
    return time.process_time()  # user + system CPU of this process, on every platform


def run_block(
    ensemble: Ensemble,
    items: Sequence[tuple[int, list[dict]]],
    level: int,
    config: GenerationConfig,
    clock: ForwardClock,
    label: str,
    chunk: int,
) -> tuple[Block, list[Sample]]:
    """The items' requests on `level` threads (each takes the next request when its own is
    done), timed as a whole and one by one."""
    batchers = _batchers(ensemble.members)
    before = {name: (b.batches, b.rows) for name, b in batchers.items()}
    samples: list[Sample] = []

    def one(item: tuple[int, list[dict]]) -> Sample:
        index, messages = item
        start = time.perf_counter()
        out = ensemble.generate(messages, config)
        seconds = time.perf_counter() - start
        return Sample(
            label, level, index, seconds, out.stats.tokens, out.text, out.finish_reason
        )  # fmt: skip

    forward, cpu = clock.total(), _cpu_seconds()
    start = time.perf_counter()
    with ThreadPoolExecutor(level, thread_name_prefix="bench-request") as pool:
        samples = list(pool.map(one, items))
    wall = time.perf_counter() - start
    block = Block(
        label,
        level,
        chunk,
        wall,
        _cpu_seconds() - cpu,
        clock.total() - forward,
        sum(s.tokens for s in samples),
        {name: b.batches - before[name][0] for name, b in batchers.items()},
        {name: b.rows - before[name][1] for name, b in batchers.items()},
    )
    return block, samples


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[round(q) - 1]


def first_difference(member: Member, messages: list[dict], alone: str, together: str) -> dict:
    """Where two texts of one prompt part: the first token (in `member`'s canonical ids) where
    they differ, and `member`'s log-prob gap between the two choices after the shared ids (alone
    minus together). For `single` this is the decision itself; for ensembles it is the drafter's
    view of it."""
    view = member.spawn(reuse=False)
    view.start(normalize_messages(messages))
    a, b = view.canonical_ids(alone), view.canonical_ids(together)
    shared = 0
    while shared < min(len(a), len(b)) and a[shared] == b[shared]:
        shared += 1
    found = {"shared_tokens": shared, "alone": alone, "together": together}
    if shared == min(len(a), len(b)):  # one is a prefix of the other: the turn ended early
        return found
    prefix = b"".join(view.vocab.token_bytes[i] for i in a[:shared]).decode("utf-8", "ignore")
    view.sync(prefix)
    if view.ids != a[:shared]:  # the prefix alone tokenizes differently: no clean decision point
        return found
    row = view.logprobs([shared])[0]
    found["gap"] = float(row[a[shared]] - row[b[shared]])
    found["tokens"] = [view.vocab.token_bytes[a[shared]].decode("utf-8", "replace"),
                       view.vocab.token_bytes[b[shared]].decode("utf-8", "replace")]  # fmt: skip
    return found


def summarise(
    setups: Sequence[Setup],
    levels: Sequence[int],
    blocks: Sequence[Block],
    samples: Sequence[Sample],
    bare: Sequence[BareBlock] = (),
    models: dict[str, list[str]] | None = None,
) -> list[dict]:
    """Per configuration and level: throughput, latency, batching, same text; with `bare`
    blocks, the bare models' bound (`models[label]`: the models the configuration runs)."""
    rows = []
    for setup in setups:
        mine_bare = [b for b in bare if b.model in (models or {}).get(setup.label, ())]
        bare_wall = {lv: sum(b.wall for b in mine_bare if b.level == lv) for lv in levels}
        bare_batches = {  # one batch of every model the configuration runs
            lv: sum(b.batches for b in mine_bare if b.level == lv)
            / max(1, len({b.model for b in mine_bare}))
            for lv in levels
        }
        alone = {s.problem: s for s in samples if s.label == setup.label and s.level == 1}
        base = None
        for level in levels:
            mine = [b for b in blocks if b.label == setup.label and b.level == level]
            reqs = [s for s in samples if s.label == setup.label and s.level == level]
            wall = sum(b.wall for b in mine)
            tokens = sum(b.tokens for b in mine)
            lat = [s.seconds for s in reqs]
            names = sorted({n for b in mine for n in b.batches})
            passes = {n: sum(b.batches.get(n, 0) for b in mine) for n in names}
            served = {n: sum(b.rows.get(n, 0) for b in mine) for n in names}
            row = {
                "label": setup.label,
                "method": setup.method,
                "level": level,
                "requests": len(reqs),
                "tokens": tokens,
                "wall_s": wall,
                "tokens_per_s": tokens / wall if wall else 0.0,
                "p50_ms": 1000 * _percentile(lat, 50),
                "p95_ms": 1000 * _percentile(lat, 95),
                "rows_per_pass": {
                    n: served[n] / passes[n] for n in names if passes[n]
                },  # fmt: skip
                "passes": passes,
                "forward_share": sum(b.forward for b in mine) / wall if wall else 0.0,
                "cpu_cores": sum(b.cpu for b in mine) / wall if wall else 0.0,
                "tokens_per_cpu_s": tokens / cpu if (cpu := sum(b.cpu for b in mine)) else None,
                "same_text": sum(s.text == alone[s.problem].text for s in reqs),
                "differences": [s.problem for s in reqs if s.text != alone[s.problem].text],
            }
            base = base or row
            row["throughput_ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
            row["p50_ratio"] = row["p50_ms"] / base["p50_ms"]
            row["p95_ratio"] = row["p95_ms"] / base["p95_ms"]
            row["cpu_efficiency_ratio"] = (
                row["tokens_per_cpu_s"] / base["tokens_per_cpu_s"]
                if row["tokens_per_cpu_s"] and base["tokens_per_cpu_s"]
                else None
            )
            row["bound_if_passes_were_free"] = (
                1 / (1 - base["forward_share"]) if base["forward_share"] < 1 else None
            )
            if mine_bare and bare_wall[level]:
                row["bare_bound"] = bare_wall[levels[0]] / bare_wall[level]
                row["of_bound"] = row["throughput_ratio"] / row["bare_bound"]
                row["bare_batch_ms"] = 1000 * bare_wall[level] / bare_batches[level]
                row["p50_vs_bare_batch"] = row["p50_ms"] / row["bare_batch_ms"]
            rows.append(row)
    return rows


def goals(rows: Sequence[dict]) -> list[dict]:
    """Per configuration: at GOAL_LEVEL, its speed-up as a share of the bare bound and its p50
    latency against the bare models' batch; at every level, never slower than one at a time."""
    out = []
    for row in rows:
        if row["level"] != GOAL_LEVEL or "of_bound" not in row:
            continue
        mine = [r for r in rows if r["label"] == row["label"]]
        out.append(
            {
                "label": row["label"],
                "of_bound": row["of_bound"],
                "of_bound_met": row["of_bound"] >= GOAL_OF_BOUND,
                "p50_vs_bare_batch": row["p50_vs_bare_batch"],
                "p50_met": row["p50_vs_bare_batch"] <= GOAL_P50,
                "never_slower": all(r["throughput_ratio"] >= 1.0 for r in mine),
            }
        )
    return out


def markdown(result: dict) -> str:
    rows = result["rows"]
    lines = []
    lines += [
        f"{result['problems']} problems ({result['task']}), greedy, max_new_tokens="
        f"{result['max_new_tokens']}, prompts of {result['prompt_tokens']} tokens (mean, first "
        f"member), chunks of {result['chunk']}, torch threads {result['torch_threads']}, "
        f"{result['cpus']} CPUs; load average {result['load_before'][0]:.2f} before, "
        f"{result['load_after'][0]:.2f} after.",
        "",
        "| configuration | concurrent | tokens/s | × one at a time | bare bound × | of bound "
        "| p50 ms | × | p95 ms | × | same text | rows/pass | in forward | CPU cores |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        per_pass = ", ".join(f"{v:.1f}" for v in r["rows_per_pass"].values())
        bound = f"{r['bare_bound']:.2f}" if "bare_bound" in r else "–"
        share = f"{100 * r['of_bound']:.0f} %" if "of_bound" in r else "–"
        lines.append(
            f"| {r['label']} | {r['level']} | {r['tokens_per_s']:.0f} | "
            f"{r['throughput_ratio']:.2f} | {bound} | {share} | {r['p50_ms']:.0f} | "
            f"{r['p50_ratio']:.2f} | {r['p95_ms']:.0f} | {r['p95_ratio']:.2f} | "
            f"{r['same_text']}/{r['requests']} | {per_pass} | {100 * r['forward_share']:.0f} % | "
            f"{r['cpu_cores']:.2f} |"
        )
    members = ", ".join(result["members"])
    lines += [
        "",
        "bare bound ×: the same requests through the bare models (a prefill and "
        "max_new_tokens - 1 decode steps each), one at a time over in batches of the level; of "
        "bound: the engine's × one at a time as a share of it. rows/pass: requests' passes per "
        f"forward pass, per model ({members}). in forward: share of the wall time inside the "
        "models' forward passes. CPU cores: process CPU time / wall time.",
    ]
    met = result["goals"]
    if met:
        lines += [
            "",
            f"Goals at {GOAL_LEVEL} concurrent requests: the speed-up over one at a time "
            f">= {GOAL_OF_BOUND:.0%} of the bare models' own batching speed-up (bound), p50 "
            f"latency <= {GOAL_P50:g}× the bare models' time for a batch of {GOAL_LEVEL}; at "
            "every level, never slower than one at a time.",
            "",
            "| configuration | × one at a time | bare bound × | of bound | met | p50 ms | bare "
            "batch ms | p50 / bare batch | met | never slower |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        at_goal = {r["label"]: r for r in rows if r["level"] == GOAL_LEVEL}
        for g in met:
            r = at_goal[g["label"]]
            lines.append(
                f"| {g['label']} | {r['throughput_ratio']:.2f} | {r['bare_bound']:.2f} | "
                f"{100 * g['of_bound']:.0f} % | {'yes' if g['of_bound_met'] else 'no'} | "
                f"{r['p50_ms']:.0f} | {r['bare_batch_ms']:.0f} | {g['p50_vs_bare_batch']:.2f} | "
                f"{'yes' if g['p50_met'] else 'no'} | {'yes' if g['never_slower'] else 'no'} |"
            )
    if result["differences"]:
        lines += ["", "Texts that differ from the one-at-a-time text:", ""]
        for d in result["differences"]:
            gap = d.get("gap")
            where = (
                f"drafter log-prob gap {gap:+.2e} between {d['tokens'][0]!r} (alone) and "
                f"{d['tokens'][1]!r}"
                if gap is not None
                else f"alone {d['alone']!r} / together {d['together']!r}"
            )
            lines.append(
                f"- {d['label']}, {d['level']} concurrent, problem {d['problem']}: after "
                f"{d['shared_tokens']} shared tokens, {where}"
            )
    else:
        lines += ["", "Every request wrote exactly the text it wrote alone."]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict], out: Path) -> Path:
    from matplotlib.ticker import ScalarFormatter

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in dict.fromkeys(r["label"] for r in rows):
        mine = [r for r in rows if r["label"] == label]
        levels = [r["level"] for r in mine]
        left.plot(levels, [r["tokens_per_s"] for r in mine], marker="o", label=label)
        right.plot(levels, [r.get("p50_vs_bare_batch", r["p50_ratio"]) for r in mine],
                   marker="o", label=label)  # fmt: skip
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["level"] for r in rows}))
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.set_xlabel("concurrent requests")
        ax.grid(alpha=0.3)
    left.set_ylabel("output tokens/s (all requests)")
    left.set_title("throughput")
    right.axhline(GOAL_P50, color="grey", linestyle="--", linewidth=1)
    right.set_ylabel("p50 latency / the bare models' batch")
    right.set_title(f"p50 latency against the bare batch (dashed: goal at {GOAL_LEVEL})")
    left.legend(fontsize=8)
    return save_figure(fig, out / "concurrency.png")


def run(
    *,
    members: Sequence[Member],
    setups: Sequence[Setup],
    items: Sequence[list[dict]],
    task: str,
    levels: Sequence[int],
    max_new_tokens: int = 128,
    prompt_tokens: int | None = None,
    chunk: int | None = None,
    out: str | Path = "bench-out/concurrency",
    progress: bool = True,
    command: str = "",
) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    levels = sorted(levels)
    chunk = chunk or 2 * levels[-1]
    config = GenerationConfig(max_new_tokens=max_new_tokens)
    if prompt_tokens:
        items = [pad_context(m, prompt_tokens, members[0], i) for i, m in enumerate(items)]
    ensembles = {
        s.label: ensemble_for(members, s, max_concurrency=levels[-1], prefix_reuse=False)
        for s in setups
    }
    local = {m.name: m for m in members if isinstance(m, HFMember)}
    runs = {label: [m.name for m in e.active_members if m.name in local]
            for label, e in ensembles.items()}  # fmt: skip
    prompts = {name: [m.render(normalize_messages(i)) for i in items] for name, m in local.items()}
    numbered = list(enumerate(items))
    chunks = [numbered[i : i + chunk] for i in range(0, len(numbered), chunk)]
    clock = ForwardClock(members)
    load_before = os.getloadavg()
    steps = max(0, max_new_tokens - 1)
    try:
        for label, ensemble in ensembles.items():  # untimed: lazy inits, thread start-up
            run_block(ensemble, numbered[: levels[-1]], levels[-1], config, clock, label, -1)
        for name, member in local.items():
            bare_seconds(member.model, prompts[name][: levels[-1]], levels[-1], 1)
        blocks: list[Block] = []
        bare: list[BareBlock] = []
        samples: list[Sample] = []
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(chunks) * (len(setups) + len(local)) * len(levels), desc="blocks")
        for index, part in enumerate(chunks):
            order = list(setups[index % len(setups) :]) + list(setups[: index % len(setups)])
            turn = index % len(levels)
            rotated = list(levels[turn:]) + list(levels[:turn])
            for setup in order:
                for level in rotated:
                    block, got = run_block(
                        ensembles[setup.label], part, level, config, clock, setup.label, index
                    )
                    blocks.append(block)
                    samples.extend(got)
                    if bar is not None:
                        bar.update(1)
            for name, member in local.items():
                mine = [prompts[name][i] for i, _ in part]
                for level in rotated:
                    wall = bare_seconds(member.model, mine, level, steps)
                    bare.append(BareBlock(name, level, index, wall, -(-len(mine) // level)))
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
    finally:
        clock.remove()
    load_after = os.getloadavg()
    rows = summarise(setups, levels, blocks, samples, bare, runs)
    differences = []
    for row in rows:
        for problem in row["differences"]:
            mine = {(s.level, s.problem): s for s in samples if s.label == row["label"]}
            alone, together = mine[1, problem], mine[row["level"], problem]
            drafter = ensembles[row["label"]].active_members[0]
            found = first_difference(drafter, items[problem], alone.text, together.text)
            differences.append({"label": row["label"], "level": row["level"],
                                "problem": problem, **found})  # fmt: skip
    first = next(iter(prompts.values()), [])
    result = {
        "command": command,
        "task": task,
        "problems": len(items),
        "levels": list(levels),
        "chunk": chunk,
        "max_new_tokens": max_new_tokens,
        "prompt_tokens": round(statistics.mean(map(len, first))) if first else None,
        "members": [m.name for m in members],
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "load_before": list(load_before),
        "load_after": list(load_after),
        "rows": rows,
        "goals": goals(rows),
        "differences": differences,
        "blocks": [asdict(b) for b in blocks],
        "bare_blocks": [asdict(b) for b in bare],
        "requests": [asdict(s) for s in samples if s.level == 1]
        + [{k: v for k, v in asdict(s).items() if k != "text"} for s in samples if s.level != 1],
    }
    result = write_results(out, result, markdown(result))
    result["plots"] = [str(plot(rows, out))]
    return result
