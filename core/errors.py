"""One small hierarchy of errors, raised at the boundary (loading, `generate`).

Every message names the problem and the fix, so a user never has to read a torch traceback to
learn that a path was wrong or a prompt too long.
"""

from __future__ import annotations


class EnsembleError(Exception):
    """Base class: catch this to handle every error the library raises on purpose."""


class ModelLoadError(EnsembleError):
    """A member could not be loaded (bad path, no weights, not a causal LM, tokenizer mismatch)."""


class ModelNotFoundError(ModelLoadError):
    pass


class MissingWeightsError(ModelLoadError):
    pass


class NotCausalLMError(ModelLoadError):
    pass


class TokenizerMismatchError(ModelLoadError):
    pass


class ChatTemplateError(EnsembleError):
    """A member has no usable chat template for the given messages."""


class InvalidMessagesError(EnsembleError, ValueError):
    """Empty message list, unknown role, or content that is not text."""


class InvalidConfigError(EnsembleError, ValueError):
    """A generation setting or method option is out of range or unknown."""


class ContextWindowError(EnsembleError):
    """The prompt does not fit a member's context window."""


class MemberError(EnsembleError):
    """A member failed while generating. The message names the member and the operation;
    `member` and `operation` hold them (None when the failure was not inside one member)."""

    def __init__(self, message: str, *, member: str | None = None, operation: str | None = None):
        super().__init__(message)
        self.member = member
        self.operation = operation


class ServerError(MemberError):
    """A remote member's server is down, timed out, or refused a request (the message names the
    member and the URL). The ensemble stays usable: the next request starts afresh."""


class RequestCancelled(EnsembleError):
    """The request was cancelled (its stream closed, or its async task cancelled) while a member
    was about to compute; nothing of it is kept."""


class EnsembleBusyError(EnsembleError):
    """The ensemble already runs `max_concurrency` requests and its waiting queue is full, or a
    request waited longer than `queue_timeout` for a slot."""
