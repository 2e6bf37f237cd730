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
  mean token probability) and `score="logit"` (authors' code: mean raw logit) are sum-normalised.
  A candidate that ended the turn includes the verifier's log-prob of ending there.
- self-judgment: a member's scores of its own draft count in the vote (as in the authors' code),
  never in its reward.
- reward: the win rate without the authors' floor of one win, so feedback also works for K = 2
  (with the floor every K = 2 reward is 1 and the weights never move).
- the weights are updated with the round's reward before the vote (as in the authors' code);
  eta_t = lr * sqrt(1/K) / t, t counting rounds since the weights were last reset.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from ..errors import InvalidConfigError
from ..events import SegmentCandidates, SegmentSelected, WeightsUpdated
from ..parallel import each
from .base import Commit, Method, Request, check_choice, pick_member

SCORES = ("logprob", "prob", "logit")


# --- pure pieces (unit-testable without a model) ---------------------------------------------


def clean_cut(text: str) -> int:
    """Where the committed part of an unfinished draft ends (a character index).

    The last start of a whitespace run after a non-space (the committed text ends BEFORE the
    space, so the next word is tokenized canonically), or the end when the draft ends with
    punctuation. A draft without whitespace may end after its last punctuation mark. No
    boundary: the whole draft."""
    if text and _is_punct(text[-1]):
        return len(text)
    for i in range(len(text) - 1, 0, -1):
        if text[i].isspace() and not text[i - 1].isspace():
            return i
    for i in range(len(text) - 1, 0, -1):
        if _is_punct(text[i - 1]):
            return i
    return len(text)


def _is_punct(char: str) -> bool:
    return unicodedata.category(char).startswith("P")


def normalise(values: Sequence[torch.Tensor], score: str) -> list[float]:
    """One verifier's token scores of each distinct candidate -> shares that sum to 1."""
    means = []
    for v in values:
        v = v.double()
        if v.numel() == 0:  # cannot happen for a non-empty candidate; never wins if it does
            means.append(-1e30 if score == "logprob" else 0.0)
        else:
            means.append(float(v.exp().mean() if score == "prob" else v.mean()))
    means = torch.tensor(means, dtype=torch.float64)
    if score == "logprob":
        return torch.softmax(means, 0).tolist()
    total = float(means.sum())  # the authors' sum-normalisation (breaks on negative means)
    return (means / total).tolist() if total != 0 else [0.0] * len(values)


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


def hedge(weights: torch.Tensor, rewards: torch.Tensor, lr: float, t: int) -> torch.Tensor:
    """Multiplicative weights: w <- normalise(w * exp(eta_t * r)), eta_t = lr * sqrt(1/K) / t."""
    eta = lr * math.sqrt(1.0 / weights.shape[0]) / t
    updated = weights * torch.exp(eta * rewards)
    return updated / updated.sum()


# --- the method --------------------------------------------------------------------------------


@dataclass
class _Learning:
    """The voting weights and the learning-rate schedule's t: one per request, or one shared
    by every request when the weights persist."""

    weights: torch.Tensor
    t: int = 0


@dataclass
class _Candidate:
    text: str
    ended: bool
    authors: list[int]  # drafter positions (in self.drafters) that produced this candidate


