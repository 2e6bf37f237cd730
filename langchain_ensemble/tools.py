"""LangChain's tool and schema kinds -> the engine's `ToolSpec`s and JSON schemas.

LangChain describes functions, `BaseTool`s, Pydantic models (v2 and v1), TypedDicts and JSON
schemas with one converter (`convert_to_openai_tool`); the core turns its output into a checked
`ToolSpec` (`core.tools.tool_spec`), once, when the tools are bound. Here only the conversion,
with a clear error for what LangChain cannot describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel

from core.errors import InvalidConfigError
from core.tools import ToolSpec, tool_spec

_KINDS = (
    "a function with a docstring, a BaseTool, a Pydantic model, a TypedDict, an OpenAI tool "
    "dict, or a JSON schema dict with a 'title' (the tool's name)"
)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _openai_tool(tool: Any, index: int, strict: bool | None) -> dict[str, Any]:
    try:
        return convert_to_openai_tool(tool, strict=strict)
    except (ValueError, TypeError, KeyError) as error:
        raise InvalidConfigError(
            f"tool #{index} ({str(tool)[:80]}) cannot be described as a tool "
            f"({_first_line(error)}); pass {_KINDS}."
        ) from error


def tool_specs(tools: Any, strict: bool | None = None) -> tuple[ToolSpec, ...]:
    """Each tool as a checked `ToolSpec` (specs already made pass as they are); `strict=True`
    makes every argument required and no other key allowed (OpenAI's strict mode), which the
    engine's grammar then enforces. Names are not checked for uniqueness here: see
    `one_per_name`."""
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidConfigError(
            f"tools must be a list, not a {type(tools).__name__}; wrap a single tool in a list."
        )
    specs = []
    for index, tool in enumerate(tools):
        if isinstance(tool, ToolSpec):
            if strict is None:
                specs.append(tool)
                continue
            tool = tool.to_openai()
        specs.append(tool_spec(_openai_tool(tool, index, strict), index))
    return tuple(specs)


def one_per_name(tools: Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    """The tools without a second one of the same name (for checks that must not refuse a
    duplicate yet)."""
    first = {}
    for tool in tools:
        first.setdefault(tool.name, tool)
    return tuple(first.values())


def tool_name(schema: Any) -> str:
    """The name LangChain gives a schema when it is bound as a tool."""
    return _openai_tool(schema, 0, None)["function"]["name"]


def response_schema(schema: Any) -> dict[str, Any]:
    """The JSON schema of a structured-output schema: a JSON schema dict as it is, a pydantic
    v2 model's own `model_json_schema()` (what LlamaIndex sends for the same class, so both
    adapters prompt alike), anything else through LangChain's converter."""
    if isinstance(schema, dict) and "function" not in schema and "parameters" not in schema:
        return schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    try:
        return convert_to_json_schema(schema)
    except (ValueError, TypeError, KeyError) as error:
        raise InvalidConfigError(
            f"the schema {str(schema)[:80]} cannot be turned into a JSON schema "
            f"({_first_line(error)}); pass a Pydantic model, a TypedDict or a JSON schema dict."
        ) from error
