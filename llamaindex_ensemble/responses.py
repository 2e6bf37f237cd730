"""Core deltas -> LlamaIndex responses, and what goes into `raw`; a non-streaming call's
response is the streamed ones added up (`collected`).

`raw["usage"]` is where `TokenCountingHandler` looks first (keys `prompt_tokens` and
`completion_tokens`); it rides on the last chunk of a stream (the one LlamaIndex reports at the
end of the call) and on every non-streamed response. `raw["events"]` carries the core events of
the chunk as dicts, so consumers that see only the response stream (a workflow agent's
`AgentStream.raw`) still see what the ensemble did. `raw["ensemble"]` is the request summary
LangChain puts in `response_metadata["ensemble"]` (`core.summary.request_summary`).

Tool calls are `ToolCallBlock`s after the text in the assistant message, each streamed response
holding the calls so far (as it holds the text so far). A call the answer could not finish (cut
by max_new_tokens) is no block an agent could run: it is in the final `raw["invalid_tool_calls"]`
with the reason, and `raw["finish_reason"]` is "length".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    MessageRole,
    TextBlock,
)

from core import Delta
from core.events import Event
from core.tool_calls import InvalidToolCall, ToolCall

from .tools import tool_call_block


def raw_info(
    shown: Sequence[Event],
    last: Delta,
    ensemble: dict[str, Any] | None,
    invalid: Sequence[InvalidToolCall] = (),
) -> dict:
    """`shown`: this chunk's events; `ensemble`: the request summary and `invalid`: the calls
    that could not be read (final chunk only)."""
    raw: dict[str, Any] = {"events": [event.to_dict() for event in shown]}
    if last.stats is not None:  # the request is over
        raw.update(
            usage=last.stats.usage(),
            finish_reason=last.finish_reason,
            stats=last.stats.to_dict(),
            ensemble=ensemble,
            invalid_tool_calls=[call.to_dict() for call in invalid],
        )
    return raw


def chat_response(
    text: str, delta: str | None, raw: dict[str, Any], calls: Sequence[ToolCall]
) -> ChatResponse:
    blocks = [TextBlock(text=text), *(tool_call_block(call) for call in calls)]
    message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
    return ChatResponse(message=message, delta=delta, raw=raw)


def completion_response(
    text: str, delta: str | None, raw: dict[str, Any], calls: Sequence[ToolCall]
) -> CompletionResponse:
    """`complete` takes no tools (`EnsembleLLM` refuses them there), so `calls` is empty."""
    return CompletionResponse(text=text, delta=delta, raw=raw)


def collected(responses: Iterable[Any]) -> Any:
    """A non-streaming call's response: the stream added up. The last response already holds
    the whole text and the request's usage; it gets no `delta` and every chunk's events."""
    events, last = [], None
    for response in responses:
        events.extend(response.raw["events"])
        last = response
    return last.model_copy(update={"delta": None, "raw": {**last.raw, "events": events}})
