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
import math
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .stops import partial_suffix
from .validate import json_depth

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
    """A call region that could not be read as a call (LangChain's `invalid_tool_calls`);
    `cut` when the response ended inside it (its token limit), as OpenAI's partial calls do."""

    id: str
    name: str | None
    arguments: str  # the raw text, for the user to see or repair
    error: str
    cut: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "error": self.error}

    @property
    def partial_arguments(self) -> str:
        """The arguments as far as they were written (the JSON after `"arguments": `), as
        OpenAI returns a call cut by max_tokens; "" when the call was cut before them."""
        found = _ARGUMENTS_START.search(self.arguments)
        return self.arguments[found.end() :] if found else ""


_NAME_IN_BROKEN_JSON = re.compile(r'"name"\s*:\s*"([^"\\]*)"')
_ARGUMENTS_START = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
MAX_ARGUMENT_DEPTH = 64  # nesting a call's arguments may have (deeper: an invalid call)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:  # past Python's limit on digits
        raise ValueError(f"a number of {len(text)} digits is too long to read") from None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is out of range")
    return value


# JSON as the standard reads it: NaN and Infinity refused, and numbers past a float's range or
# Python's limit on digits
_STRICT = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite, parse_int=_integer)


def _read_json(text: str, start: int = 0) -> tuple[Any, int]:
    """`raw_decode` of standard JSON whose every failure is a `ValueError` (a JSONDecodeError
    for malformed text): a 5,000-digit number and nesting deeper than Python can recurse
    included."""
    try:
        return _STRICT.raw_decode(text, start)
    except RecursionError:
        raise ValueError("the JSON is nested too deeply") from None


def _parse_call(body: str, offered: frozenset[str] | None) -> ToolCall | InvalidToolCall:
    raw = body.strip()
    guessed = _NAME_IN_BROKEN_JSON.search(raw)
    name_hint = guessed.group(1) if guessed else None
    try:
        data, end = _read_json(raw)
        if raw[end:].strip():
            raise json.JSONDecodeError("Extra data", raw, end)
    except json.JSONDecodeError as error:
        return InvalidToolCall(
            new_call_id(),
            name_hint,
            raw,
            f"the call is not valid JSON ({error.msg} at {error.pos})",
        )
    except ValueError as error:
        return InvalidToolCall(
            new_call_id(), name_hint, raw, f"the call is not valid JSON: {error}"
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
    if offered is not None and name not in offered:
        listed = ", ".join(repr(n) for n in sorted(offered)) or "none"
        return InvalidToolCall(
            new_call_id(), name, raw, f"the tool {name!r} was not offered (offered: {listed})"
        )
    arguments = data.get("arguments", data.get("parameters", {}))  # Llama 3 says "parameters"
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        with contextlib.suppress(ValueError):
            decoded, end = _read_json(arguments.strip())
            if not arguments.strip()[end:].strip():
                arguments = decoded
    if not isinstance(arguments, dict):
        return InvalidToolCall(new_call_id(), name, raw, '"arguments" must be a JSON object')
    if json_depth(arguments) > MAX_ARGUMENT_DEPTH:
        return InvalidToolCall(
            new_call_id(),
            name,
            raw,
            f'"arguments" nest deeper than {MAX_ARGUMENT_DEPTH} levels',
        )
    return ToolCall(new_call_id(), name, arguments)


def _region_end(body: str) -> int:
    """Where the call region that `body` starts ends (the index of its closing tag), or -1 while
    it is still open. A call is one JSON object then the tag, so the object is read first: a
    string inside it may well contain the tag's text. Text that is not such an object (or JSON
    too deep or too large to read) ends at the first tag."""
    start = len(body) - len(body.lstrip())
    if not body.startswith("{", start):  # not a call: the first tag ends it
        return body.find(TOOL_CALL_END)
    try:
        _, after = _read_json(body, start)
    except json.JSONDecodeError as error:
        if error.pos >= len(body.rstrip()) or error.msg.startswith("Unterminated"):
            return -1  # the object is still being written
        return body.find(TOOL_CALL_END)
    except ValueError:
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
    never closed (the response hit max_tokens) becomes an `InvalidToolCall`, and so does a call
    of a tool outside `offered` (when given: the names of the tools the request offered).
    """

    def __init__(self, offered: Sequence[str] | None = None) -> None:
        self._offered = None if offered is None else frozenset(offered)
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
                calls.append(_parse_call(self._buffer[:end], self._offered))
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
            cut=True,
        )


def parse_tool_calls(
    text: str, offered: Sequence[str] | None = None
) -> tuple[str, list[ToolCall], list[InvalidToolCall]]:
    """Content, calls and invalid calls of a whole response (the same as streaming it)."""
    stream = ToolCallStream(offered)
    content, found = stream.feed(text)
    rest, more = stream.finish()
    found += more
    calls = [c for c in found if isinstance(c, ToolCall)]
    invalid = [c for c in found if isinstance(c, InvalidToolCall)]
    return content + rest, calls, invalid
