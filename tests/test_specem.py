"""SpecEM through the public API: verify-in-line equals separate scoring, the Hedge update,
the member trust as its prior, streaming by segments with nothing lost at the joins, 2 and 3
members.

Tiny random-weight members draft "\\n" forever when greedy, so structure tests sample (seeded),
mostly on members whose stop ids are emptied so every request runs several rounds whatever the
random weights pick; behaviour tests run the shipped models."""

from __future__ import annotations

import math

import pytest
import torch

from core import Ensemble, GenerationConfig, InvalidConfigError
from core.events import SegmentCandidates, SegmentSelected, WeightsUpdated
from core.methods.specem import clean_cut, hedge, normalise, win_rates
from core.sampling import Sampler
from core.testbed import check_answer, make_problems

PROMPT = [{"role": "user", "content": "Tom has 7 apples. He buys 5 more. How many?"}]
SAMPLED = GenerationConfig(max_new_tokens=24, temperature=1.0, seed=3)


def _events(out, kind):
    return [e for e in out.events if isinstance(e, kind)]


def _matrix(event: SegmentSelected) -> torch.Tensor:
    """scores[verifier][drafter] as a tensor: rows = verifiers, columns = drafters."""
    return torch.tensor([list(row.values()) for row in event.scores.values()], dtype=torch.float64)


def _authors(event: SegmentSelected) -> list[int]:
    """The member index of each column of `_matrix(event)`."""
    names = list(event.scores)
    return [names.index(d) for d in next(iter(event.scores.values()))]


# --- segment boundaries ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("draft", "committed"),
    [
        (" 6 - 1 = 5. 5 +", " 6 - 1 = 5. 5"),  # the trailing word may be unfinished
        (" The capital of France is Paris", " The capital of France is"),
        ("abc def\n", "abc def"),  # end BEFORE whitespace, never after
        (" 5 + 8 = 13.", " 5 + 8 = 13."),  # ends with punctuation: a clean end
        ("Sure", "Sure"),  # no boundary: taken whole (the authors' code drops the "e")
        ("\n\n", "\n\n"),
        ("a,b,c", "a,b,"),  # no whitespace: after the last punctuation mark
        ("计算，结果", "计算，"),
        ("café au", "café"),
        (" x  y", " x"),
    ],
)
def test_clean_cut(draft, committed):
    assert draft[: clean_cut(draft)] == committed


# --- the Member change: scoring behind a cached draft, ends, raw logits, fallback -------------


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _full_rows(member, ids) -> torch.Tensor:
    with torch.no_grad():
        return member.model(torch.tensor([member.prompt_ids + ids])).logits[0].float()


@pytest.fixture(scope="module")
def eager_members(tiny_dirs):
    from core import HFMember
    from core.testbed import MODEL_ORDER

    return [
        HFMember.load(tiny_dirs[n], device="cpu", attn_implementation="eager") for n in MODEL_ORDER
    ]


