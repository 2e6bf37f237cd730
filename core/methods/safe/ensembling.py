"""SAFE's ensemble step: P_ens at one drafted position, and its choice.

The drafter's row and each verifier's row at the aligned boundary are aligned on candidate
strings (`core.alignment`: UniTE's top-k union, or GaC's full union restricted to the members'
top-k for sharpening), averaged, and sharpened where the average is overly smooth (its max
below one half: `core.aggregate.sharpen`); the choice is its argmax (greedy) or a draw. A
verifier read by text (`heal`) gives its column over the candidates directly.

The ensemble's member trust weights the average (the paper's App. H, weighted; equal weights
give the plain mean), and each choice is reported to it: which members' likeliest strings
backed the committed one (`core.trust.backers`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...aggregate import sharpen
from ...alignment import Aligned, Aligner, top_candidates
from ...events import EnsemblePoint
from ...member import Member
from ...sampling import Sampler
from ...trust import TrustView, backers
from .drafting import Position
from .scoring import Readings


@dataclass
class Choice:
    """What the ensemble chose at one position."""

    string: str | None  # None: no whole string can stand in for the drafted token (a grammar)
    event: EnsemblePoint
    stops: frozenset[str]  # the candidate strings that end the turn


class Ensembler:
    """UniTE or GaC over the members' aligned rows, with SAFE's sharpening (`sharpen`:
    "heuristic" with `threshold`, "geometric", or None)."""

    def __init__(self, aligner: Aligner, sharpening: str | None, threshold: float) -> None:
        self.aligner, self.sharpening, self.threshold = aligner, sharpening, threshold

    def choose(
        self,
        members: list[Member],
        drafter: int,
        readings: Readings,
        j: int,
        pos: Position,
        at: int,
        sampler: Sampler,
        trust: TrustView,
    ) -> Choice:
        order = [drafter, *readings.built]  # the drafter first, then the verifiers
        rows = {drafter: pos.row}
        for i in readings.built:
            if not readings.healed(i, j):
                rows[i] = readings.row(i, j)
        plain = [i for i in order if i in rows]
        aligned = self.aligner.align(members, [rows[i] for i in plain], plain)
        probs = dict(zip(plain, aligned.probs, strict=True))
        pool, donors = self._pool(aligned, pos)
        for i in order:
            if i not in rows:
                probs[i] = readings.column(i, j, aligned.strings, pool)
        matrix = torch.stack([probs[i] for i in order])
        eligible = self._drafter_top(members[drafter], pos.row, aligned)
        names = [members[i].name for i in order]
        scores, fired = sharpen(
            matrix,
            self.sharpening,
            aligned.strings,
            eligible,
            donors,
            trust.of(names),  # None: all trusted alike, the paper's plain mean
            threshold=self.threshold,
        )
        top = top_candidates(aligned.strings, scores)
        if float(scores.max()) <= 0:  # a grammar allows only part of a character here: no
            return Choice(None, EnsemblePoint(at, pos.string, pos.string, top, fired), frozenset())
        pick = int(torch.argmax(scores)) if sampler.greedy else sampler.pick_probs(scores)
        chosen = aligned.strings[pick]
        trust.update(backers(names, matrix, aligned.strings, pick))  # the trust's report
        return Choice(chosen, EnsemblePoint(at, pos.string, chosen, top, fired), aligned.stops)

    def _pool(self, aligned: Aligned, pos: Position) -> tuple[list[int], torch.Tensor | None]:
        """The candidates a healed verifier is read over, and sharpening's donors (None: all).
        UniTE: every candidate. GaC: each member's top-k and the drafted string."""
        if self.aligner.aggregator == "unite":
            return list(range(len(aligned.strings))), None
        found = set()
        for row in aligned.probs:
            found.update(torch.topk(row, self.aligner.top_k).indices.tolist())
        if pos.string in aligned.index:
            found.add(aligned.index[pos.string])
        pool = sorted(found)
        donors = torch.zeros(len(aligned.strings), dtype=torch.bool)
        donors[pool] = True
        return pool, donors

    def _drafter_top(self, drafter: Member, row: torch.Tensor, aligned: Aligned) -> torch.Tensor:
        """Which candidates are among the drafter's top-k tokens (sharpening's candidates)."""
        mask = torch.zeros(len(aligned.strings), dtype=torch.bool)
        strings = [s for _, s in self.aligner.top_strings(drafter, row)]
        mask[[aligned.index[s] for s in strings if s in aligned.index]] = True
        return mask
