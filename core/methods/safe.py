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

Three rules the paper leaves to its code are options; `preset="authors"` follows the authors'
released code on all three (docs/departures.md lists what each changes, measured), and
`preset="paper"` runs the paper's loop as the paper states it (its main results' heuristic
sharpening, our extensions off, the rules it leaves open as the library decides them):
- `stop_check`: "mass" = at the drafter's stop, a verifier's own "token" is the stop, with its
  stop mass (all its stop ids) as the probability and "argmax" meaning the stop mass beats every
  other id; "text" (authors) = the stop is decoded into the text ("<|end|>") and a verifier reads
  the first token of its own tokenization of that text, which it rarely expects, so SAFE almost
  always ensembles at the drafter's stop.
- `remap`: how the ensemble's choice continues the drafter. "likeliest" = the choice means "the
  text continues with this string": the drafter commits its own likeliest token that starts with
  it (one token), else the string itself (re-tokenized canonically; its extra drafter tokens are
  counted); "as-aligned" (authors) = UniTE: the drafter id its column was read from (its top-k
  id, else its sub-token by `subtoken`), one token even when it spells only part of the string;
  GaC: the string's own tokens.
- `subtoken` (UniTE's alignment, `core.vocab.SUBTOKEN_RULES`): "first" = a string outside a
  member's top-k reads its first sub-token (" 12" -> "▁" for a digit-splitting tokenizer);
  "nonblank" (authors) = its first sub-token that is not a bare space (" 12" -> "1").

Other decisions the paper leaves open (research notes, safe.md section 6):
- Boundaries are byte offsets: position j is aligned for a verifier when the byte offset where
  drafter token j-1 ends is one of its token ends (no decoded-string compare, no lstrip); a
  boundary inside a UTF-8 character never aligns.
- A verifier's "own next token" is its next id in its canonical tokenization of committed text +
  draft. Probabilities are full-vocabulary softmaxes (greedy) or the sampler's distributions
  (sampling). "Above 1/2" is strict: an average of exactly 1/2 may tie, so it is ensembled.
- A choice that is the drafted token changes nothing, and the scan goes on through the same
  draft (what greedy redrafting would give).
- E/T = ensemble points / output tokens (drafter tokenization, stop included); a point that
  keeps the drafted token counts. Every output token is an ensemble point or one skip reason.
- GaC: its own gate (drafter probability >= 1/2 skips, "skip_gate") is checked first: it needs
  only the drafter, so a cycle the drafter is sure of costs no verifier pass. Thresholds are on
  the mean, so the authors' doubled thresholds (GaC sums) need no doubling here.
- Sampling (App. H): condition 1 is dropped; the drafted token is accepted with probability
  min(1, mean own-token probability / the drafter's); otherwise P_ens is sampled (no residual
  correction: the union's candidates are not the drafter's vocabulary).

The ensemble's member trust (`core.trust`) meets the loop at narrow hooks. Unless `drafter=` is
given, the member trusted most drafts. P_ens and the consensus check's average are weighted by
the trust, in the weighted form of the paper's App. H. Each ensemble point reports which
members' likeliest strings backed the committed one. Consensus skips report nothing, for two
reasons. The drafter's own probability helps decide them, so counting them makes whoever
drafts look right. And a verifier's "agreement" there is with its own next token, which a
coarse tokenizer (whole words, whole numbers) gets right less often than a fine one does.
With equal weights, all of this is the paper's loop, bit for bit.

Two extensions sit beside the paper's loop, both on by default (the library's defaults are the
configuration that measured best: `heal=True`, `sharpen="geometric"`, `max_lookahead=20`;
`preset="paper"` turns both off and sharpens as the paper's main results do):
- `heal=True` (or "oov"): read a verifier by text where its tokens and the drafter's do not line
  up (`safe_heal.py`, behind one per-cycle object: where a verifier's tokens sit, whether a
  position is read by text, the extra rows that needs, and the readings).
- `max_lookahead`: a draft that stands whole (no position replaced) doubles the next draft's
  length, up to `max_lookahead`, and any replacement brings it back to `lookahead`: fewer
  cycles, so fewer verifier passes (each costs one forward call whatever its length) where the
  members agree for long stretches. Every drafted position is still checked; what changes is
  where drafts end, and a verifier reads the text cut there. When the drafter's tokens are the
  coarser ones that changes nothing (the same text on 200/200 testbed problems); when the
  drafter is finer, a cut can fall inside a verifier's token and make that position look
  aligned, so texts differ (use it with `heal=True` there, which reads a cut token as text).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..aggregate import SHARPENINGS, sharpen
from ..events import (
    Drafted,
    EnsemblePoint,
    Event,
    SkipConsensus,
    SkipGate,
    SkipMismatch,
)
from ..member import Draft, Member
from ..parallel import each
from ..sampling import Sampler
from ..trust import backers
from ..validate import check_int, check_real
from ..vocab import EOS, SUBTOKEN_RULES, ByteIndex, UnionVocab, stop_logprob, unite_union
from .base import Commit, Method, Request, check_choice, pick_member
from .safe_heal import HEALED, HealCycle, NoHeal
from .token import AGGREGATORS, GATE, top_candidates

# Every output token (drafter tokenization) is exactly one of these, so they add up to
# `stats.tokens`: E (ensemble points) + skips + tokens an ensembled string added beyond its first.
SKIP_REASONS = ("skip_mismatch", "skip_consensus", "skip_gate")
EXTRA_TOKENS = "ensemble_extra_tokens"

STOP_CHECKS = ("mass", "text")
REMAPS = ("likeliest", "as-aligned")
# The three rules as the library decides them.
RULES = {"stop_check": "mass", "remap": "likeliest", "subtoken": "first"}
# What a preset sets: the three rules, the sharpening and our two extensions. The library's
# defaults (the configuration that measured best: README, "The default"), then each preset: the
# paper's loop as it states it (its main results' heuristic sharpening, fixed 5-token drafts, no
# text reading), and the authors' released code (the same, with their three rules).
DEFAULTS = {**RULES, "sharpen": "geometric", "heal": True, "max_lookahead": 20}
PUBLISHED = {"sharpen": "heuristic", "heal": False, "max_lookahead": None}
PRESETS = {
    "paper": PUBLISHED,
    "authors": {"stop_check": "text", "remap": "as-aligned", "subtoken": "nonblank", **PUBLISHED},
}


class _Default:
    """An option left out: the preset's value, else the library's default (`DEFAULTS`)."""

    def __repr__(self) -> str:
        return "DEFAULT"


DEFAULT: Any = _Default()

__all__ = ["EXTRA_TOKENS", "HEALED", "PRESETS", "SKIP_REASONS", "Safe", "consensus"]


def consensus(
    own: Sequence[float], agree: Sequence[bool], weights: Sequence[float] | None = None
) -> bool:
    """SAFE's skip rule (Ensemble Distribution Verification). `own[0]` is the drafter's
    probability of its own token, `own[1:]` each verifier's probability of ITS own next token
    at the aligned boundary; `agree[i]` says whether verifier i's argmax is that token.

    Skip when every verifier agrees (the drafter, greedy, agrees by construction) or when the
    average own-token probability is above 1/2: either way the drafted token is the argmax of
    the plain average (Theorem 1), so ensembling cannot change it. Ties (exactly 1/2) do not
    skip: two candidates could then share the maximum. With member `weights` (in `own`'s
    order) the average is the weighted one the ensemble then takes (the paper's App. H)."""
    return all(agree) or _mean(own, weights) > 0.5


def _mean(values: Sequence[float], weights: Sequence[float] | None) -> float:
    if weights is None:
        return sum(values) / len(values)
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)


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
    stop_id: int | None = None  # the stop: the drafter's likeliest stop id


