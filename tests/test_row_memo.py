"""A member never computes the same next-token row twice in a request (`core.row_memo`): a row
asked again after a rollback, and a continuation scored over rows it has already computed, cost
no forward pass and give the numbers a pass gives; a new request starts with none; the ensemble's
texts are those it writes without the memo, with fewer passes (SAFE and SpecEM: rerank's
members score each other's whole answers, rows none of them computed before)."""

from __future__ import annotations

import pytest
import torch

from core import Ensemble
from core.config import GenerationConfig
from core.row_memo import RowMemo
from core.sampling import Sampler

MESSAGES = [{"role": "user", "content": "Tom has 7 apples. How many?"}]


def test_a_row_asked_again_after_a_rollback_costs_no_pass(tiny_members):
    member = tiny_members[0].spawn()
    member.start(MESSAGES)
    member.sync("Tom has 7 apples")
    first = member.logprobs([2, member.n_tokens])
    member.sync("Tom has")  # a rejected draft rolls back
    member.sync("Tom has 7 apples")
    calls = member.calls
    again = member.logprobs([2, member.n_tokens])
    assert member.calls == calls
    assert torch.equal(first, again)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_a_continuation_over_known_rows_is_scored_without_a_pass(tiny_members, family):
    """A member that drafted a continuation scores it from the rows it drafted with: no pass,
    the values a fresh view's verify-in-line pass gives (the stop's mass included)."""
    member = tiny_members[family].spawn()
    member.start(MESSAGES)
    member.sync("Tom has")
    drafted = member.draft(4, Sampler(GenerationConfig()))
    continuation = member.text[len("Tom has") :]
    member.logprobs([member.n_tokens])  # the row after it (ending the turn there)
    member.sync("Tom has")
    calls = member.calls
    known = member.score([continuation], ends=[True])
    assert member.calls == calls
    fresh = tiny_members[family].spawn()
    fresh.start(MESSAGES)
    fresh.sync("Tom has")
    expected = fresh.score([continuation], ends=[True])
    assert len(known[0]) == len(drafted.ids) + 1
    assert torch.allclose(known[0], expected[0], atol=1e-4)


def test_a_new_request_starts_with_no_rows(tiny_members):
    member = tiny_members[1].spawn()
    member.start(MESSAGES)
    member.sync("Tom has 7")
    member.logprobs([member.n_tokens])
    assert len(member.state.rows) > 0
    member.start([{"role": "user", "content": "Sara has 6 buttons."}])
    assert len(member.state.rows) == 0
    member.sync("Tom has 7")
    calls = member.calls
    member.logprobs([member.n_tokens])
    assert member.calls == calls + 1


def test_the_memo_keeps_the_rows_used_last_within_its_budget():
    row = torch.zeros(4)  # 16 bytes
    memo = RowMemo(budget_bytes=16 * 8)
    for i in range(8):
        memo.put([i], row + i)
    assert memo.get([0]) is not None  # used again: kept
    memo.put([8], row + 8)
    assert len(memo) == 8 and memo.get([1]) is None and torch.equal(memo.get([0]), row)


PROMPTS = [
    "Sara has 6 buttons. She donates 1. How many buttons does she have?",
    "A box holds 4 pens. How many pens are in 3 boxes?",
    "Tom has 12 apples and eats 5. How many are left?",
]


def _texts_and_passes(monkeypatch, ens: Ensemble, remember: bool) -> tuple[list[str], int]:
    """Each prompt's text and the forward passes its members made (`Member.calls`)."""
    texts, passes = [], 0
    with monkeypatch.context() as patch:
        if not remember:
            patch.setattr(RowMemo, "get", lambda self, ids: None)
        for prompt in PROMPTS:
            stream = ens.stream(prompt, GenerationConfig(max_new_tokens=48))
            texts.append("".join(delta.text for delta in stream))
            passes += sum(member.calls for member in stream.members)
    return texts, passes


@pytest.mark.parametrize("method", ["safe", "specem"])
def test_the_ensemble_writes_the_same_texts_with_fewer_passes(monkeypatch, make_ensemble, method):
    ens = make_ensemble(method)
    without, passes_without = _texts_and_passes(monkeypatch, ens, remember=False)
    texts, passes = _texts_and_passes(monkeypatch, ens, remember=True)
    assert texts == without
    assert passes < passes_without
