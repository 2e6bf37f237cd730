"""Tools, tool_choice and response_format as users and frameworks pass them, in the core's one
representation: a `ToolSpec` per tool, checked once at the call.

Every schema is checked with the grammar compiler (`core.json_schema`), so an unsupported keyword
fails here, by name. The prompts (`core.chat`) and the grammar (`core.grammar`) are both built
from these specs; the call syntax itself is `core.tool_calls`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InvalidConfigError
from .json_schema import check_schema

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


def tool_spec(tool: Any, index: int = 0) -> ToolSpec:
    """One tool (an OpenAI-style dict or a bare {"name", "description", "parameters"} dict) as a
    checked `ToolSpec`; `index` names it in errors. Adapters convert their frameworks' tools
    with this, once; `normalize_tools` also checks that names are unique."""
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
    try:
        description.encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidConfigError(
            f"{label}: the description cannot be encoded as UTF-8 ({description[error.start]!r} "
            f"at position {error.start} is a lone surrogate); fix the string."
        ) from None
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
        spec = tool_spec(tool, index)
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
    check_schema(schema, "response_format")
    return schema
