"""SAFE through the public API: OOV-like detection on the real testbed tokenizers, the consensus
rule's guarantee (Theorem 1), canonical member state after every cycle, exact reproduction of
the drafter when the verifiers are its copies, stats that add up, sampling, and `heal`."""

from __future__ import annotations

import pytest
import torch
from conftest import needs_trained
from hypothesis import given, settings
from hypothesis import strategies as st
from scripted import Scripted

from core import Ensemble, GenerationConfig, HFMember, InvalidConfigError
from core.aggregate import sharpen, sharpen_heuristic
from core.events import Drafted, EnsemblePoint, SkipConsensus, SkipGate, SkipMismatch
from core.methods.safe import EXTRA_TOKENS, HEALED, SKIP_REASONS, consensus
from core.testbed import make_problems
from core.testbed.models import load_tokenizer
from core.vocab import EOS

TEXT = "Sara starts with 6 buttons. 6 - 1 = 5. The answer is 13."
PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]


def _spans(member_index: int, text: str) -> list[tuple[int, int]]:
    """(start, end) of each token of a testbed tokenizer, from the tokenizer itself."""
    from core.testbed import model_paths

    tok = load_tokenizer(model_paths()[member_index])
    return tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]


def _ends(member_index: int, text: str) -> set[int]:
    return {0} | {end for _, end in _spans(member_index, text)}


def _adds_up(out) -> None:
    s = out.stats
    skips = sum(s.counts.get(k, 0) for k in SKIP_REASONS)
    assert s.tokens == s.ensembled_tokens + skips + s.counts.get(EXTRA_TOKENS, 0)
    assert s.ensembled_tokens == sum(isinstance(e, EnsemblePoint) for e in out.events)
    for reason, kind in zip(SKIP_REASONS, (SkipMismatch, SkipConsensus, SkipGate), strict=True):
        assert s.counts.get(reason, 0) == sum(isinstance(e, kind) for e in out.events)
        assert all(e.name == reason for e in out.events if isinstance(e, kind))
    assert s.ensemble_rate == pytest.approx(s.ensembled_tokens / s.tokens)


# --- OOV-like positions, on the real tokenizers ----------------------------------------------


@pytest.mark.parametrize("heal", [False, True], ids=["plain", "heal"])
def test_drafter_boundary_inside_a_verifier_token_is_skipped(tiny_members, heal):
    """spm drafts " 13" as "▁" "1" "3"; bpe reads it as one token "Ġ13": the boundaries after
    "▁" and "1" are inside a bpe token, so "1" and "3" must be skipped as mismatches (or, with
    heal, scored from bpe's last real boundary, where its spelling of " 13" agrees)."""
    drafter = Scripted(tiny_members[1], [TEXT], "spm-script")
    verifier = Scripted(tiny_members[0], [TEXT], "bpe-script")
    ens = Ensemble([drafter, verifier], "safe", heal=heal)
    out = ens.generate(PROMPT, max_new_tokens=64)
    assert out.text == TEXT and out.finish_reason == "stop"
    spm_ends = sorted(_ends(1, TEXT))  # where each spm token ends (0 = before the first)
    bpe_ends = _ends(0, TEXT)
    expected = {j for j, b in enumerate(spm_ends) if b not in bpe_ends}
    assert TEXT.index(" 13") + 1 in {spm_ends[j] for j in expected}  # inside "Ġ13"
    mismatched = {e.position for e in out.events if isinstance(e, SkipMismatch)}
    agreed = {e.position for e in out.events if isinstance(e, SkipConsensus)}
    assert out.stats.tokens == len(spm_ends)  # every spm token and the stop
    if heal:  # also read by text: aligned, but bpe's next token ends inside spm's token
        starts = {a: b for a, b in _spans(0, TEXT)}
        spans = {j for j, (a, b) in enumerate(_spans(1, TEXT)) if starts.get(a, b) < b}
        assert spans == {5}  # "▁buttons." against "Ġbuttons" "."
        drafts = sum(isinstance(e, Drafted) for e in out.events)  # + each draft's cut edge
        assert len(expected | spans) <= out.stats.counts[HEALED] <= len(expected | spans) + drafts
        assert not mismatched
        assert agreed == set(range(out.stats.tokens))
    else:
        assert mismatched == expected
        assert all(e.member == "bpe-script" for e in out.events if isinstance(e, SkipMismatch))
        assert agreed == set(range(out.stats.tokens)) - expected
    assert out.stats.ensembled_tokens == 0
    _adds_up(out)


