"""Running a blocking generator off the event loop: async streaming that never blocks the loop.

Both adapters (and `Ensemble.astream`) need this, so it lives in the core: a worker thread
drives the generator and hands items to the loop (waking it only when it waits for one, so a
busy consumer takes what piled up in one step, with no wake-up per item); errors are re-raised
in the consumer; when the consumer stops (cancelled, or breaks out), the worker stops at the next
item and closes the generator, and an iterator with a `cancel()` (a request stream) is told at
once, so the request stops at its next forward pass instead of computing one more item. A
request stream's worker counts as computing the request between its steps too (handing a delta
to the loop is part of its step), so batched forward passes wait for it as for a thread that
reads its own deltas (`RequestStream.computing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


class _Workers:
    """Daemon threads kept for reuse: `Thread.start()` blocks its caller until the new thread
    runs, which under a busy interpreter lock takes milliseconds (measured: 40 % of a serving
    event loop's time at 32 concurrent streams), so each request's work goes to an idle thread
    when there is one, and only a request that finds none starts a thread."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads that finished their task and will take the next one

    def submit(self, work: Callable[[], object]) -> None:
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._tasks.put(work)
        if spawn:
            threading.Thread(target=self._serve, name="ensemble-worker", daemon=True).start()

    def _serve(self) -> None:
        while True:
            work = self._tasks.get()
            with contextlib.suppress(BaseException):  # each task reports its own errors
                work()
            with self._lock:
                self._idle += 1


_workers = _Workers()


def start_worker(work: Callable[[], object]) -> None:
    """Run `work()` on a worker thread (a reused one when one is idle); it reports its own
    result and errors (as `iterate_in_thread` does through its handover)."""
    _workers.submit(work)


class _Handover:
    """Items passed from the worker thread to the loop. The worker appends under a lock and
    wakes the loop only when it waits for items it may take: a loop busy with the last batch
    (writing it to a socket, say) finds the next ones already there, with no wake-up call per
    item. With `every` = N > 1 the loop takes items N at a time (the first at once, and the
    end, or an error, with whatever came before it), so a consumer that could keep up with each
    item still handles them in batches: one socket write per N deltas, not one per delta."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every: int = 1) -> None:
        self.loop = loop
        self.every = every
        self.lock = threading.Lock()
        self.items: list[tuple[object, BaseException | None]] = []
        self.waiter: asyncio.Future | None = None
        self.taken = 0  # items the loop has taken so far

    def _ready(self) -> bool:
        """Whether the loop may take the items there now (call under the lock)."""
        items = self.items
        if not items:
            return False
        item, error = items[-1]
        return len(items) >= self.every or not self.taken or item is _DONE or error is not None

    def put(self, item: object, error: BaseException | None = None) -> bool:
        """False when the loop is gone (nobody listens any more)."""
        with self.lock:
            self.items.append((item, error))
            waiter = None
            if self._ready():
                waiter, self.waiter = self.waiter, None
        if waiter is not None:
            try:
                self.loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the loop is closed
                return False
        return True

    async def take(self) -> list[tuple[object, BaseException | None]]:
        """The items there are, once they may be taken, waiting for them if need be."""
        while True:
            with self.lock:
                if self._ready():
                    items, self.items = self.items, []
                    self.taken += len(items)
                    return items
                self.waiter = self.loop.create_future()
                waiter = self.waiter
            await waiter


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def iterate_in_thread(
    iterator: Iterator[T], batched: bool = False, every: int = 1
) -> AsyncIterator[T]:
    """`batched`: yield lists of every item that is ready (one or more), so a consumer slower
    than the producer (a server writing each delta to a socket) catches up in one step.
    `every` (with `batched`): lists of at least that many items, except the first list, which
    comes as soon as there is an item, and the last, which ends with the iterator's end or
    error."""
    handover = _Handover(asyncio.get_running_loop(), every if batched else 1)
    stop = threading.Event()

    def hand_over(item: object, error: BaseException | None = None) -> None:
        if not handover.put(item, error):
            stop.set()

    def worker() -> None:
        computing = getattr(iterator, "computing", None)  # a request stream's batching mark
        try:
            with computing() if computing is not None else contextlib.nullcontext():
                for item in iterator:
                    if stop.is_set():
                        break
                    hand_over(item)
        except BaseException as error:  # forwarded to the consumer, raised there
            hand_over(None, error)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()
            hand_over(_DONE)

    start_worker(worker)
    finished = False
    try:
        while True:
            items = await handover.take()
            batch = []
            for item, error in items:
                if error is not None or item is _DONE:
                    if batch:  # what came before the end, first
                        yield batch if batched else batch[0]
                    finished = True
                    if error is not None:
                        raise error
                    return
                if not batched:
                    yield item
                else:
                    batch.append(item)
            if batched and batch:
                yield batch
    finally:
        stop.set()
        cancel = getattr(iterator, "cancel", None)
        if cancel is not None and not finished:  # stop the request at its next forward pass
            cancel()
