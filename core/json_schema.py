"""JSON schemas as llguidance grammar rules, and llguidance's compile errors in our words.

A schema becomes the Lark body of one JSON value (`json_rule`): every object closed unless it says
otherwise (OpenAI's strict mode), laid out as `json.dumps` writes it. `check_schema` tells, at the
call, whether a schema can be enforced at all, naming the keyword or format that cannot; the
request's whole language is built on these rules in `core.grammar`.
"""

from __future__ import annotations

import json
import re
from typing import Any

from llguidance import LLMatcher

from .errors import InvalidConfigError
from .validate import json_depth

JSON_STYLE = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
GRAMMAR_OPTIONS = '%llguidance {"no_forcing": true}'  # see core.grammar: exact byte-level masks

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
# Subschemas that describe values (closing their objects keeps their meaning); "not", "if" and
# "contains" are left alone: closing inside them would change what they say (and llguidance
# rejects them anyway, by name).
_SCHEMA_ONE = ("additionalProperties", "items", "propertyNames", "additionalItems")
_SCHEMA_COMBINED = ("allOf", "anyOf", "oneOf", "$ref")


def _is_object_schema(schema: dict) -> bool:
    kind = schema.get("type")
    return (
        "properties" in schema or kind == "object" or (isinstance(kind, list) and "object" in kind)
    )


def closed_schema(schema: Any, close_here: bool = True) -> Any:
    """A copy where every object schema without "additionalProperties" accepts no other keys."""
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_schema(sub) for name, sub in value.items()}
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = closed_schema(value)
        elif key in ("items", "prefixItems") and isinstance(value, list):
            out[key] = [closed_schema(sub) for sub in value]
        elif key in ("anyOf", "oneOf") and isinstance(value, list):
            # each alternative is a whole object, unless this level adds properties of its own
            out[key] = [closed_schema(sub, "properties" not in schema) for sub in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [closed_schema(sub, False) for sub in value]
        else:
            out[key] = value  # keywords and values (const, enum, default): left as they are
    if (
        close_here
        and _is_object_schema(schema)
        and not any(key in schema for key in _SCHEMA_COMBINED)
        and "additionalProperties" not in schema
        and "unevaluatedProperties" not in schema
    ):
        out["additionalProperties"] = False
    return out


def json_rule(schema: dict) -> str:
    """The Lark body of one JSON value of `schema`, in `json.dumps` layout."""
    prepared = closed_schema(schema)
    prepared["x-guidance"] = JSON_STYLE
    return f"%json {json.dumps(prepared)}"


_FORMATS = "date-time, time, date, duration, email, hostname, ipv4, ipv6, uuid, uri"


_TOO_LARGE = ("too big", "too large", "symbols.len()", "limit for this grammar", "too many")


def explain(what: str, message: str, largest: str | None = None) -> str:
    """llguidance's compile error as a sentence that names the feature and the fix (`largest`:
    the largest tool, named when the grammar is too large as a whole)."""
    first = message.strip().splitlines()[0] if message.strip() else message
    reason = re.sub(r"^at \d+\(\d+\):\s*", "", first)
    reason = reason.replace("failed to compile JSON schema: ", "").removeprefix("panic: ")
    if any(marker in reason for marker in _TOO_LARGE):
        named = f"; the largest is {largest}" if largest else ""
        return (
            f"{what} make a grammar too large for the grammar compiler ({reason}): offer fewer "
            f"tools or smaller schemas{named}."
        )
    keys = re.match(r"Unimplemented keys: \[(.*)\]", reason)
    if keys:
        names = ", ".join(repr(k.strip().strip('"')) for k in keys.group(1).split(","))
        return (
            f"{what} uses the JSON schema keyword {names}, which constrained decoding does not "
            "support; remove it from the schema (state the rule in a description instead)."
        )
    fmt = re.match(r"Unknown format: (.*)", reason)
    if fmt:
        return (
            f"{what} uses the string format {fmt.group(1)!r}, which constrained decoding does "
            f'not support (supported: {_FORMATS}); remove "format" or use "pattern".'
        )
    if "look-around" in message:
        return (
            f"{what} has a pattern with look-ahead or look-behind, which constrained decoding "
            "does not support; rewrite the pattern without (?=, (?!, (?<= or (?<!."
        )
    return f"{what} cannot be enforced by the grammar compiler ({reason}); simplify that part."


def check_grammar(grammar: str, what: str, largest: str | None = None) -> None:
    is_error, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise InvalidConfigError(explain(what, messages[0] if messages else "", largest))


MAX_SCHEMA_DEPTH = 128  # JSON nesting of a schema (where llguidance's own parser stops, about)


def check_schema(schema: dict, what: str) -> None:
    """Raise `InvalidConfigError` naming the feature when `schema` cannot be enforced."""
    depth = json_depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise InvalidConfigError(
            f"{what}: the schema nests {depth} levels deep; constrained decoding reads schemas "
            f"up to {MAX_SCHEMA_DEPTH} levels: flatten it (name repeated parts in $defs and "
            'point to them with "$ref").'
        )
    try:
        grammar = f"{GRAMMAR_OPTIONS}\nstart: {json_rule(schema)}\n"
        json.dumps(schema, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise InvalidConfigError(
            f"{what} holds text that is not valid Unicode (a lone surrogate such as "
            f"{error.object[error.start : error.end]!r}); fix the string in the schema."
        ) from error
    except (TypeError, ValueError) as error:
        raise InvalidConfigError(f"{what} is not a JSON-serialisable schema ({error}).") from error
    check_grammar(grammar, what)
