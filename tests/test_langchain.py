"""ChatEnsemble's own behaviour, on tiny random-weight members (three tokenizer families).

Random weights answer greedily with newlines, so most tests sample with a fixed seed: the text
is varied and exactly reproducible. Every method present in this build is covered; a method
module that is added later (safe, specem) is picked up without editing this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pytest
from conftest import LoopProbe
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from pydantic import ValidationError

from core import Ensemble
from core.errors import InvalidConfigError, ModelNotFoundError
from core.methods import METHOD_NAMES
from core.testbed import MODEL_ORDER, model_paths
from langchain_ensemble import ChatEnsemble
from langchain_ensemble.events import EVENT_NAMES

METHODS = [m for m in METHOD_NAMES if importlib.util.find_spec(f"core.methods.{m}")]
ENSEMBLING = [m for m in METHODS if m != "single"]  # methods that emit ensemble events
SAMPLED = {"temperature": 1.0, "seed": 7, "max_tokens": 10}
PROMPTS = ["Hi", "Hey", "Tom has 7 apples.", "What is 3 + 4?"]  # prompt lengths all differ


@pytest.fixture(scope="module")
def paths(tiny_dirs) -> list[str]:
    return [tiny_dirs[name] for name in MODEL_ORDER]


@pytest.fixture(scope="module")
def loaded(paths):
    """Holds one loaded engine per method for the module (engines are shared by config)."""
    return {m: ChatEnsemble(models=paths, method=m).ensemble for m in METHODS}


@pytest.fixture
def chat(paths, loaded):
    def build(method: str = "token", **fields) -> ChatEnsemble:
        return ChatEnsemble(models=paths, method=method, **{**SAMPLED, **fields})

    return build


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict, object]] = []
        self.chat_runs: list[object] = []

    def on_chat_model_start(self, serialized, messages, *, run_id, **kwargs) -> None:
        self.chat_runs.append(run_id)

    def on_custom_event(self, name, data, *, run_id, **kwargs) -> None:
        self.events.append((name, data, run_id))


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict]] = []

    async def on_custom_event(self, name, data, *, run_id, **kwargs) -> None:
        self.events.append((name, data))


def _close(a, b) -> bool:
    """Equal, except floats that may differ by 1e-4."""
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-4
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _joined(chunks):
    full = chunks[0]
    for chunk in chunks[1:]:
        full = full + chunk
    return full


# --- construction and sharing -------------------------------------------------------------------


def test_constructing_loads_nothing_the_first_call_does():
    chat = ChatEnsemble(models=["/nonexistent/a", "/nonexistent/b"], method="token")
    assert chat.model_name == "ensemble-token:a+b"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        chat.invoke("hi")


def test_instances_with_one_configuration_share_one_engine(chat, paths):
    a, b = chat("token"), chat("token", temperature=0.0, max_tokens=3)
    assert a.ensemble is b.ensemble  # generation settings are per request, not per engine
    assert chat("token").ensemble is not chat("single").ensemble
    other = ChatEnsemble(models=paths, method="token", method_options={"top_k": 3})
    assert other.ensemble is not a.ensemble


def test_from_ensemble_wraps_a_built_engine(tiny_members):
    engine = Ensemble(tiny_members[:2], "token")
    chat = ChatEnsemble.from_ensemble(engine, max_tokens=4)
    assert chat.ensemble is engine
    assert chat.model_name == "ensemble-token:tb-gpt2-bpe+tb-qwen2-spm"
    message = chat.invoke("hi")
    assert message.response_metadata["ensemble"]["members"] == ["tb-gpt2-bpe", "tb-qwen2-spm"]


def test_bad_configuration_fails_at_construction_with_the_fix(paths):
    with pytest.raises(ValidationError, match="pass models="):
        ChatEnsemble(method="token")
    with pytest.raises(ValidationError, match="unknown method 'tokens'; use one of"):
        ChatEnsemble(models=paths, method="tokens")
    with pytest.raises(ValidationError, match="unknown option.*'topk'.*top_k"):
        ChatEnsemble(models=paths, method="token", method_options={"topk": 3})
    with pytest.raises(ValidationError, match="needs at least 2 members"):
        ChatEnsemble(models=paths[:1], method="token")
    with pytest.raises(ValidationError, match="temperature must be >= 0"):
        ChatEnsemble(models=paths, method="token", temperature=-1)
    with pytest.raises(ValidationError, match="unknown ensemble event name.*'tokens'"):
        ChatEnsemble(models=paths, method="token", ensemble_events=["tokens"])


def test_stop_is_accepted_under_both_names(paths):
    assert ChatEnsemble(models=paths, method="token", stop=["x"]).stop == ["x"]
    assert ChatEnsemble(models=paths, method="token", stop_sequences=["y"]).stop == ["y"]
    assert ChatEnsemble(models=paths, method="token", model="mine").model_name == "mine"


def test_identifying_params_are_plain_json(chat):
    """What tracing records of the model (`asdict()` is its identifying params and `_type`)."""
    params = chat("token", method_options={"top_k": 4}).asdict()
    assert params.pop("_type") == "llm-ensembling-chat"
    assert json.loads(json.dumps(params)) == params
    assert params["method"] == "token" and params["method_options"] == {"top_k": 4}
    assert params["models"][0].endswith("tb-gpt2-bpe")


def test_per_call_arguments_override_and_unknown_ones_fail(chat):
    model = chat("token")
    assert model.invoke("hi", max_tokens=3).usage_metadata["output_tokens"] <= 3
    with pytest.raises(InvalidConfigError, match="unknown argument.*'max_new_tokens'"):
        model.invoke("hi", max_new_tokens=3)
    with pytest.raises(InvalidConfigError, match="cannot switch"):
        model.invoke("hi", model="gpt-4o")
    with pytest.raises(InvalidConfigError, match="max_tokens must be a positive integer"):
        model.invoke("hi", max_tokens=0)


def test_token_counting_uses_the_first_active_members_tokenizer(chat, tiny_members):
    text = "He has 12 + 18 apples."
    counts = [len(m.tokenizer(text, add_special_tokens=False)["input_ids"]) for m in tiny_members]
    assert counts[0] != counts[2]  # digits: bpe "Ġ1 8" vs word-level "18"
    assert chat("token").get_num_tokens(text) == counts[0]  # no hub download of GPT-2's
    assert chat("single", method_options={"member": 2}).get_num_tokens(text) == counts[2]


# --- messages -------------------------------------------------------------------------------


def test_double_system_human_and_ai_messages_are_merged(chat):
    model = chat("token")
    doubled = [
        SystemMessage("Be brief."),
        SystemMessage("Use digits."),
        HumanMessage("Tom has 7 apples."),
        HumanMessage("He buys 5 more."),
        AIMessage("He has"),
        AIMessage("12 apples."),
    ]  # no trailing human message: the members continue as the assistant's next turn
    merged = [
        SystemMessage("Be brief.\n\nUse digits."),
        HumanMessage("Tom has 7 apples.\n\nHe buys 5 more."),
        AIMessage("He has\n\n12 apples."),
    ]
    result, expected = model.invoke(doubled), model.invoke(merged)
    assert result.content and result.content == expected.content
    assert result.usage_metadata == expected.usage_metadata


def test_tool_results_and_names_reach_every_member(chat):
    """Templates without a tool role get the tool result as a user turn; names are passed on."""
    result = chat("token").invoke(
        [
            HumanMessage("What is 3 + 4?", name="alice"),
            AIMessage("Let me compute."),
            ToolMessage("7", tool_call_id="c1", name="calculator"),
        ]
    )
    assert result.content
    assert set(result.response_metadata["ensemble"]["prompt_tokens"]) == set(MODEL_ORDER)


# --- events ---------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ENSEMBLING)
def test_a_callback_handler_receives_ensemble_events_on_invoke(chat, method):
    seen: list = []
    handler = Recorder()
    model = chat(method, on_event=seen.append)
    message = model.invoke("Tom has 7 apples.", config={"callbacks": [handler]})
    assert handler.events, "no ensemble event reached the handler"
    assert [name for name, _, _ in handler.events] == [f"ensemble.{e.name}" for e in seen]
    assert [data for _, data, _ in handler.events] == [e.to_dict() for e in seen]
    assert {run for _, _, run in handler.events} == set(handler.chat_runs)  # the LLM run
    if method == "token":  # one event per ensembled step
        assert len(handler.events) == message.response_metadata["ensemble"]["ensembled_tokens"]


@pytest.mark.parametrize("method", ENSEMBLING)
async def test_an_async_handler_receives_them_on_ainvoke(chat, method):
    handler = AsyncRecorder()
    await chat(method).ainvoke("Tom has 7 apples.", config={"callbacks": [handler]})
    assert handler.events and all(n.startswith("ensemble.") for n, _ in handler.events)
    sync = Recorder()
    chat(method).invoke("Tom has 7 apples.", config={"callbacks": [sync]})
    assert [n for n, _ in handler.events] == [n for n, _, _ in sync.events]
    assert _close([d for _, d in handler.events], [d for _, d, _ in sync.events])


@pytest.mark.parametrize("method", ENSEMBLING)
async def test_chain_astream_events_yields_ensemble_events_with_data(chat, method):
    prompt = ChatPromptTemplate.from_messages([("system", "Answer."), ("human", "{question}")])
    model = chat(method)
    chain = prompt | model | StrOutputParser()
    custom, pieces = [], []
    async for event in chain.astream_events({"question": "What is 3 + 4?"}, version="v2"):
        if event["event"] == "on_custom_event":
            custom.append(event)
        elif event["event"] == "on_parser_stream":
            pieces.append(event["data"]["chunk"])
    assert custom, "astream_events yielded no on_custom_event"
    for event in custom:
        assert event["name"].startswith("ensemble.")
        assert event["name"].removeprefix("ensemble.") in EVENT_NAMES
        assert event["data"]["name"] == event["name"].removeprefix("ensemble.")
    expected = chain.invoke({"question": "What is 3 + 4?"})
    assert "".join(pieces) == expected
    handler = Recorder()  # the sync path: chain.stream dispatches to the handler too
    assert "".join(chain.stream({"question": "What is 3 + 4?"}, {"callbacks": [handler]})) == (
        expected
    )
    assert _close([e["data"] for e in custom], [data for _, data, _ in handler.events])


def test_a_bare_stream_keeps_events_for_the_listener_and_the_trace(chat):
    """No parent run: custom events have nowhere to go, the other channels still work."""
    seen: list = []
    model = chat("token", on_event=seen.append, event_trace=True)
    chunks = list(model.stream("Hello"))
    full = _joined(chunks)
    assert full.response_metadata["ensemble_events"] == [e.to_dict() for e in seen]
    traced = model.invoke("Hello").response_metadata["ensemble_events"]
    # the same events; probabilities may differ in the 6th digit (a reused KV cache)
    assert _close(traced, full.response_metadata["ensemble_events"])


def test_event_selection_filters_custom_events_and_trace(chat):
    handler = Recorder()
    chat("token", ensemble_events=False).invoke("Hi", config={"callbacks": [handler]})
    assert handler.events == []
    model = chat("token", ensemble_events=["ensemble.member_failed"], event_trace=True)
    message = model.invoke("Hi", config={"callbacks": [handler]})
    assert handler.events == [] and message.response_metadata["ensemble_events"] == []


# --- stops, usage, metadata -----------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_stop_sequences_are_trimmed_and_never_partially_streamed(chat, method):
    prompt = "Tom has 7 apples. He buys 5 more."  # long enough an output for every method
    model = chat(method, max_tokens=12)
    text = model.invoke(prompt).content
    cut = len(text) // 2
    stop = text[cut : cut + 3]  # three characters from the middle: spans a token boundary
    cut = text.index(stop)
    assert stop.strip() and cut > 0, f"output too uniform to pick a stop string: {text!r}"
    pieces = [c.content for c in model.stream(prompt, stop=[stop])]
    streamed = ""
    for piece in pieces:
        streamed += piece
        assert text[:cut].startswith(streamed)  # never anything past the cut, even for a moment
    assert streamed == text[:cut]
    message = chat(method, max_tokens=12, stop_sequences=[stop]).invoke(prompt)
    assert message.content == text[:cut]
    assert message.response_metadata["finish_reason"] == "stop"


@pytest.mark.parametrize("method", METHODS)
def test_usage_is_ints_and_the_same_for_invoke_and_stream(chat, method):
    model = chat(method)
    invoked = model.invoke("Tom has 7 apples.")
    chunks = list(model.stream("Tom has 7 apples."))
    streamed = _joined(chunks)
    usage = invoked.usage_metadata
    assert all(type(usage[k]) is int for k in ("input_tokens", "output_tokens", "total_tokens"))
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert streamed.usage_metadata == usage
    assert streamed.content == invoked.content
    summary = invoked.response_metadata["ensemble"]
    assert usage["output_tokens"] == summary["tokens"] > 0
    first_active = next(iter(summary["prompt_tokens"].values()))
    assert usage["input_tokens"] == first_active == summary["input_tokens"]
    assert sum(1 for c in chunks if c.usage_metadata) == 1  # input tokens counted once


def test_input_tokens_are_counted_in_the_drafters_tokenization(chat):
    message = chat("safe", method_options={"drafter": 1}).invoke("He has 12 + 18 apples.")
    prompt_tokens = message.response_metadata["ensemble"]["prompt_tokens"]
    assert message.usage_metadata["input_tokens"] == prompt_tokens["tb-qwen2-spm"]
    assert len(set(prompt_tokens.values())) == 3  # the members' own counts all differ


async def test_async_usage_matches_sync(chat):
    model = chat("token")
    invoked = model.invoke("Hey")
    chunks = [c async for c in model.astream("Hey")]
    assert _joined(chunks).usage_metadata == invoked.usage_metadata
    assert (await model.ainvoke("Hey")).content == invoked.content == _joined(chunks).content


@pytest.mark.parametrize("method", METHODS)
def test_metadata_is_on_the_last_chunk_only(chat, method):
    chunks = list(chat(method).stream("Hello"))
    assert chunks[-1].chunk_position == "last"
    for chunk in chunks[:-1]:
        assert not {"model_name", "finish_reason", "ensemble"} & set(chunk.response_metadata)
    full = _joined(chunks)
    assert full.response_metadata["model_name"] == chat(method).model_name
    assert full.response_metadata["finish_reason"] in ("stop", "length")
    summary = full.response_metadata["ensemble"]
    assert summary["method"] == method and summary["members"] == list(MODEL_ORDER)
    assert 0.0 <= summary["ensemble_rate"] <= 1.0
    keys = {"winners", "ensemble_points", "weights", "ensembled_tokens", "ensembled_rounds"}
    assert keys <= set(summary)
    assert json.loads(json.dumps(summary)) == summary


# --- concurrency ----------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHODS)
def test_batch_of_four_equals_four_sequential_calls(chat, method):
    model = chat(method)
    batched = model.batch(PROMPTS)
    sequential = [model.invoke(p) for p in PROMPTS]
    assert [m.content for m in batched] == [m.content for m in sequential]
    assert [m.usage_metadata for m in batched] == [m.usage_metadata for m in sequential]
    # prompt lengths differ, so the usage comparison also catches answers returned out of order
    assert len({m.usage_metadata["input_tokens"] for m in sequential}) == len(PROMPTS)


async def test_abatch_equals_sequential_calls(chat):
    model = chat("token")
    batched = await model.abatch(PROMPTS[:2])
    assert [m.content for m in batched] == [model.invoke(p).content for p in PROMPTS[:2]]


async def test_async_calls_do_not_block_the_event_loop(chat):
    probe = LoopProbe()
    model = chat("token", max_tokens=16, on_event=probe)
    invoked = await model.ainvoke("Tom has 7 apples.")
    assert probe.proven, probe.ran  # the loop ran while the models were mid-computation
    probe.ran.clear()
    streamed = [chunk async for chunk in model.astream("Tom has 7 apples.")]
    assert probe.proven, probe.ran
    assert _joined(streamed).content == invoked.content


def test_a_stream_abandoned_early_releases_the_engine(chat):
    model = chat("token", max_tokens=16)
    for _ in model.stream("Hello"):
        break
    assert model.invoke("Hello").content  # would deadlock if the first request held the lock


# --- the example ----------------------------------------------------------------------------


async def test_the_example_streams_the_answer_and_the_ensemble_events(capsys):
    path = Path(__file__).parents[1] / "examples" / "langchain_chain.py"
    spec = importlib.util.spec_from_file_location("langchain_chain_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    question = "Max has 7 buttons. He donates 3. Then he collects 9 more. How many buttons?"
    await example.main(
        argparse.Namespace(method="specem", question=question, max_tokens=8, real=False, model=[])
    )
    out = capsys.readouterr().out
    assert "ensemble-specem:tb-gpt2-bpe+tb-qwen2-spm+tb-llama-word" in out
    assert "[round 1: tb-" in out and " wins with " in out  # events, as they arrived
    assert "E/T" in out and "'input_tokens':" in out
    two = [str(path) for path in model_paths()[:2]]  # members of the user's own (--model)
    await example.main(
        argparse.Namespace(method="safe", question=question, max_tokens=8, real=False, model=two)
    )
    assert "ensemble-safe:tb-gpt2-bpe+tb-qwen2-spm\n" in capsys.readouterr().out
