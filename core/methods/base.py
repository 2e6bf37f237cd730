"""The small interface every method implements, and the per-request state it works on.

A method is a loop that yields `Commit`s: pieces of text appended to the shared response. It
talks to members only through the `Member` interface and reports what it did through
`request.emit(event)` and `request.stats`. Each step starts from `request.text` as it is then
(members synced to it): between two steps the facade may append text no model wrote (what a
request's grammar forces, such as a tool-call tag or a JSON key). The facade (`core.ensemble`)
does the rest: prompt rendering, stop strings, max_new_tokens, streaming, timing.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..config import GenerationConfig, Stats
from ..errors import InvalidConfigError
from ..events import Event
from ..member import Member
from ..sampling import Sampler
from ..trust import TrustView
from ..validate import check_choice  # noqa: F401 (methods import it from here)


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
    trust: TrustView = field(default_factory=TrustView)  # the ensemble's member weights

    @property
    def remaining(self) -> int:
        """Output tokens still allowed by max_new_tokens."""
        return self.config.max_new_tokens - self.stats.tokens

    def emit(self, event: Event) -> None:
        self.pending.append(event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception as error:  # the user's own bug: it reaches the caller as itself
                raise CallbackFailed(error) from error


class CallbackFailed(Exception):
    """Carries an exception raised by the user's `on_event` callback out of a method, so the
    facade re-raises it as it was instead of reporting a member failure."""

    def __init__(self, error: Exception) -> None:
        super().__init__(repr(error))
        self.error = error


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


class Method(ABC):
    """One instance per ensemble holds the options and what is derived once from the members'
    vocabularies; `bind` gives each request its own shallow copy whose `members` are that
    request's member views, so `run` keeps per-request state in locals (or on that copy) only.

    `member_options` names the attributes that hold member indices (an int, or a list of ints):
    `without` keeps them pointing at the same members when one member leaves a request."""

    name: ClassVar[str]
    min_members: ClassVar[int] = 1
    member_options: ClassVar[tuple[str, ...]] = ()

    def __init__(self, members: Sequence[Member]) -> None:
        if len(members) < self.min_members:
            raise InvalidConfigError(
                f"method {self.name!r} combines models and needs at least {self.min_members} "
                f"members, got {len(members)}; pass more models, or use method='single'."
            )
        self.members = list(members)

    def bind(self, members: Sequence[Member]) -> Method:
        """This method for one request, over that request's member views (same order)."""
        twin = copy.copy(self)
        twin.members = list(members)
        return twin

    def without(self, name: str) -> Method:
        """The method for the rest of a request after member `name` failed: the same method over
        the others, a role the failed member held passing to the next member in order (SAFE's
        drafter, say); one member alone, or too few drafters left, runs as `single`."""
        gone = next(i for i, m in enumerate(self.members) if m.name == name)
        rest = [m for i, m in enumerate(self.members) if i != gone]
        if not rest:
            raise IndexError("no member left")
        twin = self.bind(rest)
        lead = 0
        for option in self.member_options:
            value = getattr(self, option)
            if isinstance(value, list):
                kept = [i - (i > gone) for i in value if i != gone]
                setattr(twin, option, kept)
                lead = kept[0] if kept else 0
                if len(kept) < len(value) and len(kept) < 2:
                    return _single(rest, lead)
            else:
                moved = value - (value > gone) if value != gone else value % len(rest)
                setattr(twin, option, moved)
                lead = moved
        if len(rest) < self.min_members:
            return _single(rest, lead)
        return twin

    @property
    def active(self) -> list[Member]:
        """The members this method runs (the facade starts only these for a request)."""
        return self.members

    def trusting(self, weights: dict[str, float]) -> Method:
        """This method for a request that starts with the ensemble's member `weights`. Roles
        that follow trust are set here, before any prompt is rendered; SAFE's drafter is one.
        With equal weights the method is the same as it is without trust."""
        return self

    @abstractmethod
    def run(self, request: Request) -> Iterator[Commit]:
        """Yield commits until done; the facade may stop iterating at any point."""

    def summary(self) -> dict:
        """JSON-safe description (adapters put it in response metadata)."""
        return {"method": self.name, "members": [m.name for m in self.members]}


def _single(members: Sequence[Member], index: int) -> Method:
    from . import method_class

    return method_class("single")(members, member=index)
