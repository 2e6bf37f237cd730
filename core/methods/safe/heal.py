"""SAFE's `heal` extension (beyond the paper): read a verifier by TEXT where its tokens and the
drafter's do not line up, instead of skipping or misreading the position.

- At a position that is OOV-like for it (the drafter's boundary falls inside one of its
  tokens), it is read from its last real token boundary: P(its continuation spells the partial
  text u + candidate c) / P(u).
- With `heal=True` (not `"oov"`), also at an aligned position where its own next token ends
  inside the drafted token (a finer verifier: "▁" against " 13"), or at the draft's end (its
  last token may be a truncation: "▁buttons" of "▁buttons."), where its own token says nothing
  sure about the drafted one: P(its continuation spells c).

Both marginalise over its tokens that extend or are prefixes of the string; rows along its own
tokens come from the cycle's one forward pass, other spellings from a few batched passes
(`Member.branch_logprobs`). A healed verifier "agrees" when it gives the drafted text > 1/2.

The verifiers' scoring (`scoring.py`) talks to this module through one per-draft object:
`place` (where a verifier's tokens sit), `reads` (is this position read by text?), `rows`
(which extra rows its forward pass must give), and the readings `own` (the drafted token) and
`column` (every candidate). `NoHeal` is the paper: nothing is read by text.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...member import Member
from ...vocab import EOS, ByteIndex, stop_logprob

HEALED = "healed_positions"  # positions scored through `heal` (informational, not in the sum)

_HEAL_DEPTH = 3  # tokens a healed verifier may spend spelling the partial text + candidate
# (the last one read only as going on with the text: see Healer._started)
_HEAL_PRUNE = 1e-2  # drop a spelling path this much less likely than what its target has
_HEAL_BRANCHES = 16  # most paths expanded per level (one forward pass per level)
_HEAL_AHEAD = 64  # most rows one branch pass computes ahead for the levels below it...
_HEAL_AHEAD_LOGITS = 1 << 20  # ...and at most this many logits in all (rows x vocabulary): on a
# large vocabulary (Gemma's 262,144) a row costs the head a good part of a pass


class Healer:
    """One verifier read from its last real token boundary `m` (byte offset `a`) inside a
    cycle: probabilities that its continuation spells given byte strings, marginalised over
    every way its tokens can spell them (rows for non-canonical paths come from batched
    `branch_logprobs` passes, one per level, cached for the rest of the cycle)."""

    def __init__(
        self, member: Member, index: ByteIndex, m: int, row: torch.Tensor, prune=_HEAL_PRUNE
    ) -> None:
        self.member, self.index, self.m, self.prune = member, index, m, prune
        self.stops = member.stop_ids
        self.rows: dict[tuple[int, ...], torch.Tensor] = {(): row.float().cpu()}
        # rows one pass may compute ahead: each costs a product with the whole vocabulary
        self.ahead = min(_HEAL_AHEAD, _HEAL_AHEAD_LOGITS // max(1, row.shape[-1]))
        self._cumsum: dict[tuple[int, ...], torch.Tensor] = {}

    def _mass(self, path: tuple[int, ...], prefix: bytes) -> float:
        """P(next token starts with `prefix`) in state `path`: a range sum over sorted ids."""
        if path not in self._cumsum:
            probs = self.rows[path].exp()[self.index.ids]
            self._cumsum[path] = torch.cat([torch.zeros(1), torch.cumsum(probs, 0)])
        lo, hi = self.index.span(prefix)
        return float(self._cumsum[path][hi] - self._cumsum[path][lo])

    def probs(self, targets: Sequence[tuple[bytes, bool]]) -> list[float]:
        """For each (s, end): P(the text continues with s), or with exactly s then the end of
        the turn when `end`."""
        result = [0.0] * len(targets)
        frontier = [((), 1.0, t, s, end) for t, (s, end) in enumerate(targets)]
        for depth in range(_HEAL_DEPTH + 1):
            self._expand_rows(frontier, depth)
            grown = []
            for path, weight, t, s, end in frontier:
                row = self.rows[path]
                if not s:  # only an `end` target gets here: it must stop now
                    result[t] += weight * float(stop_logprob(row, self.stops).exp())
                    continue
                if not end:
                    result[t] += weight * self._mass(path, s)
                if depth == _HEAL_DEPTH:  # out of depth, not out of agreement: its next
                    if not end:  # token going on with s counts as spelling the rest
                        result[t] += weight * self._started(row, s)
                    continue
                for n, ids in self.index.prefixes(s, proper=not end):
                    for i, p in zip(ids, row[ids].exp().tolist(), strict=True):  # twins apart
                        grown.append((path + (i,), weight * p, t, s[n:], end))
            frontier = self._prune(grown, result)
            if not frontier:
                break
        return result

    def _started(self, row: torch.Tensor, s: bytes) -> float:
        """P(next token spells a proper start of s): a string longer than the depth allows
        (Qwen's one-token `<tool_call>` is five tokens of text for another tokenizer) is read
        as far as the depth goes, not as impossible."""
        ids = [i for _, twins in self.index.prefixes(s, proper=True) for i in twins]
        return float(row[ids].exp().sum()) if ids else 0.0

    def _expand_rows(self, frontier, depth: int) -> None:
        """The rows every path of the frontier needs, in one batched pass; in the same pass,
        the rows of every way the frontier's paths can go on spelling their targets (within
        the depth and `ahead` rows), which the next levels would otherwise ask for one pass
        each."""
        need = {path for path, *_ in frontier if path not in self.rows}
        if not need:
            return
        ahead = _descendants(self.index, frontier, depth, self.rows)
        if len(need | ahead) <= self.ahead:
            need |= ahead
        order = sorted(need)
        rows = self.member.branch_logprobs(self.m, [list(p) for p in order])
        self.rows.update(zip(order, rows.float().cpu(), strict=True))

    def _prune(self, grown: list, result: list[float]) -> list:
        """Drop paths negligible next to what their target already has, or to its likeliest
        path; keep the `_HEAL_BRANCHES` likeliest paths."""
        top = list(result)
        for _, weight, t, *_ in grown:
            top[t] = max(weight, top[t])
        grown = [g for g in grown if g[1] > 0 and g[1] >= self.prune * top[g[2]]]
        best: dict[tuple[int, ...], float] = {}
        for path, weight, *_ in grown:
            best[path] = max(weight, best.get(path, 0.0))
        kept = set(sorted(best, key=best.get, reverse=True)[:_HEAL_BRANCHES])
        return [g for g in grown if g[0] in kept]


def _descendants(index: ByteIndex, frontier, depth: int, have) -> set[tuple[int, ...]]:
    """Every path (not in `have`) by which the frontier's paths, at `depth`, can go on spelling
    their targets down to `_HEAL_DEPTH`: what `Healer.probs` may expand at the next levels."""
    found: set[tuple[int, ...]] = set()
    level = [(path, s, end) for path, _, _, s, end in frontier]
    for _ in range(depth, _HEAL_DEPTH):
        grown = []
        for path, s, end in level:
            if not s:
                continue
            for n, ids in index.prefixes(s, proper=not end):
                grown.extend((path + (i,), s[n:], end) for i in ids)
        found.update(path for path, _, _ in grown if path not in have)
        level = grown
    return found


def healed_probs(healer: Healer, u: bytes, strings: Sequence[str]) -> list[float]:
    """P(u + c) / P(u) for each candidate c (EOS: u, then the end of the turn)."""
    targets = [(u, False)] + [
        (u, True) if c == EOS else (u + c.encode("utf-8"), False) for c in strings
    ]
    values = healer.probs(targets)
    whole = values[0] if u else 1.0  # from a real boundary nothing needs dividing out
    return [v / whole if whole > 0 else 0.0 for v in values[1:]]


class NoHeal:
    """The paper: a verifier is read only at its own token boundaries."""

    def place(self, i: int, member: Member, aligned: list[int | None]) -> None:
        pass

    def reads(self, i: int, j: int) -> bool:
        return False

    def rows(self, i: int, member: Member) -> set[int]:
        return set()


@dataclass
class _Place:
    """Where the drafter's positions sit in one verifier's tokens."""

    aligned: list[int | None]  # its token index at each boundary (None: OOV-like)
    last: list[int]  # its last real boundary before each position (token index)
    last_bytes: list[int]  # ... as a byte offset
    spans: list[bool]  # its next token ends inside the drafted one (or is cut by the draft)


class HealCycle:
    """`heal` during one cycle: which positions each verifier is read at by text, and those
    readings (healers cached for the cycle, seeded with the rows of its forward pass)."""

    def __init__(
        self, spans: bool, index: Callable[[int], ByteIndex], positions: Sequence, full: str
    ) -> None:
        self.with_spans, self.index, self.positions = spans, index, positions
        self.full_bytes = full.encode("utf-8")
        # the draft's end cuts the text: a token of the verifier that ends there may be cut short
        last_is_token = bool(positions) and positions[-1].token is not None
        self.cut = len(self.full_bytes) if last_is_token else -1
        self.places: dict[int, _Place] = {}
        self.healers: dict[tuple[int, int], Healer] = {}

    def place(self, i: int, member: Member, aligned: list[int | None]) -> None:
        ends = member.token_ends
        last, last_bytes, spans = [], [], []
        for p, m in zip(self.positions, aligned, strict=True):
            k = bisect.bisect_left(ends, p.boundary)
            last.append(k)  # tokens that end strictly before the boundary
            last_bytes.append(ends[k - 1] if k else 0)
            spans.append(
                self.with_spans and m is not None and p.token is not None
                and (ends[m] < p.end or ends[m] == self.cut)
            )  # fmt: skip
        self.places[i] = _Place(aligned, last, last_bytes, spans)

    def reads(self, i: int, j: int) -> bool:
        """Verifier i is read by text at position j (it would be skipped or misread there)."""
        place = self.places[i]
        if place.aligned[j] is None:
            return self.positions[j].whole
        return place.spans[j]

    def rows(self, i: int, member: Member) -> set[int]:
        """Rows at its last real boundaries, and along its tokens inside the drafted ones."""
        place, ends = self.places[i], member.token_ends
        wanted = {place.last[j] for j, m in enumerate(place.aligned) if m is None}
        for j, m in enumerate(place.aligned):
            k = m + 1 if place.spans[j] else len(ends) + 1
            while k <= len(ends) and ends[k - 1] < self.positions[j].end:
                wanted.add(k)
                k += 1
        return wanted

    def own(self, i: int, j: int, view) -> float:
        """P(verifier i continues with the drafted token's text at position j)."""
        healer, u = self._reading(i, j, view)
        return healed_probs(healer, u, [self.positions[j].string])[0]

    def column(self, i: int, j: int, view, strings: list[str], pool: list[int]) -> torch.Tensor:
        """Verifier i's probabilities over the candidates `pool` (normalised over them)."""
        healer, u = self._reading(i, j, view)
        values = torch.tensor(healed_probs(healer, u, [strings[c] for c in pool]))
        row = torch.zeros(len(strings))
        row[pool] = values / values.sum() if float(values.sum()) > 0 else 0.0
        return row

    def _reading(self, i: int, j: int, view) -> tuple[Healer, bytes]:
        """From the aligned boundary (nothing partial), else from its last real boundary with
        the partial text u before position j."""
        place = self.places[i]
        if place.aligned[j] is not None:
            return self._healer(i, view, place.aligned[j]), b""
        u = self.full_bytes[place.last_bytes[j] : self.positions[j].boundary]
        return self._healer(i, view, place.last[j]), u

    def _healer(self, i: int, view, m: int) -> Healer:
        """A healer from the verifier's boundary m, seeded with the rows its own tokens after
        m already got in the cycle's forward pass (the likeliest spelling costs no pass)."""
        if (i, m) not in self.healers:
            healer = Healer(view.member, self.index(i), m, view.rows[m])
            ids, k = view.member.ids, m + 1
            while k in view.rows:
                healer.rows[tuple(ids[m:k])] = view.rows[k].float().cpu()
                k += 1
            self.healers[(i, m)] = healer
        return self.healers[(i, m)]
