"""SAFE's verifier scoring: every verifier reads the draft in its own tokens, in one forward pass.

A verifier is synced to the committed text plus the draft (its canonical tokenization of that
text). A drafted position is "aligned" for it when the position's boundary is one of its token
ends (no decoded-string compare: byte offsets, exact for every tokenizer family, and a boundary
inside a UTF-8 character never aligns); elsewhere the drafter's previous token is OOV-like for
it. Where aligned, its "own next token" is its next id, and it gives the probability of that
token and whether that token is its argmax (the consensus check's inputs).

The drafter's stop is read by `stop_check`: "mass" = the verifier's own "token" there is the
stop, with its stop mass; "text" (the authors' code) = the stop is decoded into the text
("<|end|>") and the verifier reads the first token of its own tokenization of that text.

`heal` (`heal.py`) plugs in here: a verifier it reads by text at a position counts as readable
there, and its reading comes from the healer instead of the forward pass.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import torch

from ...member import Member
from ...parallel import each, overlaps
from ...sampling import Sampler
from ...vocab import stop_index, stop_logprob
from .drafting import Draft, Position
from .heal import HealCycle, NoHeal

STOP_CHECKS = ("mass", "text")


@dataclass
class Reading:
    """One verifier synced to committed text + draft: where each position sits in its tokens,
    and (once scored) what it says there."""

    member: Member
    aligned: list[int | None]  # its token index at each position's boundary (None: OOV-like)
    stop_token: int | None = None  # stop_check="text": its first token of the stop's text
    own: list[float] = field(default_factory=list)  # P(its own next token) where aligned
    agree: list[bool] = field(default_factory=list)  # its argmax is its own next token
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # token index -> log-probs
    scored: bool = False  # rows, own and agree computed (one forward pass)


class Readings:
    """Every verifier's reading of one draft, each built on first need (a draft the GaC gate
    covers needs none) and scored at most once, when first needed (a consensus the drafter and
    the first verifiers already decide needs no pass of the others)."""

    def __init__(
        self,
        verifiers: dict[int, Member],
        draft: Draft,
        drafter: Member,
        stop_check: str,
        heal: NoHeal | HealCycle,
        sampler: Sampler,
    ) -> None:
        self.verifiers, self.draft, self.drafter = verifiers, draft, drafter
        self.stop_check, self.heal, self.sampler = stop_check, heal, sampler
        self.built: dict[int, Reading] = {}  # in verifier order

    def of(self, i: int) -> Reading:
        """Verifier i synced to committed + draft, each position found in its tokens."""
        if i not in self.built:
            member, positions = self.verifiers[i], self.draft.positions
            member.sync(self.draft.text)
            aligned = _aligned(member, positions)
            stop_token = None
            if self.stop_check == "text" and positions[-1].token is None:
                stop_text = self.drafter.vocab.tokenizer.decode([positions[-1].stop_id])
                stop_token = _first_token_of(member, self.draft.text, stop_text)
                if stop_token is None:  # its text merges into the verifier's previous token
                    aligned[-1] = None
            self.heal.place(i, member, aligned)
            self.built[i] = Reading(member, aligned, stop_token)
        return self.built[i]

    def readable(self, i: int, j: int) -> bool:
        """Verifier i can be read at position j: aligned there, or read by text (`heal`)."""
        return self.of(i).aligned[j] is not None or self.heal.reads(i, j)

    def healed(self, i: int, j: int) -> bool:
        return self.heal.reads(i, j)

    @property
    def concurrent(self) -> bool:
        """The verifiers' passes overlap (they live apart: remote servers, other devices)."""
        return overlaps([self.verifiers[i] for i in self.verifiers])

    def score(self, only: int | None = None) -> None:
        """Verifier `only`'s one forward pass, or every verifier's (concurrently where they live
        apart); each verifier is scored at most once per draft."""
        wanted = self.verifiers if only is None else [only]
        built = {i: self.of(i) for i in wanted}
        index = {reading.member: i for i, reading in built.items() if not reading.scored}
        if not index:
            return

        def one(member: Member) -> None:
            i = index[member]
            extra = self.heal.rows(i, member)
            _score(self.built[i], self.draft.positions, self.sampler, extra)

        each(list(index), one)

    def own(self, i: int, j: int) -> tuple[float, bool]:
        """Verifier i at position j: P(its own next token) and whether that is its argmax. Read
        by text, the drafted text's probability, and "argmax" when it is above one half (no
        rival can beat it then). Scores the verifier first if it was not yet."""
        self.score(i)
        reading = self.built[i]
        if self.heal.reads(i, j):
            q = self.heal.own(i, j, reading)
            return q, q > 0.5
        return reading.own[j], reading.agree[j]

    def row(self, i: int, j: int) -> torch.Tensor:
        """Verifier i's log-probs at position j (aligned there)."""
        self.score(i)
        reading = self.built[i]
        return reading.rows[reading.aligned[j]]

    def column(self, i: int, j: int, strings: list[str], pool: list[int]) -> torch.Tensor:
        """Verifier i read by text at position j: its probabilities over candidates `pool`."""
        self.score(i)
        return self.heal.column(i, j, self.built[i], strings, pool)


