"""What every framework adapter needs from the engine, in one place.

LangChain's `ChatEnsemble` and LlamaIndex's `EnsembleLLM` are wiring: each converts its
framework's messages, tools and outputs, and takes the rest from here, so both load the same way,
report the same model name and the same numbers, and turn a call's arguments into a request the
same way:

- `EnsembleSettings`: how an adapter loads its engine (models, method, options, devices), checked
  before anything loads, and the model name it reports;
- `EnsembleHandle`: the engine itself, one built by hand or the shared one for those settings,
  loaded on first use (`core.shared.shared_ensemble`) and off the event loop for async callers;
- `generation_config`: the instance's settings overridden by a call's, as the call's one
  `GenerationConfig` (built, and so checked, once per call);
- `ResponseRecord`: what an adapter keeps of a request's deltas (text, tool calls, events) and,
  at the end, the request summary both adapters report as "ensemble" metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Delta, GenerationConfig
from .ensemble import Ensemble
from .errors import InvalidConfigError
from .events import Event
from .loading import check_model_source
from .local import Local
from .methods import DEFAULT_METHOD, METHOD_NAMES, check_method
from .remote import Remote
from .shared import shared_ensemble
from .sources import Source, source_label
from .summary import request_summary
from .tool_calls import InvalidToolCall, ToolCall

# Per-call names frameworks use for a GenerationConfig field.
ALIASES = {"max_tokens": "max_new_tokens"}

# The loading settings both adapters declare as fields (`Field(**LOADING_FIELDS[name])`): each
# default and description written once.
LOADING_FIELDS: dict[str, dict[str, Any]] = {
    "models": {
        "default_factory": list,
        "description": "Local model directories, .gguf files, hub ids, Local(...) members with "
        "their own options (chat_template, stop, dtype, device, name) or Remote(...) members "
        "served by vLLM (a dict of Local's or Remote's fields works too); SAFE drafts with the "
        "most trusted (the first while all are trusted alike).",
    },
    "method": {"default": DEFAULT_METHOD, "description": " | ".join(METHOD_NAMES)},
    "method_options": {
        "default_factory": dict,
        "description": "Keyword options of the method, e.g. {'drafter': 0} or {'top_k': 10}.",
    },
    "device": {"default": "auto", "description": "One device for all members, or one each."},
    "dtype": {"default": "auto", "description": "One dtype for all members, or one each."},
    "names": {"default": None, "description": "Member names in events and stats."},
}


@dataclass(frozen=True)
class EnsembleSettings:
    """How an adapter loads its engine: the members (paths, hub ids, `Local`s or `Remote`s;
    SAFE drafts with the most trusted, the first while all are trusted alike), the method and
    its options, and per-member devices, dtypes and names."""

    models: Sequence[Source]
    method: str = DEFAULT_METHOD
    method_options: Mapping[str, Any] = field(default_factory=dict)
    device: str | Sequence[str] = "auto"
    dtype: str | Sequence[str] = "auto"
    names: Sequence[str] | None = None

    @classmethod
    def of(cls, ensemble: Ensemble) -> EnsembleSettings:
        """The settings that describe an engine built by hand (its members by name)."""
        members = [m.name for m in ensemble.members]
        return cls(members, ensemble.method, dict(ensemble.method_options))

    def check(self, wrap: str, sources: bool = True) -> None:
        """What can be checked before loading: models given (`wrap` says how the adapter takes
        an Ensemble built by hand instead), the method and its options, one entry per model in
        per-model lists, and with `sources` that local paths exist."""
        if not self.models:
            raise InvalidConfigError(
                "models is empty; pass models=[...] (local model directories, .gguf files, hub "
                "ids, Local(...) or Remote(...) members, e.g. core.testbed.model_paths()), or "
                f"wrap an Ensemble you built: {wrap}."
            )
        check_method(self.method, len(self.models), dict(self.method_options))
        for what in ("device", "dtype", "names"):
            value = getattr(self, what)
            if isinstance(value, (list, tuple)) and len(value) != len(self.models):
                raise InvalidConfigError(
                    f"{what} has {len(value)} entries for {len(self.models)} models; pass one "
                    "per model, or a single value for all."
                )
        for model in self.models if sources else ():  # a wrong path fails now, not at loading
            if not isinstance(model, Remote):
                check_model_source(model.path if isinstance(model, Local) else model)

    @property
    def label(self) -> str:
        """The model name an adapter reports: the method and its members."""
        names = self.names or [source_label(m) for m in self.models]
        return f"ensemble-{self.method}:{'+'.join(names)}"

    def load(self) -> Ensemble:
        """The shared engine for these settings (loaded once per configuration)."""
        return shared_ensemble(
            list(self.models),
            self.method,
            device=self.device,
            dtype=self.dtype,
            names=self.names,
            **self.method_options,
        )


class EnsembleHandle:
    """The engine an adapter instance talks to: given (an `Ensemble` built by hand), or loaded
    on first use from the instance's settings, so constructing an adapter stays cheap."""

    def __init__(self, ensemble: Ensemble | None = None) -> None:
        self._ensemble = ensemble

    def get(self, settings: EnsembleSettings) -> Ensemble:
        if self._ensemble is None:
            self._ensemble = settings.load()
        return self._ensemble

    async def aget(self, settings: EnsembleSettings) -> Ensemble:
        """`get`, with a first load (seconds) off the event loop."""
        if self._ensemble is None:
            return await asyncio.to_thread(self.get, settings)
        return self._ensemble


def generation_config(
    defaults: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> GenerationConfig:
    """An adapter instance's settings (`defaults`) overridden by one call's (`overrides`), as
    that call's one `GenerationConfig`. Keys are `GenerationConfig` fields or their framework
    names (`ALIASES`); a value given per call replaces the instance's, and None means "not
    set" (the engine's default). The adapter checks which keys its framework may pass."""
    settings: dict[str, Any] = {}
    for key, value in [*defaults.items(), *(overrides or {}).items()]:
        settings[ALIASES.get(key, key)] = value
    return GenerationConfig(**{k: v for k, v in settings.items() if v is not None})


class ResponseRecord:
    """What an adapter keeps of one request's deltas as they arrive: the text, the tool calls
    (whole ones, and those that could not be read) and the events so far, and, once the last
    delta is in, the request's summary (`core.summary.request_summary`), which both adapters
    report as their "ensemble" metadata."""

    def __init__(self, ensemble: Ensemble) -> None:
        self.ensemble = ensemble
        self.text = ""
        self.calls: list[ToolCall] = []
        self.invalid_calls: list[InvalidToolCall] = []
        self.events: list[Event] = []
        self.summary: dict | None = None  # set by the last delta

    @property
    def n_calls(self) -> int:
        """Tool calls seen so far, whole or not (the next one's index)."""
        return len(self.calls) + len(self.invalid_calls)

    def add(self, delta: Delta) -> None:
        self.text += delta.text
        self.events.extend(delta.events)
        for call in delta.tool_calls:
            (self.calls if isinstance(call, ToolCall) else self.invalid_calls).append(call)
        if delta.stats is not None:
            self.summary = request_summary(self.ensemble.summary(), delta.stats, self.events)