def test_ensembled_token_replaces_the_draft_and_members_stay_canonical(tiny_members):
    """Two verifiers say 12 where the drafter says 13: the ensemble replaces the drafted token,
    drops the rest of the draft, and the drafter resumes from the new text."""
    wrong, right = "The answer is 13.", "The answer is 12."
    drafter = Scripted(tiny_members[0], [(wrong, 0.9), (right, 0.1)], "bpe-draft")
    verifiers = [Scripted(tiny_members[0], [right], f"bpe-{i}") for i in range(2)]
    ens = Ensemble([drafter, *verifiers], "safe", preset="paper")
    text, stream = "", ens.stream(PROMPT, GenerationConfig(max_new_tokens=32))
    for delta in stream:
        text += delta.text  # each delta is one cycle's commit: every member is synced to it
        for member in stream.members:
            assert member.text == text and member.ids == member.canonical_ids(text)
    assert text == right
    out = ens.generate(PROMPT, max_new_tokens=32)
    points = [e for e in out.events if isinstance(e, EnsemblePoint)]
    assert [(p.drafted, p.chosen) for p in points] == [(" 13", " 12")]
    assert points[0].top[0][0] == " 12" and not points[0].sharpened
    drafts = [e for e in out.events if isinstance(e, Drafted)]
    assert drafts[1].position == points[0].position + 1  # resumed right after the point
    _adds_up(out)


@pytest.mark.parametrize("heal", [False, True], ids=["plain", "heal"])
def test_heal_lets_a_finer_verifier_weigh_in_on_a_coarser_token(tiny_members, heal):
    """bpe drafts " 13" as ONE token; spm's next token there is a bare "▁" it is sure of, so
    the paper's rule skips (consensus on the space) and spm's digits never count. With heal, spm
    is scored on the drafted text " 13" itself (its "▁" "1" "3" spelling, rows from the same
    pass), disagrees, and the ensemble picks its " 12" (decided token by token, as the paper
    decides; `decide="word"` is tested on its own)."""
    wrong, right = "The answer is 13.", "The answer is 12."
    drafter = Scripted(tiny_members[0], [(wrong, 0.6), (right, 0.4)], "bpe-draft")
    verifier = Scripted(tiny_members[1], [right], "spm-verify")
    ens = Ensemble([drafter, verifier], "safe", heal=heal, decide="token")
    out = ens.generate(PROMPT, max_new_tokens=32)
    points = [(e.drafted, e.chosen) for e in out.events if isinstance(e, EnsemblePoint)]
    if heal:
        assert out.text == right and points == [(" 13", " 12")]
        assert out.stats.counts[HEALED] >= 1
    else:
        assert out.text == wrong and points == []
    _adds_up(out)


# --- the authors' three rules (preset="authors") ----------------------------------------------


def test_stop_read_as_text_is_ensembled(tiny_members):
    """Both members end the turn after TEXT (the drafter with probability 0.9). Read as the stop
    (its mass), the verifier agrees and the stop stands with no ensembling; read as text
    (stop_check="text": the authors' code decodes the drafter's "<|end|>" into the text), the
    verifier's own token there is its first token of "<|end|>", which it gives ~0, so SAFE
    ensembles at the stop; each member's stop is then a candidate of its own, spelled as its
    text, and the verifier's "<|im_end|>" (all its mass) beats the drafter's "<|end|>" (0.9 of
    its mass): the turn ends."""
    drafter = Scripted(tiny_members[0], [(TEXT, 0.9), (TEXT + " Done.", 0.1)], "bpe-script")
    verifier = Scripted(tiny_members[1], [TEXT], "spm-script")
    outs = {}
    for rule in ("mass", "text"):
        ens = Ensemble([drafter, verifier], "safe", preset="paper", stop_check=rule)
        outs[rule] = out = ens.generate(PROMPT, max_new_tokens=64)
        assert out.text == TEXT and out.finish_reason == "stop"
        _adds_up(out)
    assert outs["mass"].stats.ensembled_tokens == 0
    points = [e for e in outs["text"].events if isinstance(e, EnsemblePoint)]
    last = outs["text"].stats.tokens - 1
    assert [(p.position, p.drafted, p.chosen) for p in points] == [(last, EOS, "<|im_end|>")]
    assert (
        outs["text"].stats.counts["skip_consensus"]
        == outs["mass"].stats.counts["skip_consensus"] - 1
    )  # the stop was a consensus skip, and is now an ensemble point


