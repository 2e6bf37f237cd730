"""A member whose template ends a turn with text (`Local(..., stop=[...])`, a base model's
"\\nQuestion:") ends its drafts where it writes that text, and ending a turn counts writing it
when the member scores a continuation that ends there."""

from __future__ import annotations

import pytest
import torch

from core import GenerationConfig, Local
from core.hf_member import HFMember
from core.sampling import Sampler

MESSAGES = [{"role": "user", "content": "Tom has 7 apples. How many?"}]
GREEDY = Sampler(GenerationConfig())


@pytest.fixture(scope="module")
def plain_and_stop(tiny_dirs):
    """The bpe member as it is, its greedy text, and the same model with a stop string taken
    from the middle of that text (three of its tokens, starting at a token boundary)."""
    path = tiny_dirs["tb-gpt2-bpe"]
    plain = HFMember.load(path, device="cpu")
    plain.start(MESSAGES)
    plain.draft(40, GREEDY)
    data, ends = plain.state.sequence.data, plain.token_ends
    k = next(i for i in range(4, len(ends) - 3) if data[ends[i - 1] : ends[i + 2]].isascii())
    stop = data[ends[k - 1] : ends[k + 2]].decode()
    member = HFMember.load(Local(path, stop=[stop]), device="cpu")
    return plain, member, data, stop


def test_a_draft_ends_where_the_member_writes_its_stop_string(plain_and_stop):
    plain, member, data, stop = plain_and_stop
    member.start(MESSAGES)
    draft = member.draft(40, GREEDY)
    hit = data.find(stop.encode())
    assert draft.stopped
    assert member.state.sequence.data == data[: max(e for e in [0, *plain.token_ends] if e <= hit)]
    assert stop not in member.text
    assert len(draft.logprobs) == len(draft.ids) + 1  # the last row is where the turn ended
    assert member.cut_at_stop(f"ab{stop}cd") == ("ab", True)
    assert member.cut_at_stop("abcd") == ("abcd", False)


def test_ending_a_turn_counts_the_stop_string_written_next(plain_and_stop):
    plain, member, data, stop = plain_and_stop
    for m in (plain, member):
        m.start(MESSAGES)
    texts = [" 12 apples", " He has 12"]
    got = member.score(texts, base="", ends=[True, False])
    alone = plain.score(texts, base="", ends=[True, False])
    body = alone[0][:-1].sum()
    written = plain.score([texts[0] + stop], base="")[0].sum() - body
    assert torch.allclose(got[0][:-1], alone[0][:-1])
    assert torch.allclose(got[0][-1], torch.logaddexp(alone[0][-1], written.clamp(max=0.0)))
    assert got[0][-1] > alone[0][-1]  # writing the stop string is a way to end the turn
    assert torch.allclose(got[1], alone[1])  # a continuation that goes on is scored as before
    raw = member.score(texts, base="", ends=[True, False], raw=True)
    assert torch.allclose(raw[0], plain.score(texts, base="", ends=[True, False], raw=True)[0])
