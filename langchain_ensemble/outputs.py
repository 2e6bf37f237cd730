"""Engine deltas -> LangChain chunks; invoke's result is those same chunks added together.

LangChain adds streamed chunks together: strings concatenate, lists append, usage numbers sum.
So `model_name`, `finish_reason`, the `ensemble` summary and the usage (input tokens included)
go on the LAST chunk only, and `aggregate` (what `invoke` returns) is the aggregated stream. Usage:
`input_tokens` is `Stats.input_tokens` (the prompt in the first active member's tokenization:
the drafter's for SAFE, the chosen member's for `single`; every member's count is in
`response_metadata["ensemble"]["prompt_tokens"]`); `output_tokens` is `Stats.tokens` (output
tokens in the committed tokenization, a final stop token included).
"""

from __future__ import annotations

from collections.abc import Iterable

from langchain_core.language_models.chat_models import generate_from_stream
from langchain_core.messages import AIMessageChunk
from langchain_core.messages.ai import UsageMetadata
from langchain_core.outputs import ChatGenerationChunk, ChatResult

from core.config import Delta, Stats
from core.events import Event
from core.summary import request_summary

TRACE_KEY = "ensemble_events"  # per-chunk trace in generation_info (opt-in)


def usage_metadata(stats: Stats) -> UsageMetadata:
    n_in, n_out = int(stats.input_tokens), int(stats.tokens)
    return UsageMetadata(input_tokens=n_in, output_tokens=n_out, total_tokens=n_in + n_out)


class Turn:
    """One request's chunks as its deltas arrive; `aggregate` adds them up for invoke."""

    def __init__(self, model_name: str, method_summary: dict, traced: frozenset[str] | None):
        self.model_name = model_name
        self.method_summary = method_summary
        self.traced = traced  # event names put in the per-chunk trace; None = no trace
        self.events: list[Event] = []  # the request's events so far, for the final summary

    def chunk(self, delta: Delta) -> ChatGenerationChunk | None:
        """The chunk to stream for a delta, or None when it carries nothing to show."""
        self.events.extend(delta.events)
        final = delta.finish_reason is not None
        info = self._trace(delta, final)
        if final:
            message = AIMessageChunk(
                content=delta.text,
                usage_metadata=usage_metadata(delta.stats),
                response_metadata=self._final_metadata(delta),
                chunk_position="last",
            )
            return ChatGenerationChunk(message=message, generation_info=info)
        if not delta.text and info is None:
            return None
        return ChatGenerationChunk(message=AIMessageChunk(content=delta.text), generation_info=info)

    def _trace(self, delta: Delta, final: bool) -> dict | None:
        """The chunk's generation_info when tracing (the last chunk always has the key)."""
        if self.traced is None:
            return None
        trace = [e.to_dict() for e in delta.events if e.name in self.traced]
        return {TRACE_KEY: trace} if trace or final else None

    def _final_metadata(self, last: Delta) -> dict:
        return {
            "model_name": self.model_name,
            "finish_reason": last.finish_reason,
            "ensemble": request_summary(self.method_summary, last.stats, self.events),
        }


def aggregate(chunks: Iterable[ChatGenerationChunk], model_name: str) -> ChatResult:
    """invoke's result: the streamed chunks added together exactly as LangChain adds a stream
    (text concatenated, the trace lists joined, usage and metadata from the last chunk)."""
    result = generate_from_stream(iter(chunks))
    result.llm_output = {"model_name": model_name}
    return result
