"""Who may call: bearer keys checked in constant time, and, on a keyless loopback server, only
requests addressed to the loopback (a web page cannot reach it through a rebound DNS name).

Keys are compared as SHA-256 digests with `hmac.compare_digest`, every key every time, so the
time taken says nothing about how much of a key was right, nor which key matched. No key and
no header value ever reaches a log line or an error message.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from .errors import APIError
from .settings import is_loopback


class Keys:
    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def required(self) -> bool:
        return bool(self._digests)

    def _matches(self, token: str) -> bool:
        given = hashlib.sha256(token.strip().encode("utf-8", "replace")).digest()
        matched = False
        for digest in self._digests:
            matched |= hmac.compare_digest(given, digest)
        return matched

    def accepts(self, authorization: str | None) -> bool:
        """Whether the header holds a served key (always, on a keyless server)."""
        if not self._digests:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return self._matches(token) and scheme.lower() == "bearer" and bool(token.strip())

    def check(self, authorization: str | None) -> None:
        """Raise a 401 unless the `Authorization: Bearer <key>` header holds a served key."""
        if not self._digests:
            return
        scheme, _, token = (authorization or "").partition(" ")
        matched = self._matches(token)
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' (the "
                "OpenAI SDKs do this from api_key).",
                code="missing_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not matched:
            raise APIError(
                401,
                "Incorrect API key provided.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )


def check_host(host_header: str | None, keys: Keys) -> None:
    """Without keys, answer only requests whose Host is a loopback name or address."""
    if keys.required:
        return
    host = (host_header or "").strip()
    if host.startswith("["):  # [::1]:8000
        name = host[1 : host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if not is_loopback(name):
        raise APIError(
            403,
            "this server has no API key, so it answers only requests addressed to the loopback "
            "(Host: 127.0.0.1 or localhost); give it a key to serve other names.",
            code="host_not_allowed",
        )
