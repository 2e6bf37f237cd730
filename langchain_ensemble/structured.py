"""`with_structured_output`: a schema bound to the chat model, and the parser of its answers.

Three methods, as LangChain's providers name them, all enforced by the engine's grammar:
- "json_schema" (the default): `response_format` is the schema; the answer is one JSON value
  of it.
- "function_calling": the schema is bound as the one tool and its call is forced; the answer is
  that call's arguments.
- "json_mode": any JSON object, or, when a schema is given, a JSON value of that schema
  (stricter than OpenAI's json_mode, which only promises some JSON object).
`strict` is accepted for every method: the grammar always holds an answer to its schema.

An answer cut by max_tokens raises `OutputParserException` naming the fix (as OpenAI's client
raises on a truncated structured answer): LangChain's JSON parsers would otherwise read a
truncated `{"setup": "Why` as a partial object and return it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from operator import itemgetter
from typing import Any

from langchain_core.exceptions import OutputParserException
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import (
    JsonOutputKeyToolsParser,
    PydanticToolsParser,
)
from langchain_core.runnables import Runnable, RunnableGenerator, RunnableMap, RunnablePassthrough
from langchain_core.utils.pydantic import is_basemodel_subclass

from core.errors import InvalidConfigError

from .tools import response_schema, tool_name, tool_specs

METHODS = ("json_schema", "function_calling", "json_mode")


def _is_pydantic(schema: Any) -> bool:
    return isinstance(schema, type) and is_basemodel_subclass(schema)  # pydantic v2 and v1


def _binding(schema: Any, method: str, strict: bool | None) -> dict[str, Any]:
    """The chat model's settings for the method; LangChain reports the
    `ls_structured_output_format` binding to tracers (`on_chat_model_start` options)."""
    traced = {"ls_structured_output_format": {"kwargs": {"method": method}, "schema": schema}}
    if method == "function_calling":
        return {
            "tools": tool_specs([schema], strict),
            "tool_choice": tool_name(schema),
            "parallel_tool_calls": False,
            **traced,
        }
    if method == "json_schema":
        json_schema = response_schema(schema)
        title = json_schema.get("title")
        described = {"name": title if isinstance(title, str) else "response", "schema": json_schema}
        if strict is not None:
            described["strict"] = strict
        return {"response_format": {"type": "json_schema", "json_schema": described}, **traced}
    if schema is None:  # json_mode without a schema: any JSON object
        return {"response_format": {"type": "json_object"}}
    fmt = {"type": "json_object", "schema": response_schema(schema)}
    return {"response_format": fmt, **traced}


def _check_whole(message: BaseMessage) -> BaseMessage:
    if message.response_metadata.get("finish_reason") == "length":
        raise OutputParserException(
            "the answer reached max_tokens before its JSON was complete; raise max_tokens "
            "(ChatEnsemble(max_tokens=...), or .bind(max_tokens=...)).",
            llm_output=message.text,
        )
    return message


def _whole(messages: Iterator[BaseMessage]) -> Iterator[BaseMessage]:
    for message in messages:  # the last chunk carries the finish reason
        yield _check_whole(message)


async def _awhole(messages: AsyncIterator[BaseMessage]) -> AsyncIterator[BaseMessage]:
    async for message in messages:
        yield _check_whole(message)


def _parser(schema: Any, method: str) -> Runnable:
    whole = RunnableGenerator(_whole, _awhole, name="whole_answer")
    if method == "function_calling":
        if _is_pydantic(schema):
            return whole | PydanticToolsParser(tools=[schema], first_tool_only=True)
        return whole | JsonOutputKeyToolsParser(key_name=tool_name(schema), first_tool_only=True)
    if _is_pydantic(schema):
        return whole | PydanticOutputParser(pydantic_object=schema)
    return whole | JsonOutputParser()


def structured_binding(
    schema: Any, method: str, strict: bool | None, unknown: dict[str, Any]
) -> dict[str, Any]:
    """What `ChatEnsemble.with_structured_output` binds (see its docstring), checked."""
    if unknown:
        raise InvalidConfigError(
            f"unknown argument(s) {', '.join(map(repr, sorted(unknown)))} for "
            "with_structured_output; it takes schema, method, include_raw and strict."
        )
    if method not in METHODS:
        raise InvalidConfigError(
            f"method={method!r} is not a structured-output method; use one of "
            f"{', '.join(map(repr, METHODS))}."
        )
    if strict is not None and not isinstance(strict, bool):
        raise InvalidConfigError(f"strict must be True, False or None, got {strict!r}.")
    if schema is None and method != "json_mode":
        raise InvalidConfigError(
            f'method="{method}" needs a schema (a Pydantic model, a TypedDict or a JSON schema '
            'dict); only method="json_mode" works without one.'
        )
    return _binding(schema, method, strict)


def structured_runnable(bound: Runnable, schema: Any, method: str, include_raw: bool) -> Runnable:
    """The bound chat model followed by the method's parser (with `include_raw`, the raw
    message, the parsed answer and a parsing error, as LangChain's providers return them)."""
    parser = _parser(schema, method)
    if not include_raw:
        return bound | parser
    parsed = RunnablePassthrough.assign(
        parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
    )
    unparsed = RunnablePassthrough.assign(parsed=lambda _: None)
    return RunnableMap(raw=bound) | parsed.with_fallbacks([unparsed], exception_key="parsing_error")
