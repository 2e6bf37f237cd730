"""EnsembleLLM: several local Hugging Face models answering as one LlamaIndex LLM.

Wiring only, no algorithm: messages are mapped to the core's form (each member renders them with
its own chat template), the core `Ensemble` generates, its deltas become LlamaIndex responses,
and its events become instrumentation events. Those are dispatched by the consumer of the
response (in its context, so `instrument_tags` apply) with the span id of the LLM call, next to
LlamaIndex's own `LLMChatInProgressEvent`s. The async methods run the engine on a worker thread
(`core.concurrency.iterate_in_thread`), so the event loop keeps running while models compute.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.custom import CustomLLM

from core import Delta, Ensemble, GenerationConfig, InvalidConfigError
from core.concurrency import iterate_in_thread
from core.events import Event
from core.loading import check_model_source
from core.methods import check_method
from core.remote import Remote, source_label
from core.shared import shared_ensemble
from core.sources import model_sources
from core.summary import request_summary

from .events import to_instrumentation
from .messages import completion_messages, to_core_messages
from .responses import chat_response, collected, completion_response, raw_info

dispatcher = get_dispatcher(__name__)

_GENERATION = ("max_new_tokens", "temperature", "top_p", "seed", "stop")
_ALIASES = {"max_tokens": "max_new_tokens"}  # what LlamaIndex users often pass per call
_LOADING = ("models", "method", "method_options", "device", "dtype", "names")

MakeResponse = Callable[[str, str | None, dict[str, Any]], Any]


@dataclass
class _SoFar:
    """A request's text and events up to the current delta."""

    text: str = ""
    events: list[Event] = field(default_factory=list)


