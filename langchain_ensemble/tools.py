"""LangChain's tool and schema kinds -> the engine's OpenAI-style tool dicts and JSON schemas.

LangChain describes functions, `BaseTool`s, Pydantic models (v2 and v1), TypedDicts and JSON
schemas with one converter (`convert_to_openai_tool`); its output is what the engine takes
(`GenerationConfig.tools`), and the engine checks every schema. Here only the conversion, with
a clear error for what LangChain cannot describe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_json_schema, convert_to_openai_tool
from pydantic import BaseModel

from core.errors import InvalidConfigError

_KINDS = (
    "a function with a docstring, a BaseTool, a Pydantic model, a TypedDict, an OpenAI tool "
    "dict, or a JSON schema dict with a 'title' (the tool's name)"
)


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def openai_tools(tools: Any, strict: bool | None = None) -> list[dict[str, Any]]:
    """Each tool as an OpenAI tool dict; `strict=True` makes every argument required and no
    other key allowed (OpenAI's strict mode), which the engine's grammar then enforces."""
    if isinstance(tools, (str, bytes, dict)) or not isinstance(tools, Sequence):
        raise InvalidConfigError(
            f"tools must be a list, not a {type(tools).__name__}; wrap a single tool in a list."
        )
    converted = []
    for index, tool in enumerate(tools):
        try:
            converted.append(convert_to_openai_tool(tool, strict=strict))
        except (ValueError, TypeError, KeyError) as error:
            raise InvalidConfigError(
                f"tool #{index} ({str(tool)[:80]}) cannot be described as a tool "
                f"({_first_line(error)}); pass {_KINDS}."
            ) from error
    return converted


def one_per_name(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools without a second one of the same name (for checks that must not refuse a
    duplicate yet); tools without a name are all kept, for the engine to judge."""
    seen: set[str] = set()
    kept = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or name not in seen:
            kept.append(tool)
        if isinstance(name, str):
            seen.add(name)
    return kept


def tool_name(schema: Any) -> str:
    """The name LangChain gives a schema when it is bound as a tool."""
    return openai_tools([schema])[0]["function"]["name"]


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
