"""Credentials that never show: in reprs, dumps, pickles, member names or error texts.

A served member may hold an API key or a `user:password` for HTTP basic auth. Both live in a
`Secret`, which prints as stars, compares in constant time, survives copies (it is immutable)
and is left out of pickles: a pickle is a file, and a key in it is a key on disk. What the
engine needs to tell two credentials apart (the shared-engine cache) is `digest`, a salted
hash that cannot be turned back into the key and means nothing outside this process.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Any

import httpx

from .errors import InvalidConfigError

_SALT = os.urandom(16)  # digests are for telling secrets apart in this process only
_HIDDEN = "**********"


class Secret:
    """A credential: `get_secret_value()` gives it, nothing else does.

    Accepts a `str`, another `Secret`, or anything with `get_secret_value()` (pydantic's
    `SecretStr`). Unpickled, it is empty (`dropped`): pickles never carry the value."""

    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        if isinstance(value, Secret):
            value = value._value  # a dropped secret stays dropped
        elif value is not None and hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if value is not None and not isinstance(value, str):
            raise InvalidConfigError(
                f"a credential must be a string (or a SecretStr), not {type(value).__name__}."
            )
        object.__setattr__(self, "_value", value)

    @property
    def dropped(self) -> bool:
        """True for a secret that came out of a pickle: its value was never written there."""
        return self._value is None

    def get_secret_value(self) -> str:
        if self._value is None:
            raise InvalidConfigError(
                "this credential was left out when its Remote(...) was pickled (pickles never "
                "carry keys); build the Remote again with its api_key or base_url credentials."
            )
        return self._value

    @property
    def digest(self) -> str:
        """A salted hash of the value: equal for equal secrets, useless to anyone else."""
        if self._value is None:
            return "dropped"
        return hmac.new(_SALT, self._value.encode(), hashlib.sha256).hexdigest()

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a Secret is immutable")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self.digest, other.digest)

    def __hash__(self) -> int:
        return hash(self.digest)

    def __repr__(self) -> str:
        return f"Secret('{_HIDDEN}')"

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        return (Secret, (None,))

    def __copy__(self) -> Secret:
        return self

    def __deepcopy__(self, memo: dict) -> Secret:
        return self


def split_userinfo(url: str) -> tuple[str, Secret | None]:
    """`url` without its `user:password@` part, and that part as a Secret (None without one)."""
    parsed = httpx.URL(url)
    if not parsed.userinfo:
        return url, None
    bare = str(parsed.copy_with(username=None, password=None))
    return bare, Secret(f"{parsed.username}:{parsed.password}")


def _forms(value: str) -> list[str]:
    """The forms in which a server may echo a credential: as given, the password of a
    `user:password` alone, and each of those in base64 (an `Authorization: Basic` header), with
    and without its padding."""
    plain = [value, *value.split(":", 1)[1:]]
    encoded = [base64.b64encode(p.encode()).decode() for p in plain if p]
    return [*plain, *encoded, *(e.rstrip("=") for e in encoded)]


def scrub(text: str, secrets: list[Secret | None], limit: int = 300) -> str:
    """`text` cut to `limit` characters, with every secret's value in every form a server may
    echo it (`_forms`) replaced by stars: for quoting what a server answered in an error."""
    for secret in secrets:
        if secret is None or secret.dropped:
            continue
        for part in sorted(filter(None, _forms(secret.get_secret_value())), key=len, reverse=True):
            text = text.replace(part, _HIDDEN)
    return text if len(text) <= limit else text[:limit] + "…"
