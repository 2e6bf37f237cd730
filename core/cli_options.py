"""Options on the command line, read the same way by every command: `--option key=value` pairs
(a method's options) and `--model` values as Python values, shared by the CLI, the benchmarks and
`serve`; and one flag per ensemble option (`core.options`), made from its declaration."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .errors import InvalidConfigError
from .options import GROUP_TITLES, EachMember, options_in


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


def add_member_flags(parser: argparse.ArgumentParser, method: str | None = None) -> None:
    """The ensemble a command builds: `--model` (repeated, one per member), `--method` (default
    `method`; None: the config file's, else the library's) and `--option` (the method's)."""
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        help="a member: a directory, .gguf file, ollama:NAME (a model Ollama pulled) or hub id, "
        "or a JSON object of Local's or Remote's fields (repeat for each member)",
    )
    parser.add_argument("--method", default=method, help="safe | specem | rerank | token | single")
    parser.add_argument("--option", action="append", default=[], help="method option key=value")


def ensemble_flags(args: argparse.Namespace, groups: Iterable[str]) -> dict[str, Any]:
    """What `add_member_flags` and `add_option_flags` read, as an ensemble.toml's top level
    would hold it (None: not given)."""
    return {
        "members": parse_models(args.model) or None,
        "method": args.method,
        "options": parse_options(args.option) or None,
        **given_options(args, groups),
    }


def add_option_flags(
    parser: argparse.ArgumentParser, groups: Iterable[str], defaults: Mapping[str, Any]
) -> None:
    """One flag per ensemble option of `groups`, under a heading per group. A flag left out
    reads as None (the command's default applies: `defaults`, else the option's), so a
    config file's value is not overridden by a flag nobody gave."""
    for group in groups:
        section = parser.add_argument_group(f"ensemble options: {GROUP_TITLES[group]}")
        for option in options_in([group]):
            default = defaults.get(option.name, option.default)
            shown = "" if default is None else f" (default: {default})"
            kwargs = dict(option.kind.cli)
            if option.flag:  # named otherwise than the option: NAME rather than NAMES
                kwargs["metavar"] = option.flag.lstrip("-").upper().replace("-", "_")
            section.add_argument(
                option.command_line, dest=option.name, default=None,
                help=option.help + shown, **kwargs,
            )  # fmt: skip


def given_options(args: argparse.Namespace, groups: Iterable[str]) -> dict[str, Any]:
    """The ensemble options given as flags. A per-member flag given once is one value for
    every member; repeated, one per member."""
    given = {}
    for option in options_in(groups):
        value = getattr(args, option.name)
        if isinstance(option.kind, EachMember) and value is not None and len(value) == 1:
            value = value[0]
        if value is not None:
            given[option.name] = value
    return given


def parse_models(values: Sequence[str]) -> list[str | dict]:
    """`--model` values: a directory, a .gguf file, an Ollama name or a hub id as it is; a
    JSON object is one member's fields (`{"path": ..., "chat_template": ..., "stop": [...]}`
    for a Local, `{"base_url": ...}` for a Remote), which `core.sources.model_sources`
    reads."""
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
