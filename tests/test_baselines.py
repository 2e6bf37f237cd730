"""The two baselines on the shipped models: `single` is exactly the model's own greedy decoding,
and `token` ensembles every position."""

from __future__ import annotations

import pytest
import torch

from core.testbed import make_problems

PROBLEMS = make_problems(20, seed=5, form="cot")


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


@pytest.mark.parametrize("aggregator", ["unite", "gac"])
def test_token_ensemble_of_three_shipped_models(make_ensemble, aggregator):
    ens = make_ensemble("token", aggregator=aggregator)
    out = ens.generate(PROBLEMS[0].messages, max_new_tokens=80)
    assert out.stats.ensemble_rate == 1.0 and out.stats.tokens > 5
    assert "answer" in out.text.lower() or out.finish_reason == "length"