@dataclass
class _View:
    """A verifier synced to committed text + draft: where each position sits in its tokens."""

    member: Member
    aligned: list[int | None]  # its token index at each position's boundary (None: OOV-like)
    stop_token: int | None = None  # stop_check="text": its first token of the stop's text
    own: list[float] = field(default_factory=list)  # P(its own next token) where aligned
    agree: list[bool] = field(default_factory=list)  # its argmax is its own next token
    rows: dict[int, torch.Tensor] = field(default_factory=dict)  # token index -> log-probs
    filled: bool = False  # rows, own and agree computed (one forward pass)


@dataclass
class _Cycle:
    """One draft under verification: what every step of `_verify` reads."""

    request: Request
    drafter: Member
    positions: list[_Position]
    committed: str
    full: str  # committed text + the draft
    start: int  # output token index of the draft's first token
    heal: NoHeal | HealCycle
    views: dict[int, _View] = field(default_factory=dict)  # built lazily, in verifier order

    def head(self, pos: _Position) -> str:
        """The draft's text before position `pos`."""
        data = self.full.encode("utf-8")
        return data[len(self.committed.encode("utf-8")) : pos.boundary].decode("utf-8")


class Safe(Method):
    name = "safe"
    min_members = 2
    member_options = ("drafter",)

    def __init__(
        self,
        members,
        drafter: int | str | None = None,
        lookahead: int = 5,
        aggregator: str = "unite",
        top_k: int = 10,
        sharpen: str | None = DEFAULT,
        threshold: float = 0.1,
        heal: bool | str = DEFAULT,
        max_lookahead: int | None = DEFAULT,
        preset: str | None = None,
        stop_check: str | None = None,
        remap: str | None = None,
        subtoken: str | None = None,
    ) -> None:
        super().__init__(members)
        _check_options(aggregator, lookahead, top_k, threshold)
        rules = _rules(
            preset,
            lookahead,
            stop_check=stop_check,
            remap=remap,
            subtoken=subtoken,
            sharpen=sharpen,
            heal=heal,
            max_lookahead=max_lookahead,
        )
        sharpen, heal, max_lookahead = rules["sharpen"], rules["heal"], rules["max_lookahead"]
        # None: the member the ensemble trusts most drafts (the first while all are trusted alike)
        self.drafter = 0 if drafter is None else pick_member(self.members, drafter, "drafter")
        self.drafter_given = drafter is not None
        self.lookahead = lookahead
        self.max_lookahead = max_lookahead or lookahead
        self.aggregator = aggregator
        self.top_k = top_k
        self.sharpening = sharpen
        self.threshold = float(threshold)
        self.heal = heal is not False
        self.heal_spans = heal is True  # "oov": not where a verifier's token ends inside ours
        self.preset = preset
        self.stop_check, self.remap, self.subtoken = (rules[k] for k in RULES)
        self._tables: dict = {}  # vocabulary-derived tables, built once, shared by copies

    @property
    def active(self) -> list[Member]:
        """The drafter first (it owns the output tokenization), then the verifiers."""
        d = self.drafter
        return [self.members[d]] + [m for i, m in enumerate(self.members) if i != d]

    def trusting(self, weights: dict[str, float]) -> Safe:
        """Unless `drafter=` was given, the member trusted most drafts (ties: the first)."""
        twin = self.bind(self.members)
        if not self.drafter_given:
            trust = [weights.get(m.name, 0.0) for m in self.members]
            twin.drafter = max(range(len(trust)), key=lambda i: (trust[i], -i))
        return twin

    @property
    def verifiers(self) -> list[int]:
        return [i for i in range(len(self.members)) if i != self.drafter]

    def summary(self) -> dict:
        return {
            **super().summary(),
            "drafter": self.members[self.drafter].name,
            "lookahead": self.lookahead,
            "max_lookahead": self.max_lookahead,
            "aggregator": self.aggregator,
            "sharpen": self.sharpening,
            "heal": "oov" if self.heal and not self.heal_spans else self.heal,
            "preset": self.preset,
            **{k: getattr(self, k) for k in RULES},
        }

    def _index(self, i: int) -> ByteIndex:
        """Member i's tokens by bytes (keyed by name: a member leaving a request shifts i)."""
        member = self.members[i]
        key = ("bytes", member.name)
        if key not in self._tables:
            self._tables[key] = ByteIndex(member.vocab, member.stop_ids)
        return self._tables[key]

    def _gac_union(self) -> tuple[UnionVocab, dict[str, int]]:
        """GaC's full union and its string index, built once per member set."""
        key = ("gac", *(m.name for m in self.members))
        if key not in self._tables:
            union = UnionVocab([m.vocab for m in self.members], [m.stop_ids for m in self.members])
            self._tables[key] = union, union.index
        return self._tables[key]

    # --- the loop ---------------------------------------------------------------------------

    def run(self, request: Request) -> Iterator[Commit]:
        drafter = self.members[self.drafter]
        size = self.lookahead
        while request.remaining > 0:
            committed = request.text
            drafter.sync(committed)
            base_n, base = drafter.n_tokens, len(committed.encode("utf-8"))
            draft = _draft(drafter, size, request.remaining, request.sampler)
            if not draft.ids and not draft.stopped:  # the drafter's context window is full
                yield Commit("", 0, "length")
                return
            start = request.stats.tokens
            request.emit(_drafted(drafter, draft, start))
            ends = drafter.token_ends[base_n:]
            raw = b"".join(drafter.vocab.token_bytes[i] for i in draft.ids)
            raw = raw[len(raw) - (ends[-1] - base if ends else 0) :]  # a dummy prefix's space
            try:
                tail = raw.decode("utf-8")
            except UnicodeDecodeError:  # bytes no text can hold: take them as the drafter would
                yield from _unverifiable(request, self.members, drafter, draft, committed, start)
                if draft.stopped:
                    return
                continue
            positions = _positions(draft, ends, base, raw, drafter.stop_ids)
            full = committed + tail
            heal = (
                HealCycle(self.heal_spans, self._index, positions, full) if self.heal else NoHeal()
            )
            cycle = _Cycle(request, drafter, positions, committed, full, start, heal)
            commit = self._verify(cycle)
            for member in self.members:  # every cache back to the committed text
                member.sync(committed + commit.text)
            yield commit
            if commit.finish:
                return
            stood = commit.text == tail  # the whole draft stood: draft further next time
            size = min(2 * size, self.max_lookahead) if stood else self.lookahead

    # --- verify: why skip here, or ensemble here ---------------------------------------------

    def _verify(self, cycle: _Cycle) -> Commit:
        """The earliest position that is neither skipped nor kept by the ensemble ends the
        cycle's commit there; if there is none, the whole draft (and its stop) is committed."""
        request, tokens = cycle.request, 0
        for j, pos in enumerate(cycle.positions):
            at = cycle.start + tokens
            skip = self._why_skip(cycle, j, pos, at)
            if skip is not None:
                request.emit(skip)
                request.stats.count(skip.name)
                tokens += 1
                continue
            commit = self._ensemble_here(cycle, j, pos, at, tokens)
            if commit is not None:
                return commit
            tokens += 1  # the ensemble kept the drafted token: scan on
        stopped = bool(cycle.positions) and cycle.positions[-1].token is None
        return Commit(cycle.full[len(cycle.committed) :], tokens, "stop" if stopped else None)

    def _why_skip(self, cycle: _Cycle, j: int, pos: _Position, at: int) -> Event | None:
        """Why position j needs no ensemble: GaC's gate (the drafter is sure), a verifier that
        cannot be read there (OOV-like), or consensus. None: ensemble here."""
        own_d = _own_drafter(pos, cycle.drafter, cycle.request.sampler, self.stop_check)
        if self.aggregator == "gac" and own_d >= GATE:  # needs no verifier pass
            return SkipGate(at, cycle.drafter.name, own_d)
        for i in self.verifiers:
            view = self._view(cycle, i)
            if view.aligned[j] is None and not cycle.heal.reads(i, j):
                return SkipMismatch(at, view.member.name)
        self._fill_all(cycle)
        own, agree = [own_d], []
        for i in self.verifiers:
            view = cycle.views[i]
            if cycle.heal.reads(i, j):
                q = cycle.heal.own(i, j, view)
                own.append(q)
                agree.append(q > 0.5)  # sound stand-in for "its argmax": no rival beats q
            else:
                own.append(view.own[j])
                agree.append(view.agree[j])
        if any(cycle.heal.reads(i, j) for i in self.verifiers):
            cycle.request.stats.count(HEALED)
        weights = self._trust(cycle, [self.drafter, *self.verifiers])
        agreed = self._agreed(own, agree, cycle.request.sampler, weights)
        return SkipConsensus(at) if agreed else None

    def _ensemble_here(
        self, cycle: _Cycle, j: int, pos: _Position, at: int, tokens: int
    ) -> Commit | None:
        """Ensemble at position j; the commit it ends the cycle with, or None when the choice is
        the drafted token itself (nothing changes)."""
        chosen, event = self._ensemble(cycle, j, pos, at)
        cycle.request.emit(event)
        cycle.request.stats.ensembled += 1
        if chosen is None:  # kept: no whole string was allowed in its place
            return None
        if chosen == EOS:
            return Commit(cycle.head(pos), tokens + 1, "stop")
        piece, token, count = self._to_drafter(chosen, pos, cycle.request.sampler)
        if token is not None and token == pos.token:
            return None
        if count > 1:
            cycle.request.stats.count(EXTRA_TOKENS, count - 1)
        return Commit(cycle.head(pos) + piece, tokens + count)

    # --- reading the members ----------------------------------------------------------------

    @staticmethod
    def _agreed(own: list[float], agree: list[bool], sampler: Sampler, weights=None) -> bool:
        if sampler.greedy:
            return consensus(own, agree, weights)
        # App. H: accept the drafted token with probability min(1, P_ens / P_draft)
        ratio = _mean(own, weights) / max(own[0], 1e-30)
        return sampler.uniform() < min(1.0, ratio)

    def _trust(self, cycle: _Cycle, order: list[int]) -> list[float] | None:
        """The ensemble's member trust for these members (None: all equal, the paper's mean)."""
        return cycle.request.trust.of([self.members[i].name for i in order])

    def _view(self, cycle: _Cycle, i: int) -> _View:
        """Verifier i synced to committed + draft, with each position found in its tokens
        (built once per cycle, on first need: a cycle skipped by the gate needs none)."""
        if i not in cycle.views:
            member = self.members[i]
            member.sync(cycle.full)
            aligned = _aligned(member, cycle.positions)
            stop_token = None
            if self.stop_check == "text" and cycle.positions[-1].token is None:
                stop_text = cycle.drafter.vocab.tokenizer.decode([cycle.positions[-1].stop_id])
                stop_token = _first_token_of(member, cycle.full, stop_text)
                if stop_token is None:  # its text merges into the verifier's previous token
                    aligned[-1] = None
            cycle.heal.place(i, member, aligned)
            cycle.views[i] = _View(member, aligned, stop_token)
        return cycle.views[i]

    def _fill_all(self, cycle: _Cycle) -> None:
        """Every verifier's one forward pass, concurrently where they live apart (remote)."""
        index = {cycle.views[i].member: i for i in self.verifiers}

        def fill(member: Member) -> None:
            extra = cycle.heal.rows(index[member], member)
            _fill(cycle.views[index[member]], cycle.positions, cycle.request.sampler, extra)

        each(list(index), fill)

    # --- the ensemble and the drafter's continuation ----------------------------------------

    def _ensemble(self, cycle: _Cycle, j: int, pos: _Position, at: int):
        """P_ens over aligned candidate strings at position j, sharpened if overly smooth; the
        choice is None where no candidate has any probability (see below)."""
        order = [self.drafter, *cycle.views]  # drafter first, then verifiers
        rows = {self.drafter: pos.row}
        for i, view in cycle.views.items():
            if not cycle.heal.reads(i, j):
                rows[i] = view.rows[view.aligned[j]]
        plain = [i for i in order if i in rows]
        if self.aggregator == "unite":
            strings, probs, pool, donors, where = self._unite(plain, rows)
        else:
            strings, probs, pool, donors, where = self._gac(plain, rows, pos)
        for i in cycle.views:
            if i not in rows:
                probs[i] = cycle.heal.column(i, j, cycle.views[i], strings, pool)
        matrix = torch.stack([probs[i] for i in order])
        eligible = _drafter_top(self.members[self.drafter], pos.row, self.top_k, strings, where)
        weights = self._trust(cycle, order)
        scores, fired = sharpen(
            matrix, self.sharpening, strings, eligible, donors, weights, threshold=self.threshold
        )
        sampler = cycle.request.sampler
        if float(scores.max()) <= 0:  # a grammar allows only part of a character here: no
            top = top_candidates(strings, scores)  # string can stand in for the drafted token
            return None, EnsemblePoint(at, pos.string, pos.string, top, fired)
        pick = int(torch.argmax(scores)) if sampler.greedy else sampler.pick_probs(scores)
        chosen = strings[pick]
        names = [self.members[i].name for i in order]  # the member trust's report: who backed it
        cycle.request.trust.update(backers(names, matrix, strings, pick))
        return chosen, EnsemblePoint(at, pos.string, chosen, top_candidates(strings, scores), fired)

    def _unite(self, plain: list[int], rows: dict[int, torch.Tensor]):
        vocabs = [self.members[i].vocab for i in plain]
        stops = [self.members[i].stop_ids for i in plain]
        aligned = unite_union(
            vocabs, stops, [rows[i] for i in plain], k=self.top_k, subtoken=self.subtoken
        )
        probs = dict(zip(plain, aligned.probs, strict=True))
        strings = aligned.strings
        where = {s: k for k, s in enumerate(strings)}
        return strings, probs, list(range(len(strings))), None, where

    def _gac(self, plain: list[int], rows: dict[int, torch.Tensor], pos: _Position):
        union, where = self._gac_union()
        probs = {i: union.project(i, rows[i]) for i in plain}
        pool_set = set()
        for i in plain:
            pool_set.update(torch.topk(probs[i], self.top_k).indices.tolist())
        if pos.string in where:
            pool_set.add(where[pos.string])
        pool = sorted(pool_set)
        donors = torch.zeros(len(union.strings), dtype=torch.bool)
        donors[pool] = True
        return union.strings, probs, pool, donors, where

    def _to_drafter(self, chosen: str, pos: _Position, sampler: Sampler):
        """The text the choice commits, the drafter id it is (None: a string longer than any
        one drafter token) and how many drafter tokens it counts for (see `remap`)."""
        drafter = self.members[self.drafter]
        if self.remap == "as-aligned":
            aligned_id = (
                _unite_id(drafter, chosen, pos.row, self.top_k, self.subtoken)
                if self.aggregator == "unite" and chosen != EOS
                else None
            )
            piece = drafter.vocab.strings[aligned_id] if aligned_id is not None else None
            if piece:  # UniTE: the one id its column was read from
                return piece, aligned_id, 1
            return chosen, None, max(1, len(drafter.vocab.encode(chosen)))  # GaC: its tokens
        # "likeliest": the drafter's own likeliest token that starts with the string (so a
        # verifier's bare space never leaves the drafter in the middle of its own word)
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