@pytest.mark.parametrize(
    "remap, subtoken", [("likeliest", "first"), ("as-aligned", "first"), ("as-aligned", "nonblank")]
)
def test_remap_of_the_ensembles_choice_onto_the_drafter(tiny_members, remap, subtoken):
    """spm drafts " 13" as "▁" "1" "3"; two bpe verifiers want " 12", which wins the ensemble
    at "▁". "likeliest": spm has no token that starts with " 12", so the string itself is
    committed (three spm tokens). "as-aligned" (the authors' UniTE): the drafter appends the ONE
    id its column read " 12" from: by subtoken="first" that is "▁", the drafted token itself, so
    the drafter's " 13" stands; by "nonblank" (the authors') it is "1", glued to the word
    before it."""
    wrong, right = "The answer is 13.", "The answer is 12."
    drafter = Scripted(tiny_members[1], [(wrong, 0.9), (right, 0.1)], "spm-draft")
    verifiers = [Scripted(tiny_members[0], [right], f"bpe-{i}") for i in range(2)]
    ens = Ensemble([drafter, *verifiers], "safe", preset="paper", remap=remap, subtoken=subtoken)
    out = ens.generate(PROMPT, max_new_tokens=32)
    points = [(e.drafted, e.chosen) for e in out.events if isinstance(e, EnsemblePoint)]
    assert points[0] == (" ", " 12")
    if remap == "likeliest":
        assert out.text == right and out.stats.counts[EXTRA_TOKENS] == 2
    elif subtoken == "first":
        assert out.text == wrong
    else:
        assert out.text.startswith("The answer is1")
    _adds_up(out)


def test_authors_preset_sets_the_three_rules_and_options_override_it(tiny_members):
    rules = ("stop_check", "remap", "subtoken")

    def summary(**options):
        s = Ensemble(tiny_members[:2], "safe", **options).summary()
        return tuple(s[k] for k in rules)

    assert summary() == ("mass", "likeliest", "first")
    assert summary(preset="authors") == ("text", "as-aligned", "nonblank")
    assert summary(preset="authors", subtoken="first") == ("text", "as-aligned", "first")
    assert summary(remap="as-aligned") == ("mass", "as-aligned", "first")


# --- the consensus rule (Theorem 1) ----------------------------------------------------------


@st.composite
def _member_rows(draw) -> list[list[float]]:
    """2-4 members' probabilities over the same 2-6 aligned candidates."""
    members, candidates = draw(st.integers(2, 4)), draw(st.integers(2, 6))
    weight = st.one_of(st.just(0.0), st.floats(1e-3, 1.0))  # exact zeros and ties happen
    row = st.lists(weight, min_size=candidates, max_size=candidates).filter(lambda r: sum(r))
    return draw(st.lists(row, min_size=members, max_size=members))


@settings(max_examples=200, deadline=None)
@given(rows=_member_rows())
def test_consensus_skip_implies_drafted_token_is_the_average_argmax(rows):
    """Candidates are aligned so each member's own next token is candidate 0's slot; member 0
    is the greedy drafter (its token is its argmax). Whenever the rule skips, the plain
    average's argmax is the drafted token."""
    probs = torch.tensor(rows, dtype=torch.float64)
    probs = probs / probs.sum(1, keepdim=True)
    drafted = int(torch.argmax(probs[0]))
    own = probs[:, drafted].tolist()
    agree = [bool(probs[v, drafted] >= probs[v].max()) for v in range(1, len(rows))]
    if consensus(own, agree):
        mean = probs.mean(0)
        assert mean[drafted] >= mean.max() - 1e-12


def test_consensus_rule_edges():
    assert consensus([0.9, 0.2], [False])  # average 0.55
    assert not consensus([0.6, 0.4], [False])  # exactly one half is a possible tie: ensemble
    assert consensus([0.3, 0.1, 0.1], [True, True])  # every verifier agrees


# --- sharpening --------------------------------------------------------------------------------


