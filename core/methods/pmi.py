"""Votes by what the request makes likely (`score="pmi"`, rerank's and SpecEM's option).

Each member prefers its own text, and by plain log-probs an instruction-tuned member, sharp on
its own fluent phrasing, outvotes a base model that finds every phrasing about as likely. A
member's "pmi" vote counts each candidate by its mean token log-prob after the request minus
its mean token log-prob after an empty user turn (pointwise mutual information, nothing
fitted), softmaxed over the candidates: the difference leaves out what the member would say
whatever the request (its phrasing) and keeps what the request makes likely (the answer read
from the passages). The second reading costs one more scoring pass per member, in a view of its
own that starts from the empty turn and reads the text committed so far.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..errors import InvalidConfigError
from ..member import Member

EMPTY_REQUEST = [{"role": "user", "content": ""}]  # the candidates read without the request


def prior_scores(
    member: Member,
    texts: Sequence[str],
    ends: Sequence[bool],
    raw_prompt: bool,
    base: str = "",
) -> list[torch.Tensor]:
    """Each candidate's token log-probs as this member reads it after an empty user turn (an
    empty raw prompt for a raw-prompt request) and `base` (the text committed before the
    candidates), under the request's penalties, in a view of its own that the request's
    cancellation also stops; after, its computed prompt is kept for the next request (where
    prefix reuse is on) and what it holds is released."""
    view = member.spawn(member.state.cancel, member.state.reuse)
    try:
        view.start("" if raw_prompt else EMPTY_REQUEST, penalties=member.state.penalties)
        if base:
            view.sync(base)
        return view.score(texts, ends=ends)
    finally:
        view.keep_prefix()


def pmi_shares(values: Sequence[torch.Tensor], prior: Sequence[torch.Tensor]) -> list[float]:
    """One member's vote: softmax over the candidates of mean token log-prob after the request
    minus mean token log-prob after none."""
    gains = [
        float(v.double().mean() - p.double().mean()) if v.numel() and p.numel() else -1e30
        for v, p in zip(values, prior, strict=True)
    ]
    return torch.softmax(torch.tensor(gains, dtype=torch.float64), 0).tolist()


def check_empty_raw_prompt(method: str, members: Sequence[Member]) -> None:
    """score="pmi" on a raw prompt reads each candidate after an empty raw prompt: every member
    must read that as a token to start from (its BOS)."""
    for member in members:
        if not member.render(""):
            raise InvalidConfigError(
                f"{method}'s score='pmi' reads each candidate after an empty prompt, and member "
                f"{member.name!r} reads an empty raw prompt as no token at all (its tokenizer "
                "adds no BOS); send messages (raw_prompt=False) or use score='logprob'."
            )