# --------------------------------------------------------------------------------------------
# Pieces of a cycle that need no method state.


def _check_options(aggregator, lookahead, top_k, threshold) -> None:
    check_choice("aggregator", aggregator, AGGREGATORS)
    check_int("lookahead", lookahead, low=1, example=5)  # the paper's 5
    check_int("top_k", top_k, low=1, example=10)  # the paper's 10
    check_real("threshold", threshold, low=0, high=1, high_open=True, example=0.1)


def _rules(preset: str | None, lookahead: int, **given) -> dict:
    """What a preset sets: each given option, else the preset's, else the library's default
    (whose drafts grow to at least `lookahead`)."""
    if preset is not None:
        check_choice("preset", preset, tuple(PRESETS))
    rules = {**DEFAULTS, **(PRESETS[preset] if preset else {})}
    if given["max_lookahead"] is DEFAULT and rules["max_lookahead"] is not None:
        rules["max_lookahead"] = max(rules["max_lookahead"], lookahead)
    for key, value in given.items():  # the three rules take None for "not given" too
        if value is not DEFAULT and not (value is None and key in RULES):
            rules[key] = value
    check_choice("stop_check", rules["stop_check"], STOP_CHECKS)
    check_choice("remap", rules["remap"], REMAPS)
    check_choice("subtoken", rules["subtoken"], SUBTOKEN_RULES)
    check_choice("sharpen", rules["sharpen"], (*SHARPENINGS, None))
    check_choice("heal", rules["heal"], (False, True, "oov"))
    grow = rules["max_lookahead"]
    if grow is not None:  # None: every draft `lookahead` tokens, as in the paper
        check_int("max_lookahead", grow, low=lookahead, example=max(20, lookahead))
    return rules


