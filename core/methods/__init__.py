"""Methods by name (the table is `registry`). Each module defines one `Method` subclass and
exports it as `METHOD`."""

from __future__ import annotations

import inspect

from ..errors import InvalidConfigError
from .base import Commit, Method, Request
from .registry import METHOD_NAMES, method_class

# The method an Ensemble (and each adapter) runs unless told otherwise, at its own default
# options: the best configuration measured (README, "The default").
DEFAULT_METHOD = "safe"


def check_method(name: str, n_members: int, options: dict) -> type[Method]:
    """Everything about a method choice that can be checked before loading any model."""
    cls = method_class(name)
    accepted = [
        p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "members")
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise InvalidConfigError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for method {name!r}; its "
            f"options are: {', '.join(accepted) or '(none)'}."
        )
    if n_members < cls.min_members:
        raise InvalidConfigError(
            f"method {name!r} combines models and needs at least {cls.min_members} members, "
            f"got {n_members}; pass more models, or use method='single'."
        )
    return cls


def build_method(name: str, members, options: dict) -> Method:
    return check_method(name, len(members), options)(members, **options)


__all__ = [
    "DEFAULT_METHOD",
    "METHOD_NAMES",
    "Commit",
    "Method",
    "Request",
    "build_method",
    "check_method",
    "method_class",
]
