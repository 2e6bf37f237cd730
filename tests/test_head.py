"""The output head's few-row kernel (`core.head`): a member this library loads gets it where
its head is wide, and the rows a method reads are the model's own (to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from core import HFMember
from core.head import FEW_ROWS, WIDE_HEAD, FewRowHead, use_few_row_head
from core.testbed import random_model

PADDED = WIDE_HEAD // 32  # rows of a 32-wide head at the size from which the kernel is taken


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wide") / "tb-llama-word"
    return str(random_model("tb-llama-word", out, seed=3, vocab_size=PADDED))


def test_a_wide_head_scores_every_row_as_the_model_does(wide):
    member = HFMember.load(wide, device="cpu")
    head = member.model.get_output_embeddings()
    assert type(head) is FewRowHead
    assert head.weight is member.model.get_input_embeddings().weight  # still tied
    plain = AutoModelForCausalLM.from_pretrained(wide).eval()
    assert type(plain.get_output_embeddings()) is nn.Linear
    assert member.model.state_dict().keys() == plain.state_dict().keys()

    member.start("The cat sat on the mat and then")
    member.sync_ids(member.tokenizer.encode(" it slept all day long in the sun")[:9])
    ids = member.prompt_ids + member.ids
    with torch.no_grad():
        reference = torch.log_softmax(plain(torch.tensor([ids])).logits[0].float(), dim=-1)
    for rows in (1, 2, 3, 5, 8, 9):
        boundaries = list(range(member.n_tokens - rows + 1, member.n_tokens + 1))
        member.drop_cache()
        got = member.logprobs(boundaries)
        expected = reference[[len(member.prompt_ids) + b - 1 for b in boundaries]]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()


def test_a_small_head_is_left_as_it_is(tiny_members):
    for member in tiny_members:
        assert type(member.model.get_output_embeddings()) is nn.Linear


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_is_taken_for_a_few_float32_rows_only(wide, dtype):
    model = AutoModelForCausalLM.from_pretrained(wide, dtype=dtype).eval()
    use_few_row_head(model)
    head = model.get_output_embeddings()
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 2, 8, 9, 20):
        hidden = torch.randn(1, rows, head.in_features, generator=generator).to(dtype)
        got, plain = head(hidden), F.linear(hidden, head.weight)
        assert got.shape == plain.shape == (1, rows, PADDED) and got.is_contiguous()
        if dtype == torch.float32 and rows in FEW_ROWS:
            torch.testing.assert_close(got, plain, rtol=0, atol=1e-5)
        else:
            assert torch.equal(got, plain)  # linear itself
