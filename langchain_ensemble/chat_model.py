"""`ChatEnsemble`: several local Hugging Face causal LMs answering as one LangChain chat model.

The class only wires LangChain to the engine (`core.Ensemble`): message conversion is in
`messages.py`, chunks and usage in `outputs.py`, custom events in `events.py`, tools and schemas
in `tools.py` and `structured.py`; loading, the model name and a call's settings come from the
adapter kit both adapters share (`core.integration`), and so does a field for every ensemble
option (`core.options`). Construction is cheap (nothing loads); the first request loads the
models, and every instance with the same models, method and options uses one engine.
"""

from __future__ import annotations

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
from core.integration import (
    LOADING_FIELDS,
    EnsembleHandle,
    EnsembleSettings,
    generation_config,
    option_fields,
    wrapped_fields,
)
from core.local import Local
from core.options import option_values
from core.penalties import SETTINGS as PENALTY_SETTINGS
from core.remote import Remote
from core.sources import model_sources, public_sources

from .events import AsyncEventForwarder, EventForwarder, selected_events
from .messages import to_core_messages
from .outputs import ChunkBuilder, aggregate
from .structured import structured_binding, structured_runnable
from .tools import one_per_name, tool_specs

# Per-call keyword arguments (invoke(..., temperature=0.7), .bind(seed=1)), by LangChain's names.
_CALL_SETTINGS = (
    "temperature",
    "max_tokens",
    "top_p",
    "seed",
    *PENALTY_SETTINGS,
)
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

EnsembleOptionFields = option_fields()  # a field per ensemble option: device, max_queue, ...


