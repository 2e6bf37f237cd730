"""Rerank through the public API: every member answers, every member scores every answer, and
the answer with the highest vote is streamed, exactly as the member that wrote it wrote it."""

from __future__ import annotations

import pytest

from core import GenerationConfig, InvalidConfigError
from core.events import SegmentCandidates, SegmentSelected
from core.testbed import make_problems

CONFIG = GenerationConfig(max_new_tokens=64)


def _problems(n: int = 12):
    return make_problems(n, seed=4, form="cot")


def test_the_chosen_answer_is_its_authors_own_text_streamed_in_pieces(make_ensemble):
    ensemble = make_ensemble("rerank", learn_weights=False)  # every member answers every time
    singles = [make_ensemble("single", [i]) for i in range(3)]
    disagreed = 0
    for problem in _problems():
        deltas = list(ensemble.stream(problem.messages, CONFIG))
        text = "".join(d.text for d in deltas)
        events = [e for d in deltas for e in d.events]
        drafted = next(e for e in events if isinstance(e, SegmentCandidates)).candidates
        chosen = next(e for e in events if isinstance(e, SegmentSelected))
        alone = {s.members[0].name: s.generate(problem.messages, CONFIG) for s in singles}
        # every member's answer is what it writes alone, and the output is the winner's
        assert drafted == {name: out.text for name, out in alone.items()}
        assert text == chosen.text == alone[chosen.winner].text
        stats = deltas[-1].stats
        assert stats.tokens == alone[chosen.winner].stats.tokens
        assert deltas[-1].finish_reason == "stop"
        if len(set(drafted.values())) > 1:  # voted on: one verify-in-line pass per member
            disagreed += 1
            assert stats.ensembled_rounds == 1 and len(chosen.scores) == 3
            assert stats.ensembled_tokens == stats.tokens  # the vote chose every token
            for row in chosen.scores.values():  # each member's vote over the answers sums to 1
                shares = {drafted[author]: share for author, share in row.items()}
                assert sum(shares.values()) == pytest.approx(1.0)
            assert len([d for d in deltas if d.text]) > 3  # streamed, not one block
        else:
            assert stats.ensembled_rounds == stats.ensembled_tokens == 0
            assert stats.counts.get("consensus") == 1
    assert disagreed  # the shipped members disagree on some of these problems


def test_the_vote_picks_the_answer_with_the_highest_total(make_ensemble):
    ensemble = make_ensemble("rerank")
    for problem in _problems(8):
        out = ensemble.generate(problem.messages, CONFIG)
        chosen = next(e for e in out.events if isinstance(e, SegmentSelected))
        totals: dict[str, float] = {}
        for verifier, row in chosen.scores.items():
            for author, share in row.items():
                totals[author] = totals.get(author, 0.0) + chosen.weights[verifier] * share
        assert totals[chosen.winner] == pytest.approx(max(totals.values()))


def test_answers_follow_a_grammar_and_forced_text_is_not_repeated(make_ensemble):
    ensemble = make_ensemble("rerank")
    problem = make_problems(6, seed=4, form="tool")
    problem = next(p for p in problem if p.expected_call is not None)
    out = ensemble.generate(
        problem.messages, tools=problem.tools, tool_choice="required", max_new_tokens=96
    )
    assert out.finish_reason == "tool_calls" and len(out.tool_calls) == 1
    assert out.tool_calls[0].name in {t["function"]["name"] for t in problem.tools}


def test_bad_options_fail_at_the_call(make_ensemble):
    with pytest.raises(InvalidConfigError, match="score"):
        make_ensemble("rerank", score="vote")
    with pytest.raises(InvalidConfigError, match="at least 2"):
        make_ensemble("rerank", [0])


def test_score_min_counts_an_answer_as_its_least_likely_token(tiny_members):
    """Two members differ on the number and one also says more after it: the mean over the
    tokens (as published) lets the sure words after "13" outvote its doubt; score="min" weighs
    each answer by its least likely token, so the number both members find likelier wins. The
    words both answers start with ("The answer is") are not scored."""
    from scripted import Scripted

    from core import Ensemble

    short, long = "The answer is 12.", "The answer is 13 apples in all."
    first = Scripted(tiny_members[0], [(short, 0.6), (long, 0.4)], "first")
    second = Scripted(tiny_members[0], [(long, 0.55), (short, 0.45)], "second")
    prompt = [{"role": "user", "content": "How many apples?"}]
    out = Ensemble([first, second], "rerank", score="min").generate(prompt, max_new_tokens=32)
    assert out.text == short
    chosen = next(e for e in out.events if isinstance(e, SegmentSelected))
    assert chosen.scores["first"]["first"] == pytest.approx(0.6, abs=1e-3)
    assert chosen.scores["second"]["first"] == pytest.approx(0.45, abs=1e-3)
    published = Ensemble([first, second], "rerank", self_preference="off")  # judges as they are
    assert published.generate(prompt, max_new_tokens=32).text == long


