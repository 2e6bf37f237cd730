"""OpenAI's `frequency_penalty` and `presence_penalty`: a single member writes what transformers
writes with the same penalty on its logits; every row a method reads (the next-token rows,
verification scores from the memo or from a pass, branch rows) is penalised alike; the
adapters, `serve` and the CLI pass them; bad values and remote members are refused at the
call."""

from __future__ import annotations

import math

import openai
import pytest
import torch
from conftest import needs_trained
from fake_server import FakeServer
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from penalty_reference import penalised_greedy
from serve_helpers import reference

from core import Ensemble, GenerationConfig, InvalidConfigError, Remote
from core.cli import main
from core.penalties import Penalties
from core.testbed import model_paths
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM

pytestmark = needs_trained
FEW_SHOT = "Q: 2 + 3\nA: 5\nQ: 4 + 4\nA:"
PROMPT = [{"role": "user", "content": "Tell me about cats and dogs."}]
PENALTIES = {"frequency_penalty": 1.5, "presence_penalty": 0.5}
METHODS = ("single", "safe", "specem", "token", "rerank")
SETUPS = [(method, {}) for method in METHODS] + [("rerank", {"score": "pmi"})]


def test_a_single_member_writes_what_transformers_writes_with_the_penalty(shipped_members):
    changed = []
    for member in shipped_members:
        single = Ensemble([member], "single")
        out = single.generate(PROMPT, max_new_tokens=32, **PENALTIES)
        assert out.text == penalised_greedy(member, PROMPT, 32, **PENALTIES)
        changed.append(out.text != single.generate(PROMPT, max_new_tokens=32).text)
    assert any(changed)  # the first member repeats a name without them


def test_every_row_a_method_reads_is_penalised_alike(shipped_members):
    """Next-token rows, scores (computed, then read from the memo) and branch rows all equal
    the model's own rows penalised by the ids they follow."""
    penalties = Penalties(**{k.split("_")[0]: v for k, v in PENALTIES.items()})
    text = "cats and cats and dogs and cats"
    for member in shipped_members:
        plain, shaped = member.spawn(), member.spawn()
        plain.start(PROMPT)
        shaped.start(PROMPT, penalties=penalties)
        plain.sync(text)
        shaped.sync(text)
        ids, n = shaped.ids, shaped.n_tokens
        own = plain.logprobs(list(range(n + 1)))
        expected = penalties.apply(own, [ids[:b] for b in range(n + 1)])
        assert torch.allclose(shaped.logprobs(list(range(n + 1))), expected, atol=1e-5)
        assert not torch.allclose(own, expected, atol=1e-3)

        fresh = member.spawn()  # scores computed by a pass, then read back from the memo
        fresh.start(PROMPT, penalties=penalties)
        fresh.sync("")
        wanted = expected[torch.arange(n), torch.tensor(ids)]
        for _ in range(2):
            scores = fresh.score([text], ends=[False])[0]
            assert torch.allclose(scores, wanted, atol=1e-5)

        branches = [ids[3:5], ids[3:4]]
        rows = shaped.branch_logprobs(3, branches)
        assert torch.allclose(rows[0], expected[5], atol=1e-5)
        assert torch.allclose(rows[1], expected[4], atol=1e-5)


@pytest.mark.parametrize(("method", "options"), SETUPS, ids=[*METHODS, "rerank-pmi"])
def test_every_method_streams_what_it_generates_under_the_penalties(make_ensemble, method, options):
    ensemble = make_ensemble(method, members=[0] if method == "single" else None, **options)
    config = GenerationConfig(max_new_tokens=32, **PENALTIES)
    whole = ensemble.generate(PROMPT, config)
    assert "".join(d.text for d in ensemble.stream(PROMPT, config)) == whole.text
    assert whole.text  # penalties leave an answer to write


def test_the_penalties_change_the_default_ensembles_repetition(make_ensemble):
    ensemble = make_ensemble("safe")
    plain = ensemble.generate(PROMPT, max_new_tokens=40)
    shaped = ensemble.generate(PROMPT, max_new_tokens=40, **PENALTIES)
    assert shaped.text != plain.text


