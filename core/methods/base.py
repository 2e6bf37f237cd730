"""The small interface every method implements, and the per-request state it works on.

A method is a loop that yields `Commit`s: pieces of text appended to the shared response. It
talks to members only through the `Member` interface and reports what it did through
`request.emit(event)` and `request.stats`. Each step starts from `request.text` as it is then
(members synced to it). A request's grammar needs nothing from a method: every distribution a
member gives is already masked by it (`Member.logprobs`, `Member.draft`), and the text it forces
(a tool-call tag, a JSON key) is committed between the method's steps by `Method.commits`, the
one loop the facade runs. The facade (`core.ensemble`) does the rest: prompt rendering, stop
strings, max_new_tokens, streaming, timing; it never changes a member's state itself.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from ..config import GenerationConfig, Stats
from ..errors import InvalidConfigError
from ..events import Event, GrammarForced
from ..member import Member
from ..sampling import Sampler
from ..trust import TrustView
from ..validate import check_choice  # noqa: F401 (methods import it from here)
from .registry import method_class


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
    # whether no other request of the ensemble runs now: a method may then take a pass that
    # would not batch with other requests' (it changes no text, only how many passes it takes)
    alone: Callable[[], bool] = lambda: True

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

    @property
    def vote_score(self) -> str | None:
        """The score this method's vote softmaxes over candidates that members wrote ("logprob"
        or "min"), in which `Ensemble.calibrate` measures each member's self-preference; None
        for a method that does not vote over its members' own candidates."""
        return None

    @property
    def default_self_preference(self) -> str:
        """What `self_preference="auto"` means for this method: "builtin" where evening out the
        judges' self-preference measured better than their scores as they are, else "off"."""
        return "off"

    def trusting(self, weights: dict[str, float]) -> Method:
        """This method for a request that starts with the ensemble's member `weights`. Roles
        that follow trust are set here, before any prompt is rendered; SAFE's drafter is one.
        With equal weights the method is the same as it is without trust."""
        return self

    @abstractmethod
    def run(self, request: Request) -> Iterator[Commit]:
        """Yield commits until done; the facade may stop iterating at any point."""

    def commits(self, request: Request) -> Iterator[Commit]:
        """What the facade iterates: the text the request's grammar forces, whenever it forces
        some, else the method's own next commit (`run`). Each is taken after the facade has
        appended the previous one to `request.text`."""
        own = self.run(request)
        try:
            while True:
                commit = self.grammar_forced(request)
                if commit is None:
                    commit = next(own, None)
                if commit is None:
                    return
                yield commit
        finally:
            own.close()

    def grammar_forced(self, request: Request) -> Commit | None:
        """The text the grammar forces after the committed text, as a commit no model made
        (counted in the first active member's tokens, within max_new_tokens: what does not fit
        is not written), or None. It ends before its last whitespace run: a space is written
        by the model with the word after it (` "add",` can be one token), so the model
        continues from text it was trained on."""
        if request.config.constraint is None:
            return None
        first = self.active[0]
        if first.text != request.text:  # (a member holding part of a character keeps it)
            first.sync(request.text)
        text = first.forced()
        text = text[: _last_space_run(text)]
        if not text:
            return None
        before = first.n_tokens
        first.sync(request.text + text)
        if first.n_tokens - before > request.remaining:  # only the tokens that fit
            start = len(request.text.encode("utf-8"))
            end = first.token_ends[before + request.remaining - 1] if request.remaining else start
            text = (request.text + text).encode("utf-8")[start:end].decode("utf-8", "ignore")
            first.sync(request.text + text)
            if not text:
                return None
        tokens = max(first.n_tokens - before, 0)
        request.emit(GrammarForced(request.stats.tokens, text))
        request.stats.count("grammar_forced_tokens", tokens)
        return Commit(text, tokens)

    def summary(self) -> dict:
        """JSON-safe description (adapters put it in response metadata)."""
        return {"method": self.name, "members": [m.name for m in self.members]}


def _last_space_run(text: str) -> int:
    """Where the last run of whitespace in `text` starts (its length when there is none)."""
    end = len(text)
    while end and not text[end - 1].isspace():
        end -= 1
    if not end:
        return len(text)
    while end and text[end - 1].isspace():
        end -= 1
    return end


def _single(members: Sequence[Member], index: int) -> Method:
    """The method a lone member runs, from the one table of methods."""
    return method_class("single")(members, member=index)
