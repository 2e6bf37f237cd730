"""What one request did, as a small JSON-safe dict: the adapters' "ensemble" metadata.

LangChain puts it in `response_metadata["ensemble"]`, LlamaIndex in `raw["ensemble"]`; both
build it here so the two report the same numbers under the same keys.
"""

from __future__ import annotations

from collections.abc import Iterable

from .config import Stats
from .events import EnsemblePoint, Event, json_safe


def request_summary(stats: Stats, events: Iterable[Event]) -> dict:
    """The method as the request ran it (`stats.method_summary`: method, members, method
    settings, recorded when the request started, so an answer never describes the request
    after it). Adds: output `tokens`, `ensembled_tokens` and E/T (`ensemble_rate`), SpecEM's
    `ensembled_rounds` (see `Stats`), `input_tokens` (see
    `Stats.input_tokens`) and each member's `prompt_tokens`, SpecEM's `winners` (verified rounds
    won per member: a round where every drafter wrote the same text credits no one) and
    `weights`, the member trust the request started with (`member_weights`: the ensemble's
    trust settings come with the method summary), SAFE's `ensemble_points` (output positions
    where it ensembled), the method's `counts`, and `seconds`. Winners and points are empty for
    methods without them."""
    winners = {k.removeprefix("won/"): v for k, v in stats.counts.items() if k.startswith("won/")}
    points = [event.position for event in events if isinstance(event, EnsemblePoint)]
    method_summary = stats.method_summary
    return json_safe(
        {
            **method_summary,
            "tokens": stats.tokens,
            "ensembled_tokens": stats.ensembled_tokens,
            "ensembled_rounds": stats.ensembled_rounds,
            "ensemble_rate": stats.ensemble_rate,
            "input_tokens": stats.input_tokens,
            "prompt_tokens": dict(stats.prompt_tokens),
            "winners": winners,
            "ensemble_points": points,
            "weights": dict(stats.weights),
            "member_weights": dict(
                stats.member_weights or method_summary.get("member_weights", {})
            ),
            "counts": dict(stats.counts),
            "seconds": stats.seconds,
        }
    )
