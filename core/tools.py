"""The one tool-call syntax of the shared response text, whatever the members' families.

Members of different families do not agree on how to write a tool call (Qwen: tags around JSON,
Llama 3: bare JSON with "parameters", Phi-3 and Gemma: none), so ensembling their text naively
would mix formats. The ensemble's text uses one canonical form, the most common trained one
(Hermes / Qwen style), one call per region, regions separated by a newline:

    <tool_call>
    {"name": "add", "arguments": {"a": 7, "b": 5}}
    </tool_call>

The JSON is written as `json.dumps` writes it (", " and ": " separators, non-ASCII kept), so the
grammar (`core.grammar`), the prompts that teach the form and the parser agree byte for byte.

Also here, free of torch: what users and frameworks pass, normalised and checked once at the call
(`normalize_tools`, `normalize_tool_choice`, `normalize_response_format`; every schema is checked
with the grammar compiler, so an unsupported keyword fails there, by name), and the calls read
back out of the committed text (`ToolCallStream` while it streams, `parse_tool_calls` whole).
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

from .errors import InvalidConfigError
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
# Tool specs, tool_choice and response_format as users and frameworks pass them.

TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")  # OpenAI's rule, which every framework follows
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
ANY_JSON_OBJECT: dict[str, Any] = {"type": "object", "additionalProperties": True}
_CHOICE_WORDS = {"auto": "auto", "none": "none", "required": "required", "any": "required"}


@dataclass(frozen=True)
class ToolSpec:
    """One tool the model may call: its name, what it does, and a JSON schema of its arguments
    (always an object schema; a tool without arguments has `NO_PARAMETERS`)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI tool dict, which chat templates (`apply_chat_template(tools=...)`) read."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": copy.deepcopy(self.parameters),
            },
        }


def _tool_label(index: int, spec: Any) -> str:
    name = spec.get("name") if isinstance(spec, dict) else None
    return f"tool {name!r}" if isinstance(name, str) and name else f"tool #{index}"


def _one_tool(index: int, tool: Any) -> ToolSpec:
    if isinstance(tool, ToolSpec):  # already checked
        return tool
    if not isinstance(tool, dict):
        raise InvalidConfigError(
            f"tool #{index} is a {type(tool).__name__}, not a dict; pass OpenAI-style tools "
            '({"type": "function", "function": {"name", "description", "parameters"}}); '
            "LangChain's convert_to_openai_tool and LlamaIndex's tool.metadata.to_openai_tool() "
            "make them."
        )
    kind = tool.get("type", "function")
    if kind != "function":
        raise InvalidConfigError(
            f"tool #{index} has type {kind!r}; only function tools are supported "
            '({"type": "function", "function": {"name", "description", "parameters"}}).'
        )
    spec = tool.get("function") if "function" in tool else tool
    label = _tool_label(index, spec)
    if not isinstance(spec, dict):
        raise InvalidConfigError(
            f'{label}: "function" must be a dict with "name", "description" and "parameters".'
        )
    name = spec.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise InvalidConfigError(
            f"{label} has the name {name!r}; a tool name must be 1 to 64 letters, digits, "
            "'_' or '-' (OpenAI's rule); rename the tool."
        )
    description = spec.get("description") or ""
    if not isinstance(description, str):
        raise InvalidConfigError(f"{label}: the description must be a string.")
    parameters = spec.get("parameters")
    if parameters is None:
        parameters = NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise InvalidConfigError(
            f"{label}: parameters must be a JSON schema of an object (a dict such as "
            f'{{"type": "object", "properties": {{...}}}}), not a {type(parameters).__name__}.'
        )
    kind = parameters.get("type", "object")
    if kind != "object":
        raise InvalidConfigError(
            f"{label}: parameters must be a JSON schema of an object "
            f'({{"type": "object", "properties": {{...}}}}); this one has "type": {kind!r}. '
            "Wrap a single value in an object property."
        )
    parameters = {"type": "object", **parameters}
    from .grammar import check_schema  # the grammar module builds on this module's syntax

    check_schema(parameters, f"the parameters of {label}")
    return ToolSpec(name, description, copy.deepcopy(parameters))