def test_heuristic_sharpening_gathers_a_split_word():
    strings = ["So", "Sofia", "Sof", "Paris", " "]
    mean = torch.tensor([0.2, 0.15, 0.1, 0.3, 0.25])
    eligible = torch.tensor([True, False, False, True, True])
    out = sharpen_heuristic(mean, strings, eligible, threshold=0.1)
    assert out.tolist() == pytest.approx([0.45, 0.15, 0.1, 0.3, 0.25])  # " " never gathers
    probs = torch.stack([mean, mean])
    scores, fired = sharpen(probs, "heuristic", strings, eligible)
    assert fired and strings[int(torch.argmax(scores))] == "So"
    confident = torch.tensor([[0.6, 0.1, 0.1, 0.1, 0.1]] * 2)
    assert sharpen(confident, "geometric", strings, eligible)[1] is False


# --- stats, sampling, options on tiny random members -------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(),
        dict(decide="token"),
        dict(aggregator="gac"),
        dict(sharpen="geometric", heal=True),
        dict(aggregator="gac", sharpen=None, heal=True, lookahead=3),
        dict(heal="oov"),
        dict(drafter="tb-qwen2-spm"),
        dict(preset="authors"),
        dict(preset="authors", aggregator="gac", drafter="tb-qwen2-spm"),
    ],
    ids=[
        "unite",
        "unite-token",
        "gac",
        "geo-heal",
        "gac-heal",
        "heal-oov",
        "spm-drafts",
        "authors",
        "authors-gac",
    ],
)
def test_stats_add_up_and_verifiers_stay_canonical(tiny_members, options):
    ens = Ensemble(tiny_members, "safe", **options)
    text, stream = "", ens.stream(PROMPT, GenerationConfig(max_new_tokens=24))
    for delta in stream:
        text += delta.text
        for member in stream.members:
            if member.name == ens.summary()["drafter"]:
                continue  # a random drafter keeps its own (maybe non-canonical) tokens
            assert member.text == text and member.ids == member.canonical_ids(text)
    out = ens.generate(PROMPT, max_new_tokens=24)
    assert out.text == text
    assert out.stats.tokens <= 24 + out.stats.counts.get(EXTRA_TOKENS, 0)
    assert list(out.stats.prompt_tokens)[0] == ens.summary()["drafter"]
    _adds_up(out)


def test_sampling_is_reproducible_with_a_seed(tiny_members):
    ens = Ensemble(tiny_members[:2], "safe")
    config = GenerationConfig(max_new_tokens=20, temperature=1.0, seed=7)
    a, b = ens.generate(PROMPT, config), ens.generate(PROMPT, config)
    assert a.text == b.text and [e.to_dict() for e in a.events] == [e.to_dict() for e in b.events]
    _adds_up(a)
    other = [ens.generate(PROMPT, config, seed=s).text for s in (1, 2, 3)]
    assert any(t != a.text for t in other)


@pytest.mark.parametrize(
    "options, fragment",
    [
        (dict(aggregator="mean"), "aggregator="),
        (dict(sharpen="soft"), "sharpen="),
        (dict(lookahead=0), "lookahead="),
        (dict(lookahead=5, max_lookahead=4), "max_lookahead="),
        (dict(top_k=2.5), "top_k="),
        (dict(threshold=1.5), "threshold="),
        (dict(heal="yes"), "heal="),
        (dict(decide="phrase"), "decide="),
        (dict(preset="arxiv"), "preset="),
        (dict(stop_check="eos"), "stop_check="),
        (dict(remap="first"), "remap="),
        (dict(subtoken="space"), "subtoken="),
        (dict(drafter="nobody"), "drafter="),
        (dict(speed=3), "unknown option"),
    ],
)
def test_bad_options_name_the_problem(tiny_members, options, fragment):
    with pytest.raises(InvalidConfigError, match=fragment):
        Ensemble(tiny_members[:2], "safe", **options)


def test_branch_logprobs_match_a_fresh_forward_and_leave_the_cache(tiny_members):
    member = tiny_members[0]
    member.start(PROMPT)
    member.sync("Sara starts with 6 buttons.")
    n = member.n_tokens
    end = member.logprobs([n])[0]
    branches = [[member.ids[3]], member.canonical_ids(" 13 apples")[:3], [5, 6]]
    rows = member.branch_logprobs(2, branches)
    for branch, row in zip(branches, rows, strict=True):
        seq = member.prompt_ids + member.ids[:2] + branch
        with torch.no_grad():
            fresh = torch.log_softmax(member.model(torch.tensor([seq])).logits[0, -1].float(), -1)
        assert torch.allclose(row, fresh, atol=1e-4)
    assert member.n_tokens == n and member.text == "Sara starts with 6 buttons."
    assert torch.allclose(member.logprobs([n])[0], end, atol=1e-5)


