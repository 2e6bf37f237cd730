"""The output head's product, `linear` against the few-row kernel (`core.head`), side by side.

For each head shape (the real pair's, and a 32k x 256 one just above the size from which the
engine takes the few-row kernel; random weights of those sizes) and each number of rows, the
median time of each kernel's product, the two alternating in one run, their ratio, and the
largest difference between their results.

    python -m lab.scripts.head_kernels [--dtype float32] [--repeats 9] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from core.head import FEW_ROWS, WIDE_HEAD, FewRowHead

SHAPES = {"Gemma-3-270M": (262_144, 640), "SmolLM2-135M": (49_152, 576), "32k x 256": (32_000, 256)}
ROWS = (1, 2, 3, 5, 8, 16, 32)


def _medians_ms(head: FewRowHead, hidden: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Median ms of `linear` and of the head's own product, alternating, so load hits both."""
    runs = (lambda: F.linear(hidden, head.weight), lambda: head(hidden))
    times: tuple[list[float], list[float]] = ([], [])
    for repeat in range(repeats + 1):
        for run, kept in zip(runs, times, strict=True):
            start = time.perf_counter()
            run()
            if repeat:  # the first is a warm-up
                kept.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[0]), 1000 * statistics.median(times[1])


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
    print(f"{'head':>14} {'rows':>4} {'linear ms':>10} {'few-row ms':>10} {'ratio':>6}  max |diff|")
    generator = torch.Generator().manual_seed(0)
    for name, (vocab, width) in SHAPES.items():
        head = FewRowHead(width, vocab, bias=False, dtype=dtype)
        with torch.no_grad():
            head.weight.copy_(torch.randn(vocab, width, generator=generator) / width**0.5)
            for rows in ROWS:
                hidden = torch.randn(1, rows, width, generator=generator).to(dtype)
                plain, few = _medians_ms(head, hidden, args.repeats)
                diff = (head(hidden) - F.linear(hidden, head.weight)).abs().max().item()
                taken = rows in FEW_ROWS and dtype == torch.float32 and vocab * width >= WIDE_HEAD
                kernel = "" if taken else " (the engine keeps linear)"
                print(
                    f"{name:>14} {rows:>4} {plain:>10.2f} {few:>10.2f} {few / plain:>6.2f}"
                    f"  {diff:.1e}{kernel}"
                )


if __name__ == "__main__":
    main()
