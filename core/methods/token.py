"""Token-level ensembling (UniTE / GaC): the baselines SAFE is measured against.

Every step, every member gives its next-token distribution after the committed text (in its own
canonical tokenization), the distributions are aligned on candidate strings (UniTE: union of the
top-k; GaC: union of the full vocabularies), averaged, and the chosen string is appended to the
text. Members whose tokens do not end where the chosen string ends are then fed a partial word:
the "OOV-like" tokenization that makes every-token ensembling degrade on long outputs.

As published, UniTE ensembles at every step, and GaC only where its main (first) member is
unsure: where that member's top probability is above one half its own token is taken and no
other member runs (`gate`, a "skip_gate" position; GaC's code and the SAFE paper's GaC runs).
`gate=None` ensembles GaC at every step (E/T 100 %).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ..aggregate import AGGREGATIONS, combine
from ..errors import InvalidConfigError
from ..events import SkipGate, TokenEnsembled
from ..parallel import each
from ..vocab import EOS, SUBTOKEN_RULES, Aligned, UnionVocab, unite_union
from .base import Commit, Method, Request, check_choice

AGGREGATORS = ("unite", "gac")
GATE = 0.5  # GaC's threshold on its main member's probability (SAFE+GaC applies it too)
PAPER_GATES = {"unite": None, "gac": GATE}  # gate="paper": each method as published


class Aligner:
    """Next-token distributions of several members -> probabilities over shared strings."""

    def __init__(self, members, aggregator: str, top_k: int, subtoken: str = "nonblank") -> None:
        check_choice("aggregator", aggregator, AGGREGATORS)
        check_choice("subtoken", subtoken, SUBTOKEN_RULES)
        self.vocabs = [m.vocab for m in members]
        self.stops = [m.stop_ids for m in members]
        self.aggregator = aggregator
        self.top_k = top_k
        self.subtoken = subtoken
        self._tables: dict[str, UnionVocab] = {}  # GaC's union, built once, shared by copies

    def align(self, logprobs: Sequence[torch.Tensor], first: int = 0) -> Aligned:
        """Members `first`, `first + 1`, ... (one row each) aligned on candidate strings."""
        vocabs = self.vocabs[first : first + len(logprobs)]
        stops = self.stops[first : first + len(logprobs)]
        if self.aggregator == "unite":
            return unite_union(vocabs, stops, logprobs, k=self.top_k, subtoken=self.subtoken)
        if "gac" not in self._tables:  # GaC's union of full vocabularies
            self._tables["gac"] = UnionVocab(self.vocabs, self.stops)
        union = self._tables["gac"]
        rows = [union.project(first + m, lp) for m, lp in enumerate(logprobs)]
        return Aligned(union.strings, torch.stack(rows))


def top_candidates(strings: list[str], probs: torch.Tensor, k: int = 5) -> list[tuple[str, float]]:
    values, index = torch.topk(probs, min(k, probs.shape[0]))
    return [(strings[i], float(v)) for v, i in zip(values.tolist(), index.tolist(), strict=True)]


class TokenEnsemble(Method):
    """Options: `aggregator` ("unite" | "gac"), `top_k` (UniTE's k), `aggregation`
    ("arithmetic" | "geometric"), `weights` (per member), `gate` ("paper": GaC's 0.5 for "gac",
    none for "unite"; a number in (0, 1): ensemble only where the first member's top probability
    is at most that; None: every step), `subtoken` (UniTE's sub-token rule, SUBTOKEN_RULES)."""

    name = "token"
    min_members = 2

    def __init__(
        self,
        members,
        aggregator: str = "unite",
        top_k: int = 10,
        aggregation: str = "arithmetic",
        weights: Sequence[float] | None = None,
        gate: float | str | None = "paper",
        subtoken: str = "nonblank",
    ) -> None:
        super().__init__(members)
        check_choice("aggregation", aggregation, AGGREGATIONS)
        self.aligner = Aligner(self.members, aggregator, top_k, subtoken)
        self.aggregation = aggregation
        self.weights = list(weights) if weights is not None else None
        self.gate = PAPER_GATES[aggregator] if gate == "paper" else gate
        if self.gate is not None and (
            isinstance(self.gate, bool)
            or not isinstance(self.gate, (int, float))
            or not 0 < self.gate < 1
        ):
            raise InvalidConfigError(
                f"gate={gate!r} must be 'paper' (GaC's 0.5 for aggregator='gac', none for "
                "'unite'), a probability in (0, 1), or None (ensemble every token)."
            )

    def run(self, request: Request) -> Iterator[Commit]:
        def next_row(member):
            member.sync(request.text)
            return member.logprobs([member.n_tokens])[0]

        position = 0
        while request.remaining > 0:
            if self.gate is None:  # every member at once (remote members answer concurrently)
                chosen = self._ensembled(request, position, each(self.members, next_row))
            else:  # the first member alone decides whether the others run
                first = next_row(self.members[0])
                chosen = self._gated(request, position, first)
                if chosen is None:
                    rows = [first, *each(self.members[1:], next_row)]
                    chosen = self._ensembled(request, position, rows)
            position += 1
            if chosen == EOS:
                yield Commit("", 1, "stop")  # the stop token is a generated token
                return
            yield Commit(chosen, 1)

    def _gated(self, request: Request, position: int, row: torch.Tensor) -> str | None:
        """GaC's gate: the first member's own token where it is sure (no other member runs),
        else None."""
        if self.gate is None:
            return None
        top = float(row.max().exp())
        if top <= self.gate:
            return None
        request.emit(SkipGate(position, self.members[0].name, top))
        request.stats.count("skip_gate")
        own = self.aligner.align([row])
        return own.strings[request.sampler.pick_probs(own.probs[0])]

    def _ensembled(self, request: Request, position: int, rows: list[torch.Tensor]) -> str:
        aligned = self.aligner.align(rows)
        probs = combine(aligned.probs, self.aggregation, self.weights)
        chosen = aligned.strings[request.sampler.pick_probs(probs)]
        request.stats.ensembled += 1
        request.emit(TokenEnsembled(position, chosen, top_candidates(aligned.strings, probs)))
        return chosen

    def summary(self) -> dict:
        return {
            **super().summary(),
            "aggregator": self.aligner.aggregator,
            "aggregation": self.aggregation,
            "gate": self.gate,
            "subtoken": self.aligner.subtoken,
        }


METHOD = TokenEnsemble