class ChatEnsemble(BaseChatModel, EnsembleOptionFields):
    """Several local causal LMs (different tokenizers welcome), ensembled at inference time, as
    one LangChain chat model.

    Setup:
        The models are local directories, GGUF files or hub ids (a `Local(path, chat_template=...,
        stop=...)` where one needs options of its own), or `Remote(...)` members served by vLLM;
        `core.testbed.model_paths()` gives three tiny shipped ones that run offline on CPU.
        Construction loads nothing: the first request loads the models, once per configuration
        (`models`, `method`, `method_options` and the ensemble options) for every instance.

    Key init args:
        models: the members; SAFE drafts with the member trusted most (the first while all are
            trusted alike) unless its `drafter` option names one.
        method: "safe" | "specem" | "token" | "rerank" | "single"; method_options: its options.
        every ensemble option (`core.options`): device, dtype and names (one for all, or one
            per member), on_member_failure, max_concurrency, learn_weights, ...
        temperature, top_p, seed, max_tokens, stop, frequency_penalty, presence_penalty:
            generation settings (greedy, no penalty by default), each overridable per call
            (`invoke(..., temperature=0.7)`, `.bind(seed=1)`).
        ensemble_events, event_trace, on_event: where ensemble events go (see Events).

    Instantiate:
        ```python
        chat = ChatEnsemble(models=["path/or/hub-id-A", "path/or/hub-id-B"], method="safe")
        chat = ChatEnsemble.from_ensemble(Ensemble.from_pretrained([...], method="specem"))
        ```

    Invoke:
        ```python
        message = chat.invoke("Tom has 7 apples. He buys 5 more. How many?")
        message.content, message.usage_metadata, message.response_metadata["ensemble"]
        ```

    Stream:
        ```python
        for chunk in chat.stream("..."):  # real streaming; stops never partially streamed
            print(chunk.content, end="")
        ```
        `ainvoke`/`astream`/`abatch` run the engine on a worker thread: the event loop keeps
        running, and concurrent requests share one engine.

    Tool calling:
        ```python
        chat.bind_tools([add, subtract], tool_choice="any").invoke("What is 7 + 5?").tool_calls
        ```
        Every tool kind LangChain knows; the engine's grammar keeps each call well-formed and
        valid for its tool's schema, in every method.

    Structured output:
        ```python
        chat.with_structured_output(Answer).invoke("...")  # an Answer instance
        ```
        method="json_schema" (default), "function_calling" or "json_mode", all constrained.

    Events:
        What the method did (ensemble points, segment winners, weights, tool calls, grammar-forced
        text) arrives as LangChain custom events named `ensemble.<event>` (a handler's
        `on_custom_event` on invoke; `on_custom_event` in a chain's
        `astream_events(version="v2")`), per chunk in `response_metadata["ensemble_events"]`
        with `event_trace=True`, and at `on_event`. `langchain_ensemble.events` says which
        channel works where.

    Token usage and metadata:
        `usage_metadata` is always set: `input_tokens` counts the prompt in the leading active
        member's tokenization (`Ensemble.prompt_tokenizer`: SAFE's drafter; every member's count
        is in `response_metadata["ensemble"]["prompt_tokens"]`), `output_tokens` the response in
        the committed tokenization; `get_num_tokens` counts with the same tokenizer.
        `response_metadata` carries `model_name`, `finish_reason` and the request summary
        under "ensemble" (`core.summary.request_summary`).
    """

    model_config = ConfigDict(populate_by_name=True)

    models: list[str | Local | Remote] = Field(**LOADING_FIELDS["models"])
    method: str = Field(**LOADING_FIELDS["method"])
    method_options: dict[str, Any] = Field(**LOADING_FIELDS["method_options"])

    model_name: str = Field(default="", alias="model", description="Reported model name.")
    temperature: float | None = Field(default=None, description="0 or None: greedy.")
    top_p: float | None = None
    seed: int | None = Field(default=None, description="Makes sampling reproducible.")
    max_tokens: int | None = Field(default=None, description="Output tokens (default 256).")
    frequency_penalty: float | None = Field(
        default=None, description="OpenAI's (-2..2): each member lowers its repeated tokens."
    )
    presence_penalty: float | None = Field(
        default=None, description="OpenAI's (-2..2): each member lowers tokens already written."
    )
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

    _handle: EnsembleHandle = PrivateAttr(default_factory=EnsembleHandle)

    # --- construction (cheap: validates, loads nothing) -------------------------------------

    @field_validator("models", mode="before")
    @classmethod
    def _model_list(cls, value: Any) -> list[str | Local | Remote]:
        return model_sources(value)

    @field_serializer("models")
    def _models_without_credentials(self, models: list[str | Local | Remote]) -> list[str | dict]:
        return public_sources(models)  # keys stay out of dumps, traces and saved configs

    @model_validator(mode="after")
    def _check(self) -> ChatEnsemble:
        # a wrong path fails at the first call, which loads (construction loads nothing)
        self._settings.check("ChatEnsemble.from_ensemble(ensemble)", sources=False)
        selected_events(self.ensemble_events)
        self._call_config(None, {})  # temperature, top_p, max_tokens, stop: checked now
        if not self.model_name:
            self.model_name = self._settings.label
        return self

    @classmethod
    def from_ensemble(cls, ensemble: Ensemble, **kwargs: Any) -> ChatEnsemble:
        """Wrap an engine built by hand (`Ensemble(...)`, `Ensemble.from_pretrained(...)`)."""
        fields = wrapped_fields(ensemble, kwargs, "ChatEnsemble.from_ensemble(ensemble)")
        chat = cls(**fields, **kwargs)
        chat._handle = EnsembleHandle(ensemble)
        return chat

    @property
    def _settings(self) -> EnsembleSettings:
        return EnsembleSettings(self.models, self.method, self.method_options, option_values(self))

    @property
    def ensemble(self) -> Ensemble:
        """The engine (loaded on first use): `member_weights`, `save_weights()`, members,
        `summary()`."""
        return self._handle.get(self._settings)

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
            **option_values(self),
            **{name: getattr(self, name) for name in (*_CALL_SETTINGS, "stop")},
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
        tokenizer = self.ensemble.prompt_tokenizer
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # --- requests -----------------------------------------------------------------------------

    def _call_config(self, stop: Sequence[str] | None, kwargs: dict[str, Any]) -> GenerationConfig:
        """The call's one GenerationConfig: the instance's settings, overridden by the call's
        `stop` and keyword arguments."""
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
        strict = kwargs.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise InvalidConfigError(f"strict must be True, False or None, got {strict!r}.")
        call = {k: kwargs[k] for k in (*_CALL_SETTINGS, *_TOOL_SETTINGS) if k in kwargs}
        if call.get("tools") is not None:  # any tool kind LangChain knows, also per call
            call["tools"] = tool_specs(call["tools"], strict)
        if stop is not None:
            call["stop"] = stop
        defaults = {name: getattr(self, name) for name in (*_CALL_SETTINGS, "stop")}
        n = call.get("max_tokens", self.max_tokens)
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n <= 0):
            raise InvalidConfigError(f"max_tokens must be a positive integer, got {n!r}.")
        return generation_config(defaults, call)

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
        bound: dict[str, Any] = {"tools": tool_specs(tools, strict), **kwargs}
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
        if "tools" in per_call:
            per_call["tools"] = one_per_name(tool_specs(per_call["tools"]))
        self._call_config(None, per_call)
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
        bound = self._bind_checked(**structured_binding(schema, method, strict, kwargs))
        return structured_runnable(bound, schema, method, include_raw)

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
        self, ensemble: Ensemble, messages: list[BaseMessage], config: GenerationConfig
    ) -> tuple[Iterator[Delta], ChunkBuilder]:
        traced = selected_events(self.ensemble_events) if self.event_trace else None
        deltas = ensemble.stream(to_core_messages(messages), config, on_event=self.on_event)
        return deltas, ChunkBuilder(self.model_name, ensemble, traced)

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
        config = self._call_config(stop, kwargs)  # bad arguments fail before anything loads
        deltas, builder = self._request(self.ensemble, messages, config)
        try:
            for delta in deltas:
                forward(delta.events)
                chunk = builder.chunk(delta)
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
        config = self._call_config(stop, kwargs)
        ensemble = await self._handle.aget(self._settings)  # a first load: off the event loop
        deltas, builder = self._request(ensemble, messages, config)
        deltas = iterate_in_thread(deltas)
        try:
            async for delta in deltas:
                await forward(delta.events)
                chunk = builder.chunk(delta)
                if chunk is not None:
                    if announce is not None:
                        await announce.on_llm_new_token(chunk.text, chunk=chunk)
                    yield chunk
        finally:
            await deltas.aclose()

    @property
    def _wanted(self) -> frozenset[str]:
        return selected_events(self.ensemble_events)
