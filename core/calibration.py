"""Member trust without labels, measured once and frozen (`Ensemble.calibrate`).

Each member answers a few prompts alone (the request's own decoding: greedy). Every member then
scores every distinct answer in one verify-in-line pass per prompt (`Member.score`, its stop
included for an answer that ends the turn) and spreads a unit vote over the answers (SpecEM's
`normalise`: mean token log-prob, softmax over the answers). A member's rate is SpecEM's win
rate over all prompts: the share of (judge, rival) comparisons, judges being the OTHER members,
in which its answer scored at least as high as the rival's. Its weight is proportional to that
rate (at least `MIN_WEIGHT`), so a member whose answers no other member ever prefers ends at
the bottom, under the trust's floor, and is not run at all.

No label is needed, and nothing moves afterwards: the weights are fixed until calibrated or
loaded again, so a request's text depends on that request alone (concurrent texts are
one-at-a-time texts). `save_weights` keeps them.

`CALIBRATION_PROMPTS` is the built-in set: short questions of several kinds that any
instruction-tuned model can answer in a few sentences. Pass prompts of your own traffic where
they differ (a retrieval pipeline's questions, an agent's tasks): a member's worth depends on
the kind of request.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .chat import normalize_messages
from .config import GenerationConfig
from .errors import InvalidConfigError
from .member import Member
from .methods.specem import normalise, win_rates
from .parallel import each
from .sampling import Sampler
from .trust import MIN_WEIGHT
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


def peer_rates(
    members: Sequence[Member], prompts: Sequence[Any], max_new_tokens: int = MAX_NEW_TOKENS
) -> dict[str, float]:
    """Each member's mean win rate over the prompts, as the other members judge its answers.
    Prompts where every member wrote the same answer tell nothing and are left out (a member
    set that always agrees gets equal rates)."""
    check_int("max_new_tokens", max_new_tokens, low=1, example=MAX_NEW_TOKENS)
    names = [m.name for m in members]
    sampler = Sampler(GenerationConfig(max_new_tokens=max_new_tokens))
    total, counted = torch.zeros(len(members), dtype=torch.float64), 0
    for prompt in prompts:
        views = [m.spawn() for m in members]
        try:
            shares, columns = _one_prompt(views, prompt, max_new_tokens, sampler)
        finally:
            for view in views:
                view.release()
        if shares is not None:
            total += win_rates(shares[:, columns], list(range(len(members))))
            counted += 1
    rates = total / counted if counted else torch.full((len(members),), 0.5)
    return dict(zip(names, rates.tolist(), strict=True))


def _one_prompt(views: list[Member], prompt: Any, max_new_tokens: int, sampler: Sampler):
    """Every member's answer to one prompt and every member's vote over the distinct answers:
    (shares[judge, answer], each member's answer column), or (None, None) when all agree."""
    for view in views:
        view.start(normalize_messages(prompt))
        view.reserve(max_new_tokens)

    def answer(view: Member, sampler: Sampler) -> tuple[str, bool]:
        draft = view.draft(max_new_tokens, sampler)
        return view.text, draft.stopped

    answers = each(views, answer, sampler)
    distinct = list(dict.fromkeys(answers))
    if len(distinct) < 2:
        return None, None
    texts, ends = [a[0] for a in distinct], [a[1] for a in distinct]

    def vote(view: Member) -> list[float]:
        return normalise(view.score(texts, base="", ends=ends), "logprob")

    shares = torch.tensor(each(views, vote), dtype=torch.float64)
    return shares, [distinct.index(a) for a in answers]


def rate_weights(rates: dict[str, float]) -> dict[str, float]:
    """Weights proportional to the rates, each at least MIN_WEIGHT, summing to 1 (all rates 0:
    equal weights)."""
    values = torch.tensor(list(rates.values()), dtype=torch.float64).clamp_min(0.0)
    if float(values.sum()) <= 0:
        values = torch.ones_like(values)
    values = (values / values.sum()).clamp_min(MIN_WEIGHT)
    values = values / values.sum()
    return dict(zip(rates, values.tolist(), strict=True))
