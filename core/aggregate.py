"""Combining members' distributions over the same candidate strings.

Arithmetic mean (UniTE, GaC), weighted mean (SpecEM-style voting weights, user weights) and
geometric mean (agreement-seeking: a candidate that any member finds unlikely is penalised).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

AGGREGATIONS = ("arithmetic", "geometric")


def normalised_weights(n: int, weights: Sequence[float] | None) -> torch.Tensor:
    if weights is None:
        return torch.full((n,), 1.0 / n)
    w = torch.tensor(list(weights), dtype=torch.float32)
    if w.shape != (n,) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be {n} non-negative numbers with a positive sum")
    return w / w.sum()


def arithmetic_mean(probs: torch.Tensor, weights: Sequence[float] | None = None) -> torch.Tensor:
    """probs: [members, candidates] -> [candidates]; a weighted mean when weights are given."""
    return normalised_weights(probs.shape[0], weights) @ probs


def geometric_mean(probs: torch.Tensor, weights: Sequence[float] | None = None) -> torch.Tensor:
    """Weighted geometric mean, renormalised over the candidates."""
    w = normalised_weights(probs.shape[0], weights)
    log_mean = w @ torch.log(probs.clamp_min(1e-30))
    return torch.softmax(log_mean, dim=0)


def combine(
    probs: torch.Tensor, how: str = "arithmetic", weights: Sequence[float] | None = None
) -> torch.Tensor:
    if how == "arithmetic":
        return arithmetic_mean(probs, weights)
    if how == "geometric":
        return geometric_mean(probs, weights)
    raise ValueError(f"unknown aggregation {how!r}; use one of {AGGREGATIONS}")
