"""SpecEM measurements in ONE run, configurations interleaved on the same problems.

    python bench/specem_measure.py --problems 200 --out bench/results/specem-table.md

1. Accuracy and speed on held-out testbed problems (greedy): each shipped model alone
   (`single`), SpecEM with online feedback on and off; time per output token relative to the
   fastest single model, time to the first streamed delta.
2. KV reuse at 512 output tokens: SpecEM as shipped vs `reuse_cache=False` (every member's cache
   dropped before drafting and before verifying, the authors' cost profile), same requests, same
   code path. The trained models end their answers after ~30 tokens, so this part runs random-
   init members of the SAME architectures and tokenizers (speed does not depend on the weights'
   values), sampled with fixed seeds so both modes produce the same 512 tokens.

Ratios are measured side by side in one run; absolute times depend on the (shared) CPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from core import Ensemble, GenerationConfig, HFMember
from core.testbed import MODEL_ORDER, check_answer, make_problems, model_paths, random_model
from core.testbed.models import MEMBERS


def quality_run(n: int, max_new_tokens: int, recompute_every: int) -> tuple[list[dict], dict]:
    members = [HFMember.load(p, device="cpu") for p in model_paths()]
    configs = {m.name: Ensemble(members, "single", member=i) for i, m in enumerate(members)}
    configs["specem"] = Ensemble(members, "specem")
    configs["specem, feedback off"] = Ensemble(members, "specem", feedback=False)
    recompute = Ensemble(members, "specem", reuse_cache=False)
    runs = {name: [] for name in [*configs, "specem, recompute caches"]}
    problems = make_problems(n, seed=1, form="cot", split="test")
    order = list(configs)
    for i, problem in enumerate(problems):
        turn = order[i % len(order) :] + order[: i % len(order)]  # rotate who runs first
        todo = [(name, configs[name]) for name in turn]
        if recompute_every and i % recompute_every == 0:
            todo.append(("specem, recompute caches", recompute))
        for name, ens in todo:
            out = ens.generate(problem.messages, max_new_tokens=max_new_tokens)
            runs[name].append(
                {
                    "right": check_answer(out.text, problem),
                    "tokens": out.stats.tokens,
                    "seconds": out.stats.seconds,
                    "first": out.stats.first_delta_seconds or out.stats.seconds,
                    "rounds": out.stats.counts.get("rounds", 0),
                    "ensembled": out.stats.ensembled,
                    "problem": i,
                }
            )
        if (i + 1) % 20 == 0:
            print(f"  {i + 1}/{n} problems", flush=True)
    rows = []
    for name, results in runs.items():
        if not results:
            continue
        tokens = sum(r["tokens"] for r in results)
        rows.append(
            {
                "config": name,
                "n": len(results),
                "accuracy": sum(r["right"] for r in results) / len(results),
                "ms_per_token": 1000 * sum(r["seconds"] for r in results) / tokens,
                "first_ms": 1000 * statistics.median(r["first"] for r in results),
                "tokens": tokens / len(results),
                "rounds": sum(r["rounds"] for r in results) / len(results),
                "verified": sum(r["ensembled"] for r in results)
                / max(sum(r["rounds"] for r in results), 1),
            }
        )
    # the recompute baseline on the same problems as specem, for a short-answer ratio
    subset = {r["problem"] for r in runs["specem, recompute caches"]}
    same = [r for r in runs["specem"] if r["problem"] in subset]
    short = {
        "reuse_s": sum(r["seconds"] for r in same),
        "recompute_s": sum(r["seconds"] for r in runs["specem, recompute caches"]),
        "n": len(subset),
    }
    return rows, short


KV_SHAPES = {  # label -> random_model overrides per testbed member (None: the shipped shape)
    "shipped shapes": None,
    "hidden 384, 6 layers": dict(
        hidden_size=384, num_layers=6, num_heads=6, num_kv_heads=6, intermediate_size=1536
    ),
}


def kv_run(requests: int, tokens: int) -> list[dict]:
    """Reuse vs recompute on random-init members that cannot stop (stop ids emptied: the
    trained models end after ~30 tokens), sampled with fixed seeds: both modes write the same
    `tokens` tokens, which the run checks."""
    root = Path(tempfile.mkdtemp(prefix="specem-kv-"))
    prompt = [{"role": "user", "content": "Write a long story about Tom and his 7 apples."}]
    results = []
    for label, shape in KV_SHAPES.items():
        members = []
        for i, name in enumerate(MODEL_ORDER):
            overrides = dict(MEMBERS[name].shape if shape is None else shape)
            if MEMBERS[name].model_type == "gpt2":
                overrides.pop("num_kv_heads", None)
            path = random_model(name, root / f"{len(results)}-{name}", seed=i, **overrides)
            members.append(HFMember.load(path, device="cpu"))
            members[-1].stop_ids = frozenset()  # run to the length: speed does not depend on it
        modes = {
            "reuse": Ensemble(members, "specem"),
            "recompute": Ensemble(members, "specem", reuse_cache=False),
        }
        seconds = {"reuse": 0.0, "recompute": 0.0}
        for r in range(requests):
            config = GenerationConfig(max_new_tokens=tokens, temperature=1.0, seed=r + 1)
            texts = {}
            for mode in list(modes)[:: 1 if r % 2 else -1]:  # alternate who goes first
                out = modes[mode].generate(prompt, config)
                assert out.stats.tokens == tokens, (mode, out.stats.tokens)
                seconds[mode] += out.stats.seconds
                texts[mode] = out.text
            assert texts["reuse"] == texts["recompute"], "both modes must write the same text"
        params = sum(p.numel() for m in members for p in m.model.parameters()) / len(members)
        results.append({"label": label, "requests": requests, "params": params, **seconds})
        print(
            f"  {label}: reuse {seconds['reuse']:.1f} s, recompute {seconds['recompute']:.1f} s",
            flush=True,
        )
    return results


def table(rows: list[dict], short: dict, kv: list[dict], args) -> str:
    fastest = min(r["ms_per_token"] for r in rows if not r["config"].startswith("specem"))
    lines = [
        f'Held-out testbed problems (`make_problems({args.problems}, seed=1, form="cot", '
        f'split="test")`), greedy, max_new_tokens={args.max_new_tokens}, CPU '
        f"({torch.get_num_threads()} torch threads, shared with other jobs: read the ratios).",
        "",
        "| configuration | problems | accuracy | time / output token (x fastest single) "
        "| time to first delta (median) | output tokens (mean) | rounds (mean) | rounds verified |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        specem = r["config"].startswith("specem")
        lines.append(
            f"| {r['config']} | {r['n']} | {r['accuracy']:.1%} | {r['ms_per_token']:.1f} ms "
            f"({r['ms_per_token'] / fastest:.2f}x) | {r['first_ms']:.0f} ms | {r['tokens']:.1f} | "
            + (f"{r['rounds']:.1f} | {r['verified']:.0%} |" if specem else "- | - |")
        )
    lines += [
        "",
        "KV reuse (SpecEM, 3 members, segment_tokens=10), same requests in both modes:",
        "",
        "| output tokens | requests | members | reuse caches | recompute caches every round "
        "| speed-up |",
        "|---|---|---|---|---|---|",
        *(
            f"| {args.kv_tokens} | {k['requests']} | {k['label']} ({k['params'] / 1e6:.1f}M params "
            "each), random weights | "
            f"{k['reuse']:.1f} s | {k['recompute']:.1f} s | "
            f"{k['recompute'] / max(k['reuse'], 1e-9):.2f}x |"
            for k in kv
        ),
        f"| ~{statistics.mean(r['tokens'] for r in rows if r['config'] == 'specem'):.0f} "
        f"(the answers) | {short['n']} | shipped models | {short['reuse_s']:.1f} s | "
        f"{short['recompute_s']:.1f} s | "
        f"{short['recompute_s'] / max(short['reuse_s'], 1e-9):.2f}x |",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--recompute-every", type=int, default=10)
    parser.add_argument("--kv-requests", type=int, default=1)
    parser.add_argument("--kv-tokens", type=int, default=512)
    parser.add_argument("--out", type=Path, default=Path("bench/results/specem-table.md"))
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (tiny models: 1 is fastest)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)  # tiny matmuls: more threads only add contention
    started = time.time()
    print("quality and speed:", flush=True)
    rows, short = quality_run(args.problems, args.max_new_tokens, args.recompute_every)
    print("KV reuse:", flush=True)
    kv = kv_run(args.kv_requests, args.kv_tokens)
    text = table(rows, short, kv, args)
    text += f"\nCommand: `python bench/specem_measure.py --problems {args.problems}`"
    text += f" ({time.time() - started:.0f} s in all).\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
