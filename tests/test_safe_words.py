"""SAFE's `decide="word"` (the default) through the public API: an ensemble point decides the
whole word it falls in, from the word's start, by every member's probability of every member's
word; one member cannot veto a word the others back; the stats still add up and every verifier
stays canonical."""

from __future__ import annotations

import pytest
from scripted import Scripted

from core import Ensemble, GenerationConfig
from core.events import EnsemblePoint, SkipConsensus
from core.methods.safe import EXTRA_TOKENS, SKIP_REASONS

PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]
TEXT = "Sara starts with 6 buttons. 6 - 1 = 5. The answer is 5."


def _adds_up(out) -> None:
    s = out.stats
    skips = sum(s.counts.get(k, 0) for k in SKIP_REASONS)
    assert s.tokens == s.ensembled_tokens + skips + s.counts.get(EXTRA_TOKENS, 0)
    assert s.ensembled_tokens == sum(isinstance(e, EnsemblePoint) for e in out.events)


def _points(out) -> list[tuple[str, str]]:
    return [(e.drafted, e.chosen) for e in out.events if isinstance(e, EnsemblePoint)]


def test_the_default_decides_words_and_the_paper_tokens(tiny_members):
    assert Ensemble(tiny_members[:2], "safe").summary()["decide"] == "word"
    assert Ensemble(tiny_members[:2], "safe", preset="paper").summary()["decide"] == "token"


def test_an_ensemble_point_decides_the_whole_word(tiny_members):
    """bpe drafts " 13" (one token) and is unsure; spm, sure of " 12", disagrees: the point
    decides the word with its punctuation, " 13." against " 12.", and spm's wins; every
    verifier reads the committed text in its own canonical tokens."""
    wrong, right = "The answer is 13.", "The answer is 12."
    drafter = Scripted(tiny_members[0], [(wrong, 0.6), (right, 0.4)], "bpe-draft")
    verifier = Scripted(tiny_members[1], [right], "spm-verify")
    ens = Ensemble([drafter, verifier], "safe")
    text, stream = "", ens.stream(PROMPT, GenerationConfig(max_new_tokens=32))
    for delta in stream:
        text += delta.text
        view = stream.members[1]
        assert view.text == text and view.ids == view.canonical_ids(text)
    out = ens.generate(PROMPT, max_new_tokens=32)
    assert out.text == text == right
    assert _points(out) == [(" 13.", " 12.")]
    point = next(e for e in out.events if isinstance(e, EnsemblePoint))
    assert point.top[0][0] == " 12." and point.top[0][1] > 0.5
    _adds_up(out)


def test_the_word_is_decided_from_its_start(tiny_members):
    """The drafter writes " 23" as " 2" "3" (bpe: whole numbers up to 20); the members agree
    on " 2" and part at "3": the point goes back to where the word starts, withdraws the skip
    it had counted there, and decides " 23." against " 2.", not "3" against "."."""
    wrong, right = "The answer is 23.", "The answer is 2."
    drafter = Scripted(tiny_members[0], [(wrong, 0.55), (right, 0.45)], "bpe-draft")
    verifier = Scripted(tiny_members[1], [right], "spm-verify")
    out = Ensemble([drafter, verifier], "safe").generate(PROMPT, max_new_tokens=32)
    assert out.text == right
    assert _points(out) == [(" 23.", " 2.")]
    point = next(e for e in out.events if isinstance(e, EnsemblePoint))
    skipped = {e.position for e in out.events if isinstance(e, SkipConsensus)}
    assert point.position not in skipped  # the word's first token is the point's, not a skip
    assert skipped == set(range(point.position))  # "The answer is" agreed
    _adds_up(out)


def test_one_member_cannot_veto_a_word_the_others_back(tiny_members):
    """Two members back TEXT's " 5." (0.65; 0.05 for " 4.", 0.3 for " 3."); a third is sure
    of " 4." and gives " 5." no probability. The mixture of the members' word probabilities
    keeps " 5." (0.43 against 0.37); a geometric mean would let the third veto it."""
    wrong = "Sara starts with 6 buttons. 6 - 1 = 4. The answer is 4."
    other = "Sara starts with 6 buttons. 6 - 1 = 3. The answer is 3."
    scripts = [(TEXT, 0.65), (wrong, 0.05), (other, 0.3)]
    backing = [Scripted(tiny_members[0], scripts, n) for n in ("a", "b")]
    sure = Scripted(tiny_members[1], [wrong], "sure")
    out = Ensemble([*backing, sure], "safe").generate(PROMPT, max_new_tokens=64)
    assert out.text == TEXT
    assert (" 5.", " 5.") in _points(out)
    point = next(e for e in out.events if isinstance(e, EnsemblePoint) and e.chosen == " 5.")
    assert dict(point.top)[" 5."] > dict(point.top)[" 4."]
    _adds_up(out)


@pytest.mark.parametrize("decide", ["word", "token"])
def test_sampled_words_are_reproducible_with_a_seed(tiny_members, decide):
    ens = Ensemble(tiny_members, "safe", decide=decide)
    config = GenerationConfig(max_new_tokens=20, temperature=1.0, seed=11)
    a, b = ens.generate(PROMPT, config), ens.generate(PROMPT, config)
    assert a.text == b.text and [e.to_dict() for e in a.events] == [e.to_dict() for e in b.events]
    _adds_up(a)


def test_the_end_of_the_turn_is_decided_as_a_word(tiny_members):
    """The drafter would end after "5." (0.6) or go on with " Done." (0.4); the verifier is
    sure of " Done.": the drafter's stop is an ensemble point decided as a word, the end of
    the turn (the empty word) against " Done.", and " Done." wins."""
    ended, longer = "The answer is 5.", "The answer is 5. Done."
    drafter = Scripted(tiny_members[0], [(ended, 0.6), (longer, 0.4)], "bpe-draft")
    verifier = Scripted(tiny_members[1], [longer], "spm-verify")
    out = Ensemble([drafter, verifier], "safe").generate(PROMPT, max_new_tokens=32)
    assert out.text == longer and out.finish_reason == "stop"
    assert _points(out) == [("", " Done.")]
    _adds_up(out)


def test_a_member_that_ends_its_turn_in_text_backs_the_drafters_stop(tiny_members):
    """The same verifier, given " Done." as the stop string its template ends a turn with
    (`Local(..., stop=[...])`): writing it is how it ends its turn, so it proposes the end
    too, and the turn ends after "5."."""
    ended, longer = "The answer is 5.", "The answer is 5. Done."
    drafter = Scripted(tiny_members[0], [(ended, 0.6), (longer, 0.4)], "bpe-draft")
    verifier = Scripted(tiny_members[1], [longer], "spm-verify")
    verifier.stop_strings = verifier.stop_texts = (" Done.",)
    out = Ensemble([drafter, verifier], "safe").generate(PROMPT, max_new_tokens=32)
    assert out.text == ended and out.finish_reason == "stop"
    assert _points(out) == [("", "")]
    _adds_up(out)