def _draft(drafter: Member, size: int, limit: int, sampler: Sampler) -> Draft:
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


def _unverifiable(request, members, drafter, draft, committed, start) -> Iterator[Commit]:
    """A draft whose bytes are not valid UTF-8 (a random model's stray byte): no verifier can
    read it, so it is committed as the drafter alone would commit it."""
    n = len(draft.ids) + int(draft.stopped)
    for j in range(n):
        request.emit(SkipMismatch(start + j, drafter.name))
    request.stats.count("skip_mismatch", n)
    text = drafter.text[len(committed) :] if drafter.text.startswith(committed) else ""
    for member in members:
        member.sync(committed + text)
    yield Commit(text, n, "stop" if draft.stopped else None)


def _top_strings(member: Member, row: torch.Tensor, k: int) -> list[tuple[int, str]]:
    """The member's top-k ids by probability and their candidate strings (EOS for a stop)."""
    ids = torch.topk(row, min(k, row.shape[-1])).indices.tolist()
    return [(i, EOS if i in member.stop_ids else member.vocab.strings[i]) for i in ids]


def _drafter_top(drafter: Member, row, k: int, strings: list[str], where: dict[str, int]):
    """Which candidates are among the drafter's top-k tokens (sharpening's candidates)."""
    mask = torch.zeros(len(strings), dtype=torch.bool)
    mask[[where[s] for _, s in _top_strings(drafter, row, k) if s in where]] = True
    return mask


