"""EnsembleLLM: several local Hugging Face models answering as one LlamaIndex LLM.

Wiring only, no algorithm: messages are mapped to the core's form (each member renders them with
its own chat template), the core `Ensemble` generates, its deltas become LlamaIndex responses,
and its events become instrumentation events. Those are dispatched by the consumer of the
response (in its context, so `instrument_tags` apply) with the span id of the LLM call, next to
LlamaIndex's own `LLMChatInProgressEvent`s. The async methods run the engine on a worker thread
(`core.concurrency.iterate_in_thread`), so the event loop keeps running while models compute.

A `FunctionCallingLLM`: tools, tool_choice and structured output go to the engine, whose grammar
enforces them in every method; calls come back as `ToolCallBlock`s in the same one request path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    ToolCallBlock,
)
from llama_index.core.bridge.pydantic import BaseModel, Field, PrivateAttr, field_serializer
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.llm import (
    LLMStructuredPredictEndEvent,
    LLMStructuredPredictInProgressEvent,
    LLMStructuredPredictStartEvent,
)
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.program.utils import process_streaming_objects
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode

from core import Delta, Ensemble, GenerationConfig, InvalidConfigError
from core.concurrency import iterate_in_thread
from core.events import Event
from core.loading import check_model_source
from core.methods import DEFAULT_METHOD, METHOD_NAMES, check_method
from core.remote import Remote, source_label
from core.shared import shared_ensemble
from core.sources import model_sources, public_sources
from core.summary import request_summary
from core.tools import InvalidToolCall, ToolCall

from .events import to_instrumentation
from .messages import completion_messages, to_core_messages
from .responses import chat_response, collected, completion_response, raw_info
from .structured import structured_kwargs, structured_result
from .tools import openai_tools, tool_call_blocks, tool_selections

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

dispatcher = get_dispatcher(__name__)

_GENERATION = ("max_new_tokens", "temperature", "top_p", "seed", "stop")
_ALIASES = {"max_tokens": "max_new_tokens"}  # what LlamaIndex users often pass per call
# Per-call tool settings (chat_with_tools, structured_predict), passed to the engine, which
# checks them; `tool_required=True` is tool_choice "required" unless a tool_choice is given.
_TOOL_SETTINGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")
_LOADING = ("models", "method", "method_options", "device", "dtype", "names")

MakeResponse = Callable[[str, str | None, dict[str, Any], list[ToolCall]], Any]


@dataclass
class _SoFar:
    """A request's text, tool calls and events up to the current delta."""

    text: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    invalid: list[InvalidToolCall] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


