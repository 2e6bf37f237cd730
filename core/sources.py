"""The `models` argument, in the one form every entry point works with.

Users pass members the way that is handy where they are: one path, a `Path`, a hub id, a
`Remote(...)` (or a dict of its fields, as a config file gives it), or a list of any of these.
The engine, the shared-engine cache and both adapters need the same thing, a list of `str`
(local directory or hub id) and `Remote` entries, so the conversion and its error live here once.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from .errors import InvalidConfigError
from .remote import Remote

ModelSource = str | os.PathLike | Remote
Models = ModelSource | Sequence[ModelSource | Mapping]


def model_sources(models: Models) -> list[str | Remote]:
    """`models` as a list of member sources: paths and hub ids as `str`, `Remote`s as given.

    A single source becomes a one-element list; a dict becomes `Remote(**dict)`. Emptiness is
    left to the caller, whose error can name its own fix."""
    if isinstance(models, (str, os.PathLike, Remote)):
        models = [models]
    elif not isinstance(models, Sequence) or isinstance(models, (bytes, bytearray)):
        raise InvalidConfigError(
            f"models is {_kind(models)}; pass a local model directory, a hub id, a "
            "Remote(...), or a list of them."
        )
    return [_source(model, index) for index, model in enumerate(models)]


def public_sources(models: Sequence[str | Remote]) -> list[str | dict[str, Any]]:
    """Member sources as a dump may show them: paths and hub ids as they are, each Remote as
    a dict of its fields without credentials (adapters serialize their `models` with it)."""
    return [m.public_fields() if isinstance(m, Remote) else m for m in models]


def _source(model: object, index: int) -> str | Remote:
    if isinstance(model, Remote):
        return model
    if isinstance(model, Mapping):
        unknown = sorted(set(map(str, model)) - {f.name for f in fields(Remote)})
        if unknown or "base_url" not in model:
            problem = f"unknown field(s) {', '.join(unknown)}" if unknown else "no base_url"
            raise InvalidConfigError(
                f"models[{index}] is a dict with {problem}; a dict stands for Remote(...) and "
                f"takes its fields: {', '.join(f.name for f in fields(Remote))}."
            )
        return Remote(**model)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if isinstance(path, str) and path:
            return path
    raise InvalidConfigError(
        f"models[{index}] is {_kind(model)}; each member is a local model directory (str or "
        "Path), a hub id, or a Remote(...)."
    )


def _kind(value: object) -> str:
    if value is None or value == "":
        return "None" if value is None else "an empty string"
    return f"{reprlib.repr(value)} of type {type(value).__name__}"
