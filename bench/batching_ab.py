"""The forward-pass batcher of an earlier commit against the current one, side by side in one run.

    python bench/batching_ab.py [--before COMMIT] [--n 64] [--concurrency 1,2,4,8,16]

`core/batching.py` as it was at COMMIT (read with `git show`) runs the "before" blocks: its
batch assembly and its gathering (request threads are not counted for it, and passes of several
models do not take turns). Everything else is the current code. Every chunk of problems runs at
every level for every method under both batchers, in alternating order, so machine noise hits
them alike (`core.bench.concurrency` does the measuring). Prints a Markdown table; the texts of
the two batchers must be the same.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from core import batching  # noqa: E402
from core.bench.concurrency import ForwardClock, run_block, summarise  # noqa: E402
from core.bench.setups import ensemble_for, load_members, load_task, method_setups  # noqa: E402
from core.config import GenerationConfig  # noqa: E402

BEFORE = "7bb7760"  # the batcher before counting request threads and taking turns per device


def load_before(commit: str):
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{commit}:core/batching.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "batching_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("core.batching_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.Batcher


@contextlib.contextmanager
def _uncounted(self):
    yield


METHODS = ("_serve", "_gather", "_run_many", "_padded_past")


def behaviour(batcher_class) -> dict:
    """The batcher's methods that differ between the versions (as stored on the class)."""
    return {name: batcher_class.__dict__[name] for name in METHODS}


def use(variant: str, old: dict, current: dict) -> None:
    """Swap the batcher's behaviour between the two versions (before: no thread counting)."""
    for name, method in (old if variant == "before" else current).items():
        setattr(batching.Batcher, name, method)
    batching.RequestThreads.running = _uncounted if variant == "before" else current_running


current_running = batching.RequestThreads.running


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--concurrency", default="1,2,4,8,16")
    parser.add_argument("--methods", default="single,token,safe,specem")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    old, current = behaviour(load_before(args.before)), behaviour(batching.Batcher)
    levels = sorted({int(x) for x in args.concurrency.split(",")})
    members = load_members(None)
    setups = method_setups(args.methods.split(","), len(members), (), [m.name for m in members])
    items = [messages for messages, _ in load_task("arithmetic", args.n, 1).items]
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    ensembles = {
        s.label: ensemble_for(members, s, max_concurrency=levels[-1], prefix_reuse=False)
        for s in setups
    }
    clock = ForwardClock(members)
    numbered = list(enumerate(items))
    chunks = [numbered[i : i + 2 * levels[-1]] for i in range(0, len(numbered), 2 * levels[-1])]
    variants = ("before", "after")
    for variant in variants:  # untimed warm-up of both
        use(variant, old, current)
        for s in setups:
            run_block(ensembles[s.label], numbered[: levels[-1]], levels[-1], config, clock,
                      s.label, -1)  # fmt: skip
    blocks = {v: [] for v in variants}
    samples = {v: [] for v in variants}
    load = os.getloadavg()[0]
    for c, part in enumerate(chunks):
        for s in setups:
            for i, level in enumerate(levels):
                for variant in variants if (c + i) % 2 == 0 else variants[::-1]:
                    use(variant, old, current)
                    block, got = run_block(ensembles[s.label], part, level, config, clock,
                                           s.label, c)  # fmt: skip
                    blocks[variant].append(block)
                    samples[variant].extend(got)
    use("after", old, current)
    clock.remove()
    rows = {v: summarise(setups, levels, blocks[v], samples[v]) for v in variants}
    print(f"{len(items)} problems, before = core/batching.py at {args.before}; load average "
          f"{load:.2f} before, {os.getloadavg()[0]:.2f} after\n")  # fmt: skip
    print("| configuration | concurrent | batcher | tokens/s | × one at a time | p50 ms | × "
          "| rows/pass | tokens/CPU-s |")  # fmt: skip
    print("|" + "---|" * 9)
    for pair in zip(rows["before"], rows["after"], strict=True):
        for variant, r in zip(variants, pair, strict=True):
            per_pass = ", ".join(f"{x:.1f}" for x in r["rows_per_pass"].values())
            print(
                f"| {r['label']} | {r['level']} | {variant} | {r['tokens_per_s']:.0f} | "
                f"{r['throughput_ratio']:.2f} | {r['p50_ms']:.0f} | {r['p50_ratio']:.2f} | "
                f"{per_pass} | {r['tokens_per_cpu_s']:.0f} |"
            )
    texts = {v: {(s.label, s.level, s.problem): s.text for s in samples[v]} for v in variants}
    same = [text == texts["after"][key] for key, text in texts["before"].items()]
    print(f"\nsame text under both batchers: {sum(same)}/{len(same)}")


if __name__ == "__main__":
    main()
