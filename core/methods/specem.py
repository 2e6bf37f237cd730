"""SpecEM: segment-level ensembling by drafting, verifying in line, and voting with online feedback.

Each round every drafter continues the committed text by up to `segment_tokens` tokens from its
own cache. A candidate is cut at its last clean boundary (before a whitespace run; after
punctuation when it has no whitespace), so an unfinished word is regenerated next round instead
of being committed half-way. Every member then scores all distinct candidates in one forward pass
(`Member.score`: block mask, positions restarting at the prefix end) and the candidate with the
highest weighted vote is committed as one segment. The voting weights learn online (Hedge): a
member gains weight when the OTHER verifiers prefer its draft.

Decisions where the paper and the authors' code leave room (see the README for the reasons):
- score: mean token log-prob under the verifier, softmax over the distinct candidates (a
  verifier's unit vote spread by geometric-mean token probability); `score="prob"` (paper v1:
  mean token probability) and `score="logit"` (authors' code: mean raw logit) are sum-normalised;
  `score="min"` scores a candidate by its least likely token (see rerank); `score="pmi"` by
  how much more likely the request makes it than an empty user turn does (`core.methods.pmi`).
  A candidate that ended the turn includes the verifier's log-prob of ending there.
- self-judgment: a member's scores of its own draft count in the vote (as in the authors' code),
  never in its reward. After `Ensemble.calibrate`, each member's scores are softmaxed at a
  temperature of its calibrated self-preference over the least partial voter's
  (`core.trust.SelfPreference`, `vote_temperatures`): our extension, off until calibrated.
- reward: the win rate without the authors' floor of one win, so feedback also works for K = 2
  (with the floor every K = 2 reward is 1 and the weights never move).
- the weights are updated with the round's reward before the vote (as in the authors' code);
  eta_t = lr * sqrt(1/K) / t, t counting the updates since the weights were last reset (a round
  where every drafter wrote the same text has nothing to learn from: no update, t stays).
  `schedule="rounds"`: t counts rounds, as in the authors' code, which verifies identical
  drafts too (their rewards are all equal: an update that moves nothing but t).
- drafts continue the request's own decoding (greedy by default).
- `preset="paper"` follows the authors' code on both: drafts sampled at temperature 0.6 and
  top-p 0.9 (seeded by the request's seed), and schedule="rounds".
- a round whose drafts reach the token cap is committed uncut (the cap ends the text there
  anyway; cutting would only add rounds).
- "won/<member>" counts rounds whose candidates were verified; a round where every drafter wrote
  the same text is counted as "consensus" and credits no one.
- the learnable state (weights and t) is one `Feedback` object per request, so the method keeps
  no per-request state. Each request's weights start uniform, as in the paper. Where the
  ensemble's member trust (`core.trust`) is uneven, they start from it instead. A round's win
  rates are also the trust's reward for the drafters (the one hook: `request.trust.update`).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..config import GenerationConfig
from ..errors import InvalidConfigError
from ..events import SegmentCandidates, SegmentSelected, WeightsUpdated
from ..member import Member
from ..parallel import draft_each, each
from ..sampling import Sampler
from ..trust import PREFERENCE_SCORES, hedge
from ..validate import check_bool, check_int, check_real
from .base import Commit, Method, Request, check_choice, pick_member
from .pmi import check_empty_raw_prompt, pmi_shares, prior_scores

SCORES = ("logprob", "prob", "logit", "min", "pmi")
SOFTMAXED = PREFERENCE_SCORES  # scores spread over the candidates by a softmax (the trust's too)


def check_score(score: str, members: Sequence[Member]) -> None:
    """A candidate score these members can give: "logit" needs every member's raw logits."""
    check_choice("score", score, SCORES)
    for member in members if score == "logit" else ():
        if not member.gives_logits:
            raise InvalidConfigError(
                f"score='logit' needs raw logits, which member {member.name!r} (served "
                "over HTTP) cannot give; use score='logprob' or 'prob'."
            )


# Drafting as the authors' code does it (temperature 0.6, top-p 0.9: `Speculative_generate`).
PRESETS = {"paper": {"draft_temperature": 0.6, "draft_top_p": 0.9, "schedule": "rounds"}}
SCHEDULES = ("updates", "rounds")  # what t counts in eta_t = lr * sqrt(1/K) / t


# --- pure pieces (unit-testable without a model) ---------------------------------------------


