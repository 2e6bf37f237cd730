"""Committed response text -> what a delta shows: the content, and the tool calls.

The ensemble commits one text. With tools, that text holds call regions in the canonical syntax
(`core.tool_calls`): they are cut out of the content and handed over whole, as parsed calls, when
they close. Stop strings (`core.stops`) apply to the content only, never inside a call, and not to
an answer constrained by a `response_format` (a stop string must not cut a JSON value).
"""

from __future__ import annotations

from collections.abc import Sequence

from .config import GenerationConfig
from .stops import StopFilter
from .tool_calls import InvalidToolCall, ToolCall, ToolCallStream


class ResponseSplitter:
    """Splits the committed text, as it grows, into the content a delta shows (cut at the first
    stop string) and the tool calls that closed."""

    def __init__(self, config: GenerationConfig, member_stops: Sequence[str] = ()) -> None:
        """`member_stops`: the members' own stop strings (`Local.stop`), which end the content
        as the request's do."""
        offered = [tool.name for tool in config.tools]
        self.calls = ToolCallStream(offered) if config.calls_tools else None
        stops = () if config.response_format is not None else (*config.stop, *member_stops)
        self.stops = StopFilter(stops)

    @property
    def stop_string_found(self) -> bool:
        """A stop string ended the content."""
        return self.stops.found

    @property
    def in_call(self) -> bool:
        return self.calls is not None and self.calls.in_call

    def feed(self, text: str) -> tuple[str, list[ToolCall | InvalidToolCall]]:
        """The content that is safe to show now, and the calls that closed."""
        calls: list[ToolCall | InvalidToolCall] = []
        if self.calls is not None:
            text, calls = self.calls.feed(text)
        return self.stops.feed(text), calls

    def finish(self) -> tuple[str, list[ToolCall | InvalidToolCall]]:
        """What was held back; a call cut off by the end becomes an `InvalidToolCall`."""
        calls: list[ToolCall | InvalidToolCall] = []
        text = ""
        if self.calls is not None:
            text, calls = self.calls.finish()
        content = self.stops.feed(text)
        if not self.stops.found:
            content += self.stops.flush()
        return content, calls
