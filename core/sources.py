"""The `models` argument, in the one form every entry point works with.

Users pass members the way that is handy where they are: one path, a `Path`, a hub id, a
`Local(...)` or a `Remote(...)` (or a dict of their fields, as a config file gives it: one with
`path` is a Local, one with `base_url` a Remote), or a list of any of these. The engine, the
shared-engine cache and both adapters need the same thing, a list of `str` (a local directory, a
GGUF file or a hub id), `Local` and `Remote` entries, so the conversion and its error live here
once.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from .errors import InvalidConfigError
from .local import Local
from .remote import Remote

Source = str | Local | Remote
ModelSource = str | os.PathLike | Local | Remote
Models = ModelSource | Sequence[ModelSource | Mapping]


def model_sources(models: Models) -> list[Source]:
    """`models` as a list of member sources: paths and hub ids as `str`, `Local`s and
    `Remote`s as given.

    A single source becomes a one-element list; a dict with `path` becomes `Local(**dict)`,
    one with `base_url` `Remote(**dict)`. Emptiness is left to the caller, whose error can
    name its own fix."""
    if isinstance(models, (str, os.PathLike, Local, Remote)):
        models = [models]
    elif not isinstance(models, Sequence) or isinstance(models, (bytes, bytearray)):
        raise InvalidConfigError(
            f"models is {_kind(models)}; pass a local model directory, a .gguf file, a hub id, "
            "a Local(...) or Remote(...), or a list of them."
        )
    return [_source(model, index) for index, model in enumerate(models)]


def public_sources(models: Sequence[Source]) -> list[str | dict[str, Any]]:
    """Member sources as a dump may show them: paths and hub ids as they are, each Local and
    Remote as a dict of its fields (a Remote's without credentials); `model_sources` reads them
    back (adapters serialize their `models` with it)."""
    return [m if isinstance(m, str) else m.public_fields() for m in models]


def source_label(source: str | os.PathLike | Local | Remote) -> str:
    """A member source as adapters show it: a directory's or GGUF file's name, a hub id, a
    Local's or Remote's name."""
    if isinstance(source, (Local, Remote)):
        return source.label
    return Local(os.fspath(source)).label


def _source(model: object, index: int) -> Source:
    if isinstance(model, (Local, Remote)):
        return model
    if isinstance(model, Mapping):
        return _from_fields(model, index)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if isinstance(path, str) and path:
            return path
    raise InvalidConfigError(
        f"models[{index}] is {_kind(model)}; each member is a local model directory or .gguf "
        "file (str or Path), a hub id, a Local(...) or a Remote(...)."
    )


def _from_fields(model: Mapping, index: int) -> Local | Remote:
    """A dict with `path` is a Local, one with `base_url` a Remote."""
    keys = set(map(str, model))
    if ("path" in keys) == ("base_url" in keys):
        problem = "both path and base_url" if "path" in keys else "neither path nor base_url"
        raise InvalidConfigError(
            f"models[{index}] is a dict with {problem}; a dict with path stands for Local(...) "
            f"({_names(Local)}), one with base_url for Remote(...) ({_names(Remote)})."
        )
    spec = Local if "path" in keys else Remote
    unknown = sorted(keys - {f.name for f in fields(spec)})
    if unknown:
        raise InvalidConfigError(
            f"models[{index}] is a dict for {spec.__name__}(...) with unknown field(s) "
            f"{', '.join(unknown)}; it takes {_names(spec)}."
        )
    return spec(**model)


def _names(spec: type) -> str:
    return ", ".join(f.name for f in fields(spec))


def _kind(value: object) -> str:
    if value is None or value == "":
        return "None" if value is None else "an empty string"
    return f"{reprlib.repr(value)} of type {type(value).__name__}"
