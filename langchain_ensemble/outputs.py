"""Engine deltas -> LangChain chunks; invoke's result is those same chunks added together.

LangChain adds streamed chunks together: strings concatenate, lists append, usage numbers sum.
So `model_name`, `finish_reason`, the `ensemble` summary and the usage (input tokens included)
go on the LAST chunk only, and `aggregate` (what `invoke` returns) is the aggregated stream. Usage:
`input_tokens` is `Stats.input_tokens` (the prompt in the first active member's tokenization:
the drafter's for SAFE, the chosen member's for `single`; every member's count is in
`response_metadata["ensemble"]["prompt_tokens"]`); `output_tokens` is `Stats.tokens` (output
tokens in the committed tokenization, a final stop token included).

Tool calls arrive whole (the engine parses a call when its region closes), each as one
`tool_call_chunk` with its own `index`, so the added-up stream holds the same `tool_calls` as
invoke. A call the response could not finish (cut by max_tokens) goes out as the text the model
wrote, opening tag included: LangChain re-reads every chunk's args with a partial-JSON parser,
which would turn a truncated `{"a": 1` into a plausible call; the tagged text never parses, so
the call stays in `invalid_tool_calls` (and `finish_reason` says "length").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import ToolCallChunk, tool_call_chunk
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from core.config import Delta, Stats
from core.ensemble import Ensemble
from core.integration import ResponseRecord
from core.tool_calls import TOOL_CALL_OPEN, InvalidToolCall, ToolCall

TRACE_KEY = "ensemble_events"  # per-chunk trace in generation_info (opt-in)


def usage_metadata(stats: Stats) -> UsageMetadata:
    n_in, n_out = int(stats.input_tokens), int(stats.tokens)
    return UsageMetadata(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


def tool_call_chunks(
    calls: Sequence[ToolCall | InvalidToolCall], first_index: int
) -> list[ToolCallChunk]:
    """The engine's whole calls as LangChain chunks, numbered from `first_index` on."""
    chunks = []
    for index, call in enumerate(calls, first_index):
        if isinstance(call, ToolCall):
            args = json.dumps(call.arguments, ensure_ascii=False)
        else:  # the text as written: never parsed into a call (see the module docstring)
            args = TOOL_CALL_OPEN + call.arguments
        chunks.append(tool_call_chunk(name=call.name, args=args, id=call.id, index=index))
    return chunks


class ChunkBuilder:
    """One request's LangChain chunks, made as its deltas arrive (what the request did so far is
    kept in a `core.integration.ResponseRecord`); `aggregate` adds them up for invoke."""

    def __init__(self, model_name: str, ensemble: Ensemble, traced: frozenset[str] | None):
        self.model_name = model_name
        self.traced = traced  # event names put in the per-chunk trace; None = no trace
        self.record = ResponseRecord(ensemble)

    def chunk(self, delta: Delta) -> ChatGenerationChunk | None:
        """The chunk to stream for a delta, or None when it carries nothing to show."""
        calls = tool_call_chunks(delta.tool_calls, self.record.n_calls)
        self.record.add(delta)
        final = delta.finish_reason is not None
        info = self._trace(delta, final)
        if final:
            message = AIMessageChunk(
                content=delta.text,
                tool_call_chunks=calls,
                usage_metadata=usage_metadata(delta.stats),
                response_metadata={
                    "model_name": self.model_name,
                    "finish_reason": delta.finish_reason,
                    "ensemble": self.record.summary,
                },
                chunk_position="last",
            )
            return ChatGenerationChunk(message=message, generation_info=info)
        if not delta.text and not calls and info is None:
            return None
        message = AIMessageChunk(content=delta.text, tool_call_chunks=calls)
        return ChatGenerationChunk(message=message, generation_info=info)

    def _trace(self, delta: Delta, final: bool) -> dict | None:
        """The chunk's generation_info when tracing (the last chunk always has the key)."""
        if self.traced is None:
            return None
        trace = [e.to_dict() for e in delta.events if e.name in self.traced]
        return {TRACE_KEY: trace} if trace or final else None


def aggregate(chunks: Iterable[ChatGenerationChunk], model_name: str) -> ChatResult:
    """invoke's result: the streamed chunks added together exactly as LangChain adds a stream
    (text concatenated, the trace lists joined, usage and metadata from the last chunk)."""
    result = generate_from_stream(iter(chunks))
    result.llm_output = {"model_name": model_name}
    return result
