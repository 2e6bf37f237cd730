"""Member trust through the public API: weights learned without labels from the ensemble's own
decisions, used by every method, kept across requests (also concurrent ones), saved and loaded
as JSON, a floor under which a member costs nothing until it is probed again, and equal weights
that change nothing."""

from __future__ import annotations

import json
import math
import threading

import pytest
import torch
from conftest import needs_trained
from scripted import Scripted

from core import Ensemble, InvalidConfigError
from core.events import TrustUpdated
from core.testbed import make_problems
from core.trust import MAX_ETA, MIN_WEIGHT, hedge

TEXT = "Sara starts with 6 buttons. 6 - 1 = 5. The answer is 5."
PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]
METHODS = ["token", "safe", "specem", "rerank"]
# "wrong" never ends its turn: rerank's default would set its cut answer aside instead of
# voting, and these tests are about what the votes teach
VOTING = {"rerank": {"finished_first": False}}


def _updates(out) -> list[TrustUpdated]:
    return [e for e in out.events if isinstance(e, TrustUpdated)]


@pytest.fixture
def trio(tiny_members):
    """Two members that spell TEXT (same tokenizer, so they draft the same segments; "twin" is
    unsure, so SAFE's members do not reach consensus and it ensembles) and one that always
    says "Tom", whatever was written: it never backs the committed text."""
    return [
        Scripted(tiny_members[0], [TEXT], "right"),
        Scripted(tiny_members[0], [TEXT], "twin", sure=0.4),
        Scripted(tiny_members[1], [], "wrong", off="Tom"),
    ]


@pytest.fixture
def quartet(tiny_members):
    """Three members that spell TEXT, unsure enough that SAFE never reaches consensus however
    the weights stand (it ensembles every aligned position), and one that always says "Tom",
    half sure of it (a member sure of a one-token word outvotes three members this unsure of a
    two-token word in SAFE's mixture of word probabilities: README, Limitations)."""
    return [
        *(Scripted(tiny_members[0], [TEXT], n, sure=0.45) for n in ("right", "twin", "third")),
        Scripted(tiny_members[1], [], "wrong", off="Tom", sure=0.5),
    ]


