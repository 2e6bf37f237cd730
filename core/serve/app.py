"""The ASGI app: routes, the request's edge (host, key, readiness, the body's bytes), and the
endpoints, each of which hands its request to `core.serve.jobs` with its API's translator and
answer (`core.serve.chat`, `core.serve.responses`).

One `Ensemble`, loaded once, serves every request; each request is prepared and runs on threads
of its own (`core.serve.jobs`), so the event loop only moves bytes, and concurrent requests
share batched forward passes as they do in process. A client that leaves (a closed stream or a
dropped connection, while waiting or while generating) cancels its request, which leaves the
queue at once or stops at its next forward pass, and frees its slot. No endpoint reads a query
string, so none is kept in the request (nor written to the access log): a key sent in one is
refused, and never logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from core.ensemble import Ensemble
from core.errors import EnsembleError

from .auth import Keys, check_host
from .chat import ChatAnswer, chat_job, completion_job
from .errors import APIError, internal
from .jobs import ClientGone, engine_failure, prepare, respond
from .metrics import CONTENT_TYPE, Metrics
from .responses import ResponsesAnswer, responses_job
from .settings import Limits, ServeSettings

log = logging.getLogger("llm_ensembling.serve")
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
RETRY_AFTER_LOADING = 5
_ENDPOINTS = (
    "/v1/chat/completions, /v1/completions, /v1/responses, /v1/models, /health and /metrics"
)


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
        post = ["POST"]
        routes = [
            Route("/health", self._route("health", self.health, key=False, ready=False)),
            Route("/metrics", self._route("metrics", self.prometheus, ready=False)),
            Route("/v1/models", self._route("models", self.models)),
            Route("/v1/models/{name:path}", self._route("models", self.model)),
            Route("/v1/chat/completions", self._route("chat", self.chat), methods=post),
            Route("/v1/completions", self._route("completions", self.completions), methods=post),
            Route("/v1/responses", self._route("responses", self.responses), methods=post),
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
        scope["query_string"] = b""  # read by no endpoint; never logged (a key may be in it)

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
                failure = engine_failure(error, request.state.request_id, self.metrics)
                response = _error_response(failure)
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
                f"{_ENDPOINTS}.",
                code="unknown_url",
            )
        self._count("unknown", api.status, time.perf_counter())
        return _error_response(api)

    async def _body(self, request: HTTPRequest) -> bytes:
        """The body's bytes, sent as JSON, within the size limit and the body timeout (the JSON
        itself is read once the request holds a slot: `core.serve.jobs`)."""
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

        async def read() -> bytes:
            raw = bytearray()
            async for piece in request.stream():
                raw += piece
                if len(raw) > limit:
                    raise too_large
            return bytes(raw)

        try:
            return await asyncio.wait_for(read(), self.settings.body_timeout)
        except asyncio.TimeoutError:
            raise APIError(
                408,
                f"the body did not arrive within {self.settings.body_timeout:g} s (the "
                "server's --body-timeout); send it at once.",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None

    # --- endpoints ---------------------------------------------------------------------------

    async def health(self, request: HTTPRequest) -> Response:
        """The phase; a failed load's error only to a caller with a key (it may name paths)."""
        phase = self.lifecycle.phase
        body: dict[str, Any] = {"status": phase}
        if phase == "ready":
            return JSONResponse({**body, "models": list(self.settings.names)})
        if self.lifecycle.error and self.keys.accepts(request.headers.get("authorization")):
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

    async def chat(self, request: HTTPRequest) -> Response:
        return await self._answer(request, "chat", chat_job, ChatAnswer)

    async def completions(self, request: HTTPRequest) -> Response:
        return await self._answer(request, "completions", completion_job, ChatAnswer)

    async def responses(self, request: HTTPRequest) -> Response:
        return await self._answer(request, "responses", responses_job, ResponsesAnswer)

    async def _answer(self, http: HTTPRequest, endpoint: str, translate, answer) -> Response:
        raw = await self._body(http)
        ensemble = self.lifecycle.require()
        started = time.perf_counter()
        names, limits = self.settings.names, self.limits
        job, stream = await prepare(http, ensemble, raw, lambda b: translate(b, names, limits))

        def count(status: int) -> None:
            self._count(endpoint, status, started)

        every = self.settings.stream_interval
        return await respond(http, job, stream, answer(job), self.metrics, count, every)


def _error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)
