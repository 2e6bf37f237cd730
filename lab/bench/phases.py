"""Where a request's time goes: exclusive wall and CPU seconds per phase of a method's loop.

`PhaseClock` keeps one stack of phases per thread; a phase is entered and left around a method
of the engine (`instrumented` wraps them for the duration of a measurement and puts them back
after), and every moment is counted once, for the innermost phase open on its thread, so the
phases add up to the time measured. Inside a forward pass the model's own work is split into
its body and its output head (a hook on the model's output embeddings), and both are named
after the phase that asked for the pass ("verify · head", "draft · body"), so a draft step, a
verifier's pass and a heal branch pass are told apart. CPU seconds are the thread's own
(`time.thread_time`): on a machine busy with other work they move less than wall seconds.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

# Phases that name work inside a forward pass: reported per the phase that asked for the pass.
_INSIDE_PASS = ("body", "head", "pass set-up")


class PhaseClock:
    """Exclusive wall and CPU seconds per phase, per thread (see the module docstring)."""

    def __init__(self, wall=time.perf_counter, cpu=time.thread_time) -> None:
        self._wall_clock, self._cpu_clock = wall, cpu  # seconds now (a test gives its own)
        self.wall: Counter[str] = Counter()
        self.cpu: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()  # times each phase was entered
        self.passes: Counter[tuple[str, str]] = Counter()  # (member, asking phase) -> passes
        self._local = threading.local()
        self._lock = threading.Lock()

    def _state(self) -> tuple[list[str], list[float]]:
        local = self._local
        if not hasattr(local, "stack"):
            local.stack, local.mark = [], [self._wall_clock(), self._cpu_clock()]
        return local.stack, local.mark

    def _settle(self) -> None:
        """Count the time since the thread's last mark for its innermost phase."""
        stack, mark = self._state()
        wall, cpu = self._wall_clock(), self._cpu_clock()
        if stack:
            name = self._name(stack)
            with self._lock:
                self.wall[name] += wall - mark[0]
                self.cpu[name] += cpu - mark[1]
        mark[:] = [wall, cpu]

    def count_pass(self, member: str) -> None:
        """One forward pass of `member`'s model, for the phase that asked for it."""
        asker = _asker(self._state()[0])
        with self._lock:
            self.passes[member, asker] += 1

    @staticmethod
    def _name(stack: list[str]) -> str:
        top = stack[-1]
        if top not in _INSIDE_PASS:
            return top
        return f"{_asker(stack)} · {top}"

    def enter(self, phase: str) -> None:
        self._settle()
        stack = self._state()[0]
        stack.append(phase)
        with self._lock:
            self.calls[self._name(stack)] += 1

    def leave(self) -> None:
        self._settle()
        self._state()[0].pop()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.leave()

    def reset(self) -> None:
        with self._lock:
            self.wall.clear()
            self.cpu.clear()
            self.calls.clear()
            self.passes.clear()


def _asker(stack: list[str]) -> str:
    """The innermost open phase that is not work inside a pass: the step that asked for it."""
    return next((s for s in reversed(stack) if s not in _INSIDE_PASS), "other")


def _wrapped(clock: PhaseClock, function, phase: str):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        clock.enter(phase)
        try:
            result = function(*args, **kwargs)
        finally:
            clock.leave()
        if isinstance(result, Iterator) and not isinstance(result, (list, tuple)):
            return _timed_iterator(clock, result, phase)
        return result

    return timed


def _timed_iterator(clock: PhaseClock, iterator: Iterator, phase: str) -> Iterator:
    """A generator's own steps belong to its phase too (a method's `run` is one)."""
    try:
        while True:
            clock.enter(phase)
            try:
                item = next(iterator)
            except StopIteration:
                return
            finally:
                clock.leave()
            yield item
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def timed_steps() -> list[tuple[object, str, str]]:
    """(owner, attribute, phase): the engine's steps a breakdown tells apart."""
    from core.batching import Batcher
    from core.member import Member
    from core.methods.base import Method
    from core.methods.safe import Safe
    from core.methods.safe.drafting import Proposer
    from core.methods.safe.ensembling import Ensembler
    from core.methods.safe.heal import HealCycle
    from core.methods.safe.scoring import Readings
    from core.methods.specem import SpecEM

    return [
        (Method, "commits", "python between passes"),
        (Proposer, "propose", "draft"),
        (Member, "draft", "draft"),
        (Readings, "of", "alignment"),
        (Readings, "score", "verify"),
        (HealCycle, "own", "heal"),
        (HealCycle, "column", "heal"),
        (Member, "branch_logprobs", "heal branches"),
        (Ensembler, "choose", "ensemble step"),
        (Safe, "_settle", "rollback and re-sync"),
        (SpecEM, "_draft", "draft"),
        (SpecEM, "_shares", "verify"),
        (Member, "score", "verify"),  # SpecEM's and rerank's votes, SAFE's word decisions
        (Member, "start", "prompt"),
        (Batcher, "run", "pass set-up"),
        (Batcher, "_call", "body"),
    ]


@contextlib.contextmanager
def instrumented(clock: PhaseClock, models: Mapping[str, Any]) -> Iterator[PhaseClock]:
    """The engine's steps timed by `clock` while the block runs (put back after); `models`: the
    loaded models by member name, whose output head is timed apart from their body and whose
    forward passes are counted per member and asking phase."""
    saved = []
    for owner, attribute, phase in timed_steps():
        original = owner.__dict__[attribute]
        saved.append((owner, attribute, original))
        setattr(owner, attribute, _wrapped(clock, original, phase))
    handles, names = [], {}
    for name, model in models.items():  # a model two members share is counted once, for both
        names.setdefault(id(model), (model, []))[1].append(name)
    for model, shared in names.values():
        counted = functools.partial(lambda name, *_: clock.count_pass(name), " / ".join(shared))
        handles.append(model.register_forward_pre_hook(counted))
        head = model.get_output_embeddings()
        if head is not None:
            handles.append(head.register_forward_pre_hook(lambda *_: clock.enter("head")))
            handles.append(head.register_forward_hook(lambda *_: clock.leave()))
    try:
        yield clock
    finally:
        for handle in handles:
            handle.remove()
        for owner, attribute, original in saved:
            setattr(owner, attribute, original)
