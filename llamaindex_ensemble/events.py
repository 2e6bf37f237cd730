"""Ensemble events as LlamaIndex instrumentation events: one `BaseEvent` subclass per core event.

A `BaseEventHandler` added to the root dispatcher (`get_dispatcher().add_event_handler(h)`)
receives them next to LlamaIndex's own `LLMChatStartEvent` & co, with the same `span_id` (the
LLM call's span), so a trace shows what the ensemble did inside each call. `name` is the core
event's stable name and `data` its JSON-safe `to_dict()`.
"""

from __future__ import annotations

from typing import Any

from llama_index.core.instrumentation.events import BaseEvent

from core import events as core_events


class EnsembleEvent(BaseEvent):
    """Base class: catch this to receive every ensemble event."""

    name: str
    data: dict[str, Any]
    model_name: str = ""  # the EnsembleLLM's metadata.model_name

    @classmethod
    def class_name(cls) -> str:
        return cls.__name__


class EnsembleDraftEvent(EnsembleEvent):
    """A member drafted tokens ahead of the committed text (`core.events.Drafted`)."""


class EnsembleTokenEvent(EnsembleEvent):
    """Every-token ensembling chose the next piece of text (`TokenEnsembled`)."""


class EnsemblePointEvent(EnsembleEvent):
    """SAFE ensembled at a drafted position (`EnsemblePoint`)."""


class EnsembleSkipMismatchEvent(EnsembleEvent):
    """SAFE skipped a position: a member's tokenization does not fit there (`SkipMismatch`)."""


class EnsembleSkipConsensusEvent(EnsembleEvent):
    """SAFE skipped a position: the members already agree (`SkipConsensus`)."""


class EnsembleSkipGateEvent(EnsembleEvent):
    """A position skipped at GaC's gate: the main member was sure of its token (`SkipGate`)."""


class EnsembleSegmentCandidatesEvent(EnsembleEvent):
    """SpecEM: each drafter's candidate segment (`SegmentCandidates`)."""


class EnsembleSegmentSelectedEvent(EnsembleEvent):
    """SpecEM: the winning segment with every verifier's scores (`SegmentSelected`)."""


class EnsembleWeightsUpdatedEvent(EnsembleEvent):
    """SpecEM's online feedback moved the voting weights (`WeightsUpdated`)."""


class EnsembleTrustUpdatedEvent(EnsembleEvent):
    """The ensemble's member trust learned from a decision (`TrustUpdated`)."""


class EnsembleMemberFailedEvent(EnsembleEvent):
    """A member failed during the request (`MemberFailed`)."""


class EnsembleToolCallEvent(EnsembleEvent):
    """A tool call closed in the response (`ToolCallEvent`)."""


class EnsembleGrammarForcedEvent(EnsembleEvent):
    """Text the request's grammar forced, committed without a model call (`GrammarForced`)."""


EVENT_CLASSES: dict[type[core_events.Event], type[EnsembleEvent]] = {
    core_events.Drafted: EnsembleDraftEvent,
    core_events.TokenEnsembled: EnsembleTokenEvent,
    core_events.EnsemblePoint: EnsemblePointEvent,
    core_events.SkipMismatch: EnsembleSkipMismatchEvent,
    core_events.SkipConsensus: EnsembleSkipConsensusEvent,
    core_events.SkipGate: EnsembleSkipGateEvent,
    core_events.SegmentCandidates: EnsembleSegmentCandidatesEvent,
    core_events.SegmentSelected: EnsembleSegmentSelectedEvent,
    core_events.WeightsUpdated: EnsembleWeightsUpdatedEvent,
    core_events.TrustUpdated: EnsembleTrustUpdatedEvent,
    core_events.MemberFailed: EnsembleMemberFailedEvent,
    core_events.ToolCallEvent: EnsembleToolCallEvent,
    core_events.GrammarForced: EnsembleGrammarForcedEvent,
}


def to_instrumentation(
    event: core_events.Event, span_id: str | None, model_name: str = ""
) -> EnsembleEvent:
    """The instrumentation event for a core event (a type added to the core later still
    arrives, as the base class)."""
    cls = EVENT_CLASSES.get(type(event), EnsembleEvent)
    return cls(name=event.name, data=event.to_dict(), model_name=model_name, span_id=span_id)
