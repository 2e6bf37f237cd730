"""Every refusal as OpenAI's error body, with the status an OpenAI client expects.

`{"error": {"message", "type", "param", "code"}}`: the SDKs raise their typed exceptions from
the status (`BadRequestError` for 400, `AuthenticationError` for 401, `NotFoundError`,
`UnprocessableEntityError`, `RateLimitError`, `InternalServerError`) and show the message.
Statuses: 400 a malformed request (bad JSON, a wrong type, a value out of range, a field OpenAI
does not define), 401 a missing or wrong key, 404 an unknown model or path, 408 a body that did
not arrive in time, 413 a body or a part of it over a limit, 415 a body that is not JSON, 422 a
well-formed request the ensemble cannot honour (`n > 1`, log-probabilities, a schema the grammar
cannot enforce, images), 429 the queue is full, 503 loading or draining, 502/500 a member
failed (the message names it). Nothing here ever carries a traceback: an unexpected error is
logged on the server and answered with its request id.
"""

from __future__ import annotations

from typing import Any

from core.errors import (
    ContextWindowError,
    EnsembleBusyError,
    EnsembleError,
    InvalidConfigError,
    InvalidMessagesError,
    MemberError,
    ServerError,
)
from core.grammar import ConstraintError

_TYPES = {
    401: "authentication_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}
RETRY_AFTER_BUSY = 1  # seconds a client waits after a full queue (Retry-After)


class APIError(Exception):
    """A refusal: the status, OpenAI's error fields, and headers to send with it."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind or _TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(message: str, param: str | None = None) -> APIError:
    return APIError(422, message, param=param, code="unsupported")


def from_engine(
    error: EnsembleError, param: str | None = None, request_id: str | None = None
) -> APIError:
    """The engine's own errors (they name the problem and the fix) as HTTP refusals. A member's
    server failing is a 502 that names the member only: its URL and what its server said stay
    in this server's log, under `request_id`."""
    message = str(error)
    if isinstance(error, EnsembleBusyError):
        return APIError(
            429,
            message,
            code="queue_full",
            headers={"Retry-After": str(RETRY_AFTER_BUSY)},
        )
    if isinstance(error, ContextWindowError):
        return APIError(400, message, param="messages", code="context_length_exceeded")
    if isinstance(error, InvalidMessagesError):
        return APIError(400, message, param=param or "messages", code="invalid_messages")
    if isinstance(error, (InvalidConfigError, ConstraintError)):  # the request's own grammar
        return APIError(422, message, param=param, code="unsupported")
    if isinstance(error, ServerError):
        where = f" under request id {request_id}" if request_id else ""
        return APIError(
            502,
            f"member {error.member!r} is unavailable: its server is down, too slow, or refused "
            f"or failed the request; the details are in this server's log{where}.",
            code="member_unavailable",
        )
    if isinstance(error, MemberError):
        return APIError(500, message, code="member_failed")
    return APIError(500, message, code="ensemble_error")


def internal(request_id: str) -> APIError:
    return APIError(
        500,
        f"the server failed on this request (request id {request_id}); the error is in the "
        "server's log under that id.",
        code="internal_error",
    )
