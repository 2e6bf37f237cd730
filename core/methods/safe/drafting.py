"""SAFE's proposer: the drafter, how long its drafts are, and how an ensemble's choice continues
it.

Shaped like transformers' candidate generators: `Proposer.propose` (their `get_candidates`)
drafts the next tokens and lays them out as positions a verifier can be read at;
`Proposer.update` (their `update_candidate_strategy`) tells the draft-length strategy whether
the last draft was accepted whole. The paper drafts a fixed `lookahead` (`FixedLength`);
`max_lookahead` grows drafts that keep being accepted (`GrowingLength`).

A position's "boundary" is the byte offset in the response where the text before its token
ends; verifiers are read at boundaries (`scoring`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from ...alignment import Aligner
from ...events import Drafted
from ...member import Draft as DrafterOutput
from ...member import Member
from ...sampling import Sampler
from ...vocab import EOS, ByteIndex
from ..base import Request


@dataclass
class Position:
    """One drafted token (or the drafter's stop) as the verifiers see it."""

    boundary: int  # byte offset (response) where the text before this token ends
    token: int | None  # the drafter's id; None = the stop
    string: str  # its surface string (EOS for the stop)
    row: torch.Tensor  # the drafter's log-probs that produced it
    whole: bool  # the boundary is a character boundary of the text
    end: int  # byte offset where the token ends (= boundary for the stop)
    stop_id: int | None = None  # the stop: the drafter's likeliest stop id


@dataclass
class Draft:
    """One draft, laid out for verification."""

    committed: str  # the response before the draft
    text: str | None  # committed + the draft (None: bytes that are not UTF-8 text)
    positions: list[Position]
    start: int  # output token index of the draft's first token
    base: int  # the drafter's token count before the draft
    ids: list[int]  # the drafted ids
    stopped: bool  # the draft ends with the drafter's stop

    @property
    def tail(self) -> str:
        """The draft's own text."""
        return (self.text or "")[len(self.committed) :]

    def head(self, pos: Position) -> str:
        """The draft's text before position `pos`."""
        data = (self.text or "").encode("utf-8")
        return data[len(self.committed.encode("utf-8")) : pos.boundary].decode("utf-8")


class DraftLength(Protocol):
    """The draft-length strategy: how long the next draft is, told after every draft whether
    it was accepted whole (no position replaced)."""

    size: int

    def update(self, accepted_whole: bool) -> None: ...


class FixedLength:
    """The paper: every draft is `lookahead` tokens."""

    def __init__(self, lookahead: int) -> None:
        self.size = lookahead

    def update(self, accepted_whole: bool) -> None:
        pass


class GrowingLength:
    """`max_lookahead`: a draft accepted whole (no position replaced) doubles the next draft's
    length, up to `max_lookahead`; a replacement brings it back to `lookahead`. Fewer cycles,
    so fewer verifier passes (each costs one forward call whatever its length) where the
    members agree for long stretches."""

    def __init__(self, lookahead: int, max_lookahead: int) -> None:
        self.lookahead, self.max_lookahead, self.size = lookahead, max_lookahead, lookahead

    def update(self, accepted_whole: bool) -> None:
        self.size = min(2 * self.size, self.max_lookahead) if accepted_whole else self.lookahead


class Proposer:
    """The drafter and its draft-length strategy."""

    def __init__(self, drafter: Member, length: DraftLength) -> None:
        self.drafter, self.length = drafter, length

    def propose(self, request: Request) -> Draft | None:
        """The drafter's next draft after the committed text (None: its context window is
        full). Up to 3 tokens more while the last one ends inside a UTF-8 character, where no
        verifier could read the text."""
        drafter, committed = self.drafter, request.text
        drafter.sync(committed)
        base_n, base = drafter.n_tokens, len(committed.encode("utf-8"))
        out = _draft(drafter, self.length.size, request.remaining, request.sampler)
        if not out.ids and not out.stopped:
            return None
        start = request.stats.tokens
        request.emit(_drafted(drafter, out, start))
        token_ends = drafter.token_ends[base_n:]
        raw = b"".join(drafter.vocab.token_bytes[i] for i in out.ids)
        raw = raw[len(raw) - (token_ends[-1] - base if token_ends else 0) :]  # a dummy space
        try:
            text = committed + raw.decode("utf-8")
        except UnicodeDecodeError:  # bytes no text can hold (a random model's stray byte)
            return Draft(committed, None, [], start, base_n, out.ids, out.stopped)
        positions = _positions(out, token_ends, base, raw, drafter.stop_ids)
        return Draft(committed, text, positions, start, base_n, out.ids, out.stopped)

    def update(self, accepted_whole: bool) -> None:
        self.length.update(accepted_whole)


def _draft(drafter: Member, size: int, limit: int, sampler: Sampler) -> DrafterOutput:
    """`size` tokens (at most `limit`), and up to 3 more while the last one ends inside a
    UTF-8 character."""
    out = drafter.draft(min(size, limit), sampler)
    extra = 0
    while (
        out.ids and not out.stopped and extra < 3 and len(out.ids) < limit and _partial_end(drafter)
    ):
        more = drafter.draft(1, sampler)
        if not more.ids and not more.stopped:
            break
        out = DrafterOutput(
            out.ids + more.ids, torch.cat([out.logprobs, more.logprobs]), more.stopped
        )
        extra += 1
    return out


def _partial_end(member: Member) -> bool:
    """The member's text ends inside a UTF-8 character (a byte token mid-character)."""
    token_ends = member.token_ends
    return bool(token_ends) and len(member.text.encode("utf-8")) < token_ends[-1]


def _drafted(drafter: Member, out: DrafterOutput, start: int) -> Drafted:
    strings = [drafter.vocab.strings[i] or repr(drafter.vocab.token_bytes[i]) for i in out.ids]
    return Drafted(drafter.name, start, strings + ([EOS] if out.stopped else []))


def _positions(
    out: DrafterOutput, token_ends: list[int], base: int, raw: bytes, stop_ids
) -> list[Position]:
    positions = []
    for j in range(len(out.ids) + int(out.stopped)):
        boundary = base if j == 0 else token_ends[j - 1]
        offset = boundary - base
        whole = offset >= len(raw) or not 0x80 <= raw[offset] < 0xC0
        stop_id = None
        if j < len(out.ids):
            token, end = out.ids[j], token_ends[j]
            string = raw[offset : end - base].decode("utf-8", errors="replace")
        else:
            token, string, end = None, EOS, boundary
            stops = [i for i in stop_ids if i < out.logprobs.shape[-1]]
            stop_id = max(stops, key=lambda i: float(out.logprobs[j][i]), default=None)
        positions.append(Position(boundary, token, string, out.logprobs[j], whole, end, stop_id))
    return positions


# --------------------------------------------------------------------------------------------
# The ensemble's choice, continued by the drafter (the `remap` rule).


@dataclass
class Continuation:
    """What an ensemble point commits after the draft's head."""

    text: str  # the choice's text as the drafter writes it
    token: int | None  # the drafter id it is (None: a string, not one drafter token)
    tokens: int  # output tokens it counts for
    drafter_ids: list[int] | None = None  # the drafter's response ids, as they are (as-aligned)


class Remap(Protocol):
    """How an ensemble's choice at position j continues the drafter (the `remap` rule);
    `redraft_on_same`: a choice that is the drafted token still ends the draft."""

    redraft_on_same: bool

    def continuation(self, draft: Draft, j: int, chosen: str, sampler: Sampler) -> Continuation: ...


class Likeliest:
    """remap="likeliest": the choice means "the text continues with this string", so the
    drafter commits its own likeliest token that starts with it (a verifier's bare space never
    leaves the drafter in the middle of a word of its own), else the string itself, re-read
    canonically (its extra drafter tokens are counted). A choice that is the drafted token
    changes nothing: the scan goes on through the same draft (what greedy redrafting gives)."""

    redraft_on_same = False

    def __init__(self, drafter: Member, index: ByteIndex) -> None:
        self.drafter, self.index = drafter, index

    def continuation(self, draft: Draft, j: int, chosen: str, sampler: Sampler) -> Continuation:
        pos, vocab = draft.positions[j], self.drafter.vocab
        ids = self.index.extending(chosen.encode("utf-8"))
        ids = ids[self.index.spelled[ids]] if len(ids) else ids
        dummy_start = pos.boundary == 0 and vocab.dummy_prefix
        if len(ids) and not dummy_start and bool(torch.isfinite(pos.row[ids]).any()):
            masked = torch.full_like(pos.row, -math.inf)
            masked[ids] = pos.row[ids]
            token = sampler.pick(masked)
            return Continuation(vocab.strings[token], token, 1)
        # no such token (or none a request's grammar allows): the string itself
        return Continuation(chosen, None, max(1, len(vocab.encode(chosen))))


class AsAligned:
    """remap="as-aligned", the authors' code: UniTE appends the ONE drafter id its column was
    read from (its top-k id, else its sub-token), even when it spells only part of the chosen
    string; GaC appends the string's own tokens. The drafter goes on from exactly those ids,
    kept as they are (not re-read canonically), and every ensemble point ends the draft: the
    drafter redrafts from there, even when the choice is the drafted token itself."""

    redraft_on_same = True

    def __init__(self, drafter: Member, aligner: Aligner) -> None:
        self.drafter, self.aligner = drafter, aligner

    def continuation(self, draft: Draft, j: int, chosen: str, sampler: Sampler) -> Continuation:
        vocab = self.drafter.vocab
        aligned_id = self.aligner.column_id(self.drafter, draft.positions[j].row, chosen)
        piece = vocab.strings[aligned_id] if aligned_id is not None else None
        if piece:
            new = [aligned_id]
        else:  # GaC: its tokens
            piece, new = chosen, vocab.encode(chosen)
        ids = self.drafter.ids[: draft.base] + draft.ids[:j] + new
        token = new[0] if len(new) == 1 else None
        return Continuation(piece, token, max(1, len(new)), ids)
