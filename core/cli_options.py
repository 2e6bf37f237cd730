"""`--option key=value` pairs as Python values: shared by the CLI, the benchmarks and `serve`,
so each command reads an option the same way."""

from __future__ import annotations

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
