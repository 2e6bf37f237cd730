"""One request as the server runs it (`Job`), whichever API it came in by, and the `ensemble`
details every answer to it carries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.config import GenerationConfig, Stats
from core.events import Event
from core.summary import request_summary
from core.tool_calls import InvalidToolCall


@dataclass(frozen=True)
class Job:
    """A request translated from its API: what the engine runs (`messages`, `config`) and what
    its answer needs. `api` is the endpoint it came by ("chat", "completions", "responses"),
    `echo` the request fields a Responses API answer repeats."""

    api: str
    model: str
    messages: list[dict[str, Any]] | str  # a string: a raw prompt (/v1/completions)
    config: GenerationConfig
    stream: bool
    include_usage: bool = False
    echo: dict[str, Any] = field(default_factory=dict)


def ensemble_details(
    stats: Stats, events: Iterable[Event], invalid: Sequence[InvalidToolCall]
) -> dict[str, Any]:
    """The extra `ensemble` field of an answer: what the method did in this request (E/T,
    points or winners, weights: `core.summary.request_summary`), the members that left it, and
    the tool calls cut off at the token limit."""
    details = request_summary(stats, events)
    details["failed"] = dict(stats.failed)
    details["invalid_tool_calls"] = [call.to_dict() for call in invalid]
    return details
