"""Engine deltas -> LangChain chunks and results, identically for invoke and stream.

LangChain adds streamed chunks together: strings concatenate, lists append, usage numbers sum.
So `model_name`, `finish_reason`, the `ensemble` summary and the usage (input tokens included)
go on the LAST chunk only, and the aggregated stream equals what `invoke` returns. Usage:
`input_tokens` is `Stats.input_tokens` (the prompt in the first active member's tokenization:
the drafter's for SAFE, the chosen member's for `single`; every member's count is in
`response_metadata["ensemble"]["prompt_tokens"]`); `output_tokens` is `Stats.tokens` (output
tokens in the committed tokenization, a final stop token included).
"""

from __future__ import annotations

from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult

from core.config import Delta, Stats
from core.events import Event
from core.summary import request_summary

TRACE_KEY = "ensemble_events"  # per-chunk trace in generation_info (opt-in)


def usage_metadata(stats: Stats) -> UsageMetadata:
    n_in, n_out = int(stats.input_tokens), int(stats.tokens)
    return UsageMetadata(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


class Turn:
    """One request's output as it arrives: text pieces, events, and the final numbers."""

    def __init__(self, model_name: str, method_summary: dict, traced: frozenset[str] | None):
        self.model_name = model_name
        self.method_summary = method_summary
        self.traced = traced  # event names put in the per-chunk trace; None = no trace
        self.parts: list[str] = []
        self.events: list[Event] = []
        self.trace: list[dict] = []
        self.last: Delta | None = None

    def add(self, delta: Delta) -> dict | None:
        """Record a delta; returns its generation_info (the trace) when tracing."""
        self.parts.append(delta.text)
        self.events.extend(delta.events)
        if delta.finish_reason is not None:
            self.last = delta
        if self.traced is None:
            return None
        trace = [e.to_dict() for e in delta.events if e.name in self.traced]
        self.trace.extend(trace)
        final = delta.finish_reason is not None  # the last chunk always has the key
        return {TRACE_KEY: trace} if trace or final else None

    def final_metadata(self) -> dict:
        stats = self.last.stats
        return {
            "model_name": self.model_name,
            "finish_reason": self.last.finish_reason,
            "ensemble": request_summary(self.method_summary, stats, self.events),
        }

    def chunk(self, delta: Delta) -> ChatGenerationChunk | None:
        """The chunk to stream for a delta, or None when it carries nothing to show."""
        info = self.add(delta)
        if delta.finish_reason is not None:
            message = AIMessageChunk(
                content=delta.text,
                usage_metadata=usage_metadata(delta.stats),
                response_metadata=self.final_metadata(),
                chunk_position="last",
            )
            return ChatGenerationChunk(message=message, generation_info=info)
        if not delta.text and info is None:
            return None
        return ChatGenerationChunk(message=AIMessageChunk(content=delta.text), generation_info=info)

    def result(self) -> ChatResult:
        message = AIMessage(
            content="".join(self.parts),
            usage_metadata=usage_metadata(self.last.stats),
            response_metadata=self.final_metadata(),
        )
        info = {TRACE_KEY: self.trace} if self.traced is not None else None
        return ChatResult(
            generations=[ChatGeneration(message=message, generation_info=info)],
            llm_output={"model_name": self.model_name},
        )