def drafter_own(pos: Position, drafter: Member, sampler: Sampler, stop_check: str) -> float:
    """The drafter's probability of its own token (its stop: the stop mass, or with
    stop_check="text" the stop id it chose), as greedy or the sampler sees it."""
    token = pos.stop_id if pos.token is None and stop_check == "text" else pos.token
    if sampler.greedy:
        if token is not None:
            return float(pos.row[token].exp())
        return float(stop_logprob(pos.row, drafter.stop_ids).exp())
    probs = sampler.distribution(pos.row)
    if token is not None:
        return float(probs[token])
    return float(stop_logprob(probs.log(), drafter.stop_ids).exp())


def _aligned(member: Member, positions: list[Position]) -> list[int | None]:
    """Each position's token index in the member's tokens (its boundary is one of the member's
    token ends, on a character boundary, with a token after it), else None (OOV-like)."""
    token_ends, ids = member.token_ends, member.ids
    aligned = []
    for p in positions:
        k = bisect.bisect_left(token_ends, p.boundary)
        if p.boundary == 0:
            m = 0
        elif k < len(token_ends) and token_ends[k] == p.boundary:
            m = k + 1
        else:
            m = None
        if m is not None and (not p.whole or (p.token is not None and m >= len(ids))):
            m = None
        aligned.append(m)
    return aligned


def _first_token_of(member: Member, text: str, stop_text: str) -> int | None:
    """stop_check="text": the member's first token of the drafter's stop text after `text`,
    tokenized as the authors' code does (the whole text, special tokens recognised), or None
    where that text merges into the member's previous token (no boundary there)."""
    ids = member.ids
    ext = member.vocab.tokenizer(text + stop_text, add_special_tokens=False)["input_ids"]
    return ext[len(ids)] if len(ext) > len(ids) and ext[: len(ids)] == ids else None


def _score(reading: Reading, positions: list[Position], sampler: Sampler, extra: set[int]):
    """One forward pass for every row the verifier gives this draft (done at most once, and
    only when some position gets as far as the consensus check)."""
    if reading.scored:
        return
    reading.scored = True
    member, aligned, ids = reading.member, reading.aligned, reading.member.ids
    wanted = sorted({m for m in aligned if m is not None} | extra)
    reading.own, reading.agree = [0.0] * len(aligned), [False] * len(aligned)
    if not wanted:
        return
    rows = member.logprobs(wanted)
    reading.rows = dict(zip(wanted, rows, strict=True))
    if not sampler.greedy:  # the distributions actually sampled from
        rows = torch.stack([sampler.distribution(r) for r in rows]).clamp_min(1e-30).log()
    at = {m: k for k, m in enumerate(wanted)}
    own_ids = [ids[m] if m < len(ids) else 0 for m in wanted]
    own = rows.gather(1, torch.tensor(own_ids, device=rows.device)[:, None])[:, 0]
    own, best = own.exp().tolist(), rows.argmax(1).tolist()
    for j, m in enumerate(aligned):
        if m is None:
            continue
        if positions[j].token is not None:
            reading.own[j], reading.agree[j] = own[at[m]], best[at[m]] == ids[m]
        elif reading.stop_token is not None:  # the stop read as text: its first token there
            row = rows[at[m]]
            reading.own[j] = float(row[reading.stop_token].exp())
            reading.agree[j] = best[at[m]] == reading.stop_token
        else:  # the drafter stops here: its "token" is the stop, with the stop mass
            row = rows[at[m]]
            stop = float(stop_logprob(row, member.stop_ids).exp())
            rest = row.clone()
            rest[stop_index(member.stop_ids, row.shape[-1], row.device)] = -math.inf
            reading.own[j], reading.agree[j] = stop, stop >= float(rest.max().exp())
