"""SAFE: ensemble only where it is safe and needed (Yun et al., ICLR 2026, arXiv 2510.15346).

One member, the drafter, generates with its own cache. Every cycle it drafts `lookahead` tokens;
each verifier syncs to the committed text plus the draft and gives, in ONE forward pass, its
next-token distributions at every drafter boundary that is also one of its own boundaries. The
earliest drafted position j is ensembled where

  (a) the text before token j ends on a token boundary of EVERY verifier (token j-1 is not
      "OOV-like": a verifier would otherwise be read in the middle of one of its tokens), and
  (b) the members do not already agree: not every verifier's argmax is its own next token, and
      the average over all members (drafter included) of the probability each gives its own
      next token is not above 1/2. Either one makes the drafted token the plain average's
      argmax (the paper's Theorem 1), so ensembling there could not change anything.

The ensembled token replaces draft token j, the rest of the draft is dropped, every member is
synced back to the committed text (`Member.sync` does every rollback) and the drafter resumes.

Beyond the paper, `heal=True` reads a verifier by TEXT wherever its tokens and the drafter's do
not line up, instead of skipping or misreading the position (`heal="oov"` only does the first):
- at a position that is OOV-like for it (the drafter's boundary falls inside one of its
  tokens), from its last real token boundary: P(its continuation spells the partial text u +
  candidate c) / P(u);
- at an aligned position where its own next token ends inside the drafted token (a finer
  verifier: "▁" against " 13"), or at the draft's end (its last token may be a truncation:
  "▁buttons" of "▁buttons."), where its own token says nothing sure about the drafted one:
  P(its continuation spells c).
Both marginalise over its tokens that extend or are prefixes of the string; rows along its own
tokens come from the cycle's one forward pass, other spellings from a few batched passes
(`Member.branch_logprobs`). A healed verifier "agrees" when it gives the drafted text > 1/2.

Also beyond the paper, `max_lookahead` (off by default): a draft that stands whole (no position
replaced) doubles the next draft's length, up to `max_lookahead`, and any replacement brings it
back to `lookahead`: fewer cycles, so fewer verifier passes (each costs one forward call
whatever its length) where the members agree for long stretches. Every drafted position is
still checked; what changes is where drafts end, and a verifier reads the text cut there. When
the drafter's tokens are the coarser ones that changes nothing (the same text on 200/200
testbed problems); when the drafter is finer, a cut can fall inside a verifier's token and
make that position look aligned, so texts differ (use it with `heal=True` there, which reads a
cut token as text).

Decisions the paper leaves open (research notes, safe.md section 6):
- Boundaries are byte offsets: position j is aligned for a verifier when the byte offset where
  drafter token j-1 ends is one of its token ends (no decoded-string compare, no lstrip); a
  boundary inside a UTF-8 character never aligns.
- A verifier's "own next token" is its next id in its canonical tokenization of committed text +
  draft; at the drafter's stop it is the stop, with the stop mass (all its stop ids) as its
  probability and "argmax" meaning the stop mass beats every other id. Probabilities are
  full-vocabulary softmaxes (greedy) or the sampler's distributions (sampling). "Above 1/2" is
  strict: an average of exactly 1/2 may tie, so it is ensembled.
- The ensemble's choice means "the text continues with this string": the drafter commits its
  own likeliest token that starts with it (one token), else the string itself (re-tokenized
  canonically; its extra drafter tokens are counted). If that is the drafted token, nothing
  changes and the scan goes on through the same draft (what greedy redrafting would give).
- E/T = ensemble points / output tokens (drafter tokenization, stop included); a point that
  keeps the drafted token counts. Every output token is an ensemble point or one skip reason.
- GaC: its own gate (drafter probability >= 1/2 skips, "skip_gate") is checked first: it needs
  only the drafter, so a cycle the drafter is sure of costs no verifier pass. Thresholds are on
  the mean, so the authors' doubled thresholds (GaC sums) need no doubling here.
- Sampling (App. H): condition 1 is dropped; the drafted token is accepted with probability
  min(1, mean own-token probability / the drafter's); otherwise P_ens is sampled (no residual
  correction: the union's candidates are not the drafter's vocabulary).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..aggregate import SHARPENINGS, sharpen
from ..errors import InvalidConfigError
from ..events import Drafted, EnsemblePoint, SkipConsensus, SkipMismatch
from ..member import Draft, Member
from ..parallel import each
from ..sampling import Sampler
from ..vocab import EOS, UnionVocab, Vocab, unite_union
from .base import Commit, Method, Request, check_choice, pick_member
from .token import AGGREGATORS, top_candidates

# Every output token (drafter tokenization) is exactly one of these, so they add up to
# `stats.tokens`: E (ensemble points) + skips + tokens an ensembled string added beyond its first.
SKIP_REASONS = ("skip_mismatch", "skip_consensus", "skip_gate")
EXTRA_TOKENS = "ensemble_extra_tokens"
HEALED = "healed_positions"  # positions scored through `heal` (informational, not in the sum)

_HEAL_DEPTH = 3  # tokens a healed verifier may spend spelling the partial text + candidate
_HEAL_PRUNE = 1e-2  # drop a spelling path this much less likely than what its target has
_HEAL_BRANCHES = 16  # most paths expanded per level (one forward pass per level)


def consensus(own: Sequence[float], agree: Sequence[bool]) -> bool:
    """SAFE's skip rule (Ensemble Distribution Verification). `own[0]` is the drafter's
    probability of its own token, `own[1:]` each verifier's probability of ITS own next token
    at the aligned boundary; `agree[i]` says whether verifier i's argmax is that token.

    Skip when every verifier agrees (the drafter, greedy, agrees by construction) or when the
    average own-token probability is above 1/2: either way the drafted token is the argmax of
    the plain average (Theorem 1), so ensembling cannot change it. Ties (exactly 1/2) do not
    skip: two candidates could then share the maximum."""
    return all(agree) or sum(own) / len(own) > 0.5


# --------------------------------------------------------------------------------------------
# Byte-level helpers: which tokens spell a given prefix, for `heal` and for mapping the
# ensemble's choice back onto the drafter.


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string greater than every string that starts with `prefix`."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class _ByteIndex:
    """A vocabulary sorted by token bytes: the tokens that start with a byte string are one
    contiguous range (two bisections), the tokens that equal one are a dict lookup."""

    def __init__(self, vocab: Vocab, stop_ids: frozenset[int]) -> None:
        pairs = sorted(
            (data, i)
            for i, data in enumerate(vocab.token_bytes)
            if data and i not in stop_ids and i not in vocab.special_ids
        )
        self.keys = [data for data, _ in pairs]
        self.ids = torch.tensor([i for _, i in pairs], dtype=torch.long)
        self.exact: dict[bytes, list[int]] = {}
        for data, i in pairs:
            self.exact.setdefault(data, []).append(i)
        self.spelled = torch.tensor([s is not None for s in vocab.strings], dtype=torch.bool)

    def span(self, prefix: bytes) -> tuple[int, int]:
        """The slice of `ids` whose bytes start with `prefix` (itself included)."""
        lo = bisect.bisect_left(self.keys, prefix)
        after = _successor(prefix)
        return lo, len(self.keys) if after is None else bisect.bisect_left(self.keys, after)

    def extending(self, prefix: bytes) -> torch.Tensor:
        lo, hi = self.span(prefix)
        return self.ids[lo:hi]

    def prefixes(self, s: bytes, proper: bool) -> list[tuple[int, list[int]]]:
        """(length, ids) for every token that spells s[:length] exactly."""
        top = len(s) - 1 if proper else len(s)
        return [(n, self.exact[s[:n]]) for n in range(1, top + 1) if s[:n] in self.exact]


def _stop_mass(row: torch.Tensor, stop_ids: Sequence[int]) -> float:
    ids = [i for i in stop_ids if i < row.shape[-1]]
    return float(torch.logsumexp(row[ids], 0).exp()) if ids else 0.0


class _Healer:
    """One verifier read from its last real token boundary `m` (byte offset `a`) inside a
    cycle: probabilities that its continuation spells given byte strings, marginalised over
    every way its tokens can spell them (rows for non-canonical paths come from batched
    `branch_logprobs` passes, one per level, cached for the rest of the cycle)."""

    def __init__(
        self, member: Member, index: _ByteIndex, m: int, row: torch.Tensor, prune=_HEAL_PRUNE
    ) -> None:
        self.member, self.index, self.m, self.prune = member, index, m, prune
        self.stops = [i for i in member.stop_ids if i < row.shape[-1]]
        self.rows: dict[tuple[int, ...], torch.Tensor] = {(): row.float().cpu()}
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
            need = sorted({path for path, *_ in frontier if path not in self.rows})
            if need:
                rows = self.member.branch_logprobs(self.m, [list(p) for p in need])
                self.rows.update(zip(need, rows.float().cpu(), strict=True))
            grown = []
            for path, weight, t, s, end in frontier:
                row = self.rows[path]
                if not s:  # only an `end` target gets here: it must stop now
                    result[t] += weight * _stop_mass(row, self.stops)
                    continue
                if not end:
                    result[t] += weight * self._mass(path, s)
                if depth == _HEAL_DEPTH:
                    continue
                for n, ids in self.index.prefixes(s, proper=not end):
                    for i, p in zip(ids, row[ids].exp().tolist(), strict=True):  # twins apart
                        grown.append((path + (i,), weight * p, t, s[n:], end))
            # prune paths negligible next to what the target already has, or to its likeliest
            top = list(result)
            for _, weight, t, *_ in grown:
                top[t] = max(weight, top[t])
            grown = [g for g in grown if g[1] > 0 and g[1] >= self.prune * top[g[2]]]
            best: dict[tuple[int, ...], float] = {}
            for path, weight, *_ in grown:
                best[path] = max(weight, best.get(path, 0.0))
            kept = set(sorted(best, key=best.get, reverse=True)[:_HEAL_BRANCHES])
            frontier = [g for g in grown if g[0] in kept]
            if not frontier:
                break
        return result


# --------------------------------------------------------------------------------------------
# One cycle: the drafter's positions and each verifier's reading of them.


@dataclass
class _Position:
    boundary: int  # byte offset (response) where the text before this token ends
    token: int | None  # the drafter's id; None = the stop
    string: str  # its surface string (EOS for the stop)
    row: torch.Tensor  # the drafter's log-probs that produced it
    whole: bool  # the boundary is a character boundary of the text
    end: int  # byte offset where the token ends (= boundary for the stop)


@dataclass
class _View:
    """A verifier synced to committed text + draft: where each position sits in its tokens."""

    member: Member
    aligned: list[int | None]  # its token index at each position's boundary (None: OOV-like)
    own: list[float] = field(default_factory=list)  # P(its own next token) where aligned
    agree: list[bool] = field(default_factory=list)  # its argmax is its own next token
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # token index -> log-probs
    last: list[int] = field(default_factory=list)  # its last real boundary (token index)
    last_bytes: list[int] = field(default_factory=list)  # ... as a byte offset
    spans: list[bool] = field(default_factory=list)  # heal: its next token ends inside ours
    filled: bool = False  # rows, own and agree computed (one forward pass)


class Safe(Method):
    name = "safe"
    min_members = 2
    member_options = ("drafter",)

    def __init__(
        self,
        members,
        drafter: int | str = 0,
        lookahead: int = 5,
        aggregator: str = "unite",
        top_k: int = 10,
        sharpen: str | None = "heuristic",
        threshold: float = 0.1,
        heal: bool | str = False,
        max_lookahead: int | None = None,
    ) -> None:
        super().__init__(members)
        check_choice("aggregator", aggregator, AGGREGATORS)
        check_choice("sharpen", sharpen, (*SHARPENINGS, None))
        for option, value, low in (("lookahead", lookahead, 1), ("top_k", top_k, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidConfigError(
                    f"{option}={value!r} must be a positive integer (the paper uses "
                    f"{'5' if option == 'lookahead' else '10'})."
                )
        if max_lookahead is not None and (
            isinstance(max_lookahead, bool)
            or not isinstance(max_lookahead, int)
            or max_lookahead < lookahead
        ):
            raise InvalidConfigError(
                f"max_lookahead={max_lookahead!r} must be None (every draft `lookahead` tokens, "
                f"the paper) or an integer >= lookahead={lookahead}, e.g. 20."
            )
        if not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
            raise InvalidConfigError(
                f"threshold={threshold!r} must be in [0, 1) (sharpening's lambda; paper: 0.1)."
            )
        if heal not in (False, True, "oov"):
            raise InvalidConfigError(
                f"heal={heal!r} must be False (the paper), True, or 'oov' (heal only positions "
                "that are OOV-like for a verifier)."
            )
        self.drafter = pick_member(self.members, drafter, "drafter")
        self.lookahead = lookahead
        self.max_lookahead = max_lookahead or lookahead
        self.aggregator = aggregator
        self.top_k = top_k
        self.sharpening = sharpen
        self.threshold = float(threshold)
        self.heal = heal is not False
        self.heal_spans = heal is True  # "oov": not where a verifier's token ends inside ours
        # built once, shared by every request's copy (keyed by member names: a member that
        # leaves a request shifts the indices)
        self._unions: dict[tuple[str, ...], UnionVocab] = {}  # GaC's full union
        self._indexes: dict[str, _ByteIndex] = {}

    @property
    def active(self) -> list[Member]:
        """The drafter first (it owns the output tokenization), then the verifiers."""
        d = self.drafter
        return [self.members[d]] + [m for i, m in enumerate(self.members) if i != d]

    def summary(self) -> dict:
        return {
            **super().summary(),
            "drafter": self.members[self.drafter].name,
            "lookahead": self.lookahead,
            "max_lookahead": self.max_lookahead,
            "aggregator": self.aggregator,
            "sharpen": self.sharpening,
            "heal": "oov" if self.heal and not self.heal_spans else self.heal,
        }

    def _index(self, i: int) -> _ByteIndex:
        member = self.members[i]
        if member.name not in self._indexes:
            self._indexes[member.name] = _ByteIndex(member.vocab, member.stop_ids)
        return self._indexes[member.name]

    # --- the loop ---------------------------------------------------------------------------

    def run(self, request: Request) -> Iterator[Commit]:
        drafter = self.members[self.drafter]
        size = self.lookahead
        while request.remaining > 0:
            committed = request.text
            drafter.sync(committed)
            base_n, base = drafter.n_tokens, len(committed.encode("utf-8"))
            draft = self._draft(drafter, size, request.remaining, request.sampler)
            if not draft.ids and not draft.stopped:  # the drafter's context window is full
                yield Commit("", 0, "length")
                return
            start = request.stats.tokens
            request.emit(
                Drafted(
                    drafter.name,
                    start,
                    [
                        drafter.vocab.strings[i] or repr(drafter.vocab.token_bytes[i])
                        for i in draft.ids
                    ]
                    + ([EOS] if draft.stopped else []),
                )
            )
            ends = drafter.token_ends[base_n:]
            raw = b"".join(drafter.vocab.token_bytes[i] for i in draft.ids)
            raw = raw[len(raw) - (ends[-1] - base if ends else 0) :]  # a dummy prefix's space
            try:
                tail = raw.decode("utf-8")
            except UnicodeDecodeError:  # bytes no text can hold: take them as the drafter would
                yield from self._unverifiable(request, drafter, draft, committed, start)
                if draft.stopped:
                    return
                continue
            positions = self._positions(draft, ends, base, raw)
            full = committed + tail
            commit = self._verify(request, drafter, positions, committed, full, start)
            for member in self.members:  # every cache back to the committed text
                member.sync(committed + commit.text)
            yield commit
            if commit.finish:
                return
            stood = commit.text == tail  # the whole draft stood: draft further next time
            size = min(2 * size, self.max_lookahead) if stood else self.lookahead

    def _draft(self, drafter: Member, size: int, limit: int, sampler: Sampler) -> Draft:
        """`size` tokens (at most `limit`), and up to 3 more while the last one ends inside a
        UTF-8 character (no verifier could read the text there)."""
        draft = drafter.draft(min(size, limit), sampler)
        extra = 0
        while (
            draft.ids
            and not draft.stopped
            and extra < 3
            and len(draft.ids) < limit
            and _partial_end(drafter)
        ):
            more = drafter.draft(1, sampler)
            if not more.ids and not more.stopped:
                break
            draft = Draft(
                draft.ids + more.ids, torch.cat([draft.logprobs, more.logprobs]), more.stopped
            )
            extra += 1
        return draft

    def _unverifiable(self, request, drafter, draft, committed, start) -> Iterator[Commit]:
        """A draft whose bytes are not valid UTF-8 (a random model's stray byte): no verifier
        can read it, so it is committed as the drafter alone would commit it."""
        n = len(draft.ids) + int(draft.stopped)
        for j in range(n):
            request.emit(SkipMismatch(start + j, drafter.name))
        request.stats.count("skip_mismatch", n)
        text = drafter.text[len(committed) :] if drafter.text.startswith(committed) else ""
        for member in self.members:
            member.sync(committed + text)
        yield Commit(text, n, "stop" if draft.stopped else None)

    @staticmethod
    def _positions(draft: Draft, ends: list[int], base: int, raw: bytes) -> list[_Position]:
        positions = []
        for j in range(len(draft.ids) + int(draft.stopped)):
            boundary = base if j == 0 else ends[j - 1]
            offset = boundary - base
            whole = offset >= len(raw) or not 0x80 <= raw[offset] < 0xC0
            if j < len(draft.ids):
                token, end = draft.ids[j], ends[j]
                string = raw[offset : end - base].decode("utf-8", errors="replace")
            else:
                token, string, end = None, EOS, boundary
            positions.append(_Position(boundary, token, string, draft.logprobs[j], whole, end))
        return positions

    def _view(self, member: Member, full: str, positions: list[_Position]) -> _View:
        """Sync a verifier to committed + draft and find each position in its tokens."""
        member.sync(full)
        ends, ids = member.token_ends, member.ids
        aligned, last, last_bytes, spans = [], [], [], []
        # the draft's end cuts the text: a token of its that ends there may be a truncation
        cut = len(full.encode("utf-8")) if positions and positions[-1].token is not None else -1
        for p in positions:
            k = bisect.bisect_left(ends, p.boundary)
            if p.boundary == 0:
                m = 0
            elif k < len(ends) and ends[k] == p.boundary:
                m = k + 1
            else:
                m = None
            if m is not None and (not p.whole or (p.token is not None and m >= len(ids))):
                m = None
            aligned.append(m)
            last.append(k)  # tokens that end strictly before the boundary
            last_bytes.append(ends[k - 1] if k else 0)
            # heal: its next token ends inside the drafted one (or is cut by the draft's end),
            # so it says nothing sure about the drafted token: read the drafted text instead
            spans.append(
                self.heal and self.heal_spans and m is not None and p.token is not None
                and (ends[m] < p.end or ends[m] == cut)
            )  # fmt: skip
        return _View(member, aligned, last=last, last_bytes=last_bytes, spans=spans)

    def _fill_all(self, views: list[_View], positions: list[_Position], sampler: Sampler) -> None:
        """`_fill` for several verifiers, concurrently where they live apart (remote members)."""
        by_member = {view.member: view for view in views}
        each(list(by_member), lambda member: self._fill(by_member[member], positions, sampler))

    def _fill(self, view: _View, positions: list[_Position], sampler: Sampler) -> None:
        """One forward pass for every row the verifier gives this cycle (done at most once, and
        only when some position gets as far as the consensus check)."""
        if view.filled:
            return
        view.filled = True
        member, aligned, ids = view.member, view.aligned, view.member.ids
        wanted = {m for m in aligned if m is not None}
        if self.heal:  # rows at the last real boundaries, and along its tokens inside ours
            ends = member.token_ends
            wanted |= {view.last[j] for j, m in enumerate(aligned) if m is None}
            for j, m in enumerate(aligned):
                k = m + 1 if view.spans[j] else len(ends) + 1
                while k <= len(ends) and ends[k - 1] < positions[j].end:
                    wanted.add(k)
                    k += 1
        wanted = sorted(wanted)
        view.own, view.agree = [0.0] * len(aligned), [False] * len(aligned)
        if not wanted:
            return
        rows = member.constrained_rows(member.logprobs(wanted), wanted)
        view.rows = dict(zip(wanted, rows, strict=True))
        stops = [i for i in member.stop_ids if i < rows.shape[-1]]
        if not sampler.greedy:  # the distributions actually sampled from
            rows = torch.stack([sampler.distribution(r) for r in rows]).clamp_min(1e-30).log()
        at = {m: k for k, m in enumerate(wanted)}
        own_ids = [ids[m] if m < len(ids) else 0 for m in wanted]
        own = rows.gather(1, torch.tensor(own_ids, device=rows.device)[:, None])[:, 0]
        own, best = own.exp().tolist(), rows.argmax(1).tolist()
        for j, m in enumerate(aligned):
            if m is None:
                continue
            if positions[j].token is None:  # the drafter stops here: its "token" is the stop
                row = rows[at[m]]
                stop = float(torch.logsumexp(row[stops], 0).exp()) if stops else 0.0
                rest = row.clone()
                rest[stops] = -math.inf
                view.own[j], view.agree[j] = stop, stop >= float(rest.max().exp())
            else:
                view.own[j], view.agree[j] = own[at[m]], best[at[m]] == ids[m]

    # --- verify and ensemble ----------------------------------------------------------------

    def _verify(
        self,
        request: Request,
        drafter: Member,
        positions: list[_Position],
        committed: str,
        full: str,
        start: int,
    ) -> Commit:
        stats, sampler = request.stats, request.sampler
        full_bytes = full.encode("utf-8")
        healers: dict[tuple[int, int], _Healer] = {}
        views: dict[int, _View] = {}  # built lazily: a cycle skipped by the gate needs none
        verifiers = [i for i in range(len(self.members)) if i != self.drafter]
        tokens = 0
        for j, pos in enumerate(positions):
            at = start + tokens
            own_d = self._own_drafter(pos, drafter, sampler)
            if self.aggregator == "gac" and own_d >= 0.5:  # GaC's own gate: a sure drafter
                request.emit(SkipConsensus(at))
                stats.count("skip_gate")
                tokens += 1
                continue
            mismatch = None
            for i in verifiers:
                if i not in views:
                    views[i] = self._view(self.members[i], full, positions)
                if views[i].aligned[j] is None and not (self.heal and pos.whole):
                    mismatch = self.members[i].name
                    break
            if mismatch is not None:
                request.emit(SkipMismatch(at, mismatch))
                stats.count("skip_mismatch")
                tokens += 1
                continue
            own, agree, healed = [own_d], [], {}
            self._fill_all([views[i] for i in verifiers], positions, sampler)
            for i in verifiers:
                view = views[i]
                if view.aligned[j] is not None and not view.spans[j]:
                    own.append(view.own[j])
                    agree.append(view.agree[j])
                    continue
                if view.aligned[j] is not None:  # read the drafted text from this boundary
                    healer, u = self._healer(healers, i, view, view.aligned[j]), b""
                else:  # read the partial word + drafted text from the last real boundary
                    healer = self._healer(healers, i, view, view.last[j])
                    u = full_bytes[view.last_bytes[j] : pos.boundary]
                q = self._healed(healer, u, [pos.string])[0]
                own.append(q)
                agree.append(q > 0.5)  # sound stand-in for "its argmax": no rival beats q
                healed[i] = (healer, u)
            if healed:
                stats.count(HEALED)
            if self._agreed(own, agree, sampler):
                request.emit(SkipConsensus(at))
                stats.count("skip_consensus")
                tokens += 1
                continue
            chosen, event = self._ensemble(j, pos, views, healed, sampler, at)
            request.emit(event)
            stats.ensembled += 1
            if chosen == EOS:
                text = full_bytes[len(committed.encode("utf-8")) : pos.boundary].decode("utf-8")
                return Commit(text, tokens + 1, "stop")
            piece, token, count = self._to_drafter(chosen, pos, sampler)
            if token is not None and token == pos.token:  # the ensemble kept the drafted token
                tokens += 1
                continue
            if count > 1:
                stats.count(EXTRA_TOKENS, count - 1)
            head = full_bytes[len(committed.encode("utf-8")) : pos.boundary].decode("utf-8")
            return Commit(head + piece, tokens + count)
        # every position accepted: the whole draft, and the stop if the drafter chose it
        stopped = bool(positions) and positions[-1].token is None
        return Commit(full[len(committed) :], tokens, "stop" if stopped else None)

    def _own_drafter(self, pos: _Position, drafter: Member, sampler: Sampler) -> float:
        if sampler.greedy:
            if pos.token is None:
                stops = [i for i in drafter.stop_ids if i < pos.row.shape[-1]]
                return float(torch.logsumexp(pos.row[stops], 0).exp())
            return float(pos.row[pos.token].exp())
        probs = sampler.distribution(pos.row)
        if pos.token is None:
            stops = [i for i in drafter.stop_ids if i < probs.shape[-1]]
            return float(probs[stops].sum())
        return float(probs[pos.token])

    @staticmethod
    def _agreed(own: list[float], agree: list[bool], sampler: Sampler) -> bool:
        if sampler.greedy:
            return consensus(own, agree)
        # App. H: accept the drafted token with probability min(1, P_ens / P_draft)
        ratio = (sum(own) / len(own)) / max(own[0], 1e-30)
        return sampler.uniform() < min(1.0, ratio)

    def _healer(self, healers, i: int, view: _View, m: int) -> _Healer:
        """A healer from the verifier's boundary m, seeded with the rows its own tokens after
        m already got in the cycle's forward pass (the likeliest spelling costs no pass)."""
        if (i, m) not in healers:
            healer = _Healer(view.member, self._index(i), m, view.rows[m])
            ids, k = view.member.ids, m + 1
            while k in view.rows:
                healer.rows[tuple(ids[m:k])] = view.rows[k].float().cpu()
                k += 1
            healers[(i, m)] = healer
        return healers[(i, m)]

    @staticmethod
    def _healed(healer: _Healer, u: bytes, strings: Sequence[str]) -> list[float]:
        """P(u + c) / P(u) for each candidate c (EOS: u, then the end of the turn)."""
        targets = [(u, False)] + [
            (u, True) if c == EOS else (u + c.encode("utf-8"), False) for c in strings
        ]
        values = healer.probs(targets)
        whole = values[0] if u else 1.0  # from a real boundary nothing needs dividing out
        return [v / whole if whole > 0 else 0.0 for v in values[1:]]

    def _ensemble(self, j, pos, views, healed, sampler, at) -> tuple[str, EnsemblePoint]:
        """P_ens over aligned candidate strings at position j, sharpened if overly smooth."""
        order = [self.drafter] + [i for i in views]  # drafter first, then verifiers
        rows = {self.drafter: pos.row}
        for i, view in views.items():
            if i not in healed:
                rows[i] = view.rows[view.aligned[j]]
        plain = [i for i in order if i in rows]
        vocabs = [self.members[i].vocab for i in plain]
        stops = [self.members[i].stop_ids for i in plain]
        if self.aggregator == "unite":
            aligned = unite_union(vocabs, stops, [rows[i] for i in plain], k=self.top_k)
            strings, probs = aligned.strings, dict(zip(plain, aligned.probs, strict=True))
            donors = None
            pool = list(range(len(strings)))
        else:
            union = self._gac_union()
            strings = union.strings
            probs = {i: union.project(i, rows[i]) for i in plain}
            pool_set = set()
            for i in plain:
                pool_set.update(torch.topk(probs[i], self.top_k).indices.tolist())
            if pos.string in union.index:
                pool_set.add(union.index[pos.string])
            pool = sorted(pool_set)
            donors = torch.zeros(len(strings), dtype=torch.bool)
            donors[pool] = True
        for i, (healer, u) in healed.items():
            values = torch.tensor(self._healed(healer, u, [strings[c] for c in pool]))
            row = torch.zeros(len(strings))
            row[pool] = values / values.sum() if float(values.sum()) > 0 else 0.0
            probs[i] = row
        matrix = torch.stack([probs[i] for i in order])
        eligible = self._drafter_top(pos.row, strings)
        scores, fired = sharpen(
            matrix, self.sharpening, strings, eligible, donors, threshold=self.threshold
        )
        pick = int(torch.argmax(scores)) if sampler.greedy else sampler.pick_probs(scores)
        chosen = strings[pick]
        event = EnsemblePoint(at, pos.string, chosen, top_candidates(strings, scores), fired)
        return chosen, event

    def _gac_union(self) -> UnionVocab:
        key = tuple(m.name for m in self.members)
        if key not in self._unions:
            vocabs, stops = [m.vocab for m in self.members], [m.stop_ids for m in self.members]
            self._unions[key] = UnionVocab(vocabs, stops)
        return self._unions[key]

    def _drafter_top(self, row: torch.Tensor, strings: list[str]) -> torch.Tensor:
        """Which candidates are among the drafter's top-k tokens (sharpening's candidates)."""
        drafter = self.members[self.drafter]
        top = set()
        for i in torch.topk(row, min(self.top_k, row.shape[-1])).indices.tolist():
            top.add(EOS if i in drafter.stop_ids else drafter.vocab.strings[i])
        mask = torch.zeros(len(strings), dtype=torch.bool)
        union = self._gac_union() if self.aggregator == "gac" else None
        if union is not None and strings is union.strings:
            where = union.index
        else:
            where = {s: k for k, s in enumerate(strings)}
        mask[[where[s] for s in top if s in where]] = True
        return mask

    def _to_drafter(self, chosen: str, pos: _Position, sampler: Sampler):
        """The text the choice commits, the drafter id it is (None: a string longer than any
        one drafter token) and how many drafter tokens it counts for.

        The choice means "the text continues with `chosen`": the drafter takes its own most
        likely token that starts with it (so a verifier's bare space never leaves the drafter
        in the middle of its own word), else the string itself."""
        drafter = self.members[self.drafter]
        index = self._index(self.drafter)
        ids = index.extending(chosen.encode("utf-8"))
        ids = ids[index.spelled[ids]] if len(ids) else ids
        dummy_start = pos.boundary == 0 and drafter.vocab.dummy_prefix
        if len(ids) and not dummy_start and bool(torch.isfinite(pos.row[ids]).any()):
            masked = torch.full_like(pos.row, -math.inf)
            masked[ids] = pos.row[ids]
            token = sampler.pick(masked)
            return drafter.vocab.strings[token], token, 1
        # no such token (or none a request's grammar allows): the string itself
        return chosen, None, max(1, len(drafter.vocab.encode(chosen)))


def _partial_end(member: Member) -> bool:
    """The member's text ends inside a UTF-8 character (a byte token mid-character)."""
    ends = member.token_ends
    return bool(ends) and len(member.text.encode("utf-8")) < ends[-1]


METHOD = Safe
