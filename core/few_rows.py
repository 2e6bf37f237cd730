"""A model's linear layers for a few rows, in the kernel that is fast on a CPU.

A decoding step runs every layer on one position, a verifier's pass over a short draft on 2-8.
On a CPU, torch's float32 `linear` (input @ weight.T) is slow for so few rows when the weights
do not stay in cache, so that their time is in reading them: the same product written as
weight @ input.T runs as a matrix product over the weight's rows, reading it once, fast. One
row takes `linear`'s matrix-vector kernel, slower than two rows (the second zeros) this way.
Measured on the real pair (`python -m lab.scripts.few_row_kernels`, both side by side,
`lab/results/few-row-kernels/`): Gemma-3's output head (262,144 x 640) 1.3-6x faster for 1-8 rows;
whole passes of 1-5 positions, every layer on `linear` against the kernels, 0.25-0.7x the time
with 2 threads, 0.45-0.85x with one. A body layer keeps `linear` from 6 rows (as fast or faster
there), a head from 9. Where the weights stay in cache (the shipped 1M-parameter models)
`linear` is the faster one, about 2.5x; other dtypes (bfloat16's `linear` is the faster one) and
GPUs keep `linear` too. The product sums in another order, so outputs differ in the last bits
(logits within about 1e-4 after 30 layers).
"""

from __future__ import annotations

import torch
from torch import nn

FEW_ROWS = range(1, 9)  # positions per head product that take the weight-on-the-left kernel
BODY_ROWS = range(1, 6)  # the same for the body's layers: at 6-8 rows `linear` is as fast or faster
WIDE_HEAD = 1 << 22  # head weights (16 MiB in float32) from which a head's time is in its weights
LARGE_BODY = 1 << 24  # body linear weights (64 MiB in float32): more than a CPU's cache holds


class FewRowLinear(nn.Linear):
    """An `nn.Linear` (same parameters, same names, ties kept) whose product for a few float32
    rows on a CPU runs as weight @ input.T."""

    few_rows: range = FEW_ROWS  # the products that take the kernel (a body layer: `BODY_ROWS`)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        width = hidden.shape[-1]
        rows = hidden.numel() // width if width else 0
        weight = self.weight
        taken = weight.device.type == "cpu" and weight.dtype == hidden.dtype == torch.float32
        if not taken or rows not in self.few_rows:  # (linear also says why a dtype mismatches)
            return super().forward(hidden)
        flat = hidden.reshape(rows, width)
        if rows == 1:  # as two rows (the second zeros): the one-row kernel is slower than that
            flat = torch.cat([flat, flat.new_zeros(1, width)])
        out = (weight @ flat.T).T[:rows]
        if self.bias is not None:
            out = out + self.bias
        return out.contiguous().reshape(*hidden.shape[:-1], weight.shape[0])


def use_few_row_kernels(model: nn.Module) -> None:
    """Give a model this library loaded the few-row kernel, in place: its output head where the
    head is wide, every other linear layer where those layers' weights together are large.
    Small weights (whose products run from cache, where `linear` is faster) and layers that are
    not a plain `nn.Linear` (quantized or custom) are left as they are."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear and head.weight.numel() >= WIDE_HEAD:
        head.__class__ = FewRowLinear
    body = [layer for layer in model.modules() if type(layer) is nn.Linear and layer is not head]
    if sum(layer.weight.numel() for layer in body) >= LARGE_BODY:
        for layer in body:
            layer.__class__ = FewRowLinear
            layer.few_rows = BODY_ROWS