def _write(tmp_path, data, name="weights.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# --- learning ------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_weights_move_toward_the_members_that_back_the_committed_text(quartet, method):
    ens = Ensemble(quartet, method, learn_weights=True, weight_floor=0.0, **VOTING.get(method, {}))
    assert ens.member_weights == {"right": 0.25, "twin": 0.25, "third": 0.25, "wrong": 0.25}
    previous, total = 0.25, 0
    for _ in range(3):
        out = ens.generate(PROMPT, max_new_tokens=64)
        assert out.text == TEXT  # the two that agree carry every decision
        [learned] = _updates(out)  # one update, as the request finished
        assert learned.decisions > 0 and learned.rewards["wrong"] == 0.0
        assert min(learned.rewards[n] for n in ("right", "twin", "third")) > 0
        assert out.events[-1] == learned
        weights = ens.member_weights
        assert weights == learned.weights and sum(weights.values()) == pytest.approx(1.0)
        assert weights["wrong"] < previous and weights["wrong"] < min(weights["right"], 0.5)
        previous = weights["wrong"]
        assert json.loads(json.dumps(learned.to_dict(), allow_nan=False))
        total += learned.decisions
    assert learned.updates == total == ens.trust.updates


@pytest.mark.parametrize("method", METHODS)
def test_frozen_weights_do_not_move_and_each_request_stands_alone(trio, method):
    ens = Ensemble(trio, method, learn_weights=False, **VOTING.get(method, {}))
    first = ens.generate(PROMPT, max_new_tokens=64)
    second = ens.generate(PROMPT, max_new_tokens=64)
    assert not _updates(first) and ens.member_weights == {n: 1 / 3 for n in ens.member_weights}
    assert (first.text, [e.to_dict() for e in first.events]) == (
        second.text,
        [e.to_dict() for e in second.events],
    )
    learning = Ensemble(trio, method, learn_weights=True, **VOTING.get(method, {}))
    learning.generate(PROMPT, max_new_tokens=64)
    moved = learning.member_weights
    learning.learn_weights = False  # freezing a learning ensemble keeps what it learned
    learning.generate(PROMPT, max_new_tokens=64)
    assert learning.member_weights == moved != ens.member_weights


def test_concurrent_requests_lose_no_update(trio):
    """Every request here commits the same text, so it reports the same decisions, whatever
    weights it started with. Eighteen requests on six threads must then leave the weights
    where eighteen one-at-a-time requests leave them. A lost or torn update would show in the
    count and in the weights."""

    def ensemble():
        return Ensemble(trio, "token", learn_weights=True, weight_floor=0.0, weight_lr=0.05)

    ens, outs, errors = ensemble(), [], []

    def ask():
        try:
            for _ in range(3):
                outs.append(ens.generate(PROMPT, max_new_tokens=64))
        except Exception as error:  # noqa: BLE001 (reported below)
            errors.append(error)

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(outs) == 18 and {o.text for o in outs} == {TEXT}
    updates = [u for out in outs for u in _updates(out)]
    per_request = updates[0].decisions
    assert len(updates) == 18 and {u.decisions for u in updates} == {per_request}
    assert sorted(u.updates for u in updates) == [per_request * k for k in range(1, 19)]
    assert ens.trust.updates == 18 * per_request
    one_at_a_time = ensemble()
    for _ in range(18):
        one_at_a_time.generate(PROMPT, max_new_tokens=64)
    assert ens.member_weights == pytest.approx(one_at_a_time.member_weights, rel=1e-9)


# --- the floor and the probes ----------------------------------------------------------------


@needs_trained
def test_a_member_under_the_floor_is_not_run_until_it_is_probed(shipped_members, tmp_path):
    """Forward passes of the weak member's model are counted by a hook on the model itself: a
    member under the floor runs none, except in the requests that probe it."""
    names = [m.name for m in shipped_members]
    path = _write(tmp_path, {"weights": dict(zip(names, [0.6, 0.35, 0.05], strict=True))})
    weak = shipped_members[2]
    passes = []
    hook = weak.model.register_forward_hook(lambda *_: passes.append(1))
    problem = make_problems(1, seed=3, form="cot")[0]
    try:
        for method in METHODS:
            ens = Ensemble(
                list(shipped_members), method, learn_weights=True, weight_floor=0.2, probe_every=3
            )
            ens.load_weights(path, freeze=False)  # learns on: probes run
            seen = []
            for _ in range(6):
                passes.clear()
                out = ens.generate(problem.messages, max_new_tokens=40)
                asked = weak.name in out.stats.prompt_tokens
                assert asked == (out.stats.counts.get("trust_probe", 0) == 1)
                assert asked or not passes  # a member left out runs no pass
                if method != "safe":  # SAFE runs a verifier only where the consensus needs it
                    assert asked == bool(passes)
                seen.append(asked)
            assert seen == [False, False, True, False, False, True], method
            frozen = Ensemble(list(shipped_members), method, weight_floor=0.2, probe_every=3)
            frozen.load_weights(path)  # frozen: no probe ever
            passes.clear()
            for _ in range(4):
                frozen.generate(problem.messages, max_new_tokens=40)
            assert not passes
    finally:
        hook.remove()


def test_a_probed_member_that_backs_the_text_climbs_back_over_the_floor(trio, tmp_path):
    """The floor is a share of an equal share (here 0.1 / 3). "right" starts under it and is
    not asked; at the probe it backs every decision while "wrong" backs none, and the share
    "wrong" loses brings "right" back over the floor: the next request asks it again."""
    path = _write(tmp_path, {"weights": {"right": 0.03, "twin": 0.8, "wrong": 0.17}})
    ens = Ensemble(
        trio, "token", learn_weights=True, weight_floor=0.1, probe_every=2, weight_lr=0.5
    )
    ens.load_weights(path, freeze=False)
    first = ens.generate(PROMPT, max_new_tokens=2)
    assert "right" not in first.stats.prompt_tokens and "right" not in first.stats.member_calls
    before = ens.member_weights["right"]
    assert before == 0.03 < 0.1 / 3  # a member not asked is not moved
    probe = ens.generate(PROMPT, max_new_tokens=64)
    assert probe.stats.member_calls["right"] > 0 and probe.stats.counts["trust_probe"] == 1
    assert ens.member_weights["right"] > 0.1 / 3
    assert "right" in ens.generate(PROMPT, max_new_tokens=64).stats.member_calls


# --- methods read the weights ------------------------------------------------------------------


@needs_trained
def test_the_most_trusted_member_drafts_unless_a_drafter_is_given(shipped_members, tmp_path):
    names = [m.name for m in shipped_members]
    path = _write(tmp_path, {"weights": dict(zip(names, [0.3, 0.45, 0.25], strict=True))})
    problem = make_problems(1, seed=3, form="cot")[0]
    ens = Ensemble(list(shipped_members), "safe")
    assert ens.summary()["drafter"] == names[0]  # equal weights: the first, as published
    ens.load_weights(path)
    assert ens.summary()["drafter"] == names[1] and ens.summary()["learn_weights"] is False
    out = ens.generate(problem.messages, max_new_tokens=40)
    assert list(out.stats.prompt_tokens)[0] == names[1]  # the drafter renders first
    assert {e.member for e in out.events if e.name == "draft"} == {names[1]}
    given = Ensemble(list(shipped_members), "safe", drafter=0)
    given.load_weights(path)
    out = given.generate(problem.messages, max_new_tokens=40)
    assert {e.member for e in out.events if e.name == "draft"} == {names[0]}


@needs_trained
def test_an_answer_names_the_drafter_it_used_when_trust_moves_meanwhile(shipped_members, tmp_path):
    from core.integration import ResponseRecord

    names = [m.name for m in shipped_members]
    path = _write(tmp_path, {"weights": dict(zip(names, [0.3, 0.45, 0.25], strict=True))})
    ens = Ensemble(list(shipped_members), "safe")
    record = ResponseRecord(ens)  # what both adapters keep of a request
    stream = ens.stream(make_problems(1, seed=3, form="cot")[0].messages, max_new_tokens=24)
    record.add(next(stream))
    ens.load_weights(path)  # the next request would draft with names[1]...
    for delta in stream:
        record.add(delta)
    assert ens.summary()["drafter"] == names[1]
    assert record.summary["drafter"] == names[0]  # ...this one drafted with names[0]
    assert record.summary["member_weights"] == pytest.approx({n: 1 / 3 for n in names})
    assert list(delta.stats.prompt_tokens)[0] == names[0]


def test_token_weights_option_and_trust_multiply(trio, tmp_path):
    """A member the trust weighs down loses the vote it would win with equal trust."""
    right, _, wrong = trio
    weights = [1.0, 3.0]  # the `weights` option makes "wrong" win...
    equal = Ensemble([right, wrong], "token", weights=weights, learn_weights=False)
    assert equal.generate(PROMPT, max_new_tokens=4).text.startswith("Tom")
    path = _write(tmp_path, {"weights": {"right": 0.9, "wrong": 0.1}})
    trusted = Ensemble([right, wrong], "token", weights=weights, weight_floor=0.0)
    trusted.load_weights(path)  # ...until trust weighs it down (3 * 0.1 < 1 * 0.9)
    assert trusted.generate(PROMPT, max_new_tokens=64).text == TEXT


# --- equal weights change nothing -----------------------------------------------------------------


CONFIGS = [
    ("token", {}),
    ("token", {"aggregator": "gac"}),
    ("token", {"subtoken": "first"}),
    ("safe", {}),
    ("safe", {"aggregator": "gac"}),
    ("safe", {"heal": True, "sharpen": "geometric"}),
    ("specem", {}),
    ("specem", {"feedback": False}),
    ("rerank", {}),
]


@needs_trained
@pytest.mark.parametrize(("method", "options"), CONFIGS, ids=lambda v: str(v))
def test_equal_weights_decide_exactly_as_without_trust(make_ensemble, tmp_path, method, options):
    """A frozen ensemble and a learning one whose weights were reset give the same texts and
    events (the trust's own events aside), request after request."""
    problems = make_problems(3, seed=5, form="cot")
    frozen = make_ensemble(method, learn_weights=False, **options)
    learning = make_ensemble(method, learn_weights=True, weight_floor=0.0, **options)
    names = list(learning.member_weights)
    path = _write(tmp_path, {"weights": dict(zip(names, [0.2, 0.5, 0.3], strict=True))})
    learning.load_weights(path, freeze=False)
    for problem in problems:
        learning.generate(problem.messages, max_new_tokens=60)
    assert len(set(learning.member_weights.values())) > 1
    learning.reset_weights()
    assert learning.member_weights == frozen.member_weights
    for problem in problems:
        a = frozen.generate(problem.messages, max_new_tokens=60)
        learning.reset_weights()
        b = learning.generate(problem.messages, max_new_tokens=60)
        assert a.text == b.text
        assert [e.to_dict() for e in a.events] == [
            e.to_dict() for e in b.events if not isinstance(e, TrustUpdated)
        ]


# --- saved and loaded ----------------------------------------------------------------------------


@needs_trained
def test_saved_and_loaded_weights_give_the_same_text(make_ensemble, tmp_path):
    warm = make_problems(4, seed=2, form="cot")
    learned = make_ensemble("safe", heal=True, learn_weights=True)
    for problem in warm:
        learned.generate(problem.messages, max_new_tokens=60)
    path = learned.save_weights(tmp_path / "trust.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trust.json"]  # no temporary left
    assert json.loads(path.read_text())["weights"] == learned.member_weights
    learned.learn_weights = False
    loaded = make_ensemble("safe", heal=True)
    loaded.load_weights(path)
    assert loaded.member_weights == learned.member_weights and not loaded.learn_weights
    for problem in make_problems(3, seed=5, form="cot"):
        a = learned.generate(problem.messages, max_new_tokens=60)
        b = loaded.generate(problem.messages, max_new_tokens=60)
        assert a.text == b.text and a.stats.member_weights == b.stats.member_weights


def test_save_overwrites_atomically_and_a_missing_folder_is_an_error(trio, tmp_path):
    ens = Ensemble(trio, "token")
    path = tmp_path / "w.json"
    path.write_text("old")
    ens.save_weights(path)
    assert json.loads(path.read_text())["weights"] == ens.member_weights
    with pytest.raises(InvalidConfigError, match="does not exist"):
        ens.save_weights(tmp_path / "nowhere" / "w.json")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"weights": {"right": 0.5, "twin": 0.5, "nobody": 0.1}}, "unknown \\['nobody'\\]"),
        ({"weights": {"right": 0.5, "twin": 0.5}}, "2 weights for 3 members"),
        ({"weights": {"right": 0.5, "twin": 0.5, "wrong": 0.1, "x": 1}}, "4 weights for 3"),
        ('{"weights": {"right": NaN, "twin": 0.5, "wrong": 0.5}}', "'right' is nan"),
        ('{"weights": {"right": Infinity, "twin": 0.5, "wrong": 0.5}}', "'right' is inf"),
        ({"weights": {"right": 0, "twin": 0.5, "wrong": 0.5}}, "finite and above 0"),
        ({"weights": {"right": -1, "twin": 0.5, "wrong": 0.5}}, "finite and above 0"),
        ({"weights": {"right": "1", "twin": 0.5, "wrong": 0.5}}, "not a number"),
        ({"weights": {"right": True, "twin": 0.5, "wrong": 0.5}}, "not a number"),
        ('{"weights": {"right": 1, "right": 1, "wrong": 1}}', "given twice"),
        ("{not json", "not valid JSON"),
        ([0.3, 0.3, 0.4], '"weights"'),
        ({"right": 0.3, "twin": 0.3, "wrong": 0.4}, '"weights"'),
    ],
)
def test_a_bad_weights_file_is_refused_and_changes_nothing(trio, tmp_path, content, needle):
    ens = Ensemble(trio, "token", learn_weights=True)
    ens.generate(PROMPT, max_new_tokens=64)
    before = ens.member_weights
    path = _write(tmp_path, content)
    with pytest.raises(InvalidConfigError, match=needle) as caught:
        ens.load_weights(path)
    assert str(path) in str(caught.value)
    assert ens.member_weights == before and ens.learn_weights  # not frozen either


