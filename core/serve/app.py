"""The ASGI app: routes, the request's edge (host, key, readiness, body), and the answer.

One `Ensemble`, loaded once, serves every request; each request runs on a worker thread
(`Ensemble.stream` driven by `core.concurrency.iterate_in_thread`), so the event loop only moves
bytes, and concurrent requests share batched forward passes as they do in process. A client that
leaves (a closed stream or a dropped connection, while waiting or while generating) cancels its
request, which stops at its next forward pass and frees its slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.concurrency import iterate_in_thread
from core.config import Output
from core.ensemble import Ensemble
from core.errors import EnsembleError, MemberError
from core.summary import request_summary

from .auth import Keys, check_host
from .errors import APIError, bad_request, from_engine, internal
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    Answer,
    Request,
    chat_request,
    completion_request,
    invalid_calls,
    merged,
)
from .settings import Limits, ServeSettings

log = logging.getLogger("llm_ensembling.serve")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RETRY_AFTER_LOADING = 5


class ClientGone(Exception):
    """The client closed its connection before the answer was ready."""


class Lifecycle:
    """loading -> ready -> draining (or loading -> failed). Requests are served when ready."""

    def __init__(self) -> None:
        self.phase = "loading"
        self.ensemble: Ensemble | None = None
        self.error: str | None = None
        self.created = int(time.time())

    def require(self) -> Ensemble:
        if self.phase == "ready" and self.ensemble is not None:
            return self.ensemble
        if self.phase == "loading":
            raise APIError(
                503,
                "the models are still loading; retry shortly (GET /health says when ready).",
                code="loading",
                headers={"Retry-After": str(RETRY_AFTER_LOADING)},
            )
        if self.phase == "draining":
            raise APIError(
                503,
                "the server is shutting down and takes no new requests; send it to another "
                "replica.",
                code="draining",
            )
        raise APIError(503, "the models failed to load; see the server's log.", code="failed")


class EnsembleApp:
    """The ASGI callable plus what the runner needs: its lifecycle, metrics and `drain()`."""

    def __init__(
        self,
        settings: ServeSettings,
        load: Callable[[], Ensemble],
        on_load_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.settings = settings
        self.limits: Limits = settings.limits
        self.keys = Keys(settings.api_keys)
        self.lifecycle = Lifecycle()
        self._load = load
        self._on_load_failure = on_load_failure
        self.metrics = Metrics(self._running, self._waiting)
        routes = [
            Route("/health", self._route("health", self.health, key=False, ready=False)),
            Route("/metrics", self._route("metrics", self.prometheus, ready=False)),
            Route("/v1/models", self._route("models", self.models)),
            Route("/v1/models/{name:path}", self._route("models", self.model)),
            Route(
                "/v1/chat/completions",
                self._route("chat", self.chat_completions),
                methods=["POST"],
            ),
            Route(
                "/v1/completions", self._route("completions", self.completions), methods=["POST"]
            ),
        ]
        self.starlette = Starlette(
            routes=routes,
            exception_handlers={HTTPException: self._http_error},
            lifespan=self._lifespan,
        )

    async def __call__(self, scope, receive, send) -> None:
        """Every answer carries `x-request-id` (the client's own when it sent a sane one)."""
        if scope["type"] != "http":
            return await self.starlette(scope, receive, send)
        sent = dict(scope.get("headers") or []).get(b"x-request-id", b"").decode("latin-1")
        request_id = sent if _REQUEST_ID.match(sent) else "req_" + secrets.token_hex(12)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != b"x-request-id"]
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.starlette(scope, receive, send_with_id)
        except asyncio.CancelledError:  # uvicorn's grace period ended: the request is cut
            log.warning("request %s cut at the end of the grace period", request_id)

    # --- lifecycle ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, _app) -> AsyncIterator[None]:
        threading.Thread(target=self._load_models, name="ensemble-load", daemon=True).start()
        yield
        await self._stopped()

    async def _stopped(self, wait: float = 30.0) -> None:
        """At shutdown, requests cut at the grace period stop at their next forward pass: wait
        for that, so no model computes while the process exits."""
        deadline = time.monotonic() + wait
        while self._running() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _load_models(self) -> None:
        try:
            ensemble = self._load()
        except BaseException as error:  # reported, and the runner stops the server
            self.lifecycle.error = f"{type(error).__name__}: {error}"
            self.lifecycle.phase = "failed"
            log.error("loading the models failed: %s", self.lifecycle.error)
            if self._on_load_failure is not None:
                self._on_load_failure(error)
            return
        self.lifecycle.ensemble = ensemble
        if self.lifecycle.phase == "loading":
            self.lifecycle.phase = "ready"
            self.metrics.ready.set(1)
            log.info("ready: %s over %s", ensemble.method, [m.name for m in ensemble.members])

    def drain(self) -> None:
        """Take no new requests (in-flight ones go on); /health says draining."""
        self.lifecycle.phase = "draining"
        self.metrics.ready.set(0)

    def _running(self) -> int:
        ensemble = self.lifecycle.ensemble
        return ensemble.admission.running if ensemble is not None else 0

    def _waiting(self) -> int:
        ensemble = self.lifecycle.ensemble
        return ensemble.admission.waiting if ensemble is not None else 0

    # --- the edge ----------------------------------------------------------------------------

    def _route(
        self,
        endpoint: str,
        handler: Callable[[HTTPRequest], Awaitable[Response]],
        *,
        key: bool = True,
        ready: bool = True,
    ):
        async def route(request: HTTPRequest) -> Response:
            started = time.perf_counter()
            try:
                check_host(request.headers.get("host"), self.keys)
                if key:
                    self.keys.check(request.headers.get("authorization"))
                if ready:
                    self.lifecycle.require()
                response = await handler(request)
            except APIError as error:
                response = _error_response(error)
            except EnsembleError as error:
                response = self._engine_error(error)
            except ClientGone:
                self.metrics.cancelled.inc()
                response = Response(status_code=499)  # nginx's "client closed request"
            except Exception:
                request_id = request.state.request_id
                log.exception("request %s failed", request_id)
                response = _error_response(internal(request_id))
            if not isinstance(response, StreamingResponse):  # a stream counts when it ends
                self._count(endpoint, response.status_code, started)
            return response

        return route

    def _count(self, endpoint: str, status: int, started: float) -> None:
        self.metrics.requests.labels(endpoint, str(status)).inc()
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    def _engine_error(self, error: EnsembleError) -> Response:
        if isinstance(error, MemberError) and error.member:
            self.metrics.member_failures.labels(error.member).inc()
        return _error_response(from_engine(error))

    async def _http_error(self, request: HTTPRequest, error: HTTPException) -> Response:
        if error.status_code == 405:
            api = APIError(
                405,
                f"{request.method} is not allowed on {request.url.path}.",
                code="method_not_allowed",
            )
        else:
            api = APIError(
                error.status_code,
                f"no such endpoint: {request.method} {request.url.path}; this server has "
                "/v1/chat/completions, /v1/completions, /v1/models, /health and /metrics.",
                code="unknown_url",
            )
        self._count("unknown", api.status, time.perf_counter())
        return _error_response(api)

    async def _body(self, request: HTTPRequest) -> dict[str, Any]:
        """The JSON object of the body, within the size limit, UTF-8, finite numbers only."""
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise APIError(
                415,
                f"the body must be JSON sent as 'Content-Type: application/json', not "
                f"{kind or 'no content type'!r}.",
                code="unsupported_media_type",
            )
        limit = self.limits.max_body_bytes
        too_large = APIError(
            413,
            f"the request body is over {limit} bytes (the server's --max-body-bytes).",
            code="request_too_large",
        )
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            raise too_large
        raw = bytearray()
        async for piece in request.stream():
            raw += piece
            if len(raw) > limit:
                raise too_large
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise bad_request(
                f"the body is not UTF-8: byte {raw[error.start]:#04x} at offset {error.start}.",
                code="invalid_encoding",
            ) from None
        try:
            body = json.loads(text, parse_constant=_no_constant)
        except json.JSONDecodeError as error:
            raise bad_request(
                f"the body is not valid JSON: {error.msg} at line {error.lineno}, column "
                f"{error.colno}.",
                code="invalid_json",
            ) from None
        except (RecursionError, ValueError) as error:
            raise bad_request(
                f"the body is not valid JSON: {error}.", code="invalid_json"
            ) from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object.", code="invalid_json")
        return body

    # --- endpoints ---------------------------------------------------------------------------

    async def health(self, _request: HTTPRequest) -> Response:
        phase = self.lifecycle.phase
        body: dict[str, Any] = {"status": phase}
        if phase == "ready":
            return JSONResponse({**body, "models": list(self.settings.names)})
        if self.lifecycle.error:
            body["error"] = self.lifecycle.error
        headers = {"Retry-After": str(RETRY_AFTER_LOADING)} if phase == "loading" else None
        return JSONResponse(body, status_code=503, headers=headers)

    async def prometheus(self, _request: HTTPRequest) -> Response:
        return Response(self.metrics.text(), media_type=CONTENT_TYPE)

    def _model_entry(self, name: str) -> dict[str, Any]:
        ensemble = self.lifecycle.require()
        return {
            "id": name,
            "object": "model",
            "created": self.lifecycle.created,
            "owned_by": "llm-ensembling",
            "ensemble": ensemble.summary(),
        }

    async def models(self, _request: HTTPRequest) -> Response:
        data = [self._model_entry(name) for name in self.settings.names]
        return JSONResponse({"object": "list", "data": data})

    async def model(self, request: HTTPRequest) -> Response:
        name = request.path_params["name"]
        if name not in self.settings.names:
            raise APIError(
                404,
                f"The model {name!r} does not exist here.",
                param="model",
                code="model_not_found",
            )
        return JSONResponse(self._model_entry(name))

    async def chat_completions(self, request: HTTPRequest) -> Response:
        body = await self._body(request)
        return await self._answer(request, chat_request(body, self.settings.names, self.limits))

    async def completions(self, request: HTTPRequest) -> Response:
        body = await self._body(request)
        translated = completion_request(body, self.settings.names, self.limits)
        return await self._answer(request, translated)

    # --- answering ---------------------------------------------------------------------------

    async def _answer(self, http: HTTPRequest, request: Request) -> Response:
        ensemble = self.lifecycle.require()
        started = time.perf_counter()
        stream = await asyncio.to_thread(ensemble.stream, request.messages, request.config)
        deltas = iterate_in_thread(stream, batched=True)  # a slow socket catches up at once
        answer = Answer(request)
        if not request.stream:
            deltas_list = await _unless_gone(http, _collect(deltas), deltas)
            out = Output.from_deltas(deltas_list)
            self.metrics.finished(out.stats)
            details = self._details(ensemble, out.stats, out.events, out.invalid_tool_calls)
            body = answer.whole(out.text, out.finish_reason, out.stats, out.tool_calls, details)
            return JSONResponse(body)
        first = await _unless_gone(http, anext(deltas), deltas)  # a busy queue is still a 429
        chunks = self._sse(ensemble, answer, first, deltas, http.state.request_id, started)
        return StreamingResponse(
            chunks,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            background=BackgroundTask(chunks.aclose),  # a client that left closes it here
        )

    def _details(self, ensemble: Ensemble, stats, events, calls) -> dict[str, Any]:
        """The extra `ensemble` field: what the method did (E/T, points or winners, weights),
        the members that left the request, and calls cut off at the token limit."""
        details = request_summary(ensemble.summary(), stats, events)
        details["failed"] = dict(stats.failed)
        details["invalid_tool_calls"] = invalid_calls(calls)
        return details

    async def _sse(
        self, ensemble, answer: Answer, first, deltas, request_id: str, started: float
    ) -> AsyncIterator[bytes]:
        events: list = []
        status = "200"
        finished = False
        try:
            opening = answer.first_chunk()
            if opening is not None:
                yield _event(opening)
            delta = merged(first)
            while True:
                events.extend(delta.events)
                details = None
                if delta.finish_reason is not None:
                    details = self._details(ensemble, delta.stats, events, delta.tool_calls)
                    self.metrics.finished(delta.stats)
                for chunk in answer.chunks(delta, details):
                    yield _event(chunk)
                if delta.finish_reason is not None:
                    break
                delta = merged(await anext(deltas))
            finished = True
            yield b"data: [DONE]\n\n"
        except EnsembleError as error:
            failure = from_engine(error)
            status = str(failure.status)
            if isinstance(error, MemberError) and error.member:
                self.metrics.member_failures.labels(error.member).inc()
            yield _event(failure.body())
        except Exception:
            log.exception("request %s failed while streaming", request_id)
            status = "500"
            yield _event(internal(request_id).body())
        finally:
            await deltas.aclose()
            if not finished and status == "200":
                status = "499"
                self.metrics.cancelled.inc()
            self._count("chat" if answer.request.chat else "completions", int(status), started)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number; send finite numbers")


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _collect(batches: AsyncIterator) -> list:
    return [delta async for batch in batches for delta in batch]


async def _unless_gone(http: HTTPRequest, work: Awaitable, deltas: AsyncIterator):
    """`work`'s result, or `ClientGone` (with the request cancelled) if the client leaves
    first. The body has been read, so the next message on the connection is its end."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(http))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            await deltas.aclose()
        gone.cancel()
    if not task.done() or task.cancelled():
        raise ClientGone
    try:
        return task.result()
    except BaseException:
        await deltas.aclose()
        raise


async def _disconnected(http: HTTPRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass
