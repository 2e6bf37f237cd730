"""OpenAI's `frequency_penalty` and `presence_penalty`, applied by each member to its own rows.

OpenAI defines both on one model's logits: a token's logit loses `frequency_penalty` for every
time the token is already in the response, and `presence_penalty` once if it is there at all.
In an ensemble the members have different vocabularies, so each member applies them with its
own tokens of the shared response, before any method reads its distribution: the draft, the
verification scores, SAFE's ensemble points and SpecEM's votes all see the penalised rows.

A log-prob row is a logit row shifted by a constant, so the penalties are subtracted from the
log-probs and the row is normalised again; raw logits (`Member.score(raw=True)`) are penalised
as OpenAI penalises them, with no normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SETTINGS = ("frequency_penalty", "presence_penalty")  # as GenerationConfig and OpenAI name them
LIMIT = 2  # OpenAI's bound on each, either side of 0


@dataclass(frozen=True)
class Penalties:
    """The two penalties of a request (each in OpenAI's -2..2; both 0 is no penalty)."""

    frequency: float = 0.0
    presence: float = 0.0

    def __bool__(self) -> bool:
        return bool(self.frequency or self.presence)

    def apply(
        self, rows: torch.Tensor, histories: Sequence[Sequence[int]], normalise: bool = True
    ) -> torch.Tensor:
        """`rows[i]` (a row over the member's vocabulary) penalised by the tokens of
        `histories[i]` (the response ids that row follows); renormalised as log-probs unless
        `normalise` is False."""
        if not self or not len(rows):
            return rows
        penalised = rows.clone()
        for i, history in enumerate(histories):
            if history:
                ids, counts = torch.unique(torch.tensor(list(history)), return_counts=True)
                penalty = counts.to(rows.dtype) * self.frequency + self.presence
                penalised[i, ids.to(rows.device)] -= penalty.to(rows.device)
        return torch.log_softmax(penalised, dim=-1) if normalise else penalised