@pytest.mark.parametrize(
    "family, text, back",
    [(0, "Sara has 1", 1), (1, "Sara has 13", 3), (2, "Sara has 13", 1)],
    ids=["bpe", "spm", "word"],
)
def test_healed_probabilities_of_the_next_byte_sum_to_one(tiny_members, family, text, back):
    """From a real boundary `back` tokens before the end, P(u + x) / P(u) over every next byte
    x, plus P(u then stop), is a distribution: marginalising over every spelling (canonical or
    not, through extra batched passes) loses nothing."""
    from core.methods.safe.heal import Healer as _Healer
    from core.vocab import ByteIndex as _ByteIndex

    member = tiny_members[family]
    member.start(PROMPT)
    member.sync(text)
    m = member.n_tokens - back
    u = text.encode()[member.token_ends[m - 1] :]
    index = _ByteIndex(member.vocab, member.stop_ids)
    healer = _Healer(member, index, m, member.logprobs([m])[0], prune=0.0)  # exact
    targets = [(u, False), (u, True)] + [(u + bytes([x]), False) for x in range(256)]
    values = healer.probs(targets)
    assert values[0] > 0
    assert sum(values[1:]) / values[0] == pytest.approx(1.0, abs=1e-4)
    assert member.text == text and member.ids == member.canonical_ids(text)


def test_copies_of_a_tiny_drafter_reproduce_it(tiny_members):
    """Verifiers that are the drafter itself agree at every position: SAFE commits exactly what
    the drafter alone writes (the tiny bpe model's greedy text is canonical, so they read it
    the same way)."""
    base = tiny_members[0]
    copies = [HFMember(f"copy-{i}", base.model, base.tokenizer) for i in range(2)]
    expected = Ensemble([base], "single").generate(PROMPT, max_new_tokens=40)
    for options in (
        dict(),
        dict(aggregator="gac"),
        dict(sharpen="geometric", lookahead=3),
        dict(max_lookahead=16),
    ):
        ens = Ensemble([base, *copies], "safe", preset="paper", **options)
        out = ens.generate(PROMPT, max_new_tokens=40)
        assert out.text == expected.text and out.stats.tokens == expected.stats.tokens
        assert out.stats.ensembled_tokens == 0
        _adds_up(out)


def test_drafts_grow_while_they_stand_and_shrink_at_a_replacement(tiny_members):
    """max_lookahead: a draft that stands whole doubles the next one (capped); a replaced
    position brings it back to `lookahead`."""
    base = tiny_members[0]
    copy = HFMember("copy", base.model, base.tokenizer)
    paper = dict(preset="paper", max_lookahead=12)
    out = Ensemble([base, copy], "safe", **paper).generate(PROMPT, max_new_tokens=40)
    sizes = [len(e.tokens) for e in out.events if isinstance(e, Drafted)]
    assert sizes[:3] == [5, 10, 12] and sum(sizes) >= out.stats.tokens  # copies: all stand
    ens = Ensemble(tiny_members, "safe", **paper)  # random members disagree
    expected, replaced, drafts, replacements = 5, False, 0, 0
    for event in ens.generate(PROMPT, max_new_tokens=60).events:
        if isinstance(event, Drafted):
            if drafts:
                expected = 5 if replaced else min(2 * expected, 12)
            assert len([t for t in event.tokens if t != EOS]) <= expected + 3  # + UTF-8 tail
            drafts, replaced = drafts + 1, False
        elif isinstance(event, EnsemblePoint) and event.chosen != event.drafted:
            replaced, replacements = True, replacements + 1
    assert replacements > 0 and drafts > 2


# --- the shipped models ------------------------------------------------------------------------


