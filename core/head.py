"""The output head's product for a few rows, in the kernel that is fast on a CPU.

A decoding step applies the model's output head to one position, a verifier's pass over a short
draft to 2-8. On a CPU, torch's float32 `linear` (input @ weight.T) is slow for so few rows of a
head much wider than it is deep: on Gemma-3's 262,144 x 640 head, 2-8 rows take 70-135 ms,
against 15-45 ms for the same product written as weight @ input.T, which runs as a matrix
product over the vocabulary; one row takes 45 ms as `linear` (a matrix-vector kernel) and about
half as two rows, the second zeros (`python -m lab.scripts.head_kernels` times both, side by
side). More rows, other dtypes (bfloat16's `linear` is the faster one) and GPUs keep `linear`.
The product sums in another order, so logits differ in the last bits (about 1e-6 relative).
"""

from __future__ import annotations

import torch
from torch import nn

FEW_ROWS = range(1, 9)  # positions per head product that take the weight-on-the-left kernel
WIDE_HEAD = 1 << 22  # weights (16 MiB in float32) from which a head's time is in its weights


class FewRowHead(nn.Linear):
    """An `nn.Linear` output head (same parameters, same names, ties kept) whose product for a
    few float32 rows on a CPU runs as weight @ input.T."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        width = hidden.shape[-1]
        rows = hidden.numel() // width if width else 0
        weight = self.weight
        if rows not in FEW_ROWS or weight.device.type != "cpu" or weight.dtype != torch.float32:
            return super().forward(hidden)
        if hidden.dtype != weight.dtype:  # as linear would refuse it: let it say so
            return super().forward(hidden)
        flat = hidden.reshape(rows, width)
        if rows == 1:  # as two rows (the second zeros): the one-row kernel is slower than that
            flat = torch.cat([flat, flat.new_zeros(1, width)])
        logits = (weight @ flat.T).T[:rows]
        if self.bias is not None:
            logits = logits + self.bias
        return logits.contiguous().reshape(*hidden.shape[:-1], weight.shape[0])


def use_few_row_head(model: nn.Module) -> None:
    """Give a model this library loaded the few-row head kernel, in place. A small head (whose
    product costs microseconds either way, where the extra call would show) and a head that is
    not a plain `nn.Linear` (a quantized or custom layer) are left as they are."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is nn.Linear and head.weight.numel() >= WIDE_HEAD:
        head.__class__ = FewRowHead
