"""The foundation's central promise: after any sequence of syncs a member's ids are the
canonical tokenization of the text, and its cached logits equal a fresh full forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

MESSAGES = [{"role": "user", "content": "Tom has 7 apples. How many?"}]
WORDS = [
    "Tom",
    " has",
    " 7",
    " 12",
    " apples",
    ".",
    "\n",
    " ",
    "  ",
    "+",
    " =",
    "é",
    "☃",
    "ab",
    "\t",
]


def _fresh_logprobs(member) -> torch.Tensor:
    with torch.no_grad():
        logits = member.model(torch.tensor([member.prompt_ids + member.ids])).logits[0, -1]
    return torch.log_softmax(logits.float(), -1)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
@settings(max_examples=25, deadline=None)
@given(
    chunks=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4), max_size=8),
    cuts=st.lists(st.integers(0, 30), max_size=8),
)
def test_incremental_sync_is_canonical_and_cache_exact(tiny_members, family, chunks, cuts):
    member = tiny_members[family]
    member.start(MESSAGES)
    text = ""
    for i, chunk in enumerate(chunks):
        text += "".join(chunk)
        if i < len(cuts) and cuts[i] % 4 == 0:  # sometimes roll back, as a rejected draft does
            text = text[: max(0, len(text) - cuts[i])]
        member.sync(text)
        assert member.text == text
        assert member.ids == member.canonical_ids(text)
        got = member.logprobs([member.n_tokens])[0]
        assert torch.allclose(got, _fresh_logprobs(member), atol=1e-4)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_logprobs_at_several_boundaries_in_one_pass(tiny_members, family):
    member = tiny_members[family]
    member.start(MESSAGES)
    member.sync("Tom has 7 apples. He buys 5 more.")
    n = member.n_tokens
    calls = member.calls
    rows = member.logprobs([1, n // 2, n])
    assert member.calls == calls + 1
    seq = member.prompt_ids + member.ids
    with torch.no_grad():
        full = torch.log_softmax(member.model(torch.tensor([seq])).logits[0].float(), -1)
    p = len(member.prompt_ids)
    for row, b in zip(rows, [1, n // 2, n], strict=True):
        assert torch.allclose(row, full[p + b - 1], atol=1e-4)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_verify_in_line_equals_separate_scoring(tiny_members, family):
    member = tiny_members[family]
    member.start(MESSAGES)
    member.sync("Tom has")
    candidates = [" 7 apples", " 12 apples.", " x", " he buys\n5"]
    calls = member.calls
    scores = member.score(candidates)
    assert member.calls <= calls + 2  # the prefix (if pending) and one pass for all candidates
    assert member.text == "Tom has" and member.ids == member.canonical_ids("Tom has")
    base = len(member.ids)
    p = len(member.prompt_ids)
    for candidate, score in zip(candidates, scores, strict=True):
        ids = member.canonical_ids("Tom has" + candidate)
        with torch.no_grad():
            out = member.model(torch.tensor([member.prompt_ids + ids])).logits[0]
        full = torch.log_softmax(out.float(), -1)
        expected = torch.stack([full[p + i - 1, ids[i]] for i in range(base, len(ids))])
        assert torch.allclose(score, expected, atol=1e-4)
    # the cache still serves the prefix exactly
    assert torch.allclose(member.logprobs([base])[0], _fresh_logprobs(member), atol=1e-4)


def test_draft_then_rollback_keeps_cache_consistent(tiny_members):
    from core.config import GenerationConfig
    from core.sampling import Sampler

    member = tiny_members[0]
    member.start(MESSAGES)
    member.sync("Tom has")
    draft = member.draft(6, Sampler(GenerationConfig()))
    assert draft.logprobs.shape[0] == len(draft.ids) + int(draft.stopped)
    assert member.ids[-len(draft.ids) :] == draft.ids if draft.ids else True
    member.sync("Tom has 12")
    assert member.ids == member.canonical_ids("Tom has 12")
    assert torch.allclose(member.logprobs([member.n_tokens])[0], _fresh_logprobs(member), atol=1e-4)


def test_prompt_prefix_is_reused_across_requests(tiny_members):
    member = tiny_members[1]
    member.start(MESSAGES)
    member.logprobs([0])
    member.sync("Tom has 7")
    member.logprobs([member.n_tokens])
    before = member.calls
    member.start(MESSAGES)  # same prompt: the cached prompt stays valid
    member.logprobs([0])
    assert member.calls == before + 1  # recomputes only the last prompt row


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
@settings(max_examples=15, deadline=None)
@given(pieces=st.lists(st.sampled_from(WORDS), min_size=1, max_size=8), back=st.integers(0, 6))
def test_sync_ids_keeps_ids_as_given_and_cache_exact(tiny_members, family, pieces, back):
    """`sync_ids` makes the response exactly the ids given, one token per piece here (not the
    tokenizer's own spelling of their text): its text is theirs, the cache matches a fresh
    forward, rolling back to a prefix of them keeps them, and a `sync` to the same text keeps
    them too."""
    member = tiny_members[family]
    member.start(MESSAGES)
    member.sync("Tom")
    vocab = member.vocab
    ids = member.ids + [i for p in pieces for i in vocab.encode(p)[:1] if vocab.strings[i]]
    member.sync_ids(ids)
    text = vocab.decode_bytes(ids).decode("utf-8")
    assert member.ids == ids and member.text == text
    assert torch.allclose(member.logprobs([member.n_tokens])[0], _fresh_logprobs(member), atol=1e-4)
    kept = ids[: max(1, len(ids) - back)]
    member.sync_ids(kept)
    member.sync(vocab.decode_bytes(kept).decode("utf-8"))
    assert member.ids == kept
    assert torch.allclose(member.logprobs([member.n_tokens])[0], _fresh_logprobs(member), atol=1e-4)