def clean_cut(text: str) -> int:
    """Where the committed part of an unfinished draft ends (a character index).

    The last start of a whitespace run after a non-space (the committed text ends BEFORE the
    space, so the next word is tokenized canonically), or the end when the draft ends with
    punctuation. A draft without whitespace may end after its last punctuation mark. No
    boundary: the whole draft."""
    if text and _is_punct(text[-1]):
        return len(text)
    space = last_space_run(text)
    if space is not None:
        return space
    for i in range(len(text) - 1, 0, -1):
        if _is_punct(text[i - 1]):
            return i
    return len(text)


def last_space_run(text: str) -> int | None:
    """Where the last whitespace run after a non-space starts (the next word's start, its space
    read with it), or None."""
    for i in range(len(text) - 1, 0, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    return None


def _is_punct(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def reduced(values: torch.Tensor, score: str) -> float:
    """One candidate's token scores as one number: the least likely token's ("min"), the mean
    token probability ("prob"), else the mean ("logprob", "logit")."""
    v = values.double()
    if v.numel() == 0:  # cannot happen for a non-empty candidate; never wins if it does
        return -1e30 if score in SOFTMAXED else 0.0
    if score == "min":
        return max(float(v.min()), -1e30)
    return float(v.exp().mean() if score == "prob" else v.mean())


def normalise(values: Sequence[torch.Tensor], score: str, temperature: float = 1.0) -> list[float]:
    """One verifier's token scores of each distinct candidate -> shares that sum to 1.
    "logprob": mean token log-prob, "min": the least likely token's log-prob (each softmaxed
    over the candidates at `temperature`: the verifier's calibrated self-preference over the
    least partial verifier's); "prob" and "logit": mean token probability or raw logit,
    sum-normalised."""
    means = torch.tensor([reduced(v, score) for v in values], dtype=torch.float64)
    if score in SOFTMAXED:
        return torch.softmax(means / temperature, 0).tolist()
    total = float(means.sum())  # the authors' sum-normalisation (breaks on negative means)
    return (means / total).tolist() if total != 0 else [0.0] * len(values)


def vote_temperatures(request: Request, voters: Sequence[Member], score: str) -> list[float]:
    """Each voter's temperature for `normalise`: its calibrated self-preference over the least
    partial voter's (`core.trust.SelfPreference`); all 1 without a calibration in this score."""
    preference = request.trust.self_preference
    temperatures = None
    if preference is not None and preference.score == score:
        temperatures = preference.temperatures([m.name for m in voters])
    return temperatures or [1.0] * len(voters)


def member_shares(
    member: Member,
    texts: Sequence[str],
    ends: Sequence[bool],
    score: str,
    raw_prompt: bool,
    base: str,
    prior_base: str,
    temperature: float = 1.0,
) -> list[float]:
    """One member's vote over the candidates read after `base`: its `normalise`d scores (at
    its `temperature`), or with score="pmi" its gain over reading them after an empty turn and
    `prior_base` (one more pass, `core.methods.pmi`)."""
    values = member.score(texts, base=base, ends=ends, raw=score == "logit")
    if score == "pmi":
        return pmi_shares(values, prior_scores(member, texts, ends, raw_prompt, base=prior_base))
    return normalise(values, score, temperature)


def win_rates(matrix: torch.Tensor, authors: Sequence[int]) -> torch.Tensor:
    """Reward per member from `matrix[verifier, candidate]` (candidate c drafted by member
    `authors[c]`): the share of (judge, rival) pairs, judges being the OTHER verifiers, in which
    the member's candidate scored at least as high as the rival's. A member that did not draft
    gets the drafters' mean (it neither gains nor loses against an average drafter)."""
    k, d = matrix.shape
    rewards = torch.full((k,), float("nan"), dtype=torch.float64)
    for c, i in enumerate(authors):
        judges = [j for j in range(k) if j != i]
        rivals = [r for r in range(d) if r != c]
        wins = sum(bool(matrix[j, c] >= matrix[j, r]) for j in judges for r in rivals)
        rewards[i] = wins / max(len(judges) * len(rivals), 1)
    mean = rewards[list(authors)].mean()
    return torch.where(torch.isnan(rewards), mean, rewards)


@dataclass
class Feedback:
    """SpecEM's learnable state: the voting weights and how many updates their learning-rate
    schedule has made (eta_t = lr * sqrt(1/K) / t, t = updates so far)."""

    weights: torch.Tensor
    t: int = 0

    @classmethod
    def uniform(cls, k: int) -> Feedback:
        return cls(torch.full((k,), 1.0 / k, dtype=torch.float64))

    @classmethod
    def starting(cls, k: int, prior: Sequence[float] | None) -> Feedback:
        """Uniform weights (the paper's start), or the ensemble's member trust as the prior."""
        if prior is None:
            return cls.uniform(k)
        weights = torch.tensor(prior, dtype=torch.float64)
        return cls(weights / weights.sum())

    def update(self, rewards: torch.Tensor, lr: float) -> None:
        self.t += 1
        self.weights = hedge(self.weights, rewards, lr, self.t)

    def tick(self) -> None:
        """A round that moves only the schedule (schedule="rounds": identical drafts)."""
        self.t += 1

    def named(self, names: Sequence[str]) -> dict[str, float]:
        return {n: float(w) for n, w in zip(names, self.weights, strict=True)}


# --- the method --------------------------------------------------------------------------------


@dataclass
class _Candidate:
    text: str
    ended: bool
    authors: list[int] = field(default_factory=list)  # drafter positions (in self.drafters)


@dataclass
class _Scores:
    """One round's verification: shares[member, candidate], the same per drafter
    (matrix[member, column], column j drafted by member authors[j]), and whether there was
    anything to verify (more than one distinct candidate)."""

    shares: torch.Tensor
    matrix: torch.Tensor
    authors: list[int]
    verified: bool


class SpecEM(Method):
    """Options: `segment_tokens` (L, tokens per draft), `drafters` (indices or names; all members
    verify), `score` ("logprob" | "prob" | "logit" | "min" | "pmi"), `feedback` (Hedge on/off
    within a request), `lr`, `reuse_cache` (False drops every cache before drafting and before
    verifying: the authors' cost profile, kept as the benchmark baseline), `draft_temperature`
    and `draft_top_p` (drafts decoded with these instead of the request's settings),
    `schedule` ("updates" | "rounds": what t counts in eta_t), `preset` ("paper": the authors'
    code's draft sampling, temperature 0.6 and top-p 0.9, and schedule="rounds").

    Cost per round and member: up to L one-token draft steps plus ONE verification pass over the
    distinct candidates; a round where every drafter wrote the same text skips verification."""

    name = "specem"
    min_members = 2
    member_options = ("drafters",)

    def __init__(
        self,
        members,
        segment_tokens: int = 10,
        drafters: Sequence[int | str] | None = None,
        score: str = "logprob",
        feedback: bool = True,
        lr: float = 1.0,
        persist_weights: bool = False,
        reuse_cache: bool = True,
        draft_temperature: float | None = None,
        draft_top_p: float | None = None,
        schedule: str | None = None,
        preset: str | None = None,
    ) -> None:
        super().__init__(members)
        chosen = _preset_options(preset, draft_temperature, draft_top_p, schedule)
        draft_temperature, draft_top_p, schedule = chosen
        segment_tokens = check_int("segment_tokens", segment_tokens, low=1, example=10)
        check_score(score, self.members)
        self.drafters = _drafters(self.members, drafters)
        self.segment_tokens = segment_tokens
        self.scoring = score
        self.feedback = check_bool("feedback", feedback)
        self.lr = check_real("lr", lr, low=0, low_open=True, example=1.0)
        if check_bool("persist_weights", persist_weights):
            raise InvalidConfigError(
                "persist_weights=True is not a SpecEM option: the weights carried across "
                "requests are the ensemble's member trust, which every method learns from; "
                "pass learn_weights=True to the Ensemble, and see ens.member_weights, "
                "ens.save_weights() and ens.load_weights()."
            )
        self.reuse_cache = check_bool("reuse_cache", reuse_cache)
        self.preset = preset
        self.draft_temperature, self.draft_top_p = draft_temperature, draft_top_p
        self.schedule = schedule

    # --- one request -----------------------------------------------------------------------

    def run(self, request: Request) -> Iterator[Commit]:
        if self.scoring == "pmi" and request.config.raw_prompt:
            check_empty_raw_prompt(self.name, self.members)
        names = [m.name for m in self.members]
        state = Feedback.starting(len(names), request.trust.of(names))
        sampler = self._draft_sampler(request)
        request.stats.weights = state.named(names)
        round_ = 0
        while request.remaining > 0:
            round_ += 1
            request.stats.count("rounds")
            base = request.text
            for member in self.members:
                member.sync(base)
                if not self.reuse_cache:
                    member.drop_cache()
            before = [m.n_tokens for m in self.members]
            candidates = self._draft(request, sampler)
            drafted = {names[self.drafters[a]]: c.text for c in candidates for a in c.authors}
            request.emit(SegmentCandidates(round_, drafted))
            if not candidates:  # nobody could add text (context windows full)
                yield Commit("", 0, "length")
                return
            scores = self._verify(request, candidates)  # every member scores them all
            self._learn(request, round_, scores, state)  # online feedback on the weights
            chosen, winner = self._vote(request, round_, candidates, scores, state)
            # The winner keeps its own draft tokens: sync finds them still spelling the text.
            winner.sync(base + chosen.text)
            tokens = max(winner.n_tokens - before[self.members.index(winner)], 0)
            if chosen.ended:
                commit = Commit(chosen.text, tokens + 1, "stop")  # the stop token is generated
            else:
                commit = Commit(chosen.text, max(tokens, 1))
            if scores.verified:  # the vote chose every token of this round
                request.stats.ensembled_tokens += commit.tokens
            yield commit
            if commit.finish:
                return

    def _verify(self, request: Request, candidates: list[_Candidate]) -> _Scores:
        """Every member's normalised scores of every distinct candidate (verify-in-line); a
        round where every drafter wrote the same has nothing to verify."""
        verified = len(candidates) > 1
        if verified:
            request.stats.ensembled_rounds += 1
            shares = self._shares(request, candidates)
        else:  # every drafter wrote the same: nothing to vote on
            request.stats.count("consensus")
            shares = torch.ones(len(self.members), 1, dtype=torch.float64)
        # one column per drafter that wrote something (duplicates share their column)
        columns = sorted((a, c) for c, cand in enumerate(candidates) for a in cand.authors)
        matrix = shares[:, [c for _, c in columns]]
        authors = [self.drafters[a] for a, _ in columns]
        return _Scores(shares, matrix, authors, verified)

    def _learn(self, request: Request, round_: int, scores: _Scores, state: Feedback) -> None:
        """Online feedback: a member gains weight when the OTHER verifiers prefer its draft."""
        names = [m.name for m in self.members]
        if self.feedback and scores.verified:
            rewards = win_rates(scores.matrix, scores.authors)
            state.update(rewards, self.lr)
            rewarded = dict(zip(names, rewards.tolist(), strict=True))
            request.emit(WeightsUpdated(round_, state.named(names), rewarded))
        elif self.feedback and self.schedule == "rounds":
            state.tick()
        request.stats.weights = state.named(names)

    def _vote(
        self,
        request: Request,
        round_: int,
        candidates: list[_Candidate],
        scores: _Scores,
        state: Feedback,
    ) -> tuple[_Candidate, Member]:
        """The weighted vote: the round's winning candidate and the member that drafted it
        (the first of its authors)."""
        names = [m.name for m in self.members]
        totals = (state.weights[:, None] * scores.shares).sum(0).tolist()
        chosen = candidates[max(range(len(candidates)), key=lambda c: (totals[c], -c))]
        winner = self.members[self.drafters[chosen.authors[0]]]
        if scores.verified:
            request.stats.count(f"won/{winner.name}")
        table = {
            names[v]: {names[d]: float(scores.matrix[v, j]) for j, d in enumerate(scores.authors)}
            for v in range(len(self.members))
        }
        request.emit(SegmentSelected(round_, winner.name, chosen.text, table, state.named(names)))
        if scores.verified:  # the member trust's report: how the others scored each segment
            rates = win_rates(scores.matrix, scores.authors).tolist()
            request.trust.update({names[i]: rates[i] for i in scores.authors})
        return chosen, winner

    def _draft_sampler(self, request: Request) -> Sampler:
        """The request's own sampler, or one with the draft decoding options (seeded by the
        request's seed, so a seeded request drafts the same way every time)."""
        if self.draft_temperature is None and self.draft_top_p is None:
            return request.sampler
        config = request.config
        temperature = self.draft_temperature
        top_p = self.draft_top_p
        return Sampler(
            GenerationConfig(
                temperature=config.temperature if temperature is None else temperature,
                top_p=config.top_p if top_p is None else top_p,
                seed=config.seed,
            )
        )

    def _draft(self, request: Request, sampler: Sampler) -> list[_Candidate]:
        """Each drafter continues the committed text; distinct candidates in drafter order."""
        limit = min(self.segment_tokens, request.remaining)
        final = request.remaining <= self.segment_tokens  # the cap ends the text here anyway
        found: dict[tuple[str, bool], _Candidate] = {}
        drafters = [self.members[i] for i in self.drafters]
        drafts = draft_each(drafters, limit, sampler, request.text)
        for a, (member, draft) in enumerate(zip(drafters, drafts, strict=True)):
            text = member.text[len(request.text) :]
            if not (draft.stopped or final or len(draft.ids) < limit):
                text = text[: clean_cut(text)]
            if not text and not draft.stopped:
                continue  # no progress (a window is full, or only part of a character)
            found.setdefault((text, draft.stopped), _Candidate(text, draft.stopped))
            found[text, draft.stopped].authors.append(a)
        return list(found.values())

    def _shares(self, request: Request, candidates: list[_Candidate]) -> torch.Tensor:
        """shares[member, candidate]: each member's normalised scores, in one pass each (two
        with score="pmi": after the request, and after an empty turn)."""
        base, raw_prompt = request.text, request.config.raw_prompt
        texts = [c.text for c in candidates]
        ends = [c.ended for c in candidates]
        temperatures = vote_temperatures(request, self.members, self.scoring)

        def shares(member) -> list[float]:
            if not self.reuse_cache:
                member.drop_cache()
            temperature = temperatures[self.members.index(member)]
            return member_shares(
                member, texts, ends, self.scoring, raw_prompt, base, base, temperature
            )

        rows = each(self.members, shares)  # remote members score concurrently
        return torch.tensor(rows, dtype=torch.float64)

    @property
    def vote_score(self) -> str | None:
        return self.scoring if self.scoring in SOFTMAXED else None

    def summary(self) -> dict:
        return {
            **super().summary(),
            "drafters": [self.members[i].name for i in self.drafters],
            "segment_tokens": self.segment_tokens,
            "score": self.scoring,
            "feedback": self.feedback,
            "lr": self.lr,
            "reuse_cache": self.reuse_cache,
            "preset": self.preset,
            "draft_temperature": self.draft_temperature,
            "draft_top_p": self.draft_top_p,
            "schedule": self.schedule,
        }


def _drafters(members: Sequence, drafters: Sequence[int | str] | None) -> list[int]:
    """The drafting members' indices (every member by default)."""
    if drafters is None:
        chosen = list(range(len(members)))
    else:
        if isinstance(drafters, (str, int)):
            raise InvalidConfigError(
                f"drafters must be a list of member indices or names, got {drafters!r}."
            )
        chosen = [pick_member(members, d, "drafters") for d in drafters]
        if len(set(chosen)) != len(chosen):
            raise InvalidConfigError(f"drafters lists a member twice: {list(drafters)!r}.")
    if len(chosen) < 2:
        raise InvalidConfigError(
            "SpecEM picks among drafts, so drafters needs at least 2 members; pass more, "
            "or use method='single'."
        )
    return chosen


def _preset_options(
    preset: str | None, temperature: float | None, top_p: float | None, schedule: str | None
) -> tuple[float | None, float | None, str]:
    """The drafts' temperature and top-p and the schedule: each given option, else the
    preset's, else the default (the request's own decoding; t counting updates)."""
    given = {"draft_temperature": temperature, "draft_top_p": top_p, "schedule": schedule}
    chosen = {"draft_temperature": None, "draft_top_p": None, "schedule": "updates"}
    if preset is not None:
        check_choice("preset", preset, tuple(PRESETS))
        chosen |= PRESETS[preset]
    chosen |= {k: v for k, v in given.items() if v is not None}
    temperature, top_p, schedule = chosen.values()
    check_choice("schedule", schedule, SCHEDULES)

    def number(value) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    if temperature is not None and not (number(temperature) and 0 <= temperature < math.inf):
        raise InvalidConfigError(
            f"draft_temperature={temperature!r} must be None (the request's own temperature) "
            "or a number >= 0 (0 = greedy drafts); preset='paper' uses 0.6."
        )
    if top_p is not None and not (number(top_p) and 0 < top_p <= 1):
        raise InvalidConfigError(
            f"draft_top_p={top_p!r} must be None (the request's own top_p) or a number in "
            "(0, 1]; preset='paper' uses 0.9."
        )
    return temperature, top_p, schedule


METHOD = SpecEM
