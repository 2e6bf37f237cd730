"""One loaded Ensemble per configuration, shared by every adapter instance that asks for it.

Framework objects (a LangChain chat model, a LlamaIndex LLM) are built often and cheaply: in
`Settings`, per query engine, per test. Loading models is neither, so adapters construct without
loading and call `shared_ensemble` on first use. Instances with the same configuration get the
same `Ensemble`, and so share its admission: their requests run concurrently, up to its
`max_concurrency` at a time, each with its own member state, their forward passes batched per
model (`core.admission`). An ensemble is freed when the last instance holding it goes (weak
references), except the two most recently used, which stay loaded.
"""

from __future__ import annotations

import collections
import threading
import weakref
from pathlib import Path
from typing import Any

from .ensemble import Ensemble
from .local import Local
from .methods import DEFAULT_METHOD
from .remote import Remote
from .sources import Models, Source, model_sources

_loaded: weakref.WeakValueDictionary[str, Ensemble] = weakref.WeakValueDictionary()
_loading = threading.Lock()  # one load at a time: two threads asking together load once
# The last few ensembles used stay loaded even when no instance holds them: LangChain's
# `configurable_fields` builds a new chat model per call, which must not reload the models.
_recent: collections.deque[Ensemble] = collections.deque(maxlen=2)


def _source_key(model: Source) -> str:
    if isinstance(model, Remote):  # every field, keys as digests: no borrowed authority
        return model.fingerprint()
    if isinstance(model, Local):  # the same files with other options are another member
        options = {k: v for k, v in model.public_fields().items() if k != "path"}
        if model.chat_template is not None:  # a template file counts by its text
            options["chat_template"] = model.template_text()
        if options:
            return repr((_path_key(model.path), sorted(options.items())))
        model = model.path  # Local(path) is the path
    return _path_key(model)


def _path_key(model: str) -> str:
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def configuration_key(models: Models, method: str, options: dict[str, Any]) -> str:
    """Equal for configurations that load the same models the same way."""
    sources = [_source_key(m) for m in model_sources(models)]
    settings = sorted((k, repr(v)) for k, v in options.items())
    return repr((sources, method, settings))


def shared_ensemble(models: Models, method: str = DEFAULT_METHOD, **kwargs: Any) -> Ensemble:
    """`Ensemble.from_pretrained(models, method, **kwargs)`, loaded once per configuration."""
    models = model_sources(models)
    key = configuration_key(models, method, kwargs)
    with _loading:
        ensemble = _loaded.get(key)
        if ensemble is None:
            ensemble = Ensemble.from_pretrained(models, method, **kwargs)
            _loaded[key] = ensemble
        if ensemble not in _recent:
            _recent.append(ensemble)
        return ensemble
