"""`Ensemble.calibrate` through the public API: member trust measured without labels (each
member answers, the others judge), frozen afterwards, a member no other member prefers left out
of every request, the same weights every time, kept by save/load, bad inputs refused at the
call."""

from __future__ import annotations

import threading

import pytest
from scripted import Scripted

from core import ContextWindowError, Ensemble, InvalidConfigError
from core.calibration import CALIBRATION_PROMPTS

TEXT = "Sara starts with 6 buttons. 6 - 1 = 5. The answer is 5."
PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]


@pytest.fixture
def trio(tiny_members):
    """Two members that spell TEXT (one unsure) and one that always says "Tom"."""
    return [
        Scripted(tiny_members[0], [TEXT], "right"),
        Scripted(tiny_members[2], [TEXT], "twin", sure=0.5),
        Scripted(tiny_members[1], [], "wrong", off="Tom"),
    ]


def test_a_member_no_other_prefers_is_left_out_and_the_weights_stay(trio):
    ens = Ensemble(trio, "safe", learn_weights=True)
    weights = ens.calibrate([PROMPT, "How many buttons?"], max_new_tokens=24)
    assert weights == ens.member_weights and sum(weights.values()) == pytest.approx(1.0)
    assert weights["wrong"] < ens.trust.floor / 3 < min(weights["right"], weights["twin"])
    assert ens.learn_weights is False  # frozen: each request's text depends on it alone
    out = ens.generate(PROMPT, max_new_tokens=64)
    assert set(out.stats.prompt_tokens) == {"right", "twin"}  # "wrong" is not run at all
    assert out.text == TEXT
    assert ens.member_weights == weights
    again = Ensemble(trio, "safe").calibrate([PROMPT, "How many buttons?"], max_new_tokens=24)
    assert again == weights


def test_calibrated_weights_are_saved_and_loaded(trio, tmp_path):
    ens = Ensemble(trio, "specem")
    weights = ens.calibrate([PROMPT], max_new_tokens=24)
    path = ens.save_weights(tmp_path / "trust.json")
    fresh = Ensemble(trio, "specem")
    fresh.load_weights(path)
    assert fresh.member_weights == pytest.approx(weights)
    texts = [e.generate(PROMPT, max_new_tokens=32).text for e in (fresh, ens)]
    assert texts[0] == texts[1]


def test_the_built_in_prompts_are_used_by_default(tiny_members):
    ens = Ensemble(tiny_members[:2], "rerank")
    weights = ens.calibrate(max_new_tokens=4)
    assert len(CALIBRATION_PROMPTS) >= 8
    assert set(weights) == {m.name for m in tiny_members[:2]}
    assert all(w > 0 for w in weights.values()) and sum(weights.values()) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "prompts, options, needle",
    [
        ([], {}, "non-empty list"),
        ("What is 2 + 3?", {}, "non-empty list"),
        ([PROMPT], {"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_calibration_inputs_fail_at_the_call(trio, prompts, options, needle):
    ens = Ensemble(trio, "safe")
    with pytest.raises(InvalidConfigError, match=needle):
        ens.calibrate(prompts, **options)
    assert ens.member_weights == {"right": 1 / 3, "twin": 1 / 3, "wrong": 1 / 3}


def test_the_prompts_run_as_concurrent_requests_and_measure_what_one_at_a_time_measures(
    tiny_members,
):
    alone = Ensemble(tiny_members, "specem", max_concurrency=1)
    expected = alone.calibrate(max_new_tokens=16)
    ens = Ensemble(tiny_members, "specem", max_concurrency=8)
    seen: list[bool] = []
    watcher = threading.Thread(
        target=lambda: seen.append(ens.admission.wait_until(lambda: ens.admission.running >= 2, 60))
    )
    watcher.start()
    weights = ens.calibrate(max_new_tokens=16)
    watcher.join()
    assert seen == [True]  # several prompts held request slots at once
    assert ens.admission.running == 0  # every slot given back
    assert weights == pytest.approx(expected, abs=1e-9)
    margins = ens.summary()["self_preference"]["margins"]
    assert margins == pytest.approx(alone.summary()["self_preference"]["margins"], rel=1e-5)


def test_a_prompt_that_cannot_run_fails_the_calibration_and_changes_nothing(tiny_members):
    ens = Ensemble(tiny_members[:2], "rerank", max_concurrency=4)
    before = ens.member_weights, ens.summary()["self_preference"]  # rerank's built-in one
    too_long = "seven " * 5000
    with pytest.raises(ContextWindowError, match="shorten the messages"):
        ens.calibrate(["What is 2 + 3?", too_long, "Name a prime number."], max_new_tokens=8)
    assert (ens.member_weights, ens.summary()["self_preference"]) == before
    assert before[1] is not None
    assert ens.admission.running == 0
    assert ens.generate("What is 2 + 3?", max_new_tokens=8).text  # the ensemble still answers


def test_one_member_cannot_be_calibrated(tiny_members):
    with pytest.raises(InvalidConfigError, match="one member"):
        Ensemble(tiny_members[:1], "single").calibrate([PROMPT])
