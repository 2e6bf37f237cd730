"""Ensembling at every token (UniTE / GaC): the baseline SAFE is measured against.

Every step, every member gives its next-token distribution after the committed text (in its own
canonical tokenization), the distributions are aligned on candidate strings (UniTE: union of the
top-k; GaC: union of the full vocabularies), averaged, and the chosen string is appended to the
text. Members whose tokens do not end where the chosen string ends are then fed a partial word:
the "OOV-like" tokenization that makes every-token ensembling degrade on long outputs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ..aggregate import AGGREGATIONS, combine
from ..events import TokenEnsembled
from ..parallel import each
from ..vocab import EOS, UnionVocab, unite_union
from .base import Commit, Method, Request, check_choice

AGGREGATORS = ("unite", "gac")


class Aligner:
    """Next-token distributions of several members -> probabilities over shared strings."""

    def __init__(self, aggregator: str, top_k: int) -> None:
        check_choice("aggregator", aggregator, AGGREGATORS)
        self.aggregator = aggregator
        self.top_k = top_k
        self._unions: dict[tuple[str, ...], UnionVocab] = {}

    def align(self, members, logprobs: Sequence[torch.Tensor]):
        vocabs = [m.vocab for m in members]
        stops = [m.stop_ids for m in members]
        if self.aggregator == "unite":
            return unite_union(vocabs, stops, logprobs, k=self.top_k)
        key = tuple(m.name for m in members)
        if key not in self._unions:  # built once per member set: GaC's union of vocabularies
            self._unions[key] = UnionVocab(vocabs, stops)
        return self._unions[key].align(logprobs)


def top_candidates(strings: list[str], probs: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
    values, index = torch.topk(probs, min(k, probs.shape[0]))
    return [(strings[i], float(v)) for v, i in zip(values.tolist(), index.tolist(), strict=True)]


class TokenEnsemble(Method):
    name = "token"
    min_members = 2

    def __init__(
        self,
        members,
        aggregator: str = "unite",
        top_k: int = 10,
        aggregation: str = "arithmetic",
        weights: Sequence[float] | None = None,
    ) -> None:
        super().__init__(members)
        check_choice("aggregation", aggregation, AGGREGATIONS)
        self.aligner = Aligner(aggregator, top_k)
        self.aggregation = aggregation
        self.weights = list(weights) if weights is not None else None

    def run(self, request: Request) -> Iterator[Commit]:
        def next_row(member):
            member.sync(request.text)
            boundary = [member.n_tokens]
            return member.constrained_rows(member.logprobs(boundary), boundary)[0]

        position = 0
        while request.remaining > 0:
            rows = each(self.members, next_row)  # remote members answer concurrently
            aligned = self.aligner.align(self.members, rows)
            probs = combine(aligned.probs, self.aggregation, self.weights)
            if float(probs.max()) <= 0:  # only part of a character is allowed next
                commit = self._first_alone(request)
                position += commit.tokens
                yield commit
                if commit.finish:
                    return
                continue
            chosen = aligned.strings[request.sampler.pick_probs(probs)]
            request.stats.ensembled += 1
            request.emit(TokenEnsembled(position, chosen, top_candidates(aligned.strings, probs)))
            position += 1
            if chosen == EOS:
                yield Commit("", 1, "stop")  # the stop token is a generated token
                return
            yield Commit(chosen, 1)

    def _first_alone(self, request: Request) -> Commit:
        """The grammar allows only tokens that spell part of a character (a character some
        tokenizers write byte by byte): no string candidate exists, so the first member writes
        that character alone, token by token, until its text ends on a whole character."""
        member = self.members[0]
        member.sync(request.text)
        steps = 0
        while steps < 4 and member.text == request.text:
            draft = member.draft(1, request.sampler)
            steps += 1
            if draft.stopped or not draft.ids:
                return Commit("", steps, "stop" if draft.stopped else "length")
        request.stats.count("written_alone", steps)
        return Commit(member.text[len(request.text) :], steps)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "aggregator": self.aligner.aggregator,
            "aggregation": self.aggregation,
        }


METHOD = TokenEnsemble
