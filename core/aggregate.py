"""Combining members' distributions over the same candidate strings.

Arithmetic mean (UniTE, GaC), weighted mean (SpecEM-style voting weights, user weights) and
geometric mean (agreement-seeking: a candidate that any member finds unlikely is penalised).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MEANS = ("arithmetic", "geometric")


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
    """Weighted geometric mean, renormalised over the candidates. A candidate one member finds
    impossible is penalised, not ruled out; one that every member finds impossible (a grammar
    forbids it) keeps zero, and where no candidate is possible the result is all zeros."""
    w = normalised_weights(probs.shape[0], weights)
    log_mean = w @ torch.log(probs.clamp_min(1e-30))
    possible = (probs > 0).any(dim=0)
    if not bool(possible.any()):
        return torch.zeros_like(log_mean)
    return torch.softmax(log_mean.masked_fill(~possible, float("-inf")), dim=0)


def combine(
    probs: torch.Tensor, how: str = "arithmetic", weights: Sequence[float] | None = None
) -> torch.Tensor:
    if how == "arithmetic":
        return arithmetic_mean(probs, weights)
    if how == "geometric":
        return geometric_mean(probs, weights)
    raise ValueError(f"unknown mean {how!r}; use one of {MEANS}")


# --------------------------------------------------------------------------------------------
# SAFE's sharpening: an ensemble distribution that is "overly smooth" (its max below one half)
# usually means one word's mass is spread over several sub-word candidates ("So", "Sof",
# "Sofia") because the members split the word differently; sharpening lets the word win.

SHARPENINGS = ("heuristic", "geometric")
SMOOTH_BELOW = 0.5  # sharpen only when the arithmetic mean's max is below this


def sharpen_heuristic(
    mean: torch.Tensor,
    strings: Sequence[str],
    eligible: torch.Tensor,
    donors: torch.Tensor | None = None,
    threshold: float = 0.1,
) -> torch.Tensor:
    """Sub-word reallocation: every eligible candidate above `threshold` (SAFE: the drafter's
    top-k strings) gains the mass of each donor candidate whose string starts with it.

    As in the authors' code: raw `startswith` (leading space included), a bare " " is never a
    candidate, donors keep their mass and nothing is renormalised (only the argmax is used).
    """
    from .vocab import EOS

    out = mean.clone()
    donor_ids = range(len(strings)) if donors is None else donors.nonzero()[:, 0].tolist()
    donor_ids = [d for d in donor_ids if strings[d] != EOS]
    values = mean.tolist()
    for i in (eligible & (mean > threshold)).nonzero()[:, 0].tolist():
        s = strings[i]
        if s in (" ", EOS):
            continue
        gain = sum(values[d] for d in donor_ids if d != i and strings[d].startswith(s))
        out[i] += gain
    return out


def sharpen(
    probs: torch.Tensor,
    how: str | None,
    strings: Sequence[str],
    eligible: torch.Tensor,
    donors: torch.Tensor | None = None,
    weights: Sequence[float] | None = None,
    threshold: float = 0.1,
) -> tuple[torch.Tensor, bool]:
    """SAFE's ensemble scores: the arithmetic mean, sharpened (`how` = "heuristic" or
    "geometric", None = never) only when its max is below one half. Returns (scores, fired)."""
    mean = arithmetic_mean(probs, weights)
    if how is None or float(mean.max()) >= SMOOTH_BELOW:
        return mean, False
    if how == "geometric":
        return geometric_mean(probs, weights), True
    if how == "heuristic":
        return sharpen_heuristic(mean, strings, eligible, donors, threshold), True
    raise ValueError(f"unknown sharpening {how!r}; use one of {SHARPENINGS} or None")
