"""Member trust without labels, measured once and frozen (`Ensemble.calibrate`).

Each member answers a few prompts alone (the request's own decoding: greedy). The prompts run as
concurrent requests of the ensemble, one member over every prompt at a time, so the prompts'
forward passes on a model come together and batch (the real pair on the 12 built-in prompts, one
torch thread: 44-46 s against 61-66 s one prompt after another under the same load; the same
weights). Every member then scores every distinct answer in one verify-in-line pass per prompt
(`Member.score`, its stop included for an answer that ends the turn) and spreads a unit vote
over the answers (SpecEM's `normalise`: mean token log-prob, softmax over the answers). A
member's rate is SpecEM's win rate over all prompts: the share of (judge, rival) comparisons,
judges being the OTHER members, in which its answer scored at least as high as the rival's. Its
weight is proportional to that rate (at least `MIN_WEIGHT`), so a member whose answers no other
member ever prefers ends at the bottom, under the trust's floor, and is not run at all.

For an ensemble that votes over its members' candidates (SpecEM, rerank), the same scores also
give each member's self-preference: how far, in the vote's score, it sets its own answer apart
from the others' (the mean absolute margin). Votes then softmax each voter's scores at a
temperature of its margin over the least partial voter's (`core.trust.SelfPreference`). On the
real pair's retrieval questions SmolLM2-135M-Instruct sets its own answers about 3 nats of mean
token log-prob apart from Gemma's, Gemma-3-270M (a base model) its own about 1 apart from
SmolLM2's: without the correction SmolLM2's answer wins nearly every vote, though Gemma's is
right more often. Chosen on problems of seed 2 (`lab/results/self-preference/`).

No label is needed, and nothing moves afterwards: the weights are fixed until calibrated or
loaded again, so a request's text depends on that request alone (concurrent texts are
one-at-a-time texts). `save_weights` keeps them.

`CALIBRATION_PROMPTS` is the built-in set: short questions of several kinds that any
instruction-tuned model can answer in a few sentences. Pass prompts of your own traffic where
they differ (a retrieval pipeline's questions, an agent's tasks): a member's worth depends on
the kind of request.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from .admission import Admission
from .chat import normalize_messages
from .config import GenerationConfig
from .errors import InvalidConfigError
from .member import Member
from .methods.specem import normalise, reduced, win_rates
from .parallel import each
from .sampling import Sampler
from .trust import MIN_WEIGHT, SelfPreference
from .validate import check_int

CALIBRATION_PROMPTS: tuple[str, ...] = (
    "Tom has 7 apples. He buys 5 more and then eats 3. How many apples does he have now?",
    "What is the capital of France? Answer in one sentence.",
    "Write one sentence that explains what a leap year is.",
    "A train leaves at 9:15 and arrives at 11:40. How long is the trip?",
    "Name three primary colors.",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 11?",
    "Give one tip for writing clear emails.",
    "Is 91 a prime number? Explain briefly.",
    "Summarize in one sentence: The meeting moved from Monday to Wednesday because the room "
    "was booked.",
    "Which is heavier, a kilogram of feathers or a kilogram of iron?",
    "Write a Python expression that reverses the string s.",
)
MAX_NEW_TOKENS = 64
MIN_MARGIN = 1e-6  # a judge that never told its answer from another's still has a positive margin


def check_prompts(prompts: Sequence[Any] | None) -> list[Any]:
    """The calibration prompts: the built-in set, or a non-empty list of prompts (each a string
    or a list of chat messages)."""
    if prompts is None:
        return list(CALIBRATION_PROMPTS)
    if isinstance(prompts, (str, dict)) or not isinstance(prompts, Sequence) or not prompts:
        raise InvalidConfigError(
            f"prompts must be a non-empty list of prompts (strings or message lists), got "
            f"{prompts!r}; e.g. calibrate(['What is 2 + 3?', 'Name a prime number.']), or "
            "calibrate() for the built-in set."
        )
    return [normalize_messages(p) for p in prompts]


@dataclass(frozen=True)
class Judgement:
    """What calibration measured: each member's win rate as the others judge its answers, and
    each member's self-preference as a judge (None unless a vote score was asked for)."""

    rates: dict[str, float]
    self_preference: SelfPreference | None