@pytest.fixture(scope="module")
def nonstop(tiny_dirs):
    """Tiny members that never stop, so a request runs to max_new_tokens (several rounds) whatever
    the random weights sample."""
    from core import HFMember
    from core.testbed import MODEL_ORDER

    members = [HFMember.load(tiny_dirs[n], device="cpu") for n in MODEL_ORDER]
    for m in members:
        m.stop_ids = frozenset()
    return members


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_verify_in_line_behind_a_cached_draft_equals_separate_scoring(
    tiny_members, eager_members, family, attention
):
    member = (tiny_members if attention == "sdpa" else eager_members)[family]
    assert member.attention == attention
    member.start(PROMPT)
    base = "Tom has 7 apples."
    member.sync(base + " He buys 5 more")  # ids beyond the base, as a drafter's own draft
    member.logprobs([member.n_tokens])  # ...and all of them cached
    ids, text = list(member.ids), member.text
    candidates = [" He buys", " He buys 5 more", " 12 apples.\n5", ""]
    ends = [False, False, True, True]
    for raw in (False, True):
        scores = member.score(candidates, base=base, ends=ends, raw=raw)
        assert member.ids == ids and member.text == text  # the draft is still there...
        calls = member.calls
        member.logprobs([member.n_tokens])
        assert member.calls == calls  # ...and still cached: its next row needs no forward pass
        p, prefix = len(member.prompt_ids), member.canonical_ids(base)
        n = min(  # scores start where the candidates' tokenizations leave the base's
            _common(prefix, member.canonical_ids(base + c)) for c in candidates
        )
        stops = [i for i in member.stop_ids if i < member.vocab.size]
        for candidate, end, score in zip(candidates, ends, scores, strict=True):
            full_ids = member.canonical_ids(base + candidate)
            rows = _full_rows(member, full_ids)
            rows = rows if raw else torch.log_softmax(rows, -1)
            expected = [rows[p + i - 1, full_ids[i]] for i in range(n, len(full_ids))]
            if end:
                expected.append(torch.logsumexp(rows[p + len(full_ids) - 1, stops], 0))
            assert torch.allclose(score, torch.stack(expected), atol=1e-4)
    fresh = torch.log_softmax(_full_rows(member, member.ids)[-1], -1)
    assert torch.allclose(member.logprobs([member.n_tokens])[0], fresh, atol=1e-4)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_fallback_without_block_mask_gives_the_same_numbers(tiny_members, family):
    member = tiny_members[family]
    member.start(PROMPT)
    member.sync("Tom has")
    member.draft(5, Sampler(SAMPLED))
    candidates, ends = [" 7 apples", " 12", ""], [False, True, True]
    in_line = member.score(candidates, base="Tom has", ends=ends)
    member.takes_block_mask = False
    member.state.rows.clear()  # the rows just computed would serve the scores without a pass
    try:
        calls = member.calls
        separate = member.score(candidates, base="Tom has", ends=ends)
        assert member.calls - calls == 2  # one pass per non-empty continuation
    finally:
        member.takes_block_mask = True
    for a, b in zip(in_line, separate, strict=True):
        assert torch.allclose(a, b, atol=1e-4)


# --- scores and the Hedge update on fixed matrices --------------------------------------------


def test_normalisations():
    values = [torch.tensor([-1.0, -3.0]), torch.tensor([-2.0])]
    shares = normalise(values, "logprob")  # softmax of the mean log-probs (-2, -2)
    assert shares == pytest.approx([0.5, 0.5])
    probs = normalise(values, "prob")  # mean token probability, sum-normalised
    a, b = (math.exp(-1) + math.exp(-3)) / 2, math.exp(-2)
    assert probs == pytest.approx([a / (a + b), b / (a + b)])
    assert normalise([torch.tensor([2.0]), torch.tensor([6.0])], "logit") == pytest.approx(
        [0.25, 0.75]
    )


def test_hedge_update_k2_by_hand():
    # verifier rows, candidate columns; member 1 prefers member 0's draft over its own
    m = torch.tensor([[0.60, 0.40], [0.55, 0.45]], dtype=torch.float64)
    rewards = win_rates(m, [0, 1])
    assert rewards.tolist() == [1.0, 0.0]  # the authors' floor would make both 1: no update
    w = hedge(torch.tensor([0.5, 0.5], dtype=torch.float64), rewards, lr=1.0, t=1)
    # eta_1 = 1 * sqrt(1/2) / 1 = 0.7071068; w0 = e^eta / (e^eta + 1)
    assert w.tolist() == pytest.approx([0.6697615, 0.3302385], abs=1e-6)
    w = hedge(w, rewards, lr=1.0, t=2)  # eta_2 = 0.3535534: 0.6697615 e^eta_2 / (... + 0.3302385)
    assert w.tolist() == pytest.approx([0.7428167, 0.2571833], abs=1e-6)


