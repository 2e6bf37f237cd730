"""Ensemble events -> LangChain custom events named `ensemble.<event name>`.

LangChain gives a chat model no single channel that always works (checked against
langchain-core 1.8), so events go out through each one that does:

- `_generate`/`_agenerate` get a run manager (and hand it to the chunk loop they aggregate),
  but its own `on_custom_event` is a silent no-op: a callback manager built from its handlers
  delivers them, tied to the chat model's run id (`invoke(callbacks=[handler])` ->
  `handler.on_custom_event`).
- `_stream`/`_astream` get no run manager from `stream()`/`astream()`; `dispatch_custom_event`
  reaches the enclosing run when there is one (a chain, a graph node, a tool), which is what
  `chain.astream_events(version="v2")` shows as `on_custom_event`. Called on a bare model it
  has no parent run and raises; then the request carries on without this channel.
- `stream_events(version="v3")` does pass a run manager to `_stream`: used as in `_generate`.

The opt-in per-chunk trace (`generation_info`) and the engine's own `on_event` listener live in
the chat model; they need no LangChain plumbing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
    adispatch_custom_event,
    dispatch_custom_event,
)

from core.errors import InvalidConfigError
from core.events import EVENT_TYPES, Event

PREFIX = "ensemble."
EVENT_NAMES = tuple(t.name for t in EVENT_TYPES)


def custom_event_name(event: Event) -> str:
    return PREFIX + event.name


def selected_events(setting: bool | Sequence[str]) -> frozenset[str]:
    """`True` = every event, `False` = none, or a list of names (with or without the prefix)."""
    if isinstance(setting, bool):
        return frozenset(EVENT_NAMES) if setting else frozenset()
    names = {n.removeprefix(PREFIX) for n in setting}
    unknown = sorted(names - set(EVENT_NAMES))
    if unknown:
        raise InvalidConfigError(
            f"unknown ensemble event name(s) {', '.join(map(repr, unknown))}; use True, False or "
            f"a list of: {', '.join(EVENT_NAMES)}."
        )
    return frozenset(names)


class _Forwarder:
    """What both forwarders share: which events go out, and through which channel."""

    def __init__(self, wanted: frozenset[str], run_manager, manager_class) -> None:
        self.wanted = wanted
        self.run_id = run_manager.run_id if run_manager is not None else None
        self.manager = None
        if run_manager is not None:  # the LLM run's handlers, events attributed to that run
            self.manager = manager_class(
                handlers=run_manager.handlers,
                inheritable_handlers=run_manager.inheritable_handlers,
                parent_run_id=run_manager.run_id,
                tags=run_manager.tags,
                inheritable_tags=run_manager.inheritable_tags,
                metadata=run_manager.metadata,
                inheritable_metadata=run_manager.inheritable_metadata,
            )
        self.dispatch = run_manager is None and bool(wanted)

    def custom_events(self, events: Iterable[Event]) -> list[tuple[str, dict]]:
        """(name, data) of the selected events, or none when no channel is left."""
        if self.manager is None and not self.dispatch:
            return []
        return [(custom_event_name(e), e.to_dict()) for e in events if e.name in self.wanted]


class EventForwarder(_Forwarder):
    """Sends the selected events of one request through the run manager, or else the context."""

    def __init__(self, wanted: frozenset[str], run_manager: CallbackManagerForLLMRun | None):
        super().__init__(wanted, run_manager, CallbackManager)

    def __call__(self, events: Iterable[Event]) -> None:
        for name, data in self.custom_events(events):
            if self.manager is not None:
                self.manager.on_custom_event(name, data, run_id=self.run_id)
                continue
            try:
                dispatch_custom_event(name, data)
            except RuntimeError:  # no parent run (a bare model call): channel unavailable
                self.dispatch = False
                return


class AsyncEventForwarder(_Forwarder):
    """The same for the async path (`_astream`, and `_agenerate` through it)."""

    def __init__(
        self, wanted: frozenset[str], run_manager: AsyncCallbackManagerForLLMRun | None
    ) -> None:
        super().__init__(wanted, run_manager, AsyncCallbackManager)

    async def __call__(self, events: Iterable[Event]) -> None:
        for name, data in self.custom_events(events):
            if self.manager is not None:
                await self.manager.on_custom_event(name, data, run_id=self.run_id)
                continue
            try:
                await adispatch_custom_event(name, data)
            except RuntimeError:
                self.dispatch = False
                return