def judge(
    members: Sequence[Member],
    prompts: Sequence[Any],
    max_new_tokens: int = MAX_NEW_TOKENS,
    score: str | None = None,
    admission: Admission | None = None,
) -> Judgement:
    """Each member's mean win rate over the prompts, as the other members judge its answers,
    and (with a vote `score`) how far, on average and either way, it scores its own answer
    from its mean score of the others' answers. Prompts where every member wrote the same
    answer tell nothing and are left out (a member set that always agrees gets equal rates and
    no self-preference). With the ensemble's `admission`, up to its `max_concurrency` prompts
    run at once as requests of the ensemble (`each_prompt`), one member over all of them at a
    time, so their forward passes batch; the result is the same as one prompt after another."""
    check_int("max_new_tokens", max_new_tokens, low=1, example=MAX_NEW_TOKENS)
    names = [m.name for m in members]
    sampler = Sampler(GenerationConfig(max_new_tokens=max_new_tokens))
    size = max(1, len(prompts) if admission is None else admission.max_concurrency)
    judged: list[tuple[Any, Any]] = []
    for first in range(0, len(prompts), size):  # as many prompts at once as may run at once
        group = prompts[first : first + size]
        judged += _judge_group(members, group, max_new_tokens, sampler, admission)

    total, counted = torch.zeros(len(members), dtype=torch.float64), 0
    margins: list[list[float]] = [[] for _ in members]
    for values, columns in judged:
        if values is None:
            continue
        shares = torch.tensor([normalise(v, "logprob") for v in values], dtype=torch.float64)
        total += win_rates(shares[:, columns], list(range(len(members))))
        counted += 1
        for j, own in enumerate(columns if score else ()):
            scores = [reduced(v, score) for v in values[j]]
            others = [s for c, s in enumerate(scores) if c != own]
            margins[j].append(abs(scores[own] - sum(others) / len(others)))
    rates = total / counted if counted else torch.full((len(members),), 0.5)
    preference = None
    if score and counted:
        means = {n: max(sum(m) / len(m), MIN_MARGIN) for n, m in zip(names, margins, strict=True)}
        preference = SelfPreference(score, means)
    return Judgement(dict(zip(names, rates.tolist(), strict=True)), preference)


def each_prompt(
    prompts: Sequence[Any], fn: Callable[[Any], Any], admission: Admission | None
) -> list[Any]:
    """`fn(prompt)` for every prompt, results in prompt order. With an `admission`, up to its
    `max_concurrency` (at most one per prompt) worker threads each hold one of the ensemble's
    request slots and take the prompts in turn, as concurrent requests would: a model's batcher
    runs their passes together and waits for them as for any request's. Once a prompt fails no
    worker starts another; the first failure in prompt order is raised after every worker has
    stopped (or, where no worker got a slot for a prompt left, the refusal)."""
    if admission is None or len(prompts) < 2:
        return [fn(prompt) for prompt in prompts]
    results: list[Any] = [None] * len(prompts)
    done = [False] * len(prompts)
    failed: dict[int, BaseException] = {}
    refused: list[BaseException] = []
    turns = iter(range(len(prompts)))
    lock = threading.Lock()

    def work() -> None:
        try:
            with admission.slot(), admission.running_here():
                while True:
                    with lock:
                        i = None if failed else next(turns, None)
                    if i is None:
                        return
                    try:
                        results[i], done[i] = fn(prompts[i]), True
                    except BaseException as error:  # raised below, once every worker stopped
                        with lock:
                            failed[i] = error
        except BaseException as error:  # no slot: a full queue, a queue timeout
            refused.append(error)

    workers = min(len(prompts), admission.max_concurrency)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="calibration") as pool:
        for _ in range(workers):
            pool.submit(work)
    if failed:
        raise failed[min(failed)]
    if not all(done):
        raise refused[0]
    return results


def _judge_group(
    members: Sequence[Member],
    prompts: Sequence[Any],
    max_new_tokens: int,
    sampler: Sampler,
    admission: Admission | None,
) -> list[tuple[Any, Any]]:
    """For each prompt, every member's token scores of the distinct answers: (values[judge]
    [answer], each member's answer column), or (None, None) when all members agree. One member
    answers every prompt before the next member starts, so the prompts' passes on that
    member's model come together and batch."""
    views = [[m.spawn() for m in members] for _ in prompts]

    def answer(view: Member, prompt: Any) -> tuple[str, bool]:
        view.start(normalize_messages(prompt))
        view.reserve(max_new_tokens)
        draft = view.draft(max_new_tokens, sampler)
        return view.text, draft.stopped

    def scores(i: int):
        answers = [answered[j][i] for j in range(len(members))]
        distinct = list(dict.fromkeys(answers))
        if len(distinct) < 2:
            return None, None
        texts, ends = [a[0] for a in distinct], [a[1] for a in distinct]
        values = each(views[i], lambda view: view.score(texts, base="", ends=ends))
        return values, [distinct.index(a) for a in answers]

    indices = list(range(len(prompts)))
    try:
        answered = [
            each_prompt(indices, lambda i, j=j: answer(views[i][j], prompts[i]), admission)
            for j in range(len(members))
        ]
        return each_prompt(indices, scores, admission)
    finally:
        for row in views:
            for view in row:
                view.release()


def rate_weights(rates: dict[str, float]) -> dict[str, float]:
    """Weights proportional to the rates, each at least MIN_WEIGHT, summing to 1 (all rates 0:
    equal weights)."""
    values = torch.tensor(list(rates.values()), dtype=torch.float64).clamp_min(0.0)
    if float(values.sum()) <= 0:
        values = torch.ones_like(values)
    values = (values / values.sum()).clamp_min(MIN_WEIGHT)
    values = values / values.sum()
    return dict(zip(rates, values.tolist(), strict=True))
