"""EnsembleLLM: several local Hugging Face models answering as one LlamaIndex LLM.

Wiring only, no algorithm: messages are mapped to the core's form (each member renders them with
its own chat template), the core `Ensemble` generates, its deltas become LlamaIndex responses,
and its events become instrumentation events. Those are dispatched by the consumer of the
response (in its context, so `instrument_tags` apply) with the span id of the LLM call, next to
LlamaIndex's own `LLMChatInProgressEvent`s. Loading, the model name and a call's settings come
from the adapter kit both adapters share (`core.integration`). The async methods run the engine
on a worker thread (`core.concurrency.iterate_in_thread`), so the event loop keeps running while
models compute.

A `FunctionCallingLLM`: tools, tool_choice and structured output go to the engine, whose grammar
enforces them in every method; calls come back as `ToolCallBlock`s in the same one request path.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Sequence
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
from core.integration import (
    ALIASES,
    LOADING_FIELDS,
    EnsembleHandle,
    EnsembleSettings,
    ResponseRecord,
    generation_config,
    option_fields,
    wrapped_fields,
)
from core.local import Local
from core.options import option_values
from core.penalties import SETTINGS as PENALTY_SETTINGS
from core.remote import Remote
from core.sources import model_sources, public_sources
from core.tool_calls import ToolCall

from .events import to_instrumentation
from .messages import completion_messages, to_core_messages
from .responses import chat_response, collected, completion_response, raw_info
from .structured import structured_kwargs, structured_result
from .tools import tool_call_blocks, tool_selections, tool_specs

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

dispatcher = get_dispatcher(__name__)

_GENERATION = (
    "max_new_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    *PENALTY_SETTINGS,
)
# Per-call tool settings (chat_with_tools, structured_predict), passed to the engine, which
# checks them; `tool_required=True` is tool_choice "required" unless a tool_choice is given.
_TOOL_SETTINGS = ("tools", "tool_choice", "parallel_tool_calls", "response_format")

MakeResponse = Callable[[str, str | None, dict[str, Any], list[ToolCall]], Any]
EnsembleOptionFields = option_fields()  # a field per ensemble option: device, max_queue, ...


class EnsembleLLM(FunctionCallingLLM, EnsembleOptionFields):
    """Several local causal LMs (different tokenizers welcome), ensembled at inference time, as
    one LlamaIndex chat LLM.

    Setup:
        The models are local directories, GGUF files or hub ids (a `Local(path, chat_template=...,
        stop=...)` where one needs options of its own), or `Remote(...)` members served by vLLM;
        `core.testbed.model_paths()` gives three tiny shipped ones that run offline on CPU.
        Construction checks the paths and loads nothing: the first request loads the models,
        once per configuration (`models`, `method`, `method_options` and the ensemble options)
        for every instance. `ensemble=` wraps an `Ensemble` you built yourself.

    Key init args:
        models: the members; SAFE drafts with the member trusted most (the first while all are
            trusted alike) unless its `drafter` option names one.
        method: "safe" | "specem" | "token" | "rerank" | "single"; method_options: its options.
        every ensemble option (`core.options`): device, dtype and names (one for all, or one
            per member), on_member_failure, max_concurrency, learn_weights, ...
        max_new_tokens, temperature, top_p, seed, stop, frequency_penalty, presence_penalty:
            generation settings (greedy, no penalty by default), each overridable per call
            (`complete(..., temperature=0.7)`).
        on_event: called with every core event as it happens.

    Instantiate:
        ```python
        llm = EnsembleLLM(models=core.testbed.model_paths(), method="safe")
        llm = EnsembleLLM(ensemble=Ensemble.from_pretrained([...], method="specem"))
        Settings.llm = llm  # llama_index.core.Settings
        ```

    Invoke:
        ```python
        llm.complete("Tom has 3 apples. He buys 2 more. How many apples does Tom have now?")
        llm.chat([ChatMessage(role="user", content="...")])
        ```
        Each member renders the messages with its own chat template (never LlamaIndex's
        generic `messages_to_prompt`); `complete` is one user turn. `complete(text,
        formatted=True)` says the text is already in the form the model reads: every member
        gets it as it is, with no chat template (`GenerationConfig.raw_prompt`), as
        LlamaIndex's local-model LLMs (HuggingFaceLLM, LlamaCPP) pass a formatted prompt on.

    Stream:
        ```python
        for response in llm.stream_chat(messages):
            print(response.delta, end="")
        ```
        `achat`/`astream_chat`/`acomplete`/`astream_complete` run the engine on a worker thread:
        the event loop keeps running, and concurrent requests share one engine.

    Tools:
        `chat_with_tools(tools, user_msg=..., tool_required=..., tool_choice=...)` (and its
        async and streaming forms, which `FunctionAgent` calls), or `chat(messages, tools=[...],
        tool_choice=..., tool_required=..., parallel_tool_calls=...)`; calls are
        `ToolCallBlock`s in the response message, and `get_tool_calls_from_response` reads
        them. The engine's grammar keeps each call valid for its tool's schema.

    Structured output:
        `structured_predict(Model, prompt)` (and its async and streaming forms) constrains the
        answer to the model's JSON schema; `response_format=` per call does the same for chat
        and complete.

    Events:
        What the method did arrives as `llama_index.core.instrumentation` events
        (`llamaindex_ensemble.EnsembleEvent` and one subclass per core event) on the root
        dispatcher, within the LLM call's span; each response's `raw["events"]` holds its
        chunk's events, the last one `raw["usage"]`, `raw["stats"]` and the request summary
        under `raw["ensemble"]` (`core.summary.request_summary`).
    """

    models: list[str | Local | Remote] = Field(**LOADING_FIELDS["models"])
    method: str = Field(**LOADING_FIELDS["method"])
    method_options: dict[str, Any] = Field(**LOADING_FIELDS["method_options"])
    max_new_tokens: int = Field(default=256, description="Output tokens per call (num_output).")
    temperature: float = Field(default=0.0, description="0 = greedy.")
    top_p: float = Field(default=1.0, description="Nucleus sampling when temperature > 0.")
    seed: int | None = Field(default=None, description="Makes sampling reproducible.")
    stop: list[str] | None = Field(
        default=None, description="Stop strings (cut before the first; per-call `stop` replaces)."
    )
    frequency_penalty: float = Field(
        default=0.0, description="OpenAI's (-2..2): each member lowers its repeated tokens."
    )
    presence_penalty: float = Field(
        default=0.0, description="OpenAI's (-2..2): each member lowers tokens already written."
    )
    on_event: Callable[[Event], None] | None = Field(
        default=None, exclude=True, description="Called with every core event, as it happens."
    )

    _handle: EnsembleHandle = PrivateAttr(default_factory=EnsembleHandle)

    @field_serializer("models")
    def _models_without_credentials(self, models: list[str | Local | Remote]) -> list[str | dict]:
        return public_sources(models)  # keys stay out of to_dict, to_json and saved configs

    def __init__(self, *, ensemble: Ensemble | None = None, **data: Any) -> None:
        if data.get("models") is not None:
            data["models"] = model_sources(data["models"])
        if ensemble is not None:
            data.update(wrapped_fields(ensemble, data, "ensemble="))
        super().__init__(**data)
        self._handle = EnsembleHandle(ensemble)
        if ensemble is None:  # a wrong path fails now; loading waits for first use
            self._settings.check("EnsembleLLM(ensemble=...)")
        self._call_config({})  # bad defaults fail here, not at the first call

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleLLM"

    @property
    def _settings(self) -> EnsembleSettings:
        return EnsembleSettings(self.models, self.method, self.method_options, option_values(self))

    @property
    def ensemble(self) -> Ensemble:
        """The core Ensemble (loaded on first use, shared between same-configuration LLMs)."""
        return self._handle.get(self._settings)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(
            context_window=self.ensemble.context_window,  # prompts must fit every member
            num_output=self.max_new_tokens,
            is_chat_model=True,
            is_function_calling_model=True,
            model_name=self._settings.label,
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

    def _prompt(self, prompt: str, formatted: bool) -> list[dict[str, str]] | str:
        """What `complete` sends: one user turn (after `completion_to_prompt`, with the
        system prompt), or with `formatted=True` the text itself, which the engine gives every
        member as it is, with no chat template (a string is a raw prompt here)."""
        if formatted:
            return prompt
        return completion_messages(self.completion_to_prompt(prompt), self.system_prompt)

    def _call_config(
        self, kwargs: dict[str, Any], chat: bool = True, raw: bool = False
    ) -> GenerationConfig:
        """The call's one GenerationConfig: the instance's settings, overridden by the call's
        keyword arguments (`chat=False`: `complete`, which takes no tools; `raw`: the prompt
        is raw text)."""
        call = dict(kwargs)
        unknown = [k for k in call if ALIASES.get(k, k) not in (*_GENERATION, *_TOOL_SETTINGS)]
        unknown = [k for k in unknown if k != "tool_required"]
        if unknown:
            accepted = ", ".join(sorted([*_GENERATION, *ALIASES, *_TOOL_SETTINGS]))
            raise InvalidConfigError(
                f"unknown keyword argument {unknown[0]!r} for EnsembleLLM; per-call settings "
                f"are: {accepted}, tool_required."
            )
        required = call.pop("tool_required", False)
        if not isinstance(required, bool):
            raise InvalidConfigError(f"tool_required must be True or False, got {required!r}.")
        if required and call.get("tool_choice") is None:
            call["tool_choice"] = "required"
        if call.get("tools") is not None:
            if not chat:
                raise InvalidConfigError(
                    "complete() returns text only, so it takes no tools; call chat() or "
                    "chat_with_tools() to get ToolCallBlocks back."
                )
            call["tools"] = tool_specs(call["tools"])
        defaults = {name: getattr(self, name) for name in _GENERATION}
        return generation_config(defaults, {**call, "raw_prompt": raw or None})

    def _start(
        self, messages: list[dict[str, Any]] | str, kwargs: dict, chat: bool = True
    ) -> tuple[Iterator[Delta], Any]:
        """Validate and set up the request now (bad input fails at the call, not at the first
        chunk) and remember the LLM call's span for the events dispatched later. A string is
        a raw prompt (`complete(..., formatted=True)`)."""
        config = self._call_config(kwargs, chat, raw=isinstance(messages, str))
        deltas = self.ensemble.stream(messages, config, on_event=self.on_event)
        return deltas, active_span_id.get()

    async def _astart(
        self, messages: list[dict[str, Any]] | str, kwargs: dict, chat: bool = True
    ) -> tuple[AsyncIterator[Delta], Any]:
        await self._handle.aget(self._settings)  # a first load (seconds): off the event loop
        deltas, span = self._start(messages, kwargs, chat)
        return iterate_in_thread(deltas), span

    # One request path: `_responses` turns deltas into streamed responses (`_respond` is the
    # per-delta step, shared by sync and async), and the non-streaming calls return those same
    # responses added up (`responses.collected`).

    def _respond(self, delta: Delta, span: Any, make: MakeResponse, record: ResponseRecord) -> Any:
        """Dispatch a delta's events (in the consumer's context, within the LLM call's span)
        and build its streamed response."""
        for event in delta.events:
            dispatcher.event(to_instrumentation(event, span, self._settings.label))
        record.add(delta)
        raw = raw_info(delta.events, delta, record.summary, record.invalid_calls)
        return make(record.text, delta.text, raw, list(record.calls))

    def _responses(self, deltas: Iterator[Delta], span: Any, make: MakeResponse) -> Iterator:
        record = ResponseRecord(self.ensemble)
        try:
            for delta in deltas:
                yield self._respond(delta, span, make, record)
        finally:
            deltas.close()  # a consumer that stops early frees the engine at once

    async def _aresponses(
        self, deltas: AsyncIterator[Delta], span: Any, make: MakeResponse
    ) -> AsyncIterator:
        record = ResponseRecord(self.ensemble)
        try:
            async for delta in deltas:
                yield self._respond(delta, span, make, record)
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
            "tools": tool_specs(tools),
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
    # One path: `_structured_request` starts it (the start event, the prompt's messages, chat's
    # arguments with the schema as response_format); each entry point then runs the chat call
    # LlamaIndex names it after, and `_structured_answer` (or the partial objects) reads the
    # answer back. With `pydantic_program_mode` other than DEFAULT, LlamaIndex's own programs run.

    @property
    def _llamaindex_programs(self) -> bool:
        return self.pydantic_program_mode != PydanticProgramMode.DEFAULT

    @dispatcher.span
    def structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        """An instance of `output_cls`: the answer is constrained to its JSON schema."""
        if self._llamaindex_programs:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        return self._structured_answer(output_cls, self.chat(messages, **kwargs))

    @dispatcher.span
    async def astructured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> BaseModel:
        if self._llamaindex_programs:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        return self._structured_answer(output_cls, await self.achat(messages, **kwargs))

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
        if self._llamaindex_programs:
            return super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        return self._partial_objects(output_cls, self.stream_chat(messages, **kwargs))

    @dispatcher.span
    async def astream_structured_predict(
        self,
        output_cls: type[BaseModel],
        prompt: BasePromptTemplate,
        llm_kwargs: dict[str, Any] | None = None,
        **prompt_args: Any,
    ) -> AsyncGenerator[BaseModel, None]:
        if self._llamaindex_programs:
            return await super().astream_structured_predict(
                output_cls, prompt, llm_kwargs, **prompt_args
            )
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        responses = await self.astream_chat(messages, **kwargs)
        return self._apartial_objects(output_cls, responses)

    def _structured_request(
        self, output_cls: type, prompt: Any, llm_kwargs: dict | None, prompt_args: dict
    ) -> tuple[list[ChatMessage], dict[str, Any]]:
        start = LLMStructuredPredictStartEvent(
            output_cls=output_cls, template=prompt, template_args=prompt_args
        )
        dispatcher.event(start)
        kwargs = structured_kwargs(output_cls, llm_kwargs)
        return self._get_messages(prompt, **prompt_args), kwargs

    def _structured_answer(self, output_cls: type[BaseModel], response: ChatResponse) -> BaseModel:
        result = structured_result(output_cls, response)
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

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
