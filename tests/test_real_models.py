"""Smoke test on real models, as users have them: SmolLM2-135M-Instruct and Gemma-3-270M (base)
as GGUF files from PyPI (the `real` extra; `core.testbed.real_models`). Both load; every method
at its defaults streams exactly what it generates; a tool call and a JSON-schema answer are
valid on these two real vocabularies (49,152 and 262,144 tokens). Few tokens each: the models
load once for the module, and the module runs in a few minutes on two CPU cores.

Skipped, with the reason, where the extra is not installed."""

from __future__ import annotations

import json
import time

import jsonschema
import pytest
from penalty_reference import penalised_greedy
from torch import nn

from core import Ensemble, HFMember
from core.few_rows import FewRowLinear
from core.methods import DEFAULT_METHOD
from core.testbed import TOOL_SPECS
from core.testbed.real_models import (
    GEMMA_STOP,
    REAL_EXTRA,
    real_members,
    real_models_available,
)

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(
        not real_models_available(), reason=f"real models not installed: {REAL_EXTRA}"
    ),
]
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ADD = TOOL_SPECS["add"]  # the testbed's own spec of the tool
ANSWER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
}


@pytest.fixture(scope="module")
def members() -> list[HFMember]:
    loaded = []
    for spec in real_members():
        started = time.perf_counter()
        loaded.append(HFMember.load(spec, device="cpu"))
        print(f"\nloaded {spec.name} in {time.perf_counter() - started:.1f} s")
    return loaded


def test_both_members_load_with_their_templates(members):
    smollm2, gemma = members
    assert (smollm2.vocab.size, gemma.vocab.size) == (49152, 262144)
    assert gemma.stop_strings == GEMMA_STOP
    rendered = [m.tokenizer.decode(m.render(QUESTION)) for m in members]
    assert rendered[0].startswith("<|im_start|>system\n")  # SmolLM2's own, from the file
    assert rendered[0].endswith(f"{QUESTION[0]['content']}<|im_end|>\n<|im_start|>assistant\n")
    assert rendered[1] == (f"<bos>Question: {QUESTION[0]['content']}\nAnswer:")


def test_both_members_take_the_few_row_kernel(members):
    for member in members:  # weights far beyond a CPU's cache: passes of 1-8 ids cost 2-4x less
        head = member.model.get_output_embeddings()
        assert type(head) is FewRowLinear
        assert head.weight is member.model.get_input_embeddings().weight
        body = {type(m) for m in member.model.modules() if isinstance(m, nn.Linear)}
        assert body == {FewRowLinear}


@pytest.mark.parametrize("method", ["single", "token", "safe", "specem", "rerank"])
def test_every_method_streams_what_it_generates(members, method):
    ensemble = Ensemble(members, method)
    out = ensemble.generate(QUESTION, max_new_tokens=8)
    deltas = list(ensemble.stream(QUESTION, max_new_tokens=8))
    assert "".join(d.text for d in deltas) == out.text
    assert deltas[-1].finish_reason == out.finish_reason
    assert out.stats.tokens > 0 and out.text.strip()


def test_the_base_models_answers_end_where_it_writes_its_stop(members):
    """Gemma's answer in rerank's vote ends where it writes "\nQuestion:" (its turn's end in
    its text template), marked as ending the turn, not 40 tokens of a next question later."""
    gemma = members[1]
    assert gemma.stop_texts == GEMMA_STOP
    out = Ensemble(members, "rerank").generate(QUESTION, max_new_tokens=40)
    answers = next(e.candidates for e in out.events if e.name == "segment_candidates")
    assert GEMMA_STOP[0] not in answers[gemma.name]
    assert out.finish_reason == "stop" and GEMMA_STOP[0] not in out.text


def test_a_tool_call_is_valid_on_both_vocabularies(members):
    ensemble = Ensemble(members, DEFAULT_METHOD)
    question = [{"role": "user", "content": "What is 7 plus 5? Use the add tool."}]
    out = ensemble.generate(
        question, tools=[ADD], tool_choice="required", parallel_tool_calls=False, max_new_tokens=40
    )  # one call: left to themselves, both models call again and again
    assert out.finish_reason == "tool_calls" and not out.invalid_tool_calls
    assert [call.name for call in out.tool_calls] == ["add"]
    jsonschema.validate(out.tool_calls[0].arguments, ADD["function"]["parameters"])


def test_a_json_schema_answer_is_valid_on_both_vocabularies(members):
    ensemble = Ensemble(members, DEFAULT_METHOD)
    out = ensemble.generate(QUESTION, response_format=ANSWER, max_new_tokens=24)
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), ANSWER)


def test_the_penalties_on_both_vocabularies(members):
    """Each member alone writes what transformers writes with OpenAI's penalties on its logits
    (49,152 and 262,144 ids), and on the question of LangChain's structured-output test, where
    SmolLM2's repetition inside a JSON string carries the default to the token limit, the
    default with frequency_penalty=0.5 closes its answer."""
    for member in members:
        out = Ensemble([member], "single").generate(
            QUESTION, max_new_tokens=12, frequency_penalty=1
        )
        assert out.text == penalised_greedy(member, QUESTION, 12, frequency_penalty=1)
    joke = {
        "type": "object",
        "properties": {"setup": {"type": "string"}, "punchline": {"type": "string"}},
        "required": ["setup", "punchline"],
    }
    question = [{"role": "user", "content": "Tell me a joke about cats."}]
    ensemble = Ensemble(members, DEFAULT_METHOD)
    plain = ensemble.generate(question, response_format=joke, max_new_tokens=64)
    shaped = ensemble.generate(
        question, response_format=joke, max_new_tokens=64, frequency_penalty=0.5
    )
    assert plain.finish_reason == "length"
    assert shaped.finish_reason == "stop"
    jsonschema.validate(json.loads(shaped.text), joke)