def normalize_tools(tools: Sequence[Any] | None) -> tuple[ToolSpec, ...]:
    """Tools as OpenAI-style dicts or bare {"name", "description", "parameters"} dicts, checked:
    every name valid and unique, every parameters schema one the grammar can enforce."""
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidConfigError(
            f"tools must be a list of tool dicts, not a {type(tools).__name__}; "
            "wrap a single tool in a list."
        )
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        spec = _one_tool(index, tool)
        if spec.name in seen:
            raise InvalidConfigError(
                f"two tools are named {spec.name!r}; tool names must be unique, rename one."
            )
        seen.add(spec.name)
        specs.append(spec)
    return tuple(specs)


def _choice_name(choice: dict) -> Any:
    if choice.get("type") == "function":
        function = choice.get("function")
        return function.get("name") if isinstance(function, dict) else None
    if choice.get("type") == "tool":  # Anthropic's form
        return choice.get("name")
    if choice.get("type") in _CHOICE_WORDS:  # {"type": "auto" | "any" | "none"}, Anthropic's
        return choice["type"]
    return None


def normalize_tool_choice(choice: Any, tools: Sequence[ToolSpec]) -> str:
    """ "auto" | "none" | "required" | the one tool's name, from every form frameworks send."""
    names = [tool.name for tool in tools]
    if choice is None:
        return "auto"
    if choice is True:
        value: Any = "required"
    elif isinstance(choice, dict):
        value = _choice_name(choice)
        if not isinstance(value, str):
            raise InvalidConfigError(
                f"tool_choice {choice!r} is not understood; use 'auto', 'none', 'required', a "
                'tool name, or {"type": "function", "function": {"name": ...}}.'
            )
    elif isinstance(choice, str):
        value = choice
    else:
        raise InvalidConfigError(
            f"tool_choice must be 'auto', 'none', 'required', True or a tool name, not {choice!r}."
        )
    value = _CHOICE_WORDS.get(value, value)
    if value in ("auto", "none"):
        return value
    if not names:
        wanted = "a tool call" if value == "required" else f"a call of {value!r}"
        raise InvalidConfigError(
            f"tool_choice={choice!r} asks for {wanted}, but no tools were given; pass tools "
            "(bind_tools / tools=[...]) or drop tool_choice."
        )
    if value == "required" or value in names:
        return value
    raise InvalidConfigError(
        f"tool_choice names the tool {value!r}, which is not among the tools given "
        f"({', '.join(repr(n) for n in names)}); use one of those names."
    )


def normalize_response_format(fmt: Any) -> dict[str, Any] | None:
    """The JSON schema the answer must follow, or None for free text.

    Accepts a JSON schema dict as is, {"type": "json_object"} (any JSON object; with a "schema"
    key, as Hugging Face clients send, that schema), OpenAI's {"type": "json_schema",
    "json_schema": {"name", "schema", "strict"}}, and {"type": "text"} or None (no constraint).
    """
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InvalidConfigError(
            f"response_format must be a dict, not a {type(fmt).__name__}: a JSON schema, "
            '{"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}'
            "; for a pydantic model pass Model.model_json_schema()."
        )
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = fmt.get("schema", ANY_JSON_OBJECT)
    elif kind == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict):
            raise InvalidConfigError(
                'response_format {"type": "json_schema"} needs "json_schema": {"name": ..., '
                '"schema": {...}}; the schema is missing.'
            )
    else:
        schema = fmt
    if not isinstance(schema, dict):
        raise InvalidConfigError("response_format: the schema must be a dict (a JSON schema).")
    from .grammar import check_schema  # the grammar module builds on this module's syntax

    check_schema(schema, "response_format")
    return schema


# --------------------------------------------------------------------------------------------
# Parsing the calls out of the committed text, while it streams.

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


def json_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value`, counted without recursion (so that data too
    deep for `json.dumps` or `copy.deepcopy` is measured, then refused, rather than crashing)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            stack.extend(
                (x, level + 1) for x in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


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