def _unite_id(drafter: Member, chosen: str, row, k: int, subtoken: str) -> int | None:
    """UniTE's drafter id for a candidate string: its likeliest top-k id that spells it, else
    its sub-token for it (`subtoken`)."""
    for i, s in _top_strings(drafter, row, k):
        if s == chosen:
            return i
    return drafter.vocab.first_id(chosen, subtoken)


def _partial_end(member: Member) -> bool:
    """The member's text ends inside a UTF-8 character (a byte token mid-character)."""
    ends = member.token_ends
    return bool(ends) and len(member.text.encode("utf-8")) < ends[-1]


def _drafted(drafter: Member, draft: Draft, start: int) -> Drafted:
    strings = [drafter.vocab.strings[i] or repr(drafter.vocab.token_bytes[i]) for i in draft.ids]
    return Drafted(drafter.name, start, strings + ([EOS] if draft.stopped else []))


def _positions(draft: Draft, ends: list[int], base: int, raw: bytes, stop_ids) -> list[_Position]:
    positions = []
    for j in range(len(draft.ids) + int(draft.stopped)):
        boundary = base if j == 0 else ends[j - 1]
        offset = boundary - base
        whole = offset >= len(raw) or not 0x80 <= raw[offset] < 0xC0
        stop_id = None
        if j < len(draft.ids):
            token, end = draft.ids[j], ends[j]
            string = raw[offset : end - base].decode("utf-8", errors="replace")
        else:
            token, string, end = None, EOS, boundary
            stops = [i for i in stop_ids if i < draft.logprobs.shape[-1]]
            stop_id = max(stops, key=lambda i: float(draft.logprobs[j][i]), default=None)
        positions.append(_Position(boundary, token, string, draft.logprobs[j], whole, end, stop_id))
    return positions


