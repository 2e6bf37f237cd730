"""The one tool-call syntax of the shared response text: how a call is written, and how calls
are read back out of the committed text.

Members of different families do not agree on how to write a tool call (Qwen: tags around JSON,
Llama 3: bare JSON with "parameters", Phi-3 and Gemma: none), so ensembling their text naively
would mix formats. The ensemble's text uses one canonical form, the most common trained one
(Hermes / Qwen style), one call per region, regions separated by a newline:

    <tool_call>
    {"name": "add", "arguments": {"a": 7, "b": 5}}
    </tool_call>

The JSON is written as `json.dumps` writes it (", " and ": " separators, non-ASCII kept), so the
grammar (`core.grammar`), the prompts that teach the form (`core.chat`) and the parser here agree
byte for byte. Calls are read back while the text streams (`ToolCallStream`) or whole
(`parse_tool_calls`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from .stops import partial_suffix

TOOL_CALL_OPEN = "<tool_call>\n"
TOOL_CALL_CLOSE = "\n</tool_call>"
TOOL_CALL_SEPARATOR = "\n"  # between two calls of one turn


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one call."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"


def format_tool_calls(calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The canonical text of several calls of one assistant turn."""
    return TOOL_CALL_SEPARATOR.join(format_tool_call(name, args) for name, args in calls)


# --------------------------------------------------------------------------------------------
# Reading the calls out of the committed text, while it streams.

TOOL_CALL_START = TOOL_CALL_OPEN.rstrip("\n")  # what opens a region, whatever whitespace follows
TOOL_CALL_END = TOOL_CALL_CLOSE.lstrip("\n")


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": copy.deepcopy(self.arguments)}


@dataclass(frozen=True)
class InvalidToolCall:
    """A call region that could not be read as a call (LangChain's `invalid_tool_calls`)."""

    id: str
    name: str | None
    arguments: str  # the raw text, for the user to see or repair
    error: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "error": self.error}


_NAME_IN_BROKEN_JSON = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


def _parse_call(body: str) -> ToolCall | InvalidToolCall:
    raw = body.strip()
    guessed = _NAME_IN_BROKEN_JSON.search(raw)
    name_hint = guessed.group(1) if guessed else None
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        return InvalidToolCall(
            new_call_id(),
            name_hint,
            raw,
            f"the call is not valid JSON ({error.msg} at {error.pos})",
        )
    if not isinstance(data, dict):
        return InvalidToolCall(
            new_call_id(),
            None,
            raw,
            'the call must be a JSON object {"name": ..., "arguments": ...}',
        )
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return InvalidToolCall(new_call_id(), None, raw, 'the call has no "name"')
    arguments = data.get("arguments", data.get("parameters", {}))  # Llama 3 says "parameters"
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return InvalidToolCall(new_call_id(), name, raw, '"arguments" must be a JSON object')
    return ToolCall(new_call_id(), name, arguments)


_JSON = json.JSONDecoder()


def _region_end(body: str) -> int:
    """Where the call region that `body` starts ends (the index of its closing tag), or -1 while
    it is still open. A call is one JSON object then the tag, so the object is read first: a
    string inside it may well contain the tag's text. Text that is not such an object ends at
    the first tag."""
    start = len(body) - len(body.lstrip())
    if not body.startswith("{", start):  # not a call: the first tag ends it
        return body.find(TOOL_CALL_END)
    try:
        _, after = _JSON.raw_decode(body, start)
    except json.JSONDecodeError as error:
        if error.pos >= len(body.rstrip()) or error.msg.startswith("Unterminated"):
            return -1  # the object is still being written
        return body.find(TOOL_CALL_END)
    close = len(body[after:]) - len(body[after:].lstrip())
    if body.startswith(TOOL_CALL_END, after + close):
        return after + close
    return body.find(TOOL_CALL_END, after)


class ToolCallStream:
    """Splits the committed response text, as it grows, into content and tool calls.

    `feed(text)` returns the content that is safe to show now and every call whose region
    closed. Content is the text outside `<tool_call>` ... `</tool_call>` regions; whitespace next
    to a region (the separators between calls) is not content. A suffix that could still become
    `<tool_call>`, and whitespace that could precede one, is held back until the next piece
    shows what it is (as `core.stops` does for stop strings). `finish()` flushes; a region that
    never closed (the response hit max_tokens) becomes an `InvalidToolCall`.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._in_call = False
        self._after_call = False  # whitespace right after a region is a separator

    @property
    def in_call(self) -> bool:
        """Inside a call region that has not closed yet."""
        return self._in_call

    def feed(self, text: str) -> tuple[str, list[ToolCall | InvalidToolCall]]:
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> tuple[str, list[ToolCall | InvalidToolCall]]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[ToolCall | InvalidToolCall]]:
        content: list[str] = []
        calls: list[ToolCall | InvalidToolCall] = []
        while True:
            if self._in_call:
                end = _region_end(self._buffer)
                if end < 0:
                    if final:
                        calls.append(self._cut_off(self._buffer))
                        self._buffer, self._in_call = "", False
                    break
                calls.append(_parse_call(self._buffer[:end]))
                self._buffer = self._buffer[end + len(TOOL_CALL_END) :]
                self._in_call, self._after_call = False, True
                continue
            if self._after_call:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    break
                self._after_call = False
            start = self._buffer.find(TOOL_CALL_START)
            if start >= 0:
                content.append(self._buffer[:start].rstrip())
                self._buffer = self._buffer[start + len(TOOL_CALL_START) :]
                self._in_call = True
                continue
            if final:
                content.append(self._buffer)
                self._buffer = ""
                break
            keep = partial_suffix(self._buffer, (TOOL_CALL_START,))
            safe = self._buffer[: len(self._buffer) - keep]
            keep += len(safe) - len(safe.rstrip())
            content.append(self._buffer[: len(self._buffer) - keep])
            self._buffer = self._buffer[len(self._buffer) - keep :]
            break
        return "".join(content), calls

    @staticmethod
    def _cut_off(body: str) -> InvalidToolCall:
        raw = body.strip()
        guessed = _NAME_IN_BROKEN_JSON.search(raw)
        return InvalidToolCall(
            new_call_id(),
            guessed.group(1) if guessed else None,
            raw,
            f"the call was cut off before {TOOL_CALL_END} (the response reached its token "
            "limit); raise max_tokens (max_new_tokens)",
        )


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Content, calls and invalid calls of a whole response (the same as streaming it)."""
    stream = ToolCallStream()
    content, found = stream.feed(text)
    rest, more = stream.finish()
    found += more
    calls = [c for c in found if isinstance(c, ToolCall)]
    invalid = [c for c in found if isinstance(c, InvalidToolCall)]
    return content + rest, calls, invalid