class EnsembleLLM(CustomLLM):
    """Local models of different tokenizers, ensembled at inference time, as one chat LLM.

    >>> llm = EnsembleLLM(models=core.testbed.model_paths(), method="safe")
    >>> llm.complete("Tom has 3 apples. He buys 2 more. How many apples does Tom have now?")

    Models load on first use (not at construction) and are shared by every EnsembleLLM with
    the same loading configuration. `ensemble=` wraps an `Ensemble` you built yourself.
    """

    models: list[str | Remote] = Field(
        default_factory=list,
        description="Local model directories, hub ids, or Remote(...) members served by vLLM "
        "(SAFE drafts with the first).",
    )
    method: str = Field(default="safe", description="'safe' | 'specem' | 'token' | 'single'.")
    method_options: dict[str, Any] = Field(
        default_factory=dict, description="Options of the method, e.g. {'member': 1}."
    )
    device: str | list[str] = Field(default="auto", description="One device, or one per model.")
    dtype: str | list[str] = Field(default="auto", description="One dtype, or one per model.")
    names: list[str] | None = Field(default=None, description="Member names in events/stats.")
    max_new_tokens: int = Field(default=256, description="Output tokens per call (num_output).")
    temperature: float = Field(default=0.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, description="Nucleus sampling when temperature > 0.")
    seed: int | None = Field(default=None, description="Makes sampling reproducible.")
    stop: list[str] | None = Field(
        default=None, description="Stop strings (cut before the first; per-call `stop` replaces)."
    )
    on_event: Callable[[Event], None] | None = Field(
        default=None, exclude=True, description="Called with every core event, as it happens."
    )

    _engine: Ensemble | None = PrivateAttr(default=None)

    def __init__(self, *, ensemble: Ensemble | None = None, **data: Any) -> None:
        if data.get("models") is not None:
            data["models"] = model_sources(data["models"])
        if ensemble is not None:
            given = [k for k in _LOADING if k in data]
            if given:
                raise InvalidConfigError(
                    f"pass either ensemble= or {', '.join(given)}, not both: an Ensemble is "
                    "already loaded with its models and method."
                )
            data.update(
                models=[m.name for m in ensemble.members],
                method=ensemble.method_name,
                method_options=dict(ensemble.options),
            )
        super().__init__(**data)
        self._engine = ensemble
        if ensemble is None:
            if not self.models:
                raise InvalidConfigError(
                    "models is empty; pass local model directories or hub ids, e.g. "
                    "EnsembleLLM(models=core.testbed.model_paths()), or ensemble=Ensemble(...)."
                )
            check_method(self.method, len(self.models), self.method_options)  # before loading
            for model in self.models:  # a wrong path fails now; loading waits for first use
                if not isinstance(model, Remote):
                    check_model_source(model)
            for what in ("device", "dtype", "names"):
                value = getattr(self, what)
                if isinstance(value, list) and len(value) != len(self.models):
                    raise InvalidConfigError(
                        f"{what} has {len(value)} entries for {len(self.models)} models; pass "
                        "one per model, or a single value for all."
                    )
        self._generation({})  # bad defaults fail here, not at the first call

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleLLM"

    @property
    def engine(self) -> Ensemble:
        """The core Ensemble (loaded on first use, shared between same-configuration LLMs)."""
        if self._engine is None:
            self._engine = shared_ensemble(
                self.models,
                self.method,
                device=self.device,
                dtype=self.dtype,
                names=self.names,
                **self.method_options,
            )
        return self._engine

    @property
    def metadata(self) -> LLMMetadata:
        members = self.engine.method.active
        return LLMMetadata(
            context_window=min(m.context_window for m in members),  # prompts must fit them all
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=False,
            model_name=self._label(),
        )

    # --- LlamaIndex API ------------------------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        deltas, span = self._start(to_core_messages(messages), kwargs)
        return collected(self._responses(deltas, span, chat_response))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        deltas, span = self._start(to_core_messages(messages), kwargs)
        return self._responses(deltas, span, chat_response)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        deltas, span = self._start(self._prompt(prompt, formatted), kwargs)
        return collected(self._responses(deltas, span, completion_response))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        deltas, span = self._start(self._prompt(prompt, formatted), kwargs)
        return self._responses(deltas, span, completion_response)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        deltas, span = await self._astart(to_core_messages(messages), kwargs)
        return collected([r async for r in self._aresponses(deltas, span, chat_response)])

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        deltas, span = await self._astart(to_core_messages(messages), kwargs)
        return self._aresponses(deltas, span, chat_response)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        deltas, span = await self._astart(self._prompt(prompt, formatted), kwargs)
        return collected([r async for r in self._aresponses(deltas, span, completion_response)])

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        deltas, span = await self._astart(self._prompt(prompt, formatted), kwargs)
        return self._aresponses(deltas, span, completion_response)

    # --- wiring ----------------------------------------------------------------------------

    def _label(self) -> str:
        names = self.names or [source_label(m) for m in self.models]
        return f"ensemble-{self.method}:{'+'.join(names)}"

    def _prompt(self, prompt: str, formatted: bool) -> list[dict[str, str]]:
        """`formatted=True`: the caller already applied its prompt wrapping; the members' chat
        templates are applied either way (a raw prompt cannot suit three templates)."""
        if formatted:
            return completion_messages(prompt)
        return completion_messages(self.completion_to_prompt(prompt), self.system_prompt)

    def _generation(self, overrides: dict[str, Any]) -> GenerationConfig:
        settings: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": tuple(self.stop or ()),
        }
        for key, value in overrides.items():
            name = _ALIASES.get(key, key)
            if name not in settings:
                accepted = ", ".join(sorted([*_GENERATION, *_ALIASES]))
                raise InvalidConfigError(
                    f"unknown keyword argument {key!r} for EnsembleLLM; per-call settings are: "
                    f"{accepted}."
                )
            settings[name] = value
        return GenerationConfig(**settings)

    def _start(self, messages: list[dict[str, str]], kwargs: dict) -> tuple[Iterator[Delta], Any]:
        """Validate and set up the request now (bad input fails at the call, not at the first
        chunk) and remember the LLM call's span for the events dispatched later."""
        config = self._generation(kwargs)
        deltas = self.engine.stream(messages, config, on_event=self.on_event)
        return deltas, active_span_id.get()

    async def _astart(
        self, messages: list[dict[str, str]], kwargs: dict
    ) -> tuple[AsyncIterator[Delta], Any]:
        if self._engine is None:  # loading takes seconds: not on the event loop
            await asyncio.to_thread(lambda: self.engine)
        deltas, span = self._start(messages, kwargs)
        return iterate_in_thread(deltas), span

    # One request path: `_responses` turns deltas into streamed responses (`_respond` is the
    # per-delta step, shared by sync and async), and the non-streaming calls return those same
    # responses added up (`responses.collected`).

    def _respond(self, delta: Delta, span: Any, make: MakeResponse, so_far: _SoFar) -> Any:
        """Dispatch a delta's events (in the consumer's context, within the LLM call's span)
        and build its streamed response."""
        for event in delta.events:
            dispatcher.event(to_instrumentation(event, span, self._label()))
        so_far.text += delta.text
        so_far.events.extend(delta.events)
        ensemble = None
        if delta.stats is not None:  # the last delta: the request's summary
            ensemble = request_summary(self.engine.summary(), delta.stats, so_far.events)
        return make(so_far.text, delta.text, raw_info(delta.events, delta, ensemble))

    def _responses(self, deltas: Iterator[Delta], span: Any, make: MakeResponse) -> Iterator:
        so_far = _SoFar()
        try:
            for delta in deltas:
                yield self._respond(delta, span, make, so_far)
        finally:
            deltas.close()  # a consumer that stops early frees the engine at once

    async def _aresponses(
        self, deltas: AsyncIterator[Delta], span: Any, make: MakeResponse
    ) -> AsyncIterator:
        so_far = _SoFar()
        try:
            async for delta in deltas:
                yield self._respond(delta, span, make, so_far)
        finally:
            await deltas.aclose()
