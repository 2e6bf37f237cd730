"""`ChatEnsemble`: several local Hugging Face causal LMs answering as one LangChain chat model.

The class only wires LangChain to the engine (`core.Ensemble`): message conversion is in
`messages.py`, chunks and usage in `outputs.py`, custom events in `events.py`, tools and schemas
in `tools.py` and `structured.py`. Construction is cheap (nothing loads); the first request
loads the models through `core.shared.shared_ensemble`, so every instance with the same models,
method, options, device and dtype uses one engine (and one lock: `batch` and concurrent calls
on shared members run one at a time).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
from langchain_core.language_models.model_profile import ModelProfile
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from pydantic import (
    ConfigDict,
    Field,
    PrivateAttr,
    field_serializer,
    field_validator,
    model_validator,
)

from core.concurrency import iterate_in_thread
from core.config import Delta, GenerationConfig
from core.ensemble import Ensemble
from core.errors import InvalidConfigError
from core.events import Event
from core.methods import DEFAULT_METHOD, METHOD_NAMES, check_method
from core.remote import Remote, source_label
from core.shared import shared_ensemble
from core.sources import model_sources, public_sources

from .events import AsyncEventForwarder, EventForwarder, selected_events
from .messages import to_engine_messages
from .outputs import Turn, aggregate
from .structured import structured_output
from .tools import one_per_name, openai_tools

# Per-call keyword arguments (invoke(..., temperature=0.7), .bind(seed=1)) -> GenerationConfig.
_CALL_SETTINGS = {
    "temperature": "temperature",
    "max_tokens": "max_new_tokens",
    "top_p": "top_p",
    "seed": "seed",
}
# Per-call tool settings (bind_tools, create_agent's response_format), passed to the engine,
# which checks them; `strict` shapes the tools' schemas as they are converted.
_TOOL_SETTINGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
_FRAMEWORK_KWARGS = {"stream"}  # set by LangChain itself; the streaming choice is already made
_ACCEPTED = {*_CALL_SETTINGS, *_TOOL_SETTINGS, "strict", "model", *_FRAMEWORK_KWARGS}
# What a model can do, for `model.profile` (create_agent reads "structured_output" to send a
# response_format rather than an extra tool).
_PROFILE = ModelProfile(
    text_inputs=True,
    text_outputs=True,
    image_inputs=False,
    audio_inputs=False,
    video_inputs=False,
    pdf_inputs=False,
    tool_calling=True,
    tool_choice=True,
    tool_call_streaming=True,
    structured_output=True,
)


class ChatEnsemble(BaseChatModel):
    """Ensemble several local causal LMs (different tokenizers welcome) at inference time.

    ```python
    chat = ChatEnsemble(models=["path/or/hub-id-A", "path/or/hub-id-B"], method="safe")
    chat.invoke("Tom has 7 apples ...")           # AIMessage, with usage and an "ensemble" summary
    for chunk in chat.stream("..."): ...            # real streaming; stops never partially streamed
    ```

    Ensemble events (what the method did: ensemble points, segment winners, weights) arrive as
    LangChain custom events named `ensemble.<event>` (a handler's `on_custom_event` on invoke;
    `on_custom_event` in a chain's `astream_events(version="v2")`), per chunk in
    `response_metadata["ensemble_events"]` with `event_trace=True`, and at the engine's
    `on_event` callback. See `langchain_ensemble.events` for which channel works where.

    `usage_metadata` is always set: `input_tokens` counts the prompt in the first active
    member's tokenization (the drafter's for SAFE; every member's count is in
    `response_metadata["ensemble"]["prompt_tokens"]`), `output_tokens` the response in the
    committed tokenization. `get_num_tokens` counts with that same first member's tokenizer.
    """

    model_config = ConfigDict(populate_by_name=True)

    models: list[str | Remote] = Field(
        default_factory=list,
        description="Local model directories, hub ids, or Remote(...) members served by vLLM "
        "(a dict of Remote's fields works too). SAFE: the most trusted drafts (the first "
        "while all are trusted alike).",
    )
    method: str = Field(default=DEFAULT_METHOD, description=" | ".join(METHOD_NAMES))
    method_options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword options of the method, e.g. {'drafter': 0} or {'top_k': 10}.",
    )
    device: str | list[str] = Field(default="auto", description="One for all, or per member.")
    dtype: str | list[str] = Field(default="auto", description="One for all, or per member.")

    model_name: str = Field(default="", alias="model", description="Reported model name.")
    temperature: float | None = Field(default=None, description="0 or None: greedy.")
    top_p: float | None = None
    seed: int | None = Field(default=None, description="Makes sampling reproducible.")
    max_tokens: int | None = Field(default=None, description="Output tokens (default 256).")
    stop: list[str] | None = Field(default=None, alias="stop_sequences")
    streaming: bool = False

    ensemble_events: bool | list[str] = Field(
        default=True,
        description="Which ensemble events to send as LangChain custom events and in the "
        "trace: True (all), False (none) or a list of event names.",
    )
    event_trace: bool = Field(
        default=False,
        description="Also put each chunk's events in its generation_info / response_metadata "
        "under 'ensemble_events' (reaches every stream consumer; grows with the output).",
    )
    on_event: Callable[[Event], None] | None = Field(
        default=None,
        exclude=True,
        description="Called with every core event as it happens (on the engine's thread).",
    )

    _engine: Ensemble | None = PrivateAttr(default=None)

    # --- construction (cheap: validates, loads nothing) -------------------------------------

    @field_validator("models", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> list[str | Remote]:
        return model_sources(value)

    @field_serializer("models")
    def _models_without_credentials(self, models: list[str | Remote]) -> list[str | dict]:
        return public_sources(models)  # keys stay out of dumps, traces and saved configs

    @model_validator(mode="after")
    def _check(self) -> ChatEnsemble:
        if not self.models:
            raise InvalidConfigError(
                "ChatEnsemble needs models: pass models=[...] (local model directories or hub "
                "ids), or wrap a built engine with ChatEnsemble.from_ensemble(ensemble)."
            )
        check_method(self.method, len(self.models), self.method_options)
        selected_events(self.ensemble_events)
        self._config(None, {})  # temperature, top_p, max_tokens, stop: checked now, not later
        if not self.model_name:
            names = "+".join(source_label(m) for m in self.models)
            self.model_name = f"ensemble-{self.method}:{names}"
        return self

    @classmethod
    def from_ensemble(cls, ensemble: Ensemble, **kwargs: Any) -> ChatEnsemble:
        """Wrap an engine built by hand (`Ensemble(...)`, `Ensemble.from_pretrained(...)`)."""
        chat = cls(
            models=[m.name for m in ensemble.members],
            method=ensemble.method_name,
            method_options=ensemble.options,
            **kwargs,
        )
        chat._engine = ensemble
        return chat

    @property
    def ensemble(self) -> Ensemble:
        """The engine (loaded on first use): `member_weights`, `save_weights()`, members,
        `summary()`."""
        if self._engine is None:
            self._engine = shared_ensemble(
                self.models,
                self.method,
                device=self.device,
                dtype=self.dtype,
                **self.method_options,
            )
        return self._engine

    async def _aensemble(self) -> Ensemble:
        if self._engine is None:  # loading takes seconds: keep it off the event loop
            return await asyncio.to_thread(lambda: self.ensemble)
        return self._engine

    # --- LangChain metadata -------------------------------------------------------------------

    @property
    def _llm_type(self) -> str:
        return "llm-ensembling-chat"

    def _resolve_model_profile(self) -> ModelProfile:
        return ModelProfile(**_PROFILE)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        params = {
            "model_name": self.model_name,
            "models": list(self.models),
            "method": self.method,
            "method_options": self.method_options,
            "device": self.device,
            "dtype": self.dtype,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "stop": self.stop,
        }
        return json.loads(json.dumps(params, default=str))  # tracing needs plain JSON values

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = LangSmithParams(
            ls_provider="llm_ensembling",
            ls_model_name=str(kwargs.get("model") or self.model_name),
            ls_model_type="chat",
        )
        temperature = kwargs.get("temperature", self.temperature)
        if temperature is not None:
            params["ls_temperature"] = float(temperature)
        max_tokens = kwargs.get("max_tokens", self.max_tokens)
        if max_tokens is not None:
            params["ls_max_tokens"] = int(max_tokens)
        stops = stop if stop is not None else self.stop
        if stops:
            params["ls_stop"] = list(stops)
        return params

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids in the first active member's tokenizer, the one `input_tokens` counts in
        (LangChain's default would download GPT-2's tokenizer from the hub)."""
        if self.custom_get_token_ids is not None:
            return self.custom_get_token_ids(text)
        tokenizer = self.ensemble.method.active[0].tokenizer
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # --- requests -----------------------------------------------------------------------------

    def _config(self, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> GenerationConfig:
        """Instance settings, overridden by the call's `stop` and keyword arguments."""
        model = kwargs.get("model")
        if model is not None and model != self.model_name:
            raise InvalidConfigError(
                f"model={model!r} cannot switch an ensemble's models per call; build another "
                "ChatEnsemble(models=[...]) for other models."
            )
        unknown = sorted(set(kwargs) - _ACCEPTED)
        if unknown:
            raise InvalidConfigError(
                f"unknown argument(s) {', '.join(map(repr, unknown))} for ChatEnsemble; per "
                f"call it accepts stop, {', '.join(_CALL_SETTINGS)}, "
                f"{', '.join(_TOOL_SETTINGS)} and strict."
            )
        settings = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "top_p": self.top_p,
            "seed": self.seed,
        }
        settings.update({k: v for k, v in kwargs.items() if k in _CALL_SETTINGS})
        n = settings["max_tokens"]
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n <= 0):
            raise InvalidConfigError(f"max_tokens must be a positive integer, got {n!r}.")
        config = {_CALL_SETTINGS[k]: v for k, v in settings.items() if v is not None}
        config.update({k: kwargs[k] for k in _TOOL_SETTINGS if kwargs.get(k) is not None})
        strict = kwargs.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidConfigError(f"strict must be True, False or None, got {strict!r}.")
        if "tools" in config:  # any tool kind LangChain knows, also when passed per call
            config["tools"] = openai_tools(config["tools"], strict)
        stops = stop if stop is not None else self.stop
        return GenerationConfig(**config, stop=tuple(stops or ()))

    # --- tools and structured output ------------------------------------------------------

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable | Any],
        *,
        tool_choice: str | dict | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The model with tools bound: functions, `BaseTool`s, Pydantic models, TypedDicts,
        JSON schemas or OpenAI tool dicts.

        `tool_choice`: "auto" (default: the model decides), "none", "any" / "required" / True
        (at least one call), or a tool's name (or `{"type": "function", "function": {"name":
        ...}}`) to force that tool. `parallel_tool_calls=False`: at most one call per answer.
        `strict=True`: every argument required and no other key (OpenAI's strict mode). Other
        keyword arguments (a `response_format`, `max_tokens`, ...) are bound as well. Bad tools,
        a tool_choice naming no bound tool, or a schema the grammar cannot enforce raise
        `InvalidConfigError` here, not at the first call.
        """
        bound: dict[str, Any] = {"tools": openai_tools(tools, strict), **kwargs}
        if tool_choice is not None:
            bound["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            bound["parallel_tool_calls"] = parallel_tool_calls
        return self._bind_checked(**bound)

    def _bind_checked(self, **bound: Any) -> Runnable[LanguageModelInput, AIMessage]:
        """`bind`, with the settings checked now rather than at the first call (LangChain
        takes the tracing key out before the model sees the call's arguments). Two tools of
        one name are refused only when the model is called: binding without calling is what
        LangChain's standard suite does with a model and its schema under one name."""
        per_call = {k: v for k, v in bound.items() if k != "ls_structured_output_format"}
        if isinstance(per_call.get("tools"), list):
            per_call["tools"] = one_per_name(per_call["tools"])
        self._config(None, per_call)
        return self.bind(**bound)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        method: Literal["json_schema", "function_calling", "json_mode"] = "json_schema",
        include_raw: bool = False,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | Any]:
        """A runnable answering with an instance of `schema`: a Pydantic model (v2 or v1) gives
        instances, a TypedDict or JSON schema gives dicts.

        `method`: "json_schema" (the answer is the JSON, constrained to the schema),
        "function_calling" (the schema as a forced tool call), or "json_mode" (a JSON object;
        constrained to the schema too when one is given, which is stricter than OpenAI's
        json_mode). `include_raw=True` returns {"raw", "parsed", "parsing_error"}. The grammar
        keeps every answer to its schema, so `strict` changes nothing beyond
        function_calling's OpenAI strict-mode schema. A schema the grammar cannot enforce
        raises `InvalidConfigError` here.
        """
        return structured_output(self, schema, method, include_raw, strict, kwargs)

    # One request path: `_stream` turns the engine's deltas into chunks and `_generate` adds
    # those chunks up (`outputs.aggregate`), so invoke equals the aggregated stream by
    # construction. The async pair takes the same per-delta steps with the engine on a worker
    # thread (`core.concurrency.iterate_in_thread`).

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        forward = EventForwarder(self._wanted, run_manager)
        return aggregate(self._chunks(messages, stop, kwargs, forward), self.model_name)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        # Only stream_events(v3) passes a run manager here; it then hears each chunk as a token.
        forward = EventForwarder(self._wanted, run_manager)
        return self._chunks(messages, stop, kwargs, forward, run_manager)

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        forward = AsyncEventForwarder(self._wanted, run_manager)
        chunks = [chunk async for chunk in self._achunks(messages, stop, kwargs, forward)]
        return aggregate(chunks, self.model_name)

    def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        forward = AsyncEventForwarder(self._wanted, run_manager)
        return self._achunks(messages, stop, kwargs, forward, run_manager)

    def _request(
        self, engine: Ensemble, messages: list[BaseMessage], config: GenerationConfig
    ) -> tuple[Iterator[Delta], Turn]:
        traced = selected_events(self.ensemble_events) if self.event_trace else None
        deltas = engine.stream(to_engine_messages(messages), config, on_event=self.on_event)
        return deltas, Turn(self.model_name, engine.summary(), traced)

    def _chunks(
        self,
        messages: list[BaseMessage],
        stop: Sequence[str] | None,
        kwargs: dict[str, Any],
        forward: EventForwarder,
        announce: CallbackManagerForLLMRun | None = None,
    ) -> Iterator[ChatGenerationChunk]:
        """Per delta: its events out through `forward`, then its chunk (if it has one) to
        `announce` and the consumer."""
        config = self._config(stop, kwargs)  # bad arguments fail before anything loads
        deltas, turn = self._request(self.ensemble, messages, config)
        try:
            for delta in deltas:
                forward(delta.events)
                chunk = turn.chunk(delta)
                if chunk is not None:
                    if announce is not None:
                        announce.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        finally:
            deltas.close()  # a consumer that stops early or a callback that raises frees the engine

    async def _achunks(
        self,
        messages: list[BaseMessage],
        stop: Sequence[str] | None,
        kwargs: dict[str, Any],
        forward: AsyncEventForwarder,
        announce: AsyncCallbackManagerForLLMRun | None = None,
    ) -> AsyncIterator[ChatGenerationChunk]:
        """`_chunks` with the engine on a worker thread: the event loop keeps running."""
        config = self._config(stop, kwargs)
        deltas, turn = self._request(await self._aensemble(), messages, config)
        deltas = iterate_in_thread(deltas)
        try:
            async for delta in deltas:
                await forward(delta.events)
                chunk = turn.chunk(delta)
                if chunk is not None:
                    if announce is not None:
                        await announce.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        finally:
            await deltas.aclose()

    @property
    def _wanted(self) -> frozenset[str]:
        return selected_events(self.ensemble_events)