def test_hedge_update_k3_by_hand():
    # the sanity example of the research notes: rows = verifiers, columns = candidates
    m = torch.tensor(
        [[0.40, 0.35, 0.25], [0.30, 0.45, 0.25], [0.34, 0.33, 0.33]], dtype=torch.float64
    )
    rewards = win_rates(m, [0, 1, 2])
    assert rewards.tolist() == [0.75, 0.5, 0.0]  # wins 3, 2, 0 of (K-1)^2 = 4 comparisons
    w = hedge(torch.full((3,), 1 / 3, dtype=torch.float64), rewards, lr=0.5, t=1)
    # eta = 0.5/sqrt(3) = 0.2886751: factors e^0.2165064, e^0.1443376, 1 -> normalised
    assert w.tolist() == pytest.approx([0.3655370, 0.3400861, 0.2943770], abs=1e-6)
    # a member that does not draft gets the drafters' mean reward
    two = win_rates(m[:, [0, 2]], [0, 2])
    assert two.tolist() == pytest.approx([1.0, 0.5, 0.0])


# --- the method through the facade (tiny members: structure) ----------------------------------


@pytest.mark.parametrize("members", [[0, 1], [0, 1, 2]], ids=["2", "3"])
def test_streamed_segments_join_exactly(nonstop, members):
    ens = Ensemble([nonstop[i] for i in members], "specem")
    deltas = list(ens.stream(PROMPT, SAMPLED))
    out = ens.generate(PROMPT, SAMPLED)
    streamed = "".join(d.text for d in deltas)
    selected = [e for d in deltas for e in d.events if isinstance(e, SegmentSelected)]
    candidates = [e for d in deltas for e in d.events if isinstance(e, SegmentCandidates)]
    assert streamed == out.text == "".join(e.text for e in selected)
    assert len(selected) == len(candidates) == out.stats.counts["rounds"] >= 2
    # one delta per committed segment, the first after one round
    assert [d.text for d in deltas if d.text] == [e.text for e in selected if e.text]
    assert deltas[0].text == selected[0].text and selected[0].round == 1
    for c, s in zip(candidates, selected, strict=True):  # what won is what was drafted
        assert s.text == c.candidates[s.winner]
    for member in ens.members:  # every member followed the committed text
        member.sync(out.text)
        assert member.text == out.text
    assert out.stats.tokens <= SAMPLED.max_new_tokens
    assert set(out.stats.weights) == {m.name for m in ens.members}


def _replay(out, w: torch.Tensor, t: int, lr: float, rounds=False) -> tuple[torch.Tensor, int]:
    """Check every weight update of a request against Hedge from (w, t), t counting updates
    (or rounds); returns the weights and t after it."""
    updates = _events(out, WeightsUpdated)
    for selected in _events(out, SegmentSelected):
        update = next((u for u in updates if u.round == selected.round), None)
        t += 1 if update is not None or rounds else 0
        if update is None:  # every drafter wrote the same: nothing to learn
            continue
        rewards = win_rates(_matrix(selected), _authors(selected))
        assert list(update.rewards.values()) == pytest.approx(rewards.tolist())
        w = hedge(w, rewards, lr=lr, t=t)
        assert list(update.weights.values()) == pytest.approx(w.tolist())
        assert selected.weights == update.weights
    return w, t


def test_weights_follow_hedge_and_reset_per_request(nonstop):
    ens = Ensemble(nonstop, "specem", lr=2.0, learn_weights=False)
    out = ens.generate(PROMPT, SAMPLED)
    updates = _events(out, WeightsUpdated)
    assert updates and out.stats.ensembled_rounds == len(updates)
    w, _ = _replay(out, torch.full((3,), 1 / 3, dtype=torch.float64), 0, lr=2.0)
    assert list(out.stats.weights.values()) == pytest.approx(w.tolist())
    assert ens.member_weights == {m.name: 1 / 3 for m in ens.members}  # frozen trust: nothing
    assert ens.generate(PROMPT, SAMPLED).stats.weights == out.stats.weights  # ...is carried


