"""Token ids as exact bytes, across the three tokenizer families, and the two alignments."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.alignment import UnionVocab, subtoken_id, unite_union
from core.vocab import EOS, is_cut

TEXT = st.text(
    alphabet=st.sampled_from(list("Tom has 7 apples.\n+-=\tab cdéü☃😀 0123456789  ")),
    max_size=80,
)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
@settings(max_examples=60, deadline=None)
@given(text=TEXT)
def test_token_bytes_spell_the_text(tiny_members, family, text):
    vocab = tiny_members[family].vocab
    assert vocab.decode_bytes(vocab.encode(text)).decode("utf-8") == text


def test_families_disagree_on_number_boundaries(tiny_members):
    spelled = [[m.vocab.strings[i] for i in m.vocab.encode("7 + 15 = 22")] for m in tiny_members]
    assert len({tuple(s) for s in spelled}) == 3, spelled


def test_control_tokens_spell_nothing_and_stop(tiny_members):
    for member in tiny_members:
        for i in member.vocab.special_ids:
            assert member.vocab.token_bytes[i] == b""
            assert member.vocab.strings[i] is None
        assert member.stop_ids >= member.vocab.special_ids
        end = member.tokenizer.eos_token_id
        assert end in member.stop_ids


def test_cut_is_a_whitespace_run_start():
    data = b"a  b\nc"
    assert [i for i in range(len(data) + 1) if is_cut(data, i)] == [0, 1, 4, 6]


def _peaked(size: int, favourites: dict[int, float]) -> torch.Tensor:
    probs = torch.full((size,), 1e-6)
    for i, p in favourites.items():
        probs[i] = p
    return torch.log(probs / probs.sum())


def test_unite_union_maps_strings_across_vocabularies(tiny_members):
    a, b = tiny_members[0], tiny_members[2]
    a_id, b_id = a.vocab.string_to_id[" apples"], b.vocab.string_to_id[" apples"]
    a_lp = _peaked(a.vocab.size, {a_id: 0.9})
    b_lp = _peaked(b.vocab.size, {b_id: 0.6, next(iter(b.tokenizer.all_special_ids)): 0.3})
    aligned = unite_union([a.vocab, b.vocab], [a.stop_ids, b.stop_ids], [a_lp, b_lp], k=3)
    column = aligned.strings.index(" apples")
    assert aligned.probs[0, column] > 0.85 and aligned.probs[1, column] > 0.55
    assert EOS in aligned.strings  # the special token's mass is the member's "stop" mass
    assert torch.allclose(aligned.probs.sum(1), torch.ones(2))


def test_gac_union_projects_full_distributions(tiny_members):
    union = UnionVocab([m.vocab for m in tiny_members], [m.stop_ids for m in tiny_members])
    lps = [torch.log_softmax(torch.randn(m.vocab.size), 0) for m in tiny_members]
    aligned = union.align(lps)
    assert aligned.probs.shape == (3, len(union.strings))
    # every member's mass survives except what sits on ids that spell no whole character
    for m, (member, lp) in enumerate(zip(tiny_members, lps, strict=True)):
        spellable = [
            i for i in range(member.vocab.size) if member.vocab.strings[i] or i in member.stop_ids
        ]
        assert aligned.probs[m].sum() == pytest.approx(lp[spellable].exp().sum().item(), abs=1e-4)
    word = tiny_members[2]
    i = word.vocab.string_to_id[" apples"]
    assert aligned.probs[2, union.strings.index(" apples")] >= lps[2][i].exp() - 1e-6


def test_subtoken_rule_for_strings_outside_the_top_k(tiny_members):
    """spm spells " 12" as "▁" "1" "2". UniTE's code reads such a string by its first sub-token
    that is not a bare space ("nonblank"); "first" reads the bare space, the same value for
    every number."""
    spm = tiny_members[1].vocab
    blank, one, two = (spm.string_to_id[s] for s in (" ", "1", "2"))
    assert subtoken_id(spm, " 12", "first") == subtoken_id(spm, " 23", "first") == blank
    assert (subtoken_id(spm, " 12", "nonblank"), subtoken_id(spm, " 23", "nonblank")) == (one, two)
    assert subtoken_id(spm, " ", "nonblank") == blank  # a string that is one token is that token
    bpe = tiny_members[0]
    ids = [bpe.vocab.string_to_id[s] for s in (" 12", " 23")]
    bpe_lp = _peaked(bpe.vocab.size, dict.fromkeys(ids, 0.45))
    spm_lp = _peaked(spm.size, {two: 0.6, blank: 0.3, one: 0.05})
    columns = {}
    for rule in ("first", "nonblank"):
        aligned = unite_union(
            [bpe.vocab, spm],
            [bpe.stop_ids, tiny_members[1].stop_ids],
            [bpe_lp, spm_lp],
            k=2,
            subtoken=rule,
        )
        columns[rule] = [float(aligned.probs[1, aligned.strings.index(s)]) for s in (" 12", " 23")]
    assert columns["first"][0] == columns["first"][1]  # both read P("▁")
    assert columns["nonblank"][1] > 10 * columns["nonblank"][0]  # P("2") against P("1")
