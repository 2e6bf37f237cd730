"""The small interface every method implements, and the per-request state it works on.

A method is a loop that yields `Commit`s: pieces of text appended to the shared response. It
talks to members only through the `Member` interface and reports what it did through
`request.emit(event)` and `request.stats`. The facade (`core.ensemble`) does the rest: prompt
rendering, stop strings, max_new_tokens, streaming, timing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..config import GenerationConfig, Stats
from ..errors import InvalidConfigError
from ..events import Event
from ..member import Member
from ..sampling import Sampler


@dataclass
class Commit:
    """Text appended to the shared response, the output tokens it counts for, and whether the
    method decided to stop ("stop": an end-of-turn was chosen; "length": a window is full)."""

    text: str
    tokens: int = 0
    finish: str | None = None


@dataclass
class Request:
    config: GenerationConfig
    sampler: Sampler
    stats: Stats = field(default_factory=Stats)
    text: str = ""  # the committed response so far
    on_event: Callable[[Event], None] | None = None
    pending: list[Event] = field(default_factory=list)

    @property
    def remaining(self) -> int:
        """Output tokens still allowed by max_new_tokens."""
        return self.config.max_new_tokens - self.stats.tokens

    def emit(self, event: Event) -> None:
        self.pending.append(event)
        if self.on_event is not None:
            self.on_event(event)


def pick_member(members: Sequence[Member], which: int | str, option: str) -> int:
    """A member by index or name (method options such as `drafter=` accept both)."""
    if isinstance(which, int) and not isinstance(which, bool):
        if -len(members) <= which < len(members):
            return which % len(members)
    else:
        for i, member in enumerate(members):
            if member.name == which:
                return i
    names = ", ".join(repr(m.name) for m in members)
    raise InvalidConfigError(
        f"{option}={which!r} is not a member; use an index 0..{len(members) - 1} or a name "
        f"({names})."
    )


def check_choice(option: str, value: object, choices: Sequence[object]) -> None:
    if value not in choices:
        raise InvalidConfigError(
            f"{option}={value!r} is not supported; use one of {', '.join(map(repr, choices))}."
        )


class Method(ABC):
    name: ClassVar[str]
    min_members: ClassVar[int] = 1

    def __init__(self, members: Sequence[Member]) -> None:
        if len(members) < self.min_members:
            raise InvalidConfigError(
                f"method {self.name!r} combines models and needs at least {self.min_members} "
                f"members, got {len(members)}; pass more models, or use method='single'."
            )
        self.members = list(members)

    @property
    def active(self) -> list[Member]:
        """The members this method runs (the facade starts only these for a request)."""
        return self.members

    @abstractmethod
    def run(self, request: Request) -> Iterator[Commit]:
        """Yield commits until done; the facade may stop iterating at any point."""

    def summary(self) -> dict:
        """JSON-safe description (adapters put it in response metadata)."""
        return {"method": self.name, "members": [m.name for m in self.members]}
