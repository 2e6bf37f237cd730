"""LlamaIndex adapter: `EnsembleLLM`, a `CustomLLM` backed by the core ensemble engine.

    from llama_index.core import Settings
    from llamaindex_ensemble import EnsembleLLM
    Settings.llm = EnsembleLLM(models=["path/A", "path/B"], method="safe")

Ensemble events arrive as `llama_index.core.instrumentation` events (`EnsembleEvent` and one
subclass per core event type) on the root dispatcher.
"""

from .events import (
    EVENT_CLASSES,
    EnsembleDraftEvent,
    EnsembleEvent,
    EnsembleGrammarForcedEvent,
    EnsembleMemberFailedEvent,
    EnsemblePointEvent,
    EnsembleSegmentCandidatesEvent,
    EnsembleSegmentSelectedEvent,
    EnsembleSkipConsensusEvent,
    EnsembleSkipMismatchEvent,
    EnsembleTokenEvent,
    EnsembleToolCallEvent,
    EnsembleTrustUpdatedEvent,
    EnsembleWeightsUpdatedEvent,
    to_instrumentation,
)
from .llm import EnsembleLLM

__all__ = [
    "EVENT_CLASSES",
    "EnsembleDraftEvent",
    "EnsembleEvent",
    "EnsembleGrammarForcedEvent",
    "EnsembleLLM",
    "EnsembleMemberFailedEvent",
    "EnsemblePointEvent",
    "EnsembleSegmentCandidatesEvent",
    "EnsembleSegmentSelectedEvent",
    "EnsembleSkipConsensusEvent",
    "EnsembleSkipMismatchEvent",
    "EnsembleTokenEvent",
    "EnsembleToolCallEvent",
    "EnsembleTrustUpdatedEvent",
    "EnsembleWeightsUpdatedEvent",
    "to_instrumentation",
]
