"""The field checks both APIs share (Chat Completions and Responses): a request's body as
JSON, numbers, booleans, the model, stop sequences, tools, schemas, the token limit, and the
`GenerationConfig` they make. Each bad value is refused with the status OpenAI gives it and a
message that names the field."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from core.config import GenerationConfig
from core.errors import InvalidConfigError
from core.penalties import LIMIT, SETTINGS
from core.tools import ToolSpec, normalize_response_format, normalize_tool_choice, normalize_tools

from .errors import APIError, bad_request, from_engine, unsupported
from .settings import Limits


def type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number; send finite numbers")


def json_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a body: UTF-8, finite numbers only."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise bad_request(
            f"the body is not UTF-8: byte {raw[error.start]:#04x} at offset {error.start}.",
            code="invalid_encoding",
        ) from None
    try:
        body = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise bad_request(
            f"the body is not valid JSON: {error.msg} at line {error.lineno}, column "
            f"{error.colno}.",
            code="invalid_json",
        ) from None
    except (RecursionError, ValueError) as error:
        raise bad_request(f"the body is not valid JSON: {error}.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object.", code="invalid_json")
    return body


def integer(body: dict, name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, not {type_name(value)}.", name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad_request(f"'{name}' is {value}; it must be {bound}.", name)
    return value


def number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number, not {type_name(value)}.", name)
    if not low <= value <= high:
        raise bad_request(f"'{name}' is {value}; it must be between {low:g} and {high:g}.", name)
    return float(value)


def boolean(body: dict, name: str) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"'{name}' must be a boolean, not {type_name(value)}.", name)
    return value


def known_fields(body: dict, known: set[str], replaced: dict[str, str]) -> None:
    """A field the API does not define is a 400, as OpenAI answers it; one it replaced by
    another (`replaced`: old name -> new) is a 422 that names the new one."""
    for name in body:
        if name in replaced and name not in known:
            raise unsupported(
                f"'{name}' is OpenAI's deprecated form; send '{replaced[name]}' instead.", name
            )
        if name not in known:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name)


def model(body: dict, names: Sequence[str]) -> str:
    value = body.get("model")
    if value is None:
        raise bad_request("you must provide a model parameter ('model').", "model")
    if not isinstance(value, str):
        raise bad_request(f"'model' must be a string, not {type_name(value)}.", "model")
    if value not in names:
        raise APIError(
            404,
            f"The model {value!r} does not exist here; this server serves "
            f"{', '.join(repr(n) for n in names)}.",
            param="model",
            code="model_not_found",
        )
    return value


def message_count(items: list, limits: Limits, param: str, noun: str) -> None:
    """At most `--max-messages` turns in a request (chat messages, Responses items)."""
    if len(items) > limits.max_messages:
        raise APIError(
            413,
            f"'{param}' has {len(items)} {noun}; at most {limits.max_messages} are allowed (the "
            "server's --max-messages).",
            param=param,
            code="too_many_messages",
        )


def stop(body: dict, limits: Limits) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or an array of strings.", "stop")
    if len(stops) > limits.max_stop:
        raise bad_request(
            f"'stop' has {len(stops)} sequences; at most {limits.max_stop} are allowed.", "stop"
        )
    if any(not s for s in stops):
        raise bad_request("'stop' has an empty string; every stop sequence needs text.", "stop")
    return tuple(stops)


def schema_size(schema: Any, limits: Limits, param: str) -> None:
    """A schema as UTF-8 (a lone surrogate in it is a 400) within --max-schema-bytes."""
    text = json.dumps(schema, ensure_ascii=False)
    try:
        size = len(text.encode())
    except UnicodeEncodeError as error:
        raise bad_request(
            f"'{param}' holds text that is not valid Unicode: "
            f"{text[error.start : error.end]!r} is a lone surrogate; fix the string.",
            param,
        ) from None
    if size > limits.max_schema_bytes:
        raise APIError(
            413,
            f"the JSON schema in '{param}' is {size} bytes; at most {limits.max_schema_bytes} "
            "are allowed (the server's --max-schema-bytes).",
            param=param,
            code="schema_too_large",
        )


def function_tools(
    tools: Any, limits: Limits, schema_of, where: str = "tools"
) -> tuple[ToolSpec, ...]:
    """Function tools, counted, sized and checked by the grammar compiler. `schema_of(tool)`
    gives a tool's parameters and where they are, (schema, "tools[i]...")."""
    if tools is not None and not isinstance(tools, list):
        raise bad_request(f"'{where}' must be an array, not {type_name(tools)}.", where)
    tools = tools or []
    if len(tools) > limits.max_tools:
        raise APIError(
            413,
            f"'{where}' has {len(tools)} tools; at most {limits.max_tools} are allowed (the "
            "server's --max-tools).",
            param=where,
            code="too_many_tools",
        )
    for index, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise bad_request(f"{where}[{index}] must be an object.", f"{where}[{index}]")
        schema, param = schema_of(tool, index)
        if schema is not None:
            schema_size(schema, limits, param)
    try:
        return normalize_tools(tools)
    except InvalidConfigError as error:
        raise from_engine(error, where) from None


def tool_choice(choice: Any, specs: Sequence[ToolSpec]) -> str:
    try:
        return normalize_tool_choice(choice, specs)
    except InvalidConfigError as error:
        raise APIError(400, str(error), param="tool_choice") from None


def schema_format(fmt: dict[str, Any], limits: Limits, param: str) -> dict[str, Any] | None:
    """A checked `response_format` (the engine's forms) from an API's format object."""
    schema_size(fmt, limits, param)
    try:
        return normalize_response_format(fmt)
    except InvalidConfigError as error:
        raise from_engine(error, param) from None


def max_tokens(body: dict, limits: Limits, default: int, names: tuple[str, ...]) -> int:
    given = [(n, integer(body, n, 1)) for n in names]
    given = [(n, v) for n, v in given if v is not None]
    if len({v for _, v in given}) > 1:
        raise bad_request(
            f"'{given[1][0]}' and '{given[0][0]}' differ; send one of them.", given[1][0]
        )
    if not given:
        return min(default, limits.max_tokens)
    name, value = given[0]
    if value > limits.max_tokens:
        raise bad_request(
            f"'{name}' is {value}; this server allows at most {limits.max_tokens} (its "
            "--max-tokens).",
            name,
        )
    return value


def generation_config(
    body: dict,
    limits: Limits,
    tokens: int,
    tools: tuple[ToolSpec, ...] = (),
    choice: str = "auto",
    parallel: bool = True,
    fmt: dict[str, Any] | None = None,
) -> GenerationConfig:
    """The request's `GenerationConfig`: its sampling fields read here, the rest given."""
    temperature = number(body, "temperature", 0.0, 2.0)
    top_p = number(body, "top_p", 0.0, 1.0)
    if top_p == 0:
        raise bad_request("'top_p' is 0; it must be above 0 (1 keeps every token).", "top_p")
    seed = integer(body, "seed", -(2**63), 2**63 - 1)
    penalties = {name: number(body, name, -float(LIMIT), float(LIMIT)) for name in SETTINGS}
    try:
        return GenerationConfig(
            max_new_tokens=tokens,
            stop=stop(body, limits),
            temperature=0.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            tools=tools,
            tool_choice=choice,
            parallel_tool_calls=parallel,
            response_format=fmt,
            **{name: value for name, value in penalties.items() if value is not None},
        )
    except InvalidConfigError as error:
        raise from_engine(error) from None
