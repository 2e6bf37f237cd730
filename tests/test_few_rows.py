"""The few-row kernel (`core.few_rows`): a member this library loads gets it in its head where
the head is wide and in its other linear layers where those are large together, and the rows a
method reads are the model's own (to float32 rounding)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from core import HFMember
from core.few_rows import BODY_ROWS, FEW_ROWS, WIDE_HEAD, FewRowLinear, use_few_row_kernels
from core.testbed import random_model

PADDED = WIDE_HEAD // 32  # rows of a 32-wide head at the size from which the kernel is taken
# four layers of 4 x 512^2 attention and 3 x 512 x 2048 MLP weights: the size from which the
# body takes the kernel
LARGE = dict(hidden_size=512, num_layers=4, num_heads=4, num_kv_heads=4, intermediate_size=2048)


@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("wide") / "tb-llama-word"
    return str(random_model("tb-llama-word", out, seed=3, vocab_size=PADDED))


@pytest.fixture(scope="module")
def large(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("large") / "tb-llama-word"
    return str(random_model("tb-llama-word", out, seed=4, **LARGE))


def _kernels(model: nn.Module) -> tuple[bool, bool]:
    """Whether the head takes the kernel, and whether the other linear layers do (all of them
    or none)."""
    head = model.get_output_embeddings()
    body = {type(m) for m in model.modules() if isinstance(m, nn.Linear) and m is not head}
    assert len(body) <= 1
    return type(head) is FewRowLinear, body == {FewRowLinear}


@pytest.mark.parametrize(
    "model, taken",
    [("wide", (True, False)), ("large", (False, True))],
)
def test_where_the_kernel_is_taken_every_row_is_the_models_own(model, taken, request):
    path = request.getfixturevalue(model)
    member = HFMember.load(path, device="cpu")
    assert _kernels(member.model) == taken
    head = member.model.get_output_embeddings()
    assert head.weight is member.model.get_input_embeddings().weight  # still tied
    plain = AutoModelForCausalLM.from_pretrained(path).eval()
    assert _kernels(plain) == (False, False)
    assert member.model.state_dict().keys() == plain.state_dict().keys()

    member.start("The cat sat on the mat and then")
    member.sync_ids(member.tokenizer.encode(" it slept all day long in the sun")[:9])
    ids = member.prompt_ids + member.ids
    with torch.no_grad():
        reference = torch.log_softmax(plain(torch.tensor([ids])).logits[0].float(), dim=-1)
    for rows in (1, 2, 3, 5, 8, 9):
        boundaries = list(range(member.n_tokens - rows + 1, member.n_tokens + 1))
        member.drop_cache()
        member.logprobs([boundaries[0] - 1])  # the cache up to them: one pass of `rows` ids
        got = member.logprobs(boundaries)
        expected = reference[[len(member.prompt_ids) + b - 1 for b in boundaries]]
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
        assert got.argmax(-1).tolist() == expected.argmax(-1).tolist()


def test_small_weights_are_left_as_they_are(tiny_members):
    for member in tiny_members:  # from cache, linear is the faster kernel
        assert _kernels(member.model) == (False, False)


def _first_body_layer(model: nn.Module) -> nn.Linear:
    head = model.get_output_embeddings()
    return next(m for m in model.modules() if isinstance(m, nn.Linear) and m is not head)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "model, layer_of, taken",
    [
        ("wide", lambda model: model.get_output_embeddings(), FEW_ROWS),
        ("large", _first_body_layer, BODY_ROWS),
    ],
    ids=["head", "body"],
)
def test_the_kernel_is_taken_for_a_few_float32_rows_only(model, layer_of, taken, dtype, request):
    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(model), dtype=dtype)
    use_few_row_kernels(model.eval())
    layer = layer_of(model)
    assert type(layer) is FewRowLinear
    generator = torch.Generator().manual_seed(0)
    for rows in (1, 2, 5, 6, 8, 9, 20):
        hidden = torch.randn(1, rows, layer.in_features, generator=generator).to(dtype)
        got, plain = layer(hidden), F.linear(hidden, layer.weight, layer.bias)
        assert got.shape == plain.shape == (1, rows, layer.out_features) and got.is_contiguous()
        if dtype == torch.float32 and rows in taken:
            torch.testing.assert_close(got, plain, rtol=0, atol=1e-5)
            assert not torch.equal(got, plain)  # another kernel, summing in another order
        else:
            assert torch.equal(got, plain)  # linear itself