class SpecEM(Method):
    """Options: `segment_tokens` (L, tokens per draft), `drafters` (indices or names; all members
    verify), `score` ("logprob" | "prob" | "logit"), `feedback` (Hedge on/off), `lr`,
    `persist_weights` (keep the weights and the eta schedule across requests until
    `reset_weights()`), `reuse_cache` (False drops every cache before drafting and before
    verifying: the authors' cost profile, kept as the benchmark baseline).

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
    ) -> None:
        super().__init__(members)
        if isinstance(segment_tokens, bool) or not isinstance(segment_tokens, int):
            raise InvalidConfigError(
                f"segment_tokens must be a positive integer, got {segment_tokens!r}; "
                "e.g. segment_tokens=10."
            )
        if segment_tokens < 1:
            raise InvalidConfigError(f"segment_tokens must be >= 1, got {segment_tokens}.")
        check_choice("score", score, SCORES)
        for member in self.members if score == "logit" else ():
            if not member.gives_logits:
                raise InvalidConfigError(
                    f"score='logit' needs raw logits, which member {member.name!r} (served "
                    "over HTTP) cannot give; use score='logprob' or 'prob'."
                )
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
            raise InvalidConfigError(f"lr must be a positive number, got {lr!r}; e.g. lr=1.0.")
        if drafters is None:
            self.drafters = list(range(len(self.members)))
        else:
            if isinstance(drafters, (str, int)):
                raise InvalidConfigError(
                    f"drafters must be a list of member indices or names, got {drafters!r}."
                )
            self.drafters = [pick_member(self.members, d, "drafters") for d in drafters]
            if len(set(self.drafters)) != len(self.drafters):
                raise InvalidConfigError(f"drafters lists a member twice: {list(drafters)!r}.")
        if len(self.drafters) < 2:
            raise InvalidConfigError(
                "SpecEM picks among drafts, so drafters needs at least 2 members; pass more, "
                "or use method='single'."
            )
        self.segment_tokens = segment_tokens
        self.scoring = score
        self.feedback = bool(feedback)
        self.lr = float(lr)
        self.persist_weights = bool(persist_weights)
        self.reuse_cache = bool(reuse_cache)
        self.reset_weights()

    # --- weights ---------------------------------------------------------------------------

    @property
    def weights(self) -> dict[str, float]:
        return {m.name: float(w) for m, w in zip(self.members, self._learning.weights, strict=True)}

    def reset_weights(self) -> None:
        """Uniform weights, and the learning-rate schedule starts again at t = 1."""
        k = len(self.members)
        self._learning = _Learning(torch.full((k,), 1.0 / k, dtype=torch.float64))

    def bind(self, members) -> SpecEM:
        """A request shares the persisted weights, or learns its own from uniform."""
        twin = super().bind(members)
        if not self.persist_weights:
            twin.reset_weights()
        return twin

    def without(self, name: str):
        twin = super().without(name)
        if isinstance(twin, SpecEM):  # the voting weights of the members that stay
            keep = [i for i, m in enumerate(self.members) if m.name != name]
            weights = self._learning.weights[keep]
            twin._learning = _Learning(weights / weights.sum(), self._learning.t)
        return twin

    # --- one request -----------------------------------------------------------------------

    def run(self, request: Request) -> Iterator[Commit]:
        learning = self._learning
        names = [m.name for m in self.members]
        round_ = 0
        while request.remaining > 0:
            round_ += 1
            learning.t += 1
            request.stats.count("rounds")
            base = request.text
            for member in self.members:
                member.sync(base)
                if not self.reuse_cache:
                    member.drop_cache()
            before = [m.n_tokens for m in self.members]
            candidates = self._draft(request)
            request.emit(
                SegmentCandidates(
                    round_,
                    {names[self.drafters[a]]: c.text for c in candidates for a in c.authors},
                )
            )
            if not candidates:  # nobody could add text (context windows full)
                yield Commit("", 0, "length")
                return
            if len(candidates) == 1:  # every drafter wrote the same: nothing to vote on
                request.stats.count("consensus")
                shares = torch.ones(len(self.members), 1, dtype=torch.float64)
            else:
                request.stats.ensembled += 1
                shares = self._verify(base, candidates)
            # one column per drafter that wrote something (duplicates share their column)
            columns = [(a, c) for c, cand in enumerate(candidates) for a in cand.authors]
            columns.sort()
            matrix = shares[:, [c for _, c in columns]]
            authors = [self.drafters[a] for a, _ in columns]
            if self.feedback and len(candidates) > 1:
                rewards = win_rates(matrix, authors)
                learning.weights = hedge(learning.weights, rewards, self.lr, learning.t)
                request.emit(
                    WeightsUpdated(
                        round_, self.weights, dict(zip(names, rewards.tolist(), strict=True))
                    )
                )
            totals = (learning.weights[:, None] * shares).sum(0).tolist()
            best = max(range(len(candidates)), key=lambda c: (totals[c], -c))  # ties: first
            chosen = candidates[best]
            winner = self.members[self.drafters[chosen.authors[0]]]
            request.stats.count(f"won/{winner.name}")
            request.emit(
                SegmentSelected(
                    round_,
                    winner.name,
                    chosen.text,
                    {
                        names[v]: {names[d]: float(matrix[v, j]) for j, d in enumerate(authors)}
                        for v in range(len(self.members))
                    },
                    self.weights,
                )
            )
            # The winner keeps its own draft tokens: sync finds them still spelling the text.
            winner.sync(base + chosen.text)
            tokens = max(winner.n_tokens - before[self.members.index(winner)], 0)
            if chosen.ended:
                yield Commit(chosen.text, tokens + 1, "stop")  # the stop token is generated
                return
            yield Commit(chosen.text, max(tokens, 1))

    def _draft(self, request: Request) -> list[_Candidate]:
        """Each drafter continues the committed text; distinct candidates in drafter order."""
        limit = min(self.segment_tokens, request.remaining)
        final = request.remaining <= self.segment_tokens  # the cap ends the text here anyway
        found: dict[tuple[str, bool], _Candidate] = {}
        drafters = [self.members[i] for i in self.drafters]
        drafts = each(drafters, lambda m, s: m.draft(limit, s), request.sampler)
        for a, (member, draft) in enumerate(zip(drafters, drafts, strict=True)):
            text = member.text[len(request.text) :]
            if not (draft.stopped or final or len(draft.ids) < limit):
                text = text[: clean_cut(text)]
            if not text and not draft.stopped:
                continue  # no progress (a window is full, or only part of a character)
            found.setdefault((text, draft.stopped), _Candidate(text, draft.stopped, []))
            found[text, draft.stopped].authors.append(a)
        return list(found.values())

    def _verify(self, base: str, candidates: list[_Candidate]) -> torch.Tensor:
        """shares[member, candidate]: each member's normalised scores (verify-in-line)."""
        texts = [c.text for c in candidates]
        ends = [c.ended for c in candidates]

        def shares(member) -> list[float]:
            if not self.reuse_cache:
                member.drop_cache()
            values = member.score(texts, base=base, ends=ends, raw=self.scoring == "logit")
            return normalise(values, self.scoring)

        rows = each(self.members, shares)  # remote members score concurrently
        return torch.tensor(rows, dtype=torch.float64)

    def summary(self) -> dict:
        return {
            **super().summary(),
            "drafters": [self.members[i].name for i in self.drafters],
            "segment_tokens": self.segment_tokens,
            "score": self.scoring,
            "feedback": self.feedback,
            "lr": self.lr,
            "persist_weights": self.persist_weights,
            "reuse_cache": self.reuse_cache,
        }


METHOD = SpecEM
