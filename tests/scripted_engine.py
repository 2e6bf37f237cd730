"""A scripted engine for the adapters' tool tests: an `Ensemble` whose `stream` plays a canned
response (in the canonical tool-call syntax) through the core's own tool-call parser, and
records every request's messages and config. The adapters' conversions are then checked exactly,
whatever tiny random models would write."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from core import Delta, Ensemble, GenerationConfig, Stats
from core.tool_calls import ToolCall, ToolCallStream, format_tool_call


def call_text(name: str, arguments: dict) -> str:
    return format_tool_call(name, arguments)


class ScriptedEnsemble(Ensemble):
    """Answers every request with `reply` (or `reply(messages)`), streamed in pieces of `piece`
    characters; `cut`: the reply ends at max tokens (finish_reason "length")."""

    def __init__(
        self, members, reply: str | Callable[[list], str] = "", cut: bool = False, piece: int = 7
    ) -> None:
        super().__init__(list(members), "single")
        self.reply, self.cut, self.piece = reply, cut, piece
        self.requests: list[tuple[list, GenerationConfig]] = []

    @property
    def last_config(self) -> GenerationConfig:
        return self.requests[-1][1]

    @property
    def last_messages(self) -> list:
        return self.requests[-1][0]

    def stream(self, messages, config=None, on_event=None) -> Iterator[Delta]:
        self.requests.append((messages, config))
        return self._play(self.reply(messages) if callable(self.reply) else self.reply)

    def _play(self, reply: str) -> Iterator[Delta]:
        parser = ToolCallStream()
        made: list = []
        for start in range(0, len(reply), self.piece):
            text, calls = parser.feed(reply[start : start + self.piece])
            made += calls
            yield Delta(text=text, tool_calls=tuple(calls))
        text, calls = parser.finish()
        made += calls
        if self.cut:
            finish = "length"
        else:
            finish = "tool_calls" if any(isinstance(c, ToolCall) for c in made) else "stop"
        stats = Stats(tokens=max(1, len(reply) // 4), prompt_tokens={"m": 5})
        yield Delta(text=text, tool_calls=tuple(calls), finish_reason=finish, stats=stats)