class EnsembleLLM(FunctionCallingLLM):
    """Local models of different tokenizers, ensembled at inference time, as one chat LLM.

    >>> llm = EnsembleLLM(models=core.testbed.model_paths(), method="safe")
    >>> llm.complete("Tom has 3 apples. He buys 2 more. How many apples does Tom have now?")

    Models load on first use (not at construction) and are shared by every EnsembleLLM with
    the same loading configuration. `ensemble=` wraps an `Ensemble` you built yourself.

    Tools: `chat_with_tools(tools, user_msg=..., tool_required=..., tool_choice=...)` (and its
    async and streaming forms, which `FunctionAgent` calls), or `chat(messages, tools=[...],
    tool_choice=..., tool_required=..., parallel_tool_calls=...)`; calls are `ToolCallBlock`s
    in the response message. `structured_predict(Model, prompt)` constrains the answer to the
    model's JSON schema (`response_format=` per call does the same for chat and complete).
    """

    models: list[str | Remote] = Field(
        default_factory=list,
        description="Local model directories, hub ids, or Remote(...) members served by vLLM "
        "(SAFE drafts with the most trusted: the first while all are trusted alike).",
    )
    method: str = Field(default=DEFAULT_METHOD, description=" | ".join(METHOD_NAMES))
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

    @field_serializer("models")
    def _models_without_credentials(self, models: list[str | Remote]) -> list[str | dict]:
        return public_sources(models)  # keys stay out of to_dict, to_json and saved configs

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
            is_function_calling_model=True,
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
        deltas, span = self._start(self._prompt(prompt, formatted), kwargs, chat=False)
        return collected(self._responses(deltas, span, completion_response))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        deltas, span = self._start(self._prompt(prompt, formatted), kwargs, chat=False)
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
        deltas, span = await self._astart(self._prompt(prompt, formatted), kwargs, chat=False)
        return collected([r async for r in self._aresponses(deltas, span, completion_response)])

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        deltas, span = await self._astart(self._prompt(prompt, formatted), kwargs, chat=False)
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

    def _generation(self, overrides: dict[str, Any], chat: bool = True) -> GenerationConfig:
        settings: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "stop": tuple(self.stop or ()),
        }
        tooling: dict[str, Any] = {}
        for key, value in overrides.items():
            name = _ALIASES.get(key, key)
            if name in _TOOL_SETTINGS or name == "tool_required":
                tooling[name] = value
                continue
            if name not in settings:
                accepted = ", ".join(sorted([*_GENERATION, *_ALIASES, *_TOOL_SETTINGS]))
                raise InvalidConfigError(
                    f"unknown keyword argument {key!r} for EnsembleLLM; per-call settings are: "
                    f"{accepted}, tool_required."
                )
            settings[name] = value
        return GenerationConfig(**settings, **self._tool_settings(tooling, chat))

    @staticmethod
    def _tool_settings(tooling: dict[str, Any], chat: bool) -> dict[str, Any]:
        required = tooling.pop("tool_required", False)
        if not isinstance(required, bool):
            raise InvalidConfigError(f"tool_required must be True or False, got {required!r}.")
        if required and tooling.get("tool_choice") is None:
            tooling["tool_choice"] = "required"
        tooling = {k: v for k, v in tooling.items() if v is not None}
        if "tools" in tooling:
            if not chat:
                raise InvalidConfigError(
                    "complete() returns text only, so it takes no tools; call chat() or "
                    "chat_with_tools() to get ToolCallBlocks back."
                )
            tooling["tools"] = openai_tools(tooling["tools"])
        return tooling

    def _start(
        self, messages: list[dict[str, Any]], kwargs: dict, chat: bool = True
    ) -> tuple[Iterator[Delta], Any]:
        """Validate and set up the request now (bad input fails at the call, not at the first
        chunk) and remember the LLM call's span for the events dispatched later."""
        config = self._generation(kwargs, chat)
        deltas = self.engine.stream(messages, config, on_event=self.on_event)
        return deltas, active_span_id.get()

    async def _astart(
        self, messages: list[dict[str, Any]], kwargs: dict, chat: bool = True
    ) -> tuple[AsyncIterator[Delta], Any]:
        if self._engine is None:  # loading takes seconds: not on the event loop
            await asyncio.to_thread(lambda: self.engine)
        deltas, span = self._start(messages, kwargs, chat)
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
        for call in delta.tool_calls:
            (so_far.calls if isinstance(call, ToolCall) else so_far.invalid).append(call)
        ensemble = None
        if delta.stats is not None:  # the last delta: the request's summary
            ensemble = request_summary(self.engine.summary(), delta.stats, so_far.events)
        raw = raw_info(delta.events, delta, ensemble, so_far.invalid)
        return make(so_far.text, delta.text, raw, list(so_far.calls))

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

    # --- tools (FunctionCallingLLM) ----------------------------------------------------------

    def _prepare_chat_with_tools(
        self,
        tools: Sequence[BaseTool],
        user_msg: str | ChatMessage | None = None,
        chat_history: list[ChatMessage] | None = None,
        verbose: bool = False,
        allow_parallel_tool_calls: bool = False,
        tool_required: bool = False,
        tool_choice: str | dict | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """`chat`'s arguments for `chat_with_tools` & co: the history, the user's message, the
        tools as OpenAI dicts, and tool_choice ("auto", "none", "required" or a tool name;
        `tool_required=True` means "required" unless a tool_choice is given)."""
        messages = list(chat_history or [])
        if isinstance(user_msg, str):
            user_msg = ChatMessage(role=MessageRole.USER, content=user_msg)
        if user_msg is not None:
            messages.append(user_msg)
        return {
            "messages": messages,
            "tools": openai_tools(tools),
            "tool_choice": tool_choice,
            "tool_required": tool_required,
            "parallel_tool_calls": allow_parallel_tool_calls,
            **kwargs,
        }

    def _validate_chat_with_tools_response(
        self,
        response: ChatResponse,
        tools: Sequence[BaseTool],
        allow_parallel_tool_calls: bool = False,
        **kwargs: Any,
    ) -> ChatResponse:
        """Without parallel calls, one call: the engine's grammar already allows only one; this
        keeps the first for a response built elsewhere (LlamaIndex's own rule)."""
        calls = tool_call_blocks(response)
        if not allow_parallel_tool_calls and len(calls) > 1:
            kept = [b for b in response.message.blocks if not isinstance(b, ToolCallBlock)]
            response.message.blocks = [*kept, calls[0]]
        return response

    def get_tool_calls_from_response(
        self, response: ChatResponse, error_on_no_tool_call: bool = True, **kwargs: Any
    ) -> list[ToolSelection]:
        """The response's `ToolCallBlock`s as `ToolSelection`s (tool_id: the call's id)."""
        selections = tool_selections(response)
        if not selections and error_on_no_tool_call:
            invalid = (response.raw or {}).get("invalid_tool_calls") or []
            why = f": {invalid[0]['error']}" if invalid else ""
            raise ValueError(f"Expected at least one tool call, but got 0 tool calls{why}.")
        return selections

    # --- structured output: the output class's JSON schema as the grammar -------------------

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """An instance of `output_cls`: the answer is constrained to its JSON schema (with
        `pydantic_program_mode` other than DEFAULT, LlamaIndex's own programs run instead)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        self._structured_start(output_cls, prompt, prompt_args)
        messages = self._get_messages(prompt, **prompt_args)
        response = self.chat(messages, **structured_kwargs(output_cls, llm_kwargs))
        result = structured_result(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        self._structured_start(output_cls, prompt, prompt_args)
        messages = self._get_messages(prompt, **prompt_args)
        response = await self.achat(messages, **structured_kwargs(output_cls, llm_kwargs))
        result = structured_result(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    def stream_structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> Generator[BaseModel, None, None]:
        """Partial objects as the JSON grows (LlamaIndex's `FlexibleModel`s), then the
        validated instance."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        self._structured_start(output_cls, prompt, prompt_args)
        messages = self._get_messages(prompt, **prompt_args)
        responses = self.stream_chat(messages, **structured_kwargs(output_cls, llm_kwargs))
        return self._partial_objects(output_cls, responses)

    @dispatcher.span
    async def astream_structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[BaseModel, None]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astream_structured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        self._structured_start(output_cls, prompt, prompt_args)
        messages = self._get_messages(prompt, **prompt_args)
        responses = await self.astream_chat(messages, **structured_kwargs(output_cls, llm_kwargs))
        return self._apartial_objects(output_cls, responses)

    def _structured_start(self, output_cls: type, prompt: Any, prompt_args: dict) -> None:
        start = LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args
        )
        dispatcher.event(start)

    def _partial_object(self, output_cls: type[BaseModel], response: ChatResponse, so_far: list):
        """The object so far: the validated instance on the last response, else LlamaIndex's
        partial parse (kept in `so_far`, which it reads to never go back to fewer fields)."""
        if response.raw.get("finish_reason") is not None:
            result = structured_result(output_cls, response)
        else:
            result = process_streaming_objects(
                response, output_cls, cur_objects=so_far or None, flexible_mode=True, llm=self
            )
        so_far[:] = [result]
        dispatcher.event(LLMStructuredPredictInProgressEvent(output=result))
        return result

    def _partial_objects(
        self, output_cls: type[BaseModel], responses: Iterator[ChatResponse]
    ) -> Generator[BaseModel, None, None]:
        so_far: list = []
        for response in responses:
            yield self._partial_object(output_cls, response, so_far)
        dispatcher.event(LLMStructuredPredictEndEvent(output=so_far[-1] if so_far else None))

    async def _apartial_objects(
        self, output_cls: type[BaseModel], responses: AsyncIterator[ChatResponse]
    ) -> AsyncGenerator[BaseModel, None]:
        so_far: list = []
        async for response in responses:
            yield self._partial_object(output_cls, response, so_far)
        dispatcher.event(LLMStructuredPredictEndEvent(output=so_far[-1] if so_far else None))
