"""`linear` against the few-row kernel (`core.few_rows`), side by side: output heads, then whole
passes of the real pair.

Heads: for each head shape (the real pair's, and a 32k x 256 one just above the size from which
the engine takes the kernel; random weights of those sizes) and each number of rows, the median
time of each kernel's product, the two alternating in one run, their ratio, and the largest
difference between their results. Passes (where the `real` extra is installed, float32): each
real member as the library loads it, over a cached 32-token prompt, a pass of 1-8 new positions
(a decoding step, a verifier's pass over a draft) with every layer on `linear`, then with the
kernels the library gave it, alternating; the largest difference between their logits.

    python -m lab.scripts.few_row_kernels [--dtype float32] [--repeats 9] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from core.few_rows import FEW_ROWS, WIDE_HEAD, FewRowLinear

if TYPE_CHECKING:
    from core import HFMember

SHAPES = {"Gemma-3-270M": (262_144, 640), "SmolLM2-135M": (49_152, 576), "32k x 256": (32_000, 256)}
ROWS = (1, 2, 3, 5, 8, 16, 32)
PASS_ROWS = (1, 2, 3, 5, 6, 8)
PROMPT = (
    "Answer in one short sentence. A farmer has 17 sheep and buys 5 more, then sells 3 of them"
    " at the market on Tuesday. How many sheep does the farmer have now?"
)


def _medians_ms(runs: tuple[Callable[[], object], ...], repeats: int) -> list[float]:
    """Median ms of each run, alternating, so load hits all of them; the first is a warm-up."""
    times: list[list[float]] = [[] for _ in runs]
    for repeat in range(repeats + 1):
        for run, kept in zip(runs, times, strict=True):
            start = time.perf_counter()
            run()
            if repeat:
                kept.append(time.perf_counter() - start)
    return [1000 * statistics.median(kept) for kept in times]


def heads(dtype: torch.dtype, repeats: int) -> None:
    print(f"{'head':>14} {'rows':>4} {'linear ms':>10} {'few-row ms':>10} {'ratio':>6}  max |diff|")
    generator = torch.Generator().manual_seed(0)
    for name, (vocab, width) in SHAPES.items():
        head = FewRowLinear(width, vocab, bias=False, dtype=dtype)
        with torch.no_grad():
            head.weight.copy_(torch.randn(vocab, width, generator=generator) / width**0.5)
            for rows in ROWS:
                hidden = torch.randn(1, rows, width, generator=generator).to(dtype)
                plain, few = _medians_ms(
                    (partial(F.linear, hidden, head.weight), partial(head, hidden)), repeats
                )
                diff = (head(hidden) - F.linear(hidden, head.weight)).abs().max().item()
                taken = rows in FEW_ROWS and dtype == torch.float32 and vocab * width >= WIDE_HEAD
                kernel = "" if taken else " (the engine keeps linear)"
                print(
                    f"{name:>14} {rows:>4} {plain:>10.2f} {few:>10.2f} {few / plain:>6.2f}"
                    f"  {diff:.1e}{kernel}"
                )


@contextmanager
def _plain_linear(model: nn.Module) -> Iterator[None]:
    """Every few-row layer of `model` back on `linear` for the duration."""
    layers = [layer for layer in model.modules() if type(layer) is FewRowLinear]
    for layer in layers:
        layer.__class__ = nn.Linear
    try:
        yield
    finally:
        for layer in layers:
            layer.__class__ = FewRowLinear


def passes(repeats: int) -> None:
    from core import HFMember
    from core.testbed.real_models import real_members, real_models_available

    if not real_models_available():
        print("passes: the real extra is not installed; skipped")
        return
    header = f"{'member':>22} {'rows':>4} {'linear ms':>10} {'few-row ms':>10} {'ratio':>6}"
    print(f"{header}  max |diff|")
    for spec in real_members():
        _member_passes(HFMember.load(spec, device="cpu", dtype="float32"), repeats)


def _member_passes(member: HFMember, repeats: int) -> None:
    from transformers import DynamicCache

    model, ids = member.model, member.tokenizer.encode(PROMPT)[:32]
    cache = DynamicCache(config=model.config)

    def run(new: torch.Tensor) -> torch.Tensor:
        logits = model(new, past_key_values=cache, use_cache=True).logits
        cache.crop(-new.shape[1])
        return logits

    def plain(new: torch.Tensor) -> torch.Tensor:
        with _plain_linear(model):
            return run(new)

    with torch.no_grad():
        model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        for rows in PASS_ROWS:
            new = torch.tensor([ids[:rows]])
            linear_ms, few_ms = _medians_ms((partial(plain, new), partial(run, new)), repeats)
            diff = (run(new) - plain(new)).abs().max().item()
            print(
                f"{member.name:>22} {rows:>4} {linear_ms:>10.1f} {few_ms:>10.1f}"
                f" {few_ms / linear_ms:>6.2f}  {diff:.1e}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.dtype}")
    heads(dtype, args.repeats)
    if dtype == torch.float32:
        passes(args.repeats)


if __name__ == "__main__":
    main()
