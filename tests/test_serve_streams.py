"""An SSE answer as the server hands it to Starlette: when the response ends (a client that left
included), its background task closes the stream on the event loop, so the request's engine
thread stops at its next pass."""

from __future__ import annotations

import asyncio
import threading

from starlette.requests import Request as HTTPRequest

from core.config import Delta, GenerationConfig
from core.serve.chat import ChatAnswer
from core.serve.job import Job
from core.serve.jobs import respond
from core.serve.metrics import Metrics


class EndlessStream:
    """A request stream that writes until it is cancelled, as `RequestStream` does."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def __iter__(self):
        return self

    def __next__(self) -> Delta:
        if self.cancelled.is_set():
            raise StopIteration
        return Delta("x")

    def cancel(self) -> None:
        self.cancelled.set()


def _request() -> HTTPRequest:
    async def receive() -> dict:  # the client stays connected
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [],
             "state": {"request_id": "req_test"}}  # fmt: skip
    return HTTPRequest(scope, receive)


async def test_a_streamed_answer_s_background_task_stops_its_request():
    stream = EndlessStream()
    job = Job("chat", "ensemble", [{"role": "user", "content": "hi"}], GenerationConfig(), True)
    metrics = Metrics(lambda: 0, lambda: 0)
    response = await respond(_request(), job, stream, ChatAnswer(job), metrics, lambda _: None)
    chunk = await anext(response.body_iterator)
    assert chunk.startswith(b"data: ")
    await response.background()
    assert await asyncio.to_thread(stream.cancelled.wait, 5)
