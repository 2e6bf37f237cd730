"""How many requests one ensemble runs at once, and what the others do meanwhile.

Requests run concurrently (each with its own member state; their forward passes are batched per
model), up to `max_concurrency` at a time. Beyond that a request waits in a queue of at most
`max_queue` requests, for at most `queue_timeout` seconds; a full queue or a timeout is an
`EnsembleBusyError` at once, never a hang. A request started from inside another one on the
same thread (a `generate` in an `on_event` callback) does not queue behind its own parent.

A stream that was dropped without being closed frees its slot when Python collects it: at once
when nothing refers to it, at Python's next full garbage collection when it sits in a reference
cycle (an object holding the stream that the stream's callback holds, say), which may be long
in coming. So a request that finds every slot taken while some stream has sat between two
deltas for a second or more (garbage always has) runs that collection itself, and a waiting
request retries each second: a slot held only by garbage does not make a request fail, or wait
more than a few seconds. A full collection stalls every thread of the process for a moment
(milliseconds per hundred thousand live objects), so there is at most one every 5 seconds.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence

from .batching import RequestThreads
from .errors import EnsembleBusyError, RequestCancelled
from .kv import free_bytes

_MAX_DEFAULT = 64  # the default never exceeds this many concurrent requests
_IDLE_SECONDS = 1.0  # a stream this long between deltas may be garbage in a reference cycle
_RECLAIM_SECONDS = 5.0  # at most one garbage collection this often, when every slot is taken
_MEMORY_SHARE = 0.5  # of the memory free at load time, what concurrent requests' caches may use


class Admission:
    """One ensemble's request slots and queue; `threads` marks the threads that run its
    requests, which its models' batchers wait for (`core.batching`)."""

    def __init__(
        self,
        max_concurrency: int,
        max_queue: int,
        queue_timeout: float | None,
        threads: RequestThreads | None = None,
    ) -> None:
        self.threads = threads if threads is not None else RequestThreads()
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self.queue_timeout = queue_timeout
        lock = threading.RLock()
        self._changed = threading.Condition(lock)  # a slot freed: wakes one queued request
        self._counted = threading.Condition(lock)  # any count moved: wakes every watcher
        self._running = 0
        self._waiting = 0
        self._inside = threading.local()  # set while this thread runs one of our requests
        self._reclaimed = -_RECLAIM_SECONDS  # when a full admission last collected garbage
        # streams between two deltas (their consumer has them) -> since when
        self._paused: weakref.WeakKeyDictionary[object, float] = weakref.WeakKeyDictionary()

    @property
    def running(self) -> int:
        """Requests running now."""
        return self._running

    @property
    def waiting(self) -> int:
        """Requests waiting in the queue for a slot now."""
        return self._waiting

    def wait_until(self, condition: Callable[[], bool], timeout: float | None = None) -> bool:
        """Block until `condition()` (which reads `running` and `waiting`) holds, rechecked each
        time a count changes; False if `timeout` seconds pass first. For monitors and tests
        that must see a request start, queue or finish without polling."""
        with self._counted:
            return self._counted.wait_for(condition, timeout)

    def _moved(self) -> None:
        """A count changed (called under the lock)."""
        self._counted.notify_all()

    def admit(self, cancel: threading.Event | None = None) -> Slot:
        """Take one of the `max_concurrency` slots, waiting in the queue if need be, and hold
        it until the returned `Slot` is released. A caller that does work of its own before
        its request runs (a server reading and compiling a request) takes the slot first, so
        the queue limits bound that work too, and hands it to `Ensemble.stream(admitted=...)`.
        `cancel`, set while waiting (then `wake()`), ends the wait with `RequestCancelled`."""
        self._acquire(cancel)
        return Slot(self)

    @contextlib.contextmanager
    def slot(self, cancel: threading.Event | None = None) -> Iterator[None]:
        """Hold one of the `max_concurrency` slots (waiting in the queue if need be)."""
        with self.admit(cancel):
            yield

    def wake(self) -> None:
        """Wake every waiting request, so one whose `cancel` was set leaves the queue now."""
        with self._changed:
            self._changed.notify_all()

    def _release(self) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify()
            self._moved()

    @contextlib.contextmanager
    def running_here(self) -> Iterator[None]:
        """Mark this thread as running one of our requests (for the nested-request rule, and
        for the batchers, which wait for passes of threads that are computing)."""
        outer = getattr(self._inside, "depth", 0)
        self._inside.depth = outer + 1
        try:
            with self.threads.running():
                yield
        finally:
            self._inside.depth = outer

    def pause(self, stream: object) -> None:
        """`stream` holds a slot and waits for its consumer (it just gave a delta)."""
        with self._changed:
            self._paused[stream] = time.monotonic()

    def resume(self, stream: object) -> None:
        """`stream` runs again, or is closed."""
        with self._changed:
            self._paused.pop(stream, None)

    def _reclaim(self) -> None:
        """Every slot is taken: when a stream has been paused long enough to be garbage, collect
        garbage (at most once every 5 s), so streams dropped in a reference cycle run their
        finalisers and free their slots now."""
        now = time.monotonic()
        with self._changed:
            idle = any(now - since >= _IDLE_SECONDS for since in self._paused.values())
            if not idle or now - self._reclaimed < _RECLAIM_SECONDS:
                return
            self._reclaimed = now
        gc.collect()

    def _take(self, nested: bool = False) -> bool:
        """Take a free slot if there is one, or any slot for a nested request (called under
        the lock)."""
        if not nested and self._running >= self.max_concurrency:
            return False
        self._running += 1
        self._moved()
        return True

    def _acquire(self, cancel: threading.Event | None = None) -> None:
        nested = getattr(self._inside, "depth", 0) > 1  # this request runs inside another
        with self._changed:
            if self._take(nested):
                return
        self._reclaim()  # outside the lock: a collected stream takes it to free its slot
        with self._changed:
            if self._take():
                return
            if self._waiting >= self.max_queue:
                raise EnsembleBusyError(
                    f"the ensemble runs {self._running} requests (max_concurrency="
                    f"{self.max_concurrency}) and {self._waiting} more are waiting "
                    f"(max_queue={self.max_queue}); retry later, or raise max_concurrency / "
                    "max_queue when building the Ensemble."
                )
            self._waiting += 1
            self._moved()
        deadline = None if self.queue_timeout is None else time.monotonic() + self.queue_timeout
        try:
            with self.threads.parked():  # waiting for a slot: no pass will come from it
                while not self._wait_for_slot(deadline, cancel):
                    self._reclaim()
        finally:
            with self._changed:
                self._waiting -= 1
                self._moved()

    def _wait_for_slot(self, deadline: float | None, cancel: threading.Event | None) -> bool:
        """Wait up to a second for a free slot and take it (False: none yet); past the queue
        timeout, `EnsembleBusyError`; once `cancel` is set, `RequestCancelled`."""
        with self._changed:
            if cancel is not None and cancel.is_set():
                raise RequestCancelled("the request was cancelled while it waited for a slot")
            if self._take():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise EnsembleBusyError(
                    f"no request slot freed within queue_timeout={self.queue_timeout:g} "
                    f"s (max_concurrency={self.max_concurrency}); retry later, or raise "
                    "queue_timeout / max_concurrency when building the Ensemble."
                )
            self._changed.wait(_IDLE_SECONDS if left is None else min(left, _IDLE_SECONDS))
            return self._take()


class Slot:
    """One held request slot (`Admission.admit`): released once, by `release()` or at the end
    of a `with` block; releasing it again does nothing."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._held = True
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._admission._release()

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def default_concurrency(members: Sequence) -> int:
    """As many requests as half the memory free now can hold keys and values for, each at its
    members' full context windows (at least 1, at most 64), from each model's measured bytes
    per cached position. Remote members hold nothing here."""
    per_request: dict[str, int] = {}
    for member in members:
        per_token = getattr(member, "kv_bytes_per_token", 0)
        if per_token:
            device = str(member.device)
            per_request[device] = per_request.get(device, 0) + per_token * member.context_window
    limit = _MAX_DEFAULT
    for device, need in per_request.items():
        limit = min(limit, int(_MEMORY_SHARE * free_bytes(device) // need))
    return max(1, limit)
