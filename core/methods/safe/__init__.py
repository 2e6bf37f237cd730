"""SAFE: ensemble only where it is safe and needed (Yun et al., ICLR 2026, arXiv 2510.15346).

Algorithm 1 of the paper, as `Safe.run` and `Safe._verify` read it:

  while the turn goes on:
      Generate: the drafter drafts the next tokens (`lookahead` of them);
      Verify:   every verifier reads committed text + draft in its own tokens, one forward pass;
      for each drafted position j, earliest first:
          skip j if token j-1 is "OOV-like" (the text before token j does not end on a token
              boundary of EVERY verifier: one would be read inside one of its tokens),
          or if the members already agree (consensus: every verifier's argmax is its own next
              token, or the average over all members, drafter included, of the probability
              each gives its own next token is above 1/2; either makes the drafted token the
              plain average's argmax, the paper's Theorem 1),
          or, with GaC, if the drafter is sure of its token (GaC's gate);
          Ensemble at the first j not skipped: P_ens over aligned candidate strings (UniTE or
              GaC), sharpened where overly smooth; its choice replaces token j, the rest of the
              draft is dropped, and the drafter resumes from there.

The loop talks to small parts (the shape of transformers' candidate generators, and of vLLM's
proposer / scorer / acceptance):
- the proposer (`drafting.Proposer`): the drafter and its draft-length strategy (`propose`,
  and `update` with whether the draft was accepted whole);
- the verifiers' scoring (`scoring.Readings`): where each position sits in each verifier's
  tokens, and what each verifier says there;
- the skip rules (this module: `consensus`, the OOV-like check, GaC's gate);
- the ensemble step (`ensembling.Ensembler`): P_ens and its choice, which the `remap` rule
  (`drafting.Likeliest` / `drafting.AsAligned`) continues onto the drafter.

Every member is then synced back to the committed text (`Member.sync` does every rollback).

Rules the paper leaves to its code are options; `preset="authors"` follows the authors'
released code (SAFE/safe_generate_unite.py, SAFE/safe_generate_gac.py) on each
(docs/departures.md lists what each changes, measured), and `preset="paper"` runs the paper's
loop as the paper states it (its main results' heuristic sharpening, our extensions off, the
rules it leaves open as the library decides them):
- `stop_check`: how the drafter's stop is read. "mass": as one event, the turn ending (in the
  consensus check a verifier's own "token" there is its stop, with its stop mass; among the
  ensemble's candidates one `EOS` carries each member's stop mass). "text" (authors): as the
  text the code decodes it into ("<|end|>"): a verifier reads the first token of its own
  tokenization of that text (`scoring`), and each member's stop is a candidate of its own,
  spelled as its text; a winning stop text ends the turn (`core.alignment`).
- `remap`: how the ensemble's choice continues the drafter (`drafting`). "likeliest": its own
  likeliest token that starts with the chosen string. "as-aligned" (authors): the one id the
  drafter's UniTE column was read from (GaC: the string's tokens), appended to the drafter's
  own ids as they are, and the drafter redrafts from there at every ensemble point.
- `subtoken` ("first" | "nonblank", authors): UniTE's value for a string outside a member's
  top-k (`core.alignment.SUBTOKEN_RULES`).

Other decisions the paper leaves open (research notes, safe.md section 6):
- Boundaries are byte offsets, and a verifier's "own next token" is its next id in its
  canonical tokenization of committed text + draft (`scoring`). Probabilities are
  full-vocabulary softmaxes (greedy) or the sampler's distributions (sampling). "Above 1/2"
  is strict: an average of exactly 1/2 may tie, so it is ensembled (the code skips it; it
  takes a probability of exactly 0 or 1 to tie, which the testbed never gives).
- E/T = ensemble points / output tokens (drafter tokenization, stop included); a point that
  keeps the drafted token counts. Every output token is an ensemble point or one skip reason.
- GaC: its own gate (drafter probability >= 1/2 skips, "skip_gate") is checked first: it needs
  only the drafter, so a draft the drafter is sure of costs no verifier pass. Thresholds are on
  the mean, so the authors' doubled thresholds (GaC sums) need no doubling here.
- Sampling (App. H): condition 1 is dropped; the drafted token is accepted with probability
  min(1, mean own-token probability / the drafter's); otherwise P_ens is sampled (no residual
  correction: the union's candidates are not the drafter's vocabulary).

The ensemble's member trust (`core.trust`) meets the loop at narrow hooks. Unless `drafter=` is
given, the member trusted most drafts. P_ens and the consensus check's average are weighted by
the trust, in the weighted form of the paper's App. H. Each ensemble point reports which
members' likeliest strings backed the committed one (`ensembling`). Consensus skips report
nothing, for two reasons. The drafter's own probability helps decide them, so counting them
makes whoever drafts look right. And a verifier's "agreement" there is with its own next token,
which a coarse tokenizer (whole words, whole numbers) gets right less often than a fine one
does. With equal weights, all of this is the paper's loop, bit for bit.

Two extensions plug in as parts beside the paper's loop, both on by default (the library's
defaults are the configuration that measured best: `heal=True`, `sharpen="geometric"`,
`max_lookahead=20`; `preset="paper"` turns both off and sharpens as the paper's main results do):
- `heal=True` (or "oov"): read a verifier by text where its tokens and the drafter's do not
  line up (`heal.py`, a part of the verifiers' scoring).
- `max_lookahead`: drafts that grow while they are accepted whole (`drafting.GrowingLength`, a
  draft-length strategy). Every drafted position is still checked; what changes is where
  drafts end, and a verifier reads the text cut there. When the drafter's tokens are the
  coarser ones that changes nothing (the same text on 200/200 testbed problems); when the
  drafter is finer, a cut can fall inside a verifier's token and make that position look
  aligned, so texts differ (use it with `heal=True` there, which reads a cut token as text).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...aggregate import SHARPENINGS
from ...alignment import AGGREGATORS, GATE, SUBTOKEN_RULES, Aligner
from ...events import Event, SkipConsensus, SkipGate, SkipMismatch
from ...member import Member
from ...sampling import Sampler
from ...validate import check_int, check_real
from ...vocab import ByteIndex
from ..base import Commit, Method, Request, check_choice, pick_member
from .drafting import (
    AsAligned,
    Draft,
    DraftLength,
    FixedLength,
    GrowingLength,
    Likeliest,
    Position,
    Proposer,
    Remap,
)
from .ensembling import Ensembler
from .heal import HEALED, HealCycle, NoHeal
from .scoring import STOP_CHECKS, Readings, drafter_own
from .words import DECISIONS, WordDecision, starts_word

# Every output token (drafter tokenization) is exactly one of these, so they add up to
# `stats.tokens`: E (ensemble points) + skips + tokens an ensembled string added beyond its first.
SKIP_REASONS = ("skip_mismatch", "skip_consensus", "skip_gate")
EXTRA_TOKENS = "ensemble_extra_tokens"

REMAPS = ("likeliest", "as-aligned")
# The rules as the library decides them.
RULES = {"stop_check": "mass", "remap": "likeliest", "subtoken": "first"}
# What a preset sets: the rules, the sharpening and our two extensions. The library's defaults
# (the configuration that measured best: README, "The default"), then each preset: the paper's
# loop as it states it (its main results' heuristic sharpening, fixed 5-token drafts, no text
# reading), and the authors' released code (the same, with their rules).
DEFAULTS = {**RULES, "sharpen": "geometric", "heal": True, "max_lookahead": 20, "decide": "word"}
PUBLISHED = {"sharpen": "heuristic", "heal": False, "max_lookahead": None, "decide": "token"}
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


def _consensus_reading(
    readings: Readings, verifiers: list[int], j: int, own_d: float, weights: list[float] | None
) -> bool:
    """`consensus` at position j (greedy), reading the verifiers one at a time: once the average
    with every verifier not read yet counted as 0 is above one half, the whole average is too
    (adding what the others give cannot lower it), so they need no forward pass. Verifiers
    read by text (`heal`, the dearer reading) come last. The same decision as reading all."""
    order = sorted(range(len(verifiers)), key=lambda k: readings.healed(verifiers[k], j))
    own, agree = [own_d] + [0.0] * len(verifiers), [False] * len(verifiers)
    for k in order:
        if _mean(own, weights) > 0.5:
            return True
        own[k + 1], agree[k] = readings.own(verifiers[k], j)
    return consensus(own, agree, weights)


def _mean(values: Sequence[float], weights: Sequence[float] | None) -> float:
    if weights is None:
        return sum(values) / len(values)
    return sum(w * v for w, v in zip(weights, values, strict=True)) / sum(weights)


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
        decide: str = DEFAULT,
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
            decide=decide,
        )
        sharpen, heal, max_lookahead = rules["sharpen"], rules["heal"], rules["max_lookahead"]
        self.decide = rules["decide"]
        self.words = WordDecision() if self.decide == "word" else None
        # None: the member the ensemble trusts most drafts (the first while all are trusted alike)
        self.drafter = 0 if drafter is None else pick_member(self.members, drafter, "drafter")
        self.drafter_given = drafter is not None
        self.lookahead = lookahead
        self.max_lookahead = max_lookahead or lookahead
        self.heal = heal is not False
        self.heal_spans = heal is True  # "oov": not where a verifier's token ends inside ours
        self.preset = preset
        self.stop_check, self.remap, self.subtoken = (rules[k] for k in RULES)
        # shared by every request's copy: GaC's union and the byte indexes, built once
        self.aggregator = aggregator
        aligner = Aligner(aggregator, top_k, self.subtoken, stops_as_text=self.stop_check == "text")
        self.ensembler = Ensembler(aligner, sharpen, threshold)
        self._indexes: dict[str, ByteIndex] = {}

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
            "sharpen": self.ensembler.sharpening,
            "heal": "oov" if self.heal and not self.heal_spans else self.heal,
            "decide": self.decide,
            "preset": self.preset,
            **{k: getattr(self, k) for k in RULES},
        }

    # --- the loop ---------------------------------------------------------------------------

    def run(self, request: Request) -> Iterator[Commit]:
        drafter = self.members[self.drafter]
        proposer = Proposer(drafter, self._draft_length())
        remap = self._remap()
        while request.remaining > 0:
            draft = proposer.propose(request)  # Generate
            if draft is None:  # the drafter's context window is full
                yield Commit("", 0, "length")
                return
            if draft.text is None:  # bytes no verifier can read: taken as the drafter wrote them
                commit = self._unverifiable(request, draft)
            else:
                commit, drafter_ids = self._verify(request, draft, remap)  # Verify, Ensemble
                self._settle(draft, commit, drafter_ids)
                proposer.update(accepted_whole=commit.text == draft.tail)
            yield commit
            if commit.finish:
                return

    def _verify(
        self, request: Request, draft: Draft, remap: Remap
    ) -> tuple[Commit, list[int] | None]:
        """The earliest position no skip rule covers is ensembled, and the choice ends the
        commit there (unless it keeps the drafted token: the scan goes on); no such position:
        the whole draft (and its stop) is committed. Also returns the drafter ids to keep as
        they are, where `remap` gives them."""
        readings = self._readings(request, draft)
        tokens = 0
        held: list[Event] = []  # the current word's skips (decide="word" may withdraw them)
        for j, pos in enumerate(draft.positions):
            at = draft.start + tokens
            if self.words is None or starts_word(pos):
                self._report(request, held)
            skip = self._why_skip(request, readings, j, pos, at)
            if skip is None:
                word = self._decide_word(request, draft, j, held) if self.words else None
                if word is not None:  # the word decided: its skips are withdrawn
                    return word
                self._report(request, held)
                decided = self._ensemble(request, draft, readings, remap, j, tokens)
                if decided is not None:
                    return decided
            else:
                held.append(skip)
            tokens += 1
        self._report(request, held)
        return Commit(draft.tail, tokens, "stop" if draft.stopped else None), None

    @staticmethod
    def _report(request: Request, skips: list[Event]) -> None:
        """Emit and count the skips held so far."""
        for skip in skips:
            request.emit(skip)
            request.stats.count(skip.name)
        skips.clear()

    def _decide_word(
        self, request: Request, draft: Draft, j: int, held: list[Event]
    ) -> tuple[Commit, None] | None:
        """decide="word": the ensemble point at position j decides its whole word; the skips
        held inside that word are withdrawn (its decision covers those tokens). None: not
        decided as a word (`WordDecision.decide`)."""
        decided = self.words.decide(request, self.members, self.drafter, draft, j)
        if decided is None:
            return None
        self._report(request, held[: len(held) - (j - decided.start)])
        held.clear()
        if decided.full:  # no member can add text: every window is full
            return Commit(draft.head(draft.positions[decided.start]), decided.start, "length"), None
        request.stats.ensembled_tokens += 1
        if decided.tokens > 1:
            request.stats.count(EXTRA_TOKENS, decided.tokens - 1)
        head = draft.head(draft.positions[decided.start])
        finish = "stop" if decided.ended else None
        return Commit(head + decided.text, decided.start + decided.tokens, finish), None

    def _ensemble(
        self,
        request: Request,
        draft: Draft,
        readings: Readings,
        remap: Remap,
        j: int,
        tokens: int,
    ) -> tuple[Commit, list[int] | None] | None:
        """Ensemble at position j: the commit the choice ends the draft with, or None where it
        keeps the drafted token (or no whole string is allowed in its place)."""
        pos = draft.positions[j]
        at = draft.start + tokens
        choice = self.ensembler.choose(
            self.members, self.drafter, readings, j, pos, at, request.sampler, request.trust
        )
        request.emit(choice.event)
        request.stats.ensembled_tokens += 1
        if choice.string in choice.stops:
            return Commit(draft.head(pos), tokens + 1, "stop"), None
        if choice.string is None:
            return None
        then = remap.continuation(draft, j, choice.string, request.sampler)
        if then.token == pos.token and then.token is not None and not remap.redraft_on_same:
            return None
        if then.tokens > 1:
            request.stats.count(EXTRA_TOKENS, then.tokens - 1)
        return Commit(draft.head(pos) + then.text, tokens + then.tokens), then.drafter_ids

    # --- the skip rules -----------------------------------------------------------------------

    def _why_skip(
        self, request: Request, readings: Readings, j: int, pos: Position, at: int
    ) -> Event | None:
        """Why position j needs no ensemble: GaC's gate (the drafter is sure), a verifier that
        cannot be read there (OOV-like), or consensus. None: ensemble here."""
        drafter = self.members[self.drafter]
        own_d = drafter_own(pos, drafter, request.sampler, self.stop_check)
        if self.aggregator == "gac" and own_d >= GATE:  # no verifier needed
            return SkipGate(at, drafter.name, own_d)
        for i in self.verifiers:
            if not readings.readable(i, j):
                return SkipMismatch(at, self.members[i].name)
        if any(readings.healed(i, j) for i in self.verifiers):
            request.stats.count(HEALED)
        names = [self.members[i].name for i in [self.drafter, *self.verifiers]]
        weights = request.trust.of(names)  # None: all trusted alike, the paper's plain mean
        if request.sampler.greedy and not readings.concurrent:
            agreed = _consensus_reading(readings, self.verifiers, j, own_d, weights)
        else:
            readings.score()
            own, agree = [own_d], []
            for i in self.verifiers:
                q, agrees = readings.own(i, j)
                own.append(q)
                agree.append(agrees)
            agreed = self._agreed(own, agree, request.sampler, weights)
        return SkipConsensus(at) if agreed else None

    @staticmethod
    def _agreed(
        own: list[float], agree: list[bool], sampler: Sampler, weights: list[float] | None
    ) -> bool:
        if sampler.greedy:
            return consensus(own, agree, weights)
        # App. H: accept the drafted token with probability min(1, P_ens / P_draft)
        ratio = _mean(own, weights) / max(own[0], 1e-30)
        return sampler.uniform() < min(1.0, ratio)

    # --- the parts, per request -------------------------------------------------------------

    def _draft_length(self) -> DraftLength:
        if self.max_lookahead > self.lookahead:
            return GrowingLength(self.lookahead, self.max_lookahead)
        return FixedLength(self.lookahead)

    def _remap(self) -> Remap:
        drafter = self.members[self.drafter]
        if self.remap == "as-aligned":
            return AsAligned(drafter, self.ensembler.aligner)
        return Likeliest(drafter, self._index(self.drafter))

    def _readings(self, request: Request, draft: Draft) -> Readings:
        heal = (
            HealCycle(self.heal_spans, self._index, draft.positions, draft.text)
            if self.heal
            else NoHeal()
        )
        verifiers = {i: self.members[i] for i in self.verifiers}
        drafter = self.members[self.drafter]
        return Readings(verifiers, draft, drafter, self.stop_check, heal, request.sampler)

    def _index(self, i: int) -> ByteIndex:
        """Member i's tokens by bytes (keyed by name: a member leaving a request shifts i)."""
        member = self.members[i]
        if member.name not in self._indexes:
            self._indexes[member.name] = ByteIndex(member.vocab, member.stop_ids)
        return self._indexes[member.name]

    def _settle(self, draft: Draft, commit: Commit, drafter_ids: list[int] | None) -> None:
        """Every member back to the committed text (the drafter to `drafter_ids`, if given)."""
        if drafter_ids is not None:
            self.members[self.drafter].sync_ids(drafter_ids)
        for member in self.members:
            member.sync(draft.committed + commit.text)

    def _unverifiable(self, request: Request, draft: Draft) -> Commit:
        """A draft whose bytes are not valid UTF-8 (a random model's stray byte): no verifier
        can read it, so it is committed as the drafter alone would commit it."""
        drafter = self.members[self.drafter]
        n = len(draft.ids) + int(draft.stopped)
        for j in range(n):
            request.emit(SkipMismatch(draft.start + j, drafter.name))
        request.stats.count("skip_mismatch", n)
        committed = draft.committed
        text = drafter.text[len(committed) :] if drafter.text.startswith(committed) else ""
        for member in self.members:
            member.sync(committed + text)
        return Commit(text, n, "stop" if draft.stopped else None)


# --------------------------------------------------------------------------------------------
# Options.


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
    for key, value in given.items():  # the rules take None for "not given" too
        if value is not DEFAULT and not (value is None and key in RULES):
            rules[key] = value
    check_choice("stop_check", rules["stop_check"], STOP_CHECKS)
    check_choice("remap", rules["remap"], REMAPS)
    check_choice("subtoken", rules["subtoken"], SUBTOKEN_RULES)
    check_choice("sharpen", rules["sharpen"], (*SHARPENINGS, None))
    check_choice("heal", rules["heal"], (False, True, "oov"))
    check_choice("decide", rules["decide"], DECISIONS)
    grow = rules["max_lookahead"]
    if grow is not None:  # None: every draft `lookahead` tokens, as in the paper
        check_int("max_lookahead", grow, low=lookahead, example=max(20, lookahead))
    return rules


METHOD = Safe
