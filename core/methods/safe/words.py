"""SAFE's `decide="word"` extension (beyond the paper): at an ensemble point the ensemble decides
the whole word the position falls in, not only its next token.

Why. Members with different tokenizers spell a number in different pieces (" 27" is `Ġ2 7`
for one, `▁ 2 7` for another, one token for a third). Decided token by token, the first piece
is chosen before anyone has seen the rest: " 2" is where " 2." and " 27." both start, so every
member backs it, and the next decision ("." or "7") is then taken by members that, given
" 2", see a finished number. And UniTE renormalises each member over a few candidate strings,
so a member that does not know (its probability spread thin over many numbers) votes as
loudly as one that does. Deciding the word compares whole words, each read by every member in
its own tokens, with the probability each member really gives it.

At an ensemble point (a position no skip rule covers):
1. the word's start: back from the position to the last drafted token that starts with
   whitespace (never into text committed before this draft); the drafter's stop starts a word
   of its own, the empty one that ends the turn, so the end is weighed against going on;
2. every member proposes the word there: its own continuation (the request's decoding) up to
   the end of its next word (before the first whitespace after a non-space), its stop, or
   `WORD_TOKENS` tokens; the drafter's draft is its proposal where it already holds one;
3. every member scores every distinct proposal in one verify-in-line pass (`Member.score`, the
   stop included for a proposal that ends the turn): log P_m(word);
4. the choice maximises sum_m w_m P_m(word) (w: the member trust, equal by default), the
   members' mixture, as the paper's average is at a token, taken over whole words and without
   renormalising a member over the candidates: a member that spreads its probability thin
   over many words adds little to any of them, and one member that rules a word out cannot
   veto it where the others back it. (A geometric mean, sum_m w_m log P_m, gives every member
   that veto: with a base model that slips confidently once it reads another member's phrasing,
   it lost 5 to 10 points on the real pair's tuning problems, and the mixture was as good or
   better on the shipped testbed's, `README`, "Word decisions".) A sampling request draws from
   the mixture renormalised over the candidates.
The chosen word is committed and the drafter drafts on from it. The draft's skip events inside
the word are withdrawn (the word's decision covers those tokens), so every output token is
still one ensemble point, one skip or one extra token of an ensembled string.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...events import EnsemblePoint
from ...member import Member
from ...parallel import each
from ..base import Request
from .drafting import Draft, Position

DECISIONS = ("token", "word")
WORD_TOKENS = 8  # the most tokens a member spends proposing one word


def starts_word(position: Position) -> bool:
    """The drafted token starts a word (its string starts with whitespace), or it is the
    drafter's stop: the turn's end is never part of a word, so whether the turn ends there or
    goes on with another word is decided as a word too."""
    return position.token is None or position.string[:1].isspace()


def word_start(draft: Draft, j: int) -> int | None:
    """The draft position where the word holding position j starts: the last position at or
    before j that starts a word, else the draft's first where the committed text ends a word
    there (it is empty or ends with whitespace). None: the word began in committed text."""
    found = next((i for i in range(j, 0, -1) if starts_word(draft.positions[i])), 0)
    if found or starts_word(draft.positions[0]) or draft.committed[-1:].isspace():
        return found
    return 0 if not draft.committed else None


def word_end(text: str) -> int | None:
    """Where the first word of `text` ends (before the first whitespace after a non-space),
    or None when it has not ended yet."""
    seen = False
    for i, char in enumerate(text):
        if char.isspace():
            if seen:
                return i
        else:
            seen = True
    return None


@dataclass(frozen=True)
class Decided:
    """A word decision: the draft position its word starts at (the draft's skips from there on
    are withdrawn), the word, the output tokens it counts for (the drafter's tokens of the word,
    and the stop when it ends the turn) and whether it ends the turn; `full`: no member could
    add a word (every window is full)."""

    start: int
    text: str
    tokens: int
    ended: bool
    full: bool = False


@dataclass(frozen=True)
class Proposal:
    """One member's word: its text and whether the member ended the turn right after it."""

    text: str
    ended: bool


