"""What happened during a request, as frozen dataclasses with a stable `name` and `to_dict()`.

Events are the ensemble's observable behaviour: adapters forward them as LangChain custom events
or LlamaIndex instrumentation events, benchmarks count them, users print them. `to_dict()` is
JSON-safe (only str, int, float, bool, None, lists and dicts) so they can cross any boundary.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    name: ClassVar[str] = "event"

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: json_safe(getattr(self, f.name)) for f in dataclasses.fields(self)}
        return {"name": self.name, **data}


def json_safe(value: Any) -> Any:
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return str(value)


@dataclass(frozen=True)
class Drafted(Event):
    """A member drafted tokens ahead of the committed text (SAFE's drafter)."""

    name: ClassVar[str] = "draft"
    member: str
    position: int  # output token index where the draft starts
    tokens: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TokenEnsembled(Event):
    """Every-token ensembling chose the next piece of text (method `token`)."""

    name: ClassVar[str] = "token_ensembled"
    position: int
    chosen: str
    top: list[tuple[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class EnsemblePoint(Event):
    """SAFE ensembled at a drafted position: the drafted token was checked and maybe replaced."""

    name: ClassVar[str] = "ensemble_point"
    position: int
    drafted: str
    chosen: str
    top: list[tuple[str, float]] = field(default_factory=list)
    sharpened: bool = False


@dataclass(frozen=True)
class SkipMismatch(Event):
    """SAFE did not ensemble at a position: the previous token is OOV-like for a member."""

    name: ClassVar[str] = "skip_mismatch"
    position: int
    member: str


@dataclass(frozen=True)
class SkipConsensus(Event):
    """SAFE did not ensemble at a position: the members already agree on the drafted token."""

    name: ClassVar[str] = "skip_consensus"
    position: int


@dataclass(frozen=True)
class SkipGate(Event):
    """GaC's gate: no ensemble at a position because the main member is sure of its token (its
    probability is at least one half: SAFE+GaC's drafter, or the first member of `token` with
    GaC), so its token is taken without consulting the others."""

    name: ClassVar[str] = "skip_gate"
    position: int
    member: str
    probability: float


@dataclass(frozen=True)
class SegmentCandidates(Event):
    """SpecEM: each drafter's candidate segment for this round."""

    name: ClassVar[str] = "segment_candidates"
    round: int
    candidates: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SegmentSelected(Event):
    """SpecEM: the winning segment, every verifier's normalised scores and the voting weights."""

    name: ClassVar[str] = "segment_selected"
    round: int
    winner: str
    text: str
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WeightsUpdated(Event):
    """SpecEM online feedback moved the voting weights."""

    name: ClassVar[str] = "weights_updated"
    round: int
    weights: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TrustUpdated(Event):
    """The ensemble's member trust learned from this request's decisions as the request
    finished. Fields:
    - `decisions`: how many decisions moved the weights.
    - `rewards`: each member's mean reward over them, that is, how far it backed what was
      committed (0..1).
    - `weights`: every member's weight afterwards. Later requests start from these
      (`Ensemble.member_weights`).
    - `updates`: the trust's total of such decisions since the last reset or load."""

    name: ClassVar[str] = "trust_updated"
    updates: int
    decisions: int
    weights: dict[str, float] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberFailed(Event):
    """A member failed during the request: `operation` it was doing, `error` what happened.
    With `on_member_failure="drop"` the request goes on without it; else it ends there."""

    name: ClassVar[str] = "member_failed"
    member: str
    error: str
    operation: str = ""


@dataclass(frozen=True)
class ToolCallEvent(Event):
    """A tool call closed in the response: its id, name and parsed arguments, and how many of
    the tokens written while its text was open an ensemble decision chose (`ensembled_tokens`)."""

    name: ClassVar[str] = "tool_call"
    id: str
    tool: str
    arguments: dict = field(default_factory=dict)
    ensembled: int = 0


@dataclass(frozen=True)
class GrammarForced(Event):
    """Text the request's grammar forced (a tool-call tag, a JSON key), committed without a
    model call at output token `position`."""

    name: ClassVar[str] = "grammar_forced"
    position: int
    text: str


EVENT_TYPES: tuple[type[Event], ...] = (
    Drafted,
    TokenEnsembled,
    EnsemblePoint,
    SkipMismatch,
    SkipConsensus,
    SkipGate,
    SegmentCandidates,
    SegmentSelected,
    WeightsUpdated,
    TrustUpdated,
    MemberFailed,
    ToolCallEvent,
    GrammarForced,
)