@pytest.mark.parametrize(
    "value", [2.5, -3, math.nan, "high", True], ids=["above", "below", "nan", "text", "bool"]
)
def test_a_bad_penalty_is_refused_naming_it(value):
    for name in PENALTIES:
        with pytest.raises(InvalidConfigError, match=name):
            GenerationConfig(**{name: value})


def test_a_member_served_with_top_log_probs_only_is_refused_at_the_call(shipped_members):
    fake = FakeServer(model_paths()[0], name="bpe")
    try:
        remote = Remote(fake.url, model=fake.name, tokenizer=fake.root)
        ensemble = Ensemble.from_pretrained([remote, model_paths()[1]], "safe", device="cpu")
        with pytest.raises(InvalidConfigError, match="frequency_penalty and presence_penalty"):
            ensemble.generate(PROMPT, max_new_tokens=4, frequency_penalty=0.5)
        assert ensemble.generate(PROMPT, max_new_tokens=4).text is not None
    finally:
        fake.stop()


def test_the_adapters_pass_the_penalties(make_ensemble):
    expected = make_ensemble("safe").generate(PROMPT, max_new_tokens=24, **PENALTIES).text
    paths = [str(p) for p in model_paths()]
    chat = ChatEnsemble(models=paths, method="safe", max_tokens=24, **PENALTIES)
    assert chat.invoke([HumanMessage(PROMPT[0]["content"])]).content == expected
    plain = ChatEnsemble(models=paths, method="safe", max_tokens=24)
    assert plain.invoke([HumanMessage(PROMPT[0]["content"])], **PENALTIES).content == expected
    llm = EnsembleLLM(models=paths, method="safe", max_new_tokens=24, **PENALTIES)
    assert llm.complete(PROMPT[0]["content"]).text == expected
    plain_llm = EnsembleLLM(models=paths, method="safe", max_new_tokens=24)
    assert plain_llm.complete(PROMPT[0]["content"], **PENALTIES).text == expected


def test_serve_takes_the_penalties_as_openai_sends_them(served, bodies):
    url, _, ensemble = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", http_client=bodies.client())
    answer = client.chat.completions.create(
        model="ensemble", messages=PROMPT, max_tokens=24, **PENALTIES
    )
    assert bodies.last["frequency_penalty"] == 1.5
    assert answer.choices[0].message.content == reference(ensemble, bodies.last).text
    plain = client.chat.completions.create(model="ensemble", messages=PROMPT, max_tokens=24)
    assert plain.choices[0].message.content != answer.choices[0].message.content


def test_the_cli_takes_the_penalties(capsys, make_ensemble):
    args = ["generate", "--model", str(model_paths()[0]), "--method", "single", "--raw"]
    args += ["--frequency-penalty", "1.5", "--presence-penalty", "0.5"]
    assert main([*args, "--max-new-tokens", "24", "--device", "cpu", FEW_SHOT]) == 0
    expected = make_ensemble("single", members=[0]).generate(
        FEW_SHOT, raw_prompt=True, max_new_tokens=24, **PENALTIES
    )
    assert capsys.readouterr().out.rstrip("\n") == expected.text


@given(
    st.lists(st.lists(st.integers(0, 11), max_size=12), min_size=1, max_size=4),
    st.floats(-2, 2),
    st.floats(-2, 2),
)
@settings(max_examples=60, deadline=None)
def test_penalties_are_openais_definition_on_any_history(histories, frequency, presence):
    """Each row loses frequency * count + presence * (count > 0) at every written id, and is a
    distribution again (log-probs); raw logits lose the same with no normalisation."""
    logits = torch.randn(len(histories), 12, generator=torch.Generator().manual_seed(0))
    rows = torch.log_softmax(logits, -1)
    penalties = Penalties(frequency, presence)
    expected = logits.clone()
    for i, history in enumerate(histories):
        for token in set(history):
            expected[i, token] -= frequency * history.count(token) + presence
    raw = penalties.apply(logits, histories, normalise=False)
    assert torch.allclose(raw, expected, atol=1e-5)
    shaped = penalties.apply(rows, histories)
    assert torch.allclose(shaped, torch.log_softmax(expected, -1), atol=1e-5)