class WordDecision:
    """The ensemble point decided as a whole word (`decide="word"`)."""

    def decide(
        self,
        request: Request,
        members: list[Member],
        drafter: int,
        draft: Draft,
        j: int,
    ) -> Decided | None:
        """The word decided for an ensemble point at position j. None: it is not decided as a
        word (it began in text committed before this draft, which stays): the token decision
        applies."""
        w = word_start(draft, j)
        if w is None:
            return None
        head = draft.head(draft.positions[w])
        base = draft.committed + head
        limit = max(1, min(WORD_TOKENS, request.remaining - w))
        own = _drafted_word(draft, w)
        order = [drafter] + [i for i in range(len(members)) if i != drafter]

        def propose(member: Member, sampler) -> Proposal:
            if member is members[drafter] and own is not None:
                return own
            return _propose(member, base, limit, sampler)

        proposals = dict(
            zip(order, each([members[i] for i in order], propose, request.sampler), strict=True)
        )
        candidates = list(dict.fromkeys(p for p in proposals.values() if p.text or p.ended))
        names = [members[i].name for i in order]
        if len(candidates) > 1:
            ordered = [members[i] for i in order]
            pooled = self._pool(request, ordered, base, candidates, names)
            pick = (
                int(torch.argmax(pooled))
                if request.sampler.greedy
                else request.sampler.pick_probs(torch.softmax(pooled, 0))
            )
            shares = torch.softmax(pooled, 0).tolist()
        else:
            pick, shares = 0, [1.0] * len(candidates)
        if not candidates:  # no member could add text: their windows are full
            return Decided(w, "", 0, False, full=True)
        chosen = candidates[pick]
        request.trust.update({names[k]: float(proposals[i] == chosen) for k, i in enumerate(order)})
        ranked = zip([c.text for c in candidates], shares, strict=True)
        top = sorted(ranked, key=lambda t: -t[1])[:5]
        request.emit(EnsemblePoint(draft.start + w, proposals[drafter].text, chosen.text, top))
        count = _drafter_tokens(members[drafter], base, chosen.text) if chosen.text else 0
        count = max(count, 1 if chosen.text else 0) + int(chosen.ended)
        return Decided(w, chosen.text, count, chosen.ended)

    @staticmethod
    def _pool(
        request: Request, members: list[Member], base: str, candidates: list[Proposal], names
    ) -> torch.Tensor:
        """log sum_m w_m P_m(candidate) (weights: the member trust, equal by default), every
        member scoring every candidate in one pass."""
        texts = [c.text for c in candidates]
        ends = [c.ended for c in candidates]

        def score(member: Member) -> list[float]:
            values = member.score(texts, base=base, ends=ends)
            return [float(v.double().sum()) for v in values]

        logp = torch.tensor(each(members, score), dtype=torch.float64)
        weights = request.trust.of(names)
        w = torch.tensor(weights or [1.0] * len(members), dtype=torch.float64)
        return torch.logsumexp((w / w.sum()).log()[:, None] + logp, 0)


def _drafted_word(draft: Draft, w: int) -> Proposal | None:
    """The drafter's own word from position w, where its draft already holds all of it."""
    data = (draft.text or "").encode("utf-8")
    tail = data[draft.positions[w].boundary :].decode("utf-8", errors="replace")
    end = word_end(tail)
    if end is not None:
        return Proposal(tail[:end], False)
    return Proposal(tail, True) if draft.stopped else None


def _propose(member: Member, base: str, limit: int, sampler) -> Proposal:
    """The member's word after `base`: drafted token by token until it ends. A member that
    ends its turn by writing a stop string (`Local.stop`) proposes ending it there, the
    whitespace before the stop string left out."""
    member.sync(base)
    text, ended = "", False
    for _ in range(limit):
        out = member.draft(1, sampler)
        text, written = member.cut_at_stop(member.text[len(base) :])
        if written:
            text, ended = text.rstrip(), True
            break
        if out.stopped or not out.ids:
            ended = out.stopped
            break
        if word_end(text) is not None:
            break
    member.sync(base)  # its drafted ids go: the committed word is read in canonical tokens
    end = word_end(text)
    return Proposal(text[:end], False) if end is not None else Proposal(text, ended)


def _drafter_tokens(drafter: Member, base: str, word: str) -> int:
    """How many drafter tokens `word` adds after `base` (output tokens are the drafter's)."""
    drafter.sync(base)
    before = drafter.n_tokens
    drafter.sync(base + word)
    return max(drafter.n_tokens - before, 0)