def test_a_missing_weights_file_is_refused(trio, tmp_path):
    ens = Ensemble(trio, "token")
    with pytest.raises(InvalidConfigError, match="no such file"):
        ens.load_weights(tmp_path / "absent.json")


# --- options, bounds, visibility -------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"learn_weights": "yes"}, "learn_weights=True or learn_weights=False"),
        ({"weight_lr": 0}, "weight_lr"),
        ({"weight_lr": float("nan")}, "weight_lr"),
        ({"weight_floor": 1.0}, "weight_floor"),
        ({"weight_floor": -0.1}, "weight_floor"),
        ({"probe_every": 0}, "probe_every"),
        ({"probe_every": True}, "probe_every"),
    ],
)
def test_bad_trust_options_fail_at_the_call(trio, options, needle):
    with pytest.raises(InvalidConfigError, match=needle):
        Ensemble(trio, "token", **options)
    with pytest.raises(InvalidConfigError, match=needle):
        Ensemble.from_pretrained(["/no/such/model"], "single", **options)  # before loading
    ens = Ensemble(trio, "token")
    with pytest.raises(InvalidConfigError, match="learn_weights"):
        ens.learn_weights = "no"
    with pytest.raises(InvalidConfigError, match="freeze"):
        ens.load_weights("x.json", freeze="no")