def _own_drafter(pos: _Position, drafter: Member, sampler: Sampler, stop_check: str) -> float:
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


def _aligned(member: Member, positions: list[_Position]) -> list[int | None]:
    """Each position's token index in the member's tokens (its boundary is one of the member's
    token ends, on a character boundary, with a token after it), else None (OOV-like)."""
    ends, ids = member.token_ends, member.ids
    aligned = []
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
    return aligned


def _first_token_of(member: Member, full: str, stop_text: str) -> int | None:
    """stop_check="text": the member's first token of the drafter's stop text after `full`,
    tokenized as the authors' code does (the whole text, special tokens recognised), or None
    where that text merges into the member's previous token (no boundary there)."""
    ids = member.ids
    ext = member.vocab.tokenizer(full + stop_text, add_special_tokens=False)["input_ids"]
    return ext[len(ids)] if len(ext) > len(ids) and ext[: len(ids)] == ids else None


def _fill(view: _View, positions: list[_Position], sampler: Sampler, extra: set[int]) -> None:
    """One forward pass for every row the verifier gives this cycle (done at most once, and
    only when some position gets as far as the consensus check)."""
    if view.filled:
        return
    view.filled = True
    member, aligned, ids = view.member, view.aligned, view.member.ids
    wanted = sorted({m for m in aligned if m is not None} | extra)
    view.own, view.agree = [0.0] * len(aligned), [False] * len(aligned)
    if not wanted:
        return
    rows = member.logprobs(wanted)
    view.rows = dict(zip(wanted, rows, strict=True))
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
            view.own[j], view.agree[j] = own[at[m]], best[at[m]] == ids[m]
        elif view.stop_token is not None:  # the stop read as text: its first token there
            row = rows[at[m]]
            view.own[j] = float(row[view.stop_token].exp())
            view.agree[j] = best[at[m]] == view.stop_token
        else:  # the drafter stops here: its "token" is the stop, with the stop mass
            row = rows[at[m]]
            stop = float(stop_logprob(row, member.stop_ids).exp())
            rest = row.clone()
            rest[[i for i in member.stop_ids if i < row.shape[-1]]] = -math.inf
            view.own[j], view.agree[j] = stop, stop >= float(rest.max().exp())


METHOD = Safe
