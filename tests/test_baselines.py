"""The baselines as published, on the shipped models and on scripted members: `single` is
exactly the model's own greedy decoding; `token` with UniTE ensembles every position, with GaC
only where its first member is unsure (GaC's gate), and `gate=None` ensembles GaC everywhere."""

from __future__ import annotations

import pytest
import torch
from scripted import Scripted

from core import Ensemble, InvalidConfigError
from core.events import SkipGate, TokenEnsembled
from core.testbed import make_problems

PROBLEMS = make_problems(20, seed=5, form="cot")
PROMPT = [{"role": "user", "content": "Sara has 6 buttons. She donates 1. How many?"}]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_single_reproduces_model_generate(make_ensemble, index):
    ens = make_ensemble("single", members=[index])
    for problem in PROBLEMS:
        stream = ens.stream(problem.messages, max_new_tokens=48)
        *_, last = stream
        member = stream.members[0]  # the request's own view: its prompt and generated ids
        prompt = torch.tensor([member.prompt_ids])
        with torch.no_grad():
            reference = member.model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=48,
                do_sample=False,
                eos_token_id=sorted(member.stop_ids),
                pad_token_id=member.tokenizer.pad_token_id,
            )[0, prompt.shape[1] :].tolist()
        stopped = reference[-1] in member.stop_ids
        generated = reference[:-1] if stopped else reference
        assert member.ids == generated, problem.question
        assert last.stats.tokens == len(reference)
        assert last.finish_reason == ("stop" if stopped else "length")


def _positions(out, kind) -> list[int]:
    return [e.position for e in out.events if isinstance(e, kind)]


def _partitioned(out) -> None:
    """Every output token is an ensembled step or a gated one, and the stats say so."""
    ensembled, gated = _positions(out, TokenEnsembled), _positions(out, SkipGate)
    assert sorted(ensembled + gated) == list(range(out.stats.tokens))
    assert out.stats.ensembled_tokens == len(ensembled)
    assert out.stats.counts.get("skip_gate", 0) == len(gated)


def test_gac_gate_ensembles_only_where_the_first_member_is_unsure(tiny_members):
    """The first member is sure of every token but one (" 13" or " 12", even odds): only there
    do the members ensemble (and the second member's " 12" wins); everywhere else the first
    member's token is taken without running the second member. Without the gate every
    position is ensembled."""
    wrong, right = "The answer is 13.", "The answer is 12."
    first = Scripted(tiny_members[0], [(wrong, 0.5), (right, 0.5)], "bpe-unsure")
    second = Scripted(tiny_members[0], [right], "bpe-sure")
    out = Ensemble([first, second], "token", aggregator="gac").generate(PROMPT, max_new_tokens=32)
    assert out.text == right and out.finish_reason == "stop"
    at = first.canonical_ids(right).index(first.vocab.string_to_id[" 12"])
    points = [e for e in out.events if isinstance(e, TokenEnsembled)]
    assert [(p.position, p.chosen) for p in points] == [(at, " 12")]
    gates = [e for e in out.events if isinstance(e, SkipGate)]
    assert all(g.member == "bpe-unsure" and g.probability > 0.999 for g in gates)
    assert out.stats.member_calls["bpe-sure"] == 1  # consulted at the one unsure position
    _partitioned(out)
    every = Ensemble([first, second], "token", aggregator="gac", gate=None)
    out = every.generate(PROMPT, max_new_tokens=32)
    assert out.text == right and out.stats.ensemble_rate == 1.0
    assert out.stats.member_calls["bpe-sure"] == out.stats.tokens
    _partitioned(out)


def test_token_baselines_on_the_shipped_models(make_ensemble):
    """UniTE ensembles every token; GaC as published ensembles a small share (its first member,
    the best model, is usually sure); GaC with gate=None ensembles every token again."""
    gac = make_ensemble("token", aggregator="gac")
    every = make_ensemble("token", aggregator="gac", gate=None)
    unite = make_ensemble("token", aggregator="unite")
    gated = tokens = 0
    for problem in PROBLEMS[:8]:
        out = gac.generate(problem.messages, max_new_tokens=80)
        _partitioned(out)
        gated += out.stats.ensembled_tokens
        tokens += out.stats.tokens
        assert min(e.probability for e in out.events if isinstance(e, SkipGate)) > 0.5
        for ens in (unite, every):
            out = ens.generate(problem.messages, max_new_tokens=80)
            assert out.stats.ensemble_rate == 1.0
            _partitioned(out)
    assert 0 < gated < 0.2 * tokens  # measured: 0.6 % on 200 problems
    assert gac.summary()["gate"] == 0.5 and unite.summary()["gate"] is None
    assert every.summary()["aggregator"] == "gac" and every.summary()["gate"] is None


@pytest.mark.parametrize(
    "options, fragment",
    [
        (dict(gate=1.5), "gate="),
        (dict(gate="always"), "gate="),
        (dict(gate=True), "gate="),
        (dict(subtoken="space"), "subtoken="),
        (dict(aggregator="mean"), "aggregator="),
    ],
)
def test_bad_token_options_name_the_problem(tiny_members, options, fragment):
    with pytest.raises(InvalidConfigError, match=fragment):
        Ensemble(tiny_members[:2], "token", **options)
