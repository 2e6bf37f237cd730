"""Running one request: a slot taken before any of its own work, the engine's deltas off the
event loop, and its answer's bytes, whole or streamed.

A request takes its place in the ensemble's queue (`Admission.admit`) before its body is read
as JSON, translated, its schemas compiled and its prompts rendered, all on a thread of its own:
so `max_concurrency`, `max_queue` and `queue_timeout` bound that work too (a full queue is a
429 at once), and the event loop, which answers `/health`, only moves bytes. A client that
leaves while its request waits, is prepared or generates cancels it: a queued one leaves the
queue at once, a running one stops at its next forward pass.

Deltas that the engine commits while a chunk is being written go out together as one chunk:
a client that reads slower than the ensemble writes gets fewer, larger chunks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

from starlette.background import BackgroundTask
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from core.concurrency import iterate_in_thread, start_worker
from core.config import Delta, Output
from core.ensemble import Ensemble
from core.errors import EnsembleError, MemberError

from .errors import APIError, from_engine, internal
from .fields import json_body
from .job import Job
from .metrics import Metrics

log = logging.getLogger("llm_ensembling.serve")


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


class Answer(Protocol):
    """One API's answer to a job (`core.serve.chat.ChatAnswer`,
    `core.serve.responses.ResponsesAnswer`)."""

    def whole(self, output: Output) -> dict[str, Any]: ...
    def opening(self) -> bytes: ...
    def step(self, delta: Delta) -> bytes: ...
    def failure(self, error: APIError) -> bytes: ...


Translate = Callable[[dict[str, Any]], Job]


async def prepare(
    http: HTTPRequest, ensemble: Ensemble, raw: bytes, translate: Translate
) -> tuple[Job, Any]:
    """The job and its started request stream, made on a thread of their own once the request
    holds a slot; `ClientGone` (the request cancelled, its slot freed) if the client leaves
    first."""
    cancel = threading.Event()

    def work() -> tuple[Job, Any]:
        slot = ensemble.admission.admit(cancel)
        try:
            job = translate(json_body(raw))
            return job, ensemble.stream(job.messages, job.config, admitted=slot)
        except BaseException:
            slot.release()
            raise

    def cancelled() -> None:
        cancel.set()
        ensemble.admission.wake()

    return await _unless_gone(http, _in_thread(work, lambda made: made[1].close()), cancelled)


async def respond(
    http: HTTPRequest,
    job: Job,
    stream,
    answer: Answer,
    metrics: Metrics,
    count: Callable[[int], None],
    every: int = 1,
) -> Response:
    """The answer to a prepared job: the whole response, or an SSE stream (which calls
    `count(status)` when it ends) of one chunk per `every` deltas or more (`stream_interval`)."""
    deltas = iterate_in_thread(stream, batched=True, every=every)  # a slow socket catches up
    try:
        if not job.stream:
            batches = await _unless_gone(http, _collect(deltas), deltas.aclose)
            output = Output.from_deltas([d for batch in batches for d in batch])
            metrics.finished(output.stats)
            return JSONResponse(answer.whole(output))
        first = await _unless_gone(http, anext(deltas), deltas.aclose)  # a failed start: a status
    except BaseException:
        await deltas.aclose()
        raise
    body = _stream(http.state.request_id, answer, first, deltas, metrics, count)
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(_close, body),  # a client that left closes it here
    )


async def _close(body: AsyncGenerator[bytes, None]) -> None:
    """Close an answer's stream on the loop (Starlette runs a callable that is not a coroutine
    function, as an async generator's bound `aclose` is not, on a pool thread, where the
    awaitable it returns would never be awaited)."""
    await body.aclose()


def merged(deltas: Sequence[Delta]) -> Delta:
    """Consecutive deltas as one (a batch the engine wrote while the last chunk was sent)."""
    if len(deltas) == 1:
        return deltas[0]
    last = deltas[-1]
    return Delta(
        "".join(d.text for d in deltas),
        tuple(e for d in deltas for e in d.events),
        last.finish_reason,
        last.stats,
        tuple(c for d in deltas for c in d.tool_calls),
    )


def engine_failure(error: EnsembleError, request_id: str, metrics: Metrics) -> APIError:
    """An engine error as the client sees it (a failed member counted; a member's server's
    failure logged in full here, and answered without its URL or what that server said)."""
    if isinstance(error, MemberError) and error.member:
        metrics.member_failures.labels(error.member).inc()
    failure = from_engine(error, request_id=request_id)
    if failure.status == 502:
        log.warning("request %s: %s", request_id, error)
    return failure


async def _stream(
    request_id: str, answer: Answer, first, deltas, metrics: Metrics, count
) -> AsyncIterator[bytes]:
    status = 200
    finished = False
    try:
        delta = merged(first)
        data = answer.opening() + answer.step(delta)
        while True:
            if delta.finish_reason is not None:
                metrics.finished(delta.stats)
                yield data
                break
            yield data
            delta = merged(await anext(deltas))
            data = answer.step(delta)
        finished = True
    except EnsembleError as error:
        failure = engine_failure(error, request_id, metrics)
        status = failure.status
        yield answer.failure(failure)
    except Exception:
        log.exception("request %s failed while streaming", request_id)
        status = 500
        yield answer.failure(internal(request_id))
    finally:
        await deltas.aclose()
        if not finished and status == 200:
            status = 499
            metrics.cancelled.inc()
        count(status)


async def _collect(batches: AsyncIterator) -> list:
    return [batch async for batch in batches]


def _in_thread(work: Callable[[], Any], discard: Callable[[Any], None]) -> asyncio.Future:
    """`work()` on a worker thread of the engine's (never the loop's bounded pool, where
    requests waiting for a slot would hold every worker), as a future; a result that arrives
    after the future was cancelled is given to `discard`."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            if error is None:
                discard(result)
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result = work()
        except BaseException as error:  # raised in the awaiting task
            loop.call_soon_threadsafe(settle, None, error)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    start_worker(run)
    return future


async def _unless_gone(
    http: HTTPRequest, work: Awaitable, cleanup: Callable[[], Any] | None = None
):
    """`work`'s result, or `ClientGone` if the client leaves first (then `work` is cancelled
    and `cleanup()` called). The body has been read, so the next message on the connection is
    its end."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            if cleanup is not None:
                done = cleanup()
                if asyncio.iscoroutine(done):
                    await done
        gone.cancel()
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _disconnected(http: HTTPRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