def test_member_trust_carries_across_requests_and_is_the_next_hedge_prior(nonstop):
    """The paper's per-request Hedge starts from the ensemble's member trust, which learned from
    the earlier request's win rates; reset_weights() brings back the paper's uniform start."""
    ens = Ensemble(nonstop, "specem", lr=2.0, learn_weights=True)
    first = ens.generate(PROMPT, SAMPLED)
    trust = ens.member_weights
    assert first.stats.member_weights == {m.name: 1 / 3 for m in ens.members}
    assert len(set(trust.values())) > 1 and sum(trust.values()) == pytest.approx(1.0)
    second = ens.generate(PROMPT, SAMPLED)
    assert second.stats.member_weights == trust
    prior = torch.tensor(list(trust.values()), dtype=torch.float64)
    w, _ = _replay(second, prior / prior.sum(), 0, lr=2.0)  # its schedule starts at t = 1
    assert list(second.stats.weights.values()) == pytest.approx(w.tolist())
    ens.reset_weights()
    again = ens.generate(PROMPT, SAMPLED)
    assert (again.text, again.stats.weights) == (first.text, first.stats.weights)


def test_feedback_off_keeps_uniform_weights(nonstop):
    ens = Ensemble(nonstop[:2], "specem", feedback=False)
    out = ens.generate(PROMPT, SAMPLED)
    assert not _events(out, WeightsUpdated) and out.stats.ensembled_rounds >= 1
    assert out.stats.weights == {m.name: 0.5 for m in ens.members}


def test_blockwise_equals_separate_and_recompute_equals_reuse(nonstop):
    """The same request scored in line, one candidate per pass, and with every cache dropped
    each round gives the same segments and score matrices."""
    runs = []
    for reuse, block in [(True, True), (True, False), (False, True)]:
        for m in nonstop:
            m.takes_block_mask = block
        try:
            ens = Ensemble(nonstop, "specem", reuse_cache=reuse)
            runs.append(ens.generate(PROMPT, SAMPLED))
        finally:
            for m in nonstop:
                m.takes_block_mask = True
    reference = runs[0]
    for out in runs[1:]:
        assert out.text == reference.text
        for a, b in zip(
            _events(reference, SegmentSelected), _events(out, SegmentSelected), strict=True
        ):
            assert torch.allclose(_matrix(a), _matrix(b), atol=1e-4)


def test_drafters_subset_and_score_variants(nonstop):
    names = [m.name for m in nonstop]
    for score in ("logprob", "prob", "logit", "min", "pmi"):
        ens = Ensemble(nonstop, "specem", drafters=[0, names[2]], score=score)
        out = ens.generate(PROMPT, SAMPLED)
        for event in _events(out, SegmentCandidates):
            assert set(event.candidates) <= {names[0], names[2]}
        selected = _events(out, SegmentSelected)
        verified = [e for e in selected if any(v != 1.0 for v in e.scores[names[0]].values())]
        assert verified, "no round had two different candidates"
        for event in verified:
            assert list(event.scores) == names  # every member verifies
            for row in event.scores.values():
                assert sum(row.values()) == pytest.approx(1.0)
        assert ens.summary()["drafters"] == [names[0], names[2]]


def test_token_cap_counts_the_winners_tokens(nonstop):
    ens = Ensemble(nonstop, "specem", segment_tokens=4)
    out = ens.generate(PROMPT, SAMPLED, max_new_tokens=13)
    assert out.finish_reason == "length" and out.stats.tokens == 13


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"score": "mean"}, "score='mean'"),
        ({"drafters": [0]}, "at least 2"),
        ({"drafters": [0, 0]}, "twice"),
        ({"drafters": [0, "nobody"]}, "not a member"),
        ({"segment_tokens": 0}, "segment_tokens"),
        ({"lr": -1}, "lr"),
        ({"preset": "authors"}, "preset="),
        ({"draft_temperature": -0.5}, "draft_temperature="),
        ({"draft_top_p": 0}, "draft_top_p="),
        ({"schedule": "steps"}, "schedule="),
        ({"window": 10}, "unknown option"),
        ({"persist_weights": True}, "learn_weights=True"),
    ],
)
def test_bad_options_fail_with_a_clear_error(tiny_members, options, needle):
    with pytest.raises(InvalidConfigError, match=needle):
        Ensemble(tiny_members, "specem", **options)


