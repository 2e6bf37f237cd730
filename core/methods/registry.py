"""The one table of methods: each name and the module that defines its `Method` subclass (as
`METHOD`). A method's module is imported when the method is first asked for, so `base` can
reach `single` here (a request's last member runs alone) without importing it, and a build
without one method's module still runs the others."""

from __future__ import annotations

import importlib

from ..errors import InvalidConfigError

METHOD_MODULES = {
    "single": "single",
    "token": "token",
    "safe": "safe",
    "specem": "specem",
    "rerank": "rerank",
}
METHOD_NAMES = tuple(METHOD_MODULES)


def method_class(name: str) -> type:
    """The `Method` subclass called `name`; a clear error for a name not in the table or a
    module this build lacks."""
    if name not in METHOD_MODULES:
        raise InvalidConfigError(
            f"unknown method {name!r}; use one of {', '.join(map(repr, METHOD_NAMES))}."
        )
    try:
        module = importlib.import_module(f"{__package__}.{METHOD_MODULES[name]}")
    except ModuleNotFoundError as error:
        raise InvalidConfigError(f"method {name!r} is not available in this build") from error
    return module.METHOD
