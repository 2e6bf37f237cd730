"""EnsembleLLM's LlamaIndex contract through the public API, on tiny random-weight members
(structure, not quality): templates, complete/chat consistency, metadata, usage, events inside
the LLM span, async error forwarding, lazy shared loading, and clear errors."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, TextBlock
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.instrumentation.dispatcher import instrument_tags
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.core.instrumentation.events.llm import (
    LLMChatStartEvent,
    LLMCompletionStartEvent,
)

from core import (
    ContextWindowError,
    Ensemble,
    InvalidConfigError,
    InvalidMessagesError,
    ModelNotFoundError,
)
from core.chat import normalize_messages
from core.events import EVENT_TYPES, TokenEnsembled
from core.testbed import MODEL_ORDER, random_model
from llamaindex_ensemble import (
    EVENT_CLASSES,
    EnsembleEvent,
    EnsembleLLM,
    EnsembleTokenEvent,
    to_instrumentation,
)
from llamaindex_ensemble.messages import to_core_messages

QUESTION = "Tom has 7 apples. He buys 5 more. How many apples does Tom have now?"
MESSAGES = [
    ChatMessage(role="system", content="You are a careful math tutor."),
    ChatMessage(role="user", content=QUESTION),
]


@pytest.fixture
def llm(tiny_members) -> EnsembleLLM:
    return EnsembleLLM(ensemble=Ensemble(tiny_members, "token"), max_new_tokens=6)


def test_every_core_event_type_has_an_instrumentation_class():
    assert set(EVENT_CLASSES) == set(EVENT_TYPES)
    classes = list(EVENT_CLASSES.values())
    assert len(set(classes)) == len(classes)
    assert all(issubclass(c, EnsembleEvent) and issubclass(c, BaseEvent) for c in classes)
    event = to_instrumentation(TokenEnsembled(3, " 12", [(" 12", 0.9)]), "span-1", "m")
    assert isinstance(event, EnsembleTokenEvent) and event.span_id == "span-1"
    assert event.name == "token_ensembled" and event.data["chosen"] == " 12"
    assert event.model_dump()["class_name"] == "EnsembleTokenEvent"


def test_chat_uses_each_members_own_template(llm, tiny_members):
    response = llm.chat(MESSAGES)
    rendered = normalize_messages(to_core_messages(MESSAGES))
    seen = response.raw["stats"]["prompt_tokens"]
    for member in tiny_members:  # word's Gemma template rejects system: the core folds it
        assert seen[member.name] == len(member.render(rendered))
    flattened = llm.messages_to_prompt(MESSAGES)  # LlamaIndex's generic "system: ..." prompt
    assert flattened.startswith("system:")
    generic = normalize_messages([{"role": "user", "content": flattened}])
    assert seen[tiny_members[0].name] != len(tiny_members[0].render(generic))


async def test_complete_chat_and_async_variants_agree(llm):
    done = llm.complete(QUESTION)
    chunks = list(llm.stream_complete(QUESTION))
    assert "".join(c.delta for c in chunks) == chunks[-1].text == done.text
    assert chunks[-1].raw["usage"] == done.raw["usage"]
    assert llm.chat([ChatMessage(role="user", content=QUESTION)]).message.content == done.text
    assert llm.chat([{"role": "user", "content": QUESTION}]).message.content == done.text
    assert (await llm.acomplete(QUESTION)).text == done.text
    pieces = [c.delta async for c in await llm.astream_complete(QUESTION)]
    assert "".join(pieces) == done.text
    achat = await llm.achat(MESSAGES)
    streamed = [c async for c in await llm.astream_chat(MESSAGES)]
    assert streamed[-1].message.content == achat.message.content
    assert achat.message.content == llm.chat(MESSAGES).message.content
    assert "".join(c.delta for c in streamed) == achat.message.content


def test_system_prompt_and_formatted_completion(tiny_members):
    plain = EnsembleLLM(ensemble=Ensemble(tiny_members, "token"), max_new_tokens=4)
    tutor = EnsembleLLM(
        ensemble=Ensemble(tiny_members, "token"), max_new_tokens=4, system_prompt="Be brief."
    )
    with_system = tutor.complete(QUESTION).raw["stats"]["prompt_tokens"]
    without = plain.complete(QUESTION).raw["stats"]["prompt_tokens"]
    assert all(with_system[name] > without[name] for name in without)
    # formatted=True: the text is already the prompt, read as it is (no template, no system)
    raw = tutor.complete(QUESTION, formatted=True).raw["stats"]["prompt_tokens"]
    assert raw == {m.name: len(m.tokenizer(QUESTION).input_ids) for m in tiny_members}


def test_metadata_reports_the_smallest_window(tmp_path, tiny_dirs):
    short = random_model(MODEL_ORDER[1], tmp_path / "short", max_positions=320)
    llm = EnsembleLLM(models=[tiny_dirs[MODEL_ORDER[0]], short], device="cpu", max_new_tokens=33)
    meta = llm.metadata
    assert meta.context_window == 320 and meta.num_output == 33
    assert meta.is_chat_model and meta.is_function_calling_model
    assert meta.model_name == f"ensemble-safe:{MODEL_ORDER[0]}+short"


def test_usage_is_reported_in_raw_and_counted_by_token_counting_handler(llm):
    counter = TokenCountingHandler()
    llm.callback_manager = CallbackManager([counter])
    try:
        reply = llm.chat(MESSAGES)
        last = list(llm.stream_chat(MESSAGES))[-1]
        done = llm.complete(QUESTION)
    finally:
        llm.callback_manager = CallbackManager([])
    for response in (reply, last, done):
        usage, stats = response.raw["usage"], response.raw["stats"]
        first = next(iter(stats["prompt_tokens"].values()))  # the drafter's tokenization
        assert usage["prompt_tokens"] == first == response.raw["ensemble"]["input_tokens"]
        assert usage["completion_tokens"] == stats["tokens"] == response.raw["ensemble"]["tokens"]
        assert usage["total_tokens"] == first + stats["tokens"]
    assert counter.prompt_llm_token_count == sum(
        r.raw["usage"]["prompt_tokens"] for r in (reply, last, done)
    )
    assert counter.completion_llm_token_count == sum(
        r.raw["usage"]["completion_tokens"] for r in (reply, last, done)
    )


def test_ensemble_events_reach_a_root_handler_inside_the_llm_span(tiny_members, recorder):
    seen = []
    llm = EnsembleLLM(
        ensemble=Ensemble(tiny_members, "token"), max_new_tokens=6, on_event=seen.append
    )
    with instrument_tags({"session": "s1"}):
        response = llm.chat(MESSAGES)
    events = recorder.of(EnsembleTokenEvent)
    assert len(events) == len(seen) == response.raw["stats"]["ensembled_tokens"] > 0
    [start] = recorder.of(LLMChatStartEvent)
    assert {e.span_id for e in events} == {start.span_id}
    assert start.span_id.startswith("EnsembleLLM.chat")
    assert all(e.tags.get("session") == "s1" for e in events)
    assert [e.data for e in events] == [e.to_dict() for e in seen]
    assert response.raw["events"] == [e.to_dict() for e in seen]

    recorder.events.clear()
    chunks = list(llm.stream_complete(QUESTION))
    [start] = recorder.of(LLMCompletionStartEvent)
    streamed = recorder.of(EnsembleTokenEvent)
    assert streamed and {e.span_id for e in streamed} == {start.span_id}
    assert sum(len(c.raw["events"]) for c in chunks) == len(streamed)


async def test_async_events_carry_the_span(tiny_members, recorder):
    llm = EnsembleLLM(ensemble=Ensemble(tiny_members, "token"), max_new_tokens=6)
    chunks = [c async for c in await llm.astream_chat(MESSAGES)]
    [start] = recorder.of(LLMChatStartEvent)
    events = recorder.of(EnsembleTokenEvent)
    assert len(events) == chunks[-1].raw["stats"]["ensembled_tokens"] > 0
    assert {e.span_id for e in events} == {start.span_id}


async def test_async_errors_are_forwarded_and_the_llm_stays_usable(tmp_path):
    small = random_model(MODEL_ORDER[0], tmp_path / "small", max_positions=64)
    llm = EnsembleLLM(models=[small], method="single", device="cpu", max_new_tokens=4)
    too_long = [ChatMessage(role="user", content="apples " * 200)]
    with pytest.raises(ContextWindowError, match="context window"):
        async for _ in await llm.astream_chat(too_long):
            pass
    with pytest.raises(ContextWindowError):
        await llm.achat(too_long)
    assert (await llm.acomplete("hi")).raw["usage"]["completion_tokens"] > 0


def test_loading_is_lazy_and_shared(tiny_dirs, monkeypatch):
    loads = []
    original = Ensemble.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        loads.append(args)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Ensemble, "from_pretrained", classmethod(spy))
    paths = [tiny_dirs[name] for name in MODEL_ORDER[:2]]
    a = EnsembleLLM(models=paths, device="cpu")
    b = EnsembleLLM(models=paths, device="cpu", max_new_tokens=7)  # generation settings differ
    assert loads == []  # constructing loads nothing
    assert a.ensemble is b.ensemble and len(loads) == 1
    other = EnsembleLLM(models=paths, device="cpu", method="single")
    assert other.ensemble is not a.ensemble and len(loads) == 2


def test_bad_inputs_fail_with_clear_errors(llm, tiny_dirs, tiny_members):
    with pytest.raises(InvalidConfigError, match="unknown keyword argument 'max_lenght'"):
        llm.complete(QUESTION, max_lenght=5)
    with pytest.raises(InvalidConfigError, match="models is empty"):
        EnsembleLLM(models=[])
    with pytest.raises(InvalidConfigError, match="unknown method 'best'"):
        EnsembleLLM(models=list(tiny_dirs.values()), method="best")
    with pytest.raises(InvalidConfigError, match="unknown option"):
        EnsembleLLM(models=list(tiny_dirs.values()), method_options={"drafter_k": 2})
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        EnsembleLLM(models=["./no/such/model", tiny_dirs[MODEL_ORDER[0]]])
    with pytest.raises(InvalidConfigError, match="max_new_tokens"):
        EnsembleLLM(models=list(tiny_dirs.values()), max_new_tokens=0)
    with pytest.raises(InvalidConfigError, match="device has 2 entries for 3 models"):
        EnsembleLLM(models=list(tiny_dirs.values()), device=["cpu", "cpu"])
    with pytest.raises(InvalidConfigError, match="not both"):
        EnsembleLLM(ensemble=Ensemble(tiny_members, "token"), models=["x"])
    image = ChatMessage(
        role="user", blocks=[TextBlock(text="what is this?"), ImageBlock(url="http://x/y.png")]
    )
    with pytest.raises(InvalidMessagesError, match="ImageBlock"):
        llm.chat([image])
    with pytest.raises(InvalidMessagesError, match="takes a prompt string"):
        llm.complete(["a list"])
    with pytest.raises(InvalidMessagesError, match="messages is empty"):
        llm.chat([])


def test_stop_strings_default_and_per_call(tiny_members):
    llm = EnsembleLLM(ensemble=Ensemble(tiny_members[:1], "single"), max_new_tokens=20)
    full = llm.complete(QUESTION).text
    assert len(full) > 3
    stop = full[2:4]
    cut = full[: full.find(stop)]
    assert llm.complete(QUESTION, stop=[stop]).text == cut
    stopping = EnsembleLLM(
        ensemble=Ensemble(tiny_members[:1], "single"), max_new_tokens=20, stop=[stop]
    )
    chunks = list(stopping.stream_complete(QUESTION))
    assert chunks[-1].text == cut and chunks[-1].raw["finish_reason"] == "stop"
    assert stopping.complete(QUESTION, stop=None).text == full  # per call replaces