def test_score_pmi_counts_what_the_request_makes_likely(tiny_members):
    """ "fluent" says " 12." whatever it is asked (0.9 after the request and after none);
    "reader" says " 13." after this request (0.6) and " 12." after none (0.9). By log-probs
    the fluent member's sureness wins; by score="pmi" the fluent member gains nothing from the
    request on either answer (its vote is even) and the reader's request-driven " 13." wins."""
    from scripted import fluent_and_reader

    from core import Ensemble

    twelve, thirteen = "The answer is 12.", "The answer is 13."
    fluent, reader = fluent_and_reader(tiny_members[0])
    prompt = [{"role": "user", "content": "How many apples?"}]
    published = Ensemble([fluent, reader], "rerank", self_preference="off")  # judges as they are
    assert published.generate(prompt, max_new_tokens=32).text == twelve
    out = Ensemble([fluent, reader], "rerank", score="pmi").generate(prompt, max_new_tokens=32)
    assert out.text == thirteen
    chosen = next(e for e in out.events if isinstance(e, SegmentSelected))
    assert chosen.winner == "reader"
    assert chosen.scores["fluent"]["fluent"] == pytest.approx(0.5, abs=1e-6)
    assert chosen.scores["reader"]["reader"] > 0.5


def test_score_pmi_on_a_raw_prompt_needs_a_token_to_start_from(tiny_members, make_ensemble):
    """An empty raw prompt is no token at all for a tokenizer without a BOS: the request is
    refused at the call, naming the member and the fix; with messages it runs."""
    from core import Ensemble

    ensemble = Ensemble(tiny_members[:2], "rerank", score="pmi")
    with pytest.raises(InvalidConfigError, match="tb-gpt2-bpe.*raw_prompt=False"):
        ensemble.generate("Q: 2 + 3 =", max_new_tokens=8, raw_prompt=True)
    problem = _problems(1)[0]
    out = make_ensemble("rerank", score="pmi").generate(problem.messages, CONFIG)
    chosen = next(e for e in out.events if isinstance(e, SegmentSelected))
    assert out.text == chosen.text and chosen.scores


def test_finished_first_votes_only_among_the_answers_that_ended(tiny_members):
    """ "looper" repeats a line past the token limit and finds it likely; "finisher" answers in
    a few tokens. Spread over a long answer, the loop's one unlikely first token costs little,
    so both judges' mean log-probs prefer it; `finished_first` sets the cut answer aside while
    another ended, and votes as usual when every answer was cut."""
    from scripted import Scripted

    from core import Ensemble

    loop, done = "Answer: 33\n" * 12, "33 / 3 = 11."
    looper = Scripted(tiny_members[0], [(loop, 0.9), (done, 0.1)], "looper")
    finisher = Scripted(tiny_members[0], [(done, 0.55), (loop, 0.45)], "finisher")
    prompt = [{"role": "user", "content": "What is 33 / 3?"}]

    def answer(max_new_tokens, **options):
        ens = Ensemble([looper, finisher], "rerank", self_preference="off", **options)
        return ens.generate(prompt, max_new_tokens=max_new_tokens)

    plain = answer(16, finished_first=False)
    assert plain.text.startswith("Answer: 33\nAnswer: 33") and plain.finish_reason == "length"
    finished = answer(16)  # the default
    assert finished.text == done and finished.finish_reason == "stop"
    assert finished.stats.counts["cut answers set aside"] == 1
    assert finished.stats.ensembled_tokens == finished.stats.tokens  # the ensemble chose it
    both_cut = answer(3)  # neither ended: the vote is over both
    assert both_cut.text == answer(3, finished_first=False).text
    assert "cut answers set aside" not in both_cut.stats.counts
    with pytest.raises(InvalidConfigError, match="finished_first must be True or False"):
        answer(3, finished_first="yes")
