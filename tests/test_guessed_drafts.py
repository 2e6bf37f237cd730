"""A greedy draft given a guess (another member's draft of the same continuation) is the draft
the member writes without one, in fewer forward passes where it agrees with the guess; SpecEM,
whose members draft one after another on one device, writes the same texts with fewer
passes."""

from __future__ import annotations

import pytest
import torch

from core import Ensemble
from core.config import GenerationConfig
from core.member import Member
from core.sampling import Sampler
from core.testbed import make_problems

PROBLEMS = make_problems(4, seed=13)
GREEDY = GenerationConfig()


def _view(member: Member, messages, text: str = "") -> Member:
    view = member.spawn()
    view.start(messages)
    view.sync(text)
    return view


@pytest.mark.parametrize("family", [1, 2], ids=["spm", "word"])
def test_a_guessed_draft_is_the_plain_draft_in_fewer_passes(shipped_members, family):
    saved = 0
    for problem in PROBLEMS:
        leader = _view(shipped_members[0], problem.messages)
        leader.draft(12, Sampler(GREEDY))
        guess = leader.text

        plain = _view(shipped_members[family], problem.messages)
        alone = plain.draft(12, Sampler(GREEDY))
        guessed = _view(shipped_members[family], problem.messages)
        helped = guessed.draft(12, Sampler(GREEDY), guess=guess)

        assert (helped.ids, helped.stopped, guessed.text) == (alone.ids, alone.stopped, plain.text)
        assert torch.allclose(helped.logprobs, alone.logprobs, atol=1e-4)
        assert guessed.calls <= plain.calls
        saved += plain.calls - guessed.calls
    assert saved > 0  # the members agree on some stretches of these answers


@pytest.mark.parametrize("family", [1, 2], ids=["spm", "word"])
def test_a_guess_longer_than_the_draft_is_scored_later_without_a_pass(shipped_members, family):
    """A guess that is more of this member's tokens than its draft may take is still read
    whole: a later score of it (SpecEM verifying the leader's segment) costs no pass, and gives
    what a fresh view's pass gives."""
    for problem in PROBLEMS:
        leader = _view(shipped_members[0], problem.messages)
        leader.draft(12, Sampler(GREEDY))
        guess = leader.text
        reader = _view(shipped_members[family], problem.messages)
        reader.draft(3, Sampler(GREEDY), guess=guess)  # fewer tokens than the guess holds
        before = reader.calls
        scores = reader.score([guess], base="")
        assert reader.calls == before
        fresh = _view(shipped_members[family], problem.messages).score([guess], base="")
        assert torch.allclose(scores[0], fresh[0], atol=1e-4)


@pytest.mark.parametrize("family", [0, 1, 2], ids=["bpe", "spm", "word"])
def test_a_stop_string_inside_a_guess_ends_the_draft_where_the_plain_draft_ends(
    shipped_members, family
):
    """A member that ends its turn with a stop string written as text (a base model's template,
    `Local(..., stop=[...])`) reads a guess too: the stop is found inside the guessed tokens
    where the step-by-step draft finds it."""
    saved = 0
    for problem in PROBLEMS:
        free = _view(shipped_members[family], problem.messages)
        free.draft(12, Sampler(GREEDY))
        written = free.text
        stop = " " + written.split()[2]  # a word it writes, so its draft ends there

        plain = _view(shipped_members[family], problem.messages)
        plain.stop_strings = plain.stop_texts = (stop,)
        alone = plain.draft(12, Sampler(GREEDY))
        guessed = _view(shipped_members[family], problem.messages)
        guessed.stop_strings = guessed.stop_texts = (stop,)
        helped = guessed.draft(12, Sampler(GREEDY), guess=written)

        assert alone.stopped
        assert (helped.ids, helped.stopped, guessed.text) == (alone.ids, alone.stopped, plain.text)
        assert torch.allclose(helped.logprobs, alone.logprobs, atol=1e-4)
        assert guessed.calls <= plain.calls
        saved += plain.calls - guessed.calls
    assert saved > 0


def test_a_guess_the_member_rejects_at_once_or_cannot_read_changes_nothing(shipped_members):
    messages = PROBLEMS[0].messages
    plain = _view(shipped_members[1], messages, "Sara")
    alone = plain.draft(6, Sampler(GREEDY))
    for guess in (" zebra zebra zebra", "h"):  # never its words; would re-spell "Sara"
        guessed = _view(shipped_members[1], messages, "Sara")
        helped = guessed.draft(6, Sampler(GREEDY), guess=guess)
        assert (helped.ids, helped.stopped, guessed.text) == (alone.ids, alone.stopped, plain.text)


def test_a_sampled_draft_reads_no_guess(shipped_members):
    messages = PROBLEMS[1].messages
    sampling = GenerationConfig(temperature=0.8, seed=5)
    leader = _view(shipped_members[0], messages)
    leader.draft(8, Sampler(GREEDY))
    plain = _view(shipped_members[2], messages)
    alone = plain.draft(8, Sampler(sampling))
    guessed = _view(shipped_members[2], messages)
    helped = guessed.draft(8, Sampler(sampling), guess=leader.text)
    assert helped.ids == alone.ids and guessed.calls == plain.calls


def _texts_and_passes(monkeypatch, ens: Ensemble, guess: bool) -> tuple[list[str], int]:
    """Each problem's text and the forward passes its members made (`Member.calls`)."""
    texts, passes = [], 0
    with monkeypatch.context() as patch:
        if not guess:
            draft = Member.draft
            patch.setattr(
                Member, "draft", lambda self, n, sampler, guess="": draft(self, n, sampler)
            )
        for problem in PROBLEMS:
            stream = ens.stream(problem.messages, GenerationConfig(max_new_tokens=48))
            texts.append("".join(delta.text for delta in stream))
            passes += sum(member.calls for member in stream.members)
    return texts, passes


def test_specem_drafters_in_turn_write_the_same_texts_with_fewer_passes(monkeypatch, make_ensemble):
    ens = make_ensemble("specem")
    without, passes_without = _texts_and_passes(monkeypatch, ens, guess=False)
    texts, passes = _texts_and_passes(monkeypatch, ens, guess=True)
    assert texts == without
    assert passes < passes_without


def test_rerank_reads_guesses_only_while_no_other_request_runs(monkeypatch, make_ensemble):
    """Rerank's members read the first member's whole answer as a guess when the request runs
    alone (the same texts, fewer passes), and draft without one while another request runs
    (a guess's pass over a whole answer would not batch with its one-token steps)."""
    ens = make_ensemble("rerank", max_concurrency=2)
    without, passes_without = _texts_and_passes(monkeypatch, ens, guess=False)
    texts, passes = _texts_and_passes(monkeypatch, ens, guess=True)
    assert texts == without
    assert passes < passes_without
    with ens.admission.slot():  # another request runs
        busy, passes_busy = _texts_and_passes(monkeypatch, ens, guess=True)
    assert busy == without
    assert passes_busy == passes_without