def test_hedge_stays_finite_and_positive_for_any_lr():
    w = torch.full((3,), 1 / 3, dtype=torch.float64)
    r = torch.tensor([1.0, 0.0, 0.5], dtype=torch.float64)
    for lr in (1e-300, 1.0, 1e6, 1e300, 1.7e308):
        for t in (1, 2, 1000):
            out = hedge(w, r, lr, t)
            assert bool(torch.isfinite(out).all()) and bool((out >= MIN_WEIGHT * 0.99).all())
            assert float(out.sum()) == pytest.approx(1.0)
    plain = w * torch.exp(1.0 * math.sqrt(1 / 3) * r)  # within bounds: the plain rule
    assert torch.equal(hedge(w, r, 1.0, 1), plain / plain.sum())
    assert math.log(torch.finfo(torch.float64).max) / 2 > MAX_ETA


def test_huge_lr_never_gives_nan_weights_or_invalid_json(trio):
    ens = Ensemble(trio, "specem", lr=1e300, learn_weights=True, weight_lr=1e300, weight_floor=0)
    for _ in range(2):
        out = ens.generate(PROMPT, max_new_tokens=64)
        for weights in (out.stats.weights, ens.member_weights):
            assert all(math.isfinite(w) and w > 0 for w in weights.values())
        json.dumps([e.to_dict() for e in out.events], allow_nan=False)
        json.dumps(out.stats.to_dict(), allow_nan=False)
    assert _updates(out) and any(e.name == "weights_updated" for e in out.events)


