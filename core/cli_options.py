"""`--option key=value` pairs and `--model` values as Python values: shared by the CLI, the
benchmarks and `serve`, so each command reads them the same way."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .errors import InvalidConfigError


def parse_value(value: str) -> Any:
    """A command-line value as Python: None, a bool, an int, a float, else the string."""
    lowered = value.lower()
    if lowered in ("none", "null"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def parse_options(pairs: Sequence[str]) -> dict:
    """`--option key=value` pairs as method options."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InvalidConfigError(f"--option {pair!r}: use key=value, e.g. aggregator=gac.")
        options[key] = parse_value(value)
    return options


def parse_models(values: Sequence[str]) -> list[str | dict]:
    """`--model` values: a directory, a .gguf file or a hub id as it is; a JSON object is one
    member's fields (`{"path": ..., "chat_template": ..., "stop": [...]}` for a Local,
    `{"base_url": ...}` for a Remote), which `core.sources.model_sources` reads."""
    members: list[str | dict] = []
    for value in values:
        if not value.lstrip().startswith("{"):
            members.append(value)
            continue
        try:
            fields = json.loads(value)
        except ValueError as error:
            raise InvalidConfigError(
                f"--model {value!r} starts like a JSON object but is not one ({error}); pass "
                'e.g. --model \'{"path": "gemma.gguf", "chat_template": "gemma.jinja"}\'.'
            ) from None
        if not isinstance(fields, dict):
            raise InvalidConfigError(f"--model {value!r}: a JSON member must be an object.")
        members.append(fields)
    return members