# --- the shipped models (behaviour) ------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["updates", "rounds"])
def test_schedule_and_wins_on_rounds_without_an_update(make_ensemble, schedule):
    """Rounds where every drafter wrote the same text update nothing and credit nobody: the
    learning-rate schedule's t counts updates (or, schedule="rounds" as in the authors' code,
    every round; checked on requests where such a round comes before a later update), and the
    wins add up to the verified rounds."""
    ens = make_ensemble(  # short segments: drafters often agree on one before they differ
        "specem", lr=2.0, schedule=schedule, segment_tokens=4, learn_weights=False
    )
    uniform = torch.full((3,), 1 / 3, dtype=torch.float64)
    early = 0  # requests with a round without an update before a later update
    for problem in make_problems(6, seed=7, form="cot"):
        out = ens.generate(problem.messages, max_new_tokens=80)
        w, t = _replay(out, uniform, 0, lr=2.0, rounds=schedule == "rounds")
        assert list(out.stats.weights.values()) == pytest.approx(w.tolist())
        counts = out.stats.counts
        won = sum(v for k, v in counts.items() if k.startswith("won/"))
        assert won == out.stats.ensembled_rounds == counts["rounds"] - counts.get("consensus", 0)
        assert t == (counts["rounds"] if schedule == "rounds" else out.stats.ensembled_rounds)
        # E/T in tokens: every token of a voted round, none of a round all drafters agreed on
        assert out.stats.ensembled_tokens <= out.stats.tokens
        if not counts.get("consensus"):
            assert out.stats.ensembled_tokens == out.stats.tokens
        if not out.stats.ensembled_rounds:
            assert out.stats.ensembled_tokens == 0
        updated = [u.round for u in _events(out, WeightsUpdated)]
        skipped = [e.round for e in _events(out, SegmentSelected) if e.round not in updated]
        early += bool(updated and skipped and min(skipped) < max(updated))
    assert early > 0


def test_paper_preset_samples_drafts_reproducibly_with_a_seed(make_ensemble):
    """preset="paper": drafts sampled as the authors' code does (temperature 0.6, top-p 0.9)
    inside a greedy request; the request's seed makes them reproducible."""
    paper = make_ensemble("specem", preset="paper")
    summary = paper.summary()
    assert (summary["draft_temperature"], summary["draft_top_p"]) == (0.6, 0.9)
    assert summary["schedule"] == "rounds"
    assert make_ensemble("specem", preset="paper", schedule="updates").summary()["schedule"] == (
        "updates"
    )
    problem = make_problems(1, seed=7, form="cot")[0]

    def drafts(seed=None, ens=paper):
        out = ens.generate(problem.messages, max_new_tokens=80, seed=seed)
        return out.text, [e.candidates for e in _events(out, SegmentCandidates)]

    first = drafts(seed=1)
    assert drafts(seed=1) == first
    others = [drafts(seed=s) for s in (2, 3, 4)]
    assert any(o[1] != first[1] for o in others)  # other seeds, other samples
    greedy = drafts(ens=make_ensemble("specem"))
    assert greedy == drafts(ens=make_ensemble("specem"))
    assert any(o[1] != greedy[1] for o in [first, *others])  # sampled, not greedy, drafts


@pytest.mark.parametrize("members", [[0, 1], [0, 1, 2]], ids=["2", "3"])
def test_shipped_models_answer_and_stop(make_ensemble, members):
    ens = make_ensemble("specem", members)
    best = make_ensemble("single", members)  # the first member is the best model
    problems = make_problems(6, seed=7, form="cot")
    right = alone = 0
    for problem in problems:
        out = ens.generate(problem.messages, max_new_tokens=80)
        assert out.finish_reason == "stop"  # a winning candidate ended the turn
        assert out.text == "".join(e.text for e in _events(out, SegmentSelected))
        right += check_answer(out.text, problem)
        alone += check_answer(best.generate(problem.messages, max_new_tokens=80).text, problem)
    assert right >= max(alone - 1, 3)  # the 200-problem run: 86.5% vs 76.5% for the best