@needs_trained
@pytest.mark.parametrize("drafter", [0, 1], ids=["bpe", "spm"])
def test_safe_with_copies_of_the_drafter_reproduces_it(shipped_members, drafter):
    base = shipped_members[drafter]
    copies = [HFMember(f"copy-{i}", base.model, base.tokenizer) for i in range(2)]
    single = Ensemble([base], "single")
    configs = [
        dict(),
        dict(aggregator="gac", sharpen="geometric"),
        dict(sharpen=None, heal=True, lookahead=3),
    ]
    safes = [Ensemble([base, *copies[: 1 + i % 2]], "safe", **c) for i, c in enumerate(configs)]
    for problem in make_problems(3, seed=3):
        expected = single.generate(problem.messages, max_new_tokens=64)
        for ens in safes:
            out = ens.generate(problem.messages, max_new_tokens=64)
            assert out.text == expected.text and out.finish_reason == expected.finish_reason
            assert out.stats.tokens == expected.stats.tokens
            _adds_up(out)


@needs_trained
@pytest.mark.parametrize("heal", [False, True], ids=["plain", "heal"])
def test_growing_drafts_keep_the_text_when_the_coarser_tokenizer_drafts(make_ensemble, heal):
    """With the bpe drafter every verifier boundary it needs is one of its own, so where its
    drafts end changes nothing: the same text (measured: 200/200 problems) with fewer verifier
    passes. (With the finer spm drafter the draft's end is read differently: see the bench.)"""
    fixed = make_ensemble("safe", members=[0, 1], heal=heal, max_lookahead=None)
    growing = make_ensemble("safe", members=[0, 1], heal=heal, max_lookahead=20)
    for problem in make_problems(5, seed=4):
        want = fixed.generate(problem.messages, max_new_tokens=96)
        got = growing.generate(problem.messages, max_new_tokens=96)
        assert got.text == want.text and got.stats.ensembled_tokens == want.stats.ensembled_tokens
        cycles = [sum(isinstance(e, Drafted) for e in o.events) for o in (got, want)]
        assert cycles[0] <= cycles[1]
        _adds_up(got)


@needs_trained
@pytest.mark.parametrize("drafter", [0, 1], ids=["bpe", "spm"])
@pytest.mark.parametrize("grow", [None, 20], ids=["fixed", "grow"])
def test_every_member_is_canonical_after_every_cycle(make_ensemble, drafter, grow):
    ens = make_ensemble(
        "safe", members=[drafter, 1 - drafter], heal=drafter == 1, max_lookahead=grow
    )
    for problem in make_problems(3, seed=5):
        text, stream = "", ens.stream(problem.messages, GenerationConfig(max_new_tokens=96))
        for delta in stream:
            text += delta.text
            for member in stream.members:
                assert member.text == text and member.ids == member.canonical_ids(text)
        assert ens.generate(problem.messages, max_new_tokens=96).text == text


def test_branch_logprobs_follow_the_request_grammar(tiny_members):
    """A branch's row is masked as `logprobs` rows are; a branch the grammar rejects has none."""
    from core.grammar import build_constraint

    member = tiny_members[0]
    member.start(PROMPT, constraint=build_constraint((), "none", True, {"type": "integer"}))
    digits = member.canonical_ids("12")
    rows = member.branch_logprobs(0, [digits[:1], member.canonical_ids("ab")[:1]])
    allowed = torch.isfinite(rows[0])
    assert allowed.any() and not allowed.all()
    assert torch.isclose(rows[0].exp().sum(), torch.tensor(1.0), atol=1e-4)
    assert torch.isneginf(rows[1]).all()  # "a" is no integer: nothing follows it


@needs_trained
def test_heal_reads_a_tool_tag_that_another_tokenizer_spells_in_five_tokens(shipped_members):
    """tb-qwen2-spm writes `<tool_call>` as one token, the others as five tokens of text: the
    default SAFE (heal on) with it drafting still writes the call, whole and closed."""
    spm, bpe, word = shipped_members[1], shipped_members[0], shipped_members[2]
    magic = {
        "type": "function",
        "function": {
            "name": "magic_function",
            "description": "Applies a magic function to an input.",
            "parameters": {
                "type": "object",
                "properties": {"input": {"type": "integer"}},
                "required": ["input"],
            },
        },
    }
    question = "What is the value of magic_function(3)? Use the tool."
    out = Ensemble([spm, word, bpe]).generate(question, tools=[magic], max_new_tokens=64)
    assert [(c.name, c.arguments) for c in out.tool_calls] == [("magic_function", {"input": 3})]
    assert out.finish_reason == "tool_calls"
