"""Running a blocking generator off the event loop: async streaming that never blocks the loop.

Both adapters (and `Ensemble.astream`) need this, so it lives in the core: a worker thread
drives the generator and hands items to the loop through an asyncio queue; errors are re-raised
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
import threading
from collections.abc import AsyncIterator, Iterator
from typing import TypeVar

T = TypeVar("T")
_DONE = object()


async def iterate_in_thread(iterator: Iterator[T], batched: bool = False) -> AsyncIterator[T]:
    """`batched`: yield lists of every item that is ready (one or more), so a consumer slower
    than the producer (a server writing each delta to a socket) catches up in one step."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def hand_over(item: object, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # the loop is gone: nobody is listening any more
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

    threading.Thread(target=worker, name="ensemble-stream", daemon=True).start()
    finished = False
    waiting = None  # an end or an error found while batching, handled next
    try:
        while True:
            item, error = waiting or await queue.get()
            waiting = None
            if error is not None:
                finished = True
                raise error
            if item is _DONE:
                finished = True
                return
            if not batched:
                yield item
                continue
            batch = [item]
            while not queue.empty():
                after = queue.get_nowait()
                if after[1] is not None or after[0] is _DONE:
                    waiting = after
                    break
                batch.append(after[0])
            yield batch
    finally:
        stop.set()
        cancel = getattr(iterator, "cancel", None)
        if cancel is not None and not finished:  # stop the request at its next forward pass
            cancel()