def test_shipped_verify_in_line_equals_separate_scoring(make_ensemble):
    problem = make_problems(1, seed=7, form="cot")[0]
    outs = []
    for block in (True, False):
        ens = make_ensemble("specem")
        for m in ens.members:
            m.takes_block_mask = block
        try:
            outs.append(ens.generate(problem.messages, max_new_tokens=60))
        finally:
            for m in ens.members:
                m.takes_block_mask = True
    assert outs[0].text == outs[1].text
    pairs = zip(_events(outs[0], SegmentSelected), _events(outs[1], SegmentSelected), strict=True)
    for a, b in pairs:
        assert torch.allclose(_matrix(a), _matrix(b), atol=1e-4)


@pytest.mark.parametrize("segment_tokens", [32, 3])
def test_score_pmi_counts_what_the_request_makes_likely(tiny_members, segment_tokens):
    """ "fluent" says " 12." whatever it is asked; "reader" says " 13." after this request and
    " 12." after an empty turn. By log-probs the fluent member's sureness wins; by score="pmi"
    the reader's request-driven " 13." does, whether the segments are whole answers or the
    differing words come after committed ones (read after the empty turn too)."""
    from scripted import fluent_and_reader

    twelve, thirteen = "The answer is 12.", "The answer is 13."
    fluent, reader = fluent_and_reader(tiny_members[0])
    prompt = [{"role": "user", "content": "How many apples?"}]
    options = {"segment_tokens": segment_tokens, "feedback": False}
    plain = Ensemble([fluent, reader], "specem", **options).generate(prompt, max_new_tokens=32)
    assert plain.text == twelve
    out = Ensemble([fluent, reader], "specem", score="pmi", **options).generate(
        prompt, max_new_tokens=32
    )
    assert out.text == thirteen
    selected = _events(out, SegmentSelected)
    verified = [e for e in selected if any(v != 1.0 for v in e.scores["fluent"].values())]
    assert [e.winner for e in verified] == ["reader"]
    assert verified[0].scores["fluent"]["fluent"] == pytest.approx(0.5, abs=1e-6)
    assert verified[0].scores["reader"]["reader"] > 0.5
    if segment_tokens == 3:  # the vote came after committed words both members agreed on
        assert not thirteen.startswith(verified[0].text)


def test_score_pmi_on_a_raw_prompt_needs_a_token_to_start_from(tiny_members):
    ensemble = Ensemble(tiny_members[:2], "specem", score="pmi")
    with pytest.raises(InvalidConfigError, match="specem's score='pmi'.*raw_prompt=False"):
        ensemble.generate("Q: 2 + 3 =", max_new_tokens=8, raw_prompt=True)


def test_a_winning_stop_ends_the_request(tiny_members):
    ens = Ensemble(tiny_members, "specem")
    for seed in range(1, 40):  # random weights: find a request where a stop wins
        seen = []
        config = GenerationConfig(max_new_tokens=60, temperature=1.0, seed=seed)
        out = ens.generate(PROMPT, config, on_event=seen.append)
        if out.finish_reason == "stop":
            break
    assert out.finish_reason == "stop" and out.stats.tokens < 60
    last = [e for e in seen if isinstance(e, SegmentSelected)][-1]
    assert out.text.endswith(last.text)  # nothing after the segment that ended the turn


def test_a_full_context_window_ends_with_length(tmp_path):
    from core import HFMember
    from core.testbed import MODEL_ORDER, random_model

    members = [
        HFMember.load(random_model(name, tmp_path / name, seed=i, max_positions=40), device="cpu")
        for i, name in enumerate(MODEL_ORDER[:2])
    ]
    for m in members:
        m.stop_ids = frozenset()  # never stop: run into the window
    out = Ensemble(members, "specem").generate(PROMPT, SAMPLED, max_new_tokens=100)
    assert out.finish_reason == "length" and 0 < out.stats.tokens < 40