def test_weights_are_in_stats_summary_and_events(trio):
    assert Ensemble(trio, "token").summary()["learn_weights"] is False  # frozen by default
    ens = Ensemble(trio, "token", learn_weights=True, weight_lr=0.5)
    out = ens.generate(PROMPT, max_new_tokens=64)
    assert out.stats.member_weights == {"right": 1 / 3, "twin": 1 / 3, "wrong": 1 / 3}
    assert out.stats.to_dict()["member_weights"] == {n: 0.333333 for n in ens.member_weights}
    summary = ens.summary()
    assert summary["member_weights"] == ens.member_weights != out.stats.member_weights
    assert (summary["learn_weights"], summary["weight_floor"], summary["probe_every"]) == (
        True,
        0.2,
        10,
    )
    assert summary["weight_updates"] == _updates(out)[0].decisions
    assert _updates(out)[0].to_dict()["name"] == "trust_updated"
    second = ens.generate(PROMPT, max_new_tokens=64)
    assert second.stats.member_weights == summary["member_weights"]


# --- the adapters show the weights ----------------------------------------------------------------


def test_langchain_metadata_and_events_carry_the_weights(trio, tmp_path):
    from langchain_core.callbacks import BaseCallbackHandler

    from langchain_ensemble import ChatEnsemble

    class Names(BaseCallbackHandler):
        def __init__(self):
            self.names = []

        def on_custom_event(self, name, data, **kwargs):
            self.names.append(name)

    path = _write(tmp_path, {"weights": {"right": 0.5, "twin": 0.3, "wrong": 0.2}})
    engine = Ensemble(trio, "token", learn_weights=True, weight_floor=0.0)
    engine.load_weights(path, freeze=False)
    handler = Names()
    message = ChatEnsemble.from_ensemble(engine, max_tokens=64).invoke(
        PROMPT[0]["content"], config={"callbacks": [handler]}
    )
    summary = message.response_metadata["ensemble"]
    assert summary["member_weights"] == {"right": 0.5, "twin": 0.3, "wrong": 0.2}  # its start
    assert summary["learn_weights"] is True and summary["weight_floor"] == 0.0
    assert "ensemble.trust_updated" in handler.names
    assert json.loads(json.dumps(summary)) == summary


def test_llamaindex_raw_carries_the_weights(trio, tmp_path):
    from llama_index.core.llms import ChatMessage

    from llamaindex_ensemble import EnsembleLLM

    path = _write(tmp_path, {"weights": {"right": 0.5, "twin": 0.3, "wrong": 0.2}})
    engine = Ensemble(trio, "token", weight_floor=0.0)
    engine.load_weights(path)  # frozen
    llm = EnsembleLLM(ensemble=engine, max_new_tokens=64)
    for response in (
        llm.complete(PROMPT[0]["content"]),
        llm.chat([ChatMessage(role="user", content=PROMPT[0]["content"])]),
    ):
        ensemble = response.raw["ensemble"]
        assert ensemble["member_weights"] == {"right": 0.5, "twin": 0.3, "wrong": 0.2}
        assert ensemble["learn_weights"] is False
        assert response.raw["stats"]["member_weights"] == ensemble["member_weights"]
