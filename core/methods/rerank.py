"""Rerank: ensembling whole answers. Every member answers; every member scores every answer;
the weighted vote picks one, which is then streamed.

The answer-level counterpart of SpecEM (one round whose segments are whole answers): each
member continues the committed text to the end of its turn (or the token limit) from its own
cache; each member then scores all distinct answers in ONE verify-in-line pass (`Member.score`,
the log-prob of ending the turn included for answers that end it) and turns its scores into a
unit vote over the answers (SpecEM's `normalise`: mean token log-prob, softmax over the
answers, by default). The answers' totals are the members' votes weighted by their voting
weights (equal unless given); the highest wins, ties going to the earlier member.

`score="min"` counts each answer as its least likely token, the words every answer starts with
left out (read as part of the text before the answers: the same tokens in the same context for
every answer, they would make one token every answer's weakest and tie the vote). A whole answer
is mostly words every member finds easy (the question's own words said again: "Henry lives
in"), and the word that decides it (the city, the number) is one token among them: the mean
lets the easy ones outvote it, and with two members that each prefer their own answer the more
fluent phrasing wins. Measured (`lab/results/tuning-rerank-vote/`, then README): on the real
pair's short questions and retrieval questions "min" answers better (seed 1: 31.7 against
26.7 %, 56.7 against 48.3 %), on the shipped chain-of-thought the same within a point, but on
tool use worse (right final answers 23.5 against 32.5 %: a call's syntax holds tokens a member
finds unlikely, and the weakest one decides), so it is an option, not the default.

`score="pmi"` counts each answer by how much more likely the member finds it given the request
than given none: its mean token log-prob after the request minus its mean token log-prob after
an empty user turn (pointwise mutual information, nothing fitted), softmaxed over the answers.
Each member prefers its own answer, and by plain log-probs an instruction-tuned member, sharp on
its own fluent phrasing, outvotes a base model that finds every phrasing about as likely; the
difference leaves out what a member would say whatever the request (its phrasing) and keeps
what the request makes likely (the answer read from the passages). On the real pair's problems
of seed 2 (40 each, the tuning seed; the members' answers scored both ways,
`lab/results/rerank-pmi/`), short questions: 32.5 % by log-probs, 35.0 % by "pmi", the best
member 35.0 %; retrieval questions: 75.0 against 87.5 %, the best member 87.5 %. An option, not
the default: it has not been measured on tool use, where a call is unlikely without the
request's tools whatever its worth. It costs one more scoring pass per member, over every
token of every answer (none of them remembered from drafting): on the real pair about twice
rerank's time per output token by log-probs (5.1-5.5x the drafter against 2.1-2.6x).

`finished_first=True` (the default): where some answers ended the turn and others were cut by
the token limit, only the ended ones are voted on (all of them where none ended). A cut answer
is unfinished: a member caught in a loop ("Answer: 33\nAnswer: 33\n...") writes text every
judge finds easy to predict, so its mean log-prob outscores a finished answer, and it never
pays the log-prob of ending the turn that a finished answer pays (an answer set aside is not
voted on, so it teaches the member trust nothing). Chosen on problems of seed 2
(`lab/results/tuning-rerank-finished/`): the real pair's short questions 30.0 -> 35.0 %, the
shipped three's chain-of-thought and tool answers unchanged.

After `Ensemble.calibrate`, each member's scores are softmaxed at a temperature of its calibrated
self-preference over the least partial member's (SpecEM's `vote_temperatures`): a member that is
merely surer of its own text no longer wins every vote, and nothing else is paid per request.

It costs every member a whole answer plus one scoring pass, so its time per output token is
about the sum of the members' (on one device) rather than the drafter's. What it can fix is
also different: it picks among the members' answers and never combines two of them, so it
cannot beat the best answer any member wrote (a token- or segment-level method can: a step
one member gets right followed by a step another gets right).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from ..events import SegmentCandidates, SegmentSelected
from ..member import Member
from ..parallel import draft_each, each
from ..validate import check_bool
from .base import Commit, Method, Request
from .pmi import check_empty_raw_prompt
from .specem import (
    SOFTMAXED,
    check_score,
    last_space_run,
    member_shares,
    vote_temperatures,
    win_rates,
)


@dataclass
class Answer:
    """One distinct answer: its text, whether it ended the turn, the members that wrote it."""

    text: str
    ended: bool
    authors: list[int] = field(default_factory=list)


class Rerank(Method):
    """Options: `score` ("logprob" | "min" | "prob" | "logit" | "pmi", as SpecEM's),
    `finished_first` (vote only among the answers that ended, where some did)."""

    name = "rerank"
    min_members = 2

    def __init__(self, members, score: str = "logprob", finished_first: bool = True) -> None:
        super().__init__(members)
        check_score(score, self.members)
        self.scoring = score
        self.finished_first = check_bool("finished_first", finished_first)

    def run(self, request: Request) -> Iterator[Commit]:
        if self.scoring == "pmi" and request.config.raw_prompt:
            check_empty_raw_prompt(self.name, self.members)
        base = request.text
        names = [m.name for m in self.members]
        for member in self.members:
            member.sync(base)
        start = [m.n_tokens for m in self.members]
        answers = self._answer(request)
        drafted = {names[i]: a.text for a in answers for i in a.authors}
        request.emit(SegmentCandidates(1, drafted))
        if not answers:  # nobody could add text (context windows full)
            yield Commit("", 0, "length")
            return
        if len(answers) == 1:  # every member wrote the same answer
            request.stats.count("consensus")
        chosen = self._select(request, base, self._candidates(request, answers))
        author = chosen.authors[0]
        winner = self.members[author]
        winner.sync(base + chosen.text)  # its own tokens: they still spell the answer
        ends = list(winner.token_ends[start[author] :])
        voted = len(answers) > 1
        for commit in _stream(request, (base + chosen.text).encode("utf-8"), ends, chosen.ended):
            if voted:  # the vote chose every token of the answer
                request.stats.ensembled_tokens += commit.tokens
            yield commit

    def _answer(self, request: Request) -> list[Answer]:
        """Each member's whole answer; the distinct ones, in member order."""
        limit = request.remaining
        # members read the first member's whole answer as a guess (`draft_each`: the same
        # answers, fewer passes) only while no other request runs: a guess's pass over a whole
        # answer does not batch with other requests' one-token steps (8 requests: -30 % tokens/s)
        if request.alone():
            drafts = draft_each(self.members, limit, request.sampler, request.text)
        else:
            drafts = each(self.members, lambda m, s: m.draft(limit, s), request.sampler)
        found: dict[tuple[str, bool], Answer] = {}
        for i, (member, draft) in enumerate(zip(self.members, drafts, strict=True)):
            text = member.text[len(request.text) :]
            if not text and not draft.stopped:
                continue  # no room left in its window
            found.setdefault((text, draft.stopped), Answer(text, draft.stopped)).authors.append(i)
        return list(found.values())

    def _candidates(self, request: Request, answers: list[Answer]) -> list[Answer]:
        """The answers the vote is over: with `finished_first`, the ended ones where some ended
        and the token limit cut others."""
        ended = [a for a in answers if a.ended]
        if not self.finished_first or not ended or len(ended) == len(answers):
            return answers
        request.stats.count("cut answers set aside")
        return ended

    def _select(self, request: Request, base: str, answers: list[Answer]) -> Answer:
        """Every member scores every answer (one pass each); the weighted vote picks one."""
        names = [m.name for m in self.members]
        k = len(self.members)
        trust = request.trust.of(names)
        weights = torch.tensor(trust or [1.0] * k, dtype=torch.float64)
        weights = weights / weights.sum()
        if len(answers) == 1:  # one answer left: nothing to vote on
            shares = torch.ones(k, 1, dtype=torch.float64)
        else:
            request.stats.ensembled_rounds += 1
            head = shared_words([a.text for a in answers]) if self.scoring == "min" else ""
            texts, ends = [a.text[len(head) :] for a in answers], [a.ended for a in answers]

            temperatures = vote_temperatures(request, self.members, self.scoring)

            def vote(member: Member) -> list[float]:  # "pmi": the answers alone after none
                raw_prompt = request.config.raw_prompt
                temperature = temperatures[self.members.index(member)]
                return member_shares(
                    member, texts, ends, self.scoring, raw_prompt, base + head, "", temperature
                )

            shares = torch.tensor(each(self.members, vote), dtype=torch.float64)
        totals = (weights[:, None] * shares).sum(0).tolist()
        chosen = answers[max(range(len(answers)), key=lambda c: (totals[c], -c))]
        winner = names[chosen.authors[0]]
        if len(answers) > 1:
            request.stats.count(f"won/{winner}")
        request.stats.weights = dict(zip(names, weights.tolist(), strict=True))
        scores = {
            names[v]: {
                names[i]: float(shares[v, c]) for c, a in enumerate(answers) for i in a.authors
            }
            for v in range(k)
        }
        request.emit(SegmentSelected(1, winner, chosen.text, scores, request.stats.weights))
        if len(answers) > 1:  # the member trust's report: how the others scored each answer
            column = {i: c for c, a in enumerate(answers) for i in a.authors}
            authors = sorted(column)
            rates = win_rates(shares[:, [column[i] for i in authors]], authors).tolist()
            request.trust.update({names[i]: rates[i] for i in authors})
        return chosen

    @property
    def vote_score(self) -> str | None:
        return self.scoring if self.scoring in SOFTMAXED else None

    @property
    def default_self_preference(self) -> str:
        # with two members each judge prefers its own answer, and the surer one decides every
        # vote; evened out on the built-in prompts, rerank's mean log-prob vote lost at most a
        # point on the accuracy tables and gained up to 22 (the other scores: not measured)
        return "builtin" if self.scoring == "logprob" else "off"

    def summary(self) -> dict:
        return {**super().summary(), "score": self.scoring, "finished_first": self.finished_first}


def shared_words(texts: Sequence[str]) -> str:
    """The words every text starts with: their common start, cut before its last whitespace
    run (a word and the space before it are read together), or "" when it holds no such cut."""
    common = os.path.commonprefix(list(texts))
    return common[: last_space_run(common) or 0]


def _stream(request: Request, data: bytes, ends: Sequence[int], ended: bool) -> Iterator[Commit]:
    """The chosen answer (`data`: committed text + answer, as bytes) streamed one piece per
    winner token (a token ending inside a character joins the next), each counted as the tokens
    it spans. Text the facade commits between pieces (what a request's grammar forces) is
    skipped: the answer followed the grammar, so it continues with that text."""
    done, count = len(request.text.encode("utf-8")), 0
    for end in ends:
        count += 1
        done = max(done, len(request.text.encode("utf-8")))
        if end <= done:
            count = 0  # forced text covered it (the facade counted its tokens)
            continue
        try:
            piece = data[done:end].decode("utf-8")
        except UnicodeDecodeError:  # inside a character: wait for its last byte
            continue
        yield Commit(piece, count)
        done, count = end, 0
    if ended:
        yield Commit("", count + 1, "stop")  # the stop token is a generated token


METHOD = Rerank
