"""Calibrated self-preference through the public API: a member that is merely surer of its own
answers stops winning SpecEM's and rerank's votes once `calibrate` (or the ensemble's
`self_preference="builtin"` option, when it is built) has measured how far it usually sets its
own text apart from the others'; the correction is frozen, saved and loaded with the weights,
cleared by a reset, and a bad file is refused with nothing changed."""

from __future__ import annotations

import json

import pytest
from scripted import Scripted

from core import Ensemble, InvalidConfigError

SURE, MODEST = "The answer is 12.", "The answer is 13."
QUESTION = [{"role": "user", "content": "What is 7 + 6?"}]
CALIBRATION = ["What is 2 + 2?", "What is 9 - 4?", "Name a prime number."]


@pytest.fixture
def pair(tiny_members):
    """ "sure" answers SURE and scores it far above MODEST on the calibration prompts (0.97 to
    0.03), less so on QUESTION (0.75 to 0.25); "modest" answers MODEST, 0.6 to 0.4, always.
    Uncalibrated, sure's wider margin wins the vote on QUESTION; measured against its usual
    margin, sure likes its own answer there less than it likes its own answers elsewhere."""
    sure = Scripted(tiny_members[0], [(SURE, 0.97), (MODEST, 0.03)], "sure")
    sure.answer_after(QUESTION, [(SURE, 0.75), (MODEST, 0.25)])
    modest = Scripted(tiny_members[1], [(MODEST, 0.6), (SURE, 0.4)], "modest")
    return [sure, modest]


@pytest.mark.parametrize("method", ["rerank", "specem"])
def test_calibrated_self_preference_moves_the_vote_to_the_modest_member(pair, method):
    ens = Ensemble(pair, method, self_preference="off")
    assert ens.generate(QUESTION, max_new_tokens=16).text == SURE
    weights = ens.calibrate(CALIBRATION, max_new_tokens=16)
    preference = ens.summary()["self_preference"]
    assert preference["score"] == "logprob"
    assert preference["margins"]["sure"] > preference["margins"]["modest"] > 0
    assert weights == {"sure": 0.5, "modest": 0.5}  # neither prefers the other's answers
    out = ens.generate(QUESTION, max_new_tokens=16)
    assert out.text == MODEST
    assert [e.winner for e in out.events if type(e).__name__ == "SegmentSelected"] == ["modest"]
    ens.reset_weights()  # equal weights, no correction: the vote as published
    assert ens.summary()["self_preference"] is None
    assert ens.generate(QUESTION, max_new_tokens=16).text == SURE


@pytest.mark.parametrize("method", ["rerank", "specem"])
def test_a_builtin_self_preference_is_measured_when_the_ensemble_is_built(pair, method):
    off = Ensemble(pair, method, self_preference="off")
    assert off.generate(QUESTION, max_new_tokens=16).text == SURE
    ens = Ensemble(pair, method, self_preference="builtin")
    preference = ens.summary()["self_preference"]
    assert preference["margins"]["sure"] > preference["margins"]["modest"] > 0
    assert ens.member_weights == {"sure": 0.5, "modest": 0.5} and ens.learn_weights is False
    assert ens.generate(QUESTION, max_new_tokens=16).text == MODEST
    ens.reset_weights()  # back to the ensemble as built: still evened out
    assert ens.summary()["self_preference"] == preference
    assert ens.generate(QUESTION, max_new_tokens=16).text == MODEST


def test_rerank_evens_out_self_preference_by_default_and_specem_does_not(pair):
    builtin = Ensemble(pair, "rerank", self_preference="builtin").summary()["self_preference"]
    rerank = Ensemble(pair, "rerank")  # self_preference="auto": rerank's own default
    assert rerank.summary()["self_preference"] == builtin
    assert rerank.generate(QUESTION, max_new_tokens=16).text == MODEST
    specem = Ensemble(pair, "specem")
    assert specem.summary()["self_preference"] is None
    assert specem.generate(QUESTION, max_new_tokens=16).text == SURE
    by_least_likely = Ensemble(pair, "rerank", score="min")  # measured for "logprob" only
    assert by_least_likely.summary()["self_preference"] is None


def test_a_builtin_self_preference_is_not_measured_where_nothing_votes(pair):
    ens = Ensemble(pair, "safe", self_preference="builtin")
    assert ens.summary()["self_preference"] is None
    with pytest.raises(InvalidConfigError, match="'auto'.*'off'.*'builtin'"):
        Ensemble(pair, "rerank", self_preference="always")


def test_self_preference_is_measured_in_the_vote_score(pair):
    ens = Ensemble(pair, "rerank", score="min")
    ens.calibrate(CALIBRATION, max_new_tokens=16)
    assert ens.summary()["self_preference"]["score"] == "min"
    assert ens.generate(QUESTION, max_new_tokens=16).text == MODEST
    safe = Ensemble(pair, "safe")  # SAFE does not vote over its members' answers
    safe.calibrate(CALIBRATION, max_new_tokens=16)
    assert safe.summary()["self_preference"] is None


def test_self_preference_is_saved_and_loaded_with_the_weights(pair, tmp_path):
    ens = Ensemble(pair, "rerank")
    ens.calibrate(CALIBRATION, max_new_tokens=16)
    path = ens.save_weights(tmp_path / "trust.json")
    saved = json.loads(path.read_text())
    assert saved["self_preference"] == ens.summary()["self_preference"]
    fresh = Ensemble(pair, "rerank")
    fresh.load_weights(path)
    assert fresh.summary()["self_preference"] == ens.summary()["self_preference"]
    assert fresh.generate(QUESTION, max_new_tokens=16).text == MODEST


@pytest.mark.parametrize(
    "preference, needle",
    [
        ({"score": "prob", "margins": {"sure": 1.0, "modest": 1.0}}, "score is 'prob'"),
        ({"score": "logprob", "margins": {"sure": 1.0, "someone": 1.0}}, "unknown \\['someone'\\]"),
        ({"score": "logprob", "margins": {"sure": 1.0}}, "1 self_preference margins for 2"),
        ({"score": "logprob", "margins": {"sure": "high", "modest": 1.0}}, "not a number"),
        ({"score": "logprob", "margins": {"sure": 0.0, "modest": 1.0}}, "finite and above 0"),
        ({"score": "logprob"}, "expected"),
    ],
)
def test_a_bad_self_preference_in_a_weights_file_is_refused(pair, tmp_path, preference, needle):
    path = tmp_path / "trust.json"
    weights = {"sure": 0.5, "modest": 0.5}
    path.write_text(json.dumps({"weights": weights, "self_preference": preference}))
    ens = Ensemble(pair, "rerank")
    ens.calibrate(CALIBRATION, max_new_tokens=16)
    before = ens.summary()["self_preference"]
    with pytest.raises(InvalidConfigError, match=needle):
        ens.load_weights(path)
    assert ens.summary()["self_preference"] == before


@pytest.mark.parametrize("method", ["rerank", "specem"])
def test_calibrated_texts_are_the_same_concurrent_or_one_at_a_time(pair, method):
    from concurrent.futures import ThreadPoolExecutor

    ens = Ensemble(pair, method)
    ens.calibrate(CALIBRATION, max_new_tokens=16)
    prompts = [QUESTION, *([{"role": "user", "content": p}] for p in CALIBRATION)] * 2
    alone = [ens.generate(p, max_new_tokens=16).text for p in prompts]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda p: ens.generate(p, max_new_tokens=16).text, prompts))
    assert together == alone and alone[0] == MODEST  # frozen: no request moves another's vote
    assert ens.summary()["self_preference"]["margins"]["sure"] > 0
