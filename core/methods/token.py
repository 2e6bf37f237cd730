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

from ..aggregate import MEANS, combine
from ..alignment import GATE, Aligner, top_candidates
from ..errors import InvalidConfigError
from ..events import SkipGate, TokenEnsembled
from ..parallel import each
from ..trust import backers
from ..validate import check_int, check_real
from ..vocab import EOS
from .base import Commit, Method, Request, check_choice

PAPER_GATES = {"unite": None, "gac": GATE}  # gate="paper": each method as published


class TokenEnsemble(Method):
    """Options: `aggregator` ("unite" | "gac": how members align on strings), `top_k` (UniTE's
    k), `mean` ("arithmetic" | "geometric": how their aligned distributions combine), `weights`
    (per member), `gate` ("paper": GaC's 0.5 for "gac", none for "unite"; a number in (0, 1):
    ensemble only where the first member's top probability is at most that; None: every step),
    `subtoken` (UniTE's sub-token rule, `core.alignment.SUBTOKEN_RULES`)."""

    name = "token"
    min_members = 2

    def __init__(
        self,
        members,
        aggregator: str = "unite",
        top_k: int = 10,
        mean: str = "arithmetic",
        weights: Sequence[float] | None = None,
        gate: float | str | None = "paper",
        subtoken: str = "nonblank",
    ) -> None:
        super().__init__(members)
        check_choice("mean", mean, MEANS)
        top_k = check_int("top_k", top_k, low=1, example=10)
        self.aligner = Aligner(aggregator, top_k, subtoken)
        self.mean = mean
        checked = _check_weights(weights, len(self.members))
        # by name: a member that leaves a request (a failure, the trust's floor) takes its own
        self.weights = (
            None
            if checked is None
            else {m.name: w for m, w in zip(self.members, checked, strict=True)}
        )
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
            if chosen is None:  # only part of a character is allowed next
                commit = self._first_alone(request)
                position += commit.tokens
                yield commit
                if commit.finish:
                    return
                continue
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
        own = self.aligner.align(self.members, [row])
        if float(own.probs[0].max()) <= 0:
            return None  # no whole string allowed: see _ensembled
        request.emit(SkipGate(position, self.members[0].name, top))
        request.stats.count("skip_gate")
        return own.strings[request.sampler.pick_probs(own.probs[0])]

    def _ensembled(self, request: Request, position: int, rows: list[torch.Tensor]) -> str | None:
        """The ensemble's string, or None where a request's grammar allows only tokens that
        spell part of a character (no string candidate exists)."""
        aligned = self.aligner.align(self.members, rows)
        probs = combine(aligned.probs, self.mean, self._weights(request))
        if float(probs.max()) <= 0:
            return None
        pick = request.sampler.pick_probs(probs)
        chosen = aligned.strings[pick]
        request.stats.ensembled_tokens += 1
        request.emit(TokenEnsembled(position, chosen, top_candidates(aligned.strings, probs)))
        names = [m.name for m in self.members]  # the member trust's report: who backed it
        request.trust.update(backers(names, aligned.probs, aligned.strings, pick))
        return chosen

    def _weights(self, request: Request) -> list[float] | None:
        """The `weights` option times the ensemble's member trust (either alone when the other
        is even; None when both are)."""
        names = [m.name for m in self.members]
        trust = request.trust.of(names)
        given = None if self.weights is None else [self.weights[n] for n in names]
        if given is not None and not sum(given) > 0:  # the weighted members all left
            given = None
        if trust is None or given is None:
            return given if trust is None else trust
        return [w * t for w, t in zip(given, trust, strict=True)]

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
            "mean": self.mean,
            "gate": self.gate,
            "subtoken": self.aligner.subtoken,
        }


METHOD = TokenEnsemble


def _check_weights(weights: Sequence[float] | None, n: int) -> list[float] | None:
    """None (equal weights) or one non-negative weight per member, not all zero."""
    if weights is None:
        return None
    if isinstance(weights, (str, bytes)) or not isinstance(weights, Sequence):
        raise InvalidConfigError(f"weights={weights!r} must be a list of {n} numbers, or None.")
    if len(weights) != n:
        raise InvalidConfigError(
            f"weights has {len(weights)} entries for {n} members; pass one per member."
        )
    checked = [check_real(f"weights[{i}]", w, low=0, example=1.0) for i, w in enumerate(weights)]
    if not sum(checked) > 0:
        raise InvalidConfigError("weights are all zero; give at least one member a weight > 0.")
    return checked
