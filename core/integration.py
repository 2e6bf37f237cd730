"""What every framework adapter needs from the engine, in one place.

LangChain's `ChatEnsemble` and LlamaIndex's `EnsembleLLM` are wiring: each converts its
framework's messages, tools and outputs, and takes the rest from here, so both load the same way,
report the same model name and the same numbers, and turn a call's arguments into a request the
same way:

- `option_fields`: the ensemble options (`core.options`) as pydantic fields, which both adapters
  mix into their classes, so each offers every option, checked as `Ensemble` checks it;
- `EnsembleSettings`: how an adapter loads its engine (models, method and its options, the
  ensemble options), checked before anything loads, and the model name it reports;
  `wrapped_fields`: an adapter's fields for an engine built by hand;
- `EnsembleHandle`: the engine itself, one built by hand or the shared one for those settings,
  loaded on first use (`core.shared.shared_ensemble`) and off the event loop for async callers;
- `generation_config`: the instance's settings overridden by a call's, as the call's one
  `GenerationConfig` (built, and so checked, once per call);
- `ResponseRecord`: what an adapter keeps of a request's deltas (text, tool calls, events) and,
  at the end, the request summary both adapters report as "ensemble" metadata.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Delta, GenerationConfig
from .ensemble import Ensemble
from .errors import InvalidConfigError
from .events import Event
from .loading import check_model_source
from .local import Local
from .methods import DEFAULT_METHOD, METHOD_NAMES, check_method
from .options import BY_NAME as OPTIONS_BY_NAME
from .options import NAMES as OPTION_NAMES
from .options import OPTIONS, check_options
from .remote import Remote
from .shared import shared_ensemble
from .sources import Source, source_label
from .summary import request_summary
from .tool_calls import InvalidToolCall, ToolCall

# Per-call names frameworks use for a GenerationConfig field.
ALIASES = {"max_tokens": "max_new_tokens"}

# The engine's settings other than the ensemble options, as both adapters declare them as fields
# (`Field(**LOADING_FIELDS[name])`): each default and description written once.
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
}
# What describes an engine: given with an Ensemble built by hand, it would contradict it.
ENGINE_FIELDS = (*LOADING_FIELDS, *OPTION_NAMES)


def option_fields() -> type:
    """A pydantic model with one field per ensemble option (`core.options`): its type, default
    and help text, and the option's own check (a bad value fails at construction, as it does
    in `Ensemble`). Each adapter mixes it into its class. pydantic is the adapters' dependency,
    imported here only when an adapter asks."""
    from pydantic import BaseModel, Field, create_model, field_validator

    def check(cls, value: Any, info) -> Any:
        return OPTIONS_BY_NAME[info.field_name].check(value)

    fields = {o.name: (o.annotation, Field(default=o.default, description=o.help)) for o in OPTIONS}
    return create_model(
        "EnsembleOptionFields",
        __base__=BaseModel,
        __validators__={"check_option": field_validator(*OPTION_NAMES, mode="before")(check)},
        **fields,
    )


def wrapped_fields(ensemble: Ensemble, given: Iterable[str], how: str) -> dict[str, Any]:
    """An adapter's fields for an engine built by hand (`how` names the way it was passed):
    its members by name, its method and options. A field that describes the engine given as
    well is refused: the engine is loaded already."""
    clash = [name for name in ENGINE_FIELDS if name in given]
    if clash:
        raise InvalidConfigError(
            f"pass either {how} or {', '.join(clash)}, not both: an Ensemble is already loaded "
            "with its models, method and options."
        )
    settings = EnsembleSettings.of(ensemble)
    return {
        "models": list(settings.models),
        "method": settings.method,
        "method_options": dict(settings.method_options),
        **settings.options,
    }


@dataclass(frozen=True)
class EnsembleSettings:
    """How an adapter loads its engine: the members (paths, hub ids, `Local`s or `Remote`s;
    SAFE drafts with the most trusted, the first while all are trusted alike), the method and
    its options, and the ensemble options (`core.options`, by name; those not given take their
    defaults)."""

    models: Sequence[Source]
    method: str = DEFAULT_METHOD
    method_options: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, ensemble: Ensemble) -> EnsembleSettings:
        """The settings that describe an engine built by hand (its members by name)."""
        members = [m.name for m in ensemble.members]
        return cls(members, ensemble.method, dict(ensemble.method_options), dict(ensemble.options))

    def check(self, wrap: str, sources: bool = True) -> None:
        """What can be checked before loading: models given (`wrap` says how the adapter takes
        an Ensemble built by hand instead), the method and its options, the ensemble options,
        one entry per model in per-model lists, and with `sources` that local paths exist."""
        if not self.models:
            raise InvalidConfigError(
                "models is empty; pass models=[...] (local model directories, .gguf files, hub "
                "ids, Local(...) or Remote(...) members, e.g. core.testbed.model_paths()), or "
                f"wrap an Ensemble you built: {wrap}."
            )
        check_method(self.method, len(self.models), dict(self.method_options))
        check_options(self.options).check_members(len(self.models))
        for model in self.models if sources else ():  # a wrong path fails now, not at loading
            if not isinstance(model, Remote):
                check_model_source(model.path if isinstance(model, Local) else model)

    @property
    def label(self) -> str:
        """The model name an adapter reports: the method and its members."""
        names = self.options.get("names") or [source_label(m) for m in self.models]
        return f"ensemble-{self.method}:{'+'.join(names)}"

    def load(self) -> Ensemble:
        """The shared engine for these settings (loaded once per configuration)."""
        return shared_ensemble(
            list(self.models), self.method, **self.options, **self.method_options
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
            self.summary = request_summary(delta.stats, self.events)
